//! Link handles: [`Sender`] and [`Receiver`] (the same types for links we attach and links
//! the peer attached), their options, and the peer's attach waiting for an answer.
//!
//! # Layout
//! - `options`: [`SenderOptions`], [`ReceiverOptions`] (what [`crate::Session`] attaches).
//! - `events`: a link handle's event queue and credit state, shared between tasks, and
//!   [`LinkStatus`], the view of that state any task may hold.
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

use fe2o3_amqp_types::definitions::Handle;
use fe2o3_amqp_types::messaging::TargetArchetype;
use tokio::sync::{mpsc, watch};

pub(crate) use events::LinkEvents;
pub use events::LinkStatus;
pub use options::{ReceiverOptions, SenderOptions};
pub(crate) use peer::PeerAttach;
pub use receiver::{Receiver, Settler};
pub use sender::Sender;

use super::command::{Command, ConnCtx, ConnInner, LinkEvent, LinkRef, LinkSetup};
use crate::delivery::LinkFlow;
use crate::error::{AmqpError, Result};
use crate::performative::Attach;

/// The part of [`Sender`] and [`Receiver`] that does not depend on the direction: building
/// the handle from its [`LinkParts`], its name and attaches, whether it is attached, and
/// detaching. Both handles hold the same fields (`core`, `events`, `local`, `remote`).
macro_rules! link_handle {
    ($handle:ident) => {
        impl $handle {
            pub(crate) fn from_parts(p: $crate::core::link::LinkParts) -> Self {
                Self {
                    core: p.core,
                    events: $crate::core::link::LinkEvents::new(p.events, p.flow),
                    local: p.local,
                    remote: p.remote,
                }
            }

            /// Link name.
            pub fn name(&self) -> &str {
                &self.core.name
            }

            /// Our `attach`.
            pub fn local_attach(&self) -> &Attach {
                &self.local
            }

            /// The peer's `attach`.
            pub fn remote_attach(&self) -> &Attach {
                &self.remote
            }

            /// Target address (ours).
            pub fn target_address(&self) -> Option<&str> {
                $crate::core::link::address_of_target(&self.local)
            }

            /// Whether the link is still attached (see [`LinkStatus::is_attached`]).
            pub fn is_attached(&self) -> bool {
                self.events.status().is_attached()
            }

            /// A handle telling from any task whether this link is still attached.
            pub fn status(&self) -> LinkStatus {
                self.events.status()
            }

            /// Detaches (closing the link) and waits for the peer's detach.
            ///
            /// # Errors
            /// Connection errors.
            pub async fn detach(mut self) -> Result<()> {
                self.core.detach(None).await
            }

            /// Detaches with an error condition.
            ///
            /// # Errors
            /// Connection errors.
            pub async fn detach_with_error(mut self, error: AmqpError) -> Result<()> {
                self.core.detach(Some(error)).await
            }
        }
    };
}
use link_handle;

/// What a link handle is built from once its attach is answered.
pub(crate) struct LinkParts {
    pub(crate) core: LinkCore,
    pub(crate) events: mpsc::UnboundedReceiver<LinkEvent>,
    pub(crate) flow: watch::Receiver<LinkFlow>,
    pub(crate) local: Box<Attach>,
    pub(crate) remote: Box<Attach>,
}

/// The handle's ends of a new link's event queue and credit state, held while the attach
/// waits for its answer; the driver's ends travel in the [`LinkSetup`].
pub(crate) struct LinkPipes {
    events: mpsc::UnboundedReceiver<LinkEvent>,
    flow: watch::Receiver<LinkFlow>,
}

impl LinkPipes {
    /// Both ends of a new link's queues: the driver's (with how it tops up credit and answers
    /// drain) and the handle's.
    pub(crate) fn open(auto_credit: Option<u32>, auto_drain: bool) -> (LinkSetup, Self) {
        let (etx, erx) = mpsc::unbounded_channel();
        let (ftx, frx) = watch::channel(LinkFlow::default());
        let setup = LinkSetup {
            events: etx,
            flow: ftx,
            auto_credit,
            auto_drain,
            max_incoming: None,
        };
        (
            setup,
            Self {
                events: erx,
                flow: frx,
            },
        )
    }

    /// The handle's parts once the driver numbered the link (`core.at.handle`); `local` is the
    /// attach we sent, renumbered to that handle.
    pub(crate) fn into_parts(
        self,
        core: LinkCore,
        mut local: Attach,
        remote: Box<Attach>,
    ) -> LinkParts {
        local.handle = Handle(core.at.handle);
        LinkParts {
            core,
            events: self.events,
            flow: self.flow,
            local: Box::new(local),
            remote,
        }
    }
}

/// A link's address in the driver and what keeps its session or connection alive; dropping
/// it detaches the link.
#[derive(Debug)]
pub(crate) struct LinkCore {
    pub(crate) ctx: ConnCtx,
    /// Channel, handle and key: the driver refuses commands for a link that is gone, whatever
    /// link took its handle number since.
    pub(crate) at: LinkRef,
    pub(crate) name: String,
    pub(crate) detached: bool,
    /// Keeps the session open while the link lives; held for its drop only, so the link
    /// names no session type (sessions own links, not the reverse).
    pub(crate) _session: Option<Arc<dyn std::fmt::Debug + Send + Sync>>,
    pub(crate) _conn: Option<Arc<ConnInner>>,
}

impl Drop for LinkCore {
    fn drop(&mut self) {
        if !self.detached {
            // The driver may already be gone; then the link is gone too.
            let _ = self.ctx.cmd.send(Command::Detach {
                link: self.at,
                error: None,
                reply: None,
            });
        }
    }
}

impl LinkCore {
    /// The driver's link `at`, keeping its `session` (links we attach) or its `conn` (links
    /// the peer attached) alive.
    pub(crate) fn new(
        ctx: ConnCtx,
        at: LinkRef,
        name: String,
        session: Option<Arc<dyn std::fmt::Debug + Send + Sync>>,
        conn: Option<Arc<ConnInner>>,
    ) -> Self {
        Self {
            ctx,
            at,
            name,
            detached: false,
            _session: session,
            _conn: conn,
        }
    }

    pub(crate) async fn detach(&mut self, error: Option<AmqpError>) -> Result<()> {
        self.detached = true;
        let link = self.at;
        self.ctx
            .call(|reply| Command::Detach {
                link,
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
