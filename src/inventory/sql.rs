//! The inventory statements for each store.

use tokio_postgres::types::ToSql;

use super::{
    CONSUMER, InventoryCounts, InventoryStore, InventoryTx, MIGRATION_VERSION, OrderPlaced,
};
use crate::store::Migration;
use crate::{MssqlStore, MssqlTx, PgStore, PgTx, SqliteStore, SqliteTx, StoreError};

const NAME: &str = "0002_inventory.sql";

const PG_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/postgres/0002_inventory.sql"),
};

const SQLITE_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/sqlite/0002_inventory.sql"),
};

const MSSQL_MIGRATION: Migration = Migration {
    version: MIGRATION_VERSION,
    name: NAME,
    sql: include_str!("../../sql/mssql/0002_inventory.sql"),
};

/// Counts the inventory migration's bookkeeping row (a table every store's `migrate` creates).
const RECORDED: &str = "SELECT count(*) FROM sb_inbox_schema_migrations WHERE version = 2";

const PG_COUNTS: &str = "SELECT
    (SELECT count(*) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), 0)::bigint FROM inventory_stock),
    (SELECT coalesce(sum(quantity), 0)::bigint FROM inventory_reservation_line),
    (SELECT count(*) FROM sb_inbox WHERE consumer = $1)";

const SQLITE_COUNTS: &str = "SELECT
    (SELECT count(*) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), 0) FROM inventory_stock),
    (SELECT coalesce(sum(quantity), 0) FROM inventory_reservation_line),
    (SELECT count(*) FROM sb_inbox WHERE consumer = ?1)";

const MSSQL_COUNTS: &str = "SELECT
    (SELECT CAST(count(*) AS bigint) FROM inventory_reservation),
    (SELECT coalesce(sum(reserved), CAST(0 AS bigint)) FROM inventory_stock),
    (SELECT coalesce(sum(CAST(quantity AS bigint)), CAST(0 AS bigint)) FROM inventory_reservation_line),
    (SELECT CAST(count(*) AS bigint) FROM sb_inbox WHERE consumer = @P1)";

impl InventoryTx for PgTx {
    /// The reservation, its lines and the stock upserts need nothing from one another: one
    /// round trip ([`PgTx::pipeline`]), with the upserts still in SKU order.
    async fn reserve(&mut self, message_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        const RESERVATION: &str =
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ($1, $2)";
        const LINE: &str = "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ($1, $2, $3, $4)";
        const STOCK: &str = "INSERT INTO inventory_stock (sku, reserved) VALUES ($1, $2)
                 ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved";
        let line_numbers: Vec<i32> = (1..).take(order.lines.len()).collect();
        let stock: Vec<(&str, i64)> = order.stock_by_sku().into_iter().collect();
        let reservation: [&(dyn ToSql + Sync); 2] = [&order.order_id, &message_id];
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
        self.pipeline(&statements).await.map(drop)
    }
}

impl InventoryTx for SqliteTx {
    async fn reserve(&mut self, message_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (?1, ?2)",
            rusqlite::params![order.order_id, message_id],
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
}

impl InventoryTx for MssqlTx {
    async fn reserve(&mut self, message_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (@P1, @P2)",
            &[&order.order_id.as_str(), &message_id],
        )
        .await?;
        for (line_no, line) in (1i32..).zip(&order.lines) {
            self.execute(
                "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES (@P1, @P2, @P3, @P4)",
                &[&order.order_id.as_str(), &line_no, &line.sku.as_str(), &line.quantity],
            )
            .await?;
        }
        for (sku, units) in order.stock_by_sku() {
            // Update-then-insert under a key-range lock: two orders for a new SKU cannot both
            // insert it.
            self.execute(
                "UPDATE inventory_stock WITH (UPDLOCK, HOLDLOCK) SET reserved = reserved + @P2 WHERE sku = @P1;
                 IF @@ROWCOUNT = 0 INSERT INTO inventory_stock (sku, reserved) VALUES (@P1, @P2);",
                &[&sku, &units],
            )
            .await?;
        }
        Ok(())
    }
}

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
            StoreError::new(
                crate::ErrorKind::Unknown,
                None,
                None,
                "counts query returned no row",
            )
        })?;
        let column = |index: usize| -> Result<i64, StoreError> {
            row.try_get::<i64, _>(index)
                .map(Option::unwrap_or_default)
                .map_err(crate::store::mssql::classify)
        };
        Ok(InventoryCounts {
            reservations: column(0)?,
            reserved_units: column(1)?,
            line_units: column(2)?,
            inbox_rows: column(3)?,
        })
    }
}

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
            StoreError::new(
                crate::ErrorKind::Unknown,
                None,
                None,
                "counts query returned no row",
            )
        })?;
        Ok(InventoryCounts {
            reservations: row.get(0),
            reserved_units: row.get(1),
            line_units: row.get(2),
            inbox_rows: row.get(3),
        })
    }
}

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
