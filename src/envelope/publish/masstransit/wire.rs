//! The envelope's shape: MassTransit's `JsonMessageEnvelope` and `HostInfo` as its JSON
//! serializer reads them, filled from a [`MassTransitEnvelope`].

use std::collections::BTreeMap;

use serde::Serialize;
use uuid::Uuid;

use super::MassTransitEnvelope;
use crate::envelope::publish::{PublishError, rfc3339};
use crate::ports::PropertyValue;

/// The envelope's JSON bytes around `message` (not yet checked against the size limit).
pub(super) fn body(
    from: &MassTransitEnvelope,
    message: serde_json::Value,
) -> Result<Vec<u8>, PublishError> {
    let hyphenated = |id: Uuid| id.hyphenated().to_string();
    let envelope = Envelope {
        message_id: hyphenated(from.message_id),
        correlation_id: from.correlation_id.map(hyphenated),
        // A first message starts its own conversation (MassTransit's table: "Set: Y").
        conversation_id: hyphenated(from.conversation_id.unwrap_or(from.message_id)),
        initiator_id: from.initiator_id.map(hyphenated),
        source_address: from.source_address.as_deref(),
        destination_address: from.destination_address.as_deref(),
        message_type: &from.message_types,
        message,
        sent_time: rfc3339(from.sent_time),
        headers: from
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), json_of(value)))
            .collect(),
        host: Host::current(),
    };
    serde_json::to_vec(&envelope).map_err(PublishError::NotJson)
}

/// The envelope as MassTransit's `JsonMessageEnvelope` names its fields (camelCase), in the
/// documentation's order. Fields without a value are left out: MassTransit's deserializer
/// (`SystemTextJsonMessageSerializer`, case-insensitive property names) reads a missing field
/// as it reads the documentation example's `null`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a> {
    message_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    correlation_id: Option<String>,
    conversation_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    initiator_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    source_address: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    destination_address: Option<&'a str>,
    message_type: &'a [String],
    message: serde_json::Value,
    sent_time: String,
    headers: BTreeMap<&'a str, serde_json::Value>,
    host: Host,
}

/// MassTransit's `HostInfo`, filled with what this process can say about itself truthfully:
/// no `massTransitVersion` (it is not MassTransit) and no machine name (not needed to
/// deserialize, and not ours to publish to every consumer).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Host {
    #[serde(skip_serializing_if = "Option::is_none")]
    process_name: Option<String>,
    process_id: u32,
    assembly: &'static str,
    assembly_version: &'static str,
    framework_version: &'static str,
    operating_system_version: &'static str,
}

impl Host {
    fn current() -> Self {
        Host {
            process_name: std::env::current_exe()
                .ok()
                .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned())),
            process_id: std::process::id(),
            assembly: env!("CARGO_PKG_NAME"),
            assembly_version: env!("CARGO_PKG_VERSION"),
            framework_version: "rust",
            operating_system_version: std::env::consts::OS,
        }
    }
}

