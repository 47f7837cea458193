//! The inventory statements for each store.

#[cfg(feature = "postgres")]
use tokio_postgres::types::ToSql;

use super::{
    CONSUMER, InventoryCounts, InventoryStore, InventoryTx, MIGRATION_VERSION, OrderPlaced,
};
use sb_inbox::StoreError;
use sb_inbox::store::Migration;
#[cfg(feature = "mssql")]
use sb_inbox::{MssqlStore, MssqlTx};
#[cfg(feature = "postgres")]
use sb_inbox::{PgStore, PgTx};
#[cfg(feature = "sqlite")]
use sb_inbox::{SqliteStore, SqliteTx};

const NAME: &str = "0002_inventory.sql";

/// Units per SKU of released lines, in SKU order (the order reservations lock stock rows in).
#[cfg(any(feature = "postgres", feature = "mssql"))]
fn units_by_sku(lines: impl IntoIterator<Item = (String, i32)>) -> Vec<(String, i64)> {
    let mut units = std::collections::BTreeMap::new();
    for (sku, quantity) in lines {
        *units.entry(sku).or_insert(0) += i64::from(quantity);
    }
    units.into_iter().collect()
}

#[cfg(feature = "postgres")]
const PG_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/postgres/0002_inventory.sql"),
};

#[cfg(feature = "sqlite")]
const SQLITE_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/sqlite/0002_inventory.sql"),
};

#[cfg(feature = "mssql")]
const MSSQL_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/mssql/0002_inventory.sql"),
};

/// Counts the inventory migration's bookkeeping row (a table every store's `migrate` creates).
const RECORDED: &str = "SELECT count(*) FROM sb_inbox_schema_migrations WHERE version = 2";

#[cfg(feature = "postgres")]
const PG_COUNTS: &str = "SELECT
    (SELECT count(*) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), 0)::bigint FROM inventory_stock),
    (SELECT coalesce(sum(quantity), 0)::bigint FROM inventory_reservation_line),
    (SELECT count(*) FROM sb_inbox WHERE consumer = $1)";

#[cfg(feature = "sqlite")]
const SQLITE_COUNTS: &str = "SELECT
    (SELECT count(*) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), 0) FROM inventory_stock),
    (SELECT coalesce(sum(quantity), 0) FROM inventory_reservation_line),
    (SELECT count(*) FROM sb_inbox WHERE consumer = ?1)";

#[cfg(feature = "mssql")]
const MSSQL_COUNTS: &str = "SELECT
    (SELECT CAST(count(*) AS bigint) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), CAST(0 AS bigint)) FROM inventory_stock),
    (SELECT coalesce(sum(CAST(quantity AS bigint)), CAST(0 AS bigint)) FROM inventory_reservation_line),
    (SELECT CAST(count(*) AS bigint) FROM sb_inbox WHERE consumer = @P1)";

#[cfg(feature = "postgres")]
impl InventoryTx for PgTx {
    /// The reservation, its lines and the stock upserts need nothing from one another: one
    /// round trip ([`PgTx::pipeline`]), with the upserts still in SKU order.
    async fn reserve(&mut self, logical_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        pg_reserve(self, None, logical_id, order).await
    }

    /// The claim needs nothing from the reservation either: it goes first in the same round
    /// trip ([`PgTx::claim_business_key_then`]).
    async fn claim_and_reserve(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
        order: &OrderPlaced,
    ) -> Result<(), StoreError> {
        pg_reserve(self, Some((consumer, key)), logical_id, order).await
    }

    async fn release_reservation(&mut self, order_id: &str) -> Result<bool, StoreError> {
        let rows = self
            .query(
                "SELECT sku, quantity FROM inventory_reservation_line WHERE order_id = $1 FOR UPDATE",
                &[&order_id],
            )
            .await?;
        let lines = rows
            .iter()
            .map(|row| (row.get::<_, String>(0), row.get::<_, i32>(1)));
        for (sku, units) in units_by_sku(lines) {
            self.execute(
                "UPDATE inventory_stock SET reserved = reserved - $2 WHERE sku = $1",
                &[&sku, &units],
            )
            .await?;
        }
        self.execute(
            "DELETE FROM inventory_reservation_line WHERE order_id = $1",
            &[&order_id],
        )
        .await?;
        let released = self
            .execute(
                "DELETE FROM inventory_reservation WHERE order_id = $1",
                &[&order_id],
            )
            .await?;
        Ok(released > 0)
    }
}

