//! SQLite store: the embedded default.
//!
//! One connection per [`SqliteStore`], behind an async mutex: SQLite has a single writer, so
//! transactions queue here instead of spinning on `SQLITE_BUSY`. Several stores (or processes)
//! on one file serialise through SQLite's own locks (`BEGIN IMMEDIATE`, busy timeout 5 s); a
//! busy database past the timeout is a transient error. Statements are microseconds long and run
//! on the calling task.

mod classify;
mod outbox;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, params};
use tokio::sync::{Mutex, OwnedMutexGuard};

pub use classify::classify;

use super::Migration;
use super::tx_state::{TxState, rollback_to_sql, version_verdict};
use crate::ports::{
    ErrorKind, InboxEntry, OutboxMessage, Savepoint, Store, StoreError, StoreTx, Tx, Verdict,
    VersionCheck,
};

/// The SQLite core migrations, in order: inbox, business keys, aggregate versions, outbox
/// (versions: see [`Migration`]).
pub const MIGRATIONS: &[Migration] = crate::store::migrations!("sqlite": 1 => "0001_inbox.sql", 3 => "0003_outbox_relay.sql", 5 => "0005_outbox_publishing.sql", 6 => "0006_inbox_verdict.sql");

/// A SQLite store.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), sb_inbox::StoreError> {
/// use sb_inbox::{SqliteStore, Store, StoreTx};
/// let store = SqliteStore::open_in_memory()?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.insert_inbox("inventory", "m-1").await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqliteStore {
    conn: Arc<Mutex<Connection>>,
    /// Serialises writers of the same file within this process. SQLite has one writer per
    /// file; without this, two stores on one file would wait for each other inside
    /// `BEGIN IMMEDIATE`, blocking the runtime's threads for up to the busy timeout. Other
    /// processes still meet SQLite's own lock and the busy timeout.
    writer: Arc<Mutex<()>>,
}

/// One writer lock per database file in this process.
fn writer_for(path: &Path) -> Arc<Mutex<()>> {
    static WRITERS: std::sync::LazyLock<std::sync::Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>> =
        std::sync::LazyLock::new(Default::default);
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut writers = WRITERS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    writers.entry(key).or_default().clone()
}

impl SqliteStore {
    /// Opens (or creates) a database file, in WAL mode.
    ///
    /// # Errors
    /// A [`StoreError`] when the file cannot be opened.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let conn = Connection::open(path.as_ref()).map_err(classify)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(classify)?;
        Self::configure(conn, writer_for(path.as_ref()))
    }

    /// Opens a private in-memory database.
    ///
    /// # Errors
    /// A [`StoreError`] when SQLite cannot allocate it.
    pub fn open_in_memory() -> Result<Self, StoreError> {
        Self::configure(
            Connection::open_in_memory().map_err(classify)?,
            Arc::default(),
        )
    }

    fn configure(conn: Connection, writer: Arc<Mutex<()>>) -> Result<Self, StoreError> {
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(classify)?;
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(classify)?;
        Ok(SqliteStore {
            conn: Arc::new(Mutex::new(conn)),
            writer,
        })
    }

    /// Sets how long a transaction waits for another writer on the same file before failing
    /// with a transient `SQLITE_BUSY`.
    ///
    /// # Errors
    /// A [`StoreError`] from SQLite.
    pub async fn set_busy_timeout(&self, timeout: Duration) -> Result<(), StoreError> {
        self.conn
            .lock()
            .await
            .busy_timeout(timeout)
            .map_err(classify)
    }

    /// Applies the core migrations not applied yet; returns how many ran.
    ///
    /// # Errors
    /// As [`Self::apply_migrations`].
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        self.apply_migrations(MIGRATIONS).await
    }

    /// Applies the migrations of `set` not applied yet (the hook for a consumer's own schema:
    /// the same bookkeeping table, one version space); returns how many ran.
    ///
    /// # Errors
    /// A [`StoreError`] from the first failing script; earlier ones stay applied.
    pub async fn apply_migrations(&self, set: &[Migration]) -> Result<usize, StoreError> {
        let mut conn = self.conn.lock().await;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS sb_inbox_schema_migrations (
                 version INTEGER NOT NULL CONSTRAINT pk_sb_inbox_schema_migrations PRIMARY KEY,
                 name TEXT NOT NULL,
                 applied_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')))",
        )
        .map_err(classify)?;
        let mut applied = 0;
        for migration in set {
            let tx = conn
                .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                .map_err(classify)?;
            let done: Option<i64> = tx
                .query_row(
                    "SELECT version FROM sb_inbox_schema_migrations WHERE version = ?1",
                    params![migration.version],
                    |row| row.get(0),
                )
                .optional()
                .map_err(classify)?;
            if done.is_none() {
                tx.execute_batch(migration.sql).map_err(classify)?;
                tx.execute(
                    "INSERT INTO sb_inbox_schema_migrations (version, name) VALUES (?1, ?2)",
                    params![migration.version, migration.name],
                )
                .map_err(classify)?;
                applied += 1;
                tracing::info!(migration = migration.name, "Migration applied.");
            }
            tx.commit().map_err(classify)?;
        }
        Ok(applied)
    }

    /// Runs `f` on the connection outside any inbox transaction (reports, tests).
    ///
    /// # Errors
    /// The classified error `f` returns.
    pub async fn with_connection<T>(
        &self,
        f: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        let conn = self.conn.lock().await;
        f(&conn).map_err(classify)
    }
}

