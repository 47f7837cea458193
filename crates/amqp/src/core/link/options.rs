//! What a link we attach asks for: [`SenderOptions`], [`ReceiverOptions`].

use fe2o3_amqp_types::definitions::{Fields, Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{FilterSet, Source, Target, TargetArchetype};

use crate::builder::setters;
use crate::performative::Attach;

fn source(address: Option<String>) -> Source {
    Source {
        address,
        ..Default::default()
    }
}

fn target(address: Option<String>) -> TargetArchetype {
    TargetArchetype::Target(Target {
        address,
        ..Default::default()
    })
}

/// Options for [`crate::Session::attach_sender`].
#[derive(Debug, Clone)]
pub struct SenderOptions {
    /// Link name.
    pub name: String,
    /// Target address.
    pub target: Option<String>,
    /// Source address.
    pub source: Option<String>,
    /// Sender settle mode (default `unsettled`; `settled` for fire-and-forget links).
    pub snd_settle_mode: SenderSettleMode,
    /// Receiver settle mode we ask for.
    pub rcv_settle_mode: ReceiverSettleMode,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Answer a receiver's drain automatically when nothing is queued (default true).
    pub auto_drain: bool,
}

impl SenderOptions {
    /// A sender named `name` to `target`.
    pub fn new(name: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            target: Some(target.into()),
            source: None,
            snd_settle_mode: SenderSettleMode::Unsettled,
            rcv_settle_mode: ReceiverSettleMode::First,
            properties: None,
            auto_drain: true,
        }
    }

    setters! {
        /// Sets the sender settle mode.
        snd_settle_mode(SenderSettleMode);
        /// Sets the receiver settle mode we ask for.
        rcv_settle_mode(ReceiverSettleMode);
        /// Sets the source address.
        source(into String) => Some;
        /// Sets link properties.
        properties(Fields) => Some;
    }

    pub(crate) fn into_attach(self) -> Attach {
        Attach {
            name: self.name,
            handle: Handle(0),
            role: Role::Sender,
            snd_settle_mode: self.snd_settle_mode,
            rcv_settle_mode: self.rcv_settle_mode,
            source: Some(Box::new(source(self.source))),
            target: Some(Box::new(target(self.target))),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: self.properties,
        }
    }
}

/// Options for [`crate::Session::attach_receiver`].
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// Link name.
    pub name: String,
    /// Source address.
    pub source: Option<String>,
    /// Target address (the reply address for request/response).
    pub target: Option<String>,
    /// Receiver settle mode (`first` settles on disposition; `second` waits for the peer).
    pub rcv_settle_mode: ReceiverSettleMode,
    /// Sender settle mode we ask for.
    pub snd_settle_mode: SenderSettleMode,
    /// Source filter set.
    pub filter: Option<FilterSet>,
    /// Keep this much credit topped up automatically (refilled at half).
    pub auto_credit: Option<u32>,
    /// Credit granted once after attach (ignored with `auto_credit`).
    pub credit: Option<u32>,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Our `max-message-size`: larger deliveries are rejected with
    /// `amqp:link:message-size-exceeded` without being buffered.
    pub max_message_size: Option<u64>,
}

impl ReceiverOptions {
    /// A receiver named `name` from `source`, granting no credit until asked.
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            source: Some(source.into()),
            target: None,
            rcv_settle_mode: ReceiverSettleMode::First,
            snd_settle_mode: SenderSettleMode::Unsettled,
            filter: None,
            auto_credit: None,
            credit: None,
            properties: None,
            max_message_size: None,
        }
    }

    setters! {
        /// Sets our `max-message-size`.
        max_message_size(u64) => Some;
        /// Sets the receiver settle mode.
        rcv_settle_mode(ReceiverSettleMode);
        /// Sets the sender settle mode we ask for.
        snd_settle_mode(SenderSettleMode);
        /// Sets the target address.
        target(into String) => Some;
        /// Keeps `n` credit topped up automatically.
        auto_credit(u32) => Some;
        /// Grants `n` credit once after attaching.
        credit(u32) => Some;
        /// Sets the source filter set.
        filter(FilterSet) => Some;
    }

    pub(crate) fn into_attach(self) -> Attach {
        let mut src = source(self.source);
        src.filter = self.filter;
        Attach {
            name: self.name,
            handle: Handle(0),
            role: Role::Receiver,
            snd_settle_mode: self.snd_settle_mode,
            rcv_settle_mode: self.rcv_settle_mode,
            source: Some(Box::new(src)),
            target: Some(Box::new(target(self.target))),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: None,
            max_message_size: self.max_message_size,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: self.properties,
        }
    }
}
