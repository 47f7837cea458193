//! [`MassTransit`]: what a MassTransit producer sends, in both of its JSON serializations.
//!
//! # Wire format
//! MassTransit picks its deserializer by content type (masstransit.io,
//! `documentation/configuration/serialization`: `application/vnd.masstransit+json` is "JSON
//! (w/envelope)", `UseJsonSerializer`, the default; `application/json` is raw JSON,
//! `UseRawJsonSerializer`); this reader does the same.
//!
//! - **Envelope** (`application/vnd.masstransit+json`, or no content type: MassTransit's
//!   default): the body is a JSON object with `messageId`, `correlationId`, `conversationId`,
//!   `initiatorId`, `sourceAddress`, `destinationAddress`, `messageType` (an array of
//!   `urn:message:Namespace:Type`, most specific first), `message` (the payload), `sentTime`,
//!   `headers` (an object) and `host` (the "Envelope" example on the same page; the fields of
//!   MassTransit's `MessageEnvelope`). The contract is the first
//!   `messageType` the consumer's [`TypeMap`] resolves; the envelope's id is `messageId`; the
//!   handler decodes `message`, borrowed from the body as it was written (never re-serialised);
//!   the headers are `headers` plus `CorrelationId` and `ConversationId` from the envelope.
//! - **Raw JSON** (`application/json`): the body is the message itself. With
//!   `RawSerializerOptions.AddTransportHeaders` (part of `RawSerializerOptions.Default` since
//!   v8.1) MassTransit writes the envelope fields as transport headers, which its Azure Service
//!   Bus transport sends as application properties: `MessageId`, `CorrelationId`,
//!   `ConversationId` and `MT-MessageType` (the URNs joined by `;`)
//!   (`src/MassTransit/Serialization/RawMessageSerializer.cs`, `SetRawMessageHeaders`; the names
//!   in `src/MassTransit.Abstractions/MessageHeaders.cs`). The contract comes from
//!   `MT-MessageType`, the id from `MessageId` (else the broker message id, which MassTransit's
//!   transport sets to the same value); the headers are the application properties.

use std::borrow::Cow;

use super::json_body;
use super::reader::{EnvelopeReader, Headers, Opened};
use super::type_map::{MAX_ENVELOPE_TYPES, Quoted, TypeMap, TypeMapError};
use super::{DeadLetterReason, Rejection};
use crate::ports::{Message, PropertyValue};

/// The content type of MassTransit's JSON envelope.
pub const MASSTRANSIT_CONTENT_TYPE: &str = "application/vnd.masstransit+json";

/// The application property with the message types of a raw JSON message (`;`-separated URNs).
pub const MT_MESSAGE_TYPE_PROPERTY: &str = "MT-MessageType";

/// The application property with the message id of a raw JSON message.
pub const MT_MESSAGE_ID_PROPERTY: &str = "MessageId";

/// Reads MassTransit's JSON envelope and its raw JSON, told apart by content type (see the
/// module docs for the fields used).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{EnvelopeReader, MassTransit, TypeMap};
/// use sb_inbox::{Contract, Message};
/// let reader = MassTransit::new(
///     TypeMap::new().with("urn:message:Shop.Contracts:OrderPlaced", "orders.order-placed.v1")?,
/// )?;
/// let body = r#"{"messageId":"0c4e0000-5d59-0015-4a3e-08dc4d6a5e2a",
///   "messageType":["urn:message:Shop.Contracts:OrderPlaced"],
///   "message":{"orderId":"o-1"}}"#;
/// let mut message = Message::new("broker-id", "", body);
/// message.content_type = Some("application/vnd.masstransit+json".into());
/// let opened = reader.open(&message)?;
/// assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
/// assert_eq!(opened.id.as_deref(), Some("0c4e0000-5d59-0015-4a3e-08dc4d6a5e2a"));
/// assert_eq!(&opened.body[..], br#"{"orderId":"o-1"}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MassTransit {
    types: TypeMap,
}

