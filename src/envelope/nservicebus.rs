//! [`NServiceBus`]: what an NServiceBus endpoint sends over its Azure Service Bus transport.
//!
//! # Wire format
//! The transport maps every NServiceBus header to an application property of the same name and
//! sends the serialized message as the body (docs.particular.net,
//! `transports/azure-service-bus/native-integration`); that page also warns that "the native
//! Azure Service Bus `MessageId` is distinct from the `NServiceBus.MessageId` header" and must
//! not be assumed to match. The headers used (docs.particular.net, `nservicebus/messaging/headers`):
//!
//! - `NServiceBus.EnclosedMessageTypes`: the message's types, assembly-qualified .NET names
//!   separated by `;`, the most specific first (`Shop.Contracts.OrderPlaced, Shop.Contracts,
//!   Version=2.0.0.0, Culture=neutral, PublicKeyToken=null;Shop.Contracts.IOrderEvent, …`). The
//!   contract is the first type whose full name (the part before the first `,`) the consumer's
//!   [`TypeMap`] resolves. An entry without a version (`"Shop.Contracts.OrderPlaced" =
//!   "orders.order-placed"`) takes the major number of that type's assembly `Version=` (1 when
//!   it has none): NServiceBus types version with their assembly, so `Version=2.0.0.0` is v2.
//! - `NServiceBus.MessageId`: the envelope's id (the inbox key), else the broker message id.
//! - `NServiceBus.ContentType`, `NServiceBus.ConversationId`, `NServiceBus.CorrelationId`…:
//!   left in the headers (the application properties) for middleware and handlers.

use std::borrow::Cow;

use super::reader::{EnvelopeReader, Opened};
use super::type_map::TypeMap;
use super::{DeadLetterReason, Rejection};
use crate::ports::{Message, PropertyValue};

/// The header (application property) with the message's .NET types.
pub const ENCLOSED_MESSAGE_TYPES: &str = "NServiceBus.EnclosedMessageTypes";

/// The header (application property) with NServiceBus's message id.
pub const NSERVICEBUS_MESSAGE_ID: &str = "NServiceBus.MessageId";

/// Reads NServiceBus's native Azure Service Bus messages (see the module docs for the fields
/// used).
///
/// # Examples
/// ```
/// use sb_inbox::envelope::{EnvelopeReader, NServiceBus, TypeMap};
/// use sb_inbox::{Contract, Message};
/// let reader = NServiceBus::new(
///     TypeMap::new().with("Shop.Contracts.OrderPlaced", "orders.order-placed")?,
/// );
/// let message = Message::new("broker-id", "", r#"{"OrderId":"o-1"}"#)
///     .with_property(
///         "NServiceBus.EnclosedMessageTypes",
///         "Shop.Contracts.OrderPlaced, Shop.Contracts, Version=2.0.0.0, Culture=neutral, PublicKeyToken=null",
///     )
///     .with_property("NServiceBus.MessageId", "5d6f2a4e-0f1b-4c55-9a8e-b0a3011c2d3e");
/// let opened = reader.open(&message)?;
/// assert_eq!(opened.contract, Contract::new("orders.order-placed", 2));
/// assert_eq!(opened.id.as_deref(), Some("5d6f2a4e-0f1b-4c55-9a8e-b0a3011c2d3e"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NServiceBus {
    types: TypeMap,
}

impl NServiceBus {
    /// A reader resolving the enclosed types' full names through `types`.
    pub fn new(types: TypeMap) -> Self {
        NServiceBus { types }
    }
}

impl EnvelopeReader for NServiceBus {
    fn kind(&self) -> &'static str {
        "nservicebus"
    }

    fn open<'m>(&self, message: &'m Message) -> Result<Opened<'m>, Rejection> {
        let properties = &message.application_properties;
        let types = match properties.get(ENCLOSED_MESSAGE_TYPES) {
            None => {
                return Err(Rejection::new(
                    DeadLetterReason::MissingContract,
                    format!("the message has no {ENCLOSED_MESSAGE_TYPES} header"),
                ));
            }
            Some(PropertyValue::String(types)) => types,
            Some(_) => {
                return Err(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    format!("header {ENCLOSED_MESSAGE_TYPES} is not a string"),
                ));
            }
        };
        let contract = self.types.resolve_first(
            types
                .split(';')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(full_name_and_version),
            ENCLOSED_MESSAGE_TYPES,
        )?;
        let opened = Opened::new(
            contract,
            Cow::Borrowed(&message.body[..]),
            Cow::Borrowed(properties),
        );
        match properties.get(NSERVICEBUS_MESSAGE_ID) {
            None => Ok(opened),
            Some(PropertyValue::String(id)) => Ok(opened.with_id(id.as_str())),
            Some(_) => Err(Rejection::new(
                DeadLetterReason::InvalidMessageId,
                format!("header {NSERVICEBUS_MESSAGE_ID} is not a string"),
            )),
        }
    }

    fn type_map(&self) -> Option<&TypeMap> {
        Some(&self.types)
    }
}

