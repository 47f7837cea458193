//! AMQP messages ⇄ broker messages.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::servicebus::annotation as names;
use sb_amqp::types::messaging::annotations::OwnedKey;
use sb_amqp::types::messaging::{
    ApplicationProperties, Body, DeliveryAnnotations, Header, MessageAnnotations, MessageId,
    Properties,
};
use sb_amqp::types::primitives::{SimpleValue, Symbol, Timestamp};
use sb_amqp::{AnyMessage, BATCH_MESSAGE_FORMAT, decode_message, encode_message};

use crate::{BrokerMessage, MessageState, PropertyValue, ReceivedMessage};

/// A message that does not decode or encode (the engine's error text).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CodecError(pub(crate) String);

impl From<sb_amqp::Error> for CodecError {
    fn from(error: sb_amqp::Error) -> Self {
        CodecError(error.to_string())
    }
}

pub(crate) fn to_system(ts: &Timestamp) -> SystemTime {
    let ms = ts.milliseconds();
    if ms >= 0 {
        UNIX_EPOCH + Duration::from_millis(ms.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_millis(ms.unsigned_abs())
    }
}

pub(crate) fn to_timestamp(time: SystemTime) -> Timestamp {
    Timestamp::from_milliseconds(
        time.duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
    )
}

pub(crate) fn from_uuid(u: &sb_amqp::types::primitives::Uuid) -> uuid::Uuid {
    uuid::Uuid::from_bytes(*u.as_inner())
}

pub(crate) fn to_uuid(u: uuid::Uuid) -> sb_amqp::types::primitives::Uuid {
    sb_amqp::types::primitives::Uuid::from(u.into_bytes())
}

fn id_text(id: &MessageId) -> String {
    match id {
        MessageId::String(s) => s.clone(),
        MessageId::Ulong(n) => n.to_string(),
        MessageId::Uuid(u) => from_uuid(u).to_string(),
        MessageId::Binary(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

fn property(value: &SimpleValue) -> PropertyValue {
    match value {
        SimpleValue::Null => PropertyValue::Null,
        SimpleValue::Bool(b) => PropertyValue::Bool(*b),
        SimpleValue::Ubyte(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Ushort(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Uint(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Ulong(n) => PropertyValue::Long(i64::try_from(*n).unwrap_or(i64::MAX)),
        SimpleValue::Byte(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Short(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Int(n) => PropertyValue::Long(i64::from(*n)),
        SimpleValue::Long(n) => PropertyValue::Long(*n),
        SimpleValue::Float(f) => PropertyValue::Double(f64::from(f32::from(*f))),
        SimpleValue::Double(f) => PropertyValue::Double(f64::from(*f)),
        SimpleValue::Timestamp(t) => PropertyValue::Timestamp(to_system(t)),
        SimpleValue::Uuid(u) => PropertyValue::Uuid(from_uuid(u)),
        SimpleValue::Binary(b) => PropertyValue::Binary(Bytes::from(b.to_vec())),
        SimpleValue::String(s) => PropertyValue::String(s.clone()),
        SimpleValue::Symbol(s) => PropertyValue::String(s.0.clone()),
        _ => PropertyValue::Null,
    }
}

fn simple(value: &PropertyValue) -> SimpleValue {
    match value {
        PropertyValue::Null => SimpleValue::Null,
        PropertyValue::Bool(b) => SimpleValue::Bool(*b),
        PropertyValue::Long(n) => SimpleValue::Long(*n),
        PropertyValue::Double(f) => SimpleValue::Double((*f).into()),
        PropertyValue::String(s) => SimpleValue::String(s.clone()),
        PropertyValue::Uuid(u) => SimpleValue::Uuid(to_uuid(*u)),
        PropertyValue::Timestamp(t) => SimpleValue::Timestamp(to_timestamp(*t)),
        PropertyValue::Binary(b) => SimpleValue::Binary(b.to_vec().into()),
    }
}

/// A broker property as an AMQP value (correlation filter properties in enumerate-rules).
pub(crate) fn property_to_value(value: &PropertyValue) -> Value {
    match value {
        PropertyValue::Null => Value::Null,
        PropertyValue::Bool(b) => Value::Bool(*b),
        PropertyValue::Long(n) => Value::Long(*n),
        PropertyValue::Double(f) => Value::Double((*f).into()),
        PropertyValue::String(s) => Value::String(s.clone()),
        PropertyValue::Uuid(u) => Value::Uuid(to_uuid(*u)),
        PropertyValue::Timestamp(t) => Value::Timestamp(to_timestamp(*t)),
        PropertyValue::Binary(b) => Value::Binary(b.to_vec().into()),
    }
}

/// A `Value` from a map entry as a broker property (for properties-to-modify and DLQ info).
pub(crate) fn value_property(value: &Value) -> PropertyValue {
    match value {
        Value::Bool(b) => PropertyValue::Bool(*b),
        Value::Long(n) => PropertyValue::Long(*n),
        Value::Int(n) => PropertyValue::Long(i64::from(*n)),
        Value::Uint(n) => PropertyValue::Long(i64::from(*n)),
        Value::Ulong(n) => PropertyValue::Long(i64::try_from(*n).unwrap_or(i64::MAX)),
        Value::Double(f) => PropertyValue::Double(f64::from(*f)),
        Value::String(s) => PropertyValue::String(s.clone()),
        Value::Symbol(s) => PropertyValue::String(s.0.clone()),
        Value::Uuid(u) => PropertyValue::Uuid(from_uuid(u)),
        Value::Timestamp(t) => PropertyValue::Timestamp(to_system(t)),
        _ => PropertyValue::Null,
    }
}

/// The key of an annotation or map entry as text (symbol or string keys, as peers differ).
pub(crate) fn key_text(key: &Value) -> Option<&str> {
    match key {
        Value::String(s) => Some(s),
        Value::Symbol(s) => Some(&s.0),
        _ => None,
    }
}

fn annotation<'a>(annotations: &'a Option<MessageAnnotations>, name: &str) -> Option<&'a Value> {
    annotations
        .as_ref()?
        .0
        .iter()
        .find(|(k, _)| matches!(k, OwnedKey::Symbol(s) if s.0 == name))
        .map(|(_, v)| v)
}

/// Reads one sent message.
pub(crate) fn broker_message(payload: Bytes) -> Result<BrokerMessage, CodecError> {
    let message = decode_message(&payload)?;
    let properties = message.properties.clone().unwrap_or_default();
    let mut out = BrokerMessage::new(payload);
    out.message_id = properties.message_id.as_ref().map(id_text);
    out.correlation_id = properties.correlation_id.as_ref().map(id_text);
    out.subject = properties.subject.clone();
    out.to = properties.to.clone();
    out.reply_to = properties.reply_to.clone();
    out.content_type = properties.content_type.as_ref().map(|s| s.0.clone());
    out.session_id = properties.group_id.clone();
    out.reply_to_session_id = properties.reply_to_group_id.clone();
    if let Some(ApplicationProperties(map)) = &message.application_properties {
        for (key, value) in map.iter() {
            out.application_properties
                .insert(key.clone(), property(value));
        }
    }
    out.time_to_live = message
        .header
        .as_ref()
        .and_then(|h| h.ttl)
        .map(|ms| Duration::from_millis(u64::from(ms)));
    if let Some(Value::Timestamp(ts)) =
        annotation(&message.message_annotations, names::SCHEDULED_ENQUEUE_TIME)
    {
        out.scheduled_enqueue_time = Some(to_system(ts));
    }
    if let Some(Value::String(key)) = annotation(&message.message_annotations, names::PARTITION_KEY)
    {
        out.partition_key = Some(key.clone());
    }
    Ok(out)
}

/// Reads a transfer: one message, or a batch (format 0x80013700) of data sections that each
/// hold one encoded message.
pub(crate) fn broker_messages(
    format: u32,
    payload: Bytes,
) -> Result<Vec<BrokerMessage>, CodecError> {
    if format != BATCH_MESSAGE_FORMAT {
        return Ok(vec![broker_message(payload)?]);
    }
    let batch = decode_message(&payload)?;
    match batch.body {
        Body::Data(sections) => sections
            .iter()
            .map(|d| broker_message(Bytes::from(d.0.to_vec())))
            .collect(),
        _ => Err(CodecError("a batch must carry data sections".into())),
    }
}

/// Envelope bytes a batch may carry beyond its messages: the properties the SDKs copy from
/// the first message onto the envelope (Python `_pyamqp_transport.set_batch_envelope_properties`)
/// are headers, and the service bounds a message's headers at 64 KB (Microsoft, "Service Bus
/// quotas": "Maximum header size: 64 KB").
pub(crate) const BATCH_ENVELOPE_ALLOWANCE: u64 = 64 * 1024;

/// The size the service holds a transfer to against the entity's `max-message-size`: a single
/// message's encoded bytes; for a batch, its messages, each with its data section's header (5
/// bytes below 256 bytes, else 8), not the envelope. The SDKs fill batches to the advertised
/// limit by exactly that count (Python `azure-servicebus` 7.15 `_common/message.py`
/// `ServiceBusMessageBatch._add`: `message_size + _BATCH_MESSAGE_OVERHEAD_COST[0 if (message_size
/// < 256) else 1]`, `_common/constants.py` `[5, 8]`; .NET `AmqpMessageBatch.TryAddMessage`), and
/// the service accepts such batches: their envelope properties, which the SDK never counts,
/// must not push them over.
pub(crate) fn measured_size(format: u32, payload_len: usize, messages: &[BrokerMessage]) -> usize {
    if format != BATCH_MESSAGE_FORMAT {
        return payload_len;
    }
    messages
        .iter()
        .map(|m| {
            let len = m.payload.len();
            len + if len < 256 { 5 } else { 8 }
        })
        .sum()
}

fn annotations(entries: Vec<(&str, Value)>) -> OrderedMap<OwnedKey, Value> {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(OwnedKey::Symbol(Symbol::from(key)), value);
    }
    map
}

/// `payload` followed by a data section that announces 16 bytes and holds none: no AMQP decoder
/// reads it (the undecodable-delivery fault).
pub(crate) fn cut_short(payload: &[u8]) -> Bytes {
    let truncated_data = [0x00, 0x53, 0x75, 0xb0, 0x00, 0x00, 0x00, 0x10];
    Bytes::from([payload, &truncated_data].concat())
}

/// The message as delivered: the sender's bare message with the broker's header, annotations
/// and current application properties.
pub(crate) fn delivered(received: &ReceivedMessage) -> Result<Bytes, CodecError> {
    let mut message: AnyMessage = decode_message(&received.message.payload)?;
    let header = message.header.take().unwrap_or_default();
    if let Some(token) = received.lock_token {
        message.delivery_annotations = Some(DeliveryAnnotations(annotations(vec![(
            names::LOCK_TOKEN,
            Value::Uuid(to_uuid(token)),
        )])));
    }
    let mut extra = vec![
        (
            names::SEQUENCE_NUMBER,
            Value::Long(received.sequence_number),
        ),
        (
            names::ENQUEUED_TIME,
            Value::Timestamp(to_timestamp(received.enqueued_time)),
        ),
    ];
    if let Some(until) = received.locked_until {
        extra.push((names::LOCKED_UNTIL, Value::Timestamp(to_timestamp(until))));
    }
    if received.state != MessageState::Active {
        extra.push((
            names::MESSAGE_STATE,
            Value::Int(received.state.annotation()),
        ));
    }
    if let Some(source) = &received.dead_letter_source {
        extra.push((names::DEAD_LETTER_SOURCE, Value::String(source.clone())));
    }
    let mut merged = message
        .message_annotations
        .take()
        .map(|a| a.0)
        .unwrap_or_default();
    for (key, value) in annotations(extra) {
        merged.insert(key, value);
    }
    message.message_annotations = Some(MessageAnnotations(merged));
    let properties = message.properties.get_or_insert_with(Properties::default);
    if properties.message_id.is_none() {
        properties.message_id = received.message.message_id.clone().map(MessageId::String);
    }
    system_properties(properties, &received.message);
    message.application_properties =
        (!received.message.application_properties.is_empty()).then(|| {
            let mut map = OrderedMap::new();
            for (key, value) in &received.message.application_properties {
                map.insert(key.clone(), simple(value));
            }
            ApplicationProperties(map)
        });
    let body = encode_message(&message)?;
    let mut out = header_section(&header, received.delivery_count);
    out.extend_from_slice(&body);
    Ok(Bytes::from(out))
}

/// Writes the system properties a subscription rule's action may have changed (`SET
/// sys.Label = …`) from the broker's message. One the action left alone keeps the sender's
/// encoding: a correlation-id sent as a uuid stays a uuid.
fn system_properties(properties: &mut Properties, m: &BrokerMessage) {
    if properties.correlation_id.as_ref().map(id_text) != m.correlation_id {
        properties.correlation_id = m.correlation_id.clone().map(MessageId::String);
    }
    if properties.content_type.as_ref().map(|s| s.0.as_str()) != m.content_type.as_deref() {
        properties.content_type = m.content_type.as_deref().map(Symbol::from);
    }
    properties.subject.clone_from(&m.subject);
    properties.to.clone_from(&m.to);
    properties.reply_to.clone_from(&m.reply_to);
    properties.group_id.clone_from(&m.session_id);
    properties
        .reply_to_group_id
        .clone_from(&m.reply_to_session_id);
}

/// Encodes the header section with every field written: the codec drops trailing default
/// fields, but clients read an absent `delivery-count` as unknown rather than 0.
fn header_section(header: &Header, delivery_count: u32) -> Vec<u8> {
    let mut fields = vec![
        if header.durable { 0x41 } else { 0x42 },
        0x50,
        header.priority.0,
    ];
    match header.ttl {
        Some(ttl) => {
            fields.push(0x70);
            fields.extend_from_slice(&ttl.to_be_bytes());
        }
        None => fields.push(0x40),
    }
    fields.push(if header.first_acquirer { 0x41 } else { 0x42 });
    fields.push(0x70);
    fields.extend_from_slice(&delivery_count.to_be_bytes());
    // Descriptor 0x70 (header), then list8: size (count byte + fields) and count 5.
    let mut out = vec![
        0x00,
        0x53,
        0x70,
        0xc0,
        u8::try_from(fields.len() + 1).unwrap_or(u8::MAX),
        5,
    ];
    out.extend_from_slice(&fields);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_cut_short_does_not_decode() {
        let whole = [0x00, 0x53, 0x77, 0xa1, 0x01, b'x'];
        assert!(decode_message(&whole).is_ok());
        assert!(decode_message(&cut_short(&whole)).is_err());
    }

    #[test]
    fn header_keeps_a_zero_delivery_count() {
        let bytes = header_section(&Header::default(), 0);
        let message =
            decode_message(&[bytes.as_slice(), &[0x00, 0x53, 0x77, 0xa1, 0x01, b'x']].concat())
                .unwrap();
        let header = message.header.unwrap();
        assert_eq!(
            (header.delivery_count, header.ttl, header.priority.0),
            (0, None, 4)
        );
        let bytes = header_section(
            &Header {
                ttl: Some(5000),
                ..Header::default()
            },
            3,
        );
        let message =
            decode_message(&[bytes.as_slice(), &[0x00, 0x53, 0x77, 0x40]].concat()).unwrap();
        assert_eq!(message.header.unwrap().delivery_count, 3);
        assert_eq!(bytes.len(), 6 + 1 + 2 + 5 + 1 + 5);
    }
    /// What a rule action changed reaches the wire; what it left keeps the sender's encoding.
    #[test]
    fn a_delivery_carries_what_a_rule_action_changed() {
        let id = uuid::Uuid::from_u128(7);
        let mut props = OrderedMap::new();
        props.insert("x".to_owned(), SimpleValue::Long(1));
        let sent = AnyMessage {
            header: None,
            delivery_annotations: None,
            message_annotations: None,
            properties: Some(Properties {
                subject: Some("a".into()),
                correlation_id: Some(MessageId::Uuid(to_uuid(id))),
                ..Properties::default()
            }),
            application_properties: Some(ApplicationProperties(props)),
            body: Body::Value(sb_amqp::types::messaging::AmqpValue(Value::Null)),
            footer: None,
        };
        let mut message = broker_message(encode_message(&sent).unwrap()).unwrap();
        crate::SqlRuleAction::parse("SET sys.Label = 'b'; SET sys.To = 'q'; REMOVE x")
            .unwrap()
            .apply(&mut message);
        let received = ReceivedMessage {
            message,
            sequence_number: 1,
            enqueued_time: UNIX_EPOCH,
            delivery_count: 0,
            lock_token: None,
            locked_until: None,
            state: MessageState::Active,
            expires_at: None,
            dead_letter_source: None,
        };
        let out = decode_message(&delivered(&received).unwrap()).unwrap();
        let p = out.properties.unwrap();
        assert_eq!(p.subject.as_deref(), Some("b"));
        assert_eq!(p.to.as_deref(), Some("q"));
        assert_eq!(p.correlation_id, Some(MessageId::Uuid(to_uuid(id))));
        assert!(out.application_properties.is_none(), "x removed");
    }
}
