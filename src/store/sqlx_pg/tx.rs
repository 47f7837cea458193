//! The sqlx PostgreSQL transaction ([`SqlxPgTx`]): `BEGIN` sent with the first statement, the
//! first-error rule, savepoints, a commit that notices an aborted transaction, and the sqlx
//! connection lent to the handler.

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgArguments, PgConnection, PgQueryResult, PgRow};
use sqlx::query::Query;
use sqlx::{AssertSqlSafe, Executor, Postgres, Row};

use super::{SqlxPgStore, classify};
use crate::ports::{
    InboxEntry, OutboxMessage, Savepoint, Store, StoreError, StoreTx, Tx, Verdict, VersionCheck,
};
use crate::store::tx_state::{TxState, rollback_to_sql, version_verdict};

/// Commits, after a statement that fails in an aborted transaction: PostgreSQL answers a
/// `COMMIT` there with `ROLLBACK` and no error, and sqlx does not show the command tag. In an
/// aborted transaction the probe fails (25P02) and the rest of the message is skipped;
/// otherwise it costs nothing, sent in the same message (as `PgTx`'s commit).
const COMMIT: &str = "SELECT 1; COMMIT";

/// The inbox insert.
const INBOX_INSERT: &str = "INSERT INTO sb_inbox (consumer, message_id) VALUES ($1, $2)";

/// A sqlx query with bound parameters, as `sqlx::query(..).bind(..)` builds it.
pub type PgQuery<'q> = Query<'q, Postgres, PgArguments>;

impl Store for SqlxPgStore {
    type Tx = SqlxPgTx;

    /// Checks a connection out of the pool; sends nothing. `BEGIN` goes before the first
    /// statement.
    async fn begin(&self) -> Result<SqlxPgTx, StoreError> {
        let conn = self.pool.acquire().await.map_err(classify)?;
        Ok(SqlxPgTx {
            conn,
            state: TxState::default(),
            begun: false,
            open: false,
        })
    }
}

/// An open PostgreSQL transaction on a pooled sqlx connection. Dropping it without commit or
/// rollback closes the connection, which ends the transaction on the server (the pool never
/// hands out a connection inside a transaction).
///
/// The handler's own sqlx queries run on [`SqlxPgTx::conn`] (the connection that holds the
/// inbox row), or through [`SqlxPgTx::execute`] and [`SqlxPgTx::fetch_all`], which also keep
/// [`Tx`]'s first-error rule. After a failed statement PostgreSQL aborts the transaction, and
/// the commit then fails whichever way the statement ran. Use [`Tx::savepoint`] to go on after
/// an expected error.
#[derive(Debug)]
pub struct SqlxPgTx {
    conn: PoolConnection<Postgres>,
    state: TxState,
    /// `BEGIN` was sent.
    begun: bool,
    /// The server may be inside the transaction: set before `BEGIN` goes out, cleared once a
    /// `COMMIT` or `ROLLBACK` answered. Still set on drop: the connection is closed.
    open: bool,
}

impl Drop for SqlxPgTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

impl SqlxPgTx {
    /// The sqlx connection inside this transaction, for the handler's own queries
    /// (`sqlx::query(..).execute(tx.conn().await?)`). Sends `BEGIN` first if no statement has
    /// yet. Queries run here bypass the first-error rule (a failed one is still caught: the
    /// commit fails); prefer [`SqlxPgTx::execute`] and [`SqlxPgTx::fetch_all`]. Do not end the
    /// transaction on it (`COMMIT`, `ROLLBACK`): the runtime commits after the handler.
    ///
    /// # Errors
    /// [`StoreError::refused`] after an earlier failure; the classified error of `BEGIN`.
    pub async fn conn(&mut self) -> Result<&mut PgConnection, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        Ok(&mut self.conn)
    }

    /// Executes a sqlx query in the transaction, classifying its error; refused after an
    /// earlier failure.
    ///
    /// # Errors
    /// The classified [`StoreError`]; [`StoreError::refused`] after an earlier failure.
    pub async fn execute(&mut self, query: PgQuery<'_>) -> Result<PgQueryResult, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        let result = query.execute(&mut *self.conn).await.map_err(classify);
        self.state.record(result)
    }

    /// Runs a sqlx query in the transaction and returns its rows; as [`SqlxPgTx::execute`].
    ///
    /// # Errors
    /// As [`SqlxPgTx::execute`].
    pub async fn fetch_all(&mut self, query: PgQuery<'_>) -> Result<Vec<PgRow>, StoreError> {
        self.state.check()?;
        self.ensure_begun().await?;
        let result = query.fetch_all(&mut *self.conn).await.map_err(classify);
        self.state.record(result)
    }

    /// Sends `BEGIN` unless it was sent.
    async fn ensure_begun(&mut self) -> Result<(), StoreError> {
        if self.begun {
            return Ok(());
        }
        self.begun = true;
        self.open = true;
        let result = self.simple("BEGIN").await;
        self.state.record(result)
    }

    /// A simple-protocol batch (no parameters), classified.
    async fn simple(&mut self, sql: &str) -> Result<(), StoreError> {
        self.conn
            .execute(sqlx::raw_sql(AssertSqlSafe(sql.to_owned())))
            .await
            .map(drop)
            .map_err(classify)
    }

    /// Ends the transaction with `sql`; on failure rolls back, so the connection stays
    /// reusable (outside a transaction `ROLLBACK` only warns). Nothing to send when `BEGIN`
    /// never was.
    async fn finish(mut self, sql: &str) -> Result<(), StoreError> {
        if !self.begun {
            return Ok(());
        }
        let result = self.simple(sql).await;
        let ended = match &result {
            Ok(()) => true,
            Err(_) => self.simple("ROLLBACK").await.is_ok(),
        };
        if ended {
            self.open = false;
        }
        result
    }
}

