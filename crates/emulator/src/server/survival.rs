//! Connection-level failures of the service a client must survive, injected on demand: ended
//! AMQP sessions, `$cbs` answering busy, namespace throttling, revoked tokens, a connection
//! stuck on `amqp:internal-error`; and the counters a test reads to see how a client recovered
//! (connections, sessions and request/response links opened, settlement attempts).
//!
//! What the service does in each case, and where it is documented:
//! - Sessions: the service may end an AMQP session while its connection lives; .NET opens one
//!   session per link and rebuilds it (`AmqpConnectionScope.OpenReceiverLinkAsync` creates a
//!   new `AmqpSession` for every link).
//! - `$cbs` busy: put-token may be answered 503 / 500 / 408 during a gateway upgrade; Go
//!   retries management replies with those statuses (`azservicebus/internal/errors.go`
//!   `GetRecoveryKind`), .NET pairs them with conditions it retries (`AmqpExceptionHelper`).
//! - Throttling: a throttled namespace answers every operation with `com.microsoft:server-busy`
//!   ("The request was terminated because the entity is being throttled. Error code : 50002",
//!   Microsoft's "Throttling operations on Azure Service Bus").
//! - Revoked tokens: a `$management` request whose token the service no longer honours is
//!   answered 401 (Python `mgmt_handlers.default`: 401 → `ServiceBusAuthenticationError`).
//! - `amqp:internal-error` repeated on one connection: issue 29 item 9 (docs/servicebus-amqp.md
//!   records Go recovering the connection for internal and unknown errors).

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use sb_amqp::{AmqpError, Connection, condition};
use tokio::time::Instant;

use super::faults::ManagementFault;
use super::grants::Grants;
use super::wire_error;

/// The service's text for a throttled request.
pub(crate) const THROTTLED: &str = "The request was terminated because the entity is being throttled. Error code : 50002. Sub error : 102 (injected by the emulator's throttling).";

/// What [`crate::Emulator::stats`] counts since the emulator started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EmulatorStats {
    /// Client connections accepted (handshake done).
    pub connections: u64,
    /// AMQP sessions that attached at least one link.
    pub sessions: u64,
    /// `$cbs` request links attached (one per request/response pair).
    pub cbs_links: u64,
    /// `<entity>/$management` request links attached (one per request/response pair).
    pub management_links: u64,
    /// Entity links attached (senders and receivers).
    pub entity_links: u64,
}

/// One settlement attempt as the emulator saw it: on a link (a disposition) or by lock token
/// on `$management`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SettlementAttempt {
    /// When it arrived.
    pub at: SystemTime,
    /// True when it was answered busy (throttled or `--fault busy-settle`).
    pub busy: bool,
}

/// How a receive link is detached a while after its attach
/// ([`crate::Emulator::detach_new_receive_links`], [`crate::Emulator::force_detach_new_receive_links`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReceiverDetach {
    /// `amqp:internal-error`: a service node in trouble (protocol3 F6).
    InternalError,
    /// `amqp:link:detach-forced`, "InnerMessageReceiver was closed": the service closed its
    /// side of the link (a gateway or broker node moved).
    Forced,
}

/// One live client connection.
#[derive(Debug)]
pub(crate) struct LiveConnection {
    id: u64,
    connection: Connection,
    /// Its put-token grants, to revoke ([`Survival::revoke_token`]).
    grants: Weak<Grants>,
    /// Channels whose sessions attached links.
    channels: Mutex<BTreeSet<u16>>,
    /// Every attach on it is refused with `amqp:internal-error`.
    sticky_internal_error: AtomicBool,
}

impl LiveConnection {
    /// Records that the session on `channel` attached a link; true for its first link.
    pub(crate) fn link_on(&self, channel: u16) -> bool {
        self.channels
            .lock()
            .is_ok_and(|mut channels| channels.insert(channel))
    }

    /// Why an attach on this connection is refused, when it is stuck on internal errors.
    pub(crate) fn attach_refusal(&self) -> Option<AmqpError> {
        self.sticky_internal_error
            .load(Ordering::Acquire)
            .then(internal_error)
    }

    /// Ends the session on `channel` (as the service may, with the connection alive).
    pub(crate) async fn end_session(&self, channel: u16) {
        if let Ok(mut channels) = self.channels.lock() {
            channels.remove(&channel);
        }
        let error = wire_error(
            condition::INTERNAL_ERROR,
            Some("The session was ended by the service (injected by the emulator).".to_owned()),
        );
        // A connection that went meanwhile has no session left to end.
        let _ = self.connection.end_session(channel, Some(error)).await;
    }
}

fn internal_error() -> AmqpError {
    wire_error(
        condition::INTERNAL_ERROR,
        Some("The service was unable to process the request; please retry the operation (injected by the emulator: this connection is stuck).".to_owned()),
    )
}

