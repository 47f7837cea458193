//! Envelopes, the .NET dialects: how a delivery yields its contract, its own id, its body and
//! its headers (ours, MassTransit, NServiceBus, CloudEvents, raw), chosen per consumer with
//! [`RuntimeConfig::envelope`](crate::runtime::RuntimeConfig::envelope) or `envelope.kind` in
//! `worker.toml`; and the outbox's writers of the same envelopes.
//!
//! The envelope check lives here too: the logical id and the contract a message must carry
//! before any database work, and the dead-letter reasons and rejections when it does not. The
//! runtime calls the check and a consumer's [`EnvelopeReader`]; nothing here knows slots, locks
//! or settlement. The one runtime type named is the handler's
//! [`Context`](crate::runtime::Context), which the outbox writers read to continue a consumed
//! conversation.
//!
//! # Layout
//! - `reader`: the port, [`EnvelopeReader`] → [`Opened`], and our own [`SubjectVersioned`].
//! - One module per foreign envelope: `masstransit` ([`MassTransit`]: the JSON envelope and raw
//!   JSON), `nservicebus` ([`NServiceBus`]), `cloudevents` ([`CloudEvents`]: structured and
//!   binary), `raw` ([`Raw`]: fields named by configuration).
//! - `type_map`: [`TypeMap`], a consumer's table from foreign type names to contracts.
//! - `publish`: the mirror image for the outbox, [`MassTransitEnvelope`] and [`CloudEvent`]:
//!   events written in the envelope a .NET consumer reads.
//! - `json_body`: bounded, borrowing reads of JSON envelopes.

use std::borrow::Cow;
use std::fmt;

mod cloudevents;
mod json_body;
mod masstransit;
mod nservicebus;
mod publish;
mod raw;
mod reader;
mod type_map;

pub use cloudevents::{CLOUDEVENTS_JSON, CLOUDEVENTS_PREFIXES, CloudEvents, cloudevent_id};
pub use masstransit::{
    MASSTRANSIT_CONTENT_TYPE, MT_MESSAGE_ID_PROPERTY, MT_MESSAGE_TYPE_PROPERTY, MassTransit,
};
pub use nservicebus::{ENCLOSED_MESSAGE_TYPES, NSERVICEBUS_MESSAGE_ID, NServiceBus};
pub use publish::{
    CloudEvent, MAX_ENVELOPE_LEN, MAX_PROPERTIES_LEN, MassTransitEnvelope, PublishError,
};
pub use raw::{Field, FieldParseError, Raw, RawConfigError};
pub use reader::{
    EnvelopeReader, Headers, MAX_ENVELOPE_HEADERS, MAX_HEADER_VALUE_LEN, Opened, SubjectVersioned,
};
pub use type_map::{MAX_ENVELOPE_TYPES, TypeMap, TypeMapError};

use crate::ports::{Message, PropertyValue, TYPED_MESSAGE_ID_PREFIX};

/// The application property that carries a message's *logical* id when its broker message id
/// differs from it: delayed-retry copies and resubmitted dead letters get fresh broker ids (so
/// broker duplicate detection does not drop them) and keep the logical id here. The inbox keys on
/// it when present, else on the broker message id.
pub const LOGICAL_ID_PROPERTY: &str = "sb-inbox-logical-id";

/// The longest message id accepted, in bytes: Service Bus's own limit, and the inbox column's.
pub const MAX_MESSAGE_ID_LEN: usize = 128;

/// The longest dead-letter description written, in bytes. Longer text is cut at a character
/// boundary and ends with `…`. Service Bus keeps descriptions in message properties, where
/// shorter is kinder to the 64 KiB header budget.
pub const MAX_DESCRIPTION_LEN: usize = 1024;

/// The fixed vocabulary of dead-letter reasons the runtime writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DeadLetterReason {
    /// The message has no message id, or an empty one.
    MissingMessageId,
    /// The message id is longer than [`MAX_MESSAGE_ID_LEN`] or has control characters.
    InvalidMessageId,
    /// The message has no subject naming its contract.
    MissingContract,
    /// No handler accepts the contract name.
    UnsupportedContract,
    /// The contract name is known but not this version.
    UnsupportedContractVersion,
    /// The body does not decode as the contract says.
    InvalidPayload,
    /// The store refused the business change for good (constraint, conversion, schema).
    PermanentStoreError,
    /// The handler classified the message as permanently unprocessable.
    HandlerRejected,
    /// Delayed retries were exhausted.
    RetriesExhausted,
    /// The client cannot decode the AMQP message (a malformed section, a type it does not
    /// know); every redelivery would fail the same way.
    UndecodableMessage,
    /// The handler panicked on this message on
    /// [`RuntimeConfig::max_panics`](crate::runtime::RuntimeConfig::max_panics) deliveries.
    HandlerPanicked,
}

