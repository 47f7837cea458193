//! Bounded concurrency and prefetch.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, Context, Contract, DecodeError, Handled, Handler, HandlerError, Runtime, Tx,
};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::support::handlers::Noop;
use crate::support::orders::two_line_order;
use crate::support::runtime::config;
use crate::support::sqlite_store;

/// Counts handlers running at once and holds each until the test releases a permit.
#[derive(Debug)]
struct Held {
    inner: Noop,
    running: AtomicUsize,
    peak: AtomicUsize,
    entered: Notify,
    release: Semaphore,
}

/// The handler side of [`Held`].
#[derive(Debug)]
struct HeldHandler(Arc<Held>);

impl<T: Tx> Handler<T> for HeldHandler {
    type Payload = ();

    fn contracts(&self) -> &[Contract] {
        <Noop as Handler<T>>::contracts(&self.0.inner)
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<(), DecodeError> {
        <Noop as Handler<T>>::decode(&self.0.inner, contract, body)
    }

    async fn handle(&self, _: &Context<'_, ()>, _: &mut T) -> Result<Handled, HandlerError> {
        let held = &self.0;
        let now = held.running.fetch_add(1, Ordering::SeqCst) + 1;
        held.peak.fetch_max(now, Ordering::SeqCst);
        held.entered.notify_one();
        held.release.acquire().await.expect("open").forget();
        held.running.fetch_sub(1, Ordering::SeqCst);
        Ok(Handled::Processed)
    }
}

/// The runtime holds at most `concurrency + prefetch` deliveries and handles `concurrency`.
/// A PostgreSQL store lets handlers overlap (SQLite would serialise them on its one writer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_and_prefetch_are_bounded() {
    let store = crate::support::pg_store("rt_limits", 4).await;
    let broker = MemoryBroker::new(Clock::new());
    for i in 0..6 {
        broker.send(two_line_order(&format!("m-{i}"), &format!("o-{i}")));
    }
    let held = Arc::new(Held {
        inner: Noop::new(),
        running: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        entered: Notify::new(),
        release: Semaphore::new(0),
    });
    let mut config = config("limits");
    config.concurrency = 2;
    config.prefetch = 1;
    let runtime = Runtime::new(broker.receiver(), store, HeldHandler(held.clone()), config);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        held.entered.notified().await;
        while held.running.load(Ordering::SeqCst) < 2 {
            held.entered.notified().await;
        }
        // Two handlers run; one more delivery is prefetched and waits; the rest stay queued.
        let counts = broker.counts();
        assert_eq!((counts.locked, counts.ready), (3, 3), "{counts:?}");
        held.release.add_permits(6);
        broker.wait_idle().await;
        shutdown.cancel();
    });
    result.unwrap();
    assert_eq!(held.peak.load(Ordering::SeqCst), 2);
    assert_eq!(broker.counts().completed, 6);
}

#[tokio::test]
async fn zero_concurrency_is_refused() {
    let store = sqlite_store("zero", 1).await;
    let broker = MemoryBroker::new(Clock::new());
    let mut config = config("limits");
    config.concurrency = 0;
    let runtime = Runtime::new(broker.receiver(), store, Noop::new(), config);
    let error = runtime.run(CancellationToken::new()).await.unwrap_err();
    assert!(error.to_string().contains("concurrency"), "{error}");
}

/// A receiver whose first receives fail transiently, recording when each call came.
struct Flaky {
    failures: AtomicUsize,
    calls: Arc<std::sync::Mutex<Vec<tokio::time::Instant>>>,
}

impl sb_inbox::Receiver for Flaky {
    type Delivery = sb_inbox::testing::MemoryDelivery;

    async fn receive(&self) -> Result<Option<Self::Delivery>, sb_inbox::ReceiveError> {
        self.calls.lock().unwrap().push(tokio::time::Instant::now());
        if self.failures.load(Ordering::SeqCst) > 0 {
            self.failures.fetch_sub(1, Ordering::SeqCst);
            return Err(sb_inbox::ReceiveError::Transient("connection reset".into()));
        }
        Ok(None)
    }
}

#[tokio::test(start_paused = true)]
async fn receive_failures_back_off_exponentially_with_jitter() {
    let store = sqlite_store("backoff", 1).await;
    let calls = Arc::default();
    let receiver = Flaky {
        failures: AtomicUsize::new(6),
        calls: Arc::clone(&calls),
    };
    let runtime = Runtime::new(receiver, store, Noop::new(), config("limits"));
    runtime.run(CancellationToken::new()).await.unwrap();
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls.len(), 7, "six failures, then the receiver closes");
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, step_ms) in gaps.iter().zip([100u64, 200, 400, 800, 1600, 3200]) {
        let step = Duration::from_millis(step_ms);
        assert!(
            *gap >= step / 2 && *gap <= step,
            "step {step:?}: waited {gap:?}"
        );
    }
    // Jitter: the waits are not exactly the steps (all six on the upper bound would mean none).
    assert!(
        gaps.iter()
            .zip([100u64, 200, 400, 800, 1600, 3200])
            .any(|(g, s)| *g != Duration::from_millis(s))
    );
}
