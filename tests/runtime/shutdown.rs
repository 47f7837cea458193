//! Graceful drain on shutdown.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use sb_inbox::runtime::{DelayedRetry, RetryPolicy};
use sb_inbox::testing::MemoryBroker;
use sb_inbox::{Clock, HandlerError};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::support::handlers::{Gate, Noop, wrapper_handler};
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

/// Fails every delivery transiently before any store work, and wakes `reached` on its
/// `at`-th attempt.
#[derive(Debug)]
struct FailsUntilSeen<H> {
    inner: H,
    attempts: AtomicU32,
    at: u32,
    reached: Arc<Notify>,
}

wrapper_handler!(FailsUntilSeen, inner, |self, _ctx, _tx| {
    let _ = &self.inner; // The dependency is down: the inner handler is never reached.
    if self.attempts.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
        self.reached.notify_one();
    }
    Err(HandlerError::transient(
        "inventory API refused the connection",
    ))
});

/// Issue 40, minor 15: a shutdown past its grace cuts a transient hold short. The message's
/// ninth delivery fails and is held for 32 s to 64 s (250 ms doubling per delivery, cap 120 s,
/// lock 10 min); the shutdown's 1 s grace ends the hold and the delivery is abandoned then.
/// Before, the hold ignored the abort and the process overran its grace by half a minute.
#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_a_transient_hold_short() {
    let store = sqlite_store("shutdown_hold", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(600), 20);
    let reached = Arc::new(Notify::new());
    let handler = FailsUntilSeen {
        inner: Noop::new(),
        attempts: AtomicU32::new(0),
        at: 9,
        reached: reached.clone(),
    };
    let mut config = config("shutdown");
    config.shutdown_grace = Duration::from_secs(1);
    config.transient_hold_max = Duration::from_secs(120);
    let runtime = on_test_clock(&broker, &store, handler, config);
    broker.send(two_line_order("m-1", "o-1"));
    let shutdown = CancellationToken::new();
    let (result, cancelled_at) = tokio::join!(runtime.run(shutdown.clone()), async {
        reached.notified().await;
        shutdown.cancel();
        tokio::time::Instant::now()
    });
    result.unwrap();
    let overran = cancelled_at.elapsed();
    assert!(
        overran <= Duration::from_secs(2),
        "the run ended {overran:?} after the shutdown (grace 1 s)"
    );
    let c = broker.counts();
    assert_eq!((c.abandoned, c.dead_lettered), (9, 0), "{c:?}");
}

/// A sender whose sends never answer (a broker that accepted the connection and went quiet).
#[derive(Debug)]
struct Silent;

impl sb_inbox::Sender for Silent {
    async fn send(
        &self,
        _destination: &str,
        _message: sb_inbox::Message,
        _scheduled_enqueue_time: Option<std::time::SystemTime>,
    ) -> Result<(), sb_inbox::SendFailure> {
        std::future::pending().await
    }
}

/// Issue 40, minor 15: a delayed retry's send respects the shutdown's abort. The handler fails
/// transiently, the copy's send never answers; at the end of the 5 s grace the send is cut and
/// the original abandoned. Before, the send held the shutdown for as long as it took.
#[tokio::test(start_paused = true)]
async fn a_shutdown_cuts_a_delayed_retry_send_short() {
    let store = sqlite_store("shutdown_retry_send", 1).await;
    let broker = MemoryBroker::new(Clock::new());
    let reached = Arc::new(Notify::new());
    let handler = FailsUntilSeen {
        inner: Noop::new(),
        attempts: AtomicU32::new(0),
        at: 1,
        reached: reached.clone(),
    };
    let mut config = config("shutdown");
    config.shutdown_grace = Duration::from_secs(5);
    let policy = RetryPolicy::new(3, Duration::from_secs(10), Duration::from_secs(60)).unwrap();
    config.delayed_retry = Some(DelayedRetry::new(policy, Silent, "orders"));
    let runtime = on_test_clock(&broker, &store, handler, config);
    broker.send(two_line_order("m-1", "o-1"));
    let shutdown = CancellationToken::new();
    let begun = tokio::time::Instant::now();
    let run = async {
        tokio::join!(runtime.run(shutdown.clone()), async {
            reached.notified().await;
            shutdown.cancel();
        })
    };
    let (result, ()) = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .expect("the shutdown does not wait for a send that never answers");
    result.unwrap();
    assert_eq!(begun.elapsed(), Duration::from_secs(5));
    let c = broker.counts();
    assert_eq!((c.abandoned, c.completed, c.ready), (1, 0, 1), "{c:?}");
}
