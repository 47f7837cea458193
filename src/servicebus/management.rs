//! The `<entity>/$management` node: lock renewal and peek.

use std::time::SystemTime;

use sb_amqp::AnyMessage;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::{Array, OrderedMap};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message};
use sb_amqp::types::primitives::SimpleValue;

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

/// `com.microsoft:message-not-found`: a peek past the last message (404 with this condition).
const MESSAGE_NOT_FOUND: &str = "com.microsoft:message-not-found";

/// The status code of a `$management` reply.
fn status(reply: &AnyMessage) -> i64 {
    int_property(reply, &["statusCode", "status-code"]).unwrap_or(0)
}

fn description(reply: &AnyMessage) -> String {
    text_property(reply, &["statusDescription", "status-description"]).unwrap_or_default()
}

fn condition(reply: &AnyMessage) -> Option<String> {
    text_property(reply, &["errorCondition", "error-condition"])
}

/// Statuses a retry may clear: request timeout, internal error, service unavailable (Go
/// `internal/errors.go` `GetRecoveryKind`: 408, 503 and 500 need no recovery, only a retry),
/// and the busy conditions.
fn is_transient_reply(status: i64, condition: Option<&str>) -> bool {
    matches!(status, 408 | 500 | 503) || condition.is_some_and(super::error::is_busy_condition)
}

/// A `com.microsoft:peek-message` request: up to `count` messages from
/// `from_sequence_number` on.
pub(crate) fn peek_request(from_sequence_number: i64, count: i32) -> Message<AmqpValue<Value>> {
    let mut body = OrderedMap::new();
    body.insert(
        Value::String("from-sequence-number".into()),
        Value::Long(from_sequence_number),
    );
    body.insert(Value::String("message-count".into()), Value::Int(count));
    Message::builder()
        .application_properties(request_properties("com.microsoft:peek-message"))
        .body(AmqpValue(Value::Map(body)))
        .build()
}