/// The reservation's statements in one round trip, behind the claim of `claim` (consumer,
/// business key) when given.
#[cfg(feature = "postgres")]
async fn pg_reserve(
    tx: &mut PgTx,
    claim: Option<(&str, &str)>,
    logical_id: &str,
    order: &OrderPlaced,
) -> Result<(), StoreError> {
    const RESERVATION: &str =
        "INSERT INTO inventory_reservation (order_id, message_id) VALUES ($1, $2)";
    const LINE: &str = "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ($1, $2, $3, $4)";
    const STOCK: &str = "INSERT INTO inventory_stock (sku, reserved) VALUES ($1, $2)
                 ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved";
    let line_numbers: Vec<i32> = (1..).take(order.lines.len()).collect();
    let stock: Vec<(&str, i64)> = order.stock_by_sku().into_iter().collect();
    let reservation: [&(dyn ToSql + Sync); 2] = [&order.order_id, &logical_id];
    let lines: Vec<[&(dyn ToSql + Sync); 4]> = line_numbers
        .iter()
        .zip(&order.lines)
        .map(|(line_no, line)| -> [&(dyn ToSql + Sync); 4] {
            [&order.order_id, line_no, &line.sku, &line.quantity]
        })
        .collect();
    let upserts: Vec<[&(dyn ToSql + Sync); 2]> = stock
        .iter()
        .map(|(sku, units)| -> [&(dyn ToSql + Sync); 2] { [sku, units] })
        .collect();
    let mut statements: Vec<(&str, &[&(dyn ToSql + Sync)])> =
        Vec::with_capacity(1 + lines.len() + upserts.len());
    statements.push((RESERVATION, &reservation));
    statements.extend(lines.iter().map(|params| (LINE, &params[..])));
    statements.extend(upserts.iter().map(|params| (STOCK, &params[..])));
    match claim {
        Some((consumer, key)) => tx
            .claim_business_key_then(consumer, key, logical_id, &statements)
            .await
            .map(drop),
        None => tx.pipeline(&statements).await.map(drop),
    }
}

#[cfg(feature = "sqlite")]
impl InventoryTx for SqliteTx {
    async fn reserve(&mut self, logical_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (?1, ?2)",
            rusqlite::params![order.order_id, logical_id],
        )?;
        for (line_no, line) in (1i32..).zip(&order.lines) {
            self.execute(
                "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES (?1, ?2, ?3, ?4)",
                rusqlite::params![order.order_id, line_no, line.sku, line.quantity],
            )?;
        }
        for (sku, units) in order.stock_by_sku() {
            self.execute(
                "INSERT INTO inventory_stock (sku, reserved) VALUES (?1, ?2)
                 ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved",
                rusqlite::params![sku, units],
            )?;
        }
        Ok(())
    }

    /// One statement per table: SQLite has one writer, so the stock rows need no lock order.
    async fn release_reservation(&mut self, order_id: &str) -> Result<bool, StoreError> {
        self.execute(
            "UPDATE inventory_stock SET reserved = reserved - (
                 SELECT sum(quantity) FROM inventory_reservation_line l
                 WHERE l.order_id = ?1 AND l.sku = inventory_stock.sku)
             WHERE sku IN (SELECT sku FROM inventory_reservation_line WHERE order_id = ?1)",
            [order_id],
        )?;
        self.execute(
            "DELETE FROM inventory_reservation_line WHERE order_id = ?1",
            [order_id],
        )?;
        let released = self.execute(
            "DELETE FROM inventory_reservation WHERE order_id = ?1",
            [order_id],
        )?;
        Ok(released > 0)
    }
}

/// Orders with more lines than this take one round trip per statement on SQL Server instead of
/// one batch: a request carries at most 2100 parameters.
#[cfg(feature = "mssql")]
const MSSQL_BATCH_LINES: usize = 300;

#[cfg(feature = "mssql")]
const MSSQL_RESERVATION: &str =
    "INSERT INTO inventory_reservation (order_id, message_id) VALUES (@P1, @P2);";
/// `{line_no}`, `{sku}`, `{quantity}` stand for parameter names (`@P1` is the order id).
#[cfg(feature = "mssql")]
const MSSQL_LINE: &str = "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES (@P1, {line_no}, {sku}, {quantity});";
/// Update-then-insert under a key-range lock: two orders for a new SKU cannot both insert it.
/// `{sku}` and `{units}` stand for parameter names.
#[cfg(feature = "mssql")]
const MSSQL_UPSERT: &str = "UPDATE inventory_stock WITH (UPDLOCK, HOLDLOCK) SET reserved = reserved + {units} WHERE sku = {sku};
IF @@ROWCOUNT = 0 INSERT INTO inventory_stock (sku, reserved) VALUES ({sku}, {units});";

