//! The runtime: receive, keep the lock, run one transaction, settle after commit.
//!
//! # Layout
//! - [`Runtime`] pulls deliveries from a [`Receiver`] with bounded prefetch and concurrency and
//!   drains in-flight work on shutdown.
//! - `process` runs the algorithm for one delivery and returns a [`Report`].
//! - [`LockKeeper`] renews each lock in parallel with its handler and fences the commit.
//! - [`Handler`] is what a user implements; [`Outcome`] is what happened. [`JsonHandler`] (with
//!   [`JsonContract`] on the message type, wrapped in [`Json`]) is the typed way for JSON bodies.
//! - [`IdempotencyKey`]: the key a handler sends to a downstream API, the same on every
//!   delivery of one logical message.
//! - [`DelayedRetry`] with a [`RetryPolicy`]: transient failures scheduled for later instead of
//!   abandoned, keeping the logical message id ([`LOGICAL_ID_PROPERTY`]).
//!
//! The runtime sees only [`crate::ports`]: no SQL dialect, no AMQP frame.

mod backoff;
mod clock;
mod consumer;
mod envelope;
mod handler;
mod idempotency;
mod json;
mod lock_keeper;
mod observe;
mod outcome;
mod process;
mod retry;
mod stats;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use backoff::Backoff;
pub use clock::Clock;
pub use consumer::{ConsumerName, ConsumerNameError, MAX_CONSUMER_NAME_LEN};
pub(crate) use envelope::truncate;
pub use envelope::{
    Contract, ContractParseError, DeadLetterReason, LOGICAL_ID_PROPERTY, MAX_DESCRIPTION_LEN,
    MAX_MESSAGE_ID_LEN, Rejection,
};
pub(crate) use envelope::{derived_message_id, logical_id};
pub use handler::{Context, DecodeError, Handled, Handler, HandlerError};
pub use idempotency::IdempotencyKey;
pub use json::{Json, JsonContract, JsonHandler, decode_json};
pub use lock_keeper::{KeptLock, LockKeeper};
pub use outcome::{Outcome, Settlement};
pub use process::{LAST_ERROR_PROPERTY, Report};
pub use retry::{
    DEFAULT_JITTER, DelayedRetry, InvalidRetryPolicy, JitterSource, RETRY_ATTEMPT_PROPERTY,
    RetryPolicy, ScheduledRetry,
};
pub use stats::{Stats, StatsSnapshot};

use crate::ports::{ReceiveError, Receiver, Store};

/// How a [`Runtime`] runs.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// The consumer name: half of the inbox key.
    pub consumer: ConsumerName,
    /// Deliveries handled at once.
    pub concurrency: usize,
    /// Deliveries received ahead of a free handler slot. Their locks are kept from receipt.
    pub prefetch: usize,
    /// Renew each lock this long before it runs out.
    pub lock_margin: Duration,
    /// On shutdown, how long in-flight deliveries may run before they are rolled back and
    /// abandoned.
    pub shutdown_grace: Duration,
    /// Transient failures: `None` abandons them (the broker redelivers at once, and its max
    /// delivery count bounds the attempts); `Some` schedules a copy for later and completes the
    /// original, then dead-letters with `RetriesExhausted` after the policy's retries.
    pub delayed_retry: Option<DelayedRetry>,
}

impl RuntimeConfig {
    /// Defaults: concurrency 8, prefetch 0, margin 10 s, grace 30 s, no delayed retries.
    pub fn new(consumer: ConsumerName) -> Self {
        RuntimeConfig {
            consumer,
            concurrency: 8,
            prefetch: 0,
            lock_margin: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(30),
            delayed_retry: None,
        }
    }
}

/// Why a runtime stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The receiver failed for good.
    #[error("receiver failed: {0}")]
    Receive(#[from] ReceiveError),
    /// The configuration is unusable.
    #[error("invalid runtime configuration: {0}")]
    Config(&'static str),
}

/// The inbox runtime: one consumer over one receiver and one store.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example<R, S, H>(receiver: R, store: S, handler: H) -> Result<(), sb_inbox::RuntimeError>
/// # where R: sb_inbox::Receiver, S: sb_inbox::Store, H: sb_inbox::Handler<S::Tx> {
/// use sb_inbox::{ConsumerName, Runtime, RuntimeConfig};
/// let config = RuntimeConfig::new(ConsumerName::new("inventory.order-placed.v1").expect("valid"));
/// let runtime = Runtime::new(receiver, store, handler, config);
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// runtime.run(shutdown).await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Runtime<R, S, H> {
    inner: Arc<Inner<R, S, H>>,
}