/// The injected connection-level faults and the counters, shared by every connection.
#[derive(Debug, Default)]
pub(crate) struct Survival {
    next_id: AtomicU64,
    connections: Mutex<Vec<Arc<LiveConnection>>>,
    /// Statuses to answer the next put-tokens with, in order.
    put_token_refusals: Mutex<VecDeque<i32>>,
    /// Throttled until then.
    throttled_until: Mutex<Option<Instant>>,
    /// `--throttle SECS`: throttle this long from the first settlement attempt.
    throttle_on_first_settlement: Mutex<Option<Duration>>,
    attempts: Mutex<Vec<SettlementAttempt>>,
    /// How the next management API (HTTP) requests are answered instead of handled.
    management_faults: Mutex<VecDeque<ManagementFault>>,
    /// How the next `$management` node (AMQP) requests are answered instead of handled.
    node_faults: Mutex<VecDeque<ManagementFault>>,
    /// Link dispositions still to answer `rejected{com.microsoft:timeout}`.
    settlement_timeouts: AtomicUsize,
    /// Link dispositions still to leave unanswered (and unapplied).
    unanswered_settlements: AtomicUsize,
    /// Every receive link attached from now on is detached this long after its attach, so.
    detach_new_receivers_after: Mutex<Option<(Duration, ReceiverDetach)>>,
    sessions: AtomicU64,
    connections_opened: AtomicU64,
    cbs_links: AtomicU64,
    management_links: AtomicU64,
    entity_links: AtomicU64,
}

/// Which kind of link was attached, for the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attached {
    Cbs,
    Management,
    Entity,
}

impl Survival {
    pub(crate) fn new(throttle: Option<Duration>) -> Self {
        Survival {
            throttle_on_first_settlement: Mutex::new(throttle),
            ..Survival::default()
        }
    }

    /// Registers an accepted connection; it leaves the list when [`Survival::closed`].
    pub(crate) fn opened(
        &self,
        connection: Connection,
        grants: &Arc<Grants>,
    ) -> Arc<LiveConnection> {
        self.connections_opened.fetch_add(1, Ordering::Relaxed);
        let live = Arc::new(LiveConnection {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            connection,
            grants: Arc::downgrade(grants),
            channels: Mutex::default(),
            sticky_internal_error: AtomicBool::new(false),
        });
        if let Ok(mut list) = self.connections.lock() {
            list.push(live.clone());
        }
        live
    }

    pub(crate) fn closed(&self, live: &LiveConnection) {
        if let Ok(mut list) = self.connections.lock() {
            list.retain(|c| c.id != live.id);
        }
    }