impl DeadLetterReason {
    /// The reason as written to `DeadLetterReason`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::MissingMessageId => "MissingMessageId",
            DeadLetterReason::InvalidMessageId => "InvalidMessageId",
            DeadLetterReason::MissingContract => "MissingContract",
            DeadLetterReason::UnsupportedContract => "UnsupportedContract",
            DeadLetterReason::UnsupportedContractVersion => "UnsupportedContractVersion",
            DeadLetterReason::InvalidPayload => "InvalidPayload",
            DeadLetterReason::PermanentStoreError => "PermanentStoreError",
            DeadLetterReason::HandlerRejected => "HandlerRejected",
            DeadLetterReason::RetriesExhausted => "RetriesExhausted",
            DeadLetterReason::UndecodableMessage => "UndecodableMessage",
            DeadLetterReason::HandlerPanicked => "HandlerPanicked",
        }
    }
}

impl fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A contract: a name and a version, written in the message subject as `name.vN`.
///
/// # Examples
/// ```
/// use sb_inbox::Contract;
/// let contract: Contract = "orders.order-placed.v1".parse()?;
/// assert_eq!((contract.name(), contract.version()), ("orders.order-placed", 1));
/// assert_eq!(contract.to_string(), "orders.order-placed.v1");
/// # Ok::<(), sb_inbox::ContractParseError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Contract {
    name: String,
    version: u32,
}

/// A subject that is not `name.vN`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("contract {0:?} is not of the form <name>.v<version>")]
pub struct ContractParseError(String);

impl Contract {
    /// A contract from its parts.
    pub fn new(name: impl Into<String>, version: u32) -> Self {
        Contract {
            name: name.into(),
            version,
        }
    }

    /// The name without the version.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The version number.
    pub fn version(&self) -> u32 {
        self.version
    }
}

impl std::str::FromStr for Contract {
    type Err = ContractParseError;

    fn from_str(subject: &str) -> Result<Self, Self::Err> {
        let invalid = || ContractParseError(truncate(subject, 128));
        let (name, version) = subject.rsplit_once(".v").ok_or_else(invalid)?;
        if name.is_empty() || version.starts_with('+') {
            return Err(invalid());
        }
        let version = version.parse().map_err(|_| invalid())?;
        Ok(Contract::new(name, version))
    }
}

impl fmt::Display for Contract {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.v{}", self.name, self.version)
    }
}

/// An envelope that cannot be processed, ever: it is dead-lettered and never recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {description}")]
pub struct Rejection {
    /// The reason, from the fixed vocabulary.
    pub reason: DeadLetterReason,
    /// A bounded description that never echoes the payload.
    pub description: String,
}

impl Rejection {
    /// A rejection with its description cut to [`MAX_DESCRIPTION_LEN`].
    pub fn new(reason: DeadLetterReason, description: impl AsRef<str>) -> Self {
        Rejection {
            reason,
            description: truncate(description.as_ref(), MAX_DESCRIPTION_LEN),
        }
    }
}

/// A checked envelope: the logical message id (the inbox key), the contract the handler
/// relies on, the body it decodes and the envelope's headers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Envelope<'m> {
    pub(crate) logical_id: String,
    pub(crate) contract: Contract,
    pub(crate) body: Cow<'m, [u8]>,
    pub(crate) headers: Cow<'m, Headers>,
}

/// The logical message id: [`LOGICAL_ID_PROPERTY`] when present, else the broker message id;
/// checked for presence, length and control characters.
pub fn logical_id(message: &Message) -> Result<&str, Rejection> {
    let (id, what) = match message.application_properties.get(LOGICAL_ID_PROPERTY) {
        Some(PropertyValue::String(id)) => (Some(id.as_str()), "logical message id"),
        Some(_) => {
            return Err(Rejection::new(
                DeadLetterReason::InvalidMessageId,
                format!("application property {LOGICAL_ID_PROPERTY} is not a string"),
            ));
        }
        None => (message.message_id.as_deref(), "message id"),
    };
    checked_id(id, what)
}

/// An id checked for presence, length and control characters; `what` names it in the rejection.
fn checked_id<'a>(id: Option<&'a str>, what: &str) -> Result<&'a str, Rejection> {
    match id {
        None | Some("") => Err(Rejection::new(
            DeadLetterReason::MissingMessageId,
            format!("the message has no {what}; the inbox cannot recognise its redeliveries"),
        )),
        Some(id) if id.len() > MAX_MESSAGE_ID_LEN => Err(Rejection::new(
            DeadLetterReason::InvalidMessageId,
            format!(
                "{what} is {} bytes long; the limit is {MAX_MESSAGE_ID_LEN}",
                id.len()
            ),
        )),
        Some(id) if id.chars().any(char::is_control) => Err(Rejection::new(
            DeadLetterReason::InvalidMessageId,
            format!("{what} contains control characters"),
        )),
        Some(id) => Ok(id),
    }
}

