//! Delayed retries under tokio's paused clock: copies scheduled with the configured backoff,
//! the logical id kept, one effect however the copies and originals interleave, and
//! `RetriesExhausted` once the retries are spent.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sb_inbox::runtime::{
    DelayedRetry, JitterSource, LAST_ERROR_PROPERTY, LOGICAL_ID_PROPERTY, RETRY_ATTEMPT_PROPERTY,
    RetryPolicy, original_enqueued_time,
};
use sb_inbox::testing::{MemoryBroker, MemoryReceiver};
use sb_inbox::{
    Clock, DelegateTx, Delivery, DuplicateScope, ErrorKind, Outcome, PropertyValue, Runtime,
    RuntimeConfig, SqliteStore, Store, StoreError, StoreTx,
};
use sb_inbox_cli::inventory::{InventoryStore, OrderPlacedConsumer};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::handlers::Flaky;
use crate::support::orders::two_line_order;
use crate::support::runtime::config;
use crate::support::{Count, sqlite_store};

const BASE: Duration = Duration::from_secs(10);
const MAX: Duration = Duration::from_secs(30);
/// With jitter 0.2 and the source fixed at 0.5 every backoff is cut by 10 %: 10 s, 20 s and the
/// 30 s cap become these.
const DELAYS: [Duration; 3] = [
    Duration::from_secs(9),
    Duration::from_secs(18),
    Duration::from_secs(27),
];

type FlakyRuntime = Runtime<MemoryReceiver, SqliteStore, Flaky<OrderPlacedConsumer>>;

fn retry_config(broker: &MemoryBroker, max_retries: u32) -> RuntimeConfig {
    let policy = RetryPolicy::new(max_retries, BASE, MAX)
        .unwrap()
        .with_jitter(0.2, JitterSource::fixed(0.5))
        .unwrap();
    let mut config = config(sb_inbox_cli::inventory::CONSUMER);
    config.delayed_retry = Some(DelayedRetry::new(policy, broker.clone(), "orders"));
    config
}

/// A runtime whose handler fails transiently `failures` times, on a broker with `lock`.
async fn setup(
    failures: u32,
    max_retries: u32,
    lock: Duration,
) -> (MemoryBroker, SqliteStore, FlakyRuntime) {
    let store = sqlite_store("retry", 1).await;
    let clock = Clock::new();
    let broker = MemoryBroker::with_options(clock, lock, 10);
    let handler = Flaky::new(OrderPlacedConsumer::new(), failures);
    let config = retry_config(&broker, max_retries);
    let runtime = Runtime::with_clock(broker.receiver(), store.clone(), handler, config, clock);
    broker.send(two_line_order("m-1", "o-1"));
    (broker, store, runtime)
}

/// Runs the receive loop until the broker holds nothing ready, locked or scheduled; returns the
/// (paused) time that took.
async fn run_until_idle(runtime: &FlakyRuntime, broker: &MemoryBroker) -> Duration {
    let started = Instant::now();
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        broker.wait_idle().await;
        shutdown.cancel();
    });
    result.unwrap();
    started.elapsed()
}

fn text(value: Option<&PropertyValue>) -> &str {
    match value {
        Some(PropertyValue::String(text)) => text,
        other => panic!("not a string: {other:?}"),
    }
}

async fn inbox_keys(store: &SqliteStore) -> Vec<String> {
    store
        .with_connection(|conn| {
            let mut statement = conn.prepare("SELECT message_id FROM sb_inbox")?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect::<Result<Vec<String>, _>>()
        })
        .await
        .unwrap()
}

