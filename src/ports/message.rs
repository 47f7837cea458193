//! [`Message`], the broker-neutral view of one message, and its [`PropertyValue`]s.

use std::collections::BTreeMap;

use bytes::Bytes;

/// Message ids of a non-string AMQP type are keyed with their type, so that string `"42"`, ulong
/// 42, a uuid and a binary id can never share an inbox key: `amqp:ulong:42`,
/// `amqp:uuid:00112233-…`, `amqp:binary:<hex>`. String ids starting with this prefix are
/// refused (`InvalidMessageId`): they could pose as a typed id. Copies the runtime sends (delayed
/// retries, resubmissions) therefore never carry a broker id with this prefix.
pub const TYPED_MESSAGE_ID_PREFIX: &str = "amqp:";

/// The prefix of every application property the inbox itself writes (the logical id, the
/// delayed-retry count, the first enqueue time, the last error, the resubmission count). They
/// describe one hop: the relay strips them from outgoing messages, so a handler that copies its
/// incoming properties onto the events it writes does not hand the next consumer a logical id
/// that makes every event after the first a duplicate.
pub const INBOX_PROPERTY_PREFIX: &str = "sb-inbox-";

/// An application property value: the subset of AMQP simple types Service Bus carries.
///
/// With the `serde` feature it is (de)serialised as the plain value (`"text"`, `7`, `0.5`,
/// `true`): an integer reads as `Long`, a number with a fraction or exponent as `Double`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(untagged)
)]
pub enum PropertyValue {
    /// A string.
    String(String),
    /// Any integer type, widened.
    Long(i64),
    /// Any floating point type, widened.
    Double(f64),
    /// A boolean.
    Bool(bool),
}

impl From<&str> for PropertyValue {
    fn from(value: &str) -> Self {
        PropertyValue::String(value.to_owned())
    }
}

impl From<String> for PropertyValue {
    fn from(value: String) -> Self {
        PropertyValue::String(value)
    }
}

impl From<i64> for PropertyValue {
    fn from(value: i64) -> Self {
        PropertyValue::Long(value)
    }
}

/// The broker-neutral view of one message as the runtime and handlers see it.
///
/// # Examples
/// ```
/// use sb_inbox::Message;
/// let message = Message::new("m-1", "orders.order-placed.v1", br#"{"orderId":"o-1","lines":[]}"#.to_vec());
/// assert_eq!(message.message_id.as_deref(), Some("m-1"));
/// ```
///
/// With the `serde` feature it is (de)serialised with its field names; absent fields are
/// `None` or empty, and the body is a string when it is UTF-8 (else an array of bytes; both
/// read back as bytes).
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(default, deny_unknown_fields)
)]
pub struct Message {
    /// The producer-assigned message id: the inbox key. `None` when the broker delivered none.
    pub message_id: Option<String>,
    /// Correlation id, carried to telemetry.
    pub correlation_id: Option<String>,
    /// Subject (Service Bus "label"): the contract name and version, e.g. `orders.order-placed.v1`.
    pub subject: Option<String>,
    /// MIME content type of the body.
    pub content_type: Option<String>,
    /// The Service Bus session id (AMQP `group-id`): in session mode the runtime handles the
    /// messages of one session strictly one at a time, in order.
    pub session_id: Option<String>,
    /// Application properties.
    pub application_properties: BTreeMap<String, PropertyValue>,
    /// The body bytes.
    #[cfg_attr(feature = "serde", serde(with = "body"))]
    pub body: Bytes,
    /// The Service Bus partition key (`x-opt-partition-key`): the partition of a partitioned
    /// entity. With a session id it must equal it.
    pub partition_key: Option<String>,
    /// How long the message lives on the entity (the header's `ttl`); the entity's default
    /// when `None` (Service Bus keeps the smaller of the two).
    pub time_to_live: Option<std::time::Duration>,
    /// The AMQP `to` address (Service Bus `To`): for the application, the broker does not
    /// route on it.
    pub to: Option<String>,
    /// The AMQP `reply-to` address (Service Bus `ReplyTo`): where a reply should go.
    pub reply_to: Option<String>,
}

/// The body as a string when it is UTF-8 (readable JSON bodies), else as bytes.
#[cfg(feature = "serde")]
mod body {
    use std::fmt;

