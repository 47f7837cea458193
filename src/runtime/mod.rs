//! The runtime: receive, keep the lock, run one transaction, settle after commit.
//!
//! # Layout
//! - [`Runtime`] pulls deliveries from a [`Receiver`] with bounded prefetch and concurrency and
//!   drains in-flight work on shutdown.
//! - `process` runs the algorithm for one delivery and returns a [`Report`].
//! - [`LockKeeper`] renews each lock in parallel with its handler and fences the commit.
//! - [`Handler`] is what a user implements; [`Outcome`] is what happened. [`JsonHandler`] (with
//!   [`JsonContract`] on the message type, wrapped in [`Json`]) is the typed way for JSON bodies.
//! - [`Router`]: several contracts on one consumer, each with its own handler, with upcasters
//!   between versions; [`Layer`] and [`Middleware`] (`layer`): code around a handler or a router.
//! - [`IdempotencyKey`]: the key a handler sends to a downstream API, the same on every
//!   delivery of one logical message.
//! - `batch` runs up to [`RuntimeConfig::batch_size`] deliveries in one transaction, a
//!   savepoint each, reusing `process`'s pieces.
//! - [`DelayedRetry`] with a [`RetryPolicy`]: transient failures scheduled for later instead of
//!   abandoned, keeping the logical message id ([`LOGICAL_ID_PROPERTY`]).
//! - [`Circuit`], the kill switch: deliveries paused while the store fails for every message
//!   alike, resumed once a probe and one trial delivery pass; `transient_hold` keeps a
//!   transient failure's lock for a short backoff before its abandon; `panic` turns a
//!   handler's panic into [`Outcome::HandlerPanicked`].
//!
//! The runtime sees only [`crate::ports`]: no SQL dialect, no AMQP frame. Envelopes (the .NET
//! dialects) are [`crate::envelope`], beside the runtime: it runs their check and a consumer's
//! [`EnvelopeReader`] and names no dialect.

mod backoff;
mod batch;
mod circuit;
mod clock;
#[cfg(feature = "serde")]
mod config_fields;
mod consumer;
mod handler;
mod idempotency;
mod jitter;
mod json;
mod layer;
mod lock_keeper;
mod observe;
mod outcome;
mod panic;
mod phases;
mod process;
mod retry;
mod router;
mod session;
mod slots;
mod stats;
mod store_health;
mod transient_hold;
mod unknown;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The envelope readers and writers, now [`crate::envelope`] (a sibling of the runtime): this
/// path stays for code written against `sb_inbox::runtime::envelope`.
pub use crate::envelope;
pub(crate) use crate::envelope::truncate;
pub use backoff::Backoff;
pub(crate) use backoff::exponential_step;
pub use circuit::{Circuit, CircuitConfig, CircuitPhase, MIN_SAMPLES, PROBE_ID};
pub use clock::Clock;
pub use consumer::{ConsumerName, ConsumerNameError, MAX_CONSUMER_NAME_LEN};
// The envelope's vocabulary, named by every handler and outcome: re-exported here so
// `sb_inbox::runtime::Contract` and friends keep working.
pub use crate::envelope::{
    Contract, ContractParseError, DeadLetterReason, EnvelopeReader, Headers, LOGICAL_ID_PROPERTY,
    MAX_DESCRIPTION_LEN, MAX_MESSAGE_ID_LEN, Opened, Rejection, SubjectVersioned,
};
// Public for tools that copy messages as the runtime does (the application's dead-letter
// resubmission, `ops::dlq` in sb-inbox-cli) and for the test kit's `ContextBuilder`.
pub use crate::envelope::{derived_message_id, logical_id};
pub use handler::{BoxError, Context, DecodeError, Handled, Handler, HandlerError};
pub use idempotency::IdempotencyKey;
pub use jitter::JitterSource;
pub use json::{Json, JsonContract, JsonHandler, decode_json};
pub use layer::{Around, HandlerExt, Layer, Layered, Meta, Middleware, Next, around};
pub use lock_keeper::{KeptLock, LockKeeper};
pub use outcome::{Outcome, Report, Settlement};
#[cfg(test)]
pub(crate) use retry::copy as retry_copy;
pub use retry::{
    DEFAULT_JITTER, DelayedRetry, InvalidRetryPolicy, LAST_ERROR_PROPERTY,
    ORIGINAL_ENQUEUED_TIME_PROPERTY, RESUBMISSION_PROPERTY, RETRY_ATTEMPT_PROPERTY, RetryPolicy,
    ScheduledRetry, original_enqueued_time,
};
pub use router::{Routed, Router, RouterBuilder, RouterError, UpcastError};
pub use session::SessionConfig;
pub use slots::{STUCK_ALLOWANCE, SlotWatch};
pub use stats::{Stats, StatsSnapshot};
pub use store_health::{DEPLOYMENT_WINDOW, StoreHealth};
pub use unknown::{UnknownContracts, UnknownContractsParseError};

