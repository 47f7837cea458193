//! A bad day under tokio's paused clock: a store that fails for every message alike pauses the
//! runtime (kill switch) instead of burning the backlog's delivery counts into the dead-letter
//! queue; a panicking handler is dead-lettered `HandlerPanicked` without costing a slot; a
//! flapping dependency is held, not redelivered at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sb_inbox::testing::{MemoryBroker, MemoryReceiver};
use sb_inbox::{
    CircuitPhase, Clock, ErrorKind, Handler, HandlerError, Outcome, Runtime, RuntimeConfig,
    RuntimeError, SqliteStore, SqliteTx, StoreError,
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::support::handlers::{Noop, wrapper_handler};
use crate::support::orders::two_line_order;
use crate::support::runtime::{batched, config, ready_deliveries};
use crate::support::sqlite_store;

/// The service's default max delivery count.
const MAX_DELIVERIES: u32 = 10;

/// Fails every message with the error PostgreSQL gives a role whose INSERT grant on the
/// business table was revoked, while `down` is set; otherwise takes 100 ms (of the paused
/// clock), so the backlog lasts long enough for the outage to meet it.
#[derive(Debug)]
struct Revoked<H> {
    inner: H,
    down: Arc<AtomicBool>,
}

wrapper_handler!(Revoked, inner, |self, ctx, tx| {
    if self.down.load(Ordering::SeqCst) {
        return Err(HandlerError::Store(StoreError::new(
            ErrorKind::Deployment,
            Some("42501".into()),
            None,
            "permission denied for table inventory_reservation",
        )));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    self.inner.handle(ctx, tx).await
});

/// Panics on the message with id `poison`.
#[derive(Debug)]
struct PanicsOn<H> {
    inner: H,
    poison: &'static str,
}

wrapper_handler!(PanicsOn, inner, |self, ctx, tx| {
    if ctx.message.message_id.as_deref() == Some(self.poison) {
        panic!("stock for {} went negative", self.poison);
    }
    self.inner.handle(ctx, tx).await
});

/// Fails transiently, fast, on every delivery.
#[derive(Debug)]
struct Down<H> {
    inner: H,
}

wrapper_handler!(Down, inner, |self, _ctx, _tx| {
    let _ = &self.inner; // The dependency never answers: the inner handler is not reached.
    Err(HandlerError::transient(
        "inventory API refused the connection",
    ))
});

fn broker_with(messages: usize) -> MemoryBroker {
    let broker = MemoryBroker::with_options(Clock::new(), Duration::from_secs(30), MAX_DELIVERIES);
    for i in 0..messages {
        broker.send(two_line_order(&format!("m-{i}"), &format!("o-{i}")));
    }
    broker
}

/// A runtime over `broker` (no transient hold) whose store refuses every message with a
/// revoked grant while the returned flag is set, as it is to begin with.
async fn revoked_runtime(
    broker: &MemoryBroker,
) -> (
    Arc<AtomicBool>,
    Runtime<MemoryReceiver, SqliteStore, Revoked<Noop>>,
) {
    let store = sqlite_store("circuit", 1).await;
    let down = Arc::new(AtomicBool::new(true));
    let handler = Revoked {
        inner: Noop::new(),
        down: down.clone(),
    };
    let mut config = config("circuit");
    config.transient_hold_max = Duration::ZERO;
    let runtime = Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    (down, runtime)
}

/// Runs the receive loop until `broker` holds nothing ready, locked or scheduled.
async fn run_until_idle<H: Handler<SqliteTx>>(
    runtime: &Runtime<MemoryReceiver, SqliteStore, H>,
    broker: &MemoryBroker,
) -> Result<(), RuntimeError> {
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        broker.wait_idle().await;
        shutdown.cancel();
    });
    result
}

/// What an outage did: dead letters, processed deliveries, trips, and whether the switch said
/// why it was paused during the outage.
#[derive(Debug)]
struct Aftermath {
    dead_lettered: usize,
    processed: u64,
    trips: u64,
    paused_why: Option<String>,
}

