//! [`CloudEvents`]: CloudEvents 1.0 over AMQP, structured and binary.
//!
//! # Wire format
//! The CloudEvents AMQP protocol binding (github.com/cloudevents/spec,
//! `cloudevents/bindings/amqp-protocol-binding.md`) has two modes, told apart by content type:
//!
//! - **Structured** (`application/cloudevents+json`, §3.2): the body is the event in the JSON
//!   event format (`cloudevents/formats/json-format.md`): `specversion`, `id`, `source`, `type`,
//!   optional `datacontenttype`, `dataschema`, `subject`, `time`, extensions, and the payload as
//!   `data` (JSON, handed to the handler as written) or `data_base64` (decoded). The batch format
//!   (`application/cloudevents-batch+json`) is refused: one delivery is one inbox key.
//! - **Binary** (any other content type, §3.1): the attributes are application properties named
//!   with the prefix `cloudEvents_` or `cloudEvents:` (the binding allows both, preferring `_`
//!   for JMS 2.0 clients; the official Python SDK's `cloudevents.core.bindings.amqp.to_binary`
//!   writes `_`); `datacontenttype` is the AMQP content-type; the body is the data.
//!
//! Only `specversion` 1.0 is read. The contract is `type`, through the consumer's [`TypeMap`]
//! (a `type` that is already `name.vN` needs no entry).
//!
//! # Logical id
//! The spec makes `source` + `id` an event's identity ("Producers MUST ensure that source + id is
//! unique for each distinct event", `cloudevents/spec.md`, `id`): the same `id` from two sources
//! is two events. The envelope's id is therefore derived from both: `ce-` and the SHA-256 (hex) of
//! `{len(source)}:{source}{id}` — deterministic, the same in both modes, 67 bytes (within
//! [`MAX_MESSAGE_ID_LEN`](super::MAX_MESSAGE_ID_LEN) whatever the attributes' length), and free
//! of ambiguity between a source ending where an id begins. The attributes themselves stay in
//! the headers (`id`, `source`, `type`, …, without prefix) for logs and handlers.

use std::borrow::Cow;

use base64::Engine as _;

use super::json_body;
use super::masstransit::media_type;
use super::reader::{EnvelopeReader, Headers, MAX_ENVELOPE_HEADERS, Opened, json_property};
use super::type_map::{Quoted, TypeMap, TypeMapError};
use super::{DeadLetterReason, Rejection};
use crate::ports::{Message, PropertyValue};

/// The content type of a structured-mode CloudEvent in JSON.
pub const CLOUDEVENTS_JSON: &str = "application/cloudevents+json";

/// The application-property prefixes of binary-mode attributes.
pub const CLOUDEVENTS_PREFIXES: [&str; 2] = ["cloudEvents_", "cloudEvents:"];

/// Reads CloudEvents 1.0 in structured or binary AMQP mode (see the module docs).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{CloudEvents, EnvelopeReader, TypeMap, cloudevent_id};
/// use sb_inbox::{Contract, Message};
/// let reader = CloudEvents::new(
///     TypeMap::new().with("com.example.shop.order.placed", "orders.order-placed.v1")?,
/// )?;
/// let message = Message::new("broker-id", "", r#"{"orderId":"o-1"}"#)
///     .with_property("cloudEvents_specversion", "1.0")
///     .with_property("cloudEvents_id", "A234-1234-1234")
///     .with_property("cloudEvents_source", "/shop/checkout")
///     .with_property("cloudEvents_type", "com.example.shop.order.placed");
/// let opened = reader.open(&message)?;
/// assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
/// assert_eq!(opened.id.as_deref(), Some(cloudevent_id("/shop/checkout", "A234-1234-1234").as_str()));
/// assert_eq!(&opened.body[..], br#"{"orderId":"o-1"}"#);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEvents {
    types: TypeMap,
}