use crate::ports::{ReceiveError, Receiver, Store};
use circuit::Slot;

/// How a [`Runtime`] runs: [`RuntimeConfig::new`], then set the fields (new settings are
/// added without breaking callers).
///
/// With the `serde` feature it deserialises from the keys and units of the worker's
/// `[runtime]` section (`consumer`, `concurrency`, `prefetch`, `lock_margin_secs`,
/// `lock_duration_secs`, `max_processing_secs`, `shutdown_grace_secs`, `batch_size`,
/// `batch_linger_ms`, `circuit`, `max_panics`, `transient_hold_max_ms`), absent keys taking
/// the defaults, and is checked by [`RuntimeConfig::validate`]; delayed retries are set in
/// code.
#[derive(Debug, Clone)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(try_from = "config_fields::RuntimeFields")
)]
pub struct RuntimeConfig {
    /// The consumer name: half of the inbox key.
    pub consumer: ConsumerName,
    /// Deliveries handled at once.
    pub concurrency: usize,
    /// Deliveries received ahead of a free handler slot. Their locks are kept from receipt.
    pub prefetch: usize,
    /// Renew each lock this long before it runs out.
    pub lock_margin: Duration,
    /// The entity's lock duration, when known (the `Worker` reads it at start): a margin at
    /// least as long is refused, and no lock is reckoned to last longer, whatever the host's
    /// clock and the message's time in the queue suggest (each lock's expiry still comes from
    /// the broker).
    pub lock_duration: Option<Duration>,
    /// The longest a delivery may be handled, like the SDKs' maximum auto-lock-renewal
    /// duration: past it the handler is cancelled, its transaction rolled back and the delivery
    /// abandoned (or, with delayed retries, retried later). A slot still busy well after it is
    /// reported by [`Runtime::slots`].
    pub max_processing: Duration,
    /// On shutdown, how long in-flight deliveries may run before they are rolled back and
    /// abandoned.
    pub shutdown_grace: Duration,
    /// Transient failures: `None` abandons them (the broker redelivers at once, and its max
    /// delivery count bounds the attempts); `Some` schedules a copy for later and completes the
    /// original, then dead-letters with `RetriesExhausted` after the policy's retries.
    pub delayed_retry: Option<DelayedRetry>,
    /// Deliveries committed in one database transaction, each inside its own savepoint
    /// (`runtime.batch_size`). 1, the default, runs one transaction per delivery. With more,
    /// `concurrency` counts batches in flight and [`RuntimeConfig::max_processing`] bounds a
    /// whole batch; see the `batch` module for what batching trades.
    pub batch_size: usize,
    /// How long a batch waits for more deliveries after its first before it starts with what it
    /// has (`runtime.batch_linger_ms`), and only when it holds the last free handling slot
    /// (every other slot runs a batch); with a slot free it starts at once with what is queued.
    /// It stops waiting early once full or once another slot frees.
    pub batch_linger: Duration,
    /// The kill switch: pause deliveries while the store fails for every message alike
    /// (`runtime.circuit.*`); see [`Circuit`].
    pub circuit: CircuitConfig,
    /// A handler that panics is abandoned (after a short backoff, like a transient failure);
    /// on a delivery numbered this or later it is dead-lettered `HandlerPanicked` instead
    /// (`runtime.max_panics`). Keep it below the entity's max delivery count, or the broker
    /// dead-letters first (`MaxDeliveryCountExceeded`).
    pub max_panics: u32,
    /// Before abandoning a transient failure, the delivery is held (its lock kept) for a short
    /// jittered backoff growing with its delivery count, at most this long and never past its
    /// lock (`runtime.transient_hold_max_ms`); zero abandons at once. So a flapping dependency
    /// spends a message's max delivery count over tens of seconds, not milliseconds.
    pub transient_hold_max: Duration,
    /// How deliveries are read: the contract, the envelope's id, the body and the headers
    /// (`envelope.kind`); [`SubjectVersioned`] by default. See [`envelope`].
    pub envelope: Arc<dyn EnvelopeReader>,
    /// Where the runtime's own jitter comes from (receive and probe backoff, transient holds):
    /// [`JitterSource::random`] by default; tests and simulations pass
    /// [`JitterSource::seeded`] to replay a run. Delayed retries draw from their
    /// [`RetryPolicy`]'s source.
    pub jitter: JitterSource,
    /// A contract name no handler accepts: dead-lettered `UnsupportedContract` (the default)
    /// or completed and counted (`runtime.unknown_contracts`, per consumer
    /// `consumers[].unknown_contracts`); see [`UnknownContracts`].
    pub unknown_contracts: UnknownContracts,
}

