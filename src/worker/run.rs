use tokio_util::sync::CancellationToken;

use super::{BrokerAddress, WorkerConfig};
use crate::inventory::{InventoryStore, OrderPlacedConsumer};
use crate::servicebus::{ServiceBusClient, ServiceBusReceiver};
use crate::store::StoreUrl;
use crate::{MssqlStore, PgStore, Runtime, RuntimeError, SqliteStore, StatsSnapshot, StoreError};

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
    /// A configured feature this build does not have.
    #[error("{0}")]
    Unsupported(&'static str),
}

/// Runs the reference inventory consumer as configured until `shutdown`, then drains, releases
/// prefetched deliveries and returns the counters.
///
/// # Errors
/// [`WorkerError`] when the store cannot be opened or the receiver fails for good.
pub async fn run(
    config: &WorkerConfig,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let client = match &config.broker {
        BrokerAddress::Connection(cs) => ServiceBusClient::from_connection_string(cs),
        BrokerAddress::Namespace(_) => {
            return Err(WorkerError::Unsupported(
                "Microsoft Entra ID authentication is not in this build yet: set servicebus.connection (SB_INBOX_SERVICEBUS_CONNECTION)",
            ));
        }
    };
    let prefetch = u32::try_from(config.runtime.prefetch).unwrap_or(u32::MAX);
    let receiver = client.receiver(&config.entity, prefetch);
    let pool = u32::try_from(config.runtime.concurrency)
        .unwrap_or(u32::MAX)
        .saturating_add(2);
    match &config.store {
        StoreUrl::Postgres(url) => {
            serve(
                receiver,
                PgStore::connect(url, pool).await?,
                config,
                shutdown,
            )
            .await
        }
        StoreUrl::Mssql(raw) => {
            serve(
                receiver,
                MssqlStore::connect(raw, pool).await?,
                config,
                shutdown,
            )
            .await
        }
        StoreUrl::Sqlite(path) => serve(receiver, SqliteStore::open(path)?, config, shutdown).await,
        StoreUrl::SqliteMemory => {
            let store = SqliteStore::open_in_memory()?;
            store.migrate().await?;
            serve(receiver, store, config, shutdown).await
        }
    }
}

async fn serve<S: InventoryStore>(
    receiver: ServiceBusReceiver,
    store: S,
    config: &WorkerConfig,
    shutdown: CancellationToken,
) -> Result<StatsSnapshot, WorkerError> {
    let runtime = Runtime::new(
        receiver.clone(),
        store,
        OrderPlacedConsumer::new(),
        config.runtime.clone(),
    );
    tracing::info!(entity = %config.entity, consumer = %config.runtime.consumer, store = %config.store, "Worker started.");
    let result = runtime.run(shutdown).await;
    receiver.close().await;
    result?;
    let stats = runtime.stats().snapshot();
    tracing::info!(?stats, "Worker stopped.");
    Ok(stats)
}