#[cfg(feature = "mssql")]
fn mssql_line(line_no: usize, sku: usize, quantity: usize) -> String {
    MSSQL_LINE
        .replace("{line_no}", &format!("@P{line_no}"))
        .replace("{sku}", &format!("@P{sku}"))
        .replace("{quantity}", &format!("@P{quantity}"))
}

#[cfg(feature = "mssql")]
fn mssql_upsert(sku: usize, units: usize) -> String {
    MSSQL_UPSERT
        .replace("{sku}", &format!("@P{sku}"))
        .replace("{units}", &format!("@P{units}"))
}

/// The reservation of an order of `lines` lines over `skus` SKUs as one SQL Server batch.
/// Parameters: `@P1` order id, `@P2` message id, then per line its number, SKU and quantity,
/// then per SKU (in SKU order) the SKU and its units.
#[cfg(feature = "mssql")]
fn mssql_reserve_batch(lines: usize, skus: usize) -> String {
    let mut statements = vec![MSSQL_RESERVATION.to_owned()];
    let mut next = 3;
    for _ in 0..lines {
        statements.push(mssql_line(next, next + 1, next + 2));
        next += 3;
    }
    for _ in 0..skus {
        statements.push(mssql_upsert(next, next + 1));
        next += 2;
    }
    statements.join("\n")
}

#[cfg(feature = "mssql")]
impl InventoryTx for MssqlTx {
    /// One batch, one round trip. With `XACT_ABORT ON` its first error ends the batch and the
    /// transaction; after a savepoint (`XACT_ABORT OFF`) the statements after a failed one may
    /// still run, but the transaction keeps the first error and only a rollback follows.
    async fn reserve(&mut self, logical_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        if order.lines.len() > MSSQL_BATCH_LINES {
            return mssql_reserve_one_by_one(self, logical_id, order).await;
        }
        let order_id = order.order_id.as_str();
        let line_numbers: Vec<i32> = (1..).take(order.lines.len()).collect();
        let skus: Vec<&str> = order.lines.iter().map(|line| line.sku.as_str()).collect();
        let stock: Vec<(&str, i64)> = order.stock_by_sku().into_iter().collect();
        let mut params: Vec<&dyn tiberius::ToSql> = vec![&order_id, &logical_id];
        for ((line_no, sku), line) in line_numbers.iter().zip(&skus).zip(&order.lines) {
            params.extend([line_no as &dyn tiberius::ToSql, sku, &line.quantity]);
        }
        for (sku, units) in &stock {
            params.extend([sku as &dyn tiberius::ToSql, units]);
        }
        let sql = mssql_reserve_batch(order.lines.len(), stock.len());
        self.execute(&sql, &params).await.map(drop)
    }

    async fn release_reservation(&mut self, order_id: &str) -> Result<bool, StoreError> {
        let rows = self
            .query(
                "SELECT sku, quantity FROM inventory_reservation_line WITH (UPDLOCK) WHERE order_id = @P1",
                &[&order_id],
            )
            .await?;
        let mut lines = Vec::with_capacity(rows.len());
        for row in &rows {
            let sku = row
                .try_get::<&str, _>(0)
                .map_err(sb_inbox::store::mssql::classify)?
                .unwrap_or_default()
                .to_owned();
            let quantity = row
                .try_get::<i32, _>(1)
                .map_err(sb_inbox::store::mssql::classify)?
                .unwrap_or_default();
            lines.push((sku, quantity));
        }
        for (sku, units) in units_by_sku(lines) {
            self.execute(
                "UPDATE inventory_stock SET reserved = reserved - @P2 WHERE sku = @P1",
                &[&sku.as_str(), &units],
            )
            .await?;
        }
        self.execute(
            "DELETE FROM inventory_reservation_line WHERE order_id = @P1",
            &[&order_id],
        )
        .await?;
        let released = self
            .execute(
                "DELETE FROM inventory_reservation WHERE order_id = @P1",
                &[&order_id],
            )
            .await?;
        Ok(released > 0)
    }
}

/// [`InventoryTx::reserve`] a statement at a time, for orders too large for one batch. A free
/// function: a consumer cannot add methods to the library's `MssqlTx`.
#[cfg(feature = "mssql")]
async fn mssql_reserve_one_by_one(
    tx: &mut MssqlTx,
    logical_id: &str,
    order: &OrderPlaced,
) -> Result<(), StoreError> {
    let order_id = order.order_id.as_str();
    tx.execute(MSSQL_RESERVATION, &[&order_id, &logical_id])
        .await?;
    let line = mssql_line(2, 3, 4);
    for (line_no, item) in (1i32..).zip(&order.lines) {
        tx.execute(
            &line,
            &[&order_id, &line_no, &item.sku.as_str(), &item.quantity],
        )
        .await?;
    }
    let upsert = mssql_upsert(1, 2);
    for (sku, units) in order.stock_by_sku() {
        tx.execute(&upsert, &[&sku, &units]).await?;
    }
    Ok(())
}