impl RuntimeConfig {
    /// Defaults: concurrency 8, prefetch 0, margin 10 s, lock duration unknown, at most 5 min
    /// of processing (the SDKs' default maximum auto-lock-renewal duration), grace 30 s, no
    /// delayed retries, no batching (batch size 1, linger 5 ms when batching), the kill switch
    /// on ([`CircuitConfig::default`]), dead-lettered after panics on 3 deliveries, transient
    /// failures held up to 5 s before their abandon, unknown contracts dead-lettered.
    pub fn new(consumer: ConsumerName) -> Self {
        RuntimeConfig {
            consumer,
            concurrency: 8,
            prefetch: 0,
            lock_margin: Duration::from_secs(10),
            lock_duration: None,
            max_processing: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            delayed_retry: None,
            batch_size: 1,
            batch_linger: DEFAULT_BATCH_LINGER,
            circuit: CircuitConfig::default(),
            max_panics: 3,
            transient_hold_max: DEFAULT_TRANSIENT_HOLD_MAX,
            envelope: Arc::new(SubjectVersioned),
            jitter: JitterSource::random(),
            unknown_contracts: UnknownContracts::DeadLetter,
        }
    }

    /// The same, with [`RuntimeConfig::unknown_contracts`] set.
    #[must_use]
    pub fn with_unknown_contracts(mut self, unknown: UnknownContracts) -> Self {
        self.unknown_contracts = unknown;
        self
    }

    /// The most deliveries the runtime holds at once: those handled (`concurrency`, times
    /// `batch_size` when batching) plus `prefetch` waiting with their locks kept; a delivery
    /// whose transaction ended and whose settlement is under way no longer counts (settlements
    /// in flight are bounded apart, at twice this). A pipelined receiver keeps this many in
    /// flight ([`crate::servicebus::ServiceBusReceiver::with_capacity`]), so that every delivery
    /// the broker sends has a slot waiting for it. A hosted consumer without a `prefetch` sizes
    /// its window itself ([`crate::servicebus::window`]) and holds up to its ceiling.
    pub fn held(&self) -> usize {
        self.concurrency
            .saturating_mul(self.batch_size)
            .saturating_add(self.prefetch)
    }

    /// The longest a handler slot may be busy by design: `max_processing`, twice that when
    /// batching (a batch past its bound runs its undecided members again alone, sharing one
    /// more `max_processing`: `batch/isolate.rs`). The slot watch counts a slot as stuck only
    /// past this.
    pub(crate) fn slot_bound(&self) -> Duration {
        if self.batch_size > 1 {
            self.max_processing.saturating_mul(2)
        } else {
            self.max_processing
        }
    }