/// A header value as JSON.
fn json_of(value: &PropertyValue) -> serde_json::Value {
    match value {
        PropertyValue::String(s) => serde_json::Value::from(s.as_str()),
        PropertyValue::Long(n) => serde_json::Value::from(*n),
        PropertyValue::Double(x) => serde_json::Value::from(*x),
        PropertyValue::Bool(b) => serde_json::Value::from(*b),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::super::tests::{OrderConfirmed, TYPE, json};
    use super::*;
    use crate::ports::Message;
    use crate::testing::ContextBuilder;

    /// MassTransit's documented envelope: the example in "Message Serialization" → "Message
    /// Envelope" (<https://masstransit.io/documentation/configuration/serialization>), verbatim.
    const DOCUMENTED_EXAMPLE: &str = r#"{
        "messageId": "181c0000-6393-3630-36a4-08daf4e7c6da",
        "requestId": "ef375b18-69ee-4a9e-b5ec-44ee1177a27e",
        "correlationId": null,
        "conversationId": null,
        "initiatorId": null,
        "sourceAddress": "rabbitmq://localhost/source",
        "destinationAddress": "rabbitmq://localhost/destination",
        "responseAddress": "rabbitmq://localhost/response",
        "faultAddress": "rabbitmq://localhost/fault",
        "messageType": [
            "urn:message:Company.Project:SubmitOrder"
        ],
        "message": {
            "orderId": "181c0000-6393-3630-36a4-08daf4e7c6da",
            "timestamp": "2023-01-12T21:55:53.714Z"
        },
        "expirationTime": null,
        "sentTime": "2023-01-12T21:55:53.715882Z",
        "headers": {
            "Application-Header": "SomeValue"
        },
        "host": {
            "machineName": "MyComputer",
            "processName": "dotnet",
            "processId": 427,
            "assembly": "TestProject",
            "assemblyVersion": "2.11.1.93",
            "frameworkVersion": "6.0.7",
            "massTransitVersion": "8.0.10.0",
            "operatingSystemVersion": "Unix 12.6.2"
        }
    }"#;

    /// True for a UUID in the hyphenated form the documentation's example shows.
    fn hyphenated_uuid(value: &serde_json::Value) -> bool {
        value
            .as_str()
            .is_some_and(|s| s.len() == 36 && Uuid::parse_str(s).is_ok())
    }

    /// The envelope, field by field, against MassTransit's documentation (the example above and
    /// its table: type, "Notes", "Set").
    #[test]
    fn the_envelope_matches_masstransits_documented_format() {
        let documented: serde_json::Value = serde_json::from_str(DOCUMENTED_EXAMPLE).unwrap();
        let consumed = Message::new(
            "3b241101-e2bb-4255-8caf-4136c566a962",
            "orders.order-placed.v1",
            "{}",
        )
        .with_correlation_id("7c9e6679-7425-40de-944b-e07fc1f90ae7");
        let builder = ContextBuilder::new("shop.confirmations", consumed).unwrap();
        let message = MassTransitEnvelope::new("confirmations", TYPE)
            .unwrap()
            .with_message_id("181c0000-6393-3630-36a4-08daf4e7c6da")
            .unwrap()
            .caused_by(&builder.build(()))
            .with_source_and_destination_addresses("shop.servicebus.windows.net", "orders")
            .unwrap()
            .with_header("Application-Header", "SomeValue")
            .unwrap()
            .at(UNIX_EPOCH + Duration::new(1_673_560_553, 715_882_000))
            .message(&OrderConfirmed {
                order_id: "o-1".into(),
            })
            .unwrap();
        let written = json(&message);

        // Every member written is one the documented envelope has, with the documented JSON
        // type where the example shows a value (its ids are null or strings: Guid).
        let members = written.as_object().unwrap();
        for (name, value) in members {
            let example = documented
                .get(name)
                .unwrap_or_else(|| panic!("{name} is not a documented envelope member"));
            if !example.is_null() {
                assert_eq!(
                    std::mem::discriminant(value),
                    std::mem::discriminant(example),
                    "{name}: {value} is not of the documented type of {example}"
                );
            }
        }
        // messageId: Guid, "Recommended", set by MassTransit.
        assert_eq!(written["messageId"], "181c0000-6393-3630-36a4-08daf4e7c6da");
        // messageType: Urn[], "Required": urn:message:Namespace:TypeName.
        assert_eq!(written["messageType"], serde_json::json!([TYPE]));
        // message: the payload object, camelCase as MassTransit's serializer writes it.
        assert_eq!(written["message"], serde_json::json!({ "orderId": "o-1" }));
        // conversationId: Guid, optional, set by MassTransit: the consumed message starts it.
        assert_eq!(
            written["conversationId"],
            "3b241101-e2bb-4255-8caf-4136c566a962"
        );
        // initiatorId: Guid, optional: the message that caused this one.
        assert_eq!(
            written["initiatorId"],
            "3b241101-e2bb-4255-8caf-4136c566a962"
        );
        // correlationId: Guid, optional: carried over from the consumed message.
        assert_eq!(
            written["correlationId"],
            "7c9e6679-7425-40de-944b-e07fc1f90ae7"
        );
        for id in [
            "messageId",
            "conversationId",
            "initiatorId",
            "correlationId",
        ] {
            assert!(hyphenated_uuid(&written[id]), "{id}");
        }
        // sourceAddress / destinationAddress: Uri, optional; Azure Service Bus addresses.
        assert_eq!(
            written["sourceAddress"],
            "sb://shop.servicebus.windows.net/orders"
        );
        assert_eq!(
            written["destinationAddress"],
            "sb://shop.servicebus.windows.net/confirmations"
        );
        // sentTime: ISO-8601, optional, set by MassTransit: the example's own instant and form.
        assert_eq!(written["sentTime"], documented["sentTime"]);
        // headers: a name → value object.
        assert_eq!(written["headers"], documented["headers"]);
        // host: only the documented HostInfo members, with their types.
        for (name, value) in written["host"].as_object().unwrap() {
            let example = &documented["host"][name];
            assert!(!example.is_null(), "host.{name} is not documented");
            assert_eq!(
                std::mem::discriminant(value),
                std::mem::discriminant(example),
                "host.{name}"
            );
        }
        // requestId, responseAddress, faultAddress ("R": requests only) and expirationTime
        // ("S": with a time to live) do not apply to a published event: not written.
        for situational in [
            "requestId",
            "responseAddress",
            "faultAddress",
            "expirationTime",
        ] {
            assert!(members.get(situational).is_none(), "{situational}");
        }
    }
}