/// `Full.Type.Name, Assembly, Version=2.0.0.0, …` as the full name and the assembly's major
/// version (1 without a readable `Version=`: an unversioned assembly is its first version).
fn full_name_and_version(qualified: &str) -> (&str, Option<u32>) {
    let mut parts = qualified.split(',').map(str::trim);
    let name = parts.next().unwrap_or_default();
    let version = parts
        .find_map(|part| part.strip_prefix("Version="))
        .and_then(|v| v.split('.').next())
        .and_then(|major| major.parse().ok())
        .unwrap_or(1);
    (name, Some(version))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::envelope::Contract;

    /// The headers an NServiceBus 9 endpoint writes for a published event, as the headers
    /// page lists them (docs.particular.net/nservicebus/messaging/headers).
    fn native(types: &str) -> Message {
        Message::new("native-broker-id", "", r#"{"OrderId":"o-1"}"#)
            .with_content_type("application/json")
            .with_property(ENCLOSED_MESSAGE_TYPES, types)
            .with_property(
                NSERVICEBUS_MESSAGE_ID,
                "5d6f2a4e-0f1b-4c55-9a8e-b0a3011c2d3e",
            )
            .with_property("NServiceBus.ContentType", "application/json")
            .with_property("NServiceBus.ConversationId", "c-1")
            .with_property("NServiceBus.MessageIntent", "Publish")
            .with_property("NServiceBus.OriginatingEndpoint", "Shop.Checkout")
    }

    const ORDER_PLACED_V2: &str = "Shop.Contracts.OrderPlaced, Shop.Contracts, Version=2.0.0.0, Culture=neutral, PublicKeyToken=null;Shop.Contracts.IOrderEvent, Shop.Contracts, Version=2.0.0.0, Culture=neutral, PublicKeyToken=null";

    fn reader() -> NServiceBus {
        NServiceBus::new(
            TypeMap::new()
                .with("Shop.Contracts.OrderPlaced", "orders.order-placed")
                .unwrap()
                .with("Shop.Contracts.OrderShipped", "orders.order-shipped.v1")
                .unwrap(),
        )
    }

    #[test]
    fn the_headers_yield_contract_id_body_and_headers() {
        let message = native(ORDER_PLACED_V2);
        let opened = reader().open(&message).unwrap();
        assert_eq!(opened.contract, Contract::new("orders.order-placed", 2));
        assert_eq!(
            opened.id.as_deref(),
            Some("5d6f2a4e-0f1b-4c55-9a8e-b0a3011c2d3e"),
            "NServiceBus.MessageId, not the broker's"
        );
        assert_eq!(&opened.body[..], br#"{"OrderId":"o-1"}"#);
        assert_eq!(
            opened.headers.get("NServiceBus.ConversationId"),
            Some(&"c-1".into())
        );
    }

    #[test]
    fn versions_come_from_the_entry_or_the_assembly() {
        let versioned = native(
            "Shop.Contracts.OrderShipped, Shop.Contracts, Version=5.1.0.0, Culture=neutral, PublicKeyToken=null",
        );
        assert_eq!(
            reader().open(&versioned).unwrap().contract,
            Contract::new("orders.order-shipped", 1),
            "an entry with a version wins over the assembly's"
        );
        let bare = native("Shop.Contracts.OrderPlaced");
        assert_eq!(
            reader().open(&bare).unwrap().contract,
            Contract::new("orders.order-placed", 1)
        );
        let less_specific = TypeMap::new()
            .with("Shop.Contracts.IOrderEvent", "orders.order-event.v4")
            .unwrap();
        assert_eq!(
            NServiceBus::new(less_specific)
                .open(&native(ORDER_PLACED_V2))
                .unwrap()
                .contract,
            Contract::new("orders.order-event", 4)
        );
    }

    #[test]
    fn without_its_id_header_the_broker_id_is_the_envelopes() {
        let mut message = native(ORDER_PLACED_V2);
        message
            .application_properties
            .remove(NSERVICEBUS_MESSAGE_ID);
        assert_eq!(reader().open(&message).unwrap().id, None);
    }

    #[test]
    fn every_malformed_message_is_rejected_with_its_reason() {
        use DeadLetterReason::*;
        let mut no_types = native(ORDER_PLACED_V2);
        no_types
            .application_properties
            .remove(ENCLOSED_MESSAGE_TYPES);
        let long_list = vec!["Shop.X"; 40].join(";");
        let cases = [
            (no_types, MissingContract),
            (native(""), MissingContract),
            (native(" ; ;"), MissingContract),
            (
                native("Shop.Contracts.Unknown, Shop.Contracts, Version=1.0.0.0"),
                UnsupportedContract,
            ),
            (native(&long_list), InvalidPayload),
            (
                native(ORDER_PLACED_V2).with_property(ENCLOSED_MESSAGE_TYPES, 3_i64),
                InvalidPayload,
            ),
            (
                native(ORDER_PLACED_V2)
                    .with_property(NSERVICEBUS_MESSAGE_ID, PropertyValue::Bool(true)),
                InvalidMessageId,
            ),
        ];
        for (message, reason) in cases {
            let rejection = reader().open(&message).unwrap_err();
            assert_eq!(rejection.reason, reason, "{message:?}: {rejection}");
        }
    }
}
