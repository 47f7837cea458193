//! MassTransit's JSON message envelope (`application/vnd.masstransit+json`), as its
//! `UseJsonSerializer` (the default serializer) reads it.
//!
//! Sources for every field written:
//! - the envelope and its fields: MassTransit documentation, "Message Serialization" →
//!   "Message Envelope" (<https://masstransit.io/documentation/configuration/serialization>):
//!   `messageType` required, `messageId` recommended, every other field optional; types as
//!   `urn:message:Namespace:TypeName`;
//! - the ids are `Guid`s: `EnvelopeMessageContext.ConvertIdToGuid`
//!   (`src/MassTransit/Serialization/EnvelopeMessageContext.cs`) throws "The Id was not a Guid"
//!   for anything else; a missing `host` reads as `HostMetadataCache.Empty` there;
//! - what a consumer's send carries over from the consumed message: `TransferConsumeContextHeaders`
//!   (MassTransit `SendContextExtensions`): the conversation id;
//! - the AMQP message: `ServiceBusSendTransport.CreateMessage`
//!   (`src/Transports/MassTransit.Azure.ServiceBus.Core/AzureServiceBusTransport/`): content type,
//!   `MessageId` and `CorrelationId` as `Guid.ToString("N")`, the headers as application
//!   properties, no subject (label);
//! - addresses: `sb://<namespace>/<entity>` (`ServiceBusEndpointAddress`).
//!
//! # Layout
//! - here: [`MassTransitEnvelope`], the writer: what a handler sets, and the AMQP message
//!   around the envelope;
//! - `wire`: the envelope's JSON shape, MassTransit's `JsonMessageEnvelope` and `HostInfo`;
//! - `names`: what MassTransit accepts as a message type, an id and a header name.

mod names;
mod wire;

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;
use uuid::Uuid;

use super::super::{MASSTRANSIT_CONTENT_TYPE, MAX_ENVELOPE_HEADERS};
use super::{
    PublishError, bounded, bounded_properties, header_value, json_object, printable, serialised,
    shown,
};
use crate::ports::{OutboxMessage, PropertyValue};
use crate::runtime::Context;
use names::{derived_uuid, header_name, message_urn, uuid};

/// A MassTransit JSON envelope for one outgoing event: build it, then
/// [`message`](Self::message) turns a payload into the [`OutboxMessage`] a handler appends.
///
/// Written fields: `messageId` (a UUID, fixed per envelope), `conversationId` (the consumed
/// message's conversation with [`caused_by`](Self::caused_by), else this message starts one),
/// `correlationId` and `initiatorId` when known, `sourceAddress`/`destinationAddress` with
/// [`with_addresses`](Self::with_addresses), `messageType`, `message`, `sentTime`, `headers`
/// and `host`. The AMQP message carries the content type, the message id (and correlation id)
/// in MassTransit's `N` form and the headers as application properties, as MassTransit's own
/// Azure Service Bus transport sends them.
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{MassTransitEnvelope, MASSTRANSIT_CONTENT_TYPE};
///
/// #[derive(serde::Serialize)]
/// #[serde(rename_all = "camelCase")]
/// struct OrderConfirmed { order_id: String }
///
/// let envelope = MassTransitEnvelope::new("confirmations", "urn:message:Shop.Contracts:OrderConfirmed")?
///     .with_header("tenant", "t-1")?;
/// let message = envelope.message(&OrderConfirmed { order_id: "o-1".into() })?;
/// assert_eq!(message.content_type.as_deref(), Some(MASSTRANSIT_CONTENT_TYPE));
/// assert_eq!(message.message_id, envelope.message_id().simple().to_string());
/// let json: serde_json::Value = serde_json::from_slice(&message.body)?;
/// assert_eq!(json["message"]["orderId"], "o-1");
/// assert_eq!(json["messageType"][0], "urn:message:Shop.Contracts:OrderConfirmed");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct MassTransitEnvelope {
    destination: String,
    message_id: Uuid,
    message_types: Vec<String>,
    conversation_id: Option<Uuid>,
    correlation_id: Option<Uuid>,
    initiator_id: Option<Uuid>,
    source_address: Option<String>,
    destination_address: Option<String>,
    headers: BTreeMap<String, PropertyValue>,
    sent_time: SystemTime,
}

