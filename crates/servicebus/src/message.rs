//! The client's messages: [`ServiceBusMessage`] to send, [`ServiceBusReceivedMessage`] as
//! received (with the broker's state), and their [`PropertyValue`]s.
//!
//! The fields are the SDKs' (.NET `ServiceBusMessage` / `ServiceBusReceivedMessage`, Python
//! `azure.servicebus.ServiceBusMessage` / `ServiceBusReceivedMessage`): the AMQP `properties`
//! section (message id, correlation id, subject, content type, session id as `group-id`), the
//! application properties, one data section as the body, and what the broker writes in the
//! message annotations (`x-opt-sequence-number`, `x-opt-enqueued-time`, `x-opt-locked-until`)
//! and the header (`delivery-count`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sb_amqp::servicebus::dead_letter;

/// Message ids of a non-string AMQP type are read as text with their type, so that string
/// `"42"`, ulong 42, a uuid and a binary id never read alike: `amqp:ulong:42`,
/// `amqp:uuid:00112233-…`, `amqp:binary:<hex>`. A received string id starting with this prefix
/// could pose as a typed id: the receiver dead-letters it with
/// [`dead_letter_reason::INVALID_MESSAGE_ID`](crate::dead_letter_reason::INVALID_MESSAGE_ID).
pub const TYPED_MESSAGE_ID_PREFIX: &str = "amqp:";

/// An application property value: the subset of AMQP simple types Service Bus carries (any
/// integer read as `Long`, but a ulong above `i64::MAX` as its decimal text, any float as
/// `Double`, a uuid as its text, a timestamp as its milliseconds since the epoch).
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

impl From<f64> for PropertyValue {
    fn from(value: f64) -> Self {
        PropertyValue::Double(value)
    }
}

impl From<bool> for PropertyValue {
    fn from(value: bool) -> Self {
        PropertyValue::Bool(value)
    }
}

/// A message to send.
///
/// # Examples
/// ```
/// use sb_servicebus::ServiceBusMessage;
/// let message = ServiceBusMessage::new(r#"{"orderId":"o-1"}"#)
///     .with_message_id("m-1")
///     .with_subject("orders.order-placed.v1")
///     .with_content_type("application/json")
///     .with_property("tenant", "contoso");
/// assert_eq!(message.message_id.as_deref(), Some("m-1"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ServiceBusMessage {
    /// The message id (AMQP `message-id`, a string): what duplicate detection and idempotent
    /// consumers key on.
    pub message_id: Option<String>,
    /// The correlation id.
    pub correlation_id: Option<String>,
    /// The subject (Service Bus "label").
    pub subject: Option<String>,
    /// The MIME content type of the body.
    pub content_type: Option<String>,
    /// The session id (AMQP `group-id`), required by session-enabled entities.
    pub session_id: Option<String>,
    /// Application properties.
    pub application_properties: BTreeMap<String, PropertyValue>,
    /// The body, sent as one data section.
    pub body: Bytes,
    /// The partition key (message annotation `x-opt-partition-key`), as .NET's
    /// `ServiceBusMessage.PartitionKey`. With a session id it must be equal to it.
    pub partition_key: Option<String>,
    /// The message's time-to-live (the header's `ttl`, with `creation-time` and
    /// `absolute-expiry-time` as the .NET SDK writes them); [`SendOptions::time_to_live`]
    /// wins when both are set.
    ///
    /// [`SendOptions::time_to_live`]: crate::SendOptions::time_to_live
    pub time_to_live: Option<std::time::Duration>,
    /// The `to` address (AMQP properties `to`), for the application.
    pub to: Option<String>,
    /// The `reply-to` address (AMQP properties `reply-to`).
    pub reply_to: Option<String>,
}

impl ServiceBusMessage {
    /// A message with `body` and nothing else set.
    pub fn new(body: impl Into<Bytes>) -> Self {
        ServiceBusMessage {
            body: body.into(),
            ..ServiceBusMessage::default()
        }
    }

    /// The message with `message_id`.
    #[must_use]
    pub fn with_message_id(mut self, message_id: impl Into<String>) -> Self {
        self.message_id = Some(message_id.into());
        self
    }

    /// The message with `correlation_id`.
    #[must_use]
    pub fn with_correlation_id(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = Some(correlation_id.into());
        self
    }

    /// The message with `subject`.
    #[must_use]
    pub fn with_subject(mut self, subject: impl Into<String>) -> Self {
        self.subject = Some(subject.into());
        self
    }

    /// The message with `content_type`.
    #[must_use]
    pub fn with_content_type(mut self, content_type: impl Into<String>) -> Self {
        self.content_type = Some(content_type.into());
        self
    }

    /// The message with `session_id`.
    #[must_use]
    pub fn with_session_id(mut self, session_id: impl Into<String>) -> Self {
        self.session_id = Some(session_id.into());
        self
    }

