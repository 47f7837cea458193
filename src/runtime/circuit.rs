//! The kill switch: stop taking deliveries while the store fails for every message alike, so a
//! bad day does not burn every queued message's delivery count into the dead-letter queue.
//!
//! # Algorithm
//! 1. **Closed** (normal). Every store answer is evidence: a commit, or any refusal tied to
//!    the message (a duplicate, a constraint) counts as the store working; an error of a
//!    *systemic* kind ([`ErrorKind::is_systemic`]: unavailable, including a full disk, log or
//!    memory; connection; deployment — each store classifies its provider's codes into those
//!    kinds in its `classify.rs`) counts against it, and so does a delivery that ended with a
//!    statement or lock wait past the database's bound ([`ErrorKind::TimedOut`]: one among
//!    commits trips nothing, a run of them is a migration's table lock or an overloaded
//!    server). Contention (deadlocks, serialization failures) and unknown errors count
//!    neither way: they do not reset the failures in a row. [`CircuitConfig::consecutive`] systemic failures in a
//!    row, or more than [`CircuitConfig::failure_rate_percent`] of at least
//!    [`MIN_SAMPLES`] answers within [`CircuitConfig::window`], trip the switch.
//! 2. **Open** (paused). No new receive is started; deliveries received but not started are
//!    released (AMQP `released` does not count a delivery attempt); deliveries in flight finish
//!    with their locks kept, and one that fails while the switch is open is released too, not
//!    abandoned (`transient_hold::give_back`). A probe runs, after a jittered backoff from
//!    [`CircuitConfig::probe_min`] doubling up to [`CircuitConfig::probe_max`]: a real
//!    statement, the inbox insert for a reserved id in a transaction that is rolled back (a
//!    `SELECT 1` answers on a read-only replica or without grants).
//! 3. **Half-open**. The probe passed: exactly one delivery (the trial) is let in. The probe
//!    covers only the inbox table, so the trial is what finds a grant missing on a business
//!    table: a systemic failure (or a timeout) opens the switch again (the probe backoff keeps
//!    doubling); any other store answer closes it. A trial that got no store answer (refused
//!    before its transaction, an ignored contract, a lock lost while it waited) proves nothing:
//!    the next delivery is the trial. While no trial comes (an idle entity), the next passing
//!    probe closes the switch.
//!
//! An outage costs the deliveries that failed before the trip one counted attempt each,
//! instead of every queued message's whole max delivery count: the failure mode MassTransit's
//! kill switch (`KillSwitchOptions`: `TripThreshold` percent of failures over
//! `TrackingPeriod` after `ActivationThreshold` messages, restart after `RestartTimeout`;
//! `doc/content/4.reference/masstransit/masstransit-transports-components/killswitchoptions.md`
//! in MassTransit/MassTransit), NServiceBus's rate-limited mode on consecutive failures
//! (Particular/NServiceBus#6215, "Recoverability" on docs.particular.net) and Wolverine's
//! paused listener were built for.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Backoff, ConsumerName};
use crate::ports::{ErrorKind, Store, StoreError, StoreTx};
use crate::telemetry::names::{attr, metric};

/// Answers needed in the window before the failure rate can trip the switch: a handful of
/// failures at startup is the consecutive rule's job.
pub const MIN_SAMPLES: usize = 20;

/// The logical id the probe inserts (and rolls back) under the consumer's name. Longer than
/// any message id the runtime accepts is not needed: the insert is never committed, and a real
/// row with this id would answer a duplicate, which is a store that works.
pub const PROBE_ID: &str = "sb-inbox:circuit-probe";

/// Answers kept for the rate rule at most, so a busy worker's window stays bounded.
const MAX_SAMPLES: usize = 4096;