impl Store for SqliteStore {
    type Tx = SqliteTx;

    async fn begin(&self) -> Result<SqliteTx, StoreError> {
        let writer = self.writer.clone().lock_owned().await;
        let conn = self.conn.clone().lock_owned().await;
        conn.execute_batch("BEGIN IMMEDIATE").map_err(classify)?;
        Ok(SqliteTx {
            conn,
            _writer: writer,
            state: TxState::default(),
        })
    }
}

/// An open SQLite transaction. Dropping it rolls back.
///
/// SQLite itself undoes only the failed statement, but after some errors (a full disk, I/O,
/// `SQLITE_BUSY` in some modes) it rolls the whole transaction back and later statements would
/// autocommit; this type refuses every statement and the commit after the first error
/// ([`Tx`]'s rule), and any statement once the connection is no longer inside the
/// transaction. Use [`Tx::savepoint`] to go on after an expected error.
#[derive(Debug)]
pub struct SqliteTx {
    conn: OwnedMutexGuard<Connection>,
    _writer: OwnedMutexGuard<()>,
    state: TxState,
}

impl SqliteTx {
    /// The connection, for statements this type has no method for. Statements run through it
    /// bypass the first-error rule: prefer [`SqliteTx::execute`] and [`SqliteTx::query_row`].
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// Executes one statement, classifying its error; refused after an earlier failure.
    ///
    /// # Errors
    /// The classified [`StoreError`]; [`StoreError::refused`] after an earlier failure.
    pub fn execute(
        &mut self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<usize, StoreError> {
        self.statement(|conn| {
            conn.prepare_cached(sql)
                .and_then(|mut stmt| stmt.execute(params))
        })
    }

    /// Reads the first row, if any, classifying its error; refused after an earlier failure.
    ///
    /// # Errors
    /// As [`SqliteTx::execute`].
    pub fn query_row<T>(
        &mut self,
        sql: &str,
        params: impl rusqlite::Params,
        row: impl FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<Option<T>, StoreError> {
        self.statement(|conn| {
            conn.prepare_cached(sql)
                .and_then(|mut stmt| stmt.query_row(params, row).optional())
        })
    }

    /// Runs one statement inside the transaction, unless it failed or ended already.
    fn statement<T>(
        &mut self,
        run: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, StoreError> {
        self.state.check()?;
        if self.conn.is_autocommit() {
            return self.state.record(Err(StoreError::of_kind(
                ErrorKind::Unknown,
                "SQLite ended the transaction (it rolls back after some errors); statement refused",
            )));
        }
        self.state.record(run(&self.conn).map_err(classify))
    }

    /// Ends the transaction with `sql`. A failed `COMMIT` (a deferred foreign key, a busy
    /// database) leaves the transaction open on the store's only connection: roll it back, or
    /// every later `BEGIN` would fail. SQLite says whether a transaction is open.
    fn finish(&mut self, sql: &str) -> Result<(), StoreError> {
        let result = self.conn.execute_batch(sql).map_err(classify);
        self.roll_back_if_open();
        result
    }

    fn roll_back_if_open(&self) {
        if !self.conn.is_autocommit()
            && let Err(error) = self.conn.execute_batch("ROLLBACK")
        {
            tracing::warn!(%error, "Rollback of a SQLite transaction failed.");
        }
    }
}

impl Drop for SqliteTx {
    fn drop(&mut self) {
        self.roll_back_if_open();
    }
}

impl Tx for SqliteTx {
    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES (?1, ?2, ?3)",
            params![consumer, key, logical_id],
        )
        .map(drop)
    }

    async fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> Result<VersionCheck, StoreError> {
        let changed = self.execute(
            "INSERT INTO sb_inbox_aggregate_version (consumer, aggregate, version) VALUES (?1, ?2, ?3)
             ON CONFLICT (consumer, aggregate) DO UPDATE
                SET version = excluded.version, updated_at = excluded.updated_at
              WHERE sb_inbox_aggregate_version.version < excluded.version",
            params![consumer, aggregate, version],
        )?;
        version_verdict(changed == 1, async {
            self.query_row(
                "SELECT version FROM sb_inbox_aggregate_version WHERE consumer = ?1 AND aggregate = ?2",
                params![consumer, aggregate],
                |row| row.get(0),
            )
        })
        .await
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let columns = self.state.record(super::outbox_columns(message))?;
        self.execute(
            "INSERT INTO sb_outbox (message_id, destination, subject, correlation_id, content_type,
                 application_properties, body, session_id, partition_key, scheduled_enqueue_time,
                 time_to_live_ms, to_address, reply_to)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,
                     strftime('%Y-%m-%dT%H:%M:%fZ', ?10 / 1000.0, 'unixepoch'), ?11, ?12, ?13)",
            params![
                message.message_id,
                message.destination,
                message.subject,
                message.correlation_id,
                message.content_type,
                columns.properties,
                message.body,
                message.session_id,
                message.partition_key,
                message.scheduled_enqueue_time.map(super::unix_millis),
                columns.time_to_live_ms,
                message.to,
                message.reply_to,
            ],
        )
        .map(drop)
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let savepoint = self.state.next_savepoint()?;
        let sql = self.state.savepoint_sql(&savepoint);
        self.statement(|conn| conn.execute_batch(&sql))?;
        self.state.marked(&savepoint);
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        let result = self
            .conn
            .execute_batch(&rollback_to_sql(&savepoint))
            .map_err(classify);
        self.state.rolled_back(&savepoint, result)
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.release(&savepoint, true)
    }
}

