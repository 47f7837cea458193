//! Graceful drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use sb_inbox::Clock;
use sb_inbox::runtime::{DelayedRetry, RetryPolicy};
use sb_inbox::testing::MemoryBroker;
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::handlers::Gate;
use crate::support::orders::two_line_order;
use crate::support::runtime::{config, on_test_clock};
use crate::support::sqlite_store;

async fn run_with_gate(
    open_before_grace: bool,
    delayed_retry: bool,
) -> (MemoryBroker, sb_inbox::SqliteStore, Duration) {
    let store = sqlite_store("shutdown", 1).await;
    let broker = MemoryBroker::new(Clock::new());
    let started = Arc::new(Notify::new());
    let open = Arc::new(Notify::new());
    let handler = Gate {
        inner: OrderPlacedConsumer::new(),
        started: started.clone(),
        open: open.clone(),
    };
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.shutdown_grace = Duration::from_secs(5);
    config.concurrency = 1;
    if delayed_retry {
        let policy = RetryPolicy::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
        config.delayed_retry = Some(DelayedRetry::new(policy, broker.clone(), "orders"));
    }
    let runtime = on_test_clock(&broker, &store, handler, config);
    broker.send(two_line_order("m-1", "o-1"));
    broker.send(two_line_order("m-2", "o-2"));
    let shutdown = CancellationToken::new();
    let begun = tokio::time::Instant::now();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        started.notified().await;
        shutdown.cancel();
        if open_before_grace {
            tokio::task::yield_now().await;
            open.notify_one();
        }
    });
    result.unwrap();
    (broker, store, begun.elapsed())
}

#[tokio::test(start_paused = true)]
async fn in_flight_delivery_finishes_within_grace() {
    let (broker, store, elapsed) = run_with_gate(true, false).await;
    assert!(elapsed < Duration::from_secs(5));
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
    let counts = broker.counts();
    assert_eq!(counts.completed, 1);
    assert_eq!(counts.ready, 1, "no new message is taken after shutdown");
}

/// Shutdown is not the message's fault: even with delayed retries on, the delivery is abandoned
/// for an immediate redelivery, not scheduled for later.
#[tokio::test(start_paused = true)]
async fn in_flight_delivery_past_grace_is_rolled_back_and_abandoned() {
    let (broker, store, elapsed) = run_with_gate(false, true).await;
    assert_eq!(elapsed, Duration::from_secs(5));
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 0));
    let counts = broker.counts();
    assert_eq!(
        (counts.abandoned, counts.completed, counts.ready),
        (1, 0, 2)
    );
    assert!(broker.sent().is_empty(), "no delayed retry on shutdown");
}
