//! The correctness holes of issue 14 at the runtime level, on the in-memory broker under
//! tokio's paused clock: locks kept while deliveries wait for a slot, a skewed host clock, the
//! maximum processing time and the stuck-slot signal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sb_inbox::testing::{MemoryBroker, MemoryDelivery, MemoryReceiver};
use sb_inbox::{
    Clock, Delivery, Message, Outcome, PropertyValue, ReceiveError, Receiver, Runtime,
    RuntimeError, SettleError,
};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio_util::sync::CancellationToken;

use crate::support::handlers::Slow;
use crate::support::orders::two_line_order;
use crate::support::runtime::config;
use crate::support::sqlite_store;

/// Waits on tokio's (paused) clock until `done` holds.
async fn until(done: impl Fn() -> bool) {
    while !done() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Finding 5: concurrency 1, prefetch 3, a 3 s lock, max delivery count 1 and a handler taking
/// 12 s. The three deliveries waiting for the slot keep their locks from receipt: all four are
/// processed, none expires into the dead-letter queue.
#[tokio::test(start_paused = true)]
async fn deliveries_waiting_for_a_slot_keep_their_locks() {
    let store = sqlite_store("holes_waiting", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(3), 1);
    for i in 0..4 {
        broker.send(two_line_order(&format!("m-{i}"), &format!("o-{i}")));
    }
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.concurrency = 1;
    config.prefetch = 3;
    config.lock_margin = Duration::from_secs(1);
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: Duration::from_secs(12),
    };
    let runtime = Runtime::new(broker.receiver(), store.clone(), handler, config);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        until(|| {
            let c = broker.counts();
            c.completed + c.dead_lettered == 4
        })
        .await;
        shutdown.cancel();
    });
    result.unwrap();
    let counts = broker.counts();
    assert_eq!(
        (counts.completed, counts.dead_lettered, counts.expired),
        (4, 0, 0),
        "{:?}",
        broker.dead_letters()
    );
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 4);
}

/// Runs one 45 s handler under a 30 s lock (margin 10 s) with the runtime's host clock off the
/// broker's by `skew`.
async fn process_with_skew(
    skew: Duration,
    host_ahead: bool,
) -> (sb_inbox::Report, MemoryBroker, i64) {
    let store = sqlite_store("holes_skew", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), 10);
    broker.send(two_line_order("m-1", "o-1"));
    let now = SystemTime::now();
    let host = Clock::starting_at(if host_ahead { now + skew } else { now - skew });
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.lock_margin = Duration::from_secs(10);
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: Duration::from_secs(45),
    };
    let runtime = Runtime::with_clock(broker.receiver(), store.clone(), handler, config, host);
    let report = tokio::time::timeout(
        Duration::from_secs(600),
        runtime.process(broker.try_receive().unwrap()),
    )
    .await
    .expect("the delivery is handled");
    let reservations = store.inventory_counts().await.unwrap().reservations;
    (report, broker, reservations)
}

/// Committed and completed, renewed at 20 s and 40 s of broker time, no lock lost or expired.
fn processed_in_time((report, broker, reservations): (sb_inbox::Report, MemoryBroker, i64)) {
    assert_eq!(report.outcome, Outcome::Processed);
    assert_eq!(report.settled, Some(Ok(())));
    assert_eq!(report.renewals, 2);
    assert_eq!((broker.counts().expired, broker.counts().lock_lost), (0, 0));
    assert_eq!(reservations, 1);
}

/// Finding 8: a host clock 60 s behind the broker sees the lock expiring 60 s later than it
/// does. Renewals still come in time: the remaining lock is bounded by the broker's own
/// timestamps (`locked_until − enqueued_time`).
#[tokio::test(start_paused = true)]
async fn a_host_clock_behind_the_broker_still_renews_in_time() {
    processed_in_time(process_with_skew(Duration::from_secs(60), false).await);
}

/// Finding 8: a host clock 60 s ahead of the broker sees the lock as already expired. The
/// commit is not fenced for it, and renewals neither spin nor come late.
#[tokio::test(start_paused = true)]
async fn a_host_clock_ahead_of_the_broker_neither_fences_the_commit_nor_spins() {
    processed_in_time(process_with_skew(Duration::from_secs(60), true).await);
}