/// 300 orders at concurrency 8; after 100 are processed every transaction fails with a revoked
/// grant for `outage`, then the grant is back. Transient failures are abandoned at once (no
/// hold), so only the kill switch stands between the outage and the dead-letter queue.
async fn revoked_grant(mut config: RuntimeConfig, outage: Duration) -> Aftermath {
    let broker = broker_with(300);
    let store = sqlite_store("circuit", 1).await;
    let down = Arc::new(AtomicBool::new(false));
    let handler = Revoked {
        inner: Noop::new(),
        down: down.clone(),
    };
    config.transient_hold_max = Duration::ZERO;
    let runtime: Runtime<MemoryReceiver, SqliteStore, _> =
        Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    let (stats, circuit) = (runtime.stats(), runtime.circuit());
    let shutdown = CancellationToken::new();
    let (result, paused_why) = tokio::join!(runtime.run(shutdown.clone()), async {
        while stats.snapshot().processed < 100 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        down.store(true, Ordering::SeqCst);
        tokio::time::sleep(outage / 2).await;
        let paused_why = circuit.problem();
        tokio::time::sleep(outage / 2).await;
        down.store(false, Ordering::SeqCst);
        broker.wait_idle().await;
        shutdown.cancel();
        paused_why
    });
    result.unwrap();
    Aftermath {
        dead_lettered: broker.dead_letters().len(),
        processed: stats.snapshot().processed,
        trips: circuit.trips().0,
        paused_why,
    }
}

/// Must show 1 at the runtime level: a revoked grant for 20 s, 120 s and 600 s with the backlog
/// queued dead-letters nothing; every order is processed once afterwards, and while paused the
/// switch says why (`/readyz` shows this text).
#[tokio::test(start_paused = true)]
async fn a_revoked_grant_pauses_the_consumer_instead_of_dead_lettering_the_backlog() {
    for outage in [20, 120, 600].map(Duration::from_secs) {
        let after = revoked_grant(config("circuit"), outage).await;
        assert_eq!(after.dead_lettered, 0, "{outage:?}: {after:?}");
        assert_eq!(after.processed, 300, "{outage:?}: {after:?}");
        assert!(after.trips >= 1, "{outage:?}: {after:?}");
        let why = after.paused_why.expect("paused mid-outage");
        assert!(
            why.contains("systemic store failures in a row")
                && why.contains("deployment (code 42501)"),
            "{why}"
        );
    }
}

/// The same with batches of 16.
#[tokio::test(start_paused = true)]
async fn a_revoked_grant_pauses_a_batched_consumer_too() {
    let after = revoked_grant(batched("circuit", 16), Duration::from_secs(20)).await;
    assert_eq!(after.dead_lettered, 0, "{after:?}");
    assert_eq!(after.processed, 300, "{after:?}");
    assert!(after.trips >= 1, "{after:?}");
}

/// The before: with the switch off the same 20 s dead-letters the backlog (each delivery
/// abandoned and redelivered at once spends its 10 attempts within the outage).
#[tokio::test(start_paused = true)]
async fn without_the_switch_the_same_outage_dead_letters_the_backlog() {
    let mut off = config("circuit");
    off.circuit.enabled = false;
    let after = revoked_grant(off, Duration::from_secs(20)).await;
    assert!(after.dead_lettered >= 150, "{after:?}");
    assert_eq!(after.trips, 0);
    assert_eq!(after.paused_why, None);
}

/// A trial that fails with the store is released, not abandoned: over a 600 s outage some 25
/// probes each let the one queued message in as the trial (Service Bus and the emulator hand the
/// head of the queue back first), which would spend its max delivery count many times over.
#[tokio::test(start_paused = true)]
async fn trials_during_a_long_outage_do_not_spend_the_messages_deliveries() {
    let broker = broker_with(1);
    let (down, runtime) = revoked_runtime(&broker).await;
    let (result, ()) = tokio::join!(run_until_idle(&runtime, &broker), async {
        tokio::time::sleep(Duration::from_secs(600)).await;
        down.store(false, Ordering::SeqCst);
    });
    result.unwrap();
    assert_eq!(broker.dead_letters(), []);
    assert_eq!(runtime.stats().snapshot().processed, 1);
    let counts = broker.counts();
    assert!(counts.released >= 15, "{counts:?}");
    // Four failures before the trip count; the fifth trips the switch and is released.
    assert_eq!(counts.abandoned, 4, "{counts:?}");
}