/// The kill switch's settings (`runtime.circuit.*`): [`CircuitConfig::default`], then set the
/// fields; deserialisable with the `serde` feature.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct CircuitConfig {
    /// Whether the switch may trip at all (`runtime.circuit.enabled`).
    pub enabled: bool,
    /// Systemic failures in a row that trip it (`runtime.circuit.consecutive_failures`).
    pub consecutive: u32,
    /// Share of systemic failures among the answers of the window, in percent, above which it
    /// trips (`runtime.circuit.failure_rate_percent`); 100 turns the rate rule off.
    pub failure_rate_percent: u8,
    /// The window of the rate rule (`runtime.circuit.window_secs`).
    pub window: Duration,
    /// The first probe's delay after a trip (`runtime.circuit.probe_min_ms`).
    pub probe_min: Duration,
    /// The longest delay between probes (`runtime.circuit.probe_max_secs`).
    pub probe_max: Duration,
}

impl Default for CircuitConfig {
    /// On: 5 in a row, or over 50 % of at least [`MIN_SAMPLES`] answers in 30 s; probes from
    /// 1 s doubling up to 30 s.
    fn default() -> Self {
        CircuitConfig {
            enabled: true,
            consecutive: 5,
            failure_rate_percent: 50,
            window: Duration::from_secs(30),
            probe_min: Duration::from_secs(1),
            probe_max: Duration::from_secs(30),
        }
    }
}

/// Where the switch stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitPhase {
    /// Deliveries flow.
    Closed,
    /// Paused: nothing new starts; the probe runs.
    Open,
    /// The probe passed: one trial delivery may start.
    HalfOpen,
    /// The trial delivery is running; nothing else starts until it ends.
    Trial,
}

/// The kill switch shared by a runtime's receive loop, its deliveries and its readiness probe.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Circuit {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: CircuitConfig,
    phase: watch::Sender<CircuitPhase>,
    state: Mutex<State>,
    trips: Counter<u64>,
    paused: Counter<f64>,
    consumer: KeyValue,
}

#[derive(Debug, Default)]
struct State {
    consecutive: u32,
    /// Recent answers: when, and whether systemic.
    recent: VecDeque<(Instant, bool)>,
    /// Why and since when it is open (kept through half-open and trial).
    paused: Option<(Instant, String)>,
    trips: u64,
    paused_total: Duration,
}

