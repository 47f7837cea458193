//! [`Receiver`]: a receiving link, ours or one the peer attached to send to us; [`Settler`]
//! settles its deliveries from any task.

use fe2o3_amqp_types::definitions::{ReceiverSettleMode, Role};

use super::{LinkCore, LinkEvents, LinkStatus, address_of_source, link_handle};
use crate::core::command::{Command, ConnCtx, CreditOp, DeliveryDisposition, LinkEvent, LinkRef};
use crate::delivery::{Delivery, LinkFlow, Outcome};
#[cfg(doc)]
use crate::error::Error;
use crate::error::{AmqpError, Result};
use crate::performative::Attach;

/// A receiving link (client side, or a server-side link a client sends to).
#[derive(Debug)]
pub struct Receiver {
    core: LinkCore,
    events: LinkEvents,
    local: Box<Attach>,
    remote: Box<Attach>,
}

impl Receiver {
    /// Source address (ours).
    pub fn source_address(&self) -> Option<&str> {
        address_of_source(&self.local)
    }

    async fn credit(&self, op: CreditOp, drain: bool) -> Result<()> {
        let link = self.core.at;
        self.core
            .ctx
            .call(|reply| Command::Credit {
                link,
                op,
                drain,
                reply,
            })
            .await
    }

    /// Sets the link credit to `n` (sends a `flow`).
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn set_credit(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Set(n), false).await
    }

    /// Adds `n` to the link credit.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn add_credit(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Add(n), false).await
    }

    /// Asks the sender to drain: it sends what it can, then spends the rest of the credit.
    /// Returns when the credit is zero. Deliveries that arrived stay queued for
    /// [`Receiver::recv`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn drain(&self) -> Result<()> {
        self.credit(CreditOp::Add(0), true).await
    }

    /// Sets the credit to `n` and asks the sender to drain, in one `flow`; returns when the
    /// credit is zero.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn drain_with(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Set(n), true).await
    }

    /// Credit state as last seen.
    pub fn flow(&self) -> LinkFlow {
        self.events.flow()
    }

    /// Waits for the next delivery.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] with the peer's condition once the link is gone, or the
    /// connection's error.
    pub async fn recv(&self) -> Result<Delivery> {
        self.events
            .next(&self.core.ctx, |ev| match ev {
                LinkEvent::Delivery(d) => Some(d),
                _ => None,
            })
            .await
    }

    /// Returns a delivery if one is queued (`Ok(None)` also while another task waits in
    /// [`Receiver::recv`]).
    ///
    /// # Errors
    /// As [`Receiver::recv`].
    pub fn try_recv(&self) -> Result<Option<Delivery>> {
        self.events.try_next(&self.core.ctx, |ev| match ev {
            LinkEvent::Delivery(d) => Some(d),
            _ => None,
        })
    }

    /// Sends a disposition with `outcome`.
    ///
    /// With receiver settle mode `first` the disposition is settled and this returns
    /// `Ok(None)` once written. With `second` it is unsettled and this waits for the peer's
    /// settled reply and returns the peer's outcome (e.g. `rejected` with
    /// `com.microsoft:message-lock-lost`). A pre-settled delivery needs nothing: `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors; [`Error::IllegalState`] for a delivery
    /// already settled.
    #[tracing::instrument(level = "trace", skip_all, fields(link = %self.core.name, delivery_id = d.delivery_id))]
    pub async fn settle(&self, d: &Delivery, outcome: Outcome) -> Result<Option<Outcome>> {
        if d.settled {
            return Ok(None);
        }
        self.settler().settle(d.delivery_id, outcome).await
    }

    /// `settle(d, Outcome::Accepted)`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn accept(&self, d: &Delivery) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Accepted).await
    }

    /// `settle(d, Outcome::Rejected(error))`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn reject(&self, d: &Delivery, error: Option<AmqpError>) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Rejected(error)).await
    }

    /// `settle(d, Outcome::Released)`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn release(&self, d: &Delivery) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Released).await
    }
}

link_handle!(Receiver);

/// Settles deliveries of one [`Receiver`] from any task, while another task waits in
/// [`Receiver::recv`]. Cheap to clone.
///
/// Once its link is gone (detached, its session ended, the connection lost) every settlement
/// fails with [`Error::LinkDetached`] or [`Error::SessionEnded`], even if a new link took the
/// link's handle number or a new session its channel and holds a delivery with the same id.
#[derive(Debug, Clone)]
pub struct Settler {
    ctx: ConnCtx,
    link: LinkRef,
    settle_first: bool,
}

impl Receiver {
    /// A settlement handle for this link's deliveries.
    pub fn settler(&self) -> Settler {
        Settler {
            ctx: self.core.ctx.clone(),
            link: self.core.at,
            settle_first: self.local.rcv_settle_mode == ReceiverSettleMode::First,
        }
    }
}

impl Settler {
    /// As [`Receiver::settle`], by delivery id: with receiver settle mode `second` it waits for
    /// the peer's settled reply and returns the peer's outcome.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] or [`Error::SessionEnded`] once the link is gone; connection
    /// errors; [`Error::IllegalState`] for a delivery of the link already settled.
    pub async fn settle(&self, delivery_id: u32, outcome: Outcome) -> Result<Option<Outcome>> {
        let (link, settled) = (self.link, self.settle_first);
        let state = self
            .ctx
            .call(|reply| Command::Dispose {
                disposition: DeliveryDisposition {
                    link,
                    role: Role::Receiver,
                    delivery_id,
                    settled,
                    state: Some(outcome.into()),
                },
                reply,
            })
            .await?;
        Ok(state.as_ref().and_then(Outcome::from_state))
    }

    /// How many received deliveries of this link's session are not settled yet (tests check
    /// that nothing is left behind).
    ///
    /// # Errors
    /// The connection's error if it ended.
    pub async fn unsettled(&self) -> Result<usize> {
        let session = self.link.session();
        self.ctx
            .call(|reply| Command::Unsettled { session, reply })
            .await
    }
}
