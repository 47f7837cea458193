//! The AMQP-agnostic message representation.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use sb_amqp::servicebus::annotation::MessageState as WireState;
use uuid::Uuid;

/// An application property value: the subset of AMQP simple types filters and overlays need.
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    /// AMQP `null`.
    Null,
    /// AMQP `boolean`.
    Bool(bool),
    /// Any AMQP integer that fits an `i64`.
    Long(i64),
    /// AMQP `float` or `double`.
    Double(f64),
    /// AMQP `string` or `symbol`.
    String(String),
    /// AMQP `uuid`.
    Uuid(Uuid),
    /// AMQP `timestamp`.
    Timestamp(SystemTime),
    /// AMQP `binary`.
    Binary(Bytes),
}

impl From<&str> for PropertyValue {
    fn from(v: &str) -> Self {
        PropertyValue::String(v.to_owned())
    }
}

impl From<String> for PropertyValue {
    fn from(v: String) -> Self {
        PropertyValue::String(v)
    }
}

impl From<i64> for PropertyValue {
    fn from(v: i64) -> Self {
        PropertyValue::Long(v)
    }
}

impl From<i32> for PropertyValue {
    fn from(v: i32) -> Self {
        PropertyValue::Long(i64::from(v))
    }
}

impl From<f64> for PropertyValue {
    fn from(v: f64) -> Self {
        PropertyValue::Double(v)
    }
}

impl From<bool> for PropertyValue {
    fn from(v: bool) -> Self {
        PropertyValue::Bool(v)
    }
}

/// Application properties and overlays, ordered by name.
pub type Properties = BTreeMap<String, PropertyValue>;

/// A message as the broker stores it.
///
/// The broker reads only the fields that drive its semantics (ids for duplicate detection and
/// filters, TTL, schedule time). The wire layer keeps the sender's encoded bare message in
/// [`payload`](Self::payload) and, when it re-encodes a delivery, merges
/// [`properties_to_modify`](Self::properties_to_modify) into the application properties
/// (abandon/defer with properties to modify, dead-letter reason and description).
#[derive(Debug, Clone, Default)]
pub struct BrokerMessage {
    /// AMQP `message-id` as a string; the broker assigns one when absent.
    pub message_id: Option<String>,
    /// AMQP `correlation-id` as a string.
    pub correlation_id: Option<String>,
    /// AMQP `subject` (Service Bus `Label`/`Subject`).
    pub subject: Option<String>,
    /// AMQP `to`.
    pub to: Option<String>,
    /// AMQP `reply-to`.
    pub reply_to: Option<String>,
    /// AMQP `reply-to-group-id` (Service Bus `ReplyToSessionId`).
    pub reply_to_session_id: Option<String>,
    /// AMQP `group-id` (Service Bus `SessionId`).
    pub session_id: Option<String>,
    /// AMQP `content-type`.
    pub content_type: Option<String>,
    /// Message annotation `x-opt-partition-key`.
    pub partition_key: Option<String>,
    /// AMQP application properties (already including earlier overlays).
    pub application_properties: Properties,
    /// AMQP header `ttl`; the entity's `DefaultMessageTimeToLive` caps it.
    pub time_to_live: Option<Duration>,
    /// Message annotation `x-opt-scheduled-enqueue-time`: the message stays invisible until then.
    pub scheduled_enqueue_time: Option<SystemTime>,
    /// The encoded message (opaque to the broker); its length is the message size.
    pub payload: Bytes,
    /// Application properties set by the broker or by settlements since the message was sent.
    /// They are also merged into [`application_properties`](Self::application_properties).
    pub properties_to_modify: Properties,
}

impl BrokerMessage {
    /// A message with this payload and no properties.
    pub fn new(payload: impl Into<Bytes>) -> Self {
        BrokerMessage {
            payload: payload.into(),
            ..BrokerMessage::default()
        }
    }

