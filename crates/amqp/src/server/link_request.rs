//! Answering a client's attach: [`LinkRequest`] (what the client asked for) and
//! [`LinkAnswer`] (how we answer).

use fe2o3_amqp_types::definitions::{Fields, Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Source, TargetArchetype};
use serde_amqp::primitives::{Array, Symbol};

use crate::builder::setters;
use crate::core::link::{LinkParts, PeerAttach, address_of_source, address_of_target};
use crate::core::{Receiver, Sender};
use crate::error::{AmqpError, Error, Result};
use crate::performative::Attach;

/// How to answer a client's attach.
#[derive(Debug, Clone)]
pub struct LinkAnswer {
    /// `initial-delivery-count` when we are the sender (Python requires it).
    pub initial_delivery_count: u32,
    /// `max-message-size` to advertise.
    pub max_message_size: Option<u64>,
    /// Sender settle mode; `None` echoes the client's.
    pub snd_settle_mode: Option<SenderSettleMode>,
    /// Receiver settle mode; `None` echoes the client's.
    pub rcv_settle_mode: Option<ReceiverSettleMode>,
    /// Source to answer with; `None` echoes the client's.
    pub source: Option<Source>,
    /// Target to answer with; `None` echoes the client's.
    pub target: Option<TargetArchetype>,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Offered capabilities.
    pub offered_capabilities: Option<Vec<String>>,
    /// Receiving links: keep this much credit topped up.
    pub auto_credit: Option<u32>,
    /// Sending links: answer drain automatically when nothing is queued (default true).
    pub auto_drain: bool,
    /// Receiving links: the largest delivery the engine takes, when the application measures
    /// sizes itself against the advertised `max-message-size` (`None`: that size).
    pub max_incoming: Option<u64>,
}

impl Default for LinkAnswer {
    fn default() -> Self {
        Self {
            initial_delivery_count: 0,
            max_message_size: None,
            snd_settle_mode: None,
            rcv_settle_mode: None,
            source: None,
            target: None,
            properties: None,
            offered_capabilities: None,
            auto_credit: None,
            auto_drain: true,
            max_incoming: None,
        }
    }
}

impl LinkAnswer {
    /// Grants (and keeps topping up) `n` credit on a receiving link.
    #[must_use]
    pub fn credit(mut self, n: u32) -> Self {
        self.auto_credit = Some(n);
        self
    }

    setters! {
        /// Sets `max-message-size`.
        max_message_size(u64) => Some;
        /// Sets the receiver settle mode (e.g. `first` for a client asking `second` on send).
        rcv_settle_mode(ReceiverSettleMode) => Some;
        /// Sets the sender settle mode.
        snd_settle_mode(SenderSettleMode) => Some;
        /// Sets `initial-delivery-count`.
        initial_delivery_count(u32);
        /// Takes deliveries up to this size, whatever `max-message-size` says (see
        /// [`LinkAnswer::max_incoming`]).
        max_incoming(u64) => Some;
    }

    /// Leaves drain answers to the application ([`Sender::answer_drain`]).
    #[must_use]
    pub fn manual_drain(mut self) -> Self {
        self.auto_drain = false;
        self
    }
}

/// A client's attach waiting for the application's answer.
///
/// Dropping it unanswered refuses the link with `amqp:not-found`.
#[derive(Debug)]
pub struct LinkRequest {
    peer: PeerAttach,
}

impl LinkRequest {
    pub(super) fn new(peer: PeerAttach) -> Self {
        Self { peer }
    }

    fn remote(&self) -> &Attach {
        self.peer.remote()
    }

    /// Link name.
    pub fn name(&self) -> &str {
        &self.remote().name
    }

    /// The local channel of the session the link was attached on (for
    /// [`crate::Connection::end_session`]).
    pub fn channel(&self) -> u16 {
        self.peer.channel()
    }

    /// The client's attach.
    pub fn remote_attach(&self) -> &Attach {
        self.remote()
    }

    /// True if the client sends on this link (answer with [`LinkRequest::accept_receiver`]).
    pub fn is_peer_sender(&self) -> bool {
        self.remote().role == Role::Sender
    }

    /// The client's source address.
    pub fn source_address(&self) -> Option<&str> {
        address_of_source(self.remote())
    }

    /// The client's target address.
    pub fn target_address(&self) -> Option<&str> {
        address_of_target(self.remote())
    }

    fn answer_attach(&self, a: &LinkAnswer) -> Attach {
        let r = self.remote();
        let role = self.peer.our_role();
        Attach {
            name: r.name.clone(),
            handle: Handle(0),
            role: role.clone(),
            snd_settle_mode: a
                .snd_settle_mode
                .clone()
                .unwrap_or(r.snd_settle_mode.clone()),
            rcv_settle_mode: a
                .rcv_settle_mode
                .clone()
                .unwrap_or(r.rcv_settle_mode.clone()),
            source: a.source.clone().map(Box::new).or_else(|| r.source.clone()),
            target: a.target.clone().map(Box::new).or_else(|| r.target.clone()),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: (role == Role::Sender).then_some(a.initial_delivery_count),
            max_message_size: a.max_message_size,
            offered_capabilities: a
                .offered_capabilities
                .as_ref()
                .map(|v| Array(v.iter().map(|s| Symbol::from(s.as_str())).collect())),
            desired_capabilities: None,
            properties: a.properties.clone(),
        }
    }

    /// Accepts a link on which the client receives: we send.
    ///
    /// # Errors
    /// [`Error::IllegalState`] if the client is the sender; connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %self.name(), channel = self.peer.channel()))]
    pub async fn accept_sender(self, answer: LinkAnswer) -> Result<Sender> {
        if self.is_peer_sender() {
            return Err(Error::IllegalState("the client sends on this link"));
        }
        let parts = self.accept(answer).await?;
        Ok(Sender::from_parts(parts))
    }

    /// Accepts a link on which the client sends: we receive.
    ///
    /// # Errors
    /// [`Error::IllegalState`] if the client is the receiver; connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %self.name(), channel = self.peer.channel()))]
    pub async fn accept_receiver(self, answer: LinkAnswer) -> Result<Receiver> {
        if !self.is_peer_sender() {
            return Err(Error::IllegalState("the client receives on this link"));
        }
        let parts = self.accept(answer).await?;
        Ok(Receiver::from_parts(parts))
    }

    /// Answers the peer's attach with ours (see [`LinkAnswer`]) and builds the handle's parts.
    async fn accept(self, answer: LinkAnswer) -> Result<LinkParts> {
        let attach = self.answer_attach(&answer);
        self.peer
            .accept(
                attach,
                answer.auto_credit,
                answer.auto_drain,
                answer.max_incoming,
            )
            .await
    }

    /// Refuses the link: completes the attach, then detaches with `error`
    /// (e.g. `amqp:not-found` for an unknown entity).
    ///
    /// # Errors
    /// Connection errors.
    pub async fn reject(self, error: AmqpError) -> Result<()> {
        let attach = self.peer.echo_attach();
        self.peer.refuse(attach, error).await
    }
}