/// The messages of a peek reply. 204, 202, and 404 with `com.microsoft:message-not-found` are
/// an empty page (.NET `AmqpReceiver.PeekMessagesInternalAsync`, Python
/// `_common/mgmt_handlers.py` `peek_op`).
pub(crate) fn peek_page(reply: &AnyMessage) -> Result<Vec<PeekedMessage>, ServiceBusError> {
    let status = status(reply);
    let condition = condition(reply);
    if status == 204
        || status == 202
        || (status == 404 && condition.as_deref() == Some(MESSAGE_NOT_FOUND))
    {
        return Ok(Vec::new());
    }
    if status != 200 {
        let description = description(reply);
        return Err(match status {
            404 => ServiceBusError::NotFound(description),
            401 => ServiceBusError::Unauthorized {
                status,
                description,
            },
            _ if is_transient_reply(status, condition.as_deref()) => {
                ServiceBusError::Connection(format!("peek answered {status}: {description}"))
            }
            _ => ServiceBusError::Broker {
                condition: condition.unwrap_or_else(|| status.to_string()),
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

/// A `com.microsoft:renew-lock` request for one lock of the link `link_name`.
pub(crate) fn renew_request(link_name: &str, lock_token: uuid::Uuid) -> Message<AmqpValue<Value>> {
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
    Message::builder()
        .application_properties(properties)
        .body(AmqpValue(Value::Map(body)))
        .build()
}

/// What a settlement does, as `com.microsoft:update-disposition` says it.
#[derive(Debug, Clone)]
pub(crate) enum Disposition {
    Complete,
    Abandon(Fields),
    DeadLetter { reason: String, description: String },
}

/// A `com.microsoft:update-disposition` request: settles a lock by its token, whichever link
/// received it (Go `internal/mgmt.go` `SettleOnMgmtLink`, used when the receive link is gone).
pub(crate) fn disposition_request(
    disposition: &Disposition,
    lock_token: uuid::Uuid,
) -> Message<AmqpValue<Value>> {
    let text = |s: &str| Value::String(s.to_owned());
    let mut body = OrderedMap::new();
    let status = match disposition {
        Disposition::Complete => "completed",
        Disposition::Abandon(_) => "abandoned",
        Disposition::DeadLetter { .. } => "suspended",
    };
    body.insert(text("disposition-status"), text(status));
    body.insert(
        text("lock-tokens"),
        Value::Array(Array(vec![Value::Uuid(super::amqp_message::to_amqp_uuid(
            lock_token,
        ))])),
    );
    match disposition {
        Disposition::Complete => {}
        Disposition::Abandon(properties) => {
            if !properties.is_empty() {
                let mut map = OrderedMap::new();
                for (key, value) in properties {
                    map.insert(Value::String(key.0.clone()), value.clone());
                }
                body.insert(text("properties-to-modify"), Value::Map(map));
            }
        }
        Disposition::DeadLetter {
            reason,
            description,
        } => {
            body.insert(text("deadletter-reason"), text(reason));
            body.insert(text("deadletter-description"), text(description));
        }
    }
    Message::builder()
        .application_properties(request_properties("com.microsoft:update-disposition"))
        .body(AmqpValue(Value::Map(body)))
        .build()
}

/// Reads an `update-disposition` reply.
pub(crate) fn disposition_reply(reply: &AnyMessage) -> Result<(), SettleError> {
    lock_reply(reply)
}

/// The lock-related part of a renew or update-disposition reply: `Ok(())` for 200.
fn lock_reply(reply: &AnyMessage) -> Result<(), SettleError> {
    let status = status(reply);
    let condition = condition(reply);
    if status == 410
        || matches!(
            condition.as_deref(),
            Some(sb_amqp::condition::MESSAGE_LOCK_LOST | super::session::SESSION_LOCK_LOST)
        )
    {
        return Err(SettleError::LockLost);
    }
    if status == 200 {
        return Ok(());
    }
    let description = description(reply);
    if is_transient_reply(status, condition.as_deref()) {
        return Err(SettleError::transient(format!(
            "$management answered {status}: {description}"
        )));
    }
    Err(SettleError::Permanent {
        condition: condition.unwrap_or_else(|| status.to_string()),
        description,
    })
}

/// A session operation (`com.microsoft:renew-session-lock`, `get-session-state`,
/// `set-session-state`) on `session_id`, with the body entries `extra` (Python
/// `_servicebus_session.py`: `session-id`, `session-state`).
pub(crate) fn session_request(
    operation: &str,
    session_id: &str,
    extra: Vec<(&str, Value)>,
) -> Message<AmqpValue<Value>> {
    let mut body = OrderedMap::new();
    body.insert(
        Value::String("session-id".into()),
        Value::String(session_id.to_owned()),
    );
    for (key, value) in extra {
        body.insert(Value::String(key.to_owned()), value);
    }
    Message::builder()
        .application_properties(request_properties(operation))
        .body(AmqpValue(Value::Map(body)))
        .build()
}

/// The body entry `key` of a session operation's reply (after its status was checked):
/// `Ok(None)` when absent.
pub(crate) fn session_reply(reply: &AnyMessage, key: &str) -> Result<Option<Value>, SettleError> {
    lock_reply(reply)?;
    let Body::Value(AmqpValue(Value::Map(map))) = &reply.body else {
        return Ok(None);
    };
    Ok(map.iter().find_map(|(k, v)| match k {
        Value::String(k) if k == key => Some(v.clone()),
        Value::Symbol(k) if k.0 == key => Some(v.clone()),
        _ => None,
    }))
}

/// Reads a `renew-lock` reply: the new expiry.
pub(crate) fn renew_reply(reply: &AnyMessage) -> Result<SystemTime, SettleError> {
    lock_reply(reply)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(status: i32, condition: Option<&str>) -> AnyMessage {
        let mut properties =
            ApplicationProperties::builder().insert("statusCode", SimpleValue::Int(status));
        if let Some(condition) = condition {
            properties = properties.insert("errorCondition", SimpleValue::Symbol(condition.into()));
        }
        Message::builder()
            .application_properties(properties.build())
            .body(Body::Value(AmqpValue(Value::Null)))
            .build()
    }

    #[test]
    fn no_content_accepted_and_message_not_found_are_an_empty_page() {
        for r in [
            reply(204, None),
            reply(202, None),
            reply(404, Some(MESSAGE_NOT_FOUND)),
        ] {
            assert_eq!(peek_page(&r).unwrap(), Vec::new());
        }
        assert!(matches!(
            peek_page(&reply(404, Some("amqp:not-found"))),
            Err(ServiceBusError::NotFound(_))
        ));
    }

    #[test]
    fn timeouts_and_unavailability_are_transient_lock_loss_is_not() {
        for status in [408, 500, 503] {
            assert!(matches!(
                disposition_reply(&reply(status, None)),
                Err(SettleError::Transient(_))
            ));
            assert!(peek_page(&reply(status, None)).unwrap_err().is_transient());
        }
        assert!(matches!(
            disposition_reply(&reply(400, Some(sb_amqp::condition::SERVER_BUSY))),
            Err(SettleError::Transient(_))
        ));
        assert_eq!(
            disposition_reply(&reply(410, Some(sb_amqp::condition::MESSAGE_LOCK_LOST))),
            Err(SettleError::LockLost)
        );
        assert!(matches!(
            disposition_reply(&reply(400, Some("amqp:invalid-field"))),
            Err(SettleError::Permanent { .. })
        ));
        assert_eq!(disposition_reply(&reply(200, None)), Ok(()));
    }
}
