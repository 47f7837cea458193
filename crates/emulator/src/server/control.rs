//! The service's pressure on live entity links: the idle timer, token expiry, forced detaches
//! (from tests through [`crate::Emulator`] and from `--fault detach-link`) and the per-operation
//! fault draws.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_amqp::{AmqpError, LinkStatus, condition};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::faults::{Fault, Faults};
use super::survival::{LiveConnection, ReceiverDetach};
use super::{ConnState, wire_error};
use crate::{Clock, Right};

/// Which way messages flow on a live entity link, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkRole {
    /// The client sends (the service calls it a publisher).
    Sender,
    /// The client receives (a consumer).
    Receiver,
}

impl LinkRole {
    /// The right a link of this role needs.
    pub(crate) fn right(self) -> Right {
        match self {
            LinkRole::Sender => Right::Send,
            LinkRole::Receiver => Right::Listen,
        }
    }
}

/// A live entity link, as [`crate::Emulator::links`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkInfo {
    /// Emulator-wide id, for [`crate::Emulator::force_detach_link`].
    pub id: u64,
    /// The link name the client chose.
    pub name: String,
    /// The entity path the link is attached to, as the client wrote it (host stripped).
    pub entity: String,
    /// Which way messages flow.
    pub role: LinkRole,
    /// A receive link: the most credit the client had granted and the emulator not used yet,
    /// at any one time.
    pub peak_credit: u32,
    /// A receive link: the most deliveries it had outstanding at once, the client's unused
    /// credit plus messages sent and not settled yet (what a client's prefetch window
    /// bounds).
    pub peak_outstanding: u32,
    /// A receive link: the credit the client granted and the emulator has not used yet, as
    /// of the link task's latest look (0 after a drain).
    pub credit: u32,
}

/// A receive link's flow as its task counts it, read by [`Registry::list`].
#[derive(Debug, Default)]
struct Gauge {
    credit: AtomicU32,
    peak_credit: AtomicU32,
    peak_outstanding: AtomicU32,
}

#[derive(Debug)]
struct Entry {
    info: LinkInfo,
    gauge: Arc<Gauge>,
    detach: mpsc::UnboundedSender<AmqpError>,
    /// The message session a session receiver link holds.
    session: Option<String>,
    /// Set once the attach is answered: the engine's word on whether the link still lives,
    /// which changes before the client can see its detach answered.
    status: Option<LinkStatus>,
    /// Cancelled when the service loses the link without a detach ([`Registry::black_hole`]).
    lost: CancellationToken,
}

impl Entry {
    /// Attached from the client's point of view: not detached by it, and not being detached
    /// by us (a link we detach leaves the registry first).
    fn is_live(&self) -> bool {
        self.status.as_ref().is_none_or(LinkStatus::is_attached)
    }
}

/// Every live entity link of the emulator, so any of them can be detached on demand.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    next: AtomicU64,
    /// Ordered by id: a forced detach of an entity's links reaches them in the order they
    /// attached, so a seeded run (the simulator's `SIM_SEED`) replays bit for bit.
    links: Mutex<BTreeMap<u64, Entry>>,
}

impl Registry {
    fn register(
        self: &Arc<Self>,
        name: &str,
        entity: &str,
        role: LinkRole,
    ) -> (
        Registration,
        mpsc::UnboundedReceiver<AmqpError>,
        CancellationToken,
    ) {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = mpsc::unbounded_channel();
        let info = LinkInfo {
            id,
            name: name.to_owned(),
            entity: entity.to_owned(),
            role,
            peak_credit: 0,
            peak_outstanding: 0,
            credit: 0,
        };
        let gauge = Arc::new(Gauge::default());
        let lost = CancellationToken::new();
        if let Ok(mut links) = self.links.lock() {
            links.insert(
                id,
                Entry {
                    info,
                    gauge: gauge.clone(),
                    detach: tx,
                    session: None,
                    status: None,
                    lost: lost.clone(),
                },
            );
        }
        (
            Registration {
                id,
                registry: self.clone(),
                gauge,
            },
            rx,
            lost,
        )
    }

