//! PostgreSQL store on sqlx ([`SqlxPgStore`], feature `sqlx-postgres`): for a service whose
//! handlers write their own SQL with sqlx. Its transaction, [`SqlxPgTx`], lends the sqlx
//! connection that holds the inbox row ([`SqlxPgTx::conn`]), so the handler's queries commit or
//! roll back with it.
//!
//! Why a second PostgreSQL store and not a bridge from `PgStore`: a tokio-postgres
//! connection cannot be lent to sqlx (each driver owns its socket and protocol state), so the
//! one way to share the transaction is to open it on sqlx. Same schema, same migrations
//! (a database migrated by either store serves both), same classification of SQLSTATEs.
//!
//! # Layout
//! - here: the store, its pool and session bounds, the migrations, and error classification.
//! - `tx`: [`SqlxPgTx`], the [`Tx`](crate::Tx) port on a pooled sqlx connection.

mod tx;

use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Executor};

pub use tx::{PgQuery, SqlxPgTx};

use crate::ports::{ErrorKind, StoreError};
use crate::store::Migration;
use crate::store::pg_codes::kind_of_code;

/// `statement_timeout` and `lock_timeout` unless the URL sets them: the bounds `PgStore` sets
/// (`sb_inbox::store::postgres::STATEMENT_TIMEOUT`, `LOCK_TIMEOUT`), for the same reason (a
/// lock held elsewhere must not keep a message locked for ever).
const SESSION_BOUNDS: [(&str, &str); 2] = [("statement_timeout", "60s"), ("lock_timeout", "30s")];

/// Serialises concurrent `migrate` calls across processes (the same lock as `PgStore`'s).
const MIGRATION_LOCK: i64 = 0x5b1_0b0c;

/// A PostgreSQL store on a sqlx pool.
///
/// # What it does not do (yet)
/// It is a [`Store`](crate::Store): the inbox transaction, which a [`Runtime`](crate::Runtime)
/// runs handlers in (`testing::TestDb::run_sqlx` does that in tests). It is not yet a whole
/// worker's store:
/// - not an [`OutboxStore`](crate::OutboxStore): the outbox [`relay`](crate::relay) cannot
///   claim rows through it. Rows a handler appends here are the same `sb_outbox` rows
///   `PgStore` reads: run the relay on a `PgStore` over the same database.
/// - not a [`RetentionStore`](crate::RetentionStore): run [`retention`](crate::retention) on a
///   `PgStore` over the same database likewise.
/// - not a `worker::Ping` or `worker::OpenStore`, so `worker::Worker` (which needs all four)
///   and `Worker::from_config` cannot host it; host its consumers with
///   [`Runtime::run`](crate::Runtime::run) on a `servicebus::ServiceBusReceiver` (a
///   [`Receiver`](crate::Receiver)).
///
/// The schema and migrations are `PgStore`'s, so both stores can serve one database at once.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example() -> Result<(), sb_inbox::StoreError> {
/// use sb_inbox::{SqlxPgStore, Store, StoreTx};
/// let store = SqlxPgStore::connect("postgres://postgres@127.0.0.1/test", 16).await?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.insert_inbox("inventory", "m-1").await?;
/// // The handler's own sqlx query, in the transaction that holds the inbox row.
/// sqlx::query("UPDATE stock SET n = n - 1 WHERE sku = $1")
///     .bind("A")
///     .execute(tx.conn().await?)
///     .await
///     .map_err(sb_inbox::store::sqlx_pg::classify)?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SqlxPgStore {
    pool: PgPool,
}