impl MassTransitEnvelope {
    /// An envelope for `destination` (a queue or topic) naming the message's type as
    /// MassTransit does (`urn:message:Namespace:TypeName`), with a fresh message id, sent now.
    ///
    /// # Errors
    /// [`PublishError::InvalidMessageType`] for anything but a MassTransit message URN.
    pub fn new(destination: impl Into<String>, message_type: &str) -> Result<Self, PublishError> {
        Ok(MassTransitEnvelope {
            destination: destination.into(),
            message_id: Uuid::new_v4(),
            message_types: vec![message_urn(message_type)?],
            conversation_id: None,
            correlation_id: None,
            initiator_id: None,
            source_address: None,
            destination_address: None,
            headers: BTreeMap::new(),
            sent_time: SystemTime::now(),
        })
    }

    /// Another type the message implements (an interface or base class, as MassTransit lists
    /// every one so that consumers of any of them receive it).
    ///
    /// # Errors
    /// [`PublishError::InvalidMessageType`], as in [`new`](Self::new).
    pub fn implements(mut self, message_type: &str) -> Result<Self, PublishError> {
        let urn = message_urn(message_type)?;
        if !self.message_types.contains(&urn) {
            self.message_types.push(urn);
        }
        Ok(self)
    }

    /// This message's id instead of a fresh one: an id derived from the consumed message, so a
    /// handler that runs again (after a rollback, a lost lock) writes the event under the same
    /// id, e.g. `ctx.idempotency_key("order-confirmed").as_str()` (a UUID).
    ///
    /// # Errors
    /// [`PublishError::NotUuid`]: MassTransit reads `messageId` as a `Guid`.
    pub fn with_message_id(mut self, id: &str) -> Result<Self, PublishError> {
        self.message_id = uuid("messageId", id)?;
        Ok(self)
    }

    /// Continues the consumed message's conversation, as a MassTransit consumer's send does:
    /// `conversationId` is the consumed message's `ConversationId` header when it has one,
    /// else the consumed message starts the conversation (its logical id when a UUID, else a
    /// UUID derived from it, so every delivery of it gives the same conversation);
    /// `initiatorId` is the consumed message's logical id when a UUID; `correlationId` is its
    /// `CorrelationId` header or AMQP correlation id when a UUID. Headers are not copied:
    /// the consumed message's trace context and inbox properties belong to its own hop.
    pub fn caused_by<P>(mut self, ctx: &Context<'_, P>) -> Self {
        let header = |name: &str| {
            ctx.headers()
                .iter()
                .find(|(key, _)| key.eq_ignore_ascii_case(name))
                .and_then(|(_, value)| match value {
                    PropertyValue::String(value) => Uuid::parse_str(value).ok(),
                    _ => None,
                })
        };
        let consumed = Uuid::parse_str(ctx.logical_id()).ok();
        self.conversation_id = header("ConversationId")
            .or(consumed)
            .or_else(|| Some(derived_uuid(ctx.logical_id())));
        self.initiator_id = consumed;
        self.correlation_id = header("CorrelationId").or_else(|| {
            ctx.message
                .correlation_id
                .as_deref()
                .and_then(|id| Uuid::parse_str(id).ok())
        });
        self
    }

    /// The `correlationId` (a saga's or a business transaction's id).
    ///
    /// # Errors
    /// [`PublishError::NotUuid`]: MassTransit reads it as a `Guid`.
    pub fn with_correlation_id(mut self, id: &str) -> Result<Self, PublishError> {
        self.correlation_id = Some(uuid("correlationId", id)?);
        Ok(self)
    }

    /// The `conversationId`, when the handler carries one of its own.
    ///
    /// # Errors
    /// [`PublishError::NotUuid`]: MassTransit reads it as a `Guid`.
    pub fn with_conversation_id(mut self, id: &str) -> Result<Self, PublishError> {
        self.conversation_id = Some(uuid("conversationId", id)?);
        Ok(self)
    }

