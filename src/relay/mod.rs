//! The outbox relay: publishes the messages consumer transactions wrote to the local outbox.
//!
//! # Algorithm
//! 1. **Claim** a batch of due rows in a short transaction of the store's own
//!    ([`OutboxStore::claim_outbox`]): rows another relay is claiming are skipped, not waited
//!    for, and each claimed row gets this pass's lease (a token and an end time from the
//!    relay's clock). A row that does not read back as a message is returned apart and
//!    **quarantined**: released with the reason as its `last_error` and a growing backoff,
//!    while the rest of the claim goes on.
//! 2. **Plan**: the rows go into lanes, one per ordering key, in id (write) order. The key is
//!    (destination, session id) for a row with a session id, and the destination for a row
//!    without one when [`RelayConfig::ordered`] is set; any other row is a lane of its own.
//! 3. **Publish** each lane's rows one at a time, outside any transaction, through the
//!    [`Sender`] port under the message id fixed when the row was written, and await the
//!    broker's `accepted`. Lanes run side by side: up to [`RelayConfig::max_in_flight`] sends
//!    wait for their answer at once, so a broker a round trip away costs one round trip per that
//!    many rows, not per row. A destination's window starts at one send, grows as TCP's slow
//!    start while it is full, is carried into the next pass as what the pass measured (the
//!    bandwidth-delay product: rows accepted per second × the send's round trip, with
//!    headroom), is bounded by `max_in_flight`, and falls back to one after a failure
//!    (`lanes.rs`).
//! 4. **Hold** a lane when a row of it fails: the lane's later rows go back untried, due when
//!    the failed row is, and the key is held in later passes until then, so nothing overtakes
//!    the failed row. Other keys go on. A destination that failed transiently is not tried again
//!    in the pass.
//! 5. **Mark** the accepted rows dispatched by id and lease token, then release the failed and
//!    untried ones.
//!
//! [`Relay::run`] overlaps the steps of consecutive passes: while a full batch is published,
//! the batch before it is marked and the one after it claimed (`pipeline.rs`), so a broker a
//! round trip away costs the publishing, not the store's statements as well. Its claims size
//! themselves from the windows, as the windows do from the round trip: four windows of rows
//! (eight round trips at the measured rate), at least [`RelayConfig::batch_size`] and at most
//! four times [`RelayConfig::max_in_flight`], since a batch is a barrier and a claim of 100
//! rows to a broker 10 ms away would cost a round trip per 100 rows (`lanes.rs`,
//! `CLAIM_WINDOWS`). No claim, of either, exceeds [`MAX_ROWS_PER_STATEMENT`] rows: SQL Server
//! would escalate it (and the mark over its ids) to a table lock on the outbox.
//!
//! A relay that stops between 3 and 5 leaves its rows leased; once the lease ends another pass
//! (of any relay) claims and publishes them again under the same ids: at most a duplicate,
//! which downstream inboxes (and broker duplicate detection, within its window) drop; never a
//! loss. Failed sends wait for an exponential backoff on the row (its `last_error` says why).
//!
//! # Order
//! The rows of one (destination, session id) reach the broker in write order, one send at a
//! time, across failures and relays: a claim skips a session row while an earlier row of its
//! session is leased or backing off. Rows without a session id keep their destination's write
//! order only with [`RelayConfig::ordered`], and then within one relay (the hold lives in the
//! relay); without it they go out concurrently, in any order. Service Bus itself keeps order
//! only within a session (its FIFO guarantee), so ordered consumers read a session-enabled
//! entity.
//!
//! The relay sees only [`crate::ports`]: the worker hands it the Service Bus publisher.

mod lanes;
mod pipeline;
mod stats;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use tokio_util::sync::CancellationToken;

pub use crate::ports::BacklogSample;
pub use stats::{RelayStats, RelayStatsSnapshot};

use crate::ports::{
    MAX_ROWS_PER_STATEMENT, OutboxBacklog, OutboxClaim, OutboxLease, OutboxRow, OutboxStore,
    Sender, StoreError,
};
use crate::runtime::{Clock, exponential_step};
use lanes::{Key, Outcome, Plan, Window};

/// The longest wait before a failed row is tried again, and between failed claims.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// How often the running relay samples the backlog for [`RelayStats`].
pub const BACKLOG_SAMPLE_INTERVAL: Duration = Duration::from_secs(5);