/// The envelope id of the CloudEvent with `source` and `id` (see the module docs).
pub fn cloudevent_id(source: &str, id: &str) -> String {
    let keyed = format!("{}:{source}{id}", source.len());
    let digest = ring::digest::digest(&ring::digest::SHA256, keyed.as_bytes());
    let hex: String = digest
        .as_ref()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    format!("ce-{hex}")
}

impl CloudEvents {
    /// A reader resolving `type` through `types`.
    ///
    /// # Errors
    /// [`TypeMapError::Unversioned`] for an entry without a version: CloudEvents carry none.
    pub fn new(types: TypeMap) -> Result<Self, TypeMapError> {
        types.require_versions("cloudevents")?;
        Ok(CloudEvents { types })
    }

    fn structured<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        const WHAT: &str = "structured CloudEvent";
        let members = json_body::members(&message.body, WHAT)?;
        let attribute =
            |name: &str| json_body::string(&members, name, WHAT).map(|v| v.unwrap_or_default());
        let (specversion, id, source, kind) = (
            attribute("specversion")?,
            attribute("id")?,
            attribute("source")?,
            attribute("type")?,
        );
        let contract = self.identify(&specversion, &source, &id, &kind)?;
        let data = json_body::member(&members, "data").filter(|raw| raw.get() != "null");
        let data_base64 = json_body::string(&members, "data_base64", WHAT)?;
        let content_type = json_body::string(&members, "datacontenttype", WHAT)?;
        let body: Cow<'m, [u8]> = match (data, data_base64) {
            (Some(_), Some(_)) => {
                return Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    "the CloudEvent has both data and data_base64",
                ));
            }
            (None, Some(encoded)) => base64::engine::general_purpose::STANDARD
                .decode(encoded.as_bytes())
                .map(Cow::Owned)
                .map_err(|_| {
                    Rejection::new(
                        DeadLetterReason::InvalidPayload,
                        "the CloudEvent's data_base64 is not base64",
                    )
                })?,
            // JSON data is handed over as written; a string under a non-JSON content type is
            // the data's text (json-format.md §3.1), so it is unescaped.
            (Some(raw), None) => match content_type.as_deref() {
                Some(ct) if !is_json(ct) && raw.get().starts_with('"') => {
                    let text: String = serde_json::from_str(raw.get())
                        .map_err(|e| json_body::not_json(WHAT, &e))?;
                    Cow::Owned(text.into_bytes())
                }
                _ => Cow::Borrowed(raw.get().as_bytes()),
            },
            (None, None) => Cow::Borrowed(&[][..]),
        };
        let mut headers = Headers::new();
        for (name, raw) in &members {
            if matches!(name.0.as_ref(), "data" | "data_base64") {
                continue;
            }
            let value: serde_json::Value =
                serde_json::from_str(raw.get()).map_err(|e| json_body::not_json(WHAT, &e))?;
            if let Some(value) = json_property(&value) {
                headers.insert(name.0.clone().into_owned(), value);
            }
        }
        Ok(Opened::new(contract, body, Cow::Owned(headers)).with_id(cloudevent_id(&source, &id)))
    }

    fn binary<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        let (attributes, plain) = binary_attributes(message)?;
        let attribute = |name: &str| -> Result<String, Rejection> {
            match attributes.get(name) {
                None => Ok(String::new()),
                Some(PropertyValue::String(value)) => Ok(value.clone()),
                Some(_) => Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!("CloudEvent attribute {name} is not a string"),
                )),
            }
        };
        let (specversion, id, source, kind) = (
            attribute("specversion")?,
            attribute("id")?,
            attribute("source")?,
            attribute("type")?,
        );
        let contract = self.identify(&specversion, &source, &id, &kind)?;
        // The handler's headers: the plain properties under their own names, the attributes
        // over them (a plain `id` never stands for the event's id).
        let mut headers = plain;
        headers.extend(attributes);
        if let Some(content_type) = &message.content_type {
            headers.insert("datacontenttype".to_owned(), content_type.as_str().into());
        }
        Ok(Opened::new(
            contract,
            Cow::Borrowed(&message.body[..]),
            Cow::Owned(headers),
        )
        .with_id(cloudevent_id(&source, &id)))
    }

    /// Checks the required attributes and resolves `type` to a contract.
    fn identify(
        &self,
        specversion: &str,
        source: &str,
        id: &str,
        kind: &str,
    ) -> Result<crate::envelope::Contract, Rejection> {
        if specversion != "1.0" {
            return Err(Rejection::new(
                DeadLetterReason::InvalidPayload,
                format!("CloudEvents specversion {} is not 1.0", Quoted(specversion)),
            ));
        }
        for (name, value) in [("id", id), ("source", source)] {
            if value.is_empty() {
                return Err(Rejection::new(
                    DeadLetterReason::MissingMessageId,
                    format!("the CloudEvent has no {name}; its identity is source + id"),
                ));
            }
        }
        if kind.is_empty() {
            return Err(Rejection::new(
                DeadLetterReason::MissingContract,
                "the CloudEvent has no type",
            ));
        }
        self.types.resolve_first([(kind, None)], "CloudEvent")
    }
}