    /// `destinationAddress` as MassTransit writes Azure Service Bus addresses,
    /// `sb://<namespace>/<destination>`, and `sourceAddress` `sb://<namespace>/<source_entity>`
    /// when given (the entity this service consumes from, never the destination; the call
    /// site reads better with [`Self::with_destination_address`] or
    /// [`Self::with_source_and_destination_addresses`]). Both are optional in MassTransit's
    /// envelope (the documentation's table: "Optional") and its consumers need neither to
    /// deserialize (`EnvelopeMessageContext.ConvertToUri` reads a missing one as `null`); they
    /// show up in MassTransit's logs and fault messages. The relay does not fill them in: it
    /// never rewrites a body, so every attempt sends the bytes the handler wrote.
    ///
    /// # Errors
    /// [`PublishError::InvalidValue`] for an empty namespace or entity, or one with whitespace,
    /// control characters or `/` in the namespace.
    pub fn with_addresses(
        mut self,
        namespace: &str,
        source_entity: Option<&str>,
    ) -> Result<Self, PublishError> {
        printable("namespace", namespace)?;
        if namespace.contains('/') {
            return Err(PublishError::InvalidValue {
                what: "namespace",
                value: shown(namespace),
                why: "a namespace is a host name",
            });
        }
        printable("destination", &self.destination)?;
        self.destination_address = Some(format!("sb://{namespace}/{}", self.destination));
        self.source_address = match source_entity {
            Some(entity) => {
                printable("source entity", entity)?;
                Some(format!("sb://{namespace}/{entity}"))
            }
            None => None,
        };
        Ok(self)
    }

    /// `destinationAddress` only (`sb://<namespace>/<destination>`): [`Self::with_addresses`]
    /// without a source, named so the call site says which address it sets.
    ///
    /// # Errors
    /// As [`Self::with_addresses`].
    pub fn with_destination_address(self, namespace: &str) -> Result<Self, PublishError> {
        self.with_addresses(namespace, None)
    }

    /// `destinationAddress` and `sourceAddress` = `sb://<namespace>/<consumed_entity>`, the
    /// entity this service consumes from (not the destination): [`Self::with_addresses`] with
    /// its second argument named at the call site.
    ///
    /// # Errors
    /// As [`Self::with_addresses`].
    pub fn with_source_and_destination_addresses(
        self,
        namespace: &str,
        consumed_entity: &str,
    ) -> Result<Self, PublishError> {
        self.with_addresses(namespace, Some(consumed_entity))
    }

    /// A header, written in the envelope's `headers` and as an application property (as
    /// MassTransit's transport does).
    ///
    /// # Errors
    /// [`PublishError::InvalidName`] for an empty name, one longer than 256 bytes, with control
    /// characters, or one the inbox or MassTransit reserve (`sb-inbox-…`, `MT-…`);
    /// [`PublishError::InvalidValue`] for a string longer than 4096 bytes;
    /// [`PublishError::TooMany`] past 126 headers.
    pub fn with_header(
        mut self,
        name: &str,
        value: impl Into<PropertyValue>,
    ) -> Result<Self, PublishError> {
        header_name(name)?;
        let value = value.into();
        header_value("header", &value)?;
        // Two envelope fields (CorrelationId, ConversationId) join the headers on the way in.
        let max = MAX_ENVELOPE_HEADERS - 2;
        if self.headers.len() >= max && !self.headers.contains_key(name) {
            return Err(PublishError::TooMany {
                what: "headers",
                max,
            });
        }
        self.headers.insert(name.to_owned(), value);
        Ok(self)
    }

    /// `sentTime` instead of now.
    #[must_use]
    pub fn at(mut self, sent_time: SystemTime) -> Self {
        self.sent_time = sent_time;
        self
    }

    /// The envelope's `messageId`; the AMQP message id is its `N` form (32 hex digits).
    pub fn message_id(&self) -> Uuid {
        self.message_id
    }

    /// The outbox message carrying `payload` (serialised as JSON) under `message`.
    ///
    /// # Errors
    /// [`PublishError::NotJson`] when it does not serialise, [`PublishError::NotAnObject`] when
    /// it is not a JSON object, [`PublishError::TooLarge`] above
    /// [`MAX_ENVELOPE_LEN`](super::MAX_ENVELOPE_LEN).
    pub fn message(&self, payload: &impl Serialize) -> Result<OutboxMessage, PublishError> {
        self.wrap(serialised(payload)?)
    }

    /// The same for a payload already encoded as JSON bytes.
    ///
    /// # Errors
    /// As [`message`](Self::message); [`PublishError::NotJson`] for bytes that are not JSON.
    pub fn message_json(&self, payload: &[u8]) -> Result<OutboxMessage, PublishError> {
        self.wrap(json_object(payload)?)
    }

