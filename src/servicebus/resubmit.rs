//! [`resubmission`]: the copy of a dead letter to send again, keyed as the original.

use super::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON};
use crate::ports::{Message, PropertyValue};
use crate::runtime::{
    LAST_ERROR_PROPERTY, LOGICAL_ID_PROPERTY, ORIGINAL_ENQUEUED_TIME_PROPERTY,
    RETRY_ATTEMPT_PROPERTY, derived_message_id, logical_id, original_enqueued_time,
};

pub use crate::runtime::RESUBMISSION_PROPERTY;

/// The copy of a dead letter to resubmit: a fresh broker id, the logical id kept, the
/// resubmission counted; the dead-letter properties and the delayed-retry count removed, so the
/// copy starts with its retries afresh.
///
/// # Errors
/// The reason a message without a usable logical id cannot be resubmitted (it would only be
/// dead-lettered again).
pub fn resubmission(message: &Message) -> Result<Message, String> {
    resubmission_of(message, None)
}

/// [`resubmission`] of a dead letter the broker enqueued at `enqueued`: the copy also carries
/// when the message was first enqueued ([`ORIGINAL_ENQUEUED_TIME_PROPERTY`]: the one it carries,
/// else `enqueued`), so a copy dead-lettered again, or retried, counts its resubmission window
/// and replay horizon from the original and not from its own enqueue. Without it, chained
/// resubmissions could outlive the inbox retention.
///
/// # Errors
/// As [`resubmission`].
pub fn resubmission_of(
    message: &Message,
    enqueued: Option<std::time::SystemTime>,
) -> Result<Message, String> {
    let logical = logical_id(message)
        .map_err(|rejection| rejection.description)?
        .to_owned();
    let count = match message.application_properties.get(RESUBMISSION_PROPERTY) {
        Some(PropertyValue::Long(n)) => n.saturating_add(1).max(1),
        _ => 1,
    };
    let mut copy = message.clone();
    copy.message_id = Some(derived_message_id(&logical, &format!("resubmit-{count}")));
    let properties = &mut copy.application_properties;
    for stale in [
        DEAD_LETTER_REASON,
        DEAD_LETTER_ERROR_DESCRIPTION,
        RETRY_ATTEMPT_PROPERTY,
        LAST_ERROR_PROPERTY,
    ] {
        properties.remove(stale);
    }
    properties.insert(LOGICAL_ID_PROPERTY.to_owned(), logical.into());
    properties.insert(RESUBMISSION_PROPERTY.to_owned(), PropertyValue::Long(count));
    let first = original_enqueued_time(message).or(enqueued);
    if let Some(ms) = first
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|since| i64::try_from(since.as_millis()).ok())
    {
        properties.insert(
            ORIGINAL_ENQUEUED_TIME_PROPERTY.to_owned(),
            PropertyValue::Long(ms),
        );
    }
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ports::TYPED_MESSAGE_ID_PREFIX;

    /// Issue 40, minor 5: a resubmitted original carries the dead letter's enqueued time as its
    /// first enqueue, and a copy of a copy keeps the first one.
    #[test]
    fn a_resubmission_carries_the_first_enqueue_time() {
        use std::time::{Duration, UNIX_EPOCH};
        let enqueued = UNIX_EPOCH + Duration::from_millis(1_800_000_000_000);
        let original = Message::new("m-1", "orders.order-placed.v1", "{}");
        let copy = resubmission_of(&original, Some(enqueued)).unwrap();
        assert_eq!(original_enqueued_time(&copy), Some(enqueued));
        let later = enqueued + Duration::from_secs(3600);
        let again = resubmission_of(&copy, Some(later)).unwrap();
        assert_eq!(original_enqueued_time(&again), Some(enqueued));
    }

    /// A delayed-retry copy and a resubmitted dead letter of a message whose id is of another
    /// AMQP type (the client reads it as `amqp:ulong:42` etc.) are sent with a string id: it
    /// must not carry the typed prefix (the client dead-letters those as `InvalidMessageId`,
    /// and the original is completed already), and the logical id they carry is the typed
    /// text, so the inbox still sees one message.
    #[test]
    fn copies_of_typed_ids_carry_no_typed_prefix_and_keep_the_typed_key() {
        for key in [
            "amqp:ulong:42",
            "amqp:uuid:00112233-4455-6677-8899-aabbccddeeff",
            "amqp:binary:3432",
        ] {
            let original = Message::new(key, "orders.order-placed.v1", "{}");
            let first = crate::runtime::retry_copy(&original, key, 1, "e", None);
            let second = crate::runtime::retry_copy(&first, key, 2, "e", None);
            let resubmitted = resubmission(&original).unwrap();
            for copy in [first, second, resubmitted] {
                let id = copy.message_id.as_deref().unwrap();
                assert!(!id.starts_with(TYPED_MESSAGE_ID_PREFIX), "{key}: {id}");
                assert_eq!(logical_id(&copy).unwrap(), key);
            }
        }
    }
}