#[derive(Debug)]
struct Inner<R, S, H> {
    receiver: R,
    store: S,
    handler: H,
    config: RuntimeConfig,
    clock: Clock,
    stats: Arc<Stats>,
    observer: observe::Observer,
}

impl<R, S, H> Runtime<R, S, H>
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
{
    /// A runtime on the real clock.
    pub fn new(receiver: R, store: S, handler: H, config: RuntimeConfig) -> Self {
        Runtime::with_clock(receiver, store, handler, config, Clock::new())
    }

    /// A runtime on a given clock (tests pass one anchored under tokio's paused time).
    pub fn with_clock(
        receiver: R,
        store: S,
        handler: H,
        config: RuntimeConfig,
        clock: Clock,
    ) -> Self {
        let observer = observe::Observer::new(receiver.source(), &config.consumer, clock);
        Runtime {
            inner: Arc::new(Inner {
                observer,
                receiver,
                store,
                handler,
                config,
                clock,
                stats: Arc::new(Stats::default()),
            }),
        }
    }

    /// Counters of outcomes, settlements and renewals, shared with the running runtime.
    pub fn stats(&self) -> Arc<Stats> {
        self.inner.stats.clone()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler
    }

    /// Handles one delivery now, outside the receive loop, and records it in [`Runtime::stats`].
    pub async fn process<D: crate::ports::Delivery>(&self, delivery: D) -> Report {
        let report = self
            .inner
            .step()
            .run(Arc::new(delivery), &CancellationToken::new())
            .await;
        self.inner.stats.record(&report);
        report
    }

    /// Receives and handles deliveries until `shutdown` is cancelled or the receiver closes,
    /// then drains: in-flight deliveries get [`RuntimeConfig::shutdown_grace`] to finish; the
    /// rest are rolled back and abandoned.
    ///
    /// # Errors
    /// [`RuntimeError::Receive`] when the receiver fails for good (after draining);
    /// [`RuntimeError::Config`] for zero concurrency.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RuntimeError> {
        let config = &self.inner.config;
        if config.concurrency == 0 {
            return Err(RuntimeError::Config("concurrency must be at least 1"));
        }
        let held = Arc::new(Semaphore::new(config.concurrency + config.prefetch));
        let handling = Arc::new(Semaphore::new(config.concurrency));
        let tracker = TaskTracker::new();
        let abort = CancellationToken::new();
        // Jittered, so that workers cut off by one outage do not all reconnect at once.
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));
        let result = loop {
            let slot = tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                slot = held.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => break Ok(()),
                },
            };
            let received = tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                received = self.inner.receiver.receive() => received,
            };
            let delivery = match received {
                Ok(Some(delivery)) => {
                    backoff.reset();
                    delivery
                }
                Ok(None) => break Ok(()),
                Err(ReceiveError::Transient(error)) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(%error, ?delay, "Receive failed; retrying.");
                    tokio::select! {
                        () = shutdown.cancelled() => break Ok(()),
                        () = tokio::time::sleep(delay) => {}
                    }
                    continue;
                }
                Err(error) => break Err(RuntimeError::Receive(error)),
            };
            let inner = self.inner.clone();
            let handling = handling.clone();
            let abort = abort.clone();
            tracker.spawn(async move {
                let delivery = Arc::new(delivery);
                let report = {
                    // Closed only when the runtime is dropped mid-run; the delivery then rolls
                    // back through the abort token below.
                    let _permit = handling.acquire_owned().await;
                    inner.step().run(delivery, &abort).await
                };
                inner.stats.record(&report);
                drop(slot);
            });
        };
        tracker.close();
        if tokio::time::timeout(config.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                in_flight = tracker.len(),
                "Shutdown grace elapsed; abandoning in-flight deliveries."
            );
            abort.cancel();
            tracker.wait().await;
        }
        result
    }
}

impl<R, S, H> Inner<R, S, H>
where
    S: Store,
    H: Handler<S::Tx>,
{
    fn step(&self) -> process::Step<'_, S, H> {
        process::Step {
            store: &self.store,
            handler: &self.handler,
            consumer: &self.config.consumer,
            keeper: LockKeeper::new(self.config.lock_margin, self.clock)
                .metered(self.observer.renewal_meter()),
            observer: &self.observer,
            retry: self.config.delayed_retry.as_ref(),
            clock: self.clock,
        }
    }
}
