//! Envelope writers: outbox messages that .NET consumers read as their own framework's format.
//!
//! The mirror image of the envelope readers. A handler builds the event in the envelope its
//! consumers expect and appends it in its transaction like any other outbox message:
//!
//! - [`MassTransitEnvelope`]: MassTransit's JSON envelope (`application/vnd.masstransit+json`),
//!   what `UseJsonSerializer` (MassTransit's default) reads;
//! - [`CloudEvent`]: a CloudEvents 1.0 event, structured (`application/cloudevents+json`) or
//!   binary (`cloudEvents:` application properties per the AMQP binding).
//!
//! # Ids
//! The envelope's id is fixed when the row is written, and the row's broker message id is
//! derived from it: every relay attempt sends the same bytes under the same id, so broker
//! duplicate detection, MassTransit's own idempotency (its inbox keys on `messageId`) and our
//! inbox (which keys on the envelope's id) all recognise a republished row.
//!
//! # Times
//! `sentTime` / `time` are taken when the handler builds the envelope (the transaction's
//! time), not when the relay sends: the body is final once written. Tests pass their own
//! time with `at`.

mod cloudevents;
mod masstransit;
#[cfg(test)]
mod round_trip;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::ports::PropertyValue;

pub use cloudevents::CloudEvent;
pub use masstransit::MassTransitEnvelope;

/// The largest envelope body written, in bytes: Service Bus's standard tier caps a message at
/// 256 KB (Microsoft Learn, "Azure Service Bus quotas": "Message size for a queue, topic, or
/// subscription entity", 256 KB standard). An envelope above it would be refused by the
/// broker on every relay attempt; it is refused here instead, in the handler, where the error
/// can dead-letter the message that caused it.
pub const MAX_ENVELOPE_LEN: usize = 256 * 1024;

/// The most bytes of application properties written (names and values): Service Bus's
/// "cumulative size of all properties can't exceed 64 KB" (Microsoft Learn, "Azure Service Bus
/// quotas", message property size). The transport adds its own (`traceparent`), so the
/// writers leave 4 KiB of it.
pub const MAX_PROPERTIES_LEN: usize = 60 * 1024;

/// The longest header, attribute or type name written, in bytes.
const MAX_NAME_LEN: usize = 256;

/// An envelope that cannot be written. Permanent: the same input fails the same way on every
/// delivery (map it with [`HandlerError::permanent`](crate::runtime::HandlerError::permanent)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// MassTransit reads `messageId` (and the conversation and correlation ids) as a `Guid`:
    /// any other string fails its deserialiser.
    #[error("{what} {value:?} is not a UUID")]
    NotUuid {
        /// Which id.
        what: &'static str,
        /// The value, cut to 64 bytes.
        value: String,
        /// The parser's error.
        #[source]
        source: uuid::Error,
    },
    /// A MassTransit message type that is not `urn:message:Namespace:TypeName`.
    #[error("message type {0:?} is not a MassTransit message URN (urn:message:Namespace:TypeName)")]
    InvalidMessageType(String),
    /// A payload that does not serialise to JSON, or bytes that are not JSON.
    #[error("the payload is not JSON")]
    NotJson(#[source] serde_json::Error),
    /// A MassTransit payload that is JSON but not an object: MassTransit messages are .NET
    /// records, classes or interfaces (its documentation, "Messages"), read from a JSON object.
    #[error("the payload is JSON but not an object")]
    NotAnObject,
    /// A required attribute that is empty (CloudEvents `source`, `type`, `id`).
    #[error("{0} is empty")]
    Empty(&'static str),
    /// A header, extension or attribute name the format does not allow.
    #[error("{what} name {name:?} is not allowed: {why}")]
    InvalidName {
        /// What the name names.
        what: &'static str,
        /// The name, cut to 64 bytes.
        name: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A value with control characters or longer than 256 bytes where a name or an
    /// address is expected.
    #[error("{what} {value:?} is not valid: {why}")]
    InvalidValue {
        /// What the value is.
        what: &'static str,
        /// The value, cut to 64 bytes.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// More headers or extensions than a reader keeps
    /// ([`MAX_ENVELOPE_HEADERS`](crate::envelope::MAX_ENVELOPE_HEADERS) in all): the rest would
    /// be refused on the way in.
    #[error("more than {max} {what}")]
    TooMany {
        /// What there are too many of.
        what: &'static str,
        /// The most allowed.
        max: usize,
    },
    /// The application properties (headers, binary-mode attributes) take more than
    /// [`MAX_PROPERTIES_LEN`] bytes.
    #[error("the application properties take {len} bytes; the limit is {MAX_PROPERTIES_LEN}")]
    PropertiesTooLarge {
        /// Their size, names and values.
        len: usize,
    },
    /// The envelope is larger than [`MAX_ENVELOPE_LEN`].
    #[error("the envelope is {len} bytes; the limit is {MAX_ENVELOPE_LEN}")]
    TooLarge {
        /// Its length.
        len: usize,
    },
}

/// Cuts an offending value for an error message.
fn shown(value: &str) -> String {
    crate::envelope::truncate(value, 64)
}

/// A JSON object from bytes the caller encoded: not JSON, or JSON but not an object, is refused.
fn json_object(bytes: &[u8]) -> Result<serde_json::Value, PublishError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(PublishError::NotJson)?;
    object(value)
}

/// `value` when it is a JSON object.
fn object(value: serde_json::Value) -> Result<serde_json::Value, PublishError> {
    if value.is_object() {
        Ok(value)
    } else {
        Err(PublishError::NotAnObject)
    }
}

/// A serialisable payload as a JSON object.
fn serialised(payload: &impl serde::Serialize) -> Result<serde_json::Value, PublishError> {
    object(serde_json::to_value(payload).map_err(PublishError::NotJson)?)
}

/// The body, refused above [`MAX_ENVELOPE_LEN`].
fn bounded(body: Vec<u8>) -> Result<Vec<u8>, PublishError> {
    if body.len() > MAX_ENVELOPE_LEN {
        return Err(PublishError::TooLarge { len: body.len() });
    }
    Ok(body)
}

/// A header or extension value a reader keeps whole: strings up to
/// [`MAX_HEADER_VALUE_LEN`](crate::envelope::MAX_HEADER_VALUE_LEN) bytes (readers cut longer
/// ones, and a cut value is a lost one).
fn header_value(what: &'static str, value: &PropertyValue) -> Result<(), PublishError> {
    match value {
        PropertyValue::String(text) if text.len() > super::MAX_HEADER_VALUE_LEN => {
            Err(PublishError::InvalidValue {
                what,
                value: shown(text),
                why: "longer than 4096 bytes",
            })
        }
        _ => Ok(()),
    }
}

/// The properties, refused above [`MAX_PROPERTIES_LEN`] (names and values; numbers 8 bytes).
fn bounded_properties(
    properties: std::collections::BTreeMap<String, PropertyValue>,
) -> Result<std::collections::BTreeMap<String, PropertyValue>, PublishError> {
    let len = properties
        .iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    PropertyValue::String(text) => text.len(),
                    PropertyValue::Bool(_) => 1,
                    _ => 8,
                }
        })
        .sum();
    if len > MAX_PROPERTIES_LEN {
        return Err(PublishError::PropertiesTooLarge { len });
    }
    Ok(properties)
}