/// Unit-level trip and resume: five systemic failures in a row open the switch; a probe that
/// passes lets one trial in, and its success closes it.
#[tokio::test(start_paused = true)]
async fn the_switch_trips_after_five_in_a_row_and_resumes_after_a_passing_trial() {
    let broker = broker_with(1);
    let (down, runtime) = revoked_runtime(&broker).await;
    let circuit = runtime.circuit();
    for _ in 0..4 {
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(report.outcome, Outcome::Transient);
        assert_eq!(circuit.phase(), CircuitPhase::Closed);
    }
    runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(circuit.phase(), CircuitPhase::Open);
    assert_eq!(circuit.trips(), (1, Duration::ZERO));
    let started = Instant::now();
    down.store(false, Ordering::SeqCst);
    run_until_idle(&runtime, &broker).await.unwrap();
    assert_eq!(circuit.phase(), CircuitPhase::Closed);
    assert_eq!(runtime.stats().snapshot().processed, 1);
    let (trips, paused) = circuit.trips();
    assert_eq!(trips, 1);
    // The first probe comes after half to all of `probe_min` (1 s).
    assert!(paused >= Duration::from_millis(500), "{paused:?}");
    assert!(
        started.elapsed() <= Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

/// Must show 2 at the runtime level: a handler that panics on one message. It is abandoned
/// twice, then dead-lettered `HandlerPanicked` on its third delivery (`max_panics` 3); the 19
/// others are processed by the same two slots.
#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_dead_lettered_handler_panicked_and_the_slots_survive() {
    let broker = broker_with(20);
    let store = sqlite_store("circuit", 1).await;
    let handler = PanicsOn {
        inner: Noop::new(),
        poison: "m-3",
    };
    let mut config = config("circuit");
    config.concurrency = 2;
    let runtime = Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    tokio::time::timeout(Duration::from_secs(600), run_until_idle(&runtime, &broker))
        .await
        .expect("the queue drains: the panicking message does not loop")
        .unwrap();
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("m-3"));
    assert_eq!(dead[0].reason, "HandlerPanicked");
    assert!(
        dead[0].description.contains("stock for m-3 went negative"),
        "{}",
        dead[0].description
    );
    let stats = runtime.stats().snapshot();
    assert_eq!((stats.processed, stats.panicked), (19, 2), "{stats:?}");
    assert_eq!(runtime.slots().stuck(), 0);
}

/// A panicking member of a batch is rolled back alone: the other 15 commit.
#[tokio::test(start_paused = true)]
async fn a_panicking_batch_member_is_taken_out_alone() {
    let broker = broker_with(16);
    let store = sqlite_store("circuit", 1).await;
    let handler = PanicsOn {
        inner: Noop::new(),
        poison: "m-7",
    };
    let runtime = Runtime::with_clock(
        broker.receiver(),
        store,
        handler,
        batched("circuit", 16),
        Clock::new(),
    );
    let reports = runtime.process_batch(ready_deliveries(&broker)).await;
    let outcomes: Vec<Outcome> = reports.iter().map(|r| r.outcome).collect();
    for (i, outcome) in outcomes.iter().enumerate() {
        let expected = if i == 7 {
            Outcome::HandlerPanicked
        } else {
            Outcome::Processed
        };
        assert_eq!(*outcome, expected, "member {i}: {outcomes:?}");
    }
}

/// Must show item 2: a dependency that fails fast on every delivery. Without the hold its 10
/// deliveries are spent at once; with it they span at least 16 s (250 ms doubling to 5 s,
/// jittered down to half), while the lock is kept.
#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_held_before_its_abandon() {
    let mut spans = Vec::new();
    for hold in [Duration::ZERO, Duration::from_secs(5)] {
        let broker = broker_with(1);
        let store = sqlite_store("circuit", 1).await;
        let mut config = config("circuit");
        config.transient_hold_max = hold;
        let runtime = Runtime::with_clock(
            broker.receiver(),
            store,
            Down { inner: Noop::new() },
            config,
            Clock::new(),
        );
        let started = Instant::now();
        run_until_idle(&runtime, &broker).await.unwrap();
        let dead = broker.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].reason, "MaxDeliveryCountExceeded");
        assert_eq!(broker.counts().expired, 0, "no lock ran out while held");
        spans.push(started.elapsed());
    }
    assert!(spans[0] < Duration::from_millis(100), "{spans:?}");
    assert!(spans[1] >= Duration::from_secs(16), "{spans:?}");
}