    /// Loses link `id` the way the service sometimes does (a gateway or broker node moved
    /// without telling the client): no detach, no transfer, no answer ever again on it,
    /// while the connection lives on. Go `azservicebus` guards against exactly this with a
    /// client idle timer (Azure/azure-sdk-for-go#19465: "if our link were to be
    /// disconnected on the service side, and we somehow missed the detach notification,
    /// there'd be no confirmation on our end that the link is actually alive"). False when
    /// the link is not live.
    pub(crate) fn black_hole(&self, id: u64) -> bool {
        let Ok(links) = self.links.lock() else {
            return false;
        };
        let Some(entry) = links.get(&id).filter(|e| e.is_live()) else {
            return false;
        };
        tracing::info!(link = %entry.info.name, entity = %entry.info.entity, "Losing the link without a detach.");
        entry.lost.cancel();
        true
    }

    pub(crate) fn list(&self) -> Vec<LinkInfo> {
        let mut list: Vec<LinkInfo> = self
            .links
            .lock()
            .map(|links| {
                links
                    .values()
                    .filter(|e| e.is_live())
                    .map(|e| LinkInfo {
                        credit: e.gauge.credit.load(Ordering::Acquire),
                        peak_credit: e.gauge.peak_credit.load(Ordering::Acquire),
                        peak_outstanding: e.gauge.peak_outstanding.load(Ordering::Acquire),
                        ..e.info.clone()
                    })
                    .collect()
            })
            .unwrap_or_default();
        list.sort_by_key(|l| l.id);
        list
    }

    /// Asks link `id` to detach with `error`; false when it is not live.
    pub(crate) fn detach(&self, id: u64, error: AmqpError) -> bool {
        self.links
            .lock()
            .ok()
            .and_then(|links| {
                links
                    .get(&id)
                    .filter(|e| e.is_live())
                    .map(|e| e.detach.send(error).is_ok())
            })
            .unwrap_or(false)
    }

    /// Detaches every live link on `entity` (case-insensitive, exact path); returns how many.
    pub(crate) fn detach_entity(&self, entity: &str, error: &AmqpError) -> usize {
        let entity = entity.trim_matches('/');
        let Ok(links) = self.links.lock() else {
            return 0;
        };
        links
            .values()
            .filter(|e| e.is_live() && e.info.entity.eq_ignore_ascii_case(entity))
            .filter(|e| e.detach.send(error.clone()).is_ok())
            .count()
    }

    /// Records that link `id` now holds `session` on its entity, and detaches every other
    /// live link that held it with `amqp:link:stolen`; returns how many.
    fn claim_session(&self, id: u64, session: &str) -> usize {
        let Ok(mut links) = self.links.lock() else {
            return 0;
        };
        let Some(entity) = links.get_mut(&id).map(|e| {
            e.session = Some(session.to_owned());
            e.info.entity.clone()
        }) else {
            return 0;
        };
        links
            .values()
            .filter(|e| e.info.id != id && e.is_live() && e.session.as_deref() == Some(session))
            .filter(|e| e.info.entity.eq_ignore_ascii_case(&entity))
            .filter(|e| {
                let stolen = wire_error(
                    condition::LINK_STOLEN,
                    Some(format!(
                        "The session '{session}' was accepted by another receiver after its lock expired; this link no longer holds it."
                    )),
                );
                e.detach.send(stolen).is_ok()
            })
            .count()
    }

    fn detach_random(&self, faults: &Faults, error: AmqpError) {
        let Ok(links) = self.links.lock() else { return };
        let mut ids: Vec<u64> = links
            .iter()
            .filter(|(_, e)| e.is_live())
            .map(|(id, _)| *id)
            .collect();
        if ids.is_empty() {
            return;
        }
        ids.sort_unstable();
        let id = ids[faults.pick(ids.len())];
        if let Some(entry) = links.get(&id) {
            tracing::info!(link = %entry.info.name, entity = %entry.info.entity, "Fault: detaching a link with server-busy.");
            // A link task already gone has nothing left to detach.
            let _ = entry.detach.send(error);
        }
    }
}

/// Removes its link from the registry when the link task ends (or earlier, when the link
/// starts detaching).
#[derive(Debug)]
struct Registration {
    id: u64,
    registry: Arc<Registry>,
    gauge: Arc<Gauge>,
}

