//! Values exchanged with the application: outcomes, deliveries, messages to send.

use bytes::Bytes;
use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::messaging::{
    Accepted, Body, DeliveryState, Message, Modified, Rejected, Released,
    message::__private::{Deserializable, Serializable},
};
use serde_amqp::Value;

use crate::error::{AmqpError, Error, Result};

/// The message type decoded by [`Delivery::message`]: any body, values kept generic.
pub type AnyMessage = Message<Body<Value>>;

/// Message format used by Service Bus batches (`0x80013700`).
pub const BATCH_MESSAGE_FORMAT: u32 = 0x8001_3700;

/// A terminal delivery state.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Outcome {
    /// `accepted`.
    Accepted,
    /// `rejected`, with the error if the peer gave one.
    Rejected(Option<AmqpError>),
    /// `released`.
    Released,
    /// `modified`.
    Modified {
        /// `delivery-failed`.
        delivery_failed: bool,
        /// `undeliverable-here`.
        undeliverable_here: bool,
        /// `message-annotations` to merge.
        message_annotations: Option<Fields>,
    },
}

impl Outcome {
    /// True for [`Outcome::Accepted`].
    pub fn is_accepted(&self) -> bool {
        matches!(self, Outcome::Accepted)
    }

    /// The rejection error, if this is a rejection carrying one.
    pub fn error(&self) -> Option<&AmqpError> {
        match self {
            Outcome::Rejected(e) => e.as_ref(),
            _ => None,
        }
    }

    /// `Ok(())` when accepted, else a typed error ([`Error::Rejected`] keeps the condition).
    ///
    /// # Errors
    /// [`Error::Rejected`] or [`Error::NotAccepted`].
    pub fn into_result(self) -> Result<()> {
        match self {
            Outcome::Accepted => Ok(()),
            Outcome::Rejected(e) => Err(Error::Rejected(e)),
            Outcome::Released => Err(Error::NotAccepted("released".into())),
            Outcome::Modified { .. } => Err(Error::NotAccepted("modified".into())),
        }
    }

    /// Same outcome type without details, as a broker echoes it (`rejected` without error).
    pub fn same_type(&self) -> Outcome {
        match self {
            Outcome::Rejected(_) => Outcome::Rejected(None),
            Outcome::Modified { .. } => Outcome::Modified {
                delivery_failed: false,
                undeliverable_here: false,
                message_annotations: None,
            },
            o => o.clone(),
        }
    }

    /// Converts a wire delivery state; `received` (not terminal) gives `None`.
    pub fn from_state(s: &DeliveryState) -> Option<Outcome> {
        Some(match s {
            DeliveryState::Accepted(_) => Outcome::Accepted,
            DeliveryState::Rejected(r) => Outcome::Rejected(r.error.clone().map(Into::into)),
            DeliveryState::Released(_) => Outcome::Released,
            DeliveryState::Modified(m) => Outcome::Modified {
                delivery_failed: m.delivery_failed.unwrap_or(false),
                undeliverable_here: m.undeliverable_here.unwrap_or(false),
                message_annotations: m.message_annotations.clone(),
            },
            _ => return None,
        })
    }
}

impl From<Outcome> for DeliveryState {
    fn from(o: Outcome) -> Self {
        match o {
            Outcome::Accepted => DeliveryState::Accepted(Accepted {}),
            Outcome::Rejected(e) => DeliveryState::Rejected(Rejected {
                error: e.map(Into::into),
            }),
            Outcome::Released => DeliveryState::Released(Released {}),
            Outcome::Modified {
                delivery_failed,
                undeliverable_here,
                message_annotations,
            } => DeliveryState::Modified(Modified {
                delivery_failed: Some(delivery_failed),
                undeliverable_here: Some(undeliverable_here),
                message_annotations,
            }),
        }
    }
}

