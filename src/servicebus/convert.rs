//! The client's messages and errors as the ports' ([`Message`], [`SettleError`],
//! [`ReceiveError`]), and back for sending.

use sb_servicebus as client;

use crate::ports::{Cause, Message, PropertyValue, ReceiveError, SettleError, Source};

/// The client's property value as the port's; `None` for a kind the port does not carry.
pub(super) fn property_from_client(value: &client::PropertyValue) -> Option<PropertyValue> {
    Some(match value {
        client::PropertyValue::String(s) => PropertyValue::String(s.clone()),
        client::PropertyValue::Long(n) => PropertyValue::Long(*n),
        client::PropertyValue::Double(f) => PropertyValue::Double(*f),
        client::PropertyValue::Bool(b) => PropertyValue::Bool(*b),
        // A kind a later client reads: the runtime's messages never had it.
        _ => return None,
    })
}

/// The port's property value as the client's.
pub(super) fn property_to_client(value: &PropertyValue) -> client::PropertyValue {
    match value {
        PropertyValue::String(s) => client::PropertyValue::String(s.clone()),
        PropertyValue::Long(n) => client::PropertyValue::Long(*n),
        PropertyValue::Double(f) => client::PropertyValue::Double(*f),
        PropertyValue::Bool(b) => client::PropertyValue::Bool(*b),
    }
}

impl From<&client::ServiceBusReceivedMessage> for Message {
    /// What the producer set; the broker's state stays with the delivery.
    fn from(received: &client::ServiceBusReceivedMessage) -> Self {
        Message {
            message_id: received.message_id.clone(),
            correlation_id: received.correlation_id.clone(),
            subject: received.subject.clone(),
            content_type: received.content_type.clone(),
            session_id: received.session_id.clone(),
            application_properties: received
                .application_properties
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), property_from_client(v)?)))
                .collect(),
            body: received.body.clone(),
            partition_key: received.partition_key.clone(),
            time_to_live: received.time_to_live,
            to: received.to.clone(),
            reply_to: received.reply_to.clone(),
        }
    }
}

impl From<Message> for client::ServiceBusMessage {
    fn from(message: Message) -> Self {
        let mut sent = client::ServiceBusMessage::new(message.body);
        sent.message_id = message.message_id;
        sent.correlation_id = message.correlation_id;
        sent.subject = message.subject;
        sent.content_type = message.content_type;
        sent.session_id = message.session_id;
        sent.partition_key = message.partition_key;
        sent.time_to_live = message.time_to_live;
        sent.to = message.to;
        sent.reply_to = message.reply_to;
        sent.application_properties = message
            .application_properties
            .iter()
            .map(|(k, v)| (k.clone(), property_to_client(v)))
            .collect();
        sent
    }
}

/// The client's settlement error as the port's: lock lost, transient (the client's error kept
/// as the cause), or refused with the broker's condition.
pub(super) fn settle_error(error: client::SettlementError) -> SettleError {
    match error {
        client::SettlementError::LockLost => SettleError::LockLost,
        client::SettlementError::Permanent {
            condition,
            description,
        } => SettleError::Permanent {
            condition,
            description,
        },
        client::SettlementError::Transient(cause) => SettleError::Transient(Cause::new(cause)),
        // A kind a later client adds: its outcome is unknown, which is what transient says.
        other => SettleError::Transient(Cause::new(other)),
    }
}

/// The client's receive error as the port's, the client's error kept as the cause.
pub(super) fn receive_error(error: client::ReceiveError) -> ReceiveError {
    match error {
        client::ReceiveError::Permanent(cause) => ReceiveError::Permanent(Cause::new(cause)),
        client::ReceiveError::Transient(cause) => ReceiveError::Transient(Cause::new(cause)),
        other => ReceiveError::Transient(Cause::new(other)),
    }
}