    /// Checks the values that cannot work.
    ///
    /// # Errors
    /// [`RuntimeError::Config`] for zero concurrency, a zero maximum processing time, or a lock
    /// margin not shorter than the known lock duration.
    pub fn validate(&self) -> Result<(), RuntimeError> {
        if self.concurrency == 0 {
            return Err(RuntimeError::Config(
                "concurrency must be at least 1".into(),
            ));
        }
        if self.batch_size == 0 {
            return Err(RuntimeError::Config("batch_size must be at least 1".into()));
        }
        if self.max_processing.is_zero() {
            return Err(RuntimeError::Config(
                "max_processing must be longer than zero".into(),
            ));
        }
        if let Some(lock) = self.lock_duration
            && self.lock_margin >= lock
        {
            return Err(RuntimeError::Config(format!(
                "lock margin {:?} must be shorter than the lock duration {lock:?}",
                self.lock_margin
            )));
        }
        Ok(())
    }
}

/// The default [`RuntimeConfig::batch_linger`]: short against a transaction's round trips, long
/// enough for a prefetched burst to fill a batch. Spent only while every other handling slot
/// runs a batch, so it adds no latency to a runtime with room.
pub const DEFAULT_BATCH_LINGER: Duration = Duration::from_millis(5);

/// How often the `sb_inbox::pipeline` debug trace reports the phases.
const PHASE_REPORT_EVERY: Duration = Duration::from_secs(2);

/// The default [`RuntimeConfig::transient_hold_max`].
pub const DEFAULT_TRANSIENT_HOLD_MAX: Duration = Duration::from_secs(5);

/// Why a runtime stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The receiver failed for good.
    #[error("receiver failed: {0}")]
    Receive(#[from] ReceiveError),
    /// The configuration is unusable.
    #[error("invalid runtime configuration: {0}")]
    Config(String),
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
    /// The kill switch's probe for [`Runtime::process`] and [`Runtime::process_batch`], started
    /// by the first call and stopped when the runtime is dropped: a switch they trip must be
    /// probed too, or it stays open for good.
    probing: std::sync::OnceLock<tokio_util::sync::DropGuard>,
}

#[derive(Debug)]
struct Inner<R, S, H> {
    receiver: R,
    store: S,
    handler: H,
    config: RuntimeConfig,
    clock: Clock,
    stats: Arc<Stats>,
    slots: Arc<SlotWatch>,
    observer: observe::Observer,
    health: StoreHealth,
    circuit: Circuit,
    /// One keeper for every delivery: it learns the entity's lock duration from them.
    keeper: LockKeeper,
    /// Where deliveries' time goes (the `sb_inbox::pipeline` debug trace).
    phases: Arc<phases::Phases>,
}

impl<R, S, H> Runtime<R, S, H> {
    /// The runtime's parts over any source of deliveries (plain or sessions).
    fn assemble(
        receiver: R,
        source: crate::ports::Source,
        store: S,
        handler: H,
        config: RuntimeConfig,
        clock: Clock,
    ) -> Self {
        let observer = observe::Observer::new(source, &config.consumer, clock);
        let health = StoreHealth::new(&config.consumer);
        let circuit = Circuit::new(config.circuit.clone(), &config.consumer);
        let keeper = LockKeeper::new(config.lock_margin, clock)
            .knowing(config.lock_duration)
            .metered(observer.renewal_meter());
        Runtime {
            inner: Arc::new(Inner {
                circuit,
                keeper,
                slots: Arc::new(SlotWatch::new(config.slot_bound())),
                observer,
                health,
                receiver,
                store,
                handler,
                config,
                clock,
                stats: Arc::new(Stats::default()),
                phases: Arc::default(),
            }),
            probing: std::sync::OnceLock::new(),
        }
    }

    /// Counters of outcomes, settlements and renewals, shared with the running runtime.
    pub fn stats(&self) -> Arc<Stats> {
        self.inner.stats.clone()
    }

