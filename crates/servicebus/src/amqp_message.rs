//! Mapping between the client's messages ([`crate::ServiceBusMessage`],
//! [`crate::ServiceBusReceivedMessage`]) and AMQP messages as Service Bus writes them.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::annotations::OwnedKey;
use sb_amqp::types::messaging::{
    AmqpValue, ApplicationProperties, Body, Data, Header, Message as AmqpMessage,
    MessageAnnotations, MessageId, Properties,
};
use sb_amqp::types::primitives::{Binary, SimpleValue, Symbol, Timestamp};
use sb_amqp::{AmqpError, AnyMessage, Outcome, codec::Value};

use sb_amqp::servicebus::{annotation, condition, dead_letter};

use super::SendOptions;
use crate::dead_letter_reason;
use crate::{PropertyValue, ServiceBusMessage, ServiceBusReceivedMessage, TYPED_MESSAGE_ID_PREFIX};

/// A received message, and whether the client can hand it out at all.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Received {
    pub(crate) message: ServiceBusReceivedMessage,
    /// Why the message is unusable as it stands, when the reason is visible only at the AMQP
    /// level ([`crate::ServiceBusDelivery::unusable`]).
    pub(crate) refusal: Option<Refusal>,
}

/// Why a delivered message is unusable as it stands: it does not decode, or its string message
/// id poses as an id of another AMQP type. The client hands such a delivery to the caller
/// like any other ([`crate::ServiceBusDelivery::unusable`]) and leaves its settlement to the
/// caller, as the SDKs do; dead-lettering it with [`UnusableMessage::reason`] and
/// [`UnusableMessage::description`] is what the inbox does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnusableMessage {
    /// A [`crate::dead_letter_reason`] constant.
    pub reason: &'static str,
    /// What was wrong, at most 1 KB (fit for a dead-letter description).
    pub description: String,
}

pub(crate) type Refusal = UnusableMessage;

/// A delivery whose AMQP message does not decode: its lock token (from the delivery tag) and
/// why; nothing else of it can be read.
pub(crate) fn undecodable(tag: &[u8], error: &dyn std::fmt::Display) -> Received {
    Received {
        message: ServiceBusReceivedMessage {
            lock_token: lock_token_from_tag(tag),
            ..ServiceBusReceivedMessage::default()
        },
        refusal: Some(UnusableMessage {
            reason: dead_letter_reason::UNDECODABLE_MESSAGE,
            description: truncate(
                &format!("the AMQP message does not decode: {error}"),
                MAX_DESCRIPTION_LEN,
            ),
        }),
    }
}

/// The longest dead-letter description the client writes itself: Service Bus keeps
/// descriptions up to 4 KB in total with the reason ("Overview of Service Bus dead-letter
/// queues", learn.microsoft.com/azure/service-bus-messaging/service-bus-dead-letter-queues);
/// 1 KB leaves room for the reason and the other properties.
pub(crate) const MAX_DESCRIPTION_LEN: usize = 1024;

/// `text` cut to at most `max` bytes on a character boundary, marked with an ellipsis.
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

/// Converts the lock token of a delivery tag: .NET's `Guid.ToByteArray` order (the first three
/// groups little-endian), as Service Bus writes it.
pub(crate) fn lock_token_from_tag(tag: &[u8]) -> Option<uuid::Uuid> {
    let bytes: [u8; 16] = tag.try_into().ok()?;
    Some(uuid::Uuid::from_bytes_le(bytes))
}

/// AMQP uuids are RFC 4122 bytes in network order, as `uuid::Uuid` keeps them.
pub(crate) fn from_amqp_uuid(u: &sb_amqp::types::primitives::Uuid) -> uuid::Uuid {
    uuid::Uuid::from_bytes(*u.as_inner())
}

pub(crate) fn to_amqp_uuid(u: uuid::Uuid) -> sb_amqp::types::primitives::Uuid {
    sb_amqp::types::primitives::Uuid::from(u.into_bytes())
}