/// An entity's telemetry names as the port's [`Source`].
pub(super) fn source(names: &client::EntityNames) -> Source {
    let mut source = Source::new(client::names::SYSTEM, names.destination.clone());
    source.subscription = names.subscription.clone();
    source.server_address = Some(names.server_address.clone());
    source
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_through_the_clients_types() {
        let message = Message::new("m-1", "orders.order-placed.v1", r#"{"a":1}"#)
            .with_correlation_id("c-1")
            .with_session_id("s-1")
            .with_property("tenant", "t")
            .with_property("n", PropertyValue::Long(7))
            .with_property("f", PropertyValue::Double(0.5))
            .with_property("b", PropertyValue::Bool(true));
        let sent = client::ServiceBusMessage::from(message.clone());
        assert_eq!(sent.message_id.as_deref(), Some("m-1"));
        assert_eq!(sent.session_id.as_deref(), Some("s-1"));
        let mut received = client::ServiceBusReceivedMessage::default();
        received.message_id = sent.message_id.clone();
        received.correlation_id = sent.correlation_id.clone();
        received.subject = sent.subject.clone();
        received.content_type = sent.content_type.clone();
        received.session_id = sent.session_id.clone();
        received.application_properties = sent.application_properties.clone();
        received.body = sent.body.clone();
        received.sequence_number = Some(42);
        assert_eq!(Message::from(&received), message);
    }

    /// Issue 40, minor 14: a received message's TTL, partition key, `to` and `reply-to` reach
    /// the port's message, so a delayed-retry copy (a clone of it) is sent with them (before, a
    /// short-TTL command's retry copy lived for the entity's default TTL).
    #[test]
    fn a_retry_copy_keeps_ttl_partition_key_to_and_reply_to() {
        let mut received = client::ServiceBusReceivedMessage::default();
        received.message_id = Some("m-1".into());
        received.session_id = Some("s-1".into());
        received.partition_key = Some("s-1".into());
        received.time_to_live = Some(std::time::Duration::from_secs(30));
        received.to = Some("audit".into());
        received.reply_to = Some("replies".into());
        let message = Message::from(&received);
        let copy = crate::runtime::retry_copy(&message, "m-1", 1, "e", None);
        let sent = client::ServiceBusMessage::from(copy);
        assert_eq!(sent.partition_key.as_deref(), Some("s-1"));
        assert_eq!(sent.time_to_live, Some(std::time::Duration::from_secs(30)));
        assert_eq!(sent.to.as_deref(), Some("audit"));
        assert_eq!(sent.reply_to.as_deref(), Some("replies"));
        assert_ne!(sent.message_id.as_deref(), Some("m-1"), "a copy of its own");
    }

    #[test]
    fn settlement_errors_keep_their_kind_condition_and_cause() {
        assert_eq!(
            settle_error(client::SettlementError::LockLost),
            SettleError::LockLost
        );
        assert_eq!(
            settle_error(client::SettlementError::Permanent {
                condition: "amqp:not-allowed".into(),
                description: "no".into(),
            }),
            SettleError::Permanent {
                condition: "amqp:not-allowed".into(),
                description: "no".into(),
            }
        );
        let transient = settle_error(client::SettlementError::Transient(
            client::ServiceBusError::Timeout("late".into()),
        ));
        let SettleError::Transient(cause) = transient else {
            panic!("{transient:?}");
        };
        assert!(matches!(
            cause.downcast_ref::<client::ServiceBusError>(),
            Some(client::ServiceBusError::Timeout(_))
        ));
        let refused = receive_error(client::ReceiveError::Permanent(
            client::ServiceBusError::NotFound("orders".into()),
        ));
        assert!(matches!(refused, ReceiveError::Permanent(_)), "{refused:?}");
    }

    #[test]
    fn the_clients_dead_letter_reasons_are_the_runtimes() {
        use crate::runtime::DeadLetterReason;
        assert_eq!(
            DeadLetterReason::InvalidMessageId.as_str(),
            client::dead_letter_reason::INVALID_MESSAGE_ID
        );
        assert_eq!(
            DeadLetterReason::UndecodableMessage.as_str(),
            client::dead_letter_reason::UNDECODABLE_MESSAGE
        );
        assert_eq!(
            crate::ports::TYPED_MESSAGE_ID_PREFIX,
            client::TYPED_MESSAGE_ID_PREFIX
        );
    }
}