/// Fails every message with `error` while `down` is set; otherwise runs the inner handler.
#[derive(Debug)]
struct FailsWith<H> {
    inner: H,
    down: Arc<AtomicBool>,
    error: StoreError,
}

wrapper_handler!(FailsWith, inner, |self, ctx, tx| {
    if self.down.load(Ordering::SeqCst) {
        return Err(HandlerError::Store(self.error.clone()));
    }
    self.inner.handle(ctx, tx).await
});

/// The error PostgreSQL gives a statement that waited past `lock_timeout` for a migration's
/// `ACCESS EXCLUSIVE` lock, classified as the store classifies it.
fn lock_timeout() -> StoreError {
    StoreError::new(
        ErrorKind::TimedOut,
        Some("55P03".into()),
        None,
        "canceling statement due to lock timeout",
    )
}

/// A runtime over `broker` whose handler fails with `error` while the returned flag is set (as
/// it is to begin with), no transient hold.
async fn failing_runtime(
    broker: &MemoryBroker,
    error: StoreError,
    mut config: RuntimeConfig,
) -> (
    Arc<AtomicBool>,
    Runtime<MemoryReceiver, SqliteStore, FailsWith<Noop>>,
) {
    let store = sqlite_store("circuit", 1).await;
    let down = Arc::new(AtomicBool::new(true));
    let handler = FailsWith {
        inner: Noop::new(),
        down: down.clone(),
        error,
    };
    config.transient_hold_max = Duration::ZERO;
    let runtime = Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    (down, runtime)
}

/// Issue 40, M1: with delayed retries on (5 retries, 1 s to 10 s), a 600 s outage on a quiet
/// queue. Each trial the probe lets in fails while the switch is open: released, its retry not
/// spent. Before, every trial scheduled a copy, and the message was dead-lettered
/// `RetriesExhausted` within minutes.
#[tokio::test(start_paused = true)]
async fn delayed_retries_are_not_spent_while_the_switch_is_open() {
    let broker = broker_with(1);
    let policy =
        sb_inbox::runtime::RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(10))
            .unwrap();
    let mut config = config("circuit");
    config.delayed_retry = Some(sb_inbox::runtime::DelayedRetry::new(
        policy,
        broker.clone(),
        "q",
    ));
    let (down, runtime) = failing_runtime(&broker, revoked_grant_error(), config).await;
    let (result, ()) = tokio::join!(run_until_idle(&runtime, &broker), async {
        tokio::time::sleep(Duration::from_secs(600)).await;
        down.store(false, Ordering::SeqCst);
    });
    result.unwrap();
    assert_eq!(broker.dead_letters(), []);
    assert_eq!(runtime.stats().snapshot().processed, 1);
    let counts = broker.counts();
    assert!(counts.released >= 15, "{counts:?}");
    // The message itself and no copy: the failures before the trip are systemic too.
    assert_eq!(counts.sent, 1, "{counts:?}");
}

/// Issue 40, M1 (the rest; issue 41's seed 340): a systemic store failure while the switch is
/// still closed (before it trips) is the store's, not the message's: the delivery is given
/// back (held, then abandoned) and no delayed retry is spent on it. Before, each failure before
/// the trip scheduled a copy, so a flapping outage (tripping, closing, failing again) spent the
/// retries of a healthy message until it was dead-lettered `RetriesExhausted`.
#[tokio::test(start_paused = true)]
async fn a_systemic_failure_before_the_trip_does_not_spend_a_delayed_retry() {
    let unavailable = StoreError::new(
        ErrorKind::Unavailable,
        Some("57P03".into()),
        None,
        "the database system is starting up",
    );
    for error in [revoked_grant_error(), unavailable] {
        let broker = broker_with(1);
        let policy =
            sb_inbox::runtime::RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(10))
                .unwrap();
        let mut config = config("circuit");
        config.delayed_retry = Some(sb_inbox::runtime::DelayedRetry::new(
            policy,
            broker.clone(),
            "q",
        ));
        let (_down, runtime) = failing_runtime(&broker, error.clone(), config).await;
        let report = runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(runtime.circuit().phase(), CircuitPhase::Closed, "{error}");
        assert_eq!(report.outcome, Outcome::Transient, "{error}");
        assert_eq!(report.retry, None, "{error}: {report:?}");
        assert_eq!(report.settled, Some(Ok(())), "{error}");
        let counts = broker.counts();
        assert_eq!(
            (counts.sent, counts.abandoned, counts.completed),
            (1, 1, 0),
            "{error}: no copy sent, the original given back: {counts:?}"
        );
    }
}

