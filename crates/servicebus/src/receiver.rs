//! [`ServiceBusReceiver`]: a peek-lock receive link, re-attached after the service detaches
//! it; deliveries whose message is unusable are handed out marked as such.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sb_amqp::types::definitions::{ReceiverSettleMode, SenderSettleMode};
use sb_amqp::{Outcome, ReceiverOptions, unique_name};
use tokio::sync::Mutex;

use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::amqp_message::{Received, from_amqp, undecodable};
use super::client::management_node;
use super::delivery::ServiceBusDelivery;
use super::error::{Recovery, recovery};
use super::lock_clock::LockClock;
use super::receive_link::{LinkShared, ReceiveLink, ReceiverInner};
use super::session_lock::{SESSION_LINK_GONE, SessionRequest, session_refusal};
use super::telemetry::{EntityNames, EntityTelemetry, Kind};
use super::window::{SETTLING_FACTOR, Sizer, WindowState};
use super::{ServiceBusClient, ServiceBusError};
use crate::ReceiveError;
use crate::names::{error, span};
use crate::propagation::producer_context;

/// How long [`ServiceBusReceiver::close`] waits for the broker.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// A receive link that delivered nothing for this long is replaced by a fresh one: the
/// service can lose a link without a detach, and a link waiting on credit it already has
/// shows nothing wrong. Go `azservicebus` does the same after 5 minutes
/// (Azure/azure-sdk-for-go#19465, "Idle timer": "if we don't receive anything for that time
/// we'll just restart the link, which is a pretty cheap operation"); below the service's own
/// 10-minute idle detach, so a healthy idle link is recycled before the service detaches it.
pub const DEFAULT_LINK_IDLE_GUARD: Duration = Duration::from_secs(300);

/// Pipelined credit is topped up once this fraction of the capacity is missing. The credit on
/// the link is what the capacity leaves beside the deliveries in hand (handled, queued, being
/// settled), and it is what bounds the rate at a distance: rate ≈ link credit ÷ round trip.
/// Waiting for a quarter to be missing left the link on average an eighth of the capacity
/// short; the phase trace at a 10 ms round trip (`sb_inbox::pipeline`, concurrency 16,
/// capacity 64) showed 36 of 64 held, the receive loop waiting on an empty link, and 0.74 of
/// the local rate. A sixteenth costs one `flow` frame per 4 deliveries at capacity 64.
const TOP_UP_FRACTION: u32 = 16;

/// A peek-lock receiver (the SDKs' `ServiceBusReceiver` in peek-lock mode).
///
/// Credit follows demand: each [`ServiceBusReceiver::receive_message`] call grants one
/// message, plus up to `prefetch` more (not renewed while they wait on the link). [`ServiceBusReceiver::with_capacity`] pipelines instead: credit is
/// kept so that deliveries in flight on the link plus those handed out and not yet settled
/// reach the capacity, so the broker's distance costs one round trip per capacity's worth of
/// deliveries rather than one per delivery. A delivery whose message is unusable (undecodable, a
/// string id posing as another AMQP type's) is handed out like any other, marked by
/// [`ServiceBusDelivery::unusable`]: the caller settles it. When the service detaches the link (idle,
/// busy, token expired, …) during a receive, that receive reports a transient error and the
/// next one re-attaches on the same connection; a link detached between receives is replaced
/// before the next one (after handing out what it still had queued). Deliveries of the lost
/// link are settled through `$management` by their lock tokens, so their locks, not the link,
/// decide.
#[derive(Debug, Clone)]
pub struct ServiceBusReceiver {
    inner: Arc<ReceiverInner>,
}

// Made here rather than in `client`: the receiver holds a client to reach its connection, so
// the client does not import its links (no import circle between the two).
impl ServiceBusClient {
    /// A peek-lock receiver on `entity` (a queue, `TOPIC/Subscriptions/SUB`, or either's
    /// `/$DeadLetterQueue`), holding at most `prefetch` deliveries beyond those asked for.
    /// Deliveries waiting on the link are not renewed: a caller that renews the locks of what
    /// it holds passes 0 and pipelines with [`ServiceBusReceiver::with_capacity`].
    pub fn receiver(&self, entity: &str, prefetch: u32) -> ServiceBusReceiver {
        ServiceBusReceiver::new(self.clone(), entity, prefetch)
    }
}

