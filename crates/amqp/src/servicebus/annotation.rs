//! Message annotations Service Bus writes on a delivered message (`x-opt-…`).
//!
//! Sources: Python `_common/constants.py` (`_X_OPT_*`, `LOCKTOKENNAME`, `MESSAGE_STATE_NAME`);
//! JS `@azure/core-amqp` `Constants` (`lockedUntil`, `sequenceNumber`, `messageState`, …);
//! .NET `AmqpMessageConverter` / `AmqpMessageConstants`.

/// The lock token of a peek-lock delivery (a UUID); the delivery tag carries the same bytes.
pub const LOCK_TOKEN: &str = "x-opt-lock-token";
/// When the message's lock expires (timestamp).
pub const LOCKED_UNTIL: &str = "x-opt-locked-until";
/// The broker-assigned sequence number (long).
pub const SEQUENCE_NUMBER: &str = "x-opt-sequence-number";
/// When the broker accepted the message (timestamp).
pub const ENQUEUED_TIME: &str = "x-opt-enqueued-time";
/// When a scheduled message becomes visible (timestamp); set by the sender.
pub const SCHEDULED_ENQUEUE_TIME: &str = "x-opt-scheduled-enqueue-time";
/// The partition key (string); set by the sender.
pub const PARTITION_KEY: &str = "x-opt-partition-key";
/// The entity a dead-lettered message came from (string).
pub const DEAD_LETTER_SOURCE: &str = "x-opt-deadletter-source";
/// The message's state ([`MessageState::code`]); absent means active.
pub const MESSAGE_STATE: &str = "x-opt-message-state";

/// The values of [`MESSAGE_STATE`] (.NET `ServiceBusMessageState`, JS `ServiceBusMessageState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MessageState {
    /// Receivable (0).
    Active,
    /// Deferred: receivable only by sequence number (1).
    Deferred,
    /// Scheduled: not yet visible (2).
    Scheduled,
}

impl MessageState {
    /// The annotation's value.
    pub fn code(self) -> i32 {
        match self {
            MessageState::Active => 0,
            MessageState::Deferred => 1,
            MessageState::Scheduled => 2,
        }
    }

    /// The state for an annotation value; `None` for a value Service Bus does not define.
    pub fn from_code(code: i64) -> Option<Self> {
        match code {
            0 => Some(MessageState::Active),
            1 => Some(MessageState::Deferred),
            2 => Some(MessageState::Scheduled),
            _ => None,
        }
    }
}
