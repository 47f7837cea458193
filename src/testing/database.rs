//! [`TestDb`]: a fresh, migrated PostgreSQL schema per test, and [`TestDb::run`]: messages
//! through a handler for real (the runtime, the store's transactions, the outbox), in the
//! spirit of `#[sqlx::test]`.

use tokio_util::sync::CancellationToken;

use super::{DeadLettered, MemoryBroker};
use crate::ports::{Message, OutboxLease, OutboxMessage, OutboxStore, StoreError};
use crate::runtime::{
    Clock, ConsumerName, ConsumerNameError, Handler, Runtime, RuntimeConfig, RuntimeError,
    StatsSnapshot,
};
use crate::store::Migration;
use crate::{PgStore, PgTx};

/// The database a test uses when `DATABASE_URL` is unset.
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Why a [`TestDb`] could not be made or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestDbError {
    /// The test name cannot be a schema name: it must be ASCII letters, digits and `_`.
    #[error("test name {0:?}: use ASCII letters, digits and _ (it names the schema)")]
    Name(String),
    /// The database refused.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The consumer name is invalid.
    #[error(transparent)]
    Consumer(#[from] ConsumerNameError),
    /// The runtime refused its configuration or its receiver failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// What [`TestDb::run`] saw: the outcomes, what was dead-lettered, and the outbox rows the
/// handler wrote (in write order), read from the database after the commits.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RunReport {
    /// The runtime's counters (processed, duplicate, stale, transient, permanent, …).
    pub stats: StatsSnapshot,
    /// The messages dead-lettered, with reason and description.
    pub dead_letters: Vec<DeadLettered>,
    /// The outbox rows waiting to be published.
    pub outbox: Vec<OutboxMessage>,
}

/// A schema of a test's own on the PostgreSQL at `DATABASE_URL` (default
/// [`DEFAULT_DATABASE_URL`]), dropped and created afresh, with sb-inbox's migrations and the
/// service's own applied: each test sees empty tables, and tests run in parallel.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example<H: sb_inbox::Handler<sb_inbox::PgTx>>(handler: H) -> Result<(), Box<dyn std::error::Error>> {
/// use sb_inbox::Message;
/// use sb_inbox::testing::TestDb;
/// # const MY_MIGRATION: sb_inbox::store::Migration = sb_inbox::store::Migration { version: 1000, name: "1000_orders.sql", sql: "" };
///
/// let placed = |id: &str| Message::new(id, "orders.order-placed.v1", r#"{"orderId":"o-1"}"#);
/// let report = TestDb::postgres("orders_placed_twice", &[MY_MIGRATION])
///     .await?
///     .run("shop.orders", handler, [placed("m-1"), placed("m-2")])
///     .await?;
/// assert_eq!((report.stats.processed, report.stats.duplicate), (1, 1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct TestDb {
    store: PgStore,
    url: String,
    schema: String,
}