    /// The store's fitness as this runtime's transactions find it (deployment errors), for a
    /// readiness probe.
    pub fn store_health(&self) -> StoreHealth {
        self.inner.health.clone()
    }

    /// The kill switch, shared with the running runtime: [`Circuit::problem`] says why
    /// deliveries are paused, for a readiness probe.
    pub fn circuit(&self) -> Circuit {
        self.inner.circuit.clone()
    }

    /// The busy handler slots, shared with the running runtime: [`SlotWatch::stuck`] is the
    /// readiness signal for slots that cancellation could not free.
    pub fn slots(&self) -> Arc<SlotWatch> {
        self.inner.slots.clone()
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.inner.store
    }

    /// The handler.
    pub fn handler(&self) -> &H {
        &self.inner.handler
    }
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
        let source = receiver.source();
        Runtime::assemble(receiver, source, store, handler, config, clock)
    }

    /// Handles one delivery now, outside the receive loop, and records it in [`Runtime::stats`].
    pub async fn process<D: crate::ports::Delivery>(&self, delivery: D) -> Report {
        self.probing.get_or_init(|| self.inner.probing());
        let processor = self.inner.processor();
        let delivery = Arc::new(delivery);
        let lock = processor.keeper.keep(delivery.clone());
        let report = processor
            .run(delivery, lock, &CancellationToken::new())
            .await;
        self.inner.stats.record(&report);
        report
    }

    /// Handles deliveries now as one batch (one transaction, a savepoint each, as
    /// [`RuntimeConfig::batch_size`] does in [`Runtime::run`]), outside the receive loop, and
    /// records them in [`Runtime::stats`]. The reports are in the order of `deliveries`.
    pub async fn process_batch<D: crate::ports::Delivery>(
        &self,
        deliveries: Vec<D>,
    ) -> Vec<Report> {
        self.probing.get_or_init(|| self.inner.probing());
        let processor = self.inner.processor();
        let members = deliveries
            .into_iter()
            .map(|delivery| {
                let delivery = Arc::new(delivery);
                let lock = processor.keeper.keep(delivery.clone());
                (delivery, lock, ())
            })
            .collect();
        batch::handle(&self.inner, members, &CancellationToken::new(), ()).await
    }

    /// Receives and handles deliveries until `shutdown` is cancelled or the receiver closes,
    /// then drains. Each delivery's lock is kept from receipt, also while it waits for a handler
    /// slot. On shutdown, deliveries not started yet are released (given back without counting
    /// a delivery attempt); in-flight ones get [`RuntimeConfig::shutdown_grace`] to finish, then
    /// are rolled back and abandoned.
    ///
    /// # Errors
    /// [`RuntimeError::Receive`] when the receiver fails for good (after draining);
    /// [`RuntimeError::Config`] when [`RuntimeConfig::validate`] refuses the configuration.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), RuntimeError> {
        let config = &self.inner.config;
        config.validate()?;
        if config.batch_size > 1 {
            return batch::run(&self.inner, shutdown).await;
        }
        let (held, gates) = limits(config, &shutdown);
        let _probing = self.inner.probing();
        let tracker = TaskTracker::new();
        let mut backoff = receive_backoff(&config.jitter);
        let result = loop {
            let (delivery, slot) = match self
                .inner
                .next_delivery(&held, &shutdown, &mut backoff)
                .await
            {
                Ok(Some(next)) => next,
                Ok(None) => break Ok(()),
                Err(error) => break Err(error),
            };
            let received = self.inner.receipt(delivery, slot);
            tracker.spawn(self.inner.clone().handle_received(received, gates.clone()));
        };
        self.inner.drain(&tracker, &gates.abort).await;
        result
    }
}

/// A delivery from receipt to its handler slot.
struct Received<D> {
    delivery: Arc<D>,
    /// Kept from receipt.
    lock: KeptLock,
    /// Its place among what the runtime holds, and its kill-switch ticket.
    slot: Slot,
    at: tokio::time::Instant,
}