impl Registration {
    fn remove(&self) {
        if let Ok(mut links) = self.registry.links.lock() {
            links.remove(&self.id);
        }
    }

    fn watch(&self, status: LinkStatus) {
        if let Ok(mut links) = self.registry.links.lock()
            && let Some(entry) = links.get_mut(&self.id)
        {
            entry.status = Some(status);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.remove();
    }
}

/// What one entity link task needs to behave like the service towards its client.
#[derive(Debug)]
pub(crate) struct LinkControl {
    registration: Registration,
    detach: mpsc::UnboundedReceiver<AmqpError>,
    lost: CancellationToken,
    name: String,
    entity: String,
    role: LinkRole,
    idle_timeout: Option<Duration>,
    last_activity: Instant,
    state: Arc<ConnState>,
    clock: Clock,
    faults: Arc<Faults>,
    connection: CancellationToken,
    live: Arc<LiveConnection>,
    channel: u16,
    /// Detach then, so ([`crate::Emulator::detach_new_receive_links`],
    /// [`crate::Emulator::force_detach_new_receive_links`]).
    scheduled_detach: Option<(Instant, ReceiverDetach)>,
}

/// Everything [`LinkControl::new`] takes from the emulator and the connection.
#[derive(Debug, Clone)]
pub(crate) struct ControlContext {
    pub(crate) registry: Arc<Registry>,
    pub(crate) faults: Arc<Faults>,
    pub(crate) idle_timeout: Option<Duration>,
    pub(crate) clock: Clock,
    pub(crate) state: Arc<ConnState>,
    /// Cancelling it closes the connection with `amqp:connection:forced`.
    pub(crate) connection: CancellationToken,
    /// The connection as the injected connection-level faults see it.
    pub(crate) live: Arc<LiveConnection>,
    /// The channel of the link's session.
    pub(crate) channel: u16,
}

impl LinkControl {
    pub(crate) fn new(ctx: ControlContext, name: &str, entity: &str, role: LinkRole) -> Self {
        let (registration, detach, lost) = ctx.registry.register(name, entity, role);
        let scheduled_detach = match role {
            LinkRole::Receiver => ctx.state.survival.new_receiver_detach(),
            LinkRole::Sender => None,
        }
        .map(|(after, how)| (Instant::now() + after, how));
        LinkControl {
            scheduled_detach,
            registration,
            detach,
            lost,
            name: name.to_owned(),
            entity: entity.to_owned(),
            role,
            idle_timeout: ctx.idle_timeout,
            last_activity: Instant::now(),
            state: ctx.state,
            clock: ctx.clock,
            faults: ctx.faults,
            connection: ctx.connection,
            live: ctx.live,
            channel: ctx.channel,
        }
    }

    /// This session receiver link accepted `session`: a link still attached to it from an
    /// expired acceptance is detached with `amqp:link:stolen`, as AMQP 1.0 (2.8.17, "the link
    /// has been attached elsewhere, causing the existing attachment to be forcibly closed")
    /// and the service's link-terminus stealing (Azure/azure-amqp `AmqpLinkTerminus`) have it.
    pub(crate) fn claim_session(&self, session: &str) {
        let stolen = self
            .registration
            .registry
            .claim_session(self.registration.id, session);
        if stolen > 0 {
            tracing::info!(link = %self.name, %session, stolen, "Session taken over; detached its stale link.");
        }
    }

    /// The attach is answered: the registry follows the engine's view of the link from now on,
    /// so a link the client detached is not listed even before this task notices.
    pub(crate) fn watch(&self, status: LinkStatus) {
        self.registration.watch(status);
    }

    /// The link starts detaching on our side: it is no longer listed or detachable, before the
    /// client can see our detach.
    pub(crate) fn unlist(&self) {
        self.registration.remove();
    }

    /// A receive link's flow: `credit` unused, `unsettled` messages sent and not settled.
    pub(crate) fn record_flow(&self, credit: u32, unsettled: u32) {
        let gauge = &self.registration.gauge;
        gauge.credit.store(credit, Ordering::Release);
        gauge.peak_credit.fetch_max(credit, Ordering::AcqRel);
        gauge
            .peak_outstanding
            .fetch_max(credit.saturating_add(unsettled), Ordering::AcqRel);
    }

