//! Lock keeping under tokio's paused clock (no real waiting): renewals while a long handler
//! runs, and fencing when renewals fail.

use std::time::Duration;

use sb_inbox::testing::{MemoryBroker, RenewFault};
use sb_inbox::{Clock, Outcome, Runtime, SqliteStore};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};

use crate::support::handlers::Slow;
use crate::support::orders::two_line_order;
use crate::support::runtime::{config, on_test_clock};
use crate::support::{inventory_totals, sqlite_store};

const LOCK: Duration = Duration::from_secs(30);
const MARGIN: Duration = Duration::from_secs(10);

async fn setup(
    handler_time: Duration,
) -> (
    MemoryBroker,
    SqliteStore,
    Runtime<sb_inbox::testing::MemoryReceiver, SqliteStore, Slow<OrderPlacedConsumer>>,
) {
    let store = sqlite_store("lock", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), LOCK, 10);
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.lock_margin = MARGIN;
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: handler_time,
    };
    let runtime = on_test_clock(&broker, &store, handler, config);
    broker.send(two_line_order("m-1", "o-1"));
    (broker, store, runtime)
}

/// Renewals fall at `k × (lock − margin)` while the handler runs.
fn expected_renewals(handler_time: Duration) -> u32 {
    let period = (LOCK - MARGIN).as_secs();
    u32::try_from((handler_time.as_secs() - 1) / period).unwrap()
}

#[tokio::test(start_paused = true)]
async fn long_handler_keeps_its_lock() {
    let handler_time = LOCK * 5;
    let (broker, store, runtime) = setup(handler_time).await;
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Processed);
    assert_eq!(report.settled, Some(Ok(())));
    assert_eq!(expected_renewals(handler_time), 7);
    assert_eq!(report.renewals, 7);
    assert_eq!(broker.counts().renewed, 7);
    assert_eq!(broker.counts().expired, 0);
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
}

#[tokio::test(start_paused = true)]
async fn lock_lost_on_renewal_fences_the_commit() {
    let (broker, store, runtime) = setup(LOCK * 5).await;
    broker.set_renew_fault(RenewFault::LockLost);
    let started = tokio::time::Instant::now();
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::LockLost);
    assert_eq!(
        report.settled, None,
        "no settlement is possible without the lock"
    );
    assert_eq!(
        started.elapsed(),
        LOCK - MARGIN,
        "the handler is cancelled at the failed renewal"
    );
    assert_eq!(inventory_totals(&store).await, (0, 0, 0));
    assert_eq!(broker.counts().completed, 0);
}

#[tokio::test(start_paused = true)]
async fn failing_renewals_fence_at_expiry() {
    let (broker, store, runtime) = setup(LOCK * 5).await;
    broker.set_renew_fault(RenewFault::Transient);
    let started = tokio::time::Instant::now();
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::LockLost);
    assert_eq!(report.settled, None);
    assert_eq!(
        started.elapsed(),
        LOCK,
        "retries go on until the lock runs out"
    );
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 0));
    // The broker redelivers once the lock has run out; the redelivery is processed normally.
    broker.set_renew_fault(RenewFault::None);
    let redelivery = broker.try_receive().expect("redelivered");
    assert_eq!(sb_inbox::Delivery::delivery_count(&redelivery), 1);
}

#[tokio::test(start_paused = true)]
async fn short_handler_needs_no_renewal() {
    let (broker, _store, runtime) = setup(LOCK - MARGIN - Duration::from_secs(1)).await;
    broker.set_renew_fault(RenewFault::LockLost);
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!((report.outcome, report.renewals), (Outcome::Processed, 0));
}