impl TestDb {
    /// The schema `test` (ASCII letters, digits, `_`; lower-cased), emptied and migrated with
    /// the core migrations and `migrations`.
    ///
    /// # Errors
    /// [`TestDbError::Name`] for a name that cannot be a schema; the database's refusal.
    pub async fn postgres(test: &str, migrations: &[Migration]) -> Result<TestDb, TestDbError> {
        let schema = test.to_ascii_lowercase();
        // An identifier cannot be a bound parameter: only names that need no quoting pass.
        let plain = !schema.is_empty()
            && schema.len() <= 63
            && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && schema
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain {
            return Err(TestDbError::Name(test.to_owned()));
        }
        let base = std::env::var("DATABASE_URL").unwrap_or_else(|_| DEFAULT_DATABASE_URL.into());
        let admin = PgStore::connect(&base, 1).await?;
        admin
            .query(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"), &[])
            .await?;
        admin.query(&format!("CREATE SCHEMA {schema}"), &[]).await?;
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options=-csearch_path%3D{schema}");
        // Enough for a runtime's default concurrency, the test's own queries and the outbox read.
        let store = PgStore::connect(&url, 10).await?;
        store.migrate().await?;
        store.apply_migrations(migrations).await?;
        Ok(TestDb { store, url, schema })
    }

    /// The store on the schema, for the test's own queries and arrangements.
    pub fn store(&self) -> &PgStore {
        &self.store
    }

    /// The schema's URL (`search_path` set), for a second connection or a `Worker`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The schema's name.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Runs `messages` through `handler` as the consumer `consumer`, for real: the runtime
    /// opens each (the subject envelope), inserts the inbox row, runs the handler in the
    /// store's transaction, commits and settles, on an in-memory broker. Returns once every
    /// message is settled or dead-lettered, with what happened.
    ///
    /// # Errors
    /// An invalid consumer name; the runtime's failure; the database's refusal to read the
    /// outbox.
    pub async fn run<H, I>(
        &self,
        consumer: &str,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        H: Handler<PgTx>,
        I: IntoIterator<Item = Message>,
    {
        self.run_with(
            RuntimeConfig::new(ConsumerName::new(consumer)?),
            handler,
            messages,
        )
        .await
    }

    /// [`TestDb::run`] with a runtime configuration of the test's (an envelope, a
    /// concurrency).
    ///
    /// # Errors
    /// As [`TestDb::run`].
    pub async fn run_with<H, I>(
        &self,
        config: RuntimeConfig,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        H: Handler<PgTx>,
        I: IntoIterator<Item = Message>,
    {
        self.run_on(self.store.clone(), config, handler, messages)
            .await
    }

    /// [`TestDb::run`] on the sqlx store (`sqlx-postgres`) over the same schema: for a handler
    /// whose own SQL is sqlx, on the transaction that holds the inbox row
    /// ([`crate::SqlxPgTx::conn`]).
    ///
    /// # Errors
    /// As [`TestDb::run`]; the sqlx pool's connection error.
    #[cfg(feature = "sqlx-postgres")]
    pub async fn run_sqlx<H, I>(
        &self,
        consumer: &str,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        H: Handler<crate::SqlxPgTx>,
        I: IntoIterator<Item = Message>,
    {
        let store = crate::SqlxPgStore::connect(&self.url, 10).await?;
        let config = RuntimeConfig::new(ConsumerName::new(consumer)?);
        self.run_on(store, config, handler, messages).await
    }

    /// Runs `messages` through `handler` on `store` (one on this schema), then reads the
    /// outbox.
    async fn run_on<S, H, I>(
        &self,
        store: S,
        config: RuntimeConfig,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        S: crate::Store,
        H: Handler<S::Tx>,
        I: IntoIterator<Item = Message>,
    {
        let broker = MemoryBroker::new(Clock::new());
        for message in messages {
            broker.send(message);
        }
        let runtime = Runtime::new(broker.receiver(), store, handler, config);
        let stop = CancellationToken::new();
        let idle = async {
            broker.wait_idle().await;
            stop.cancel();
        };
        let (result, ()) = tokio::join!(runtime.run(stop.clone()), idle);
        result?;
        Ok(RunReport {
            stats: runtime.stats().snapshot(),
            dead_letters: broker.dead_letters(),
            outbox: self.outbox().await?,
        })
    }

    /// The outbox rows not published yet, in write order: leased and given back untried, so
    /// they stay as they were.
    ///
    /// # Errors
    /// The database's refusal.
    pub async fn outbox(&self) -> Result<Vec<OutboxMessage>, StoreError> {
        let now = std::time::SystemTime::now();
        let lease = OutboxLease::new(now + std::time::Duration::from_secs(60));
        let claim = self.store.claim_outbox(now, &lease, 10_000).await?;
        let ids: Vec<i64> = claim
            .rows
            .iter()
            .map(|row| row.id)
            .chain(claim.unreadable.iter().map(|row| row.id))
            .collect();
        self.store.release_outbox(&lease, &ids, now, None).await?;
        Ok(claim.rows.into_iter().map(|row| row.message).collect())
    }
}