/// A value that must be printable and at most [`MAX_NAME_LEN`] bytes.
fn printable(what: &'static str, value: &str) -> Result<(), PublishError> {
    let why = if value.is_empty() {
        "it is empty"
    } else if value.len() > MAX_NAME_LEN {
        "it is longer than 256 bytes"
    } else if value.chars().any(|c| c.is_control() || c.is_whitespace()) {
        "it has whitespace or control characters"
    } else {
        return Ok(());
    };
    Err(PublishError::InvalidValue {
        what,
        value: shown(value),
        why,
    })
}

/// RFC 3339 UTC with microseconds (`2026-12-04T17:03:09.123456Z`): the `sentTime` MassTransit
/// parses as an ISO-8601 `DateTime` and the CloudEvents `time` ("Timestamp": RFC 3339). Times
/// before 1970 are written as the epoch.
pub(crate) fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = since.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_micros()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc_with_microseconds() {
        let cases = [
            (0, 0, "1970-01-01T00:00:00.000000Z"),
            // 2000-02-29, a leap day in a century leap year.
            (951_782_400, 0, "2000-02-29T00:00:00.000000Z"),
            (1_673_560_553, 715_882_000, "2023-01-12T21:55:53.715882Z"),
            (4_102_444_799, 999_999_999, "2099-12-31T23:59:59.999999Z"),
        ];
        for (secs, nanos, expected) in cases {
            let time = UNIX_EPOCH + Duration::new(secs, nanos);
            assert_eq!(rfc3339(time), expected);
        }
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_secs(1)),
            "1970-01-01T00:00:00.000000Z"
        );
    }

    #[test]
    fn payloads_must_be_json_objects_and_bodies_bounded() {
        assert!(matches!(json_object(b"{"), Err(PublishError::NotJson(_))));
        assert!(matches!(
            json_object(b"[1]"),
            Err(PublishError::NotAnObject)
        ));
        assert!(json_object(br#"{"a":1}"#).is_ok());
        assert!(matches!(
            serialised(&"text"),
            Err(PublishError::NotAnObject)
        ));
        assert!(bounded(vec![0; MAX_ENVELOPE_LEN]).is_ok());
        assert!(matches!(
            bounded(vec![0; MAX_ENVELOPE_LEN + 1]),
            Err(PublishError::TooLarge { len }) if len == MAX_ENVELOPE_LEN + 1
        ));
    }

    #[test]
    fn printable_values_are_checked() {
        assert!(printable("x", "sb://a/b").is_ok());
        for bad in ["", "a b", "a\nb", &"x".repeat(MAX_NAME_LEN + 1)] {
            assert!(
                matches!(printable("x", bad), Err(PublishError::InvalidValue { .. })),
                "{bad:?}"
            );
        }
    }
}