/// Must show 3: a handler failing transiently twice, then succeeding. Each failure schedules a
/// copy after exactly the configured delay (9 s, then 18 s) and completes the delivery that
/// failed; the second copy succeeds. One reservation, one inbox row keyed on the logical id.
#[tokio::test(start_paused = true)]
async fn failing_twice_then_succeeding_takes_effect_once_after_the_configured_delays() {
    let (broker, store, runtime) = setup(2, 3, Duration::from_secs(30)).await;
    let elapsed = run_until_idle(&runtime, &broker).await;
    assert_eq!(
        elapsed,
        DELAYS[0] + DELAYS[1],
        "each copy ran when it was due"
    );
    let attempts = runtime.handler().attempts();
    let (first, _) = attempts[0];
    let timeline: Vec<(Duration, &str)> = attempts
        .iter()
        .map(|(at, id)| (*at - first, id.as_str()))
        .collect();
    assert_eq!(
        timeline,
        [
            (Duration::ZERO, "m-1"),
            (DELAYS[0], "m-1/retry-1"),
            (DELAYS[0] + DELAYS[1], "m-1/retry-1/retry-2")
        ]
    );

    let sent = broker.sent();
    assert_eq!(sent.len(), 2, "{sent:#?}");
    // Each copy's broker id derives from the delivery that failed: no copy repeats another's.
    let ids = ["m-1/retry-1", "m-1/retry-1/retry-2"];
    for ((attempt, copy), id) in (1..).zip(&sent).zip(ids) {
        let delay = DELAYS[usize::try_from(attempt - 1).unwrap()];
        assert_eq!(copy.destination, "orders");
        assert_eq!(copy.scheduled_enqueue_time, Some(copy.sent_at + delay));
        let message = &copy.message;
        assert_eq!(message.message_id.as_deref(), Some(id));
        let properties = &message.application_properties;
        assert_eq!(text(properties.get(LOGICAL_ID_PROPERTY)), "m-1");
        assert_eq!(
            properties.get(RETRY_ATTEMPT_PROPERTY),
            Some(&PropertyValue::Long(attempt))
        );
        assert!(text(properties.get(LAST_ERROR_PROPERTY)).contains("injected failure"));
        assert_eq!(message.body, two_line_order("m-1", "o-1").body);
    }
    assert_eq!(
        sent[1].sent_at.duration_since(sent[0].sent_at).unwrap(),
        DELAYS[0],
        "the first copy was delivered (and failed) the moment it was due"
    );
    // Both copies carry the original's enqueue time (the moment of the first attempt, when the
    // first copy was sent), not their own: the second copy was enqueued DELAYS[0] later.
    for copy in &sent {
        let carried = original_enqueued_time(&copy.message).expect("carried");
        let off = carried
            .duration_since(sent[0].sent_at)
            .unwrap_or_else(|e| e.duration());
        assert!(
            off < Duration::from_millis(1),
            "{carried:?} vs {:?}",
            sent[0].sent_at
        );
    }

    let stats = runtime.stats().snapshot();
    assert_eq!(
        (
            stats.transient,
            stats.retried,
            stats.processed,
            stats.permanent
        ),
        (2, 2, 1, 0)
    );
    let counts = broker.counts();
    assert_eq!(
        (
            counts.completed,
            counts.abandoned,
            counts.dead_lettered,
            counts.scheduled
        ),
        (3, 0, 0, 0),
        "the original and both copies completed, nothing abandoned"
    );
    let inventory = store.inventory_counts().await.unwrap();
    assert_eq!(
        (
            inventory.reservations,
            inventory.inbox_rows,
            inventory.reserved_units,
            inventory.line_units
        ),
        (1, 1, 3, 3)
    );
    assert_eq!(inbox_keys(&store).await, ["m-1"]);
}

/// A handler that always fails: after the original and 3 copies (9 + 18 + 27 s) the last copy
/// is dead-lettered with `RetriesExhausted`, naming the attempts and the last error, its
/// verdict recorded as the message's inbox row.
#[tokio::test(start_paused = true)]
async fn exhausted_retries_dead_letter_with_retries_exhausted() {
    let (broker, store, runtime) = setup(u32::MAX, 3, Duration::from_secs(30)).await;
    let elapsed = run_until_idle(&runtime, &broker).await;
    assert_eq!(elapsed, DELAYS.iter().sum::<Duration>());

    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    let dead = &dead[0];
    assert_eq!(dead.reason, "RetriesExhausted");
    assert!(
        dead.description
            .starts_with("delayed retries exhausted (3 of 3, 4 attempts in all); last error: "),
        "{}",
        dead.description
    );
    assert!(dead.description.contains("injected failure"));
    assert_eq!(
        dead.message.message_id.as_deref(),
        Some("m-1/retry-1/retry-2/retry-3")
    );
    assert_eq!(
        text(dead.message.application_properties.get(LOGICAL_ID_PROPERTY)),
        "m-1"
    );
    let stats = runtime.stats().snapshot();
    assert_eq!((stats.transient, stats.retried, stats.permanent), (3, 3, 1));
    assert_eq!(broker.sent().len(), 3);
    let counts = broker.counts();
    assert_eq!((counts.completed, counts.dead_lettered), (3, 1));
    // Nothing reserved; the one inbox row is the dead letter's verdict (issue 41), which a
    // twin of the message would meet.
    let inventory = store.inventory_counts().await.unwrap();
    assert_eq!((inventory.reservations, inventory.inbox_rows), (0, 1));
}