/// One complete incoming delivery: the raw message bytes as sent, plus transfer metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    /// Session-scoped delivery id.
    pub delivery_id: u32,
    /// The sender's delivery tag.
    pub delivery_tag: Bytes,
    /// `message-format` of the first transfer frame (0 for plain AMQP messages).
    pub message_format: u32,
    /// True if the sender sent it pre-settled (no disposition is needed).
    pub settled: bool,
    /// Delivery state the sender put on the transfer, if any.
    pub state: Option<DeliveryState>,
    /// The encoded message exactly as received (all frames joined).
    pub payload: Bytes,
}

impl Delivery {
    /// Decodes the payload into a message with generic body values.
    ///
    /// # Errors
    /// [`Error::Decode`] if the payload is not a valid AMQP message.
    pub fn message(&self) -> Result<AnyMessage> {
        decode_message(&self.payload)
    }
}

/// Decodes an encoded AMQP message: the bytes pass [`crate::validate_encoding`] (every
/// length, count and nesting level bounded by the bytes present) before `serde_amqp` reads them.
///
/// # Errors
/// [`Error::Decode`] if the bytes are not a valid AMQP message.
pub fn decode_message(b: &[u8]) -> Result<AnyMessage> {
    crate::decode::decode::<Deserializable<AnyMessage>>(b).map(|d| d.0)
}

/// Encodes an AMQP message.
///
/// # Errors
/// [`Error::Encode`] if a section does not encode.
pub fn encode_message<B>(m: &Message<B>) -> Result<Bytes>
where
    B: fe2o3_amqp_types::messaging::SerializableBody,
{
    serde_amqp::to_vec(&Serializable(m))
        .map(Bytes::from)
        .map_err(|e| Error::Encode(e.to_string()))
}

/// A message ready to send: the encoded bytes plus transfer metadata.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sendable {
    /// Encoded message (one or more sections, or a batch for format `0x80013700`).
    pub payload: Bytes,
    /// Delivery tag; `None` lets the link pick a unique one.
    pub delivery_tag: Option<Bytes>,
    /// `message-format` (0 by default).
    pub message_format: u32,
}

impl Sendable {
    /// Wraps already encoded message bytes.
    pub fn raw(payload: impl Into<Bytes>) -> Self {
        Self {
            payload: payload.into(),
            ..Default::default()
        }
    }

    /// Encodes a message.
    ///
    /// # Errors
    /// [`Error::Encode`] if a section does not encode.
    pub fn message<B>(m: &Message<B>) -> Result<Self>
    where
        B: fe2o3_amqp_types::messaging::SerializableBody,
    {
        Ok(Self::raw(encode_message(m)?))
    }

    /// Sets the delivery tag.
    #[must_use]
    pub fn tag(mut self, tag: impl Into<Bytes>) -> Self {
        self.delivery_tag = Some(tag.into());
        self
    }

    /// Sets the message format (e.g. [`BATCH_MESSAGE_FORMAT`]).
    #[must_use]
    pub fn format(mut self, format: u32) -> Self {
        self.message_format = format;
        self
    }
}

/// Link credit as last seen by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LinkFlow {
    /// Credit left (sender: what the receiver granted; receiver: what we granted).
    pub credit: u32,
    /// Current delivery count.
    pub delivery_count: u32,
    /// True while the receiver asks the sender to drain.
    pub drain: bool,
    /// `available` as reported by the sender.
    pub available: u32,
}

/// A disposition from the receiving peer about a delivery sent with
/// [`crate::Sender::send_no_wait`].
#[derive(Debug, Clone, PartialEq)]
pub struct IncomingDisposition {
    /// The delivery id.
    pub delivery_id: u32,
    /// The delivery tag we used.
    pub delivery_tag: Bytes,
    /// The peer's state (outcome) for it.
    pub state: Option<DeliveryState>,
    /// True if the peer settled; false if it waits for our settlement
    /// (answer with [`crate::Sender::settle`]).
    pub settled: bool,
}

impl IncomingDisposition {
    /// The peer's state as an outcome, if terminal.
    pub fn outcome(&self) -> Option<Outcome> {
        self.state.as_ref().and_then(Outcome::from_state)
    }
}
