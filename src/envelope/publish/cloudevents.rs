//! CloudEvents 1.0 events for the outbox, structured or binary.
//!
//! Sources:
//! - attributes, their types and naming rules: CloudEvents 1.0 specification
//!   (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/spec.md>): `id`, `source`
//!   (URI-reference), `specversion`, `type` required and non-empty; `datacontenttype`,
//!   `subject`, `time` (RFC 3339) optional; extension names lower-case ASCII letters or digits;
//!   Integer is 32-bit;
//! - structured mode: the JSON event format
//!   (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md>):
//!   media type `application/cloudevents+json`, attributes as top-level members, JSON data in
//!   `data`;
//! - binary mode: the AMQP protocol binding
//!   (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/amqp-protocol-binding.md>,
//!   3.1): `datacontenttype` is the AMQP `content-type`, the data is the body, every other
//!   attribute an application property named `cloudEvents:<attribute>`, each value in its AMQP
//!   type or its canonical string (a timestamp as its RFC 3339 string).

use std::collections::BTreeMap;
use std::time::SystemTime;

use serde::Serialize;

use super::super::{CLOUDEVENTS_JSON, MAX_ENVELOPE_HEADERS};
use super::{PublishError, bounded, bounded_properties, header_value, printable, rfc3339, shown};
use crate::envelope::MAX_MESSAGE_ID_LEN;
use crate::ports::{OutboxMessage, PropertyValue};

/// The prefix written for a binary event's attributes: the binding's own (v1.0.2, 3.1.3.1).
/// Readers accept `cloudEvents_` too (the binding's later drafts, and the CloudEvents Python SDK
/// 2.x writes it), so both are in
/// [`CLOUDEVENTS_PREFIXES`](crate::envelope::CLOUDEVENTS_PREFIXES).
const WRITTEN_PREFIX: &str = "cloudEvents:";

/// The data's content type: the writers take JSON data.
const DATA_CONTENT_TYPE: &str = "application/json";

/// Attribute names the specification defines; an extension may not take one of them.
const CORE_ATTRIBUTES: [&str; 10] = [
    "id",
    "source",
    "specversion",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
    "data",
    "data_base64",
];

/// A CloudEvents 1.0 event for one outgoing message: build it, then [`message`](Self::message)
/// turns JSON data into the [`OutboxMessage`] a handler appends.
///
/// Written attributes: `specversion` `1.0`, `id` (a fresh UUID unless given; also the AMQP
/// message id, so it must fit Service Bus's 128 bytes), `source`, `type`, `time` (RFC 3339
/// UTC), `datacontenttype` `application/json`, `subject` and extensions when given, and the
/// data. [`structured`](Self::structured) (the default) writes them as one JSON document
/// (`application/cloudevents+json`); [`binary`](Self::binary) writes the data as the body and
/// the attributes as `cloudEvents:`-prefixed application properties.
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{CloudEvent, CLOUDEVENTS_JSON};
///
/// let event = CloudEvent::new("payments", "/shop/orders", "shop.order.confirmed.v1")?
///     .with_subject("o-1")?;
/// let message = event.message(&serde_json::json!({ "orderId": "o-1" }))?;
/// assert_eq!(message.content_type.as_deref(), Some(CLOUDEVENTS_JSON));
/// assert_eq!(message.message_id, event.id());
/// let json: serde_json::Value = serde_json::from_slice(&message.body)?;
/// assert_eq!((json["specversion"].as_str(), json["data"]["orderId"].as_str()), (Some("1.0"), Some("o-1")));
///
/// let binary = event.binary().message(&serde_json::json!({ "orderId": "o-1" }))?;
/// assert_eq!(binary.content_type.as_deref(), Some("application/json"));
/// assert_eq!(binary.application_properties["cloudEvents:type"], "shop.order.confirmed.v1".into());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct CloudEvent {
    destination: String,
    id: String,
    source: String,
    event_type: String,
    subject: Option<String>,
    time: SystemTime,
    extensions: BTreeMap<String, PropertyValue>,
    binary: bool,
}