/// The default [`RelayConfig::max_in_flight`], the ceiling of each destination's
/// self-sizing window: the link credit Service Bus grants a sending link, 1000 (azure-amqp's
/// `AmqpConstants.DefaultLinkCredit`, which the service's accepted links take; the emulator
/// grants the same, `links.rs` `SEND_LINK_CREDIT`), so sends beyond it would only wait for
/// credit on the link. The window asks for twice rate × round trip: a relay that publishes
/// 20 000 rows/s locally needs about 400 at 10 ms to keep 0.8 of that rate, and 256 left a pass
/// of 1000 rows four round trips of sending (0.65 of the local rate at 10 ms, issue 42). The
/// sends in flight are rows of the claim, held in memory anyway; a broker close by or few rows
/// keep the window small whatever the ceiling (`lanes.rs`).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1000;

/// How a [`Relay`] runs. Built from [`RelayConfig::default`] and the `with_*` methods (new
/// settings are added without breaking callers); deserialisable with the `serde` feature
/// (missing fields take the defaults; durations as serde writes them, `{"secs":..,"nanos":..}`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct RelayConfig {
    /// Rows claimed per pass: what [`Relay::relay_once`] claims, and the least
    /// [`Relay::run`] claims; the running relay claims more while its windows need more: four
    /// windows of rows, at most four times [`RelayConfig::max_in_flight`] (a batch is a
    /// barrier, so with a broker 10 ms away claims of 100 would cost a round trip per 100 rows).
    /// More rows are then leased at once: a relay that crashes leaves up to two claims published
    /// but not marked (published again after the lease: duplicates, not losses). Claims are
    /// capped at [`MAX_ROWS_PER_STATEMENT`] (4000) rows whatever this says, so SQL Server never
    /// escalates a claim to a table lock on the outbox.
    pub batch_size: usize,
    /// Wait between passes while the outbox has nothing due.
    pub poll_interval: Duration,
    /// How long claimed rows stay reserved for this relay. No send starts after half of it has
    /// passed, so another relay only takes rows over from a relay that stopped (or a send that
    /// hung for half a lease). Shorter means faster recovery after a crash; too short for a
    /// batch means duplicates, never losses.
    pub lease: Duration,
    /// Sends of one pass awaiting the broker's answer at once (at least 1), and the ceiling of
    /// each destination's self-sizing window (which keeps fewer when the broker is close or
    /// the rows few). Each row is still marked only after its own `accepted`. The running
    /// relay's claims grow to four times this, but are capped at [`MAX_ROWS_PER_STATEMENT`]
    /// (4000) rows: above 1000 the cap, not this, bounds a claim.
    pub max_in_flight: usize,
    /// Publish the rows without a session id of each destination in write order, one at a
    /// time, a failed row holding back the later ones. Off by default: such rows then go out
    /// concurrently (Service Bus keeps order only within a session, so consumers that need
    /// order read sessions, whose rows the relay always keeps in order).
    pub ordered: bool,
}

impl RelayConfig {
    /// Rows claimed per pass (claims are capped at [`MAX_ROWS_PER_STATEMENT`] rows).
    #[must_use]
    pub fn with_batch_size(mut self, batch_size: usize) -> Self {
        self.batch_size = batch_size;
        self
    }

    /// Wait between passes while the outbox has nothing due.
    #[must_use]
    pub fn with_poll_interval(mut self, poll_interval: Duration) -> Self {
        self.poll_interval = poll_interval;
        self
    }

    /// How long claimed rows stay reserved for this relay.
    #[must_use]
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sends of one pass awaiting the broker's answer at once (claims are capped at
    /// [`MAX_ROWS_PER_STATEMENT`] rows whatever this is).
    #[must_use]
    pub fn with_max_in_flight(mut self, max_in_flight: usize) -> Self {
        self.max_in_flight = max_in_flight;
        self
    }

    /// Keep each destination's write order for rows without a session id too.
    #[must_use]
    pub fn with_ordered(mut self, ordered: bool) -> Self {
        self.ordered = ordered;
        self
    }
}

