//! Opening the store at start-up: connect, then check that every migration this build knows is
//! applied. The worker retries both with backoff instead of exiting, so a first deployment
//! (database users or schema not there yet) or a database fail-over at start leaves a live,
//! not-ready process that becomes ready on its own once the database answers and `sb-inbox
//! migrate` has run.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::health::{Condition, Ping};
use crate::ports::{ErrorKind, StoreError};
use crate::ports::{OutboxStore, RetentionStore, Store};
use crate::runtime::Backoff;
#[cfg(feature = "mssql")]
use crate::store::MssqlStore;
#[cfg(feature = "postgres")]
use crate::store::PgStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::{Migration, StoreUrl};

/// The first retry waits about a second; later ones at most 30 s, so a database that appears
/// is noticed within half a minute without hammering one that is down.
const RETRY_FIRST: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A store a [`super::ConfiguredWorker`] opens from its configuration's [`StoreUrl`], and
/// whose schema it checks before it reports ready. Implemented by `PgStore`, `SqliteStore` and
/// `MssqlStore` (each with its feature); a store of your own implements it to be hosted from a
/// [`super::WorkerConfig`] too.
pub trait OpenStore: Store + OutboxStore + RetentionStore + Ping + Clone + Sized {
    /// The migrations this build ships for the store: each must be recorded as applied before
    /// the worker starts consuming.
    const MIGRATIONS: &'static [Migration];

    /// Whether `url` names a store of this type (checked once before the retries of
    /// [`OpenStore::open`]: waiting does not change the URL).
    fn accepts(url: &StoreUrl) -> bool;

    /// Opens the store `url` names, with a pool of `pool` connections where the store pools.
    ///
    /// # Errors
    /// [`ErrorKind::Configuration`] for a URL of another store; the store's connection error.
    fn open(url: &StoreUrl, pool: u32) -> impl Future<Output = Result<Self, StoreError>> + Send;

    /// The versions recorded in `sb_inbox_schema_migrations`, empty when the table is missing.
    fn applied(&self) -> impl Future<Output = Result<Vec<i64>, StoreError>> + Send;
}

/// A URL that names another store than the one being opened.
// Only the stores call it: a build with none (no store feature) has no caller.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mssql"))]
fn other_store(url: &StoreUrl, wanted: &str) -> StoreError {
    StoreError::configuration(format!(
        "the store URL names a {} store; this worker hosts a {wanted} store",
        url.feature()
    ))
}

#[cfg(feature = "postgres")]
impl OpenStore for PgStore {
    const MIGRATIONS: &'static [Migration] = crate::store::postgres::MIGRATIONS;

    fn accepts(url: &StoreUrl) -> bool {
        matches!(url, StoreUrl::Postgres(_))
    }

    async fn open(url: &StoreUrl, pool: u32) -> Result<Self, StoreError> {
        match url {
            StoreUrl::Postgres(url) => PgStore::connect(url, pool).await,
            other => Err(other_store(other, "postgres")),
        }
    }

    async fn applied(&self) -> Result<Vec<i64>, StoreError> {
        let exists = self
            .query(
                "SELECT to_regclass('sb_inbox_schema_migrations') IS NOT NULL",
                &[],
            )
            .await?;
        if !exists.first().is_some_and(|row| row.get::<_, bool>(0)) {
            return Ok(Vec::new());
        }
        let rows = self
            .query("SELECT version FROM sb_inbox_schema_migrations", &[])
            .await?;
        Ok(rows.iter().map(|row| row.get::<_, i64>(0)).collect())
    }
}

#[cfg(feature = "mssql")]
impl OpenStore for MssqlStore {
    const MIGRATIONS: &'static [Migration] = crate::store::mssql::MIGRATIONS;

    fn accepts(url: &StoreUrl) -> bool {
        matches!(url, StoreUrl::Mssql(_))
    }

    async fn open(url: &StoreUrl, pool: u32) -> Result<Self, StoreError> {
        match url {
            StoreUrl::Mssql(raw) => {
                let parsed: crate::store::MssqlConfig = raw.parse()?;
                MssqlStore::connect_with(parsed, pool).await
            }
            other => Err(other_store(other, "mssql")),
        }
    }

    async fn applied(&self) -> Result<Vec<i64>, StoreError> {
        let rows = self
            .query(
                "IF OBJECT_ID(N'sb_inbox_schema_migrations', N'U') IS NOT NULL
                     SELECT version FROM sb_inbox_schema_migrations",
                &[],
            )
            .await?;
        Ok(rows.iter().filter_map(|row| row.get::<i64, _>(0)).collect())
    }
}

#[cfg(feature = "sqlite")]
impl OpenStore for SqliteStore {
    const MIGRATIONS: &'static [Migration] = crate::store::sqlite::MIGRATIONS;