    /// The message with `partition_key`.
    #[must_use]
    pub fn with_partition_key(mut self, partition_key: impl Into<String>) -> Self {
        self.partition_key = Some(partition_key.into());
        self
    }

    /// The message with a time-to-live.
    #[must_use]
    pub fn with_time_to_live(mut self, time_to_live: std::time::Duration) -> Self {
        self.time_to_live = Some(time_to_live);
        self
    }

    /// The message with the `to` address.
    #[must_use]
    pub fn with_to(mut self, to: impl Into<String>) -> Self {
        self.to = Some(to.into());
        self
    }

    /// The message with the `reply-to` address.
    #[must_use]
    pub fn with_reply_to(mut self, reply_to: impl Into<String>) -> Self {
        self.reply_to = Some(reply_to.into());
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
}

/// A received message: what its producer set, and what the broker added.
#[derive(Debug, Clone, Default, PartialEq)]
#[non_exhaustive]
pub struct ServiceBusReceivedMessage {
    /// The message id as text; ids of other AMQP types carry [`TYPED_MESSAGE_ID_PREFIX`].
    pub message_id: Option<String>,
    /// The correlation id as text.
    pub correlation_id: Option<String>,
    /// The subject (Service Bus "label").
    pub subject: Option<String>,
    /// The MIME content type of the body.
    pub content_type: Option<String>,
    /// The session id (AMQP `group-id`).
    pub session_id: Option<String>,
    /// Application properties (those of a type Service Bus does not carry are left out).
    pub application_properties: BTreeMap<String, PropertyValue>,
    /// The body: the data sections joined, or a string or binary `amqp-value` as its bytes.
    pub body: Bytes,
    /// The broker's sequence number (`x-opt-sequence-number`).
    pub sequence_number: Option<i64>,
    /// When the broker accepted the message (`x-opt-enqueued-time`).
    pub enqueued_time: Option<SystemTime>,
    /// Deliveries before this one (the header's `delivery-count`; 0 on the first).
    pub delivery_count: u32,
    /// The lock token (the delivery tag, or the `x-opt-lock-token` delivery annotation).
    pub lock_token: Option<uuid::Uuid>,
    /// When the lock runs out, by the broker's clock (`x-opt-locked-until`).
    pub locked_until: Option<SystemTime>,
    /// The partition key its producer set (`x-opt-partition-key`).
    pub partition_key: Option<String>,
    /// The time-to-live its producer set (the header's `ttl`).
    pub time_to_live: Option<std::time::Duration>,
    /// The `to` address its producer set.
    pub to: Option<String>,
    /// The `reply-to` address its producer set.
    pub reply_to: Option<String>,
}

impl ServiceBusReceivedMessage {
    /// `DeadLetterReason`, for a dead-lettered message (the application property Service Bus
    /// writes).
    pub fn dead_letter_reason(&self) -> Option<&str> {
        self.text(dead_letter::REASON)
    }

    /// `DeadLetterErrorDescription`, for a dead-lettered message.
    pub fn dead_letter_description(&self) -> Option<&str> {
        self.text(dead_letter::ERROR_DESCRIPTION)
    }

    fn text(&self, name: &str) -> Option<&str> {
        match self.application_properties.get(name) {
            Some(PropertyValue::String(text)) => Some(text),
            _ => None,
        }
    }

    /// The message to send again: what its producer set, none of the broker's state.
    pub fn to_message(&self) -> ServiceBusMessage {
        ServiceBusMessage {
            message_id: self.message_id.clone(),
            correlation_id: self.correlation_id.clone(),
            subject: self.subject.clone(),
            content_type: self.content_type.clone(),
            session_id: self.session_id.clone(),
            application_properties: self.application_properties.clone(),
            body: self.body.clone(),
            partition_key: self.partition_key.clone(),
            time_to_live: self.time_to_live,
            to: self.to.clone(),
            reply_to: self.reply_to.clone(),
        }
    }
}

/// Per-message send options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendOptions {
    /// The message's time-to-live (the entity's default when `None`).
    pub time_to_live: Option<Duration>,
    /// Keep the message invisible until this time (Service Bus scheduled messages).
    pub scheduled_enqueue_time: Option<SystemTime>,
}

impl SendOptions {
    /// Options that schedule the message for `at`.
    pub fn scheduled(at: SystemTime) -> Self {
        SendOptions::default().with_scheduled_enqueue_time(at)
    }

    /// The options with the message's time-to-live.
    #[must_use]
    pub fn with_time_to_live(mut self, time_to_live: Duration) -> Self {
        self.time_to_live = Some(time_to_live);
        self
    }

    /// The options keeping the message invisible until `at`.
    #[must_use]
    pub fn with_scheduled_enqueue_time(mut self, at: SystemTime) -> Self {
        self.scheduled_enqueue_time = Some(at);
        self
    }
}