/// Completing the original fails after its copy was accepted, so both exist: the original
/// comes back when its lock runs out, the copy when it is due. Whichever comes first takes
/// effect; the other is a duplicate of the logical id. Run with the copy first (due at 9 s, before
/// the 30 s lock runs out) and with the original first (5 s lock).
#[tokio::test(start_paused = true)]
async fn a_failed_completion_after_the_copy_leaves_both_and_only_one_takes_effect() {
    for lock in [Duration::from_secs(30), Duration::from_secs(5)] {
        let (broker, store, runtime) = setup(1, 3, lock).await;
        let start = Instant::now();
        broker.fail_next_settlements(1);
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(report.outcome, Outcome::Transient);
        assert!(matches!(report.settled, Some(Err(_))), "{report:?}");
        let retry = report.retry.expect("the copy was accepted");
        assert_eq!((retry.attempt, retry.delay), (1, DELAYS[0]));
        let counts = broker.counts();
        assert_eq!(
            (counts.locked, counts.scheduled, counts.completed),
            (1, 1, 0),
            "the original is still locked beside its scheduled copy"
        );

        let mut due = [(DELAYS[0], "m-1/retry-1"), (lock, "m-1")];
        due.sort();
        let mut outcomes = Vec::new();
        for (at, id) in due {
            tokio::time::advance((start + at).saturating_duration_since(Instant::now())).await;
            let delivery = broker.try_receive().expect("due now");
            assert_eq!(delivery.message().message_id.as_deref(), Some(id));
            let report = runtime.process(delivery).await;
            assert_eq!(report.settled, Some(Ok(())), "{report:?}");
            outcomes.push(report.outcome);
        }
        assert_eq!(
            outcomes,
            [
                Outcome::Processed,
                Outcome::Duplicate(DuplicateScope::Inbox)
            ],
            "lock {lock:?}"
        );
        let inventory = store.inventory_counts().await.unwrap();
        assert_eq!(
            (
                inventory.reservations,
                inventory.inbox_rows,
                inventory.reserved_units
            ),
            (1, 1, 3)
        );
        let counts = broker.counts();
        assert_eq!((counts.ready, counts.locked, counts.scheduled), (0, 0, 0));
    }
}

/// The broker refuses the copy: the original is abandoned instead (nothing lost) and the next
/// failure schedules the copy as the first retry.
#[tokio::test(start_paused = true)]
async fn a_refused_copy_falls_back_to_abandon() {
    let (broker, store, runtime) = setup(2, 3, Duration::from_secs(30)).await;
    broker.fail_next_sends(1);
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(
        (report.outcome, report.settled.clone(), report.retry),
        (Outcome::Transient, Some(Ok(())), None)
    );
    assert_eq!(broker.counts().abandoned, 1);
    assert!(broker.sent().is_empty());

    let redelivery = broker
        .try_receive()
        .expect("abandoned, so available at once");
    assert_eq!(redelivery.delivery_count(), 1);
    let report = runtime.process(redelivery).await;
    assert_eq!(report.retry.map(|r| r.attempt), Some(1));
    assert_eq!(
        broker.sent()[0].message.message_id.as_deref(),
        Some("m-1/retry-1")
    );
    tokio::time::advance(DELAYS[0]).await;
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Processed);
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
}