    fn accepts(url: &StoreUrl) -> bool {
        matches!(url, StoreUrl::Sqlite(_) | StoreUrl::SqliteMemory)
    }

    async fn open(url: &StoreUrl, _pool: u32) -> Result<Self, StoreError> {
        match url {
            StoreUrl::Sqlite(path) => SqliteStore::open(path),
            // A new in-memory database is empty: migrating it is the only way it becomes ready.
            StoreUrl::SqliteMemory => {
                let store = SqliteStore::open_in_memory()?;
                store.migrate().await?;
                Ok(store)
            }
            other => Err(other_store(other, "sqlite")),
        }
    }

    async fn applied(&self) -> Result<Vec<i64>, StoreError> {
        self.with_connection(|c| {
            let exists: bool = c.query_row(
                "SELECT count(*) > 0 FROM sqlite_master \
                 WHERE type = 'table' AND name = 'sb_inbox_schema_migrations'",
                [],
                |row| row.get(0),
            )?;
            if !exists {
                return Ok(Vec::new());
            }
            let mut statement = c.prepare("SELECT version FROM sb_inbox_schema_migrations")?;
            let versions = statement.query_map([], |row| row.get(0))?;
            versions.collect()
        })
        .await
    }
}

/// `Ok` when every migration of this build is applied; otherwise a [`ErrorKind::Schema`] error
/// naming the missing ones.
pub(crate) async fn check_schema<S: OpenStore>(store: &S) -> Result<(), StoreError> {
    let applied = store.applied().await?;
    let missing: Vec<&str> = S::MIGRATIONS
        .iter()
        .filter(|m| !applied.contains(&m.version))
        .map(|m| m.name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(StoreError::of_kind(
        ErrorKind::Schema,
        format!(
            "schema not migrated (missing {}): run `sb-inbox migrate`",
            missing.join(", ")
        ),
    ))
}

/// Calls `open` until it succeeds, waiting with [`Backoff`] between attempts; meanwhile
/// `condition` is not ready with the last cause, which is also logged. `None` when `shutdown`
/// comes first.
pub(crate) async fn until_open<S, F, Fut>(
    open: F,
    condition: &Condition,
    shutdown: &CancellationToken,
) -> Option<S>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<S, StoreError>>,
{
    let mut backoff = Backoff::new(RETRY_FIRST, RETRY_MAX);
    loop {
        let attempt = tokio::select! {
            () = shutdown.cancelled() => return None,
            attempt = open() => attempt,
        };
        let error = match attempt {
            Ok(store) => return Some(store),
            Err(error) => error,
        };
        let delay = backoff.next_delay();
        // StoreError never carries the connection string's secrets.
        tracing::warn!(%error, retry_in = ?delay, "The store is not ready; the worker stays not ready and retries.");
        condition.not_ready(error.to_string());
        tokio::select! {
            () = shutdown.cancelled() => return None,
            () = tokio::time::sleep(delay) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;
    use crate::worker::Readiness;

    #[tokio::test(start_paused = true)]
    async fn retries_with_backoff_and_reports_the_cause_until_open() {
        let readiness = Readiness::new();
        let condition = readiness.condition("store", "opening");
        let attempts = Arc::new(AtomicU32::new(0));
        let shutdown = CancellationToken::new();
        let opened = tokio::spawn({
            let (attempts, condition, shutdown) =
                (attempts.clone(), condition.clone(), shutdown.clone());
            async move {
                until_open(
                    || {
                        let n = attempts.fetch_add(1, Ordering::SeqCst);
                        async move {
                            if n < 3 {
                                Err(StoreError::connection("refused"))
                            } else {
                                Ok(n)
                            }
                        }
                    },
                    &condition,
                    &shutdown,
                )
                .await
            }
        });
        // Paused time: sleeps end when every task waits; three failures then the open.
        assert_eq!(opened.await.unwrap(), Some(3));
        assert_eq!(attempts.load(Ordering::SeqCst), 4);
        let failing = readiness.not_ready().await;
        assert_eq!(
            failing.len(),
            1,
            "the caller marks it ready, not until_open"
        );
        assert!(failing[0].1.contains("refused"), "{failing:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_ends_the_retries() {
        let readiness = Readiness::new();
        let condition = readiness.condition("store", "opening");
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let opened: Option<()> = until_open(
            || async { Err(StoreError::connection("down")) },
            &condition,
            &shutdown,
        )
        .await;
        assert_eq!(opened, None);
    }

    #[tokio::test]
    async fn a_store_without_the_schema_names_the_missing_migrations() {
        let store = SqliteStore::open_in_memory().unwrap();
        let error = check_schema(&store).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Schema);
        assert!(error.to_string().contains("sb-inbox migrate"), "{error}");
        assert!(
            error.to_string().contains(SqliteStore::MIGRATIONS[0].name),
            "{error}"
        );
        store.migrate().await.unwrap();
        check_schema(&store).await.unwrap();
    }
}