impl Circuit {
    /// A closed switch for `consumer`, counting into the global meter provider present now.
    pub fn new(config: CircuitConfig, consumer: &ConsumerName) -> Self {
        let meter = opentelemetry::global::meter("sb-inbox");
        let trips = meter
            .u64_counter(metric::CIRCUIT_TRIPS)
            .with_unit("{trip}")
            .build();
        let paused = meter
            .f64_counter(metric::CIRCUIT_PAUSED)
            .with_unit("s")
            .build();
        Circuit {
            shared: Arc::new(Shared {
                config,
                phase: watch::Sender::new(CircuitPhase::Closed),
                state: Mutex::default(),
                trips,
                paused,
                consumer: KeyValue::new(attr::CONSUMER, consumer.as_str().to_owned()),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Where the switch stands now.
    pub fn phase(&self) -> CircuitPhase {
        *self.shared.phase.borrow()
    }

    /// How many times it tripped, and the time spent paused in finished pauses.
    pub fn trips(&self) -> (u64, Duration) {
        let state = self.state();
        (state.trips, state.paused_total)
    }

    /// Why deliveries are paused, for `/readyz`; `None` while closed.
    pub fn problem(&self) -> Option<String> {
        let phase = self.phase();
        let state = self.state();
        let (since, why) = state.paused.as_ref()?;
        let doing = match phase {
            CircuitPhase::Closed => return None,
            CircuitPhase::Open => "probing the store",
            CircuitPhase::HalfOpen | CircuitPhase::Trial => "probe passed, one trial delivery",
        };
        Some(format!(
            "paused for {} s ({doing}): {why}",
            since.elapsed().as_secs()
        ))
    }

    /// A store error seen by a delivery's transaction: systemic kinds count against the store;
    /// contention (a deadlock, a serialization failure) and unknown errors say nothing either
    /// way, so they neither count nor reset the count of failures in a row; a timeout is
    /// counted when the delivery ends with it ([`Circuit::timed_out`], since a batch's bounded
    /// lock wait meets one by design); any other error (a duplicate, a constraint) is an answer
    /// of a working store.
    pub(crate) fn store_error(&self, error: &StoreError) {
        match error.kind() {
            kind if kind.is_systemic() => self.failure(error),
            ErrorKind::Contention | ErrorKind::Unknown | ErrorKind::TimedOut => {}
            _ => self.answered(),
        }
    }

    /// A delivery's attempt ended with a statement or lock wait past the database's bound
    /// ([`ErrorKind::TimedOut`]): counted against the store like a systemic failure, so a run
    /// of them (a migration's table lock, an overloaded server) trips the switch and a trial
    /// that meets one opens it again. A single one among commits does not trip it.
    pub(crate) fn timed_out(&self, redacted: &str) {
        self.failed(redacted);
    }

    /// A transaction committed, or the store answered with an error tied to the message.
    pub(crate) fn answered(&self) {
        let mut state = self.state();
        state.consecutive = 0;
        self.sample(&mut state, false);
        if matches!(self.phase(), CircuitPhase::HalfOpen | CircuitPhase::Trial) {
            self.close(&mut state);
        }
    }

    fn failure(&self, error: &StoreError) {
        self.failed(&error.redacted());
    }

    /// A failure counted against the store; `redacted` says what it was (no values).
    fn failed(&self, redacted: &str) {
        let config = &self.shared.config;
        let mut state = self.state();
        state.consecutive = state.consecutive.saturating_add(1);
        self.sample(&mut state, true);
        if !config.enabled {
            return;
        }
        let why = match self.phase() {
            // Already paused: deliveries in flight finishing.
            CircuitPhase::Open => return,
            CircuitPhase::HalfOpen | CircuitPhase::Trial => {
                "the trial delivery failed the same way".to_owned()
            }
            CircuitPhase::Closed => match self.tripping(&state) {
                Some(why) => why,
                None => return,
            },
        };
        let why = format!("{why}; last: {redacted}");
        if state.paused.is_none() {
            state.trips += 1;
            state.paused = Some((Instant::now(), why.clone()));
            self.shared
                .trips
                .add(1, std::slice::from_ref(&self.shared.consumer));
            tracing::error!(
                consumer = %self.shared.consumer.value,
                reason = %why,
                "Store failing for every message alike: pausing deliveries (kill switch tripped)."
            );
        } else {
            tracing::warn!(reason = %why, "Trial delivery failed; pausing deliveries again.");
        }
        self.shared.phase.send_replace(CircuitPhase::Open);
    }

    /// Whether the answers so far trip a closed switch, and why.
    fn tripping(&self, state: &State) -> Option<String> {
        let config = &self.shared.config;
        if state.consecutive >= config.consecutive {
            return Some(format!(
                "{} systemic store failures in a row",
                state.consecutive
            ));
        }
        let failed = state
            .recent
            .iter()
            .filter(|(_, systemic)| *systemic)
            .count();
        let total = state.recent.len();
        let over = failed * 100 > total * usize::from(config.failure_rate_percent);
        (config.failure_rate_percent < 100 && total >= MIN_SAMPLES && over).then(|| {
            format!(
                "{failed} of {total} store answers in {} s were systemic failures",
                config.window.as_secs()
            )
        })
    }

    fn sample(&self, state: &mut State, systemic: bool) {
        let now = Instant::now();
        let window = self.shared.config.window;
        while let Some(&(at, _)) = state.recent.front() {
            if now.duration_since(at) <= window && state.recent.len() < MAX_SAMPLES {
                break;
            }
            state.recent.pop_front();
        }
        state.recent.push_back((now, systemic));
    }

    fn close(&self, state: &mut State) {
        if let Some((since, _)) = state.paused.take() {
            let paused = since.elapsed();
            state.paused_total += paused;
            self.shared.paused.add(
                paused.as_secs_f64(),
                std::slice::from_ref(&self.shared.consumer),
            );
            tracing::info!(
                paused_secs = paused.as_secs_f64(),
                "Store answers again: resuming deliveries."
            );
        }
        state.recent.clear();
        self.shared.phase.send_replace(CircuitPhase::Closed);
    }

    /// A ticket to start one delivery now: `None` while paused or while the trial runs.
    pub(crate) fn try_admit(&self) -> Option<Ticket> {
        let (mut admitted, mut trial) = (false, false);
        // Only the trial changes the phase (and wakes the watchers).
        self.shared.phase.send_if_modified(|phase| match *phase {
            CircuitPhase::Closed => {
                admitted = true;
                false
            }
            CircuitPhase::HalfOpen => {
                *phase = CircuitPhase::Trial;
                (admitted, trial) = (true, true);
                true
            }
            CircuitPhase::Open | CircuitPhase::Trial => false,
        });
        admitted.then(|| Ticket {
            circuit: trial.then(|| self.clone()),
        })
    }

    /// Resolves once the switch is open (paused), for a delivery waiting to start with
    /// `ticket`; never for the trial, which is what the pause waits for.
    pub(crate) async fn opened_for(&self, ticket: &Ticket) {
        if ticket.is_trial() {
            return std::future::pending().await;
        }
        let mut phase = self.shared.phase.subscribe();
        // The sender lives in `self`, so the wait ends only when the phase matches.
        let _ = phase.wait_for(|phase| *phase == CircuitPhase::Open).await;
    }

    /// Whether a delivery could be admitted now (closed, or half-open with the trial not taken
    /// yet): what [`Circuit::wait_admissible`] waits for.
    pub(crate) fn is_admissible(&self) -> bool {
        matches!(self.phase(), CircuitPhase::Closed | CircuitPhase::HalfOpen)
    }

    /// Waits until a delivery could be admitted (closed, or half-open with the trial not taken
    /// yet); `false` once `stop` is cancelled.
    pub(crate) async fn wait_admissible(&self, stop: &CancellationToken) -> bool {
        let mut phase = self.shared.phase.subscribe();
        tokio::select! {
            () = stop.cancelled() => false,
            // The sender lives in `self`: the wait cannot fail.
            ready = phase.wait_for(|phase| matches!(phase, CircuitPhase::Closed | CircuitPhase::HalfOpen)) => ready.is_ok(),
        }
    }

    /// Whether a delivery not started yet should be given back: paused, and not the trial.
    pub(crate) fn holds_back(&self, ticket: &Ticket) -> bool {
        !ticket.is_trial() && self.phase() != CircuitPhase::Closed
    }

    /// Probes `store` with backoff whenever the switch is open, until `stop`: a pass lets one
    /// trial delivery in. Half-open with no trial taken by the next probe (nothing arrived: an
    /// idle entity), a passing probe closes the switch, so readiness does not stay paused
    /// after the outage ended; the failures in a row are kept, so a first delivery that fails
    /// the same way trips it again at once.
    pub(crate) async fn supervise<S: Store>(
        &self,
        store: &S,
        consumer: &ConsumerName,
        jitter: &super::JitterSource,
        stop: &CancellationToken,
    ) {
        let config = &self.shared.config;
        let mut backoff = Backoff::from_jitter(config.probe_min, config.probe_max, jitter);
        let mut phase = self.shared.phase.subscribe();
        loop {
            let current = *phase.borrow_and_update();
            match current {
                CircuitPhase::Closed => {
                    backoff.reset();
                    tokio::select! {
                        () = stop.cancelled() => return,
                        changed = phase.changed() => if changed.is_err() { return },
                    }
                }
                CircuitPhase::Open => {
                    let delay = backoff.next_delay();
                    if stop
                        .run_until_cancelled(tokio::time::sleep(delay))
                        .await
                        .is_none()
                    {
                        return;
                    }
                    self.probe_open(store, consumer, delay).await;
                }
                CircuitPhase::HalfOpen | CircuitPhase::Trial => {
                    let delay = backoff.next_delay();
                    // Until the trial decides (closed or open again), or the next probe is due.
                    let decided =
                        phase.wait_for(|p| matches!(p, CircuitPhase::Closed | CircuitPhase::Open));
                    tokio::select! {
                        () = stop.cancelled() => return,
                        _ = decided => continue,
                        () = tokio::time::sleep(delay) => {}
                    }
                    if self.phase() == CircuitPhase::HalfOpen {
                        self.probe_idle(store, consumer).await;
                    }
                }
            }
        }
    }

    /// The probe of an open switch: a pass makes it half-open (one trial delivery).
    async fn probe_open<S: Store>(&self, store: &S, consumer: &ConsumerName, delay: Duration) {
        match probe(store, consumer).await {
            Ok(()) => {
                tracing::info!(?delay, "Store probe passed; letting one trial delivery in.");
                self.shared.phase.send_if_modified(|phase| {
                    let open = *phase == CircuitPhase::Open;
                    if open {
                        *phase = CircuitPhase::HalfOpen;
                    }
                    open
                });
            }
            Err(error) => {
                tracing::warn!(%error, next_in = ?delay, "Store probe failed; still paused.");
            }
        }
    }

    /// The probe of a half-open switch whose trial never came (an idle entity): a pass closes
    /// it, a failure opens it again.
    async fn probe_idle<S: Store>(&self, store: &S, consumer: &ConsumerName) {
        let passed = probe(store, consumer).await;
        // Under the state lock, as every answer is counted; the phase moves only if no trial
        // was taken meanwhile (a trial decides then).
        let mut state = self.state();
        let to = if passed.is_ok() {
            CircuitPhase::Closed
        } else {
            CircuitPhase::Open
        };
        let moved = self.shared.phase.send_if_modified(|phase| {
            let idle = *phase == CircuitPhase::HalfOpen;
            if idle {
                *phase = to;
            }
            idle
        });
        match passed {
            Ok(()) if moved => {
                tracing::info!(
                    "No trial delivery arrived and the store probe passed again; resuming."
                );
                self.close(&mut state);
            }
            Err(error) if moved => {
                tracing::warn!(%error, "Store probe failed while waiting for a trial; pausing again.");
            }
            _ => {}
        }
    }
}

/// The probe: the consumer's inbox insert in a transaction that is always rolled back. A
/// duplicate (a row with [`PROBE_ID`] exists) is an answer too.
async fn probe<S: Store>(store: &S, consumer: &ConsumerName) -> Result<(), StoreError> {
    let mut tx = store.begin().await?;
    let inserted = tx.insert_inbox(consumer.as_str(), PROBE_ID).await;
    let rolled_back = tx.rollback().await;
    match inserted {
        Err(error) if !matches!(error.kind(), ErrorKind::Duplicate(_)) => Err(error),
        _ => rolled_back,
    }
}

/// Leave to start one delivery; the trial's ticket, dropped when that delivery ends, lets the
/// next delivery be the trial when no store answer decided this one (it never reached the
/// store).
#[derive(Debug)]
pub(crate) struct Ticket {
    circuit: Option<Circuit>,
}

impl Ticket {
    /// Whether this is the half-open switch's one trial delivery.
    pub(crate) fn is_trial(&self) -> bool {
        self.circuit.is_some()
    }
}

impl Drop for Ticket {
    /// A trial that ends with the phase still `Trial` got no store answer either way (an
    /// envelope refusal, an ignored contract, a lock lost while it waited, a handler failure
    /// before any statement): it proved nothing, so the next delivery is the trial.
    fn drop(&mut self) {
        if let Some(circuit) = self.circuit.take() {
            circuit.shared.phase.send_if_modified(|phase| {
                let undecided = *phase == CircuitPhase::Trial;
                if undecided {
                    *phase = CircuitPhase::HalfOpen;
                }
                undecided
            });
        }
    }
}

/// A delivery's `held` slot with its admission ticket: both end when the delivery is done,
/// unless the slot is taken out earlier ([`Slot::take_permit`]).
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) ticket: Ticket,
    permit: Option<OwnedSemaphorePermit>,
}

impl Slot {
    pub(crate) fn new(permit: OwnedSemaphorePermit, ticket: Ticket) -> Self {
        Slot {
            ticket,
            permit: Some(permit),
        }
    }

    /// The `held` permit, for a caller that frees it before the delivery is done (once its
    /// transaction ended); the ticket stays until then.
    pub(crate) fn take_permit(&mut self) -> Option<OwnedSemaphorePermit> {
        self.permit.take()
    }
}