impl CloudEvent {
    /// An event for `destination` (a queue or topic) from `source` (a URI-reference naming the
    /// producer, such as `/shop/orders`) of `event_type` (reverse-DNS style, such as
    /// `com.example.order.confirmed.v1`), with a fresh id, happening now, structured.
    ///
    /// # Errors
    /// [`PublishError::Empty`] or [`PublishError::InvalidValue`] for an empty `source` or
    /// `event_type`, or one with whitespace or control characters.
    pub fn new(
        destination: impl Into<String>,
        source: &str,
        event_type: &str,
    ) -> Result<Self, PublishError> {
        Ok(CloudEvent {
            destination: destination.into(),
            id: uuid::Uuid::new_v4().to_string(),
            source: required("source", source)?,
            event_type: required("type", event_type)?,
            subject: None,
            time: SystemTime::now(),
            extensions: BTreeMap::new(),
            binary: false,
        })
    }

    /// This event's `id` instead of a fresh UUID: any string unique within its `source`, such
    /// as `ctx.idempotency_key("order-confirmed").as_str()`, which a handler that runs again
    /// derives again. It is also the AMQP message id.
    ///
    /// # Errors
    /// [`PublishError::Empty`] for an empty id, [`PublishError::InvalidValue`] for one longer
    /// than 128 bytes (Service Bus's message id limit) or with control characters.
    pub fn with_id(mut self, id: &str) -> Result<Self, PublishError> {
        if id.is_empty() {
            return Err(PublishError::Empty("id"));
        }
        if id.len() > MAX_MESSAGE_ID_LEN || id.chars().any(char::is_control) {
            return Err(PublishError::InvalidValue {
                what: "id",
                value: shown(id),
                why: "at most 128 bytes, no control characters",
            });
        }
        self.id = id.to_owned();
        Ok(self)
    }

    /// The `subject`: what the event is about within its source (an order id).
    ///
    /// # Errors
    /// [`PublishError::Empty`] for an empty subject (the specification: non-empty if present).
    pub fn with_subject(mut self, subject: &str) -> Result<Self, PublishError> {
        if subject.is_empty() {
            return Err(PublishError::Empty("subject"));
        }
        self.subject = Some(subject.to_owned());
        Ok(self)
    }

    /// An extension attribute (`tenant`, `traceparent`, `partitionkey`, …): a string, a 32-bit
    /// integer or a boolean.
    ///
    /// # Errors
    /// [`PublishError::InvalidName`] for a name that is not 1 to 20 lower-case ASCII letters and
    /// digits, or names a core attribute; [`PublishError::InvalidValue`] for a float, an
    /// integer outside 32 bits (the specification's Integer) or a string longer than 4096
    /// bytes; [`PublishError::TooMany`] past 118 extensions.
    pub fn with_extension(
        mut self,
        name: &str,
        value: impl Into<PropertyValue>,
    ) -> Result<Self, PublishError> {
        let why = if name.is_empty() || name.len() > 20 {
            Some("1 to 20 characters")
        } else if !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            Some("lower-case ASCII letters and digits only")
        } else if CORE_ATTRIBUTES.contains(&name) {
            Some("it is a core attribute")
        } else {
            None
        };
        if let Some(why) = why {
            return Err(PublishError::InvalidName {
                what: "extension",
                name: shown(name),
                why,
            });
        }
        let value = value.into();
        match &value {
            PropertyValue::Long(n) if i32::try_from(*n).is_err() => {
                return Err(PublishError::InvalidValue {
                    what: "extension",
                    value: n.to_string(),
                    why: "a CloudEvents Integer is 32-bit",
                });
            }
            PropertyValue::Double(x) => {
                return Err(PublishError::InvalidValue {
                    what: "extension",
                    value: x.to_string(),
                    why: "CloudEvents has no floating point type",
                });
            }
            _ => {}
        }
        header_value("extension", &value)?;
        // Readers count every attribute, the core ones included.
        let max = MAX_ENVELOPE_HEADERS - CORE_ATTRIBUTES.len();
        if self.extensions.len() >= max && !self.extensions.contains_key(name) {
            return Err(PublishError::TooMany {
                what: "extensions",
                max,
            });
        }
        self.extensions.insert(name.to_owned(), value);
        Ok(self)
    }

    /// `time` instead of now.
    #[must_use]
    pub fn at(mut self, time: SystemTime) -> Self {
        self.time = time;
        self
    }

    /// Structured mode (the default): the whole event as one `application/cloudevents+json`
    /// document.
    #[must_use]
    pub fn structured(mut self) -> Self {
        self.binary = false;
        self
    }

    /// Binary mode: the data as the body (`application/json`), the attributes as
    /// `cloudEvents:`-prefixed application properties.
    #[must_use]
    pub fn binary(mut self) -> Self {
        self.binary = true;
        self
    }

    /// The event's `id`, which is also the AMQP message id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The outbox message carrying `data` (serialised as JSON).
    ///
    /// # Errors
    /// [`PublishError::NotJson`] when it does not serialise, [`PublishError::TooLarge`] above
    /// [`MAX_ENVELOPE_LEN`](super::MAX_ENVELOPE_LEN).
    pub fn message(&self, data: &impl Serialize) -> Result<OutboxMessage, PublishError> {
        self.wrap(serde_json::to_value(data).map_err(PublishError::NotJson)?)
    }

    /// The same for data already encoded as JSON bytes.
    ///
    /// # Errors
    /// As [`message`](Self::message); [`PublishError::NotJson`] for bytes that are not JSON.
    pub fn message_json(&self, data: &[u8]) -> Result<OutboxMessage, PublishError> {
        self.wrap(serde_json::from_slice(data).map_err(PublishError::NotJson)?)
    }

    fn wrap(&self, data: serde_json::Value) -> Result<OutboxMessage, PublishError> {
        let time = rfc3339(self.time);
        let mut attributes: Vec<(&str, PropertyValue)> = vec![
            ("specversion", "1.0".into()),
            ("id", self.id.as_str().into()),
            ("source", self.source.as_str().into()),
            ("type", self.event_type.as_str().into()),
            ("time", time.into()),
        ];
        if let Some(subject) = &self.subject {
            attributes.push(("subject", subject.as_str().into()));
        }
        attributes.extend(self.extensions.iter().map(|(k, v)| (k.as_str(), v.clone())));

        let (body, content_type, application_properties) = if self.binary {
            let properties = attributes
                .into_iter()
                .map(|(name, value)| (format!("{WRITTEN_PREFIX}{name}"), value))
                .collect();
            let body = serde_json::to_vec(&data).map_err(PublishError::NotJson)?;
            (body, DATA_CONTENT_TYPE, properties)
        } else {
            let mut event = serde_json::Map::new();
            for (name, value) in attributes {
                event.insert(name.to_owned(), json_of(value));
            }
            event.insert("datacontenttype".into(), DATA_CONTENT_TYPE.into());
            event.insert("data".into(), data);
            let body = serde_json::to_vec(&event).map_err(PublishError::NotJson)?;
            (body, CLOUDEVENTS_JSON, BTreeMap::new())
        };
        let mut message = OutboxMessage::new(self.destination.clone(), "", bounded(body)?)
            .with_message_id(self.id.clone())
            .with_content_type(content_type);
        message.subject = None;
        message.application_properties = bounded_properties(application_properties)?;
        Ok(message)
    }
}