    /// A peek-lock delivery went out on this link: its lock is the connection's to drop.
    pub(crate) fn hold_lock(&self, entity: &crate::Entity, lock_token: uuid::Uuid) {
        self.state.hold_lock(entity, lock_token);
    }

    /// Cancelled once the service lost this link ([`Registry::black_hole`]).
    pub(crate) fn lost(&self) -> CancellationToken {
        self.lost.clone()
    }

    /// Holds a lost link in silence: nothing is sent or answered on it (the engine still
    /// answers the client's own detach, as the service's gateway would), until the client
    /// detaches it, the connection ends or the emulator stops.
    pub(crate) async fn hold_lost(&self, status: LinkStatus, stop: &CancellationToken) {
        self.unlist();
        tokio::select! {
            () = status.gone() => {}
            () = stop.cancelled() => {}
            () = self.connection.cancelled() => {}
        }
    }

    /// A transfer, flow or disposition happened: restart the idle timer.
    pub(crate) fn touch(&mut self) {
        self.last_activity = Instant::now();
    }

    /// Draws the per-transfer faults: may close the connection or detach a random link.
    pub(crate) fn after_transfer(&mut self) {
        self.touch();
        if self.faults.hit(Fault::DropConnection) {
            tracing::info!(link = %self.name, "Fault: dropping the connection.");
            self.connection.cancel();
        }
        if self.faults.hit(Fault::EndSession) {
            tracing::info!(link = %self.name, channel = self.channel, "Fault: ending the session.");
            let (live, channel) = (self.live.clone(), self.channel);
            tokio::spawn(async move { live.end_session(channel).await });
        }
        self.maybe_detach_random();
    }

    /// True when this disposition is to be left unanswered and unapplied
    /// ([`crate::Emulator::leave_settlements_unanswered`]).
    pub(crate) fn settlement_unanswered(&self) -> bool {
        self.state.survival.settlement_unanswered()
    }

    /// True when this disposition is to be answered `rejected{com.microsoft:timeout}` and left
    /// unapplied ([`crate::Emulator::time_out_settlements`]).
    pub(crate) fn settlement_timed_out(&self) -> bool {
        self.state.survival.settlement_timed_out()
    }

    /// True while the namespace is throttled: a send is then refused with server-busy.
    pub(crate) fn is_throttled(&self) -> bool {
        self.state.survival.is_throttled()
    }

    /// Draws the per-disposition faults; true when this disposition must be answered
    /// `rejected{com.microsoft:server-busy}` and left unapplied.
    pub(crate) fn after_disposition(&mut self, settled_by_client: bool) -> bool {
        self.touch();
        self.maybe_detach_random();
        // A disposition the client settled expects no answer: it is always applied.
        !settled_by_client
            && self
                .state
                .survival
                .settlement(self.faults.hit(Fault::BusySettle))
    }

    fn maybe_detach_random(&self) {
        if self.faults.hit(Fault::DetachLink) {
            self.registration.registry.detach_random(
                &self.faults,
                wire_error(
                    condition::SERVER_BUSY,
                    Some(
                        "The server is busy. Please retry the operation (injected by --fault detach-link)."
                            .to_owned(),
                    ),
                ),
            );
        }
    }