/// The last delayed retry's commit went through but its answer was lost (the connection broke):
/// the runtime finds the inbox row and completes the message as a duplicate instead of
/// dead-lettering an applied effect as `RetriesExhausted`.
#[tokio::test]
async fn a_last_retry_whose_commit_went_through_is_not_dead_lettered() {
    let store = sqlite_store("retry_answer_lost", 1).await;
    let broker = MemoryBroker::new(Clock::new());
    let mut runtime_config = retry_config(&broker, 1);
    runtime_config.consumer = sb_inbox::ConsumerName::new("billing.order-placed.v1").unwrap();
    let runtime = Runtime::new(
        broker.receiver(),
        crate::batch::FailingCommit::answer_lost(store.clone(), 1),
        crate::support::handlers::Noop::new(),
        runtime_config,
    );
    let mut last = two_line_order("m-1/retry-1", "o-1");
    let properties = &mut last.application_properties;
    properties.insert(LOGICAL_ID_PROPERTY.into(), "m-1".into());
    properties.insert(RETRY_ATTEMPT_PROPERTY.into(), PropertyValue::Long(1));
    broker.send(last);
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(
        report.outcome,
        Outcome::Duplicate(DuplicateScope::Inbox),
        "{report:?}"
    );
    assert_eq!(report.settled, Some(Ok(())));
    let c = broker.counts();
    assert_eq!(
        (c.completed, c.dead_lettered, c.sent),
        (1, 0, 1),
        "no copy sent"
    );
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

/// Issue 34: a MassTransit message (the JSON envelope, its `messageId` distinct from the broker
/// id) failing once is retried under a copy keyed on the envelope's id: the copy carries
/// `messageId` as its logical id, the inbox row is keyed on it, and the message delivered again
/// under another broker id is a duplicate of its first delivery.
#[tokio::test(start_paused = true)]
async fn a_masstransit_retry_copy_keys_on_the_envelopes_message_id() {
    use sb_inbox::envelope::{MASSTRANSIT_CONTENT_TYPE, MassTransit, TypeMap};
    let store = sqlite_store("retry_masstransit", 1).await;
    let clock = Clock::new();
    let broker = MemoryBroker::with_options(clock, Duration::from_secs(30), 10);
    let handler = Flaky::new(OrderPlacedConsumer::new(), 1);
    let mut config = retry_config(&broker, 3);
    config.envelope = std::sync::Arc::new(
        MassTransit::new(
            TypeMap::new()
                .with(
                    "urn:message:Shop.Contracts:OrderPlaced",
                    "orders.order-placed.v1",
                )
                .unwrap(),
        )
        .unwrap(),
    );
    let runtime = Runtime::with_clock(broker.receiver(), store.clone(), handler, config, clock);
    let order = two_line_order("unused", "o-1").body;
    let envelope = |broker_id: &str| {
        let body = format!(
            r#"{{"messageId":"mt-1","messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{}}}"#,
            String::from_utf8_lossy(&order)
        );
        sb_inbox::Message::new(broker_id, "", body).with_content_type(MASSTRANSIT_CONTENT_TYPE)
    };
    broker.send(envelope("b-1"));
    run_until_idle(&runtime, &broker).await;
    let sent = broker.sent();
    assert_eq!(sent.len(), 1, "{sent:#?}");
    let copy = &sent[0].message;
    assert_eq!(copy.message_id.as_deref(), Some("b-1/retry-1"));
    assert_eq!(
        text(copy.application_properties.get(LOGICAL_ID_PROPERTY)),
        "mt-1"
    );
    assert_eq!(inbox_keys(&store).await, ["mt-1"]);

    broker.send(envelope("b-2"));
    let delivery = broker.try_receive().unwrap();
    assert_eq!(
        runtime.process(delivery).await.outcome,
        Outcome::Duplicate(DuplicateScope::Inbox)
    );
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 1);
}

/// A store whose first commit fails with `kind` (after committing when `commits`: the answer
/// was lost), and which is down (every `begin` refused, unavailable) from then on while `down`
/// stays set.
#[derive(Debug, Clone)]
struct LostAnswer<S> {
    inner: S,
    kind: ErrorKind,
    commits: bool,
    failed: Arc<AtomicBool>,
    down: Arc<AtomicBool>,
}

impl<S> LostAnswer<S> {
    fn new(inner: S, kind: ErrorKind, commits: bool, then_down: bool) -> Self {
        LostAnswer {
            inner,
            kind,
            commits,
            failed: Arc::default(),
            down: Arc::new(AtomicBool::new(then_down)),
        }
    }
}

#[derive(Debug)]
struct LostAnswerTx<T> {
    inner: T,
    store: LostAnswer<()>,
}

impl<S: Store> Store for LostAnswer<S> {
    type Tx = LostAnswerTx<S::Tx>;

    async fn begin(&self) -> Result<Self::Tx, StoreError> {
        if self.failed.load(Ordering::SeqCst) && self.down.load(Ordering::SeqCst) {
            return Err(StoreError::new(
                ErrorKind::Unavailable,
                Some("57P03".into()),
                None,
                "the database system is shutting down",
            ));
        }
        Ok(LostAnswerTx {
            inner: self.inner.begin().await?,
            store: LostAnswer {
                inner: (),
                kind: self.kind,
                commits: self.commits,
                failed: self.failed.clone(),
                down: self.down.clone(),
            },
        })
    }
}

