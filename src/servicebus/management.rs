//! The `<entity>/$management` node: lock renewal and peek.

use std::time::SystemTime;

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::{Array, OrderedMap};
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{AnyMessage, RequestResponse};

use super::amqp_message::{Received, from_amqp, timestamp_to_system};
use super::cbs::{int_property, text_property};
use super::{PeekedMessage, ServiceBusError};
use crate::SettleError;

const SERVER_TIMEOUT_MS: u32 = 30_000;

/// The application properties of a `$management` request.
fn request_properties(operation: &str) -> ApplicationProperties {
    ApplicationProperties::builder()
        .insert("operation", SimpleValue::String(operation.into()))
        .insert(
            "com.microsoft:server-timeout",
            SimpleValue::Uint(SERVER_TIMEOUT_MS),
        )
        .build()
}

/// `com.microsoft:peek-message`: up to `count` messages from `from_sequence_number` on, without
/// locking them. An empty list when there are none (status 204).
pub(crate) async fn peek(
    management: &RequestResponse,
    from_sequence_number: i64,
    count: i32,
) -> Result<Vec<PeekedMessage>, ServiceBusError> {
    let mut body = OrderedMap::new();
    body.insert(
        Value::String("from-sequence-number".into()),
        Value::Long(from_sequence_number),
    );
    body.insert(Value::String("message-count".into()), Value::Int(count));
    let request = Message::builder()
        .application_properties(request_properties("com.microsoft:peek-message"))
        .body(AmqpValue(Value::Map(body)))
        .build();
    let reply = management
        .request(request)
        .await
        .map_err(|e| ServiceBusError::from_amqp(&e))?;
    peek_reply(&reply)
}

/// Reads a peek-message reply: its status, then every message it carries.
pub(crate) fn peek_reply(reply: &AnyMessage) -> Result<Vec<PeekedMessage>, ServiceBusError> {
    let status = int_property(reply, &["statusCode", "status-code"]).unwrap_or(0);
    if status == 204 {
        return Ok(Vec::new());
    }
    if status != 200 {
        let description =
            text_property(reply, &["statusDescription", "status-description"]).unwrap_or_default();
        return Err(match status {
            404 => ServiceBusError::NotFound(description),
            401 => ServiceBusError::Unauthorized {
                status,
                description,
            },
            _ => ServiceBusError::Broker {
                condition: text_property(reply, &["errorCondition", "error-condition"])
                    .unwrap_or_else(|| status.to_string()),
                description,
            },
        });
    }
    let malformed = |what: &str| ServiceBusError::Broker {
        condition: "peek-message".into(),
        description: format!("malformed reply: {what}"),
    };
    let Body::Value(AmqpValue(Value::Map(map))) = &reply.body else {
        return Err(malformed("no map body"));
    };
    let messages = map
        .iter()
        .find_map(|(key, value)| match (key, value) {
            (Value::String(k), Value::List(list)) if k == "messages" => Some(list.clone()),
            (Value::String(k), Value::Array(Array(list))) if k == "messages" => Some(list.clone()),
            _ => None,
        })
        .ok_or_else(|| malformed("no messages"))?;
    let mut out = Vec::with_capacity(messages.len());
    for entry in messages {
        let Value::Map(entry) = entry else {
            return Err(malformed("an entry is not a map"));
        };
        let encoded = entry
            .iter()
            .find_map(|(key, value)| match (key, value) {
                (Value::String(k), Value::Binary(b)) if k == "message" => Some(b.clone()),
                _ => None,
            })
            .ok_or_else(|| malformed("an entry has no message"))?;
        let message = sb_amqp::decode_message(&encoded).map_err(|e| malformed(&e.to_string()))?;
        let Received {
            message,
            delivery_count,
            sequence_number,
            ..
        } = from_amqp(&message, &[]);
        out.push(PeekedMessage {
            message,
            delivery_count,
            sequence_number: sequence_number.ok_or_else(|| malformed("no sequence number"))?,
        });
    }
    Ok(out)
}

/// Renews one lock; returns the new expiry.
pub(crate) async fn renew_lock(
    management: &RequestResponse,
    link_name: &str,
    lock_token: uuid::Uuid,
) -> Result<SystemTime, SettleError> {
    let mut body = OrderedMap::new();
    body.insert(
        Value::String("lock-tokens".into()),
        Value::Array(Array(vec![Value::Uuid(super::amqp_message::to_amqp_uuid(
            lock_token,
        ))])),
    );
    let properties = ApplicationProperties::builder()
        .insert(
            "operation",
            SimpleValue::String("com.microsoft:renew-lock".into()),
        )
        .insert(
            "com.microsoft:server-timeout",
            SimpleValue::Uint(SERVER_TIMEOUT_MS),
        )
        .insert(
            "associated-link-name",
            SimpleValue::String(link_name.into()),
        )
        .build();
    let request = Message::builder()
        .application_properties(properties)
        .body(AmqpValue(Value::Map(body)))
        .build();
    let reply = management.request(request).await.map_err(|e| {
        if e.is_lock_lost() {
            SettleError::LockLost
        } else {
            SettleError::Transient(e.to_string())
        }
    })?;
    renew_lock_reply(&reply)
}

/// Reads a renew-lock reply: the new expiry, or why there is none.
pub(crate) fn renew_lock_reply(reply: &AnyMessage) -> Result<SystemTime, SettleError> {
    let status = int_property(reply, &["statusCode", "status-code"]).unwrap_or(0);
    let condition = text_property(reply, &["errorCondition", "error-condition"]);
    if status == 410 || condition.as_deref() == Some(sb_amqp::condition::MESSAGE_LOCK_LOST) {
        return Err(SettleError::LockLost);
    }
    if status != 200 {
        let description =
            text_property(reply, &["statusDescription", "status-description"]).unwrap_or_default();
        return Err(SettleError::Refused {
            condition: condition.unwrap_or_else(|| status.to_string()),
            description,
        });
    }
    let Body::Value(AmqpValue(Value::Map(map))) = &reply.body else {
        return Err(SettleError::Transient(
            "renew-lock reply has no map body".into(),
        ));
    };
    let expirations = map.iter().find_map(|(key, value)| match (key, value) {
        (Value::String(k), Value::Array(a)) if k == "expirations" => Some(a),
        (Value::Symbol(k), Value::Array(a)) if k.0 == "expirations" => Some(a),
        _ => None,
    });
    match expirations.and_then(|a| a.0.first()) {
        Some(Value::Timestamp(ts)) => Ok(timestamp_to_system(ts)),
        _ => Err(SettleError::Transient(
            "renew-lock reply has no expiration".into(),
        )),
    }
}
