//! Link handles: [`Sender`] and [`Receiver`] (the same types for links we attach and links
//! the peer attached), their options, and the peer's attach waiting for an answer.
//!
//! # Layout
//! - `options`: [`SenderOptions`], [`ReceiverOptions`] (what [`crate::Session`] attaches).
//! - `events`: a link handle's event queue and credit state, shared between tasks.
//! - `sender`, `receiver`: the handles; [`Settler`] settles a receiver's deliveries from any
//!   task.
//! - `peer`: [`PeerAttach`], a peer's attach the application answers (the server role wraps
//!   it as `LinkRequest`).

mod events;
mod options;
mod peer;
mod receiver;
mod sender;

use std::sync::Arc;

use fe2o3_amqp_types::messaging::TargetArchetype;
use tokio::sync::{mpsc, watch};

pub(crate) use events::LinkEvents;
pub use options::{ReceiverOptions, SenderOptions};
pub(crate) use peer::PeerAttach;
pub use receiver::{Receiver, Settler};
pub use sender::Sender;

use super::command::{Command, ConnCtx, LinkEvent};
use super::connection::ConnInner;
use super::session::SessionInner;
use crate::delivery::LinkFlow;
use crate::error::{AmqpError, Result};
use crate::performative::Attach;

/// Whether a link is still attached, readable from any task (a server's link listing, say)
/// without the link handle. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// The driver drops the sending end when the link leaves its state: detached by the peer
    /// (or our detach answered), its session ended, or the connection gone.
    flow: watch::Receiver<LinkFlow>,
}

impl LinkStatus {
    /// False once the link is gone: the peer detached it (or answered our detach), its session
    /// ended or the connection closed. A link we are detaching counts as attached until the
    /// peer answers.
    pub fn is_attached(&self) -> bool {
        self.flow.has_changed().is_ok()
    }
}

/// What a link handle is built from once its attach is answered.
pub(crate) struct LinkParts {
    pub(crate) core: LinkCore,
    pub(crate) events: mpsc::UnboundedReceiver<LinkEvent>,
    pub(crate) flow: watch::Receiver<LinkFlow>,
    pub(crate) local: Box<Attach>,
    pub(crate) remote: Box<Attach>,
}

/// A link's address in the driver and what keeps its session or connection alive; dropping
/// it detaches the link.
#[derive(Debug)]
pub(crate) struct LinkCore {
    pub(crate) ctx: ConnCtx,
    pub(crate) channel: u16,
    pub(crate) handle: u32,
    pub(crate) name: String,
    pub(crate) detached: bool,
    pub(crate) _session: Option<Arc<SessionInner>>,
    pub(crate) _conn: Option<Arc<ConnInner>>,
}

impl Drop for LinkCore {
    fn drop(&mut self) {
        if !self.detached {
            // The driver may already be gone; then the link is gone too.
            let _ = self.ctx.cmd.send(Command::Detach {
                channel: self.channel,
                handle: self.handle,
                error: None,
                reply: None,
            });
        }
    }
}

impl LinkCore {
    pub(crate) async fn detach(&mut self, error: Option<AmqpError>) -> Result<()> {
        self.detached = true;
        let (channel, handle) = (self.channel, self.handle);
        self.ctx
            .call(|reply| Command::Detach {
                channel,
                handle,
                error,
                reply: Some(reply),
            })
            .await
    }
}

pub(crate) fn address_of_source(a: &Attach) -> Option<&str> {
    a.source.as_ref().and_then(|s| s.address.as_deref())
}

pub(crate) fn address_of_target(a: &Attach) -> Option<&str> {
    match a.target.as_deref() {
        Some(TargetArchetype::Target(t)) => t.address.as_deref(),
        _ => None,
    }
}