    fn wrap(&self, message: serde_json::Value) -> Result<OutboxMessage, PublishError> {
        let body = bounded(wire::body(self, message)?)?;
        // The AMQP message as MassTransit's Azure Service Bus transport sends it: the ids in
        // their `N` form, no subject, the headers again as application properties.
        let mut outgoing = OutboxMessage::new(self.destination.clone(), "", body)
            .with_message_id(self.message_id.simple().to_string())
            .with_content_type(MASSTRANSIT_CONTENT_TYPE);
        outgoing.subject = None;
        outgoing.correlation_id = self.correlation_id.map(|id| id.simple().to_string());
        outgoing.application_properties = bounded_properties(self.headers.clone())?;
        Ok(outgoing)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::ports::Message;
    use crate::testing::ContextBuilder;

    pub(super) const TYPE: &str = "urn:message:Shop.Contracts:OrderConfirmed";

    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    pub(super) struct OrderConfirmed {
        pub(super) order_id: String,
    }

    pub(super) fn json(message: &OutboxMessage) -> serde_json::Value {
        serde_json::from_slice(&message.body).unwrap()
    }

    #[test]
    fn ids_must_be_uuids() {
        let envelope = MassTransitEnvelope::new("q", TYPE).unwrap();
        for (result, what) in [
            (envelope.clone().with_message_id("order-1"), "messageId"),
            (envelope.clone().with_correlation_id("c-1"), "correlationId"),
            (envelope.with_conversation_id(""), "conversationId"),
        ] {
            assert!(
                matches!(result, Err(PublishError::NotUuid { what: w, .. }) if w == what),
                "{what}"
            );
        }
    }

    #[test]
    fn the_amqp_message_is_what_masstransits_transport_sends() {
        let id = "0f8fad5b-d9cb-469f-a165-70867728950e";
        let message = MassTransitEnvelope::new("confirmations", TYPE)
            .unwrap()
            .with_message_id(id)
            .unwrap()
            .with_correlation_id("7c9e6679-7425-40de-944b-e07fc1f90ae7")
            .unwrap()
            .with_header("tenant", "t-1")
            .unwrap()
            .message(&OrderConfirmed {
                order_id: "o-1".into(),
            })
            .unwrap();
        assert_eq!(message.message_id, "0f8fad5bd9cb469fa16570867728950e");
        assert_eq!(
            message.correlation_id.as_deref(),
            Some("7c9e6679742540de944be07fc1f90ae7")
        );
        assert_eq!(
            message.content_type.as_deref(),
            Some(MASSTRANSIT_CONTENT_TYPE)
        );
        assert_eq!(message.subject, None);
        assert_eq!(message.destination, "confirmations");
        assert_eq!(
            message.application_properties.get("tenant"),
            Some(&PropertyValue::from("t-1"))
        );
        let envelope = json(&message);
        assert_eq!(envelope["messageId"], id);
        assert_eq!(
            envelope["correlationId"],
            "7c9e6679-7425-40de-944b-e07fc1f90ae7"
        );
        assert_eq!(envelope["headers"]["tenant"], "t-1");
    }

    #[test]
    fn an_idempotency_key_is_a_message_id_every_handler_run_repeats() {
        let received = Message::new("order-placed-o-1", "orders.order-placed.v1", "{}");
        let builder = ContextBuilder::new("shop.confirmations", received).unwrap();
        let ctx = builder.build(());
        let key = ctx.idempotency_key("order-confirmed");
        let ids: Vec<String> = (0..2)
            .map(|_| {
                MassTransitEnvelope::new("q", TYPE)
                    .unwrap()
                    .with_message_id(key.as_str())
                    .unwrap()
                    .message_json(b"{}")
                    .unwrap()
                    .message_id
            })
            .collect();
        assert_eq!(ids[0], ids[1]);
        assert_eq!(ids[0], key.as_str().replace('-', ""));
    }

    #[test]
    fn the_same_envelope_writes_the_same_bytes() {
        let envelope = MassTransitEnvelope::new("q", TYPE)
            .unwrap()
            .at(UNIX_EPOCH + Duration::from_secs(1));
        let payload = OrderConfirmed {
            order_id: "o-1".into(),
        };
        assert_eq!(
            envelope.message(&payload).unwrap(),
            envelope.message(&payload).unwrap()
        );
        assert_ne!(
            MassTransitEnvelope::new("q", TYPE).unwrap().message_id(),
            envelope.message_id(),
            "each envelope gets its own id"
        );
    }

    #[test]
    fn caused_by_continues_the_consumed_conversation() {
        let consumed_id = "3b241101-e2bb-4255-8caf-4136c566a962";
        let conversation = "9a3e4b1c-0000-4000-8000-000000000001";
        let correlation = "4b3e4b1c-0000-4000-8000-000000000002";
        let received = Message::new(consumed_id, "orders.order-placed.v1", "{}")
            .with_property("ConversationId", conversation)
            .with_correlation_id(correlation.replace('-', ""));
        let ctx = ContextBuilder::new("shop.confirmations", received).unwrap();
        let continued = json(
            &MassTransitEnvelope::new("q", TYPE)
                .unwrap()
                .caused_by(&ctx.build(()))
                .message_json(br#"{"orderId":"o-1"}"#)
                .unwrap(),
        );
        assert_eq!(continued["conversationId"], conversation);
        assert_eq!(continued["initiatorId"], consumed_id);
        assert_eq!(continued["correlationId"], correlation);

        // A consumed message without a conversation starts one: its own id when a UUID, else a
        // UUID derived from its logical id, the same on every delivery.
        let plain = Message::new("order-placed-o-1", "orders.order-placed.v1", "{}");
        let ctx = ContextBuilder::new("shop.confirmations", plain).unwrap();
        let first = json(
            &MassTransitEnvelope::new("q", TYPE)
                .unwrap()
                .caused_by(&ctx.build(()))
                .message_json(b"{}")
                .unwrap(),
        );
        let again = json(
            &MassTransitEnvelope::new("q", TYPE)
                .unwrap()
                .caused_by(&ctx.build(()))
                .message_json(b"{}")
                .unwrap(),
        );
        assert_eq!(first["conversationId"], again["conversationId"]);
        assert_ne!(first["conversationId"], first["messageId"]);
        assert!(Uuid::parse_str(first["conversationId"].as_str().unwrap()).is_ok());
        assert!(first.get("initiatorId").is_none());
        assert!(first.get("correlationId").is_none());
    }

    #[test]
    fn bad_headers_addresses_and_payloads_are_refused() {
        let envelope = MassTransitEnvelope::new("q", TYPE).unwrap();
        for name in [
            "",
            "MT-Host-Info",
            "mt-reason",
            "sb-inbox-logical-id",
            "a\u{7}",
        ] {
            assert!(
                matches!(
                    envelope.clone().with_header(name, "x"),
                    Err(PublishError::InvalidName { .. })
                ),
                "{name:?}"
            );
        }
        for (namespace, source) in [("", None), ("a/b", None), ("ns", Some("a b"))] {
            assert!(
                matches!(
                    envelope.clone().with_addresses(namespace, source),
                    Err(PublishError::InvalidValue { .. })
                ),
                "{namespace:?} {source:?}"
            );
        }
        assert!(matches!(
            envelope.clone().with_header("long", "x".repeat(4097)),
            Err(PublishError::InvalidValue { .. })
        ));
        let full = (0..126).fold(envelope.clone(), |e, i| {
            e.with_header(&format!("h{i}"), "x").unwrap()
        });
        assert!(full.clone().with_header("h0", "again").is_ok());
        assert!(matches!(
            full.with_header("one-more", "x"),
            Err(PublishError::TooMany { max: 126, .. })
        ));
        assert!(matches!(
            envelope.message_json(b"not json"),
            Err(PublishError::NotJson(_))
        ));
        assert!(matches!(
            envelope.message_json(b"[]"),
            Err(PublishError::NotAnObject)
        ));
        let heavy = (0..16).fold(envelope.clone(), |e, i| {
            e.with_header(&format!("h{i}"), "x".repeat(4000)).unwrap()
        });
        assert!(matches!(
            heavy.message_json(b"{}"),
            Err(PublishError::PropertiesTooLarge { .. })
        ));
        let big = serde_json::json!({ "blob": "x".repeat(super::super::MAX_ENVELOPE_LEN) });
        assert!(matches!(
            envelope.message(&big),
            Err(PublishError::TooLarge { .. })
        ));
    }
}