/// Finding 8: the runtime itself refuses a margin not shorter than the lock duration.
#[tokio::test]
async fn a_margin_not_shorter_than_the_lock_is_refused() {
    let broker = MemoryBroker::new(Clock::new());
    let store = sqlite_store("holes_margin", 1).await;
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.lock_margin = Duration::from_secs(30);
    config.lock_duration = Some(Duration::from_secs(30));
    let error = config.validate().unwrap_err();
    assert!(
        error
            .to_string()
            .contains("lock margin 30s must be shorter than the lock duration 30s"),
        "{error}"
    );
    let runtime = Runtime::new(broker.receiver(), store, OrderPlacedConsumer::new(), config);
    let refused = runtime.run(CancellationToken::new()).await;
    assert!(
        matches!(refused, Err(RuntimeError::Config(_))),
        "{refused:?}"
    );
}

/// Finding 6: a handler that would run for an hour is cancelled at the maximum processing
/// time, its transaction rolled back (no inbox row, no reservation) and the delivery abandoned.
#[tokio::test(start_paused = true)]
async fn processing_past_the_maximum_is_cancelled_rolled_back_and_abandoned() {
    let store = sqlite_store("holes_max_processing", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), 10);
    broker.send(two_line_order("m-1", "o-1"));
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.max_processing = Duration::from_secs(60);
    // Measured to the abandon: without the short hold every transient failure gets before it.
    config.transient_hold_max = Duration::ZERO;
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: Duration::from_secs(3600),
    };
    let runtime = Runtime::new(broker.receiver(), store.clone(), handler, config);
    let started = tokio::time::Instant::now();
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(started.elapsed(), Duration::from_secs(60));
    assert_eq!(report.outcome, Outcome::Transient);
    assert_eq!(report.settled, Some(Ok(())));
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 0));
    let counts = broker.counts();
    assert_eq!((counts.abandoned, counts.ready), (1, 1));
}

/// A delivery whose abandon never returns: its slot stays busy after the cancellation.
struct StuckAbandon(MemoryDelivery);

impl Delivery for StuckAbandon {
    fn message(&self) -> &Message {
        self.0.message()
    }
    fn delivery_count(&self) -> u32 {
        self.0.delivery_count()
    }
    fn lock_token(&self) -> uuid::Uuid {
        self.0.lock_token()
    }
    fn locked_until(&self) -> SystemTime {
        self.0.locked_until()
    }
    fn enqueued_time(&self) -> Option<SystemTime> {
        self.0.enqueued_time()
    }
    async fn renew_lock(&self) -> Result<SystemTime, SettleError> {
        self.0.renew_lock().await
    }
    async fn complete(&self) -> Result<(), SettleError> {
        self.0.complete().await
    }
    async fn abandon(&self, _: BTreeMap<String, PropertyValue>) -> Result<(), SettleError> {
        std::future::pending().await
    }
    async fn release(&self) -> Result<(), SettleError> {
        self.0.release().await
    }
    async fn dead_letter(&self, reason: &str, description: &str) -> Result<(), SettleError> {
        self.0.dead_letter(reason, description).await
    }
}

struct StuckReceiver(MemoryReceiver);

impl Receiver for StuckReceiver {
    type Delivery = StuckAbandon;
    async fn receive(&self) -> Result<Option<StuckAbandon>, ReceiveError> {
        Ok(self.0.receive().await?.map(StuckAbandon))
    }
}

/// Finding 6: a slot still busy well past the maximum processing time (here: a settlement that
/// never returns) is reported stuck, which fails the worker's `/readyz`; a slot within the
/// bound is not.
#[tokio::test(start_paused = true)]
async fn a_slot_busy_past_the_bound_is_reported_stuck() {
    let store = sqlite_store("holes_stuck", 1).await;
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), 10);
    broker.send(two_line_order("m-1", "o-1"));
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.concurrency = 1;
    config.max_processing = Duration::from_secs(60);
    let handler = Slow {
        inner: OrderPlacedConsumer::new(),
        duration: Duration::from_secs(3600),
    };
    let runtime = Arc::new(Runtime::new(
        StuckReceiver(broker.receiver()),
        store,
        handler,
        config,
    ));
    let slots = runtime.slots();
    let task = tokio::spawn({
        let runtime = runtime.clone();
        async move { runtime.run(CancellationToken::new()).await }
    });
    until(|| slots.in_use() == 1).await;
    let begun = tokio::time::Instant::now();
    // `begun` is up to one poll after the slot was taken: stay a second clear of the bound.
    let bound = Duration::from_secs(60) + sb_inbox::runtime::STUCK_ALLOWANCE;
    tokio::time::sleep_until(begun + bound - Duration::from_secs(1)).await;
    assert_eq!((slots.in_use(), slots.stuck()), (1, 0), "within the bound");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(slots.stuck(), 1, "past the bound");
    task.abort();
}