/// A broker message id for a copy of a message with `logical_id` (a delayed retry, a
/// resubmission): `{logical}/{suffix}`, or the logical id's SHA-256 (hex) in place of a logical
/// id too long for the [`MAX_MESSAGE_ID_LEN`] limit or keyed from a typed AMQP id
/// ([`TYPED_MESSAGE_ID_PREFIX`]: the copy is sent with a string id, which the receiver refuses
/// with that prefix; the logical id travels in [`LOGICAL_ID_PROPERTY`]). Deterministic, so the
/// same copy sent twice has the same broker id.
pub fn derived_message_id(logical_id: &str, suffix: &str) -> String {
    if logical_id.len() + 1 + suffix.len() <= MAX_MESSAGE_ID_LEN
        && !logical_id.starts_with(TYPED_MESSAGE_ID_PREFIX)
    {
        return format!("{logical_id}/{suffix}");
    }
    let digest = ring::digest::digest(&ring::digest::SHA256, logical_id.as_bytes());
    let hex: String = digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("{hex}/{suffix}")
}

/// The logical message id of `message` read with `reader`, by the rule the runtime keys the
/// inbox on: [`LOGICAL_ID_PROPERTY`] when present (a retry copy, a resubmitted dead letter),
/// else the envelope's own id, else the broker message id. A message whose envelope does not
/// open (it was dead-lettered for it) falls back to [`logical_id`]: it never reached the inbox,
/// so no key of it is there to match. For tools that copy messages as the runtime does (the
/// application's dead-letter resubmission).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{NServiceBus, TypeMap, envelope_logical_id};
/// use sb_inbox::Message;
/// let reader = NServiceBus::new(TypeMap::new().with("Shop.OrderPlaced", "orders.order-placed.v1")?);
/// let message = Message::new("broker-id", "", "{}")
///     .with_property("NServiceBus.EnclosedMessageTypes", "Shop.OrderPlaced")
///     .with_property("NServiceBus.MessageId", "nsb-1");
/// assert_eq!(envelope_logical_id(&message, &reader)?, "nsb-1");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// The [`Rejection`] of a missing or malformed id.
pub fn envelope_logical_id(
    message: &Message,
    reader: &dyn EnvelopeReader,
) -> Result<String, Rejection> {
    if message
        .application_properties
        .contains_key(LOGICAL_ID_PROPERTY)
    {
        return logical_id(message).map(str::to_owned);
    }
    match reader.open(message) {
        Ok(Opened { id: Some(id), .. }) => {
            checked_id(Some(&id), "envelope message id").map(str::to_owned)
        }
        _ => logical_id(message).map(str::to_owned),
    }
}

/// Opens `message` with `reader` and checks the logical message id, as [`check`] does before
/// it looks at the contract (the test kit's `ContextBuilder` opens fixtures with it).
pub(crate) fn open<'m>(
    message: &'m Message,
    reader: &dyn EnvelopeReader,
) -> Result<Envelope<'m>, Rejection> {
    let opened = reader.open(message)?;
    let logical_id = match (
        &opened.id,
        message.application_properties.get(LOGICAL_ID_PROPERTY),
    ) {
        (Some(id), None) => checked_id(Some(id.as_ref()), "envelope message id")?,
        _ => logical_id(message)?,
    }
    .to_owned();
    Ok(Envelope {
        logical_id,
        contract: opened.contract,
        body: opened.body,
        headers: opened.headers,
    })
}

/// Opens `message` with `reader` and checks the logical message id and the contract against
/// the accepted contracts. The logical id is [`LOGICAL_ID_PROPERTY`] when present (a retry copy,
/// a resubmitted dead letter), else the envelope's own id, else the broker message id.
pub(crate) fn check<'m>(
    message: &'m Message,
    reader: &dyn EnvelopeReader,
    accepted: &[Contract],
) -> Result<Envelope<'m>, Rejection> {
    let envelope = open(message, reader)?;
    let contract = &envelope.contract;
    if accepted.contains(contract) {
        return Ok(envelope);
    }
    let supported = accepted
        .iter()
        .filter(|c| c.name == contract.name)
        .map(ToString::to_string)
        .collect::<Vec<_>>();
    if supported.is_empty() {
        Err(Rejection::new(
            DeadLetterReason::UnsupportedContract,
            format!("no handler for contract {}", truncate(contract.name(), 256)),
        ))
    } else {
        Err(Rejection::new(
            DeadLetterReason::UnsupportedContractVersion,
            format!(
                "version {} is not supported; supported: {}",
                contract.version,
                supported.join(", ")
            ),
        ))
    }
}

