//! The downstream service: `orders.order-placed.v1` → one row per order in its own table,
//! hosted by sb-inbox's `Worker` from a configuration file.

use std::path::Path;

use sb_inbox::store::Migration;
use sb_inbox::worker::{Worker, WorkerConfig, WorkerError, WorkerStats};
use std::future::Future;

use sb_inbox::{
    Context, Handled, HandlerError, Json, JsonContract, JsonHandler, PgStore, PgTx, StoreError, Tx,
};
use tokio_util::sync::CancellationToken;

/// The service's own table, applied after sb-inbox's migrations.
pub const MIGRATION: Migration = Migration {
    version: 1000,
    name: "1000_downstream_orders.sql",
    sql: "CREATE TABLE downstream_orders (
              order_id  text   PRIMARY KEY,
              total     bigint NOT NULL);",
};

/// `orders.order-placed.v1`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderPlaced {
    /// The order.
    pub order_id: String,
    /// Its total, in cents.
    pub total_cents: i64,
}

impl JsonContract for OrderPlaced {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 1;
}

/// The service's own SQL, on the transaction that holds the inbox row: implemented for
/// `PgTx` here, and for a recording double in its tests (`sb_inbox::recording_tx!`).
pub trait OrdersTx: Tx {
    /// Inserts the order's row.
    fn insert_order(
        &mut self,
        order_id: &str,
        total_cents: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl OrdersTx for PgTx {
    async fn insert_order(&mut self, order_id: &str, total_cents: i64) -> Result<(), StoreError> {
        self.execute(
            "INSERT INTO downstream_orders (order_id, total) VALUES ($1, $2)",
            &[&order_id, &total_cents],
        )
        .await
        .map(|_| ())
    }
}

/// Records each order once, keyed by the order id (a republished order is a duplicate).
#[derive(Debug, Default)]
pub struct Orders;

impl<T: OrdersTx> JsonHandler<T> for Orders {
    type Message = OrderPlaced;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        order: &OrderPlaced,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        // A republished order (same order, new message id) stops here: a duplicate.
        ctx.claim(tx, &format!("order:{}", order.order_id)).await?;
        tx.insert_order(&order.order_id, order.total_cents).await?;
        Ok(Handled::Processed)
    }
}

/// Why the service stopped.
#[derive(Debug)]
pub enum Error {
    /// The configuration file or the environment.
    Config(sb_inbox::worker::ConfigErrors),
    /// The worker.
    Worker(WorkerError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Config(errors) => write!(f, "configuration: {errors}"),
            Error::Worker(error) => write!(f, "worker: {error}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Config(errors) => Some(errors),
            Error::Worker(error) => Some(error),
        }
    }
}

/// The worker configuration: `path` (JSON), with overrides from `ORDERS_*` variables in `env`.
///
/// # Errors
/// Every problem with the file or the variables.
pub fn load(path: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<WorkerConfig, Error> {
    WorkerConfig::load_with_prefix(Some(path), "ORDERS_", env).map_err(Error::Config)
}

/// Hosts [`Orders`] as `config` says, until `shutdown`.
///
/// # Errors
/// [`Error::Worker`] when the worker stops with an error.
pub async fn serve(
    config: WorkerConfig,
    shutdown: CancellationToken,
) -> Result<WorkerStats, Error> {
    Worker::<PgStore>::from_config(config)
        .schema_check(|store: PgStore| async move { own_table(&store).await })
        .run(shutdown, |_consumer| Json::new(Orders))
        .await
        .map_err(Error::Worker)
}

/// Hosts [`Orders`] as `config` says until the process receives SIGTERM or SIGINT, then
/// drains.
///
/// # Errors
/// [`Error::Worker`] when the worker stops with an error.
pub async fn serve_until_shutdown(config: WorkerConfig) -> Result<WorkerStats, Error> {
    Worker::<PgStore>::from_config(config)
        .schema_check(|store: PgStore| async move { own_table(&store).await })
        .run_until_shutdown(|_consumer| Json::new(Orders))
        .await
        .map_err(Error::Worker)
}

/// Ready once the service's own migration is applied too (a deployment step runs it).
async fn own_table(store: &PgStore) -> Result<(), sb_inbox::StoreError> {
    let rows = store
        .query(
            "SELECT count(*) FROM sb_inbox_schema_migrations WHERE version = $1",
            &[&MIGRATION.version],
        )
        .await?;
    match rows.first().map(|row| row.get::<_, i64>(0)) {
        Some(1) => Ok(()),
        _ => Err(sb_inbox::StoreError::of_kind(
            sb_inbox::ErrorKind::Schema,
            "downstream_orders is not migrated",
        )),
    }
}