impl ServiceBusReceiver {
    pub(crate) fn new(client: ServiceBusClient, entity: &str, prefetch: u32) -> Self {
        ServiceBusReceiver {
            inner: Arc::new(ReceiverInner {
                telemetry: EntityTelemetry::new(entity, client.host()),
                client,
                entity: entity.to_owned(),
                prefetch,
                capacity: AtomicU32::new(0),
                in_hand: AtomicUsize::new(0),
                settling: AtomicUsize::new(0),
                freed: tokio::sync::Notify::new(),
                sizer: StdMutex::new(None),
                link: Mutex::new(None),
                attached: AtomicBool::new(false),
                reauthorize: AtomicBool::new(false),
                session: std::sync::OnceLock::new(),
                current_link: StdMutex::new(None),
                current_status: StdMutex::new(None),
                idle_guard_ms: AtomicU64::new(millis(DEFAULT_LINK_IDLE_GUARD)),
                lock_clock: LockClock::default(),
            }),
        }
    }

    /// Pipelines the receive link: keeps credit so that the deliveries on the link (granted,
    /// in transit, queued) plus those handed out and not yet being settled reach `capacity`,
    /// topping it up as deliveries are taken and as their settlements start, and never beyond.
    /// A delivery whose settlement is under way leaves the window (it waits only on the
    /// network); those are bounded apart, at [`SETTLING_FACTOR`] × the window: beyond that no
    /// credit is granted until settlements are answered. A caller that renews the locks of
    /// what it holds passes the most it holds: every delivery then has a slot waiting for it,
    /// and its lock is kept from receipt. The AMQP spec lets a receiver keep several credits
    /// outstanding (AMQP 1.0 §2.6.7 flow control); the SDKs' prefetch does the same (.NET
    /// `ServiceBusReceiverOptions.PrefetchCount`, Python `prefetch_count`).
    #[must_use]
    pub fn with_capacity(self, capacity: u32) -> Self {
        self.inner.capacity.store(capacity, Ordering::Release);
        self
    }