    /// Sets the message id.
    pub fn with_message_id(mut self, id: impl Into<String>) -> Self {
        self.message_id = Some(id.into());
        self
    }

    /// Sets an application property.
    pub fn with_property(
        mut self,
        name: impl Into<String>,
        value: impl Into<PropertyValue>,
    ) -> Self {
        self.application_properties
            .insert(name.into(), value.into());
        self
    }

    /// The size the broker checks against the entity's maximum message size.
    pub fn size(&self) -> usize {
        self.payload.len()
    }

    /// Merges properties into both the application properties and the overlay.
    pub(crate) fn modify(&mut self, properties: Properties) {
        for (name, value) in properties {
            self.application_properties
                .insert(name.clone(), value.clone());
            self.properties_to_modify.insert(name, value);
        }
    }
}

/// A message's state as reported by `x-opt-message-state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Receivable (possibly locked right now).
    Active,
    /// Deferred: only `receive_deferred` by sequence number gets it.
    Deferred,
    /// Scheduled: invisible until its scheduled enqueue time.
    Scheduled,
}

impl MessageState {
    /// The value of the `x-opt-message-state` annotation (0, 1, 2).
    pub fn annotation(self) -> i32 {
        let state = match self {
            MessageState::Active => WireState::Active,
            MessageState::Deferred => WireState::Deferred,
            MessageState::Scheduled => WireState::Scheduled,
        };
        state.code()
    }
}

/// How a receiver takes messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReceiveMode {
    /// Lock the message; it must be settled by lock token before the lock expires.
    PeekLock,
    /// Remove the message on delivery (AMQP `snd-settle-mode=settled`).
    ReceiveAndDelete,
}

/// A delivered or peeked message with its broker state.
#[derive(Debug, Clone)]
pub struct ReceivedMessage {
    /// The message, with overlays merged into its application properties.
    pub message: BrokerMessage,
    /// `x-opt-sequence-number`.
    pub sequence_number: i64,
    /// `x-opt-enqueued-time`.
    pub enqueued_time: SystemTime,
    /// Header `delivery-count`: earlier delivery attempts (0 on the first delivery).
    pub delivery_count: u32,
    /// `x-opt-lock-token`; `None` for peeked and receive-and-delete messages.
    pub lock_token: Option<Uuid>,
    /// `x-opt-locked-until`; `None` when not locked by this delivery.
    pub locked_until: Option<SystemTime>,
    /// `x-opt-message-state`.
    pub state: MessageState,
    /// When the message expires (`None` in dead-letter queues, where TTL does not apply).
    pub expires_at: Option<SystemTime>,
    /// For dead-lettered messages: the entity the message was dead-lettered from.
    pub dead_letter_source: Option<String>,
}

impl ReceivedMessage {
    /// The `DeadLetterReason` application property, if any.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        match self.message.application_properties.get(DEAD_LETTER_REASON) {
            Some(PropertyValue::String(s)) => Some(s),
            _ => None,
        }
    }

    /// The `DeadLetterErrorDescription` application property, if any.
    pub fn dead_letter_description(&self) -> Option<&str> {
        match self
            .message
            .application_properties
            .get(DEAD_LETTER_ERROR_DESCRIPTION)
        {
            Some(PropertyValue::String(s)) => Some(s),
            _ => None,
        }
    }
}

/// Application property carrying the dead-letter reason.
pub const DEAD_LETTER_REASON: &str = sb_amqp::servicebus::dead_letter::REASON;
/// Application property carrying the dead-letter description.
pub const DEAD_LETTER_ERROR_DESCRIPTION: &str = sb_amqp::servicebus::dead_letter::ERROR_DESCRIPTION;
/// Reason used when the delivery count reaches `MaxDeliveryCount`.
pub const MAX_DELIVERY_COUNT_EXCEEDED: &str = "MaxDeliveryCountExceeded";
/// Reason used when a message expires on an entity with `DeadLetteringOnMessageExpiration`.
pub const TTL_EXPIRED: &str = "TTLExpiredException";
