use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::health::{self, Condition, Ping, Readiness};
use super::open::{self, Applied};
use super::{BrokerAddress, WorkerConfig};
use crate::entra::{EntraCredential, EntraMode};
use crate::inventory::{InventoryStore, OrderPlacedConsumer};
use crate::relay::Relay;
use crate::retention::RetentionTask;
use crate::runtime::{DelayedRetry, RetryPolicy};
use crate::servicebus::{ServiceBusClient, ServiceBusReceiver};
use crate::store::{MssqlConfig, StoreUrl};
use crate::telemetry;
use crate::{
    MssqlStore, OutboxStore, PgStore, RetentionStore, Runtime, RuntimeError, SqliteStore,
    StatsSnapshot, StoreError,
};

/// How long the relay and retention get to finish their current batch after the runtime has
/// drained: one send's timeout and a little. A relay stopped harder only causes duplicates.
pub const BACKGROUND_STOP: Duration = Duration::from_secs(35);

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
}

/// Runs the reference inventory consumer as configured until `shutdown`, then drains, releases
/// prefetched deliveries and returns the counters. Beside it run the outbox relay (always: any
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
    let client = match &config.broker {
        BrokerAddress::Connection(cs) => ServiceBusClient::from_connection_string(cs),
        BrokerAddress::Namespace { host, client_id } => ServiceBusClient::with_entra(
            host,
            EntraCredential::new(EntraMode::Default, client_id.clone()),
        ),
    };
    let readiness = Readiness::new();
    readiness.probe("broker", {
        let client = client.clone();
        move || {
            let connected = client.is_connected();
            async move {
                connected
                    .then_some(())
                    .ok_or_else(|| "not connected to Service Bus".to_owned())
            }
        }
    });
    let store_ready = readiness.condition("store", "opening");
    let stop_health = CancellationToken::new();
    if let Some(listener) = health {
        tokio::spawn(health::serve(
            listener,
            readiness.clone(),
            stop_health.clone(),
        ));
    }
    // The probes answer until the drain is over, then stop with the worker.
    let _stop_health = stop_health.drop_guard();
    let prefetch = u32::try_from(config.runtime.prefetch).unwrap_or(u32::MAX);
    let receiver = client.receiver(&config.entity, prefetch);
    let probe = Probe {
        client,
        readiness,
        shutdown,
    };
    let pool = u32::try_from(config.runtime.concurrency)
        .unwrap_or(u32::MAX)
        .saturating_add(2);
    match &config.store {
        StoreUrl::Postgres(url) => {
            let connect = || PgStore::connect(url, pool);
            open_then_serve(connect, receiver, config, probe, &store_ready).await
        }
        StoreUrl::Mssql(raw) => {
            // A string that does not parse will not parse later either: fail now.
            let parsed: MssqlConfig = raw.parse()?;
            let connect = || MssqlStore::connect_with(parsed.clone(), pool);
            open_then_serve(connect, receiver, config, probe, &store_ready).await
        }
        StoreUrl::Sqlite(path) => {
            let connect = || async { SqliteStore::open(path) };
            open_then_serve(connect, receiver, config, probe, &store_ready).await
        }
        StoreUrl::SqliteMemory => {
            let store = SqliteStore::open_in_memory()?;
            store.migrate().await?;
            serve(receiver, store, config, probe).await
        }
    }
}

/// Connects and checks the schema until both succeed (see [`open::until_open`]), then serves;
/// a shutdown before that ends the worker with nothing processed.
async fn open_then_serve<S, F, Fut>(
    connect: F,
    receiver: ServiceBusReceiver,
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
        Ok(store)
    };
    match open::until_open(open, store_ready, &probe.shutdown).await {
        Some(store) => serve(receiver, store, config, probe).await,
        None => Ok(StatsSnapshot::default()),
    }
}

/// What the health endpoints and the drain need.
struct Probe {
    client: ServiceBusClient,
    readiness: Readiness,
    shutdown: CancellationToken,
}

async fn serve<S: InventoryStore + OutboxStore + RetentionStore + Ping + Clone + 'static>(
    receiver: ServiceBusReceiver,
    store: S,
    config: &WorkerConfig,
    probe: Probe,
) -> Result<StatsSnapshot, WorkerError> {
    let Probe {
        client,
        readiness,
        shutdown,
    } = probe;
    // Open and migrated: from now on the store is ready while it answers a ping in time.
    readiness.probe("store", {
        let store = store.clone();
        move || {
            let store = store.clone();
            async move { store.ping().await.map_err(|e| e.to_string()) }
        }
    });
    let mut runtime_config = config.runtime.clone();
    if let Some(policy) = &config.retry {
        // Copies go back to the consumed queue (the configuration refuses subscriptions).
        runtime_config.delayed_retry = Some(DelayedRetry::new(
            policy.clone(),
            client.publisher(),
            config.entity.clone(),
        ));
    }
    // The relay and retention stop after the drain, or when this future is dropped.
    let stop_background = CancellationToken::new();
    let _stop_background = stop_background.clone().drop_guard();
    let relay = Relay::new(store.clone(), client.publisher(), config.relay.clone());
    let consumer_name = config.runtime.consumer.as_str();
    // The gauges read the relay's last backlog sample; they live as long as the worker.
    let relay_stats = relay.stats();
    let _outbox_gauges = telemetry::hooks::observe_outbox(consumer_name, move || {
        relay_stats.snapshot().backlog.map_or_else(
            telemetry::hooks::OutboxBacklog::default,
            |sample| telemetry::hooks::OutboxBacklog {
                pending: sample.pending,
                oldest_age: sample.oldest_age,
            },
        )
    });
    let mut _retention_counter = None;
    let mut background = vec![tokio::spawn({
        let stop = stop_background.clone();
        async move { relay.run(stop).await }
    })];
    if let Some(retention) = &config.retention {
        let task = RetentionTask::new(store.clone(), retention.task_config());
        let stats = task.stats();
        _retention_counter = Some(telemetry::hooks::observe_retention(
            consumer_name,
            move || stats.snapshot().inbox_deleted,
        ));
        let stop = stop_background.clone();
        background.push(tokio::spawn(async move { task.run(stop).await }));
    }
    let consumer = match &config.outbox_destination {
        Some(destination) => OrderPlacedConsumer::new().with_events(destination),
        None => OrderPlacedConsumer::new(),
    };
    let runtime = Runtime::new(receiver.clone(), store, consumer, runtime_config);
    let retries = config.retry.as_ref().map_or(0, RetryPolicy::max_retries);
    tracing::info!(entity = %config.entity, consumer = %config.runtime.consumer, store = %config.store, delayed_retries = retries, "Worker started.");
    let result = runtime.run(shutdown).await;
    receiver.close().await;
    stop_background.cancel();
    stop(background).await;
    result?;
    let stats = runtime.stats().snapshot();
    tracing::info!(?stats, "Worker stopped.");
    Ok(stats)
}

/// Waits for the background tasks to finish their batch, at most [`BACKGROUND_STOP`] in all.
async fn stop(tasks: Vec<JoinHandle<()>>) {
    let deadline = tokio::time::Instant::now() + BACKGROUND_STOP;
    for mut task in tasks {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "A background task failed."),
            Err(_) => {
                tracing::warn!("A background task did not stop in time; aborting it.");
                task.abort();
            }
        }
    }
}