/// Cuts `text` to at most `max` bytes at a character boundary, marking the cut with `…`.
pub(crate) fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    const MARK: &str = "…";
    let mut end = max.saturating_sub(MARK.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{MARK}", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepted() -> Vec<Contract> {
        vec![Contract::new("orders.order-placed", 1)]
    }

    fn message(id: Option<&str>, subject: Option<&str>) -> Message {
        Message {
            message_id: id.map(str::to_owned),
            subject: subject.map(str::to_owned),
            ..Message::default()
        }
    }

    #[test]
    fn accepts_known_contract() {
        let message = message(Some("m"), Some("orders.order-placed.v1"));
        let envelope = check(&message, &SubjectVersioned, &accepted()).unwrap();
        assert_eq!(envelope.logical_id, "m");
        assert_eq!(envelope.contract, Contract::new("orders.order-placed", 1));
    }

    #[test]
    fn rejects_each_bad_envelope_with_its_reason() {
        let cases = [
            (
                message(None, Some("orders.order-placed.v1")),
                DeadLetterReason::MissingMessageId,
            ),
            (
                message(Some(""), Some("orders.order-placed.v1")),
                DeadLetterReason::MissingMessageId,
            ),
            (
                message(Some(&"x".repeat(129)), Some("orders.order-placed.v1")),
                DeadLetterReason::InvalidMessageId,
            ),
            (
                message(Some("a\nb"), Some("orders.order-placed.v1")),
                DeadLetterReason::InvalidMessageId,
            ),
            (message(Some("m"), None), DeadLetterReason::MissingContract),
            (
                message(Some("m"), Some("orders.order-placed")),
                DeadLetterReason::UnsupportedContract,
            ),
            (
                message(Some("m"), Some("billing.charge.v1")),
                DeadLetterReason::UnsupportedContract,
            ),
            (
                message(Some("m"), Some("orders.order-placed.v2")),
                DeadLetterReason::UnsupportedContractVersion,
            ),
        ];
        for (message, reason) in cases {
            let rejection = check(&message, &SubjectVersioned, &accepted()).unwrap_err();
            assert_eq!(rejection.reason, reason, "{message:?}");
            assert!(rejection.description.len() <= MAX_DESCRIPTION_LEN);
        }
    }

    #[test]
    fn the_logical_id_property_is_the_inbox_key() {
        let mut copy = message(Some("m-1/retry-1"), Some("orders.order-placed.v1"));
        copy.application_properties
            .insert(LOGICAL_ID_PROPERTY.into(), "m-1".into());
        assert_eq!(
            check(&copy, &SubjectVersioned, &accepted())
                .unwrap()
                .logical_id,
            "m-1"
        );
        copy.message_id = None;
        assert_eq!(
            check(&copy, &SubjectVersioned, &accepted())
                .unwrap()
                .logical_id,
            "m-1"
        );

        let cases = [
            (
                PropertyValue::String(String::new()),
                DeadLetterReason::MissingMessageId,
            ),
            (
                PropertyValue::String("x".repeat(129)),
                DeadLetterReason::InvalidMessageId,
            ),
            (
                PropertyValue::String("a\tb".into()),
                DeadLetterReason::InvalidMessageId,
            ),
            (PropertyValue::Long(7), DeadLetterReason::InvalidMessageId),
        ];
        for (value, reason) in cases {
            let mut bad = message(Some("m-1"), Some("orders.order-placed.v1"));
            bad.application_properties
                .insert(LOGICAL_ID_PROPERTY.into(), value.clone());
            let rejection = check(&bad, &SubjectVersioned, &accepted()).unwrap_err();
            assert_eq!(rejection.reason, reason, "{value:?}");
            assert!(
                rejection.description.contains("logical message id")
                    || matches!(value, PropertyValue::Long(_)),
                "{rejection}"
            );
        }
    }

    #[test]
    fn truncation_is_utf8_safe_and_bounded() {
        let text = "é".repeat(2000);
        let cut = truncate(&text, MAX_DESCRIPTION_LEN);
        assert!(cut.len() <= MAX_DESCRIPTION_LEN);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short", 10), "short");
        let long_subject = format!("{}.v1", "n".repeat(5000));
        let rejection = check(
            &message(Some("m"), Some(&long_subject)),
            &SubjectVersioned,
            &accepted(),
        )
        .unwrap_err();
        assert!(rejection.description.len() <= MAX_DESCRIPTION_LEN);
    }

    #[test]
    fn contract_parsing() {
        assert!("a.v".parse::<Contract>().is_err());
        assert!(".v1".parse::<Contract>().is_err());
        assert!("a.v+1".parse::<Contract>().is_err());
        assert_eq!(
            "a.b.v12".parse::<Contract>().unwrap(),
            Contract::new("a.b", 12)
        );
    }
}