fn revoked_grant_error() -> StoreError {
    StoreError::new(
        ErrorKind::Deployment,
        Some("42501".into()),
        None,
        "permission denied for table inventory_reservation",
    )
}

/// Issue 40, minor 10: a handler that panics on every delivery under delayed retries is
/// abandoned (counted on the same message), never retried as a copy whose delivery count starts
/// again: dead-lettered `HandlerPanicked` after `max_panics`, not `RetriesExhausted`.
#[tokio::test(start_paused = true)]
async fn a_panic_under_delayed_retries_still_counts_towards_max_panics() {
    let broker = broker_with(1);
    let store = sqlite_store("circuit", 1).await;
    let policy =
        sb_inbox::runtime::RetryPolicy::new(5, Duration::from_secs(1), Duration::from_secs(10))
            .unwrap();
    let mut config = config("circuit");
    config.delayed_retry = Some(sb_inbox::runtime::DelayedRetry::new(
        policy,
        broker.clone(),
        "q",
    ));
    let handler = PanicsOn {
        inner: Noop::new(),
        poison: "m-0",
    };
    let runtime = Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    tokio::time::timeout(Duration::from_secs(600), run_until_idle(&runtime, &broker))
        .await
        .unwrap()
        .unwrap();
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].reason, "HandlerPanicked");
    assert_eq!(dead[0].delivery_count, 2, "on its third delivery");
    assert_eq!(broker.counts().sent, 1, "the message, and no retry copy");
    assert_eq!(runtime.stats().snapshot().panicked, 2);
}

/// Issue 40, M2: a migration holds a table lock for 10 minutes, and every transaction waits out
/// its `lock_timeout` (55P03). A run of timeouts trips the switch; the backlog is released, not
/// abandoned until the broker dead-letters it. Before, each timeout counted as a working store
/// (contention): the switch never tripped, and 300 orders at max delivery count 10 were
/// dead-lettered `MaxDeliveryCountExceeded`.
#[tokio::test(start_paused = true)]
async fn a_run_of_lock_timeouts_trips_the_switch_instead_of_dead_lettering_the_backlog() {
    let broker = broker_with(300);
    let (down, runtime) = failing_runtime(&broker, lock_timeout(), config("circuit")).await;
    let circuit = runtime.circuit();
    let (result, paused_why) = tokio::join!(run_until_idle(&runtime, &broker), async {
        tokio::time::sleep(Duration::from_secs(300)).await;
        let paused_why = circuit.problem();
        tokio::time::sleep(Duration::from_secs(300)).await;
        down.store(false, Ordering::SeqCst);
        paused_why
    });
    result.unwrap();
    assert_eq!(broker.dead_letters().len(), 0);
    assert_eq!(runtime.stats().snapshot().processed, 300);
    assert!(circuit.trips().0 >= 1);
    let why = paused_why.expect("paused mid-outage");
    assert!(why.contains("timed_out (code 55P03)"), "{why}");
}

/// Fails each delivery with the next error of `errors`.
#[derive(Debug)]
struct InTurn<H> {
    inner: H,
    errors: std::sync::Mutex<std::collections::VecDeque<StoreError>>,
}

wrapper_handler!(InTurn, inner, |self, ctx, tx| {
    let next = self.errors.lock().unwrap().pop_front();
    match next {
        Some(error) => Err(HandlerError::Store(error)),
        None => self.inner.handle(ctx, tx).await,
    }
});