pub(crate) fn timestamp_to_system(ts: &Timestamp) -> SystemTime {
    let ms = ts.milliseconds();
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

pub(crate) fn system_to_timestamp(time: SystemTime) -> Timestamp {
    let ms = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    Timestamp::from_milliseconds(ms)
}

/// The text key of a message id of any AMQP type (see [`TYPED_MESSAGE_ID_PREFIX`]), or why
/// there is none.
pub(crate) fn message_id_key(id: &MessageId) -> Result<String, (String, Refusal)> {
    match id {
        MessageId::String(s) if s.starts_with(TYPED_MESSAGE_ID_PREFIX) => Err((
            s.clone(),
            Refusal {
                reason: dead_letter_reason::INVALID_MESSAGE_ID,
                description: format!(
                    "string message ids starting with {TYPED_MESSAGE_ID_PREFIX:?} are reserved for \
                     ids of other AMQP types (ulong, uuid, binary)"
                ),
            },
        )),
        MessageId::String(s) => Ok(s.clone()),
        MessageId::Ulong(n) => Ok(format!("{TYPED_MESSAGE_ID_PREFIX}ulong:{n}")),
        MessageId::Uuid(u) => Ok(format!(
            "{TYPED_MESSAGE_ID_PREFIX}uuid:{}",
            from_amqp_uuid(u)
        )),
        MessageId::Binary(_) => Ok(format!(
            "{TYPED_MESSAGE_ID_PREFIX}binary:{}",
            message_id_text(id)
        )),
    }
}

/// A message id of any AMQP type as the string Service Bus shows (for display and correlation,
/// never as a key).
pub(crate) fn message_id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => from_amqp_uuid(u).to_string(),
        MessageId::Binary(b) => b.iter().map(|byte| format!("{byte:02x}")).collect(),
    }
}