impl SqlxPgStore {
    /// Connects a pool of at most `max_size` connections to a `postgres://` URL (TLS with
    /// `sslmode=require` or `verify-full`, on rustls with the webpki roots). Each session gets
    /// a 60 s statement timeout and a 30 s lock timeout unless the URL's `options` sets them.
    /// One connection is made before returning, so a wrong host or password fails here.
    /// Connections are not pinged when the pool hands them out (sqlx's default would cost
    /// a round trip per inbox transaction); one that died idle fails its first statement, a
    /// transient error.
    ///
    /// # Errors
    /// [`ErrorKind::Configuration`] for a URL sqlx cannot parse; the classified error of the
    /// first connection.
    pub async fn connect(url: &str, max_size: u32) -> Result<Self, StoreError> {
        let setup: String = SESSION_BOUNDS
            .iter()
            .filter(|(name, _)| !url.contains(name))
            .map(|(name, value)| format!("SET {name} = '{value}'; "))
            .collect();
        let pool = PgPoolOptions::new()
            .max_connections(max_size.max(1))
            .min_connections(1)
            // sqlx pings every idle connection it hands out: one more round trip per inbox
            // transaction (PgStore checks only that the socket is open). A connection that
            // died idle fails its first statement instead, a transient error the runtime
            // retries, and sqlx drops it.
            .test_before_acquire(false)
            .after_connect(move |conn, _| {
                let setup = setup.clone();
                Box::pin(async move {
                    if !setup.is_empty() {
                        conn.execute(sqlx::raw_sql(AssertSqlSafe(setup))).await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await
            .map_err(classify)?;
        Ok(SqlxPgStore { pool })
    }

    /// A store on a pool the service built itself (its own options, or one it shares with the
    /// rest of the service). Session bounds are then the pool's own, and so is sqlx's default
    /// ping of every connection it hands out, one more round trip per inbox transaction
    /// (`PgPoolOptions::test_before_acquire(false)` turns it off, as [`Self::connect`] does).
    pub fn from_pool(pool: PgPool) -> Self {
        SqlxPgStore { pool }
    }

    /// The pool, for queries outside an inbox transaction (reports, tests, an API endpoint).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies the core migrations not applied yet; returns how many ran.
    ///
    /// # Errors
    /// As [`Self::apply_migrations`].
    pub async fn migrate(&self) -> Result<usize, StoreError> {
        self.apply_migrations(crate::store::PG_MIGRATIONS).await
    }

    /// Applies the migrations of `set` not applied yet (the service's own schema: the same
    /// bookkeeping table and version space as `PgStore::apply_migrations`), each in its
    /// own transaction under an advisory lock; returns how many ran.
    ///
    /// # Errors
    /// The classified error of the first failing script (its transaction rolls back).
    pub async fn apply_migrations(&self, set: &[Migration]) -> Result<usize, StoreError> {
        self.pool
            .execute(
                "CREATE TABLE IF NOT EXISTS sb_inbox_schema_migrations (
                     version bigint NOT NULL CONSTRAINT pk_sb_inbox_schema_migrations PRIMARY KEY,
                     name text NOT NULL,
                     applied_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(classify)?;
        let mut applied = 0;
        for migration in set {
            if self.apply_one(migration).await.map_err(classify)? {
                applied += 1;
                tracing::info!(migration = migration.name, "Migration applied.");
            }
        }
        Ok(applied)
    }

    /// Applies `migration` unless it was; true when it ran.
    async fn apply_one(&self, migration: &Migration) -> Result<bool, sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        // A migration may build an index on a large table or wait for another `migrate`.
        tx.execute(sqlx::raw_sql(
            "SET LOCAL statement_timeout = 0; SET LOCAL lock_timeout = 0",
        ))
        .await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *tx)
            .await?;
        let done = sqlx::query("SELECT 1 FROM sb_inbox_schema_migrations WHERE version = $1")
            .bind(migration.version)
            .fetch_optional(&mut *tx)
            .await?;
        if done.is_some() {
            tx.commit().await?;
            return Ok(false);
        }
        tx.execute(sqlx::raw_sql(migration.sql)).await?;
        sqlx::query("INSERT INTO sb_inbox_schema_migrations (version, name) VALUES ($1, $2)")
            .bind(migration.version)
            .bind(migration.name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }
}

/// Classifies a sqlx error: a database error by its SQLSTATE and constraint (the table
/// `PgStore` uses), the rest by what failed (the socket, the pool, a value's encoding).
pub fn classify(error: sqlx::Error) -> StoreError {
    if let sqlx::Error::Database(db) = &error {
        let code = db.code().map(|code| code.into_owned());
        let constraint = db.constraint().map(str::to_owned);
        let kind = code.as_deref().map_or(ErrorKind::Unknown, |code| {
            kind_of_code(code, constraint.as_deref())
        });
        let message = db.message().to_owned();
        return StoreError::new(kind, code, constraint, message).with_source(error);
    }
    let kind = match &error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => {
            ErrorKind::Connection
        }
        sqlx::Error::WorkerCrashed => ErrorKind::Connection,
        // Every connection busy, or none can be made: transient, as `PgStore`'s pool timeout.
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => ErrorKind::Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::InvalidArgument(_) => ErrorKind::Configuration,
        sqlx::Error::Encode(_) | sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } => {
            ErrorKind::Conversion
        }
        _ => ErrorKind::Unknown,
    };
    StoreError::of_kind(kind, error.to_string()).with_source(error)
}

/// A handler's own sqlx query is classified like the runtime's: a deadlock is transient, a
/// check violation permanent, a unique violation of a business-key constraint a duplicate.
impl From<sqlx::Error> for crate::runtime::HandlerError {
    fn from(error: sqlx::Error) -> Self {
        crate::runtime::HandlerError::Store(classify(error))
    }
}