impl MassTransit {
    /// A reader resolving MassTransit's message types through `types`.
    ///
    /// # Errors
    /// [`TypeMapError::Unversioned`] for an entry without a version: MassTransit carries none.
    pub fn new(types: TypeMap) -> Result<Self, TypeMapError> {
        types.require_versions("masstransit")?;
        Ok(MassTransit { types })
    }

    fn envelope<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        const WHAT: &str = "MassTransit envelope";
        let members = json_body::members(&message.body, WHAT)?;
        let types = match json_body::member(&members, "messageType") {
            None => Vec::new(),
            Some(raw) => json_body::strings(raw, MAX_ENVELOPE_TYPES, "MassTransit messageType")?,
        };
        let contract = self.types.resolve_first(
            types.iter().map(|t| (t.as_ref(), None)),
            "MassTransit messageType",
        )?;
        let payload = match json_body::member(&members, "message") {
            Some(raw) if raw.get() != "null" => raw,
            _ => {
                return Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    "the MassTransit envelope has no message",
                ));
            }
        };
        let mut headers = match json_body::member(&members, "headers") {
            Some(raw) if raw.get() != "null" => json_body::headers(raw, "MassTransit headers")?,
            _ => Headers::new(),
        };
        for (field, header) in [
            ("correlationId", "CorrelationId"),
            ("conversationId", "ConversationId"),
        ] {
            if let Some(value) = json_body::string(&members, field, WHAT)? {
                headers
                    .entry(header.to_owned())
                    .or_insert_with(|| PropertyValue::String(super::truncate(&value, 256)));
            }
        }
        let opened = Opened::new(
            contract,
            Cow::Borrowed(payload.get().as_bytes()),
            Cow::Owned(headers),
        );
        Ok(match json_body::string(&members, "messageId", WHAT)? {
            Some(id) => opened.with_id(id),
            None => opened,
        })
    }

    fn raw<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        let properties = &message.application_properties;
        let types = match properties.get(MT_MESSAGE_TYPE_PROPERTY) {
            None => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    format!(
                        "the raw MassTransit message has no {MT_MESSAGE_TYPE_PROPERTY} application property"
                    ),
                ));
            }
            Some(PropertyValue::String(types)) => types,
            Some(_) => {
                return Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!("application property {MT_MESSAGE_TYPE_PROPERTY} is not a string"),
                ));
            }
        };
        let contract = self.types.resolve_first(
            types
                .split(';')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| (t, None)),
            MT_MESSAGE_TYPE_PROPERTY,
        )?;
        let opened = Opened::new(
            contract,
            Cow::Borrowed(&message.body[..]),
            Cow::Borrowed(properties),
        );
        match properties.get(MT_MESSAGE_ID_PROPERTY) {
            None => Ok(opened),
            Some(PropertyValue::String(id)) => Ok(opened.with_id(id.as_str())),
            Some(_) => Err(Rejection::new(
                DeadLetterReason::InvalidMessageId,
                format!("application property {MT_MESSAGE_ID_PROPERTY} is not a string"),
            )),
        }
    }
}

impl EnvelopeReader for MassTransit {
    fn kind(&self) -> &'static str {
        "masstransit"
    }

    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        match message.content_type.as_deref().map(media_type) {
            None => self.envelope(message),
            Some(media) if media.eq_ignore_ascii_case(MASSTRANSIT_CONTENT_TYPE) => {
                self.envelope(message)
            }
            Some(media) if media.eq_ignore_ascii_case("application/json") => self.raw(message),
            Some(media) => Err(Rejection::new(
                DeadLetterReason::InvalidPayload,
                format!(
                    "content type {} is neither MassTransit's envelope ({MASSTRANSIT_CONTENT_TYPE}) nor its raw JSON (application/json)",
                    Quoted(media)
                ),
            )),
        }
    }

    fn type_map(&self) -> Option<&TypeMap> {
        Some(&self.types)
    }
}