    /// Resolves with the error to detach with: an explicit request, the idle timer, or the
    /// token's expiry. Cancel-safe: `select!` it against the link's work.
    pub(crate) async fn must_detach(&mut self) -> AmqpError {
        loop {
            let now = Instant::now();
            let idle_deadline = self.idle_timeout.map(|d| self.last_activity + d);
            let token_deadline = self
                .state
                .grants
                .token_expiry(&self.entity, Some(self.role.right()))
                .map(|expiry| {
                    now + expiry
                        .duration_since(self.clock.now())
                        .unwrap_or(Duration::ZERO)
                });
            if let Some(deadline) = token_deadline
                && deadline <= now
            {
                return self.token_expired();
            }
            if let (Some(deadline), Some(timeout)) = (idle_deadline, self.idle_timeout)
                && deadline <= now
            {
                return self.idle_expired(timeout);
            }
            if let Some((at, how)) = self.scheduled_detach
                && at <= now
            {
                return self.scheduled(how);
            }
            let wake = [
                idle_deadline,
                token_deadline,
                self.scheduled_detach.map(|(at, _)| at),
            ]
            .into_iter()
            .flatten()
            .min();
            tokio::select! {
                error = self.detach.recv() => {
                    if let Some(error) = error {
                        return error;
                    }
                    // The registry is gone (cannot happen while we hold our registration).
                    std::future::pending::<()>().await;
                }
                // Re-checked on waking: a refreshed token or new activity moves the deadline.
                () = sleep_until_opt(wake) => {}
            }
        }
    }

    /// The detach a receive link was scheduled for at its attach.
    fn scheduled(&self, how: ReceiverDetach) -> AmqpError {
        match how {
            ReceiverDetach::InternalError => {
                tracing::info!(link = %self.name, "Fault: detaching a new receive link with internal-error.");
                wire_error(
                    condition::INTERNAL_ERROR,
                    Some("The service was unable to process the request; please retry the operation (injected by the emulator: new receive links are detached).".to_owned()),
                )
            }
            // The service's words when it closes its side of a receive link for its own
            // reasons (a gateway or broker node moving the entity), not the idle timer:
            // "The link 'G9:…' is force detached. Code: consumer(link35055). Details:
            // InnerMessageReceiver was closed." (Azure/azure-sdk-for-js#22963,
            // Azure/azure-sdk-for-java#6280); the SDKs recover the link and go on.
            ReceiverDetach::Forced => {
                tracing::info!(link = %self.name, entity = %self.entity, "Fault: force detaching a receive link (--detach-receive-links-after).");
                wire_error(
                    condition::DETACH_FORCED,
                    Some(format!(
                        "The link '{}' is force detached. Code: consumer(link{}). Details: InnerMessageReceiver was closed (injected by the emulator).",
                        self.name, self.registration.id
                    )),
                )
            }
        }
    }

    /// `amqp:link:detach-forced` with the service's idle-timer text. The service's words, from
    /// azure-sdk-for-python issue 18795 and 33013: "The link 'G2:…:receiver-link-…' is force
    /// detached. Code: consumer(link4508054). Details: AmqpMessageConsumer.IdleTimerExpired:
    /// Idle timeout: 00:10:00." (`publisher` / `AmqpMessagePublisher` for senders).
    fn idle_expired(&self, timeout: Duration) -> AmqpError {
        let (code, class) = match self.role {
            LinkRole::Receiver => ("consumer", "AmqpMessageConsumer"),
            LinkRole::Sender => ("publisher", "AmqpMessagePublisher"),
        };
        let secs = timeout.as_secs();
        tracing::info!(link = %self.name, entity = %self.entity, "Link idle; force detaching.");
        wire_error(
            condition::DETACH_FORCED,
            Some(format!(
                "The link '{}' is force detached. Code: {code}(link{}). Details: {class}.IdleTimerExpired: Idle timeout: {:02}:{:02}:{:02}.",
                self.name,
                self.registration.id,
                secs / 3600,
                secs / 60 % 60,
                secs % 60
            )),
        )
    }

    /// `amqp:link:detach-forced` once the token that authorised the link expired and no
    /// fresh one was put, as the service does: "… is force detached. Code: RenewToken.
    /// Details: Unauthorized access. …" (azure-sdk-for-python issue 23487: the service's
    /// detach on token expiry carries `amqp:link:detach-forced` with that text, not
    /// `amqp:unauthorized-access`).
    fn token_expired(&self) -> AmqpError {
        tracing::info!(link = %self.name, entity = %self.entity, "Token expired; detaching.");
        wire_error(
            condition::DETACH_FORCED,
            Some(format!(
                "The link '{}' is force detached. Code: RenewToken. Details: Unauthorized access. The token for '{}' has expired; put a fresh token on $cbs before it expires.",
                self.name, self.entity
            )),
        )
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