impl StoreTx for SqliteTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox (consumer, message_id) VALUES (?1, ?2)",
            params![consumer, logical_id],
        )
        .map(drop)
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO sb_inbox (consumer, message_id, verdict, verdict_resubmission) VALUES (?1, ?2, ?3, ?4)",
            params![consumer, logical_id, verdict.reason, verdict.resubmission],
        )
        .map(drop)
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        self.query_row(
            "SELECT verdict, verdict_resubmission FROM sb_inbox WHERE consumer = ?1 AND message_id = ?2",
            params![consumer, logical_id],
            |row| Ok(super::inbox_entry(row.get(0)?, row.get(1)?)),
        )
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        self.execute(
            "DELETE FROM sb_inbox WHERE consumer = ?1 AND message_id = ?2
                AND verdict IS NOT NULL AND coalesce(verdict_resubmission, 0) < ?3",
            params![consumer, logical_id, resubmission],
        )
        .map(|deleted| deleted > 0)
    }

    async fn bound_lock_waits(&mut self, _limit: std::time::Duration) -> Result<(), StoreError> {
        // No row locks: one writer holds the whole database, so batches cannot hold rows the
        // other needs; `busy_timeout` bounds the wait for the writer's lock.
        Ok(())
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        if let Err(refused) = self.state.check() {
            self.roll_back_if_open();
            return Err(refused);
        }
        self.finish("COMMIT")
    }

    async fn rollback(mut self) -> Result<(), StoreError> {
        self.finish("ROLLBACK")
    }
}
