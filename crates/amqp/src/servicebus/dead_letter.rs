//! The names that carry a dead-letter reason and description.
//!
//! On a settlement over the receive link they are fields of the `rejected` outcome's error
//! info; on a dead-lettered message Service Bus writes them as application properties. On
//! `$management` (`update-disposition`) the keys differ: see
//! [`management::key::DEAD_LETTER_REASON`](super::management::key::DEAD_LETTER_REASON).
//!
//! Sources: Python `_common/constants.py` (`RECEIVER_LINK_DEAD_LETTER_REASON`,
//! `PROPERTIES_DEAD_LETTER_REASON`); .NET `AmqpMessageConstants.DeadLetterReasonHeader`.

/// The dead-letter reason.
pub const REASON: &str = "DeadLetterReason";
/// The dead-letter description.
pub const ERROR_DESCRIPTION: &str = "DeadLetterErrorDescription";