fn property_value(value: &SimpleValue) -> Option<PropertyValue> {
    Some(match value {
        SimpleValue::String(s) => PropertyValue::String(s.clone()),
        SimpleValue::Symbol(s) => PropertyValue::String(s.0.clone()),
        SimpleValue::Bool(b) => PropertyValue::Bool(*b),
        SimpleValue::Ubyte(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Ushort(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Uint(n) => PropertyValue::Long(i64::from(*n)),
        // Above i64::MAX a ulong has no Long: its decimal text keeps distinct values distinct
        // (clamped to i64::MAX, distinct ids read alike and all but one were dropped as
        // duplicates).
        SimpleValue::Ulong(n) => match i64::try_from(*n) {
            Ok(n) => PropertyValue::Long(n),
            Err(_) => PropertyValue::String(n.to_string()),
        },
        SimpleValue::Byte(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Short(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Int(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Long(n) => PropertyValue::Long(*n),
        SimpleValue::Float(f) => PropertyValue::Double(f64::from(f32::from(*f))),
        SimpleValue::Double(f) => PropertyValue::Double(f64::from(*f)),
        SimpleValue::Uuid(u) => PropertyValue::String(from_amqp_uuid(u).to_string()),
        SimpleValue::Timestamp(t) => PropertyValue::Long(t.milliseconds()),
        _ => return None,
    })
}

pub(crate) fn simple_value(value: &PropertyValue) -> SimpleValue {
    match value {
        PropertyValue::String(s) => SimpleValue::String(s.clone()),
        PropertyValue::Long(n) => SimpleValue::Long(*n),
        PropertyValue::Double(f) => SimpleValue::Double((*f).into()),
        PropertyValue::Bool(b) => SimpleValue::Bool(*b),
    }
}

/// The body as bytes: data sections joined; a string or binary amqp-value as its bytes (JS
/// and some .NET senders use amqp-value); anything else as empty, which fails decoding.
fn body_bytes(body: &Body<Value>) -> Bytes {
    match body {
        Body::Data(sections) => {
            let mut out = Vec::new();
            for Data(binary) in sections.iter() {
                out.extend_from_slice(binary);
            }
            Bytes::from(out)
        }
        Body::Value(AmqpValue(Value::String(s))) => Bytes::from(s.clone().into_bytes()),
        Body::Value(AmqpValue(Value::Binary(b))) => Bytes::from(b.to_vec()),
        _ => Bytes::new(),
    }
}

/// The value under the symbol key `name` of an annotations map.
fn symbol_entry<'a>(map: Option<&'a OrderedMap<OwnedKey, Value>>, name: &str) -> Option<&'a Value> {
    map?.iter()
        .find(|(k, _)| matches!(k, OwnedKey::Symbol(s) if s.0 == name))
        .map(|(_, v)| v)
}

/// Reads a received message and its Service Bus annotations.
pub(crate) fn from_amqp(message: &AnyMessage, tag: &[u8]) -> Received {
    let properties = message.properties.as_ref();
    let mut application_properties = BTreeMap::new();
    if let Some(ApplicationProperties(map)) = &message.application_properties {
        for (key, value) in map.iter() {
            if let Some(value) = property_value(value) {
                application_properties.insert(key.clone(), value);
            }
        }
    }
    let message_annotation =
        |name: &str| symbol_entry(message.message_annotations.as_ref().map(|a| &a.0), name);
    let locked_until = match message_annotation(annotation::LOCKED_UNTIL) {
        Some(Value::Timestamp(ts)) => Some(timestamp_to_system(ts)),
        _ => None,
    };
    let sequence_number = match message_annotation(annotation::SEQUENCE_NUMBER) {
        Some(Value::Long(n)) => Some(*n),
        _ => None,
    };
    let enqueued_time = match message_annotation(annotation::ENQUEUED_TIME) {
        Some(Value::Timestamp(ts)) => Some(timestamp_to_system(ts)),
        _ => None,
    };
    let delivery_annotations = message.delivery_annotations.as_ref().map(|a| &a.0);
    let lock_token = match symbol_entry(delivery_annotations, annotation::LOCK_TOKEN) {
        Some(Value::Uuid(u)) => Some(from_amqp_uuid(u)),
        _ => None,
    }
    .or_else(|| lock_token_from_tag(tag));
    let (message_id, refusal) = match properties.and_then(|p| p.message_id.as_ref()) {
        None => (None, None),
        Some(id) => match message_id_key(id) {
            Ok(key) => (Some(key), None),
            Err((text, refusal)) => (Some(text), Some(refusal)),
        },
    };
    Received {
        refusal,
        message: ServiceBusReceivedMessage {
            message_id,
            correlation_id: properties
                .and_then(|p| p.correlation_id.as_ref())
                .map(message_id_text),
            subject: properties.and_then(|p| p.subject.clone()),
            session_id: properties.and_then(|p| p.group_id.clone()),
            content_type: properties
                .and_then(|p| p.content_type.as_ref())
                .map(|s| s.0.clone()),
            application_properties,
            body: body_bytes(&message.body),
            delivery_count: message.header.as_ref().map_or(0, |h| h.delivery_count),
            lock_token,
            locked_until,
            sequence_number,
            enqueued_time,
            partition_key: match message_annotation(annotation::PARTITION_KEY) {
                Some(Value::String(key)) => Some(key.clone()),
                _ => None,
            },
            time_to_live: message
                .header
                .as_ref()
                .and_then(|h| h.ttl)
                .map(|ms| Duration::from_millis(u64::from(ms))),
            to: properties.and_then(|p| p.to.clone()),
            reply_to: properties.and_then(|p| p.reply_to.clone()),
        },
    }
}

/// Builds the AMQP message for a send: properties, application properties and one data
/// section, with the TTL (the options', else the message's), the scheduled enqueue time and the
/// partition key. As .NET's `AmqpMessageConverter.SBMessageToAmqpMessage`
/// (Azure/azure-sdk-for-net, `sdk/servicebus/Azure.Messaging.ServiceBus/src/Amqp/
/// AmqpMessageConverter.cs`): `to`, `reply-to` and `group-id` in the properties; a TTL in the
/// header's `ttl` with `creation-time` now and `absolute-expiry-time` = creation + TTL; the
/// scheduled time and the partition key as the message annotations
/// `x-opt-scheduled-enqueue-time` and `x-opt-partition-key`.
pub(crate) fn to_amqp(message: &ServiceBusMessage, options: &SendOptions) -> AmqpMessage<Data> {
    let time_to_live = options.time_to_live.or(message.time_to_live);
    let created = time_to_live.map(|_| SystemTime::now());
    let properties = Properties {
        message_id: message.message_id.clone().map(MessageId::String),
        correlation_id: message.correlation_id.clone().map(MessageId::String),
        subject: message.subject.clone(),
        content_type: message.content_type.clone().map(Symbol::from),
        group_id: message.session_id.clone(),
        to: message.to.clone(),
        reply_to: message.reply_to.clone(),
        creation_time: created.map(system_to_timestamp),
        absolute_expiry_time: created
            .zip(time_to_live)
            .map(|(at, ttl)| expiry_timestamp(at, ttl)),
        ..Properties::default()
    };
    let application_properties = (!message.application_properties.is_empty()).then(|| {
        let mut builder = ApplicationProperties::builder();
        for (key, value) in &message.application_properties {
            builder = builder.insert(key.clone(), simple_value(value));
        }
        builder.build()
    });
    let header = time_to_live.map(|ttl| Header {
        ttl: Some(u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX)),
        ..Header::default()
    });
    let mut annotations = OrderedMap::new();
    if let Some(at) = options.scheduled_enqueue_time {
        annotations.insert(
            OwnedKey::Symbol(Symbol::from(annotation::SCHEDULED_ENQUEUE_TIME)),
            Value::Timestamp(system_to_timestamp(at)),
        );
    }
    if let Some(key) = &message.partition_key {
        annotations.insert(
            OwnedKey::Symbol(Symbol::from(annotation::PARTITION_KEY)),
            Value::String(key.clone()),
        );
    }
    AmqpMessage {
        header,
        delivery_annotations: None,
        message_annotations: (!annotations.is_empty()).then_some(MessageAnnotations(annotations)),
        properties: Some(properties),
        application_properties,
        body: Data(Binary::from(message.body.to_vec())),
        footer: None,
    }
}

/// `at + ttl` as an AMQP timestamp, capped at the largest one (.NET caps at
/// `AmqpConstants.MaxAbsoluteExpiryTime` the same way).
fn expiry_timestamp(at: SystemTime, ttl: Duration) -> Timestamp {
    at.checked_add(ttl)
        .map_or(Timestamp::from_milliseconds(i64::MAX), system_to_timestamp)
}

/// The disposition that dead-letters with a reason and a description.
pub(super) fn dead_letter_outcome(reason: &str, description: &str) -> Outcome {
    let info = fields([
        (
            dead_letter::REASON.to_owned(),
            Value::String(reason.to_owned()),
        ),
        (
            dead_letter::ERROR_DESCRIPTION.to_owned(),
            Value::String(description.to_owned()),
        ),
    ]);
    Outcome::Rejected(Some(
        AmqpError::new(condition::DEAD_LETTER, None).with_info(info),
    ))
}

/// AMQP fields (a symbol-keyed map) from `entries`, in their order.
pub(super) fn fields(entries: impl IntoIterator<Item = (String, Value)>) -> Fields {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(Symbol::from(key), value);
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptions_are_cut_on_a_character_boundary() {
        assert_eq!(truncate("short", 10), "short");
        let cut = truncate(&"é".repeat(10), 8);
        assert!(cut.len() <= 8 && cut.ends_with('…'), "{cut}");
    }

    #[test]
    fn lock_token_uses_dotnet_guid_byte_order() {
        let token = uuid::Uuid::parse_str("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        let tag = token.to_bytes_le();
        assert_eq!(tag[..4], [0x33, 0x22, 0x11, 0x00]);
        assert_eq!(lock_token_from_tag(&tag), Some(token));
        assert_eq!(lock_token_from_tag(&[1, 2, 3]), None);
    }

    #[test]
    fn round_trip_through_the_wire_encoding() {
        let message = ServiceBusMessage::new(r#"{"a":1}"#)
            .with_message_id("m-1")
            .with_subject("orders.order-placed.v1")
            .with_content_type("application/json")
            .with_correlation_id("c-1")
            .with_property("tenant", "t")
            .with_property("n", PropertyValue::Long(7));
        let at = UNIX_EPOCH + Duration::from_millis(1_800_000_000_123);
        let options = SendOptions {
            time_to_live: Some(Duration::from_secs(5)),
            scheduled_enqueue_time: Some(at),
        };
        let encoded = sb_amqp::encode_message(&to_amqp(&message, &options)).unwrap();
        let decoded = sb_amqp::decode_message(&encoded).unwrap();
        let received = from_amqp(&decoded, &[]);
        // The options' TTL reads back as the message's.
        assert_eq!(
            received.message.to_message(),
            message.with_time_to_live(Duration::from_secs(5))
        );
        assert_eq!(received.message.delivery_count, 0);
        let annotations = decoded.message_annotations.clone().unwrap();
        let scheduled = annotations
            .0
            .iter()
            .find(|(k, _)| matches!(k, OwnedKey::Symbol(s) if s.0 == annotation::SCHEDULED_ENQUEUE_TIME))
            .map(|(_, v)| v.clone());
        assert_eq!(
            scheduled,
            Some(Value::Timestamp(Timestamp::from_milliseconds(
                1_800_000_000_123
            )))
        );
        assert_eq!(decoded.header.unwrap().ttl, Some(5000));
    }

    #[test]
    fn message_ids_of_other_types_keep_their_type_in_the_key() {
        let uuid = uuid::Uuid::parse_str("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        let ids = [
            MessageId::String("42".into()),
            MessageId::Ulong(42),
            MessageId::Uuid(to_amqp_uuid(uuid)),
            MessageId::Binary(Binary::from(vec![0x34, 0x32])),
            MessageId::String("00112233-4455-6677-8899-aabbccddeeff".into()),
            MessageId::String("3432".into()),
        ];
        let keys: Vec<String> = ids.iter().map(|id| message_id_key(id).unwrap()).collect();
        assert_eq!(
            keys,
            [
                "42",
                "amqp:ulong:42",
                "amqp:uuid:00112233-4455-6677-8899-aabbccddeeff",
                "amqp:binary:3432",
                "00112233-4455-6677-8899-aabbccddeeff",
                "3432",
            ]
        );
        let distinct: std::collections::HashSet<_> = keys.iter().collect();
        assert_eq!(distinct.len(), keys.len(), "no two ids share a key");
        let (text, refusal) =
            message_id_key(&MessageId::String("amqp:ulong:42".into())).unwrap_err();
        assert_eq!(
            (text.as_str(), refusal.reason),
            ("amqp:ulong:42", dead_letter_reason::INVALID_MESSAGE_ID)
        );
    }

    /// Issue 40, minor 8: ulongs past `i64::MAX` read as their decimal text, so two of them
    /// stay two values (a raw reader keys on them); smaller ones stay `Long`.
    #[test]
    fn large_ulong_properties_keep_their_value() {
        let big = 1_u64 << 63;
        let read = |n: u64| property_value(&SimpleValue::Ulong(n));
        assert_eq!(read(big), Some(PropertyValue::String(big.to_string())));
        assert_eq!(
            read(u64::MAX),
            Some(PropertyValue::String("18446744073709551615".into()))
        );
        assert_ne!(read(big), read(big + 1));
        assert_eq!(read(7), Some(PropertyValue::Long(7)));
    }

    /// Issue 40 (outbox publishing): the partition key, `to`, `reply-to` and a TTL go out as
    /// .NET's `AmqpMessageConverter` writes them (annotation `x-opt-partition-key`; properties
    /// `to`, `reply-to`, `creation-time`, `absolute-expiry-time` = creation + TTL; header `ttl`)
    /// and read back.
    #[test]
    fn publishing_fields_go_out_as_the_sdk_writes_them() {
        let message = ServiceBusMessage::new("{}")
            .with_message_id("m-1")
            .with_session_id("s-1")
            .with_partition_key("s-1")
            .with_to("audit")
            .with_reply_to("replies")
            .with_time_to_live(Duration::from_secs(90));
        let encoded = sb_amqp::encode_message(&to_amqp(&message, &SendOptions::default())).unwrap();
        let decoded = sb_amqp::decode_message(&encoded).unwrap();
        let properties = decoded.properties.clone().unwrap();
        let created = properties.creation_time.unwrap().milliseconds();
        let expires = properties.absolute_expiry_time.unwrap().milliseconds();
        assert_eq!(expires - created, 90_000);
        assert_eq!(decoded.header.clone().unwrap().ttl, Some(90_000));
        let key = symbol_entry(
            decoded.message_annotations.as_ref().map(|a| &a.0),
            annotation::PARTITION_KEY,
        );
        assert_eq!(key, Some(&Value::String("s-1".into())));
        let received = from_amqp(&decoded, &[]).message;
        assert_eq!(received.to_message(), message);
    }

    #[test]
    fn message_ids_of_every_type_read_as_text() {
        assert_eq!(message_id_text(&MessageId::Ulong(42)), "42");
        assert_eq!(message_id_text(&MessageId::String("x".into())), "x");
        let uuid = uuid::Uuid::parse_str("00112233-4455-6677-8899-aabbccddeeff").unwrap();
        assert_eq!(
            message_id_text(&MessageId::Uuid(to_amqp_uuid(uuid))),
            uuid.to_string()
        );
    }
}
