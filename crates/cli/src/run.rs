//! [`run`]: the reference worker (`sb-inbox run`): the inventory consumer's router
//! ([`inventory::router`]: orders v1 and v2, cancellations) hosted by a [`ConfiguredWorker`] as
//! `worker.toml` says, on the store its URL names. Everything else
//! (health, store opening with backoff, schema check, relay, retention, drain) is the
//! library's, as for any service's own handlers.

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::inventory::{self, InventoryStore};
#[cfg(feature = "mssql")]
use sb_inbox::store::MssqlStore;
#[cfg(feature = "postgres")]
use sb_inbox::store::PgStore;
#[cfg(feature = "sqlite")]
use sb_inbox::store::SqliteStore;
use sb_inbox::store::StoreUrl;
use sb_inbox::worker::OpenStore;
use sb_inbox::worker::{ConfiguredWorker, Worker, WorkerConfig, WorkerError};
use sb_inbox::{ErrorKind, RuntimeError, StatsSnapshot, StoreError};

pub use sb_inbox::worker::BACKGROUND_STOP;

/// The variable naming the queue or topic the reference consumer's
/// `inventory.stock-reserved.v1` events go to (through the outbox); unset or empty, it writes
/// none. The binary's own setting: the library's configuration has no such key (issue 45), as
/// a service names each outbox row's destination in its handler.
pub const OUTBOX_DESTINATION_VAR: &str = "SB_INBOX_OUTBOX_DESTINATION";

/// [`OUTBOX_DESTINATION_VAR`] read through `env`; empty counts as unset, as for the library's
/// variables.
pub fn outbox_destination(env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    env(OUTBOX_DESTINATION_VAR).filter(|v| !v.is_empty())
}

/// Runs the reference inventory consumer as configured (under each configured consumer name
/// and entity, in one [`Worker`]) until `shutdown`, then drains, releases prefetched deliveries
/// and returns the counters of all consumers added up. Beside it run the outbox relay (always: any
/// row in the outbox is published) and, when a retention is configured, the retention task;
/// both stop after the drain. Serves `/healthz` and `/readyz` on `health.port` when configured.
/// The consumer's events go to `outbox_destination` (see [`outbox_destination`]); none are
/// written without it.
///
/// # Errors
/// [`WorkerError`] when the store cannot be opened, the health port cannot be bound, or the
/// receiver fails for good.
pub async fn run(
    config: &WorkerConfig,
    outbox_destination: Option<&str>,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let health = match config.health_port {
        Some(port) => Some(
            TcpListener::bind(("0.0.0.0", port))
                .await
                .map_err(|source| WorkerError::Health { port, source })?,
        ),
        None => None,
    };
    run_with(config, outbox_destination, health, shutdown).await
}

/// As [`run`], serving the health endpoints on `health` when given (tests pass a listener on an
/// ephemeral port) and on no port otherwise.
///
/// The health endpoints answer from the start. Until the store is open and its schema migrated
/// (the reference consumer's tables included) the worker stays alive but not ready (`/readyz`
/// names the cause), retrying with backoff: on a first deployment the database user or schema
/// appear later, and a fail-over at start passes.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    config: &WorkerConfig,
    outbox_destination: Option<&str>,
    health: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    match &config.store {
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(_) => {
            host::<PgStore>(config, outbox_destination, health, shutdown).await
        }
        #[cfg(feature = "mssql")]
        StoreUrl::Mssql(_) => {
            host::<MssqlStore>(config, outbox_destination, health, shutdown).await
        }
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(_) | StoreUrl::SqliteMemory => {
            host::<SqliteStore>(config, outbox_destination, health, shutdown).await
        }
        // A store this build lacks (`StoreUrl`'s parser refuses it already: this is for a
        // configuration built in code), or a kind of store the reference worker does not know.
        other => Err(match other.ensure_compiled_in() {
            Err(error) => error.into(),
            Ok(()) => StoreError::of_kind(
                ErrorKind::Deployment,
                format!("the reference worker cannot host the store at {other}"),
            )
            .into(),
        }),
    }
}

/// The inventory consumer on a store of type `S`.
async fn host<S: OpenStore + InventoryStore + 'static>(
    config: &WorkerConfig,
    outbox_destination: Option<&str>,
    health: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let mut config = config.clone();
    // The listener is bound by `run` (or given by a test); none means none.
    config.health_port = None;
    let router = inventory::router::<S::Tx>(outbox_destination)
        .map_err(|e| RuntimeError::Config(format!("the reference consumer's routes: {e}")))?;
    // An in-memory database starts empty: its tables are created, not waited for.
    let memory = matches!(config.store, StoreUrl::SqliteMemory);
    let mut worker: ConfiguredWorker<S> = Worker::from_config(config)
        .schema_check(move |store: S| async move { inventory_tables(&store, memory).await });
    if let Some(listener) = health {
        worker = worker.health(listener);
    }
    let stats = worker.run(shutdown, |_| router.clone()).await?;
    Ok(stats.total())
}

/// The reference consumer's tables: missing counts like a schema not migrated yet (retried,
/// not an exit).
async fn inventory_tables<S: InventoryStore>(store: &S, create: bool) -> Result<(), StoreError> {
    if create {
        store.migrate_inventory().await?;
    }
    if !store.inventory_migrated().await? {
        return Err(StoreError::of_kind(
            ErrorKind::Schema,
            "the reference consumer's tables are missing: run `sb-inbox migrate --inventory`",
        ));
    }
    Ok(())
}