    /// Counts an attached link (a request/response pair counts once, by its request link).
    pub(crate) fn attached(&self, live: &LiveConnection, channel: u16, kind: Option<Attached>) {
        if live.link_on(channel) {
            self.sessions.fetch_add(1, Ordering::Relaxed);
        }
        let counter = match kind {
            Some(Attached::Cbs) => &self.cbs_links,
            Some(Attached::Management) => &self.management_links,
            Some(Attached::Entity) => &self.entity_links,
            None => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn stats(&self) -> EmulatorStats {
        EmulatorStats {
            connections: self.connections_opened.load(Ordering::Relaxed),
            sessions: self.sessions.load(Ordering::Relaxed),
            cbs_links: self.cbs_links.load(Ordering::Relaxed),
            management_links: self.management_links.load(Ordering::Relaxed),
            entity_links: self.entity_links.load(Ordering::Relaxed),
        }
    }

    fn live(&self) -> Vec<Arc<LiveConnection>> {
        self.connections
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Ends every session with links on every live connection; returns how many.
    pub(crate) async fn end_sessions(&self) -> usize {
        let mut ended = 0;
        for live in self.live() {
            let channels: Vec<u16> = live
                .channels
                .lock()
                .map(|c| c.iter().copied().collect())
                .unwrap_or_default();
            for channel in channels {
                live.end_session(channel).await;
                ended += 1;
            }
        }
        ended
    }

    /// Answers the next `times` put-tokens with `status`.
    pub(crate) fn refuse_put_tokens(&self, times: usize, status: i32) {
        if let Ok(mut queue) = self.put_token_refusals.lock() {
            queue.extend(std::iter::repeat_n(status, times));
        }
    }

    /// The status to answer this put-token with instead of handling it, if any.
    pub(crate) fn put_token_refusal(&self) -> Option<i32> {
        self.put_token_refusals.lock().ok()?.pop_front()
    }

    /// Throttles the namespace for `duration` from now.
    pub(crate) fn throttle(&self, duration: Duration) {
        if let Ok(mut until) = self.throttled_until.lock() {
            *until = Some(Instant::now() + duration);
        }
    }

    /// Throttles the namespace for `duration` from the next settlement attempt on.
    pub(crate) fn throttle_from_next_settlement(&self, duration: Duration) {
        if let Ok(mut armed) = self.throttle_on_first_settlement.lock() {
            *armed = Some(duration);
        }
    }

    /// True while the namespace is throttled.
    pub(crate) fn is_throttled(&self) -> bool {
        self.throttled_until
            .lock()
            .is_ok_and(|until| until.is_some_and(|u| Instant::now() < u))
    }

    /// Records a settlement attempt: arms `--throttle` on the first one, and answers whether
    /// it must be refused as busy (`fault_busy`: `--fault busy-settle` drew it).
    pub(crate) fn settlement(&self, fault_busy: bool) -> bool {
        if let Some(duration) = self
            .throttle_on_first_settlement
            .lock()
            .ok()
            .and_then(|mut armed| armed.take())
        {
            tracing::info!(?duration, "Throttling the namespace (--throttle).");
            self.throttle(duration);
        }
        let busy = fault_busy || self.is_throttled();
        if let Ok(mut attempts) = self.attempts.lock() {
            attempts.push(SettlementAttempt {
                at: SystemTime::now(),
                busy,
            });
        }
        busy
    }

    pub(crate) fn settlement_attempts(&self) -> Vec<SettlementAttempt> {
        self.attempts.lock().map(|a| a.clone()).unwrap_or_default()
    }

    /// Forgets every grant of `audience` on every connection: the next request for it is
    /// refused as unauthorized until a fresh put-token. Returns how many grants went.
    pub(crate) fn revoke_token(&self, audience: &str) -> usize {
        self.live()
            .iter()
            .filter_map(|live| live.grants.upgrade())
            .map(|grants| grants.revoke(audience))
            .sum()
    }

    /// Answers the next management API requests with `faults`, one each, in order.
    pub(crate) fn fail_management_requests(
        &self,
        faults: impl IntoIterator<Item = ManagementFault>,
    ) {
        if let Ok(mut queue) = self.management_faults.lock() {
            queue.extend(faults);
        }
    }

    /// How to answer this management API request instead of handling it, if at all.
    pub(crate) fn management_fault(&self) -> Option<ManagementFault> {
        self.management_faults.lock().ok()?.pop_front()
    }

    /// Answers the next `$management` node (AMQP) requests with `faults`, one each, in order.
    pub(crate) fn fail_node_requests(&self, faults: impl IntoIterator<Item = ManagementFault>) {
        if let Ok(mut queue) = self.node_faults.lock() {
            queue.extend(faults);
        }
    }

    /// How to answer this `$management` node request instead of handling it, if at all.
    pub(crate) fn node_fault(&self) -> Option<ManagementFault> {
        self.node_faults.lock().ok()?.pop_front()
    }

    /// Leaves the next `times` link dispositions unanswered and unapplied (added to those
    /// still pending).
    pub(crate) fn leave_settlements_unanswered(&self, times: usize) {
        self.unanswered_settlements
            .fetch_add(times, Ordering::AcqRel);
    }

    /// True when this link disposition is to be left unanswered (one fewer left).
    pub(crate) fn settlement_unanswered(&self) -> bool {
        self.unanswered_settlements
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Answers the next `times` link dispositions `rejected{com.microsoft:timeout}`, unapplied.
    pub(crate) fn time_out_settlements(&self, times: usize) {
        self.settlement_timeouts.store(times, Ordering::Release);
    }

    /// True when this link disposition is to be answered with a timeout (one fewer left).
    pub(crate) fn settlement_timed_out(&self) -> bool {
        self.settlement_timeouts
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok()
    }

    /// Detaches every receive link attached from now on `after` its attach, `how` (`None`:
    /// no longer).
    pub(crate) fn detach_new_receive_links(&self, after: Option<Duration>, how: ReceiverDetach) {
        if let Ok(mut armed) = self.detach_new_receivers_after.lock() {
            *armed = after.map(|after| (after, how));
        }
    }

    /// How long after its attach a new receive link is detached, and how.
    pub(crate) fn new_receiver_detach(&self) -> Option<(Duration, ReceiverDetach)> {
        self.detach_new_receivers_after.lock().ok().and_then(|a| *a)
    }

    /// Sticks every live connection on `amqp:internal-error`: each attach on it is refused
    /// with it from now on. Returns how many connections.
    pub(crate) fn stick_internal_error(&self) -> usize {
        let live = self.live();
        for connection in &live {
            connection
                .sticky_internal_error
                .store(true, Ordering::Release);
        }
        live.len()
    }
}