/// Issue 40, M2: contention and unknown errors say nothing about the store: they neither trip
/// the switch nor reset the systemic failures in a row, so a systemic outage interleaved with
/// deadlocks and internal errors still trips it at the fifth systemic failure.
#[tokio::test(start_paused = true)]
async fn contention_and_unknown_errors_do_not_reset_the_failures_in_a_row() {
    let broker = broker_with(10);
    let deadlock = StoreError::new(
        ErrorKind::Contention,
        Some("40P01".into()),
        None,
        "deadlock",
    );
    let unknown = StoreError::new(ErrorKind::Unknown, Some("XX000".into()), None, "internal");
    let revoked = revoked_grant_error();
    let errors = [
        &revoked, &deadlock, &revoked, &unknown, &revoked, &deadlock, &revoked, &unknown, &revoked,
    ];
    let handler = InTurn {
        inner: Noop::new(),
        errors: std::sync::Mutex::new(errors.into_iter().cloned().collect()),
    };
    let store = sqlite_store("circuit", 1).await;
    let mut config = config("circuit");
    config.transient_hold_max = Duration::ZERO;
    let runtime = Runtime::with_clock(broker.receiver(), store, handler, config, Clock::new());
    let circuit = runtime.circuit();
    for _ in 0..8 {
        runtime.process(broker.try_receive().unwrap()).await;
        assert_eq!(circuit.phase(), CircuitPhase::Closed);
    }
    runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(circuit.phase(), CircuitPhase::Open);
    assert_eq!(circuit.trips().0, 1);
}

/// Trips `runtime`'s switch with five revoked-grant failures of deliveries from a broker of
/// their own (so `runtime`'s broker keeps only what the test put there).
async fn trip<H: Handler<SqliteTx>>(runtime: &Runtime<MemoryReceiver, SqliteStore, H>) {
    let elsewhere = broker_with(5);
    for _ in 0..5 {
        runtime.process(elsewhere.try_receive().unwrap()).await;
    }
    assert_eq!(runtime.circuit().phase(), CircuitPhase::Open);
}

/// Issue 40, minor 1: after the outage ends on an idle entity (no message to be the trial) the
/// switch closes once a probe passes again, so `/readyz` does not stay "paused". Before, it
/// stayed half-open until a message arrived.
#[tokio::test(start_paused = true)]
async fn half_open_ends_on_an_idle_entity() {
    let broker = broker_with(0);
    let (down, runtime) = failing_runtime(&broker, revoked_grant_error(), config("circuit")).await;
    trip(&runtime).await;
    down.store(false, Ordering::SeqCst);
    let circuit = runtime.circuit();
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        tokio::time::sleep(Duration::from_secs(120)).await;
        shutdown.cancel();
    });
    result.unwrap();
    assert_eq!(circuit.phase(), CircuitPhase::Closed);
    assert_eq!(circuit.problem(), None);
}

/// Issue 40, minor 6: a switch tripped through `Runtime::process` is probed too. Before, only
/// `run` probed, so it stayed open for good and every later failure was released uncounted.
#[tokio::test(start_paused = true)]
async fn a_switch_tripped_by_process_calls_is_probed() {
    let broker = broker_with(0);
    let (down, runtime) = failing_runtime(&broker, revoked_grant_error(), config("circuit")).await;
    trip(&runtime).await;
    down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(120)).await;
    assert_ne!(runtime.circuit().phase(), CircuitPhase::Open);
}

/// Issue 40, minor 2: a trial that never reaches the store (a contract nobody here takes,
/// dead-lettered before any transaction) proves nothing: the next delivery is the trial, and
/// its failure keeps the same pause. Before, the refused trial closed the switch, the next
/// delivery's failure tripped it again (a second trip), and each probe let a burst in.
#[tokio::test(start_paused = true)]
async fn a_trial_that_never_reached_the_store_does_not_close_the_switch() {
    let broker = broker_with(0);
    broker.send(sb_inbox::Message::new(
        "m-x",
        "billing.invoice-sent.v1",
        "{}",
    ));
    broker.send(two_line_order("m-1", "o-1"));
    let (down, runtime) = failing_runtime(&broker, revoked_grant_error(), config("circuit")).await;
    trip(&runtime).await;
    let circuit = runtime.circuit();
    let (result, ()) = tokio::join!(run_until_idle(&runtime, &broker), async {
        tokio::time::sleep(Duration::from_secs(60)).await;
        down.store(false, Ordering::SeqCst);
    });
    result.unwrap();
    assert_eq!(circuit.trips().0, 1, "one pause, however many trials");
    assert_eq!(runtime.stats().snapshot().processed, 1);
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].reason, "UnsupportedContract");
}