/// What a received delivery waits on before its handler runs, and what stops it.
#[derive(Clone)]
struct Gates {
    handling: Arc<Semaphore>,
    settling: Arc<Semaphore>,
    /// Shutdown: nothing new starts.
    stopping: CancellationToken,
    /// The shutdown grace ran out: in-flight work rolls back and abandons.
    abort: CancellationToken,
}

/// Settlements in flight may reach this many times what the runtime holds.
const SETTLING_FACTOR: usize = 2;

/// The receive loop's limits: what the runtime holds; its handler slots and settlements in
/// flight, with the shutdown that stops what waits on them.
fn limits(config: &RuntimeConfig, shutdown: &CancellationToken) -> (Arc<Semaphore>, Gates) {
    let held = Arc::new(Semaphore::new(config.held()));
    // A delivery leaves what the runtime holds once its transaction ended; from its
    // handler slot to its settlement's answer it counts here instead, so that a slow
    // broker cannot pile up settlements (issue 42).
    let settling = Arc::new(Semaphore::new(
        config.held().saturating_mul(SETTLING_FACTOR),
    ));
    let gates = Gates {
        handling: Arc::new(Semaphore::new(config.concurrency)),
        settling,
        stopping: shutdown.clone(),
        abort: CancellationToken::new(),
    };
    (held, gates)
}

/// The receive loop's backoff after a failed receive.
fn receive_backoff(jitter: &JitterSource) -> Backoff {
    // Jittered, so that workers cut off by one outage do not all reconnect at once.
    Backoff::from_jitter(Duration::from_millis(100), Duration::from_secs(30), jitter)
}

/// A place among settlements in flight, then a handler slot; `None` once either semaphore is
/// closed (only when the runtime is dropped mid-run).
async fn handler_and_settlement(
    handling: Arc<Semaphore>,
    settling: Arc<Semaphore>,
) -> Option<(
    tokio::sync::OwnedSemaphorePermit,
    tokio::sync::OwnedSemaphorePermit,
)> {
    let settlement = settling.acquire_owned().await.ok()?;
    let handler = handling.acquire_owned().await.ok()?;
    Some((handler, settlement))
}

impl<R: Receiver, S, H> Inner<R, S, H> {
    /// The next delivery, once one of the `held` slots (deliveries handled or waiting) is free;
    /// transient receive failures are retried after `backoff`. `Ok(None)` on shutdown or once
    /// the receiver is closed.
    async fn next_delivery(
        &self,
        held: &Arc<Semaphore>,
        shutdown: &CancellationToken,
        backoff: &mut Backoff,
    ) -> Result<Option<(R::Delivery, Slot)>, RuntimeError> {
        loop {
            let waiting = tokio::time::Instant::now();
            let slot = tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                slot = held.clone().acquire_owned() => match slot {
                    Ok(slot) => slot,
                    Err(_) => return Ok(None),
                },
            };
            self.phases
                .record(phases::Phase::HeldWait, waiting.elapsed());
            // Paused by the kill switch: the receiver stops holding deliveries ahead (credit
            // withdrawn, prefetched deliveries released: their locks would otherwise run on a
            // link nobody reads), and no receive starts until the switch lets one in.
            if !self.circuit.is_admissible() {
                self.receiver.pause().await;
            }
            if !self.circuit.wait_admissible(shutdown).await {
                return Ok(None);
            }
            let receiving = tokio::time::Instant::now();
            // Half-open lets one trial delivery in: the receiver is asked for that one, not for
            // its window, whose rest would be locked only to be released below.
            let trial = self.circuit.phase() == CircuitPhase::HalfOpen;
            let receive = async {
                if trial {
                    self.receiver.receive_one().await
                } else {
                    self.receiver.receive().await
                }
            };
            let received = tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                // Not given up when the switch trips: while it waits, the link holds nothing
                // (the broker has nothing to send); what arrives is given back below, and the
                // next turn withdraws the credit.
                received = receive => received,
            };
            match received {
                Ok(Some(delivery)) => {
                    backoff.reset();
                    self.phases
                        .record(phases::Phase::ReceiveWait, receiving.elapsed());
                    let held_now = self.config.held().saturating_sub(held.available_permits());
                    self.phases.received(held_now);
                    // Tripped while the receive was under way, or the trial already taken.
                    let Some(ticket) = self.circuit.try_admit() else {
                        self.give_back(&delivery).await;
                        continue;
                    };
                    return Ok(Some((delivery, Slot::new(slot, ticket))));
                }
                Ok(None) => return Ok(None),
                Err(ReceiveError::Transient(error)) => {
                    let delay = backoff.next_delay();
                    tracing::warn!(%error, ?delay, "Receive failed; retrying.");
                    tokio::select! {
                        () = shutdown.cancelled() => return Ok(None),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(error) => return Err(RuntimeError::Receive(error)),
            }
        }
    }
}

