//! [`run`]: the reference worker (`sb-inbox run`): opens the store with retries while
//! `/readyz` reports why, then hosts the inventory consumer in a [`Worker`] as configured.

use std::future::Future;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::health::{self, Condition, Ping, Readiness};
use super::open::{self, Applied};
use super::{BrokerAddress, Worker, WorkerConfig};
#[cfg(feature = "entra")]
use crate::entra::{EntraCredential, EntraMode};
use crate::inventory::{InventoryStore, OrderPlacedConsumer};
use crate::servicebus::ServiceBusClient;
#[cfg(feature = "postgres")]
use crate::store::PgStore;
#[cfg(feature = "sqlite")]
use crate::store::SqliteStore;
use crate::store::StoreUrl;
#[cfg(feature = "mssql")]
use crate::store::{MssqlConfig, MssqlStore};
use crate::{ErrorKind, OutboxStore, RetentionStore, RuntimeError, StatsSnapshot, StoreError};

pub use super::host::BACKGROUND_STOP;

/// Why the worker stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The runtime failed (a receiver that cannot go on).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The health endpoints could not be served.
    #[error("health endpoints: {0}")]
    Health(String),
    /// The consumers cannot be hosted as given (none, one name twice, delayed retries on a
    /// subscription).
    #[error("worker: {0}")]
    Config(String),
    /// A consumer's task ended abnormally (a panic in a handler).
    #[error("consumer {0}")]
    Consumer(String),
}

/// Runs the reference inventory consumer as configured (under each configured consumer name
/// and entity, in one [`Worker`]) until `shutdown`, then drains, releases prefetched deliveries
/// and returns the counters of all consumers added up. Beside it run the outbox relay (always: any
/// row in the outbox is published) and, when a retention is configured, the retention task;
/// both stop after the drain. Serves `/healthz` and `/readyz` on `health.port` when configured.
///
/// # Errors
/// [`WorkerError`] when the store cannot be opened, the health port cannot be bound, or the
/// receiver fails for good.
pub async fn run(
    config: &WorkerConfig,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let health = match config.health_port {
        Some(port) => Some(
            TcpListener::bind(("0.0.0.0", port))
                .await
                .map_err(|e| WorkerError::Health(format!("cannot listen on port {port}: {e}")))?,
        ),
        None => None,
    };
    run_with(config, health, shutdown).await
}

/// As [`run`], serving the health endpoints on `health` when given (tests pass a listener on an
/// ephemeral port).
///
/// The health endpoints answer from the start. Until the store is open and its schema migrated
/// the worker stays alive but not ready (`/readyz` names the cause), retrying with backoff: on a
/// first deployment the database user or schema appear later, and a fail-over at start passes.
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    config: &WorkerConfig,
    health: Option<TcpListener>,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let client = broker_client(&config.broker)?
        .with_server_busy_wait(config.server_busy_wait)
        .with_trust(&config.trust)
        .map_err(|e| WorkerError::Config(e.to_string()))?
        .with_proxy(&config.proxy);
    // Served from the start, before the store opens; the Worker adds its probes to it.
    let readiness = Readiness::new();
    let store_ready = readiness.condition("store", "opening");
    let _stop_health = health::serve_while(health, &readiness);
    // The entity's real settings, before anything is received (issue 33).
    super::entity_check::at_start(config, &readiness)
        .await
        .map_err(|e| WorkerError::Config(e.to_string()))?;
    let probe = Probe {
        client,
        readiness,
        shutdown,
    };
    // Every consumer's handlers at once, plus the relay and retention.
    #[cfg(any(feature = "postgres", feature = "mssql"))]
    let pool = u32::try_from(
        config
            .consumers
            .iter()
            .map(|c| c.runtime.concurrency)
            .sum::<usize>(),
    )
    .unwrap_or(u32::MAX)
    .saturating_add(2);
    match &config.store {
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(url) => {
            let connect = || PgStore::connect(url, pool);
            open_then_serve(connect, config, probe, &store_ready).await
        }
        #[cfg(feature = "mssql")]
        StoreUrl::Mssql(raw) => {
            // A string that does not parse will not parse later either: fail now.
            let parsed: MssqlConfig = raw.parse()?;
            let connect = || MssqlStore::connect_with(parsed.clone(), pool);
            open_then_serve(connect, config, probe, &store_ready).await
        }
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(path) => {
            let connect = || async { SqliteStore::open(path) };
            open_then_serve(connect, config, probe, &store_ready).await
        }
        #[cfg(feature = "sqlite")]
        StoreUrl::SqliteMemory => {
            let store = SqliteStore::open_in_memory()?;
            store.migrate().await?;
            store.migrate_inventory().await?;
            serve(store, config, probe).await
        }
        // A store this build lacks: `StoreUrl`'s parser refuses it already, this is for a
        // configuration built in code.
        #[cfg(not(all(feature = "postgres", feature = "mssql", feature = "sqlite")))]
        other => Err(WorkerError::Config(
            other
                .ensure_compiled_in()
                .err()
                .map_or_else(|| format!("store {other}"), |error| error.to_string()),
        )),
    }
}