impl EnvelopeReader for CloudEvents {
    fn kind(&self) -> &'static str {
        "cloudevents"
    }

    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        match message.content_type.as_deref().map(media_type) {
            Some(media) if media.eq_ignore_ascii_case(CLOUDEVENTS_JSON) => self.structured(message),
            Some(media)
                if media
                    .to_ascii_lowercase()
                    .starts_with("application/cloudevents") =>
            {
                Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!(
                        "CloudEvents content type {} is not read (only {CLOUDEVENTS_JSON} and binary mode)",
                        Quoted(media)
                    ),
                ))
            }
            _ => self.binary(message),
        }
    }

    fn type_map(&self) -> Option<&TypeMap> {
        Some(&self.types)
    }
}

/// Whether a `datacontenttype` is JSON (`application/json`, `text/json`, `…+json`).
fn is_json(content_type: &str) -> bool {
    let media = media_type(content_type).to_ascii_lowercase();
    media == "application/json" || media == "text/json" || media.ends_with("+json")
}

/// A binary-mode event's attributes (the `cloudEvents_`/`cloudEvents:` application properties,
/// prefix removed) apart from its plain application properties. Only prefixed properties are
/// attributes: the AMQP binding maps each attribute to a prefixed property, so a plain `id`,
/// `source` or `type` property is the producer's own header and never fills an attribute (it
/// overrode `cloudEvents_id` once, and distinct events shared one logical id). Both prefixes
/// name one attribute: the first seen (`:` sorts before `_`) is kept, as the binding gives
/// neither precedence.
fn binary_attributes(message: &Message) -> Result<(Headers, Headers), Rejection> {
    let mut attributes = Headers::new();
    let mut plain = Headers::new();
    let mut seen = 0;
    for (name, value) in &message.application_properties {
        let attribute = CLOUDEVENTS_PREFIXES
            .iter()
            .find_map(|prefix| name.strip_prefix(prefix));
        let Some(attribute) = attribute else {
            plain.insert(name.clone(), value.clone());
            continue;
        };
        seen += 1;
        if seen > MAX_ENVELOPE_HEADERS {
            return Err(Rejection::new(
                DeadLetterReason::InvalidPayload,
                format!("the CloudEvent has more than {MAX_ENVELOPE_HEADERS} attributes"),
            ));
        }
        attributes
            .entry(attribute.to_owned())
            .or_insert_with(|| value.clone());
    }
    if seen == 0 {
        return Err(Rejection::new(
            DeadLetterReason::MissingContract,
            "the message is neither a structured CloudEvent (application/cloudevents+json) nor a binary one (no cloudEvents_ application properties)",
        ));
    }
    Ok((attributes, plain))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::envelope::Contract;

    /// The JSON format's own example (cloudevents/formats/json-format.md §3), with the reference
    /// order as its data.
    const STRUCTURED: &str = r#"{
        "specversion" : "1.0",
        "type" : "com.example.shop.order.placed",
        "source" : "/shop/checkout",
        "subject" : "o-1",
        "id" : "A234-1234-1234",
        "time" : "2018-04-05T17:31:00Z",
        "comexampleextension1" : "value",
        "comexampleothervalue" : 5,
        "datacontenttype" : "application/json",
        "data" : {"orderId": "o-1"}
    }"#;

    fn reader() -> CloudEvents {
        CloudEvents::new(
            TypeMap::new()
                .with("com.example.shop.order.placed", "orders.order-placed.v1")
                .unwrap(),
        )
        .unwrap()
    }

    fn structured(body: &str) -> Message {
        Message::new("broker-1", "", body.to_owned())
            .with_content_type("application/cloudevents+json; charset=utf-8")
    }

    fn binary(prefix: &str) -> Message {
        Message::new("broker-2", "", r#"{"orderId": "o-1"}"#)
            .with_content_type("application/json")
            .with_property(format!("{prefix}specversion"), "1.0")
            .with_property(format!("{prefix}type"), "com.example.shop.order.placed")
            .with_property(format!("{prefix}source"), "/shop/checkout")
            .with_property(format!("{prefix}id"), "A234-1234-1234")
            .with_property(format!("{prefix}time"), 1_522_949_460_000_i64)
            .with_property("tenant", "t-1")
    }

    #[test]
    fn structured_mode_yields_each_field() {
        let message = structured(STRUCTURED);
        let opened = reader().open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
        assert_eq!(
            opened.id.as_deref(),
            Some(cloudevent_id("/shop/checkout", "A234-1234-1234").as_str())
        );
        assert!(matches!(opened.body, Cow::Borrowed(_)));
        assert_eq!(&opened.body[..], br#"{"orderId": "o-1"}"#);
        let header = |name: &str| opened.headers.get(name).cloned();
        assert_eq!(header("subject"), Some("o-1".into()));
        assert_eq!(header("comexampleothervalue"), Some(PropertyValue::Long(5)));
        assert_eq!(header("data"), None);
    }

    #[test]
    fn binary_mode_with_either_prefix_is_the_same_event() {
        let structured_id = reader()
            .open(&structured(STRUCTURED))
            .unwrap()
            .id
            .unwrap()
            .into_owned();
        for prefix in CLOUDEVENTS_PREFIXES {
            let message = binary(prefix);
            let opened = reader().open(&message).unwrap();
            assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
            assert_eq!(
                opened.id.as_deref(),
                Some(structured_id.as_str()),
                "{prefix}"
            );
            assert_eq!(&opened.body[..], br#"{"orderId": "o-1"}"#);
            assert_eq!(
                opened.headers.get("time"),
                Some(&PropertyValue::Long(1_522_949_460_000))
            );
            assert_eq!(opened.headers.get("tenant"), Some(&"t-1".into()));
            assert_eq!(
                opened.headers.get("datacontenttype"),
                Some(&"application/json".into())
            );
        }
    }

    /// Issue 40, M4: plain properties named like attributes (`id`, `source`, `type`,
    /// `specversion`) never fill an attribute. Two distinct events that both carry a plain
    /// `id` (an order id) keep their own ids; one with a plain `type` keeps its contract; and
    /// without a prefixed `id` a plain one does not stand in for it.
    #[test]
    fn binary_mode_plain_properties_never_fill_an_attribute() {
        for prefix in CLOUDEVENTS_PREFIXES {
            let event = |id: &str| {
                binary(prefix)
                    .with_property(format!("{prefix}id"), id)
                    .with_property("id", "o-1")
                    .with_property("source", "/elsewhere")
                    .with_property("type", "com.example.other")
                    .with_property("specversion", "0.3")
            };
            let (first, second) = (event("e-1"), event("e-2"));
            let opened = reader().open(&first).unwrap();
            assert_eq!(
                opened.id.as_deref(),
                Some(cloudevent_id("/shop/checkout", "e-1").as_str()),
                "{prefix}"
            );
            assert_eq!(opened.contract, Contract::new("orders.order-placed", 1));
            assert_eq!(
                opened.headers.get("id"),
                Some(&"e-1".into()),
                "attributes win"
            );
            let other = reader().open(&second).unwrap();
            assert_ne!(opened.id, other.id, "{prefix}: distinct events");

            let mut no_id = binary(prefix).with_property("id", "o-1");
            no_id.application_properties.remove(&format!("{prefix}id"));
            assert!(reader().open(&no_id).is_err(), "{prefix}: no attribute id");
        }
    }

    #[test]
    fn identity_is_source_and_id_bounded_and_unambiguous() {
        assert_ne!(cloudevent_id("/a", "1"), cloudevent_id("/b", "1"));
        assert_ne!(cloudevent_id("/a", "b1"), cloudevent_id("/ab", "1"));
        assert_eq!(cloudevent_id("/a", "1"), cloudevent_id("/a", "1"));
        let long = cloudevent_id(&"s".repeat(4096), &"i".repeat(4096));
        assert_eq!(long.len(), 67);
        assert!(long.len() <= super::super::MAX_MESSAGE_ID_LEN);
    }

    #[test]
    fn data_base64_and_text_data_are_decoded() {
        let encoded = STRUCTURED.replace(
            r#""data" : {"orderId": "o-1"}"#,
            r#""data_base64" : "eyJvcmRlcklkIjoibzEifQ==""#,
        );
        assert_eq!(
            &reader().open(&structured(&encoded)).unwrap().body[..],
            br#"{"orderId":"o1"}"#
        );
        let text = STRUCTURED
            .replace(r#""application/json""#, r#""text/plain""#)
            .replace(r#"{"orderId": "o-1"}"#, r#""a \"quoted\" line""#);
        assert_eq!(
            &reader().open(&structured(&text)).unwrap().body[..],
            br#"a "quoted" line"#
        );
        let no_data = STRUCTURED.replace(r#""data" : {"orderId": "o-1"}"#, r#""data": null"#);
        assert!(
            reader()
                .open(&structured(&no_data))
                .unwrap()
                .body
                .is_empty()
        );
    }

    #[test]
    fn every_malformed_event_is_rejected_with_its_reason() {
        use DeadLetterReason::*;
        let secret = "s3cr3t";
        let swap = |from: &str, to: &str| structured(&STRUCTURED.replace(from, to));
        let mut no_attributes = binary("cloudEvents_");
        no_attributes
            .application_properties
            .retain(|k, _| !k.starts_with("cloudEvents"));
        let cases = [
            (structured(&format!("{{{secret}")), InvalidPayload),
            (swap(r#""1.0""#, r#""0.3""#), InvalidPayload),
            (swap(r#""id" : "A234-1234-1234","#, ""), MissingMessageId),
            (
                swap(r#""source" : "/shop/checkout","#, ""),
                MissingMessageId,
            ),
            (
                swap(r#""type" : "com.example.shop.order.placed","#, ""),
                MissingContract,
            ),
            (
                swap("com.example.shop.order.placed", "com.example.other"),
                UnsupportedContract,
            ),
            (
                swap(r#""A234-1234-1234""#, &format!(r#"{{"x":"{secret}"}}"#)),
                InvalidPayload,
            ),
            (
                swap(r#""data" : {"#, r#""data_base64": "AA==", "data" : {"#),
                InvalidPayload,
            ),
            (
                swap(
                    r#""data" : {"orderId": "o-1"}"#,
                    &format!(r#""data_base64": "{secret}!""#),
                ),
                InvalidPayload,
            ),
            (
                Message::new("b", "", "[]").with_content_type("application/cloudevents-batch+json"),
                InvalidPayload,
            ),
            (no_attributes, MissingContract),
            (
                binary("cloudEvents_").with_property("cloudEvents_id", 7_i64),
                InvalidPayload,
            ),
        ];
        for (message, reason) in cases {
            let rejection = reader().open(&message).unwrap_err();
            assert_eq!(rejection.reason, reason, "{message:?}: {rejection}");
            assert!(!rejection.description.contains(secret), "{rejection}");
        }
    }
}