impl Tx for SqlxPgTx {
    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ($1, $2, $3)",
        );
        self.execute(query.bind(consumer).bind(key).bind(logical_id))
            .await
            .map(drop)
    }

    async fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> Result<VersionCheck, StoreError> {
        let upsert = sqlx::query(
            "INSERT INTO sb_inbox_aggregate_version (consumer, aggregate, version) VALUES ($1, $2, $3)
             ON CONFLICT (consumer, aggregate) DO UPDATE
                SET version = excluded.version, updated_at = now()
              WHERE sb_inbox_aggregate_version.version < excluded.version",
        );
        let changed = self
            .execute(upsert.bind(consumer).bind(aggregate).bind(version))
            .await?
            .rows_affected();
        let verdict = version_verdict(changed == 1, async {
            let read = sqlx::query(
                "SELECT version FROM sb_inbox_aggregate_version WHERE consumer = $1 AND aggregate = $2",
            );
            let rows = self.fetch_all(read.bind(consumer).bind(aggregate)).await?;
            rows.first()
                .map(|row| row.try_get::<i64, _>(0).map_err(classify))
                .transpose()
        })
        .await;
        // A contradiction fails the transaction as a failed statement does.
        self.state.record(verdict)
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let columns = self.state.record(crate::store::outbox_columns(message))?;
        let insert = sqlx::query(
            "INSERT INTO sb_outbox (message_id, destination, subject, correlation_id, content_type,
                 application_properties, body, session_id, partition_key, scheduled_enqueue_time,
                 time_to_live_ms, to_address, reply_to)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9,
                     'epoch'::timestamptz + $10::bigint * interval '1 microsecond', $11, $12, $13)",
        );
        let insert = insert
            .bind(&message.message_id)
            .bind(&message.destination)
            .bind(&message.subject)
            .bind(&message.correlation_id)
            .bind(&message.content_type)
            .bind(columns.properties)
            .bind(&message.body)
            .bind(&message.session_id)
            .bind(&message.partition_key)
            .bind(message.scheduled_enqueue_time.map(micros))
            .bind(columns.time_to_live_ms)
            .bind(&message.to)
            .bind(&message.reply_to);
        self.execute(insert).await.map(drop)
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let savepoint = self.state.next_savepoint()?;
        let mut sql = self.state.savepoint_sql(&savepoint);
        if !self.begun {
            // One simple-protocol message: if BEGIN fails the rest of it is skipped.
            sql.insert_str(0, "BEGIN; ");
            self.begun = true;
            self.open = true;
        }
        let result = self.simple(&sql).await;
        self.state.record(result)?;
        self.state.marked(&savepoint);
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        let result = self.simple(&rollback_to_sql(&savepoint)).await;
        self.state.rolled_back(&savepoint, result)
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.release(&savepoint, true)
    }
}

impl StoreTx for SqlxPgTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        let query = sqlx::query(INBOX_INSERT).bind(consumer).bind(logical_id);
        self.execute(query).await.map(drop)
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        let query = sqlx::query(crate::store::pg_verdict::INSERT);
        let query = query
            .bind(consumer)
            .bind(logical_id)
            .bind(verdict.reason.as_str())
            .bind(verdict.resubmission);
        self.execute(query).await.map(drop)
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        let read = sqlx::query(crate::store::pg_verdict::READ);
        let rows = self.fetch_all(read.bind(consumer).bind(logical_id)).await?;
        let entry = rows
            .first()
            .map(|row| {
                Ok(crate::store::inbox_entry(
                    row.try_get(0).map_err(classify)?,
                    row.try_get(1).map_err(classify)?,
                ))
            })
            .transpose();
        self.state.record(entry)
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        let delete = sqlx::query(crate::store::pg_verdict::TAKE_OVER);
        let deleted = self
            .execute(delete.bind(consumer).bind(logical_id).bind(resubmission))
            .await?
            .rows_affected();
        Ok(deleted > 0)
    }

    async fn bound_lock_waits(&mut self, limit: std::time::Duration) -> Result<(), StoreError> {
        self.state.check()?;
        // `SET LOCAL` ends with the transaction, so the pooled connection goes back with the
        // server's default. The value is a number of ours, so it can be written into the text,
        // and the statement can go in one simple-protocol message with `BEGIN` when this is the
        // first statement (as the batch runtime sends it): the round trip sqlx's API would
        // otherwise spend on `BEGIN` alone. If `BEGIN` fails, the rest of the message is
        // skipped.
        let mut sql = format!("SET LOCAL lock_timeout = '{}ms'", limit.as_millis().max(1));
        if !self.begun {
            sql.insert_str(0, "BEGIN; ");
            self.begun = true;
            self.open = true;
        }
        let result = self.simple(&sql).await;
        self.state.record(result)
    }

    async fn commit(self) -> Result<(), StoreError> {
        if let Err(refused) = self.state.check() {
            if let Err(error) = self.finish("ROLLBACK").await {
                tracing::warn!(%error, "Rollback failed; the connection is discarded.");
            }
            return Err(refused);
        }
        self.finish(COMMIT).await
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.finish("ROLLBACK").await
    }
}

/// `at` in microseconds since 1970, which the insert turns into a `timestamptz` exactly
/// (`'epoch' + n * 1 µs`, PostgreSQL's own resolution): sqlx binds `std::time::SystemTime` only
/// through the `chrono` or `time` crates, which this store does not pull in.
fn micros(at: std::time::SystemTime) -> i64 {
    let clamp = |micros: u128| i64::try_from(micros).unwrap_or(i64::MAX);
    match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(after) => clamp(after.as_micros()),
        Err(before) => -clamp(before.duration().as_micros()),
    }
}