impl<T: StoreTx> DelegateTx for LostAnswerTx<T> {
    type Inner = T;

    fn inner(&mut self) -> &mut T {
        &mut self.inner
    }

    fn into_inner(self) -> T {
        self.inner
    }

    async fn commit(self) -> Result<(), StoreError> {
        if self.store.failed.swap(true, Ordering::SeqCst) {
            return self.inner.commit().await;
        }
        if self.store.commits {
            self.inner.commit().await?;
        } else {
            self.inner.rollback().await?;
        }
        Err(StoreError::new(
            self.store.kind,
            None,
            None,
            "injected: the commit's answer was lost",
        ))
    }
}

/// The last delayed retry of `m-1` (attempt 1 of 1), on `broker`.
fn last_retry(broker: &MemoryBroker) {
    let mut last = two_line_order("m-1/retry-1", "o-1");
    let properties = &mut last.application_properties;
    properties.insert(LOGICAL_ID_PROPERTY.into(), "m-1".into());
    properties.insert(RETRY_ATTEMPT_PROPERTY.into(), PropertyValue::Long(1));
    broker.send(last);
}

/// Issue 40, M1 (the rest): the last delayed retry's commit fails without an answer (a broken
/// connection, or an error nobody classified), and the store is down when the runtime asks
/// whether the inbox row is there. It cannot tell whether the message took effect, so the
/// delivery is given back (abandoned, no copy), never dead-lettered `RetriesExhausted`; once
/// the store answers again, the redelivery is processed. Before, a store that could not answer
/// counted as "not committed" and the message was dead-lettered.
#[tokio::test(start_paused = true)]
async fn a_last_retry_the_store_cannot_check_is_given_back_not_dead_lettered() {
    for kind in [ErrorKind::Connection, ErrorKind::Unknown] {
        let store = sqlite_store("retry_cannot_check", 1).await;
        let broker = MemoryBroker::new(Clock::new());
        let mut config = retry_config(&broker, 1);
        config.transient_hold_max = Duration::ZERO;
        let unsure = LostAnswer::new(store.clone(), kind, false, true);
        let down = unsure.down.clone();
        let runtime = Runtime::new(
            broker.receiver(),
            unsure,
            crate::support::handlers::Noop::new(),
            config,
        );
        last_retry(&broker);
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(report.outcome, Outcome::Transient, "{kind:?}: {report:?}");
        assert_eq!(report.settled, Some(Ok(())), "{kind:?}");
        let c = broker.counts();
        assert_eq!(
            (c.dead_lettered, c.abandoned, c.sent),
            (0, 1, 1),
            "{kind:?}: given back, no copy: {c:?}"
        );
        down.store(false, Ordering::SeqCst);
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(report.outcome, Outcome::Processed, "{kind:?}: {report:?}");
        assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
    }
}

/// Issue 40, minor 13: without delayed retries, the commit on a message's last delivery (max
/// delivery count 1 here) goes through but its answer is lost. The runtime asks the store
/// before settling, finds the inbox row and completes the message. Before, it was abandoned and
/// the broker dead-lettered an applied message `MaxDeliveryCountExceeded`.
#[tokio::test(start_paused = true)]
async fn a_lost_commit_answer_on_the_last_delivery_is_not_dead_lettered() {
    for kind in [ErrorKind::Connection, ErrorKind::Unknown] {
        let store = sqlite_store("retry_lost_answer", 1).await;
        let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), 1);
        let mut config = config(sb_inbox_cli::inventory::CONSUMER);
        config.transient_hold_max = Duration::ZERO;
        let runtime = Runtime::new(
            broker.receiver(),
            LostAnswer::new(store.clone(), kind, true, false),
            crate::support::handlers::Noop::new(),
            config,
        );
        broker.send(two_line_order("m-1", "o-1"));
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(
            report.outcome,
            Outcome::Duplicate(DuplicateScope::Inbox),
            "{kind:?}: {report:?}"
        );
        assert_eq!(report.settled, Some(Ok(())), "{kind:?}");
        let c = broker.counts();
        assert_eq!((c.completed, c.dead_lettered), (1, 0), "{kind:?}: {c:?}");
        assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
    }
}