/// The media type of a content type, without its parameters (`; charset=utf-8`).
pub(crate) fn media_type(content_type: &str) -> &str {
    content_type.split(';').next().unwrap_or_default().trim()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::envelope::Contract;

    /// A MassTransit envelope as MassTransit's documentation shows it
    /// (masstransit.io/documentation/configuration/serialization, "Envelope"), carrying the
    /// reference order.
    const ENVELOPE: &str = r#"{
      "messageId": "181c0000-6393-3630-36a4-08daf4e7c6da",
      "requestId": null,
      "correlationId": "5f8e0000-6393-3630-36a4-08daf4e7c6db",
      "conversationId": "181c0000-6393-3630-f465-08daf4e7c6db",
      "initiatorId": null,
      "sourceAddress": "sb://shop.servicebus.windows.net/checkout",
      "destinationAddress": "sb://shop.servicebus.windows.net/Shop.Contracts/OrderPlaced",
      "messageType": [
        "urn:message:Shop.Contracts:OrderPlaced",
        "urn:message:Shop.Contracts:IOrderEvent"
      ],
      "message": {"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}]},
      "expirationTime": null,
      "sentTime": "2023-01-12T15:10:40.1234567Z",
      "headers": {"Tenant": "t-1", "Attempt": 2},
      "host": {"machineName": "SHOP01", "processName": "Checkout", "massTransitVersion": "8.0.10.0"}
    }"#;

    fn reader() -> MassTransit {
        MassTransit::new(
            TypeMap::new()
                .with(
                    "urn:message:Shop.Contracts:OrderPlaced",
                    "orders.order-placed.v1",
                )
                .unwrap(),
        )
        .unwrap()
    }

    fn enveloped(body: &str) -> Message {
        Message::new("broker-1", "", body.to_owned()).with_content_type(MASSTRANSIT_CONTENT_TYPE)
    }

    #[test]
    fn the_envelope_yields_each_field() {
        let message = enveloped(ENVELOPE);
        let opened = reader().open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
        assert_eq!(
            opened.id.as_deref(),
            Some("181c0000-6393-3630-36a4-08daf4e7c6da")
        );
        assert!(
            matches!(opened.body, Cow::Borrowed(_)),
            "the payload is borrowed"
        );
        assert_eq!(
            &opened.body[..],
            br#"{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}]}"#
        );
        let header = |name: &str| opened.headers.get(name).cloned();
        assert_eq!(header("Tenant"), Some("t-1".into()));
        assert_eq!(header("Attempt"), Some(PropertyValue::Long(2)));
        assert_eq!(
            header("CorrelationId"),
            Some("5f8e0000-6393-3630-36a4-08daf4e7c6db".into())
        );
        assert_eq!(
            header("ConversationId"),
            Some("181c0000-6393-3630-f465-08daf4e7c6db".into())
        );
    }

    #[test]
    fn no_content_type_is_the_envelope_and_parameters_are_ignored() {
        let mut message = enveloped(ENVELOPE);
        message.content_type = None;
        assert!(reader().open(&message).is_ok());
        message.content_type = Some("application/vnd.masstransit+json; charset=utf-8".into());
        assert!(reader().open(&message).is_ok());
    }

    #[test]
    fn a_less_specific_mapped_type_is_used_and_an_envelope_without_id_keeps_the_brokers() {
        let reader = MassTransit::new(
            TypeMap::new()
                .with(
                    "urn:message:Shop.Contracts:IOrderEvent",
                    "orders.order-event.v3",
                )
                .unwrap(),
        )
        .unwrap();
        let body = ENVELOPE.replace(
            r#""messageId": "181c0000-6393-3630-36a4-08daf4e7c6da","#,
            "",
        );
        let message = enveloped(&body);
        let opened = reader.open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-event", 3));
        assert_eq!(opened.id, None);
    }

    #[test]
    fn raw_json_takes_type_and_id_from_the_transport_headers() {
        let message = Message::new("broker-2", "", r#"{"orderId":"o-1"}"#)
            .with_content_type("application/json")
            .with_property(
                MT_MESSAGE_TYPE_PROPERTY,
                "urn:message:Shop.Contracts:OrderPlaced;urn:message:Shop.Contracts:IOrderEvent",
            )
            .with_property(MT_MESSAGE_ID_PROPERTY, "mt-7")
            .with_property("ConversationId", "c-1");
        let opened = reader().open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
        assert_eq!(opened.id.as_deref(), Some("mt-7"));
        assert_eq!(&opened.body[..], br#"{"orderId":"o-1"}"#);
        assert_eq!(opened.headers.get("ConversationId"), Some(&"c-1".into()));

        let mut without_id = message.clone();
        without_id
            .application_properties
            .remove(MT_MESSAGE_ID_PROPERTY);
        assert_eq!(reader().open(&without_id).unwrap().id, None);
    }

    #[test]
    fn every_malformed_envelope_is_rejected_with_its_reason() {
        use DeadLetterReason::*;
        let secret = "s3cr3t-payload";
        let too_many: Vec<String> = (0..=MAX_ENVELOPE_TYPES)
            .map(|i| format!("\"t{i}\""))
            .collect();
        let cases: Vec<(Message, DeadLetterReason)> = vec![
            (enveloped(&format!("not json {secret}")), InvalidPayload),
            (enveloped(&format!("[\"{secret}\"]")), InvalidPayload),
            (enveloped(r#"{"message":{}}"#), MissingContract),
            (
                enveloped(r#"{"messageType":[],"message":{}}"#),
                MissingContract,
            ),
            (
                enveloped(&format!(r#"{{"messageType":"{secret}","message":{{}}}}"#)),
                InvalidPayload,
            ),
            (
                enveloped(&format!(
                    r#"{{"messageType":[7, "{secret}"],"message":{{}}}}"#
                )),
                InvalidPayload,
            ),
            (
                enveloped(&format!(
                    r#"{{"messageType":[{}],"message":{{}}}}"#,
                    too_many.join(",")
                )),
                InvalidPayload,
            ),
            (
                enveloped(r#"{"messageType":["urn:message:Shop:Other"],"message":{}}"#),
                UnsupportedContract,
            ),
            (
                enveloped(r#"{"messageType":["urn:message:Shop.Contracts:OrderPlaced"]}"#),
                InvalidPayload,
            ),
            (
                enveloped(
                    r#"{"messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":null}"#,
                ),
                InvalidPayload,
            ),
            (
                enveloped(&format!(
                    r#"{{"messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{{}},"messageId":{{"x":"{secret}"}}}}"#
                )),
                InvalidPayload,
            ),
            (
                enveloped(&format!(
                    r#"{{"messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{{}},"headers":"{secret}"}}"#
                )),
                InvalidPayload,
            ),
            (
                Message::new("b", "", "{}").with_content_type("application/json"),
                MissingContract,
            ),
            (
                Message::new("b", "", "{}")
                    .with_content_type("application/json")
                    .with_property(MT_MESSAGE_TYPE_PROPERTY, 7_i64),
                InvalidPayload,
            ),
            (
                Message::new("b", "", "{}")
                    .with_content_type("application/json")
                    .with_property(
                        MT_MESSAGE_TYPE_PROPERTY,
                        "urn:message:Shop.Contracts:OrderPlaced",
                    )
                    .with_property(MT_MESSAGE_ID_PROPERTY, 7_i64),
                InvalidMessageId,
            ),
            (
                Message::new("b", "", "{}").with_content_type("application/xml"),
                InvalidPayload,
            ),
        ];
        for (message, reason) in cases {
            let rejection = reader().open(&message).unwrap_err();
            assert_eq!(rejection.reason, reason, "{message:?}: {rejection}");
            assert!(!rejection.description.contains(secret), "{rejection}");
        }
    }

    #[test]
    fn an_unversioned_type_map_entry_is_refused() {
        let types = TypeMap::new()
            .with("urn:message:A:B", "orders.order-placed")
            .unwrap();
        assert!(matches!(
            MassTransit::new(types),
            Err(TypeMapError::Unversioned { .. })
        ));
    }
}