/// The Service Bus client for `broker`: a connection string's key, or Entra ID tokens for a
/// namespace (refused when this build lacks the `entra` feature).
fn broker_client(broker: &BrokerAddress) -> Result<ServiceBusClient, WorkerError> {
    Ok(match broker {
        BrokerAddress::Connection(cs) => ServiceBusClient::from_connection_string(cs),
        #[cfg(feature = "entra")]
        BrokerAddress::Namespace {
            host,
            client_id,
            transport,
        } => ServiceBusClient::with_entra_over(
            host,
            EntraCredential::new(EntraMode::Default, client_id.clone()),
            *transport,
        ),
        #[cfg(not(feature = "entra"))]
        BrokerAddress::Namespace { host, .. } => {
            return Err(WorkerError::Config(format!(
                "{host}: a namespace without a connection string takes Entra ID tokens, and this \
                 build has no `entra` cargo feature"
            )));
        }
    })
}

/// Connects and checks the schema, the reference consumer's tables included, until all
/// succeed (see [`open::until_open`]), then serves; a shutdown before that ends the worker with
/// nothing processed.
async fn open_then_serve<S, F, Fut>(
    connect: F,
    config: &WorkerConfig,
    probe: Probe,
    store_ready: &Condition,
) -> Result<StatsSnapshot, WorkerError>
where
    S: InventoryStore + OutboxStore + RetentionStore + Ping + Applied + Clone + 'static,
    F: Fn() -> Fut,
    Fut: Future<Output = Result<S, StoreError>>,
{
    let open = || async {
        let store = connect().await?;
        open::check_schema(&store).await?;
        // Missing like a schema not migrated yet: retried, not an exit.
        if !store.inventory_migrated().await? {
            return Err(StoreError::of_kind(
                ErrorKind::Schema,
                "the reference consumer's tables are missing: run `sb-inbox migrate --inventory`",
            ));
        }
        Ok(store)
    };
    match open::until_open(open, store_ready, &probe.shutdown).await {
        Some(store) => serve(store, config, probe).await,
        None => Ok(StatsSnapshot::default()),
    }
}

/// What the health endpoints and the drain need.
struct Probe {
    client: ServiceBusClient,
    readiness: Readiness,
    shutdown: CancellationToken,
}

/// The reference worker: the inventory consumer under each configured consumer name and
/// entity, hosted by a [`Worker`] that reports on `readiness`.
async fn serve<S: InventoryStore + OutboxStore + RetentionStore + Ping + Clone + 'static>(
    store: S,
    config: &WorkerConfig,
    probe: Probe,
) -> Result<StatsSnapshot, WorkerError> {
    let Probe {
        client,
        readiness,
        shutdown,
    } = probe;
    let mut worker = Worker::new(client, store)
        .relay(config.relay.clone())
        .readiness(readiness);
    if let Some(retention) = config.retention {
        worker = worker.retention(retention);
    }
    if let Some(sessions) = &config.sessions {
        worker = worker.sessions(sessions.clone());
    }
    if let Some(policy) = &config.retry {
        worker = worker.delayed_retries(policy.clone());
    }
    for consumer in &config.consumers {
        let handler = match &config.outbox_destination {
            Some(destination) => OrderPlacedConsumer::new().with_events(destination),
            None => OrderPlacedConsumer::new(),
        };
        worker = worker.consumer(consumer.clone(), handler);
    }
    tracing::info!(consumers = config.consumers.len(), store = %config.store, "Worker started.");
    let stats = worker.run(shutdown).await?.total();
    tracing::info!(?stats, "Worker stopped.");
    Ok(stats)
}