impl Default for RelayConfig {
    /// 100 rows per pass, polling every 500 ms, 60 s leases, at most 1000 sends in flight,
    /// order kept per session only.
    fn default() -> Self {
        RelayConfig {
            batch_size: 100,
            poll_interval: Duration::from_millis(500),
            lease: Duration::from_secs(60),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            ordered: false,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Pass {
    /// Rows claimed.
    pub claimed: usize,
    /// Rows the broker accepted.
    pub published: usize,
    /// Rows marked dispatched.
    pub marked: u64,
    /// Sends that failed.
    pub failed: usize,
    /// Rows handed back untried (shutdown, a destination down, the lease half gone, an
    /// earlier row of their key failed).
    pub untried: usize,
    /// Rows that did not read back as messages, quarantined (counted in `failed` too).
    pub quarantined: usize,
}

/// A claimed batch: its lease, the time after which none of its sends may start, its rows.
#[derive(Debug)]
struct Claimed {
    lease: OutboxLease,
    /// Rows asked for: a claim that got fewer found the outbox drained.
    asked: usize,
    send_until: SystemTime,
    claim: OutboxClaim,
}

/// The outbox relay over one store and one publisher.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::SystemTime;
/// use sb_inbox::relay::{Relay, RelayConfig};
/// use sb_inbox::{Message, OutboxMessage, SendFailure, Sender, SqliteStore, Store, StoreTx, Tx};
///
/// /// Prints instead of publishing (the worker passes the Service Bus publisher).
/// struct Print;
/// impl Sender for Print {
///     async fn send(&self, to: &str, message: Message, _: Option<SystemTime>) -> Result<(), SendFailure> {
///         println!("{to}: {:?}", message.message_id);
///         Ok(())
///     }
/// }
///
/// let store = SqliteStore::open_in_memory()?;
/// store.migrate().await?;
/// let mut tx = store.begin().await?;
/// tx.append_outbox(&OutboxMessage::new("events", "inventory.stock-reserved.v1", b"{}".to_vec())).await?;
/// tx.commit().await?;
///
/// let relay = Relay::new(store, Print, RelayConfig::default());
/// let pass = relay.relay_once(&Default::default()).await?;
/// assert_eq!((pass.published, pass.marked), (1, 1));
/// assert_eq!(relay.backlog().await?.pending, 0);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Relay<S, P> {
    store: S,
    publisher: P,
    config: RelayConfig,
    clock: Clock,
    stats: Arc<RelayStats>,
    /// Sends each destination may have in flight, carried from pass to pass: one until a send
    /// to it succeeds, then sized from the measured send round trip and rate (`lanes.rs`) up
    /// to [`RelayConfig::max_in_flight`], back to one after a failure. A destination that is
    /// down thus costs one failed send per pass, as when sends went one at a time, and a
    /// healthy one gets the window its distance and rows need.
    windows: std::sync::Mutex<HashMap<String, Window>>,
    /// Ordering keys held back until their failed row is due again, carried from pass to
    /// pass: a later claim's rows of the key must not overtake it.
    held: std::sync::Mutex<HashMap<Key, SystemTime>>,
}

impl<S: OutboxStore, P: Sender> Relay<S, P> {
    /// A relay on the real clock.
    pub fn new(store: S, publisher: P, config: RelayConfig) -> Self {
        Relay::with_clock(store, publisher, config, Clock::new())
    }

    /// A relay on a given clock: leases are written and compared in it.
    pub fn with_clock(store: S, publisher: P, config: RelayConfig, clock: Clock) -> Self {
        Relay {
            store,
            publisher,
            config,
            clock,
            stats: Arc::new(RelayStats::default()),
            windows: std::sync::Mutex::default(),
            held: std::sync::Mutex::default(),
        }
    }

    /// The windows and held keys carried from the last pass.
    fn carried(&self) -> (HashMap<String, Window>, HashMap<Key, SystemTime>) {
        fn copy<K: Clone, V: Clone>(map: &std::sync::Mutex<HashMap<K, V>>) -> HashMap<K, V> {
            map.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        }
        (copy(&self.windows), copy(&self.held))
    }

    fn carry(&self, windows: HashMap<String, Window>, held: HashMap<Key, SystemTime>) {
        *self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = windows;
        *self
            .held
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = held;
    }

    /// The publisher.
    pub fn publisher(&self) -> &P {
        &self.publisher
    }

    /// The counters, shared with the running relay.
    pub fn stats(&self) -> Arc<RelayStats> {
        self.stats.clone()
    }

    /// Reads the backlog now (and records it in [`Relay::stats`]).
    ///
    /// # Errors
    /// The store's [`StoreError`].
    pub async fn backlog(&self) -> Result<OutboxBacklog, StoreError> {
        let backlog = self.store.outbox_backlog().await?;
        self.stats.record_backlog(&backlog, self.clock.now());
        Ok(backlog)
    }

    /// Claims one batch ([`RelayConfig::batch_size`] rows, at most [`MAX_ROWS_PER_STATEMENT`]),
    /// publishes it and marks what the broker accepted. With `stop` cancelled, the send in
    /// flight finishes, the rest is handed back untried.
    ///
    /// # Errors
    /// A [`StoreError`] from the claim or the mark (published rows that could not be marked are
    /// published again after their lease: duplicates, not losses). A failed send is no error:
    /// the row waits for its backoff.
    pub async fn relay_once(&self, stop: &CancellationToken) -> Result<Pass, StoreError> {
        let claimed = self.claim(self.config.batch_size).await?;
        let outcome = self.publish(&claimed.claim, stop, claimed.send_until).await;
        self.settle(&claimed.lease, claimed.claim.len(), outcome)
            .await
    }

    /// Step 1: claims up to `asked` rows (at most [`MAX_ROWS_PER_STATEMENT`]) under a new
    /// lease, whose sends must start before half of it.
    async fn claim(&self, asked: usize) -> Result<Claimed, StoreError> {
        // Every claim passes here, `relay_once`'s unsized batch too: capped once for all of
        // them, and `asked` kept capped so a full claim of the cap still reads as full.
        let asked = asked.min(MAX_ROWS_PER_STATEMENT);
        let claimed_at = self.clock.now();
        let lease = OutboxLease::new(claimed_at + self.config.lease);
        let claim = self.store.claim_outbox(claimed_at, &lease, asked).await?;
        self.stats.add_claimed(claim.len());
        Ok(Claimed {
            lease,
            asked,
            send_until: claimed_at + self.config.lease / 2,
            claim,
        })
    }

    /// Steps 2 to 4: plans the claim in lanes and sends until every row is sent, failed or
    /// handed back. No send starts once `stop` is cancelled or `send_until` has passed.
    async fn publish(
        &self,
        claim: &OutboxClaim,
        stop: &CancellationToken,
        send_until: SystemTime,
    ) -> Outcome {
        let (windows, held) = self.carried();
        let max_in_flight = self.config.max_in_flight;
        let now = self.clock.now();
        let mut plan = Plan::new(
            claim,
            self.config.ordered,
            windows,
            held,
            max_in_flight,
            now,
        );
        let mut sending = FuturesUnordered::new();
        loop {
            let now = self.clock.now();
            let stopping = stop.is_cancelled() || now >= send_until;
            for (lane, row) in plan.ready(now, stopping, |n| self.backoff(n)) {
                sending.push(async move {
                    let message = row.to_message();
                    let at = row.message.scheduled_enqueue_time;
                    let sent = self
                        .publisher
                        .send(&row.message.destination, message, at)
                        .await;
                    (lane, row, sent)
                });
            }
            let Some((lane, row, sent)) = sending.next().await else {
                break;
            };
            let answer = self.answer(row, sent);
            plan.answered(lane, row, answer, self.clock.now());
        }
        let (outcome, windows, held) = plan.finish(self.clock.now());
        self.carry(windows, held);
        outcome
    }

    /// Counts and logs one answer; a failure with its due time, reason and whether it was
    /// transient.
    fn answer(
        &self,
        row: &OutboxRow,
        sent: Result<(), crate::ports::SendFailure>,
    ) -> Option<(SystemTime, String, bool)> {
        match sent {
            Ok(()) => {
                self.stats.add_published(row.is_retry());
                None
            }
            Err(failure) => {
                self.stats.add_failed();
                let wait = self.backoff(row.attempts);
                log_failure(row, &failure, wait);
                let due = self.clock.now() + wait;
                Some((due, failure.to_string(), failure.is_transient()))
            }
        }
    }

    /// Step 5: marks what the broker accepted, then releases the failed and untried rows.
    async fn settle(
        &self,
        lease: &OutboxLease,
        claimed: usize,
        outcome: Outcome,
    ) -> Result<Pass, StoreError> {
        let sent = outcome.sent;
        let mut pass = Pass {
            claimed,
            published: sent.len(),
            failed: outcome.failed.len(),
            untried: outcome.untried.values().map(Vec::len).sum(),
            quarantined: outcome.quarantined,
            ..Pass::default()
        };
        // Marking first: it is what keeps accepted rows from being published twice.
        if !sent.is_empty() {
            pass.marked = self
                .store
                .mark_dispatched(lease, &sent, self.clock.now())
                .await?;
        }
        self.stats.add_marked(pass.marked, sent.len());
        if pass.marked < sent.len() as u64 {
            tracing::warn!(
                published = sent.len(),
                marked = pass.marked,
                "Another relay took over expired leases; it publishes those rows again."
            );
        }
        for (id, due, failure) in &outcome.failed {
            self.store
                .release_outbox(lease, &[*id], *due, Some(failure))
                .await?;
        }
        for (due, ids) in &outcome.untried {
            self.store.release_outbox(lease, ids, *due, None).await?;
        }
        Ok(pass)
    }

    /// Poll interval × 2^(n − 1), at most [`MAX_BACKOFF`]: the runtime's exponential step,
    /// without jitter (each row waits on its own, so rows do not retry in lockstep anyway).
    fn backoff(&self, n: u32) -> Duration {
        let base = self.config.poll_interval.max(Duration::from_millis(1));
        exponential_step(base, MAX_BACKOFF, n)
    }
}

fn log_failure(row: &OutboxRow, failure: &crate::ports::SendFailure, retry_in: Duration) {
    macro_rules! failed {
        ($level:expr, $text:literal) => {
            tracing::event!(
                $level,
                message_id = %row.message.message_id,
                destination = %row.message.destination,
                attempts = row.attempts,
                %failure,
                ?retry_in,
                $text
            )
        };
    }
    if failure.is_transient() {
        failed!(
            tracing::Level::WARN,
            "Outbox message not published; retrying later."
        );
    } else {
        failed!(
            tracing::Level::ERROR,
            "Broker refused an outbox message; it stays in the outbox and is retried until an operator fixes the cause."
        );
    }
}

#[cfg(all(test, feature = "serde"))]
#[allow(clippy::unwrap_used)]
mod serde_tests {
    use std::time::Duration;

    use super::RelayConfig;
    use crate::retention::RetentionConfig;
    use crate::runtime::SessionConfig;

    /// Missing fields take the defaults; unknown ones are refused, as in `WorkerConfig`.
    #[test]
    fn configuration_types_deserialize_with_their_defaults() {
        let relay: RelayConfig = serde_json::from_str(r#"{"batch_size":7}"#).unwrap();
        assert_eq!(relay, RelayConfig::default().with_batch_size(7));
        assert!(serde_json::from_str::<RelayConfig>(r#"{"batch":7}"#).is_err());
        let sessions: SessionConfig =
            serde_json::from_str(r#"{"idle":{"secs":2,"nanos":0}}"#).unwrap();
        assert_eq!(
            sessions,
            SessionConfig::default().with_idle(Duration::from_secs(2))
        );
        let retention: RetentionConfig =
            serde_json::from_str(r#"{"retention":{"secs":60,"nanos":0},"batch_size":10}"#).unwrap();
        assert_eq!(
            retention,
            RetentionConfig::new(Duration::from_secs(60)).with_batch_size(10)
        );
        assert!(
            serde_json::from_str::<RetentionConfig>("{}").is_err(),
            "retention is required"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::ports::{Message, SendFailure};

    /// An empty outbox that records the limit of every claim asked of it.
    #[derive(Default)]
    struct ClaimSpy {
        limits: Mutex<Vec<usize>>,
    }

    impl OutboxStore for ClaimSpy {
        async fn claim_outbox(
            &self,
            _: SystemTime,
            _: &OutboxLease,
            limit: usize,
        ) -> Result<OutboxClaim, StoreError> {
            self.limits
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(limit);
            Ok(OutboxClaim::default())
        }

        async fn mark_dispatched(
            &self,
            _: &OutboxLease,
            _: &[i64],
            _: SystemTime,
        ) -> Result<u64, StoreError> {
            Ok(0)
        }

        async fn release_outbox(
            &self,
            _: &OutboxLease,
            _: &[i64],
            _: SystemTime,
            _: Option<&str>,
        ) -> Result<u64, StoreError> {
            Ok(0)
        }

        async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
            Ok(OutboxBacklog::default())
        }
    }

    /// Never called: the spy's claims are empty.
    struct NoSends;

    impl Sender for NoSends {
        async fn send(
            &self,
            _: &str,
            _: Message,
            _: Option<SystemTime>,
        ) -> Result<(), SendFailure> {
            Ok(())
        }
    }

    /// A batch size above the cap still asks the store for at most the cap: a single pass's
    /// claim is no way around SQL Server's lock escalation.
    #[tokio::test]
    async fn a_single_pass_claims_at_most_the_rows_one_statement_may_lock() {
        let config = RelayConfig::default().with_batch_size(10_000);
        let relay = Relay::new(ClaimSpy::default(), NoSends, config);
        relay
            .relay_once(&CancellationToken::new())
            .await
            .expect("the spy never fails");
        let limits = relay.store.limits.lock().expect("not poisoned").clone();
        assert_eq!(limits, vec![MAX_ROWS_PER_STATEMENT]);
    }
}