    /// With [`ServiceBusReceiver::with_capacity`]: the window sizes itself between `base`
    /// (what the caller handles at once) and the capacity, from the broker's measured round
    /// trip and the rate deliveries are taken at (see [`crate::window`]): a broker far away
    /// gets more in flight without a setting.
    #[must_use]
    pub fn with_auto_window(self, base: u32) -> Self {
        *self
            .inner
            .sizer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Sizer::new(base));
        self
    }

    /// The window in force now (deliveries in flight on the link and in hand), with the
    /// measured round trip and rate; `None` unless pipelined.
    pub fn window(&self) -> Option<crate::window::WindowSnapshot> {
        let capacity = self.inner.capacity.load(Ordering::Acquire);
        (capacity > 0).then(|| {
            let state = self.inner.window_state(capacity);
            crate::window::WindowSnapshot {
                window: state.window,
                rtt: state.rtt,
                rate: state.rate,
                settling: self.inner.settling.load(Ordering::Acquire),
            }
        })
    }

    /// Replaces a receive link that delivered nothing for `guard` (default
    /// [`DEFAULT_LINK_IDLE_GUARD`]) by a fresh one; `Duration::ZERO` never does. Session
    /// receivers are not guarded: their link holds the session lock and ends with it.
    #[must_use]
    pub fn with_link_idle_guard(self, guard: Duration) -> Self {
        self.inner
            .idle_guard_ms
            .store(millis(guard), Ordering::Relaxed);
        self
    }

    pub(super) fn inner(&self) -> &Arc<ReceiverInner> {
        &self.inner
    }

    /// The entity this receiver reads.
    pub fn entity(&self) -> &str {
        &self.inner.entity
    }

    /// True while the receive link is attached (false before the first receive, once the
    /// service detached it, and while it re-attaches after a failure).
    pub fn is_attached(&self) -> bool {
        self.inner.attached.load(Ordering::Acquire)
            && self
                .inner
                .current_status
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .as_ref()
                .is_some_and(sb_amqp::LinkStatus::is_attached)
    }

    async fn attach(&self) -> Result<ReceiveLink, ReceiveError> {
        self.attach_with(None).await
    }

    /// Attaches a receive link; `session` asks for a message session (see
    /// [`SessionRequest`]), whose accepted id and lock the link's attach reply carries.
    pub(super) async fn attach_with(
        &self,
        session: Option<&SessionRequest>,
    ) -> Result<ReceiveLink, ReceiveError> {
        let inner = &self.inner;
        let client = &inner.client;
        let fresh = inner.reauthorize.load(Ordering::Acquire);
        client.busy().wait_out().await;
        let conn = client.connection().await.map_err(transient)?;
        client
            .authorize(&conn, &inner.entity, fresh)
            .await
            .map_err(|e| self.refused(e))?;
        // Renewals need the node's token too (the service checks it on the management link).
        client
            .authorize(&conn, &management_node(&inner.entity), fresh)
            .await
            .map_err(|e| self.refused(e))?;
        let name = unique_name("sb-servicebus-receiver");
        let mut options = ReceiverOptions::new(name.clone(), inner.entity.clone())
            .rcv_settle_mode(ReceiverSettleMode::Second)
            .snd_settle_mode(SenderSettleMode::Unsettled)
            .max_message_size(super::limits::MAX_RECEIVED_MESSAGE_SIZE);
        let mut wait = client.timeout();
        if let Some(session) = session {
            options = session.apply(options);
            wait += session.wait;
        }
        let receiver = tokio::time::timeout(wait, conn.session.attach_receiver(options))
            .await
            .map_err(|_| {
                ReceiveError::Transient(ServiceBusError::Timeout(
                    "the service did not answer the attach in time".into(),
                ))
            })?
            .map_err(|e| {
                conn.observe(&e);
                match session {
                    Some(_) => session_refusal(&e).unwrap_or_else(|| self.failed(&e, fresh)),
                    None => self.failed(&e, fresh),
                }
            })?;
        // An attach that works says nothing of links detached right after it (F6): only a
        // delivery counts as the link's healthy answer.
        let prefetched = inner.prefetch > 0 && inner.capacity.load(Ordering::Acquire) == 0;
        if prefetched {
            receiver
                .add_credit(inner.prefetch)
                .await
                .map_err(|e| self.failed(&e, fresh))?;
        }
        inner.reauthorize.store(false, Ordering::Release);
        Ok(ReceiveLink {
            shared: Arc::new(LinkShared {
                settler: receiver.settler(),
                name,
                gone: AtomicBool::new(false),
            }),
            receiver,
            conn: Arc::downgrade(&conn),
            granted: false,
            prefetched,
            pending: 0,
        })
    }

    /// Classifies a link or connection failure; an unauthorized one arms a re-attach with a
    /// fresh token, unless that was this attempt already.
    fn failed(&self, error: &sb_amqp::Error, fresh: bool) -> ReceiveError {
        if error.condition().is_some_and(super::error::is_server_busy) {
            self.inner.client.busy().set();
        }
        let cause = ServiceBusError::from_amqp(error);
        match recovery(error) {
            Recovery::Link | Recovery::Connection => ReceiveError::Transient(cause),
            Recovery::Reauthorize if !fresh => {
                self.inner.reauthorize.store(true, Ordering::Release);
                ReceiveError::Transient(cause)
            }
            Recovery::Reauthorize | Recovery::Fatal => ReceiveError::Permanent(cause),
        }
    }

    /// A `$cbs` failure. A refused put-token is fatal: the provider made that token just now;
    /// a busy `$cbs` holds the client as any busy answer does.
    fn refused(&self, error: ServiceBusError) -> ReceiveError {
        if let ServiceBusError::Broker { condition, .. } = &error
            && super::error::is_server_busy(condition)
        {
            self.inner.client.busy().set();
        }
        if error.is_transient() {
            ReceiveError::Transient(error)
        } else {
            ReceiveError::Permanent(error)
        }
    }

    /// Connects, authorizes and attaches the receive link now, as the first receive would:
    /// a bounded wait for messages that follows counts only the broker's silence, not the
    /// connection's setup (which against a real namespace can take seconds).
    ///
    /// # Errors
    /// As [`ServiceBusReceiver::receive_message`]: transient for connection failures,
    /// permanent for an unknown entity or refused rights.
    pub async fn attach_now(&self) -> Result<(), ReceiveError> {
        let mut guard = self.inner.link.lock().await;
        self.attach_into(&mut guard).await
    }

    /// Attaches a link into `slot` unless one is there.
    async fn attach_into(&self, slot: &mut Option<ReceiveLink>) -> Result<(), ReceiveError> {
        if slot.is_none() {
            let link = self.attach().await?;
            self.inner.set_current(&link);
            *slot = Some(link);
        }
        Ok(())
    }

    /// Returns every delivery received but not handed out to the broker (released: no delivery
    /// count), then detaches. Call on shutdown.
    pub async fn close(&self) {
        let Some(link) = self.inner.link.lock().await.take() else {
            return;
        };
        self.inner.set_current_link(None);
        // Shutdown must not hang on a broker that does not answer: after the bound, the locks
        // of anything prefetched simply run out.
        let closing = async {
            if link.receiver.drain().await.is_ok() {
                while let Ok(Some(delivery)) = link.receiver.try_recv() {
                    // Best effort: the lock runs out anyway if the release is lost.
                    let _ = link.receiver.release(&delivery).await;
                }
            }
            let _ = link.receiver.detach().await;
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, closing).await.is_err() {
            tracing::warn!(entity = %self.inner.entity, "Receiver close timed out; dropping the link.");
        }
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl ReceiverInner {
    /// The name of the receive link attached now, if any.
    pub(super) fn current_link(&self) -> Option<String> {
        self.current_link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records `link` as the one attached now.
    pub(super) fn set_current(&self, link: &ReceiveLink) {
        *self
            .current_status
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(link.receiver.status());
        self.set_current_link(Some(&link.shared.name));
    }

    /// Records the link attached now (`None`: none).
    pub(super) fn set_current_link(&self, name: Option<&str>) {
        if name.is_none() {
            *self
                .current_status
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        *self
            .current_link
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = name.map(str::to_owned);
        self.attached.store(name.is_some(), Ordering::Release);
    }

    /// The window and what sized it: the sizer's under `capacity`, else `capacity`.
    fn window_state(&self, capacity: u32) -> WindowState {
        let sizer = self
            .sizer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match sizer.as_ref() {
            Some(sizer) => sizer.state(capacity),
            None => WindowState {
                window: capacity,
                rtt: None,
                rate: 0.0,
            },
        }
    }

    /// A broker round trip measured on this receiver's link.
    pub(super) fn round_trip(&self, sample: Duration) {
        if let Some(sizer) = self
            .sizer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            sizer.round_trip(sample);
        }
    }

    /// A receive waited `waited` on a link with credit (see [`Sizer::waited`]).
    fn waited(&self, waited: Duration) {
        let in_hand = self.in_hand.load(Ordering::Acquire);
        if let Some(sizer) = self
            .sizer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
        {
            sizer.waited(waited, in_hand);
        }
    }

    /// A delivery handed out: counts towards the rate the window is sized for.
    fn taken(&self, bytes: usize, lock_left: Option<Duration>, capacity: u32) {
        let report = self
            .sizer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_mut()
            .and_then(|sizer| sizer.taken(tokio::time::Instant::now(), bytes, lock_left, capacity));
        if let Some(state) = report {
            self.telemetry.window(state.window, state.rtt);
            // The client's own target (it names nothing of the inbox); the bench's `--trace`
            // turns it on beside the runtime's `sb_inbox::pipeline`.
            tracing::debug!(
                target: "sb_servicebus::window",
                entity = %self.entity,
                window = state.window,
                rtt_ms = state.rtt.map_or(0.0, |rtt| rtt.as_secs_f64() * 1000.0),
                rate = state.rate,
                in_hand = self.in_hand.load(Ordering::Relaxed),
                settling = self.settling.load(Ordering::Relaxed),
                "Receive window."
            );
        }
    }

    /// How long a non-session link may deliver nothing before it is replaced.
    fn idle_guard(&self) -> Option<Duration> {
        if self.session.get().is_some() {
            return None;
        }
        match self.idle_guard_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }
}

/// How much credit a receive may grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Credit {
    /// The receiver's window: its capacity when pipelined, else one plus the prefetch.
    Window,
    /// One delivery only ([`ServiceBusReceiver::receive_one`]).
    One,
}

/// What [`ServiceBusReceiver::replace_detached`] found on a detached link.
enum Detached {
    /// A delivery it had queued before the detach.
    Queued(sb_amqp::Delivery),
    /// A detach no retry clears (entity gone, rights refused).
    Fatal(ReceiveError),
    /// Nothing left on it: attach a new one.
    Replace,
}

fn transient(error: ServiceBusError) -> ReceiveError {
    ReceiveError::Transient(error)
}

impl ServiceBusReceiver {
    /// The entity as telemetry names it (destination, subscription, namespace host).
    pub fn names(&self) -> &EntityNames {
        self.inner.telemetry.names()
    }

    /// Waits for the next delivery, under a `receive {entity}` client span linked to the
    /// message's producer (its `traceparent` or `Diagnostic-Id`). A link idle past the guard
    /// is replaced meanwhile. A delivery whose message is unusable comes back with
    /// [`ServiceBusDelivery::unusable`] set, for the caller to settle.
    ///
    /// # Errors
    /// [`ReceiveError::Transient`] when the link or connection failed (the next receive
    /// re-attaches); [`ReceiveError::Permanent`] for an unknown entity or refused rights.
    pub async fn receive_message(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        self.receive_with(Credit::Window).await
    }

    /// As [`ServiceBusReceiver::receive_message`], asking the broker for this one delivery
    /// only: a pipelined receiver grants one credit (when none is outstanding) instead of
    /// topping the link up to its capacity, a plain one grants its one credit without the
    /// prefetch. For a caller that will take a single delivery and then pause (a kill switch's
    /// trial): a full window would have the broker lock deliveries that are only released again
    /// (or, should the drain fail, left to expire, each then counted against the max delivery
    /// count: the lock of a prefetched message runs from when it was prefetched, "Prefetch Azure
    /// Service Bus messages", learn.microsoft.com/azure/service-bus-messaging/service-bus-prefetch).
    ///
    /// # Errors
    /// As [`ServiceBusReceiver::receive_message`].
    pub async fn receive_one(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        self.receive_with(Credit::One).await
    }

    async fn receive_with(
        &self,
        credit: Credit,
    ) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        let operation = self.inner.telemetry.start(span::RECEIVE, Kind::Receive);
        let received = self.next(credit).instrument(operation.span.clone()).await;
        match &received {
            Ok(Some(delivery)) => {
                if let Some(producer) = producer_context(&delivery.message().application_properties)
                {
                    operation.span.add_link(producer);
                }
                operation.received();
            }
            Ok(None) => operation.end(None),
            Err(ReceiveError::Transient(_)) => operation.end(Some(error::TRANSIENT)),
            Err(_) => operation.end(Some(error::REFUSED)),
        }
        received
    }

    /// The next delivery (a lock that ran out on the link is released and skipped).
    pub(super) async fn next(
        &self,
        credit: Credit,
    ) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        loop {
            if let Some(delivery) = self.next_or_refused(credit).await? {
                return Ok(Some(delivery));
            }
        }
    }

    /// The next delivery, or `None` after releasing one whose lock ran out on the link or
    /// replacing a link idle past the guard. The steps: take the link (attaching one), grant
    /// credit and wait for a transfer, then either hand the delivery out or deal with an idle
    /// or failed link.
    async fn next_or_refused(
        &self,
        credit: Credit,
    ) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        let mut guard = self.inner.link.lock().await;
        let capacity = self.inner.capacity.load(Ordering::Acquire);
        if let Some(answer) = self.detached_meanwhile(&mut guard, capacity).await {
            return answer;
        }
        self.ready_link(&mut guard).await?;
        let Some(link) = guard.as_mut() else {
            return Err(ReceiveError::Transient(ServiceBusError::Link(
                "no receive link".to_owned(),
            )));
        };
        let idle_guard = self.inner.idle_guard();
        match self
            .take_from_link(link, capacity, idle_guard, credit)
            .await
        {
            Ok(Some(delivery)) => {
                if let Some(conn) = link.conn.upgrade() {
                    conn.observe_healthy(super::scope::LinkKind::Entity);
                }
                self.hand_out(link, &delivery, capacity).await
            }
            Ok(None) => {
                self.replace_idle_link(guard, idle_guard).await;
                // Not an error for the caller: the caller's receive goes on, on a fresh link.
                Ok(None)
            }
            Err(error) => Err(self.drop_failed_link(&mut guard, &error)),
        }
    }

    /// F8: a link the service detached while nobody was receiving (idle for 10 minutes, say,
    /// while every slot was busy) is replaced before this receive, not after a failed one and
    /// the caller's backoff: azure-amqp reuses a cached link only while it is open
    /// (`FaultTolerantAmqpObject.TryGetOpenedObject`), pyamqp checks a link's state before
    /// using it (`Link._check_if_closed`). `Some` when the receive ends here: a delivery the
    /// link had queued, or a detach no retry clears.
    async fn detached_meanwhile(
        &self,
        slot: &mut Option<ReceiveLink>,
        capacity: u32,
    ) -> Option<Result<Option<ServiceBusDelivery>, ReceiveError>> {
        if self.inner.session.get().is_some() {
            return None;
        }
        let stale = slot.as_mut().filter(|link| !link.receiver.is_attached())?;
        match self.replace_detached(stale) {
            // Not a healthy answer of the link (it is gone): the connection's internal-error
            // count is left as it is (F6).
            Detached::Queued(delivery) => Some(self.hand_out(stale, &delivery, capacity).await),
            Detached::Fatal(error) => {
                *slot = None;
                self.inner.set_current_link(None);
                Some(Err(error))
            }
            Detached::Replace => {
                tracing::debug!(entity = %self.inner.entity, "Receive link detached meanwhile; attaching a new one.");
                *slot = None;
                self.inner.set_current_link(None);
                None
            }
        }
    }

    /// Attaches a link into `slot` unless one is there; a session receiver's lost link is
    /// not replaced (the session lock went with it).
    async fn ready_link(&self, slot: &mut Option<ReceiveLink>) -> Result<(), ReceiveError> {
        if slot.is_none() && self.inner.session.get().is_some() {
            return Err(ReceiveError::Transient(ServiceBusError::Link(
                SESSION_LINK_GONE.to_owned(),
            )));
        }
        self.attach_into(slot).await
    }

    /// Grants the credit this receive needs (pipelined: the window's top-up, or exactly one
    /// for `Credit::One`; else the prefetch after a withdraw and one credit per receive), then
    /// waits for a transfer; `None` when the link stayed idle past `idle_guard`.
    async fn take_from_link(
        &self,
        link: &mut ReceiveLink,
        capacity: u32,
        idle_guard: Option<Duration>,
        credit: Credit,
    ) -> Result<Option<sb_amqp::Delivery>, sb_amqp::Error> {
        if capacity > 0 && credit == Credit::One {
            // Credit still outstanding brings a delivery as it is; else exactly one.
            if link.pending == 0 {
                link.receiver.add_credit(1).await?;
                link.pending = 1;
            }
        } else if capacity > 0 {
            self.top_up(link, capacity).await?;
        } else if credit == Credit::Window && !link.prefetched && self.inner.prefetch > 0 {
            // Resumed after a withdraw: the prefetch is granted again (with this
            // receive's credit, as at attach).
            link.receiver.add_credit(self.inner.prefetch).await?;
            link.prefetched = true;
        }
        if capacity == 0 && !link.granted {
            // One credit per outstanding receive; a receive cancelled after granting leaves
            // its credit for the next call instead of granting again.
            link.receiver.add_credit(1).await?;
            link.granted = true;
        }
        let waiting = tokio::time::Instant::now();
        let delivery = match idle_guard {
            Some(idle) => match tokio::time::timeout(idle, link.receiver.recv()).await {
                Ok(delivery) => delivery?,
                Err(_) => {
                    // Idle past the guard: the link is replaced, and the quiet spell is no
                    // rate sample either (the window stays for the traffic that resumes).
                    if capacity > 0 {
                        self.inner.waited(idle);
                    }
                    return Ok(None);
                }
            },
            None => link.receiver.recv().await?,
        };
        if capacity > 0 {
            link.pending = link.pending.saturating_sub(1);
            // How long the link, with credit, had nothing: an idle gap is not a rate sample.
            self.inner.waited(waiting.elapsed());
        } else {
            link.granted = false;
        }
        Ok(Some(delivery))
    }

    /// Idle past the guard: the link may be lost without a detach. Detaching costs little
    /// (credit is granted again on the fresh link); what it delivered meanwhile stays
    /// settleable by lock token.
    async fn replace_idle_link(
        &self,
        mut guard: tokio::sync::MutexGuard<'_, Option<ReceiveLink>>,
        idle_guard: Option<Duration>,
    ) {
        let stale = guard.take();
        if let Some(stale) = &stale {
            stale.shared.gone.store(true, Ordering::Release);
        }
        self.inner.set_current_link(None);
        drop(guard);
        tracing::info!(entity = %self.inner.entity, idle = ?idle_guard, "Receive link idle past the guard; replacing it.");
        if let Some(stale) = stale {
            // Bounded: a lost link may never answer the detach.
            let detach = stale.receiver.detach();
            if tokio::time::timeout(CLOSE_TIMEOUT, detach).await.is_err() {
                tracing::debug!(entity = %self.inner.entity, "Idle link's detach unanswered; dropped.");
            }
        }
    }

    /// Only this link is gone (the connection too for a connection-level error): the next
    /// receive, after the caller's backoff, attaches anew.
    fn drop_failed_link(
        &self,
        slot: &mut Option<ReceiveLink>,
        error: &sb_amqp::Error,
    ) -> ReceiveError {
        if let Some(link) = slot.take() {
            link.shared.gone.store(true, Ordering::Release);
            if let Some(conn) = link.conn.upgrade() {
                conn.observe(error);
            }
        }
        self.inner.set_current_link(None);
        tracing::warn!(entity = %self.inner.entity, %error, "Receive link failed; re-attaching.");
        self.failed(error, false)
    }

    /// What to do with a link found detached before a receive: hand out what it still had
    /// queued (its locks, not the link, decide: settled by lock token), give up when the
    /// detach is one no retry clears, else replace it. Marks the link gone (its deliveries
    /// settle through `$management`) and tells the connection of the detach.
    fn replace_detached(&self, link: &mut ReceiveLink) -> Detached {
        link.shared.gone.store(true, Ordering::Release);
        match link.receiver.try_recv() {
            Ok(Some(delivery)) => {
                if self.inner.capacity.load(Ordering::Acquire) > 0 {
                    link.pending = link.pending.saturating_sub(1);
                } else {
                    link.granted = false;
                }
                Detached::Queued(delivery)
            }
            Ok(None) => Detached::Replace,
            Err(error) => {
                if let Some(conn) = link.conn.upgrade() {
                    conn.observe(&error);
                }
                // Classified as a failed receive would be (a busy detach pauses the client,
                // an unauthorized one arms a fresh token for the attach that follows).
                match self.failed(&error, false) {
                    ReceiveError::Transient(_) => Detached::Replace,
                    fatal => {
                        tracing::warn!(entity = %self.inner.entity, %error, "Receive link detached for good.");
                        Detached::Fatal(fatal)
                    }
                }
            }
        }
    }

    /// A delivery taken from the link: handed out (marked unusable when its message is), or
    /// `None` when its lock ran out while it waited on the link (released).
    async fn hand_out(
        &self,
        link: &ReceiveLink,
        delivery: &sb_amqp::Delivery,
        capacity: u32,
    ) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        let received = match delivery.message() {
            Ok(message) => from_amqp(&message, &delivery.delivery_tag),
            // Handed out as unusable: the caller settles it (protocol3 F10).
            Err(error) => undecodable(&delivery.delivery_tag, &error),
        };
        // Monotonic: a step of the host's clock must not change the judgement (F3).
        // tokio's clock (monotonic; virtual under a paused runtime, as in the simulator).
        let now = tokio::time::Instant::now().into_std();
        if let Some(until) = received.message.locked_until {
            // Every delivery teaches the broker's clock: what the check below and settlement
            // deadlines read.
            self.inner
                .lock_clock
                .learn(until, received.message.enqueued_time, now);
        }
        if capacity > 0
            && self.inner.session.get().is_none()
            && received
                .message
                .locked_until
                .is_some_and(|until| self.inner.lock_clock.ran_out(until, now))
        {
            // It waited on the link past its lock (nothing renews a lock before the delivery
            // is handed out): the broker has made it available again, so it must not be
            // processed here; released to clear it from the link.
            tracing::warn!(entity = %self.inner.entity, "Releasing a delivery whose lock ran out while it was queued on the link.");
            // Best effort: the broker answers lock-lost or released; either clears it.
            let _ = tokio::time::timeout(
                self.inner.client.timeout(),
                link.shared
                    .settler
                    .settle(delivery.delivery_id, Outcome::Released),
            )
            .await;
            return Ok(None);
        }
        if capacity > 0 {
            // The lock time left as the broker's clock tells it: what bounds how long the
            // window may keep deliveries waiting.
            let lock_left = received.message.locked_until.map(|until| {
                until
                    .duration_since(
                        self.inner
                            .lock_clock
                            .broker_now(now, self.inner.client.now()),
                    )
                    .unwrap_or_default()
            });
            self.inner
                .taken(delivery.payload.len(), lock_left, capacity);
        }
        if let Some(unusable) = &received.refusal {
            tracing::warn!(entity = %self.inner.entity, reason = %unusable.reason, description = %unusable.description, "Handing out a delivery whose message is unusable as it stands.");
        }
        Ok(Some(self.delivery(link, delivery.delivery_id, received)))
    }

    fn delivery(
        &self,
        link: &ReceiveLink,
        delivery_id: u32,
        received: Received,
    ) -> ServiceBusDelivery {
        self.inner.in_hand.fetch_add(1, Ordering::AcqRel);
        let lock_token = received.message.lock_token.unwrap_or_else(uuid::Uuid::nil);
        let locked_until = received
            .message
            .locked_until
            .unwrap_or_else(|| self.inner.client.now() + Duration::from_secs(30));
        ServiceBusDelivery {
            session: self.inner.session.get().cloned(),
            receiver: self.inner.clone(),
            link: link.shared.clone(),
            delivery_id,
            lock_token,
            locked_until: StdMutex::new(locked_until),
            settled: AtomicBool::new(false),
            settling: AtomicBool::new(false),
            received,
        }
    }

    /// Pipelined: grants what keeps the link's deliveries plus those in hand at the window
    /// (the capacity, or what the window sized itself to under it), in blocks
    /// ([`TOP_UP_FRACTION`] of the window at least, or whatever is missing once the link ran
    /// dry) so that a busy caller does not send one `flow` per delivery. While settlements in
    /// flight reach [`SETTLING_FACTOR`] × the window, no credit is granted. With no credit on
    /// the link and none to grant (the window is in hand, or the settlements at their bound),
    /// it waits until a delivery leaves the window or a settlement ends: a receive must not
    /// wait on a link that has no credit.
    async fn top_up(&self, link: &mut ReceiveLink, capacity: u32) -> Result<(), sb_amqp::Error> {
        loop {
            // Registered before the counts are read: a delivery freed in between still wakes it.
            let freed = self.inner.freed.notified();
            let missing = self.missing_credit(link, capacity);
            let window = self.window_under(capacity);
            let block = (window / TOP_UP_FRACTION).max(1);
            if missing >= block || (missing > 0 && link.pending == 0) {
                link.receiver.add_credit(missing).await?;
                link.pending += missing;
            }
            if link.pending > 0 {
                return Ok(());
            }
            freed.await;
        }
    }

    /// The window under `capacity`: a session's is the capacity (its messages come one at a
    /// time), a self-sizing receiver's what it sized itself to.
    fn window_under(&self, capacity: u32) -> u32 {
        if self.inner.session.get().is_some() {
            capacity
        } else {
            self.inner.window_state(capacity).window
        }
    }

    /// The credit that brings the link's deliveries plus those in hand to the window; none
    /// while settlements in flight are at their bound.
    fn missing_credit(&self, link: &ReceiveLink, capacity: u32) -> u32 {
        // A session's messages come one at a time, each asked for by a receive once the one
        // before is settled (V1); a delivery still referenced elsewhere (a lock keeper winding
        // down) must not hold the next back. Plain receivers count what they hold.
        if self.inner.session.get().is_some() {
            return capacity.saturating_sub(link.pending);
        }
        let window = self.window_under(capacity);
        let bound = usize::try_from(window.saturating_mul(SETTLING_FACTOR)).unwrap_or(usize::MAX);
        if self.inner.settling.load(Ordering::Acquire) >= bound {
            return 0;
        }
        let in_hand = u32::try_from(self.inner.in_hand.load(Ordering::Acquire)).unwrap_or(u32::MAX);
        window.saturating_sub(in_hand.saturating_add(link.pending))
    }

    /// Withdraws the link's outstanding credit (AMQP drain) and releases what arrived and was
    /// not handed out: for a caller that pauses (a kill switch); deliveries left on the link
    /// would sit there locked, unrenewed, until their locks ran out, each costing a delivery
    /// count ("Prefetch Azure Service Bus messages", learn.microsoft.com/azure/service-bus-messaging/service-bus-prefetch:
    /// the lock timer starts when the message is prefetched). Released, they go back to the
    /// entity for whoever reads it next, without one. The credit goes with a `flow` whose
    /// drain flag has the broker spend or return it (AMQP 1.0 §2.6.7). Bounded like
    /// [`ServiceBusReceiver::close`]; a link that does not answer is dropped and re-attached by
    /// the next receive.
    pub async fn withdraw(&self) {
        let mut guard = self.inner.link.lock().await;
        let Some(link) = guard.as_mut() else {
            return;
        };
        // Credit granted at attach for a plain prefetch counts too (protocol3 F9).
        if link.pending == 0 && !link.granted && !link.prefetched {
            return;
        }
        let withdrawing = async {
            link.receiver.drain().await?;
            while let Some(delivery) = link.receiver.try_recv()? {
                link.receiver.release(&delivery).await?;
            }
            Ok::<_, sb_amqp::Error>(())
        };
        match tokio::time::timeout(CLOSE_TIMEOUT, withdrawing).await {
            Ok(Ok(())) => {
                link.pending = 0;
                link.granted = false;
                link.prefetched = false;
                tracing::info!(entity = %self.inner.entity, "Receive credit withdrawn; prefetched deliveries released.");
            }
            failed => {
                // Whatever is left on it, its locks decide; the next receive attaches afresh.
                link.shared.gone.store(true, Ordering::Release);
                *guard = None;
                self.inner.set_current_link(None);
                tracing::warn!(entity = %self.inner.entity, timed_out = failed.is_err(), "Withdrawing receive credit failed; dropping the link.");
            }
        }
    }

    /// Received deliveries of the current link not settled yet (0 without a link): what a
    /// settlement or a drop has not cleared yet.
    pub async fn unsettled(&self) -> usize {
        let guard = self.inner.link.lock().await;
        match guard.as_ref() {
            Some(link) => link.shared.settler.unsettled().await.unwrap_or(0),
            None => 0,
        }
    }
}
