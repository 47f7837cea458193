//! Driving the runtime over the in-memory broker: configurations, a runtime on the test's
//! (paused) clock, every ready delivery at once, and deliveries handed over one at a time or
//! in batches as the receive loop would.

use sb_inbox::testing::{MemoryBroker, MemoryDelivery, MemoryReceiver};
use sb_inbox::{
    ConsumerName, Delivery, Handler, Outcome, Receiver, Report, Runtime, RuntimeConfig, Store,
};

/// The batch size the batched variants of the runtime scenarios run with.
pub const BATCH: usize = 16;

/// A runtime configuration for `consumer`, the defaults otherwise.
pub fn config(consumer: &str) -> RuntimeConfig {
    RuntimeConfig::new(ConsumerName::new(consumer).expect("a valid consumer name"))
}

/// A runtime configuration for `consumer` with `batch` deliveries per transaction.
pub fn batched(consumer: &str, batch: usize) -> RuntimeConfig {
    let mut config = config(consumer);
    config.batch_size = batch;
    config
}

/// A runtime on `broker` and `store` on the broker's clock (created inside the test, so that
/// it follows tokio's paused clock): one clock, so that the lock the broker grants is the lock
/// the runtime reckons, whatever real time passed between the two were set up.
pub fn on_test_clock<S: Store + Clone, H: Handler<S::Tx>>(
    broker: &MemoryBroker,
    store: &S,
    handler: H,
    config: RuntimeConfig,
) -> Runtime<MemoryReceiver, S, H> {
    Runtime::with_clock(
        broker.receiver(),
        store.clone(),
        handler,
        config,
        broker.clock(),
    )
}

/// Every delivery `broker` has ready now, in order.
pub fn ready_deliveries(broker: &MemoryBroker) -> Vec<MemoryDelivery> {
    std::iter::from_fn(|| broker.try_receive()).collect()
}

/// The outcome of each report, in order.
pub fn outcomes(reports: &[Report]) -> Vec<Outcome> {
    reports.iter().map(|r| r.outcome).collect()
}

/// Hands `deliveries` to `runtime` in order: one at a time with `batch` 1, else in batches of
/// `batch` (one transaction each), as the receive loop would.
pub async fn handle_all<R, S, H, D>(
    runtime: &Runtime<R, S, H>,
    batch: usize,
    deliveries: Vec<D>,
) -> Vec<Report>
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let mut reports = Vec::new();
    if batch == 1 {
        for delivery in deliveries {
            reports.push(runtime.process(delivery).await);
        }
        return reports;
    }
    let mut deliveries = deliveries.into_iter().peekable();
    while deliveries.peek().is_some() {
        let chunk: Vec<D> = deliveries.by_ref().take(batch).collect();
        reports.extend(runtime.process_batch(chunk).await);
    }
    reports
}

/// One delivery, as [`handle_all`] hands it over.
pub async fn handle_one<R, S, H, D>(runtime: &Runtime<R, S, H>, batch: usize, delivery: D) -> Report
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    handle_all(runtime, batch, vec![delivery])
        .await
        .pop()
        .expect("one report per delivery")
}