#[cfg(feature = "mssql")]
impl InventoryStore for MssqlStore {
    async fn migrate_inventory(&self) -> Result<usize, StoreError> {
        self.apply_migrations(&[MSSQL_MIGRATION]).await
    }

    async fn inventory_migrated(&self) -> Result<bool, StoreError> {
        let rows = self.query(RECORDED, &[]).await?;
        Ok(rows
            .first()
            .and_then(|row| row.get::<i32, _>(0))
            .is_some_and(|n| n > 0))
    }

    async fn inventory_counts(&self) -> Result<InventoryCounts, StoreError> {
        let rows = self.query(MSSQL_COUNTS, &[&CONSUMER]).await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::of_kind(sb_inbox::ErrorKind::Unknown, "counts query returned no row")
        })?;
        let column = |index: usize| -> Result<i64, StoreError> {
            row.try_get::<i64, _>(index)
                .map(Option::unwrap_or_default)
                .map_err(sb_inbox::store::mssql::classify)
        };
        Ok(InventoryCounts {
            reservations: column(0)?,
            reserved_units: column(1)?,
            line_units: column(2)?,
            inbox_rows: column(3)?,
        })
    }
}

#[cfg(feature = "postgres")]
impl InventoryStore for PgStore {
    async fn migrate_inventory(&self) -> Result<usize, StoreError> {
        self.apply_migrations(&[PG_MIGRATION]).await
    }

    async fn inventory_migrated(&self) -> Result<bool, StoreError> {
        let rows = self.query(RECORDED, &[]).await?;
        Ok(rows.first().is_some_and(|row| row.get::<_, i64>(0) > 0))
    }

    async fn inventory_counts(&self) -> Result<InventoryCounts, StoreError> {
        let rows = self.query(PG_COUNTS, &[&CONSUMER]).await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::of_kind(sb_inbox::ErrorKind::Unknown, "counts query returned no row")
        })?;
        Ok(InventoryCounts {
            reservations: row.get(0),
            reserved_units: row.get(1),
            line_units: row.get(2),
            inbox_rows: row.get(3),
        })
    }
}

#[cfg(feature = "sqlite")]
impl InventoryStore for SqliteStore {
    async fn migrate_inventory(&self) -> Result<usize, StoreError> {
        self.apply_migrations(&[SQLITE_MIGRATION]).await
    }

    async fn inventory_migrated(&self) -> Result<bool, StoreError> {
        self.with_connection(|conn| conn.query_row(RECORDED, [], |row| row.get::<_, i64>(0)))
            .await
            .map(|n| n > 0)
    }

    async fn inventory_counts(&self) -> Result<InventoryCounts, StoreError> {
        self.with_connection(|conn| {
            conn.query_row(SQLITE_COUNTS, [CONSUMER], |row| {
                Ok(InventoryCounts {
                    reservations: row.get(0)?,
                    reserved_units: row.get(1)?,
                    line_units: row.get(2)?,
                    inbox_rows: row.get(3)?,
                })
            })
        })
        .await
    }
}

#[cfg(all(test, feature = "mssql"))]
mod tests {
    use super::*;

    /// Every parameter of the batch is numbered once, in the order `reserve` binds them.
    #[test]
    fn mssql_batch_numbers_parameters_in_binding_order() {
        let sql = mssql_reserve_batch(2, 2);
        assert_eq!(
            sql,
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (@P1, @P2);
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES (@P1, @P3, @P4, @P5);
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES (@P1, @P6, @P7, @P8);
UPDATE inventory_stock WITH (UPDLOCK, HOLDLOCK) SET reserved = reserved + @P10 WHERE sku = @P9;
IF @@ROWCOUNT = 0 INSERT INTO inventory_stock (sku, reserved) VALUES (@P9, @P10);
UPDATE inventory_stock WITH (UPDLOCK, HOLDLOCK) SET reserved = reserved + @P12 WHERE sku = @P11;
IF @@ROWCOUNT = 0 INSERT INTO inventory_stock (sku, reserved) VALUES (@P11, @P12);"
        );
        // The largest batch stays under SQL Server's 2100 parameters.
        let most = 2 + 3 * MSSQL_BATCH_LINES + 2 * MSSQL_BATCH_LINES;
        assert!(most < 2100);
        assert!(
            mssql_reserve_batch(MSSQL_BATCH_LINES, MSSQL_BATCH_LINES)
                .contains(&format!("@P{most}"))
        );
    }
}