    use bytes::Bytes;
    use serde::de::{self, SeqAccess, Visitor};
    use serde::{Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(body: &Bytes, serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(body) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => serializer.serialize_bytes(body),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Bytes, D::Error> {
        deserializer.deserialize_any(BodyVisitor)
    }

    struct BodyVisitor;

    impl<'de> Visitor<'de> for BodyVisitor {
        type Value = Bytes;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a string or an array of bytes")
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(text.as_bytes()))
        }

        fn visit_bytes<E: de::Error>(self, bytes: &[u8]) -> Result<Bytes, E> {
            Ok(Bytes::copy_from_slice(bytes))
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Bytes, A::Error> {
            let mut bytes = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(byte) = seq.next_element::<u8>()? {
                bytes.push(byte);
            }
            Ok(Bytes::from(bytes))
        }
    }
}

impl Message {
    /// The message with `session_id` (Service Bus `SessionId`).
    #[must_use]
    pub fn with_session_id(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// The message with `correlation_id`.
    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    /// The message with `partition_key` (Service Bus `PartitionKey`).
    #[must_use]
    pub fn with_partition_key(mut self, partition_key: impl Into<String>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// The message with a time-to-live (Service Bus `TimeToLive`).
    #[must_use]
    pub fn with_time_to_live(mut self, time_to_live: std::time::Duration) -> Self {
        self.time_to_live = Some(time_to_live);
        self
    }

    /// The message with the `to` address (Service Bus `To`).
    #[must_use]
    pub fn with_to(mut self, to: impl Into<String>) -> Self {
        self.to = Some(to.into());
        self
    }

    /// The message with the `reply-to` address (Service Bus `ReplyTo`).
    #[must_use]
    pub fn with_reply_to(mut self, reply_to: impl Into<String>) -> Self {
        self.reply_to = Some(reply_to.into());
        self
    }

    /// The message with `content_type` (`application/json` by [`Message::new`]).
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The message with the application property `name` set to `value`.
    #[must_use]
    pub fn with_property(
        mut self,
        name: impl Into<String>,
        value: impl Into<PropertyValue>,
    ) -> Self {
        self.application_properties
            .insert(name.into(), value.into());
        self
    }

    /// The message without the inbox's own application properties
    /// ([`INBOX_PROPERTY_PREFIX`]: the logical id, the retry count, …), for a handler that
    /// forwards a message it received through the [`Sender`](crate::Sender) port: they
    /// describe this hop, and copied through, the next consumer would key its inbox on this
    /// message's logical id (the relay strips them from outbox rows the same way). The port
    /// itself leaves them: delayed retries and resubmissions send through it and need them.
    #[must_use]
    pub fn forwardable(mut self) -> Self {
        self.application_properties
            .retain(|name, _| !name.starts_with(INBOX_PROPERTY_PREFIX));
        self
    }

    /// A message with an id, a subject (contract) and a body.
    pub fn new(
        message_id: impl Into<String>,
        subject: impl Into<String>,
        body: impl Into<Bytes>,
    ) -> Self {
        Message {
            message_id: Some(message_id.into()),
            subject: Some(subject.into()),
            content_type: Some("application/json".to_owned()),
            body: body.into(),
            ..Message::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40, minor 16: a forwarded message drops the inbox's properties and keeps the
    /// producer's.
    #[test]
    fn a_forwardable_message_has_no_inbox_properties() {
        let message = Message::new("m-1", "orders.order-placed.v1", "{}")
            .with_property("sb-inbox-logical-id", "m-0")
            .with_property("sb-inbox-retry-attempt", 2_i64)
            .with_property("tenant", "contoso")
            .forwardable();
        let names: Vec<&str> = message
            .application_properties
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(names, ["tenant"]);
    }
}

#[cfg(all(test, feature = "serde"))]
mod serde_tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_json_with_every_property_kind() {
        let message = Message::new("m-1", "orders.order-placed.v1", r#"{"orderId":"o-1"}"#)
            .with_correlation_id("c-1")
            .with_session_id("s-1")
            .with_property("tenant", "contoso")
            .with_property("lines", 2_i64)
            .with_property("ratio", PropertyValue::Double(1.0))
            .with_property("urgent", PropertyValue::Bool(true));
        let json = serde_json::to_value(&message).unwrap();
        assert_eq!(
            json["body"], r#"{"orderId":"o-1"}"#,
            "a UTF-8 body reads as text"
        );
        assert_eq!(json["application_properties"]["lines"], 2);
        let back: Message = serde_json::from_value(json).unwrap();
        assert_eq!(back, message);
        // A double stays a double, an integer an integer.
        assert_eq!(
            back.application_properties.get("ratio"),
            Some(&PropertyValue::Double(1.0))
        );
    }

    #[test]
    fn a_binary_body_round_trips_and_absent_fields_are_empty() {
        let message = Message {
            body: Bytes::from_static(&[0xff, 0x00, 0x80]),
            ..Message::default()
        };
        let text = serde_json::to_string(&message).unwrap();
        let back: Message = serde_json::from_str(&text).unwrap();
        assert_eq!(back, message);
        let sparse: Message = serde_json::from_str(r#"{"message_id":"m-2"}"#).unwrap();
        assert_eq!(sparse.message_id.as_deref(), Some("m-2"));
        assert!(sparse.body.is_empty() && sparse.subject.is_none());
        let typo = serde_json::from_str::<Message>(r#"{"mesage_id":"m-2"}"#);
        assert!(typo.is_err(), "an unknown field is refused: {typo:?}");
    }
}
