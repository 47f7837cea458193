//! [`TestDb`]: a fresh, migrated PostgreSQL schema per test (feature `postgres`), and
//! [`SqliteTestDb`]: a fresh SQLite file per test (`sqlite`); `run` on either: messages through
//! a handler for real (the runtime, the store's transactions, the outbox), in the spirit of
//! `#[sqlx::test]`.

use tokio_util::sync::CancellationToken;

use super::{DeadLettered, MemoryBroker};
use crate::ports::{Message, OutboxLease, OutboxMessage, OutboxStore, StoreError};
use crate::runtime::{
    Clock, ConsumerName, ConsumerNameError, Handler, Runtime, RuntimeConfig, RuntimeError,
    StatsSnapshot,
};
use crate::store::Migration;
#[cfg(feature = "postgres")]
use crate::store::{PgStore, PgTx};

/// The database a test uses when `DATABASE_URL` is unset.
#[cfg(feature = "postgres")]
pub const DEFAULT_DATABASE_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Why a [`TestDb`] could not be made or run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestDbError {
    /// The test name cannot be a schema or file name: it must be ASCII letters, digits and `_`.
    #[error("test name {0:?}: use ASCII letters, digits and _ (it names the schema or file)")]
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
#[cfg(feature = "postgres")]
#[derive(Debug, Clone)]
pub struct TestDb {
    store: PgStore,
    url: String,
    schema: String,
}

#[cfg(feature = "postgres")]
impl TestDb {
    /// The schema `<test>_p<process id>` (`test`: ASCII letters, digits, `_`; lower-cased),
    /// emptied and migrated with the core migrations and `migrations`. The process id keeps
    /// two test processes (two crates' tests, two `cargo test` runs at once) that use the same
    /// test name apart; a schema a finished process left behind is not dropped for it.
    ///
    /// # Errors
    /// [`TestDbError::Name`] for a name that cannot be a schema; the database's refusal.
    pub async fn postgres(test: &str, migrations: &[Migration]) -> Result<TestDb, TestDbError> {
        let schema = schema_name(test)?;
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
        H: Handler<crate::store::SqlxPgTx>,
        I: IntoIterator<Item = Message>,
    {
        let store = crate::store::SqlxPgStore::connect(&self.url, 10).await?;
        let config = RuntimeConfig::new(ConsumerName::new(consumer)?);
        self.run_on(store, config, handler, messages).await
    }

    /// The outbox rows not published yet, in write order: leased and given back untried, so
    /// they stay as they were.
    ///
    /// # Errors
    /// The database's refusal.
    pub async fn outbox(&self) -> Result<Vec<OutboxMessage>, StoreError> {
        read_outbox(&self.store).await
    }

    /// Runs `messages` through `handler` on `store` (one on this schema).
    async fn run_on<S, H, I>(
        &self,
        store: S,
        config: RuntimeConfig,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        S: crate::ports::Store,
        H: Handler<S::Tx>,
        I: IntoIterator<Item = Message>,
    {
        run_messages(store, &self.store, config, handler, messages).await
    }
}

#[cfg(feature = "postgres")]
/// The schema of `test` in this process: `<test>_p<pid>`, lower-cased. An identifier cannot be a
/// bound parameter, so only names that need no quoting pass (PostgreSQL's 63-byte limit
/// included).
fn schema_name(test: &str) -> Result<String, TestDbError> {
    let schema = format!("{}_p{}", test.to_ascii_lowercase(), std::process::id());
    let plain = !test.is_empty()
        && schema.len() <= 63
        && schema.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        Ok(schema)
    } else {
        Err(TestDbError::Name(test.to_owned()))
    }
}

/// A SQLite file of a test's own, `<temp dir>/sb-inbox-test-<test>-p<process id>.sqlite`,
/// removed and created afresh, with sb-inbox's migrations and the service's own applied:
/// [`TestDb`] for a service on SQLite, with no server to reach.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example<H: sb_inbox::Handler<sb_inbox::SqliteTx>>(handler: H) -> Result<(), Box<dyn std::error::Error>> {
/// use sb_inbox::Message;
/// use sb_inbox::testing::SqliteTestDb;
///
/// let placed = |id: &str| Message::new(id, "orders.order-placed.v1", r#"{"orderId":"o-1"}"#);
/// let report = SqliteTestDb::new("orders_placed_twice", &[])
///     .await?
///     .run("shop.orders", handler, [placed("m-1"), placed("m-2")])
///     .await?;
/// assert_eq!((report.stats.processed, report.stats.duplicate), (1, 1));
/// # Ok(()) }
/// ```
#[cfg(feature = "sqlite")]
#[derive(Debug, Clone)]
pub struct SqliteTestDb {
    store: crate::store::SqliteStore,
    path: std::path::PathBuf,
}

#[cfg(feature = "sqlite")]
impl SqliteTestDb {
    /// The file of `test` (ASCII letters, digits, `_`) in this process, emptied and migrated
    /// with the core migrations and `migrations`.
    ///
    /// # Errors
    /// [`TestDbError::Name`] for a name that cannot be a file name; the store's refusal.
    pub async fn new(test: &str, migrations: &[Migration]) -> Result<SqliteTestDb, TestDbError> {
        let plain = !test.is_empty() && test.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !plain {
            return Err(TestDbError::Name(test.to_owned()));
        }
        let name = format!("sb-inbox-test-{test}-p{}.sqlite", std::process::id());
        let path = std::env::temp_dir().join(name);
        for suffix in ["", "-wal", "-shm"] {
            let mut file = path.clone().into_os_string();
            file.push(suffix);
            // Absent is the usual case: nothing to remove.
            drop(std::fs::remove_file(file));
        }
        let store = crate::store::SqliteStore::open(&path)?;
        store.migrate().await?;
        store.apply_migrations(migrations).await?;
        Ok(SqliteTestDb { store, path })
    }

    /// The store on the file, for the test's own queries and arrangements.
    pub fn store(&self) -> &crate::store::SqliteStore {
        &self.store
    }

    /// The file's path (for a `Worker`'s `sqlite://` URL).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// As [`TestDb::run`], on this file.
    ///
    /// # Errors
    /// As [`TestDb::run`].
    pub async fn run<H, I>(
        &self,
        consumer: &str,
        handler: H,
        messages: I,
    ) -> Result<RunReport, TestDbError>
    where
        H: Handler<crate::store::SqliteTx>,
        I: IntoIterator<Item = Message>,
    {
        let config = RuntimeConfig::new(ConsumerName::new(consumer)?);
        self.run_with(config, handler, messages).await
    }

    /// As [`TestDb::run_with`], on this file.
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
        H: Handler<crate::store::SqliteTx>,
        I: IntoIterator<Item = Message>,
    {
        run_messages(self.store.clone(), &self.store, config, handler, messages).await
    }

    /// As [`TestDb::outbox`], on this file.
    ///
    /// # Errors
    /// The store's refusal.
    pub async fn outbox(&self) -> Result<Vec<OutboxMessage>, StoreError> {
        read_outbox(&self.store).await
    }
}

/// Runs `messages` through `handler` on `store` as the runtime does, on an in-memory broker,
/// until every message is settled or dead-lettered; then reads the outbox from `outbox`.
async fn run_messages<S, O, H, I>(
    store: S,
    outbox: &O,
    config: RuntimeConfig,
    handler: H,
    messages: I,
) -> Result<RunReport, TestDbError>
where
    S: crate::ports::Store,
    O: OutboxStore,
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
        outbox: read_outbox(outbox).await?,
    })
}

