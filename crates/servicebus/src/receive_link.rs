//! What a receiver's link state is made of ([`ReceiverInner`], [`ReceiveLink`]) and what the
//! deliveries of one link share ([`LinkShared`]).
//!
//! Below the receiver, its deliveries and the session receiver: a delivery holds these to
//! settle and to give its place in the window back, so it imports them here rather than
//! importing its receiver. The receiver's algorithm (attach, credit, receive) is in `receiver`.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex as StdMutex};

use sb_amqp::Settler;
use tokio::sync::Mutex;

use super::ServiceBusClient;
use super::lock_clock::LockClock;
use super::scope::ConnectionScope;
use super::session_lock::SessionLock;
use super::telemetry::EntityTelemetry;
use super::window::Sizer;

#[derive(Debug)]
pub(super) struct ReceiverInner {
    pub(super) client: ServiceBusClient,
    pub(super) entity: String,
    pub(super) prefetch: u32,
    /// With pipelining ([`ServiceBusReceiver::with_capacity`](crate::ServiceBusReceiver::with_capacity)), the most deliveries on the link
    /// (credit granted, transfers queued) plus handed out and not being settled yet; 0: one
    /// credit per receive.
    pub(super) capacity: AtomicU32,
    /// Deliveries handed out, not dropped and not being settled (whatever their link): what the
    /// caller holds in its queue and handlers.
    pub(super) in_hand: AtomicUsize,
    /// Deliveries whose settlement started and that are not dropped yet: bounded apart from
    /// the window ([`SETTLING_FACTOR`](crate::window::SETTLING_FACTOR)), not in it.
    pub(super) settling: AtomicUsize,
    /// Told when a delivery leaves the window (its settlement starts, or it is dropped) or a
    /// settlement in flight ends: a receive waiting for room to grant credit looks again.
    pub(super) freed: tokio::sync::Notify,
    /// Set by [`ServiceBusReceiver::with_auto_window`](crate::ServiceBusReceiver::with_auto_window): the window sizes itself under the
    /// capacity from what the receiver measures.
    pub(super) sizer: StdMutex<Option<Sizer>>,
    pub(super) link: Mutex<Option<ReceiveLink>>,
    /// True while a link is attached: what readiness reports.
    pub(super) attached: AtomicBool,
    /// The service detached the link as unauthorized: the next attach puts a fresh token, and
    /// a refusal right after it is fatal.
    pub(super) reauthorize: AtomicBool,
    pub(super) telemetry: EntityTelemetry,
    /// Set for a session receiver: its one link, once lost, is not re-attached (the session
    /// lock went with it), and its deliveries are settled on that link only.
    pub(super) session: std::sync::OnceLock<Arc<SessionLock>>,
    /// The name of the link attached now: what `$management` requests name as their
    /// associated link (read without waiting on a receive that holds `link`).
    pub(super) current_link: StdMutex<Option<String>>,
    /// Whether that link is still attached, as the engine sees it (the service may have
    /// detached it while nobody was receiving).
    pub(super) current_status: StdMutex<Option<sb_amqp::LinkStatus>>,
    /// [`DEFAULT_LINK_IDLE_GUARD`](crate::DEFAULT_LINK_IDLE_GUARD) unless set, in milliseconds.
    pub(super) idle_guard_ms: AtomicU64,
    /// The broker's clock as its deliveries tell it: whether a delivery's lock ran out on the
    /// link, and what settlement deadlines compare with.
    pub(super) lock_clock: LockClock,
}

#[derive(Debug)]
pub(super) struct ReceiveLink {
    pub(super) receiver: sb_amqp::Receiver,
    /// The connection it lives on, told of the link's failures (`ConnectionScope::observe`).
    pub(super) conn: std::sync::Weak<ConnectionScope>,
    pub(super) shared: Arc<LinkShared>,
    pub(super) granted: bool,
    /// Not pipelined: the receiver's prefetch is granted on the link (at attach, and again by
    /// the next receive after a [`ServiceBusReceiver::withdraw`](crate::ServiceBusReceiver::withdraw)).
    pub(super) prefetched: bool,
    /// Pipelined: credit granted on this link not yet turned into a delivery taken from it
    /// (the link's credit plus its queued transfers).
    pub(super) pending: u32,
}

/// What deliveries of one link share.
#[derive(Debug)]
pub(super) struct LinkShared {
    pub(super) settler: Settler,
    pub(super) name: String,
    /// Set once the link failed: its deliveries settle through `$management`.
    pub(super) gone: AtomicBool,
}