impl<R, S, H> Inner<R, S, H> {
    /// Gives back a delivery that waited and was never started, and stops keeping its lock.
    async fn give_back_queued<D: crate::ports::Delivery>(&self, delivery: &D, lock: KeptLock) {
        self.give_back(delivery).await;
        lock.release().await;
    }

    /// Releases a delivery that was never started: the broker makes it available again without
    /// counting a delivery attempt.
    async fn give_back<D: crate::ports::Delivery>(&self, delivery: &D) {
        match delivery.release().await {
            Ok(()) => self.stats.record_released(),
            // Its lock runs out instead, which counts a delivery.
            Err(error) => tracing::warn!(%error, "Releasing an unstarted delivery failed."),
        }
    }

    /// Waits for the in-flight work of `tracker` for [`RuntimeConfig::shutdown_grace`], then
    /// cancels `abort` (roll back and abandon) and waits for the rest.
    async fn drain(&self, tracker: &TaskTracker, abort: &CancellationToken) {
        tracker.close();
        if tokio::time::timeout(self.config.shutdown_grace, tracker.wait())
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
    }
}

impl<R, S, H> Inner<R, S, H>
where
    S: Store,
    H: Handler<S::Tx>,
{
    /// Runs the kill switch's store probe, and the pipeline trace's reports, until the guard
    /// is dropped.
    fn probing(self: &Arc<Self>) -> tokio_util::sync::DropGuard
    where
        R: Send + Sync + 'static,
    {
        let stop = CancellationToken::new();
        let (inner, token) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            inner
                .circuit
                .supervise(
                    &inner.store,
                    &inner.config.consumer,
                    &inner.config.jitter,
                    &token,
                )
                .await;
        });
        let (inner, token) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            let mut every = tokio::time::interval(PHASE_REPORT_EVERY);
            while token.run_until_cancelled(every.tick()).await.is_some() {
                inner.phases.report();
            }
        });
        stop.drop_guard()
    }

    /// A delivery just received in `slot`, its lock kept from now: a delivery waiting for a
    /// handler slot must not expire there.
    fn receipt<D: crate::ports::Delivery>(&self, delivery: D, slot: Slot) -> Received<D> {
        let delivery = Arc::new(delivery);
        let lock = self.processor().keeper.keep(delivery.clone());
        Received {
            delivery,
            lock,
            slot,
            at: tokio::time::Instant::now(),
        }
    }

    /// One received delivery: waits for a place among settlements and a handler slot, then
    /// handles it, unless it should be given back first (shutdown, the kill switch, its lock
    /// lost while it waited).
    async fn handle_received<D: crate::ports::Delivery>(
        self: Arc<Self>,
        received: Received<D>,
        gates: Gates,
    ) {
        let Received {
            delivery,
            lock,
            mut slot,
            at,
        } = received;
        let permit = tokio::select! {
            // Biased: once shutting down, nothing new starts.
            biased;
            () = gates.stopping.cancelled() => None,
            // Paused by the kill switch: released, not left to wait.
            () = self.circuit.opened_for(&slot.ticket) => None,
            // Its lock was lost while it waited: another receiver may hold it by now.
            () = lock.lost().cancelled() => None,
            // Closed only when the runtime is dropped mid-run.
            permits = handler_and_settlement(gates.handling, gates.settling) => permits,
        };
        // A delivery whose lock ran out while it waited is given back, never handled
        // late: its redelivery may already be in another instance's hands.
        let permit = permit.filter(|_| !self.circuit.holds_back(&slot.ticket) && lock.is_held());
        let Some((permit, settlement)) = permit else {
            self.give_back_queued(&*delivery, lock).await;
            drop(slot);
            return;
        };
        // All three end with the transaction: the handler slot, the place held and the
        // slot's busy time in the phase trace.
        let freed = (permit, slot.take_permit(), self.phases.busy());
        self.phases.record(phases::Phase::Queued, at.elapsed());
        let report = {
            // The slot watch covers the settlement too (one that never returns is stuck).
            let _busy = self.slots.enter();
            // Boxed when it starts: a delivery that only waits for a slot (a window far from
            // its broker holds many more than the slots) carries none of the handling's
            // state, the transaction's and the settlement's (kilobytes each; issue 42).
            Box::pin(
                self.processor()
                    .run_freeing(delivery, lock, &gates.abort, Some(freed)),
            )
            .await
        };
        self.stats.record(&report);
        drop((settlement, slot));
    }

    fn processor(&self) -> process::Processor<'_, S, H> {
        process::Processor {
            store: &self.store,
            handler: &self.handler,
            consumer: &self.config.consumer,
            keeper: self.keeper.clone(),
            observer: &self.observer,
            health: &self.health,
            circuit: &self.circuit,
            max_panics: self.config.max_panics,
            transient_hold_max: self.config.transient_hold_max,
            jitter: &self.config.jitter,
            unknown_contracts: self.config.unknown_contracts,
            retry: self.config.delayed_retry.as_ref(),
            clock: self.clock,
            max_processing: self.config.max_processing,
            phases: &self.phases,
            envelope: &*self.config.envelope,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::Tx;
    use crate::testing::MemoryBroker;
    use crate::{Context, Contract, DecodeError, Handled, HandlerError, Message, SqliteStore};

    /// A handler whose transaction holds 64 KiB across an await.
    struct Heavy;

    impl<T: Tx> Handler<T> for Heavy {
        type Payload = ();

        fn contracts(&self) -> &[Contract] {
            &[]
        }

        fn decode(&self, _: &Contract, _: &[u8]) -> Result<(), DecodeError> {
            Ok(())
        }

        async fn handle(&self, _: &Context<'_, ()>, _: &mut T) -> Result<Handled, HandlerError> {
            let scratch = [7u8; 64 * 1024];
            tokio::task::yield_now().await;
            std::hint::black_box(&scratch);
            Ok(Handled::Processed)
        }
    }

    /// The window holds more deliveries than there are handler slots (its prefetch, or what a
    /// self-sized window holds far from its broker), each a task waiting for a slot. Such a
    /// task must not carry the handling's state (the handler's transaction, the settlement)
    /// before it starts: before, the unbatched worker's per-delivery task was 8 KiB from
    /// receipt (release), and as large as any handler's future.
    #[tokio::test]
    async fn a_received_delivery_holds_no_handling_state_until_it_starts() {
        let store = SqliteStore::open_in_memory().unwrap();
        let broker = MemoryBroker::new(Clock::new());
        let config = RuntimeConfig::new(ConsumerName::new("orders").unwrap());
        let runtime = Runtime::new(broker.receiver(), store, Heavy, config.clone());
        broker.send(Message::new("m-1", "orders.order-placed.v1", "{}"));
        let inner = runtime.inner.clone();
        let (held, gates) = limits(&config, &CancellationToken::new());
        let slot = Slot::new(
            held.try_acquire_owned().unwrap(),
            inner.circuit.try_admit().unwrap(),
        );
        let received = inner.receipt(broker.try_receive().unwrap(), slot);
        let task = inner.handle_received(received, gates);
        let size = std::mem::size_of_val(&task);
        assert!(size < 1024, "a received delivery's task takes {size} bytes");
    }
}
