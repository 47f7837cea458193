//! The envelope port: how a delivery yields its contract, its own id, its body and its headers.
//!
//! Producers wrap the same business event in different envelopes: our subject-versioned form
//! (`subject` = `name.vN`, the body is the contract), MassTransit's JSON envelope, NServiceBus
//! native headers, CloudEvents. A consumer reads its entity with one [`EnvelopeReader`]; the
//! runtime then applies the same rules to every envelope: the logical id (the inbox key) is
//! the [`LOGICAL_ID_PROPERTY`](super::LOGICAL_ID_PROPERTY) of a retry copy or a resubmitted
//! dead letter when present, else the envelope's own id ([`Opened::id`]), else the broker
//! message id; the contract must be one a handler accepts; the body goes to the handler's
//! decoder.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use super::{Contract, ContractParseError, DeadLetterReason, Rejection};
use crate::ports::{Message, PropertyValue};

/// Named values an envelope carries beside the body (MassTransit `headers`, NServiceBus or
/// CloudEvents application properties): what middleware reads a tenant or a trace field from.
/// JSON values that are not strings, integers, floats or booleans are kept as their JSON text.
pub type Headers = BTreeMap<String, PropertyValue>;

/// The most headers an envelope may carry in its body (MassTransit's `headers`, a CloudEvent's
/// extension attributes); more is refused, so a hostile body cannot make the reader copy an
/// unbounded map.
pub const MAX_ENVELOPE_HEADERS: usize = 128;

/// The longest header value kept from an envelope's body, in bytes; longer values are cut at a
/// character boundary (ending `…`). Broker application properties are kept as they came.
pub const MAX_HEADER_VALUE_LEN: usize = 4096;

/// A JSON header value as a [`PropertyValue`]: strings, integers, floats and booleans as
/// themselves; anything else (objects, arrays, integers beyond `i64`) as its JSON text; `None`
/// for `null`.
pub(crate) fn json_property(value: &serde_json::Value) -> Option<PropertyValue> {
    use serde_json::Value;
    let bounded = |text: &str| super::truncate(text, MAX_HEADER_VALUE_LEN);
    Some(match value {
        Value::Null => return None,
        Value::Bool(b) => PropertyValue::Bool(*b),
        Value::String(s) => PropertyValue::String(bounded(s)),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => PropertyValue::Long(i),
            (None, Some(f)) if !n.is_u64() => PropertyValue::Double(f),
            _ => PropertyValue::String(n.to_string()),
        },
        other => PropertyValue::String(bounded(&other.to_string())),
    })
}

/// What an [`EnvelopeReader`] found in a delivery.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Opened<'m> {
    /// The contract the envelope names, mapped to a name and a version.
    pub contract: Contract,
    /// The envelope's own message id (MassTransit `messageId`, `NServiceBus.MessageId`, the
    /// CloudEvent's id), or `None` where the broker message id is the envelope's id.
    pub id: Option<Cow<'m, str>>,
    /// The bytes the handler decodes: the whole body, or the payload inside the envelope.
    pub body: Cow<'m, [u8]>,
    /// The envelope's headers.
    pub headers: Cow<'m, Headers>,
}

impl<'m> Opened<'m> {
    /// An envelope whose id is the broker's, whose body is `body` and whose headers are the
    /// message's application properties.
    pub fn new(contract: Contract, body: Cow<'m, [u8]>, headers: Cow<'m, Headers>) -> Self {
        Opened {
            contract,
            id: None,
            body,
            headers,
        }
    }

    /// The same, with the envelope's own message id.
    #[must_use]
    pub fn with_id(mut self, id: impl Into<Cow<'m, str>>) -> Self {
        self.id = Some(id.into());
        self
    }
}

/// Reads one kind of envelope. A delivery it cannot read (no contract, a malformed envelope)
/// is a [`Rejection`]: dead-lettered before any database work, with a reason from the fixed
/// vocabulary and a description that never echoes the payload.
///
/// Implementations must be deterministic: every delivery of a message, and every retry copy
/// of it, must open to the same contract, id and body, or the inbox cannot recognise it.
pub trait EnvelopeReader: Send + Sync + fmt::Debug + 'static {
    /// The envelope's name in logs, metrics and `worker.toml` (`subject`, `masstransit`, …).
    fn kind(&self) -> &'static str;

    /// Reads the envelope of `message`.
    ///
    /// # Errors
    /// A [`Rejection`] when the message does not carry this envelope or carries it malformed.
    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection>;

    /// The table this envelope resolves foreign type names through, when it has one that
    /// decides which contracts can arrive (MassTransit, NServiceBus, CloudEvents, a raw
    /// envelope with types). A [`Worker`](crate::worker::Worker) compares it with the
    /// handler's contracts when it starts and refuses an empty table or a mismatch, which would
    /// otherwise dead-letter every message at run time. `None` (the default): nothing to check.
    fn type_map(&self) -> Option<&super::TypeMap> {
        None
    }
}

/// Our own envelope, the default: the AMQP `subject` names the contract as `<name>.v<N>`, the
/// body is the contract's encoding, and the broker message id is the envelope's id.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubjectVersioned;

impl EnvelopeReader for SubjectVersioned {
    fn kind(&self) -> &'static str {
        "subject"
    }

    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        let subject = match message.subject.as_deref() {
            None | Some("") => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    "the message has no subject naming its contract (<name>.v<version>)",
                ));
            }
            Some(subject) => subject,
        };
        let contract: Contract = subject.parse().map_err(|e: ContractParseError| {
            Rejection::new(DeadLetterReason::UnsupportedContract, e.to_string())
        })?;
        Ok(Opened::new(
            contract,
            Cow::Borrowed(&message.body[..]),
            Cow::Borrowed(&message.application_properties),
        ))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_subject_names_the_contract_and_the_body_is_the_payload() {
        let message = Message::new("m-1", "orders.order-placed.v2", "{}").with_property("t", "a");
        let opened = SubjectVersioned.open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 2));
        assert_eq!(opened.id, None);
        assert_eq!(&opened.body[..], b"{}");
        assert_eq!(opened.headers.get("t"), Some(&PropertyValue::from("a")));
    }

    #[test]
    fn a_missing_or_unversioned_subject_is_rejected_with_its_reason() {
        let mut message = Message::new("m-1", "", "{}");
        let rejected = |m: &Message| SubjectVersioned.open(m).unwrap_err().reason;
        assert_eq!(rejected(&message), DeadLetterReason::MissingContract);
        message.subject = None;
        assert_eq!(rejected(&message), DeadLetterReason::MissingContract);
        message.subject = Some("orders.order-placed".to_owned());
        assert_eq!(rejected(&message), DeadLetterReason::UnsupportedContract);
    }
}
