//! [`resubmission`]: the copy of a dead letter to send again, keyed as the original.

use super::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON};
use crate::runtime::{
    LAST_ERROR_PROPERTY, LOGICAL_ID_PROPERTY, RETRY_ATTEMPT_PROPERTY, derived_message_id,
    logical_id,
};
use crate::{Message, PropertyValue};

/// The application property counting how often a message was resubmitted from a dead-letter
/// queue (1 on the first resubmission).
pub const RESUBMISSION_PROPERTY: &str = "sb-inbox-resubmission";

/// The copy of a dead letter to resubmit: a fresh broker id, the logical id kept, the
/// resubmission counted; the dead-letter properties and the delayed-retry count removed, so the
/// copy starts with its retries afresh.
///
/// # Errors
/// The reason a message without a usable logical id cannot be resubmitted (it would only be
/// dead-lettered again).
pub fn resubmission(message: &Message) -> Result<Message, String> {
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
    Ok(copy)
}
