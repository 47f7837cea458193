//! [`Sender`]: a sending link, ours or one the peer attached to receive from us.

use fe2o3_amqp_types::definitions::Role;

use super::{LinkCore, LinkEvents, LinkStatus, link_handle};
use crate::core::command::{Command, DeliveryDisposition, LinkEvent, SendReport, Track};
use crate::delivery::{IncomingDisposition, LinkFlow, Outcome, Sendable};
#[cfg(doc)]
use crate::error::Error;
use crate::error::{AmqpError, Result};
use crate::performative::Attach;

/// A sending link (client side, or a server-side link a client receives from).
#[derive(Debug)]
pub struct Sender {
    core: LinkCore,
    events: LinkEvents,
    local: Box<Attach>,
    remote: Box<Attach>,
}

impl Sender {
    /// The peer's `max-message-size` (0 = unlimited).
    pub fn max_message_size(&self) -> u64 {
        self.remote.max_message_size.unwrap_or(0)
    }

    async fn send_tracked(&self, send: Sendable, track: Track) -> Result<SendReport> {
        let link = self.core.at;
        self.core
            .ctx
            .call(|reply| Command::Send {
                link,
                send,
                track,
                reply,
            })
            .await
    }

    /// Sends unsettled and waits for the peer's outcome (settling it if the peer does not).
    ///
    /// Waits for credit first. A peer that settles without a state counts as accepted.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors; a rejection is an `Ok(Outcome::Rejected)`.
    #[tracing::instrument(level = "trace", skip_all, fields(link = %self.core.name))]
    pub async fn send(&self, send: Sendable) -> Result<Outcome> {
        let r = self.send_tracked(send, Track::Await).await?;
        Ok(r.state
            .as_ref()
            .and_then(Outcome::from_state)
            .unwrap_or(Outcome::Accepted))
    }

    /// Sends pre-settled; returns the delivery id once written.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn send_settled(&self, send: Sendable) -> Result<u32> {
        Ok(self.send_tracked(send, Track::Settled).await?.delivery_id)
    }

    /// Sends unsettled without waiting for the outcome: returns the delivery id once written.
    /// The peer's dispositions arrive through [`Sender::next_disposition`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn send_no_wait(&self, send: Sendable) -> Result<u32> {
        Ok(self.send_tracked(send, Track::Events).await?.delivery_id)
    }

    /// Next disposition from the peer for a delivery sent with [`Sender::send_no_wait`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] once the link is gone, or the connection's error.
    pub async fn next_disposition(&self) -> Result<IncomingDisposition> {
        self.events
            .next(&self.core.ctx, |ev| match ev {
                LinkEvent::Disposition(d) => Some(d),
                _ => None,
            })
            .await
    }

    /// Settles a delivery the peer disposed without settling (receiver settle mode
    /// `second`), with the outcome we choose (e.g. the same type, or
    /// `rejected{com.microsoft:message-lock-lost}`).
    ///
    /// # Errors
    /// [`Error::IllegalState`] for an unknown or already settled delivery.
    pub async fn settle(&self, delivery_id: u32, outcome: Outcome) -> Result<()> {
        let link = self.core.at;
        self.core
            .ctx
            .call(|reply| Command::Dispose {
                disposition: DeliveryDisposition {
                    link,
                    role: Role::Sender,
                    delivery_id,
                    settled: true,
                    state: Some(outcome.into()),
                },
                reply,
            })
            .await
            .map(|_| ())
    }

    /// Credit and drain state as last seen.
    pub fn flow(&self) -> LinkFlow {
        self.events.flow()
    }

    /// Waits for the next change of credit or drain state.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] (or the session's/connection's error) once the link is gone.
    pub async fn flow_changed(&self) -> Result<LinkFlow> {
        self.events.flow_changed(&self.core.ctx).await
    }

    /// Waits until the receiver granted credit.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] (or the session's/connection's error) once the link is gone.
    pub async fn wait_credit(&self) -> Result<LinkFlow> {
        self.events.wait_credit(&self.core.ctx).await
    }

    /// Answers a receiver's drain request: spends the remaining credit and reports it.
    ///
    /// # Errors
    /// The connection's error if it ended.
    pub fn answer_drain(&self) -> Result<()> {
        self.core
            .ctx
            .send(Command::AnswerDrain { link: self.core.at })
    }
}

link_handle!(Sender);
