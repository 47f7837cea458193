//! Messages read with `com.microsoft:peek-message`: their state, no lock.

use crate::ServiceBusReceivedMessage;

use sb_amqp::servicebus::dead_letter;

/// The application property Service Bus writes the dead-letter reason to.
pub const DEAD_LETTER_REASON: &str = dead_letter::REASON;
/// The application property Service Bus writes the dead-letter description to.
pub const DEAD_LETTER_ERROR_DESCRIPTION: &str = dead_letter::ERROR_DESCRIPTION;

/// A peeked message: the message as sent (plus broker-written properties) and its broker state.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct PeekedMessage {
    /// The message (no lock: its lock token and expiry are `None`).
    pub message: ServiceBusReceivedMessage,
    /// The broker's sequence number.
    pub sequence_number: i64,
    /// Deliveries so far.
    pub delivery_count: u32,
}

impl PeekedMessage {
    /// `DeadLetterReason`, for a dead-lettered message.
    pub fn dead_letter_reason(&self) -> Option<&str> {
        self.message.dead_letter_reason()
    }

    /// `DeadLetterErrorDescription`, for a dead-lettered message.
    pub fn dead_letter_description(&self) -> Option<&str> {
        self.message.dead_letter_description()
    }
}