/// The outbox rows not published yet, in write order: leased and given back untried, so they
/// stay as they were.
async fn read_outbox<O: OutboxStore>(store: &O) -> Result<Vec<OutboxMessage>, StoreError> {
    let now = std::time::SystemTime::now();
    let lease = OutboxLease::new(now + std::time::Duration::from_secs(60));
    let claim = store.claim_outbox(now, &lease, 10_000).await?;
    let ids: Vec<i64> = claim
        .rows
        .iter()
        .map(|row| row.id)
        .chain(claim.unreadable.iter().map(|row| row.id))
        .collect();
    store.release_outbox(&lease, &ids, now, None).await?;
    Ok(claim.rows.into_iter().map(|row| row.message).collect())
}

#[cfg(all(test, feature = "postgres"))]
mod tests {
    use super::*;

    #[test]
    fn schema_names_carry_the_process_id_and_refuse_what_needs_quoting() {
        let pid = std::process::id();
        assert_eq!(schema_name("Orders_1").unwrap(), format!("orders_1_p{pid}"));
        for bad in ["", "1orders", "orders-x", "orders x", &"x".repeat(60)] {
            assert!(
                matches!(schema_name(bad), Err(TestDbError::Name(_))),
                "{bad:?}"
            );
        }
    }
}

#[cfg(all(test, feature = "sqlite"))]
mod sqlite_tests {
    use super::*;
    use crate::runtime::{Context, Handled, HandlerError, Json, JsonContract, JsonHandler};
    use crate::store::SqliteTx;

    #[derive(Debug, serde::Deserialize)]
    struct Placed {
        order: String,
    }

    impl JsonContract for Placed {
        const NAME: &'static str = "orders.placed";
        const VERSION: u32 = 1;
    }

    /// Claims the order's key and writes one outbox row per order.
    struct Orders;

    impl JsonHandler<SqliteTx> for Orders {
        type Message = Placed;

        async fn handle(
            &self,
            ctx: &Context<'_, Placed>,
            placed: &Placed,
            tx: &mut SqliteTx,
        ) -> Result<Handled, HandlerError> {
            ctx.claim(tx, &format!("order:{}", placed.order)).await?;
            let event = OutboxMessage::new("orders.out", "orders.confirmed.v1", b"{}".to_vec());
            crate::ports::Tx::append_outbox(tx, &event).await?;
            Ok(Handled::Processed)
        }
    }

    /// A fresh file per test: the messages run for real, the second of one order is a
    /// duplicate, and a second `new` of the same test starts empty again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sqlite_test_db_runs_messages_for_real_on_a_fresh_file() {
        let placed =
            |id: &str| Message::new(id, "orders.placed.v1", r#"{"order":"o-1"}"#.to_owned());
        for _ in 0..2 {
            let db = SqliteTestDb::new("sqlite_test_db", &[]).await.unwrap();
            assert!(db.path().ends_with(format!(
                "sb-inbox-test-sqlite_test_db-p{}.sqlite",
                std::process::id()
            )));
            let report = db
                .run(
                    "shop.orders",
                    Json::new(Orders),
                    [placed("m-1"), placed("m-2")],
                )
                .await
                .unwrap();
            assert_eq!(
                (report.stats.processed, report.stats.duplicate),
                (1, 1),
                "{report:?}"
            );
            assert_eq!(report.outbox.len(), 1);
        }
        assert!(matches!(
            SqliteTestDb::new("no/slash", &[]).await,
            Err(TestDbError::Name(_))
        ));
    }
}
