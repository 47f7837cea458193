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
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
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
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
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
    pub body: Bytes,
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
