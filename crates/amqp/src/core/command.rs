//! The plumbing between application handles and the connection driver: the [`Command`]s a
//! handle sends, the [`LinkEvent`]s a link handle receives, [`ConnCtx`], the sending end
//! every handle holds, and [`ConnInner`], what keeps the connection open while any handle
//! lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;
use tokio::sync::{mpsc, oneshot, watch};

use crate::delivery::{Delivery, IncomingDisposition, LinkFlow, Sendable};
use crate::error::{AmqpError, Error, Result};
use crate::performative::{Attach, Open};

/// Keys given to sessions and links; never reused in the process.
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

/// A new key for a session or link. Channel and handle numbers are reused as soon as their
/// session or link is gone (the lowest free one is taken, as azure-amqp's `HandleTable` does);
/// a handle that outlives its link must never act on the link that took its number, so every
/// command names the key of the session or link it was made for and the driver refuses it once
/// that one is gone.
pub(crate) fn next_key() -> u64 {
    NEXT_KEY.fetch_add(1, Ordering::Relaxed)
}

/// A session as the handles name it: its channel and its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SessionRef {
    pub(crate) channel: u16,
    pub(crate) key: u64,
}

/// A link as the handles name it: its session (channel and key), its handle and its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LinkRef {
    pub(crate) channel: u16,
    pub(crate) session: u64,
    pub(crate) handle: u32,
    pub(crate) key: u64,
}

impl LinkRef {
    pub(crate) fn session(&self) -> SessionRef {
        SessionRef {
            channel: self.channel,
            key: self.session,
        }
    }
}

/// Result of a send as reported by the driver.
#[derive(Debug)]
pub(crate) struct SendReport {
    pub(crate) delivery_id: u32,
    pub(crate) state: Option<DeliveryState>,
}

/// How the driver reports a send back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Track {
    /// Pre-settled: reply once written.
    Settled,
    /// Reply with the peer's outcome; settle automatically if the peer does not.
    Await,
    /// Reply once written; the peer's dispositions go to the link's event queue.
    Events,
}

pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// What a handle says about one delivery: its outcome, and whether it settles it. The driver
/// queues it as is until the turn's dispositions are written.
#[derive(Debug)]
pub(crate) struct DeliveryDisposition {
    /// The link the delivery came on (or went out on): the disposition is refused once that
    /// link is gone, even when another link took its number or another session its channel
    /// and a delivery of its own has the same id.
    pub(crate) link: LinkRef,
    /// The role of the link that disposes (receivers settle deliveries, senders answer the
    /// peer's unsettled dispositions).
    pub(crate) role: Role,
    pub(crate) delivery_id: u32,
    pub(crate) settled: bool,
    pub(crate) state: Option<DeliveryState>,
}

/// What a link handle needs from the driver.
#[derive(Debug)]
pub(crate) struct LinkSetup {
    pub(crate) events: mpsc::UnboundedSender<LinkEvent>,
    pub(crate) flow: watch::Sender<LinkFlow>,
    pub(crate) auto_credit: Option<u32>,
    pub(crate) auto_drain: bool,
    /// Largest incoming delivery taken, when it differs from the advertised `max-message-size`.
    pub(crate) max_incoming: Option<u64>,
}

/// Events for one link handle.
#[derive(Debug)]
pub(crate) enum LinkEvent {
    Delivery(Delivery),
    Disposition(IncomingDisposition),
    /// The link is gone: detached by the peer, its session ended or the connection died.
    Gone(Error),
}

#[derive(Debug)]
pub(crate) enum CreditOp {
    Set(u32),
    Add(u32),
}

#[derive(Debug)]
pub(crate) enum Command {
    Begin {
        key: u64,
        incoming_window: u32,
        outgoing_window: u32,
        /// Set by the driver once the session ended (the handle's `Session::is_ended`).
        ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
        reply: Reply<u16>,
    },
    End {
        channel: u16,
        /// The session's key; `None` ends whatever session has the channel (a server ending
        /// a peer's session by its channel number).
        key: Option<u64>,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    Attach {
        session: SessionRef,
        key: u64,
        attach: Box<Attach>,
        setup: LinkSetup,
        reply: Reply<(u32, Box<Attach>)>,
    },
    AnswerAttach {
        session: SessionRef,
        key: u64,
        remote_handle: u32,
        attach: Box<Attach>,
        setup: Option<LinkSetup>,
        reject: Option<AmqpError>,
        reply: Reply<u32>,
    },
    Detach {
        /// A handle is reused once its link is gone, and a late detach (a link dropped after
        /// the peer detached it) must not end the link that has it now: the key tells them
        /// apart.
        link: LinkRef,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    Send {
        link: LinkRef,
        send: Sendable,
        track: Track,
        reply: Reply<SendReport>,
    },
    Credit {
        link: LinkRef,
        op: CreditOp,
        drain: bool,
        reply: Reply<()>,
    },
    AnswerDrain {
        link: LinkRef,
    },
    Dispose {
        disposition: DeliveryDisposition,
        reply: Reply<Option<DeliveryState>>,
    },
    Close {
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    /// How many incoming deliveries of the session wait for their settlement.
    Unsettled {
        session: SessionRef,
        reply: Reply<usize>,
    },
}

/// Counters readable from handles.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) heartbeats_received: AtomicU64,
    pub(crate) heartbeats_sent: AtomicU64,
    pub(crate) heartbeat_notify: tokio::sync::Notify,
}

/// Shared plumbing from a handle to its connection driver.
/// What every handle of one connection shares; dropping the last one closes the connection.
#[derive(Debug)]
pub(crate) struct ConnInner {
    pub(crate) ctx: ConnCtx,
    pub(crate) remote_open: Open,
    pub(crate) stats: Arc<Stats>,
}

impl Drop for ConnInner {
    fn drop(&mut self) {
        // The driver may already be gone; then there is nothing to close.
        let _ = self.ctx.cmd.send(Command::Close {
            error: None,
            reply: None,
        });
    }
}

#[derive(Debug, Clone)]
pub(crate) struct ConnCtx {
    pub(crate) cmd: mpsc::UnboundedSender<Command>,
    pub(crate) terminal: watch::Receiver<Option<Error>>,
}

impl ConnCtx {
    pub(crate) fn err(&self) -> Error {
        self.terminal
            .borrow()
            .clone()
            .unwrap_or(Error::ConnectionLost)
    }

    pub(crate) fn send(&self, c: Command) -> Result<()> {
        self.cmd.send(c).map_err(|_| self.err())
    }

    pub(crate) async fn call<T>(&self, f: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(f(tx))?;
        rx.await.map_err(|_| self.err())?
    }
}