/// Issue 40, minor 4: the transient hold reckons the lock on the keeper's monotonic clock. A
/// host 60 s ahead of the broker sees every fresh 30 s lock as expired on its wall clock; the
/// hold is still spent (before, it was zero there, and a flapping dependency spent a message's
/// ten deliveries at once).
#[tokio::test(start_paused = true)]
async fn the_transient_hold_does_not_read_the_hosts_wall_clock() {
    let broker_clock = Clock::starting_at(std::time::SystemTime::now() - Duration::from_secs(60));
    let broker = MemoryBroker::with_options(broker_clock, Duration::from_secs(30), MAX_DELIVERIES);
    broker.send(two_line_order("m-1", "o-1"));
    let store = sqlite_store("circuit", 1).await;
    let mut config = config("circuit");
    config.transient_hold_max = Duration::from_secs(5);
    let runtime = Runtime::with_clock(
        broker.receiver(),
        store,
        Down { inner: Noop::new() },
        config,
        Clock::new(),
    );
    let started = Instant::now();
    run_until_idle(&runtime, &broker).await.unwrap();
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].reason, "MaxDeliveryCountExceeded");
    assert!(
        started.elapsed() >= Duration::from_secs(16),
        "{:?}",
        started.elapsed()
    );
}

/// A receiver on a [`MemoryBroker`] that records which receive the runtime asked for:
/// `"window"` ([`sb_inbox::Receiver::receive`]) or `"one"` (`receive_one`).
#[derive(Debug)]
struct Recording {
    inner: MemoryReceiver,
    calls: Arc<std::sync::Mutex<Vec<&'static str>>>,
}

impl sb_inbox::Receiver for Recording {
    type Delivery = sb_inbox::testing::MemoryDelivery;

    async fn receive(
        &self,
    ) -> Result<Option<sb_inbox::testing::MemoryDelivery>, sb_inbox::ReceiveError> {
        self.calls.lock().unwrap().push("window");
        self.inner.receive().await
    }

    async fn receive_one(
        &self,
    ) -> Result<Option<sb_inbox::testing::MemoryDelivery>, sb_inbox::ReceiveError> {
        self.calls.lock().unwrap().push("one");
        self.inner.receive().await
    }
}

/// Issue 40, minor 3: half-open asks the receiver for the one trial delivery
/// (`Receiver::receive_one`: one credit on Service Bus), not a full window whose rest the
/// broker would lock only for the runtime to release it. After the trial closes the switch,
/// receives ask for the window again. Before, every receive asked for the window.
#[tokio::test(start_paused = true)]
async fn half_open_asks_the_receiver_for_one_delivery() {
    let broker = broker_with(3);
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let receiver = Recording {
        inner: broker.receiver(),
        calls: calls.clone(),
    };
    let down = Arc::new(AtomicBool::new(true));
    let handler = FailsWith {
        inner: Noop::new(),
        down: down.clone(),
        error: revoked_grant_error(),
    };
    let mut config = config("circuit");
    config.transient_hold_max = Duration::ZERO;
    let store = sqlite_store("circuit", 1).await;
    let runtime = Runtime::with_clock(receiver, store, handler, config, Clock::new());
    let elsewhere = broker_with(5);
    for _ in 0..5 {
        runtime.process(elsewhere.try_receive().unwrap()).await;
    }
    assert_eq!(runtime.circuit().phase(), CircuitPhase::Open);
    down.store(false, Ordering::SeqCst);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        broker.wait_idle().await;
        shutdown.cancel();
    });
    result.unwrap();
    assert_eq!(runtime.stats().snapshot().processed, 3);
    assert_eq!(runtime.circuit().phase(), CircuitPhase::Closed);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.first(), Some(&"one"), "{calls:?}");
    assert_eq!(
        calls.iter().filter(|c| **c == "one").count(),
        1,
        "{calls:?}"
    );
    assert!(calls.len() >= 4, "{calls:?}");
}