/// A required attribute: non-empty, printable.
fn required(what: &'static str, value: &str) -> Result<String, PublishError> {
    if value.is_empty() {
        return Err(PublishError::Empty(what));
    }
    printable(what, value)?;
    Ok(value.to_owned())
}

/// An attribute value as JSON (the JSON format: String as string, Integer as number, Boolean
/// as boolean). Floats never get here ([`CloudEvent::with_extension`] refuses them).
fn json_of(value: PropertyValue) -> serde_json::Value {
    match value {
        PropertyValue::String(s) => serde_json::Value::from(s),
        PropertyValue::Long(n) => serde_json::Value::from(n),
        PropertyValue::Double(x) => serde_json::Value::from(x),
        PropertyValue::Bool(b) => serde_json::Value::from(b),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;

    fn event() -> CloudEvent {
        CloudEvent::new("payments", "/shop/orders", "shop.order.confirmed.v1")
            .unwrap()
            .with_id("e-1")
            .unwrap()
            .at(UNIX_EPOCH + Duration::from_secs(1_673_560_553))
    }

    #[test]
    fn required_attributes_are_checked() {
        assert!(matches!(
            CloudEvent::new("q", "", "t"),
            Err(PublishError::Empty("source"))
        ));
        assert!(matches!(
            CloudEvent::new("q", "/s", ""),
            Err(PublishError::Empty("type"))
        ));
        assert!(matches!(
            CloudEvent::new("q", "/a b", "t"),
            Err(PublishError::InvalidValue { .. })
        ));
        assert!(matches!(
            event().with_id(""),
            Err(PublishError::Empty("id"))
        ));
        assert!(matches!(
            event().with_id(&"x".repeat(129)),
            Err(PublishError::InvalidValue { .. })
        ));
        assert!(matches!(
            event().with_subject(""),
            Err(PublishError::Empty("subject"))
        ));
        assert!(matches!(
            event().message_json(b"{oops"),
            Err(PublishError::NotJson(_))
        ));
    }

    #[test]
    fn extension_names_and_values_follow_the_specification() {
        assert!(event().with_extension("tenant", "t-1").is_ok());
        assert!(event().with_extension("retries2", 3i64).is_ok());
        for name in [
            "",
            "Tenant",
            "ten-ant",
            "id",
            "data",
            "abcdefghijklmnopqrstu",
        ] {
            assert!(
                matches!(
                    event().with_extension(name, "x"),
                    Err(PublishError::InvalidName { .. })
                ),
                "{name:?}"
            );
        }
        assert!(matches!(
            event().with_extension("big", i64::from(i32::MAX) + 1),
            Err(PublishError::InvalidValue { .. })
        ));
        assert!(matches!(
            event().with_extension("long", "x".repeat(4097)),
            Err(PublishError::InvalidValue { .. })
        ));
        let full = (0..118).fold(event(), |e, i| {
            e.with_extension(&format!("x{i}"), "v").unwrap()
        });
        assert!(matches!(
            full.with_extension("more", "v"),
            Err(PublishError::TooMany { max: 118, .. })
        ));
        assert!(matches!(
            event().with_extension("ratio", PropertyValue::Double(0.5)),
            Err(PublishError::InvalidValue { .. })
        ));
    }

    /// A structured event, member by member, against the JSON event format
    /// (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/formats/json-format.md>,
    /// 2 and 3) and the core specification's attribute rules.
    #[test]
    fn structured_mode_is_the_json_event_format() {
        let message = event()
            .with_subject("o-1")
            .unwrap()
            .with_extension("tenant", "t-1")
            .unwrap()
            .with_extension("attempt", 2i64)
            .unwrap()
            .message(&serde_json::json!({ "orderId": "o-1" }))
            .unwrap();
        // The AMQP binding, 3.2.1: content-type is the event format's media type.
        assert_eq!(message.content_type.as_deref(), Some(CLOUDEVENTS_JSON));
        // The broker id is the event id: a republished row is recognised by both.
        assert_eq!(message.message_id, "e-1");
        assert!(message.application_properties.is_empty());
        let event: serde_json::Value = serde_json::from_slice(&message.body).unwrap();
        assert_eq!(
            event,
            serde_json::json!({
                // REQUIRED, String, "1.0" for this version of the specification.
                "specversion": "1.0",
                // REQUIRED, String, non-empty.
                "id": "e-1",
                // REQUIRED, URI-reference, non-empty.
                "source": "/shop/orders",
                // REQUIRED, String, non-empty.
                "type": "shop.order.confirmed.v1",
                // OPTIONAL, Timestamp: RFC 3339.
                "time": "2023-01-12T21:55:53.000000Z",
                // OPTIONAL, String, non-empty.
                "subject": "o-1",
                // OPTIONAL, RFC 2046 media type of `data`.
                "datacontenttype": "application/json",
                // Extensions are top-level members; Integer as a JSON number (format, 2.2).
                "tenant": "t-1",
                "attempt": 2,
                // JSON data is stored as the JSON value of `data` (format, 3.1), not
                // `data_base64`.
                "data": { "orderId": "o-1" }
            })
        );
    }

    #[test]
    fn the_written_prefix_is_one_readers_accept() {
        assert!(crate::envelope::CLOUDEVENTS_PREFIXES.contains(&WRITTEN_PREFIX));
    }

    #[test]
    fn binary_mode_maps_attributes_to_prefixed_properties() {
        let message = event()
            .with_subject("o-1")
            .unwrap()
            .with_extension("tenant", "t-1")
            .unwrap()
            .binary()
            .message(&serde_json::json!({ "orderId": "o-1" }))
            .unwrap();
        assert_eq!(message.message_id, "e-1");
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        let expected: BTreeMap<String, PropertyValue> = [
            ("cloudEvents:specversion", "1.0"),
            ("cloudEvents:id", "e-1"),
            ("cloudEvents:source", "/shop/orders"),
            ("cloudEvents:type", "shop.order.confirmed.v1"),
            ("cloudEvents:time", "2023-01-12T21:55:53.000000Z"),
            ("cloudEvents:subject", "o-1"),
            ("cloudEvents:tenant", "t-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.into()))
        .collect();
        assert_eq!(message.application_properties, expected);
        assert_eq!(message.body, br#"{"orderId":"o-1"}"#);
    }
}
