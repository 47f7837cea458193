//! The `<entity>/$management` node: a [`Request`] per operation (lock renewal, settlement by
//! lock token, peek, session operations) and the [`Reply`] the service sends back.
//!
//! Every name on the wire comes from [`sb_amqp::servicebus`]; the service's replies spell their
//! status properties in camel case, the request-response convention (`$cbs`, JS
//! `@azure/core-amqp`) in kebab case, and both are read.

use std::time::SystemTime;

use sb_amqp::AnyMessage;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::{Array, OrderedMap};
use sb_amqp::servicebus::management::{
    DispositionStatus, Operation, key, reply as reply_property, request as request_property,
    status as code,
};
use sb_amqp::servicebus::{cbs, condition};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::{AmqpValue, ApplicationProperties, Body, Message};
use sb_amqp::types::primitives::SimpleValue;

use super::amqp_message::{Received, from_amqp, timestamp_to_system, to_amqp_uuid};
use super::cbs::{int_property, text_property};
use super::{PeekedMessage, ServiceBusError};
use crate::SettlementError;

/// How long the service may take over an operation (`com.microsoft:server-timeout`).
const SERVER_TIMEOUT_MS: u32 = 30_000;

/// A `$management` request: the operation, its body map and, for a lock renewal or a
/// settlement, the receive link it acts for.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    operation: Operation,
    associated_link: Option<String>,
    body: OrderedMap<Value, Value>,
}

impl Request {
    /// An `operation` with an empty body.
    pub(crate) fn new(operation: Operation) -> Self {
        Request {
            operation,
            associated_link: None,
            body: OrderedMap::new(),
        }
    }

    /// Adds the body entry `key`.
    pub(crate) fn entry(mut self, key: &str, value: Value) -> Self {
        self.body.insert(Value::String(key.to_owned()), value);
        self
    }

    /// `peek-message`: up to `count` messages from `from_sequence_number` on.
    pub(crate) fn peek(from_sequence_number: i64, count: i32) -> Self {
        Request::new(Operation::PeekMessage)
            .entry(key::FROM_SEQUENCE_NUMBER, Value::Long(from_sequence_number))
            .entry(key::MESSAGE_COUNT, Value::Int(count))
    }

    /// `renew-lock` for one lock.
    pub(crate) fn renew_lock(lock_token: uuid::Uuid) -> Self {
        Request::new(Operation::RenewLock).entry(key::LOCK_TOKENS, lock_tokens(lock_token))
    }

    /// Names the receive link the request acts for: the receiver's link attached now, or
    /// none without one. Never a link already gone: the SDKs name their current, open link
    /// (Python `_base_handler.py` `_mgmt_request_response`: the handler's link name after
    /// `_open()`, for renew-lock and update-disposition alike; .NET `AmqpReceiver` only when
    /// `_receiveLink.TryGetOpenedObject` succeeds; Go `internal/mgmt.go` `RenewLocks` omits it
    /// for an empty name).
    pub(crate) fn for_link(mut self, link_name: Option<String>) -> Self {
        self.associated_link = link_name;
        self
    }

    /// `update-disposition`: settles a lock by its token, whichever link received it (Go
    /// `internal/mgmt.go` `SettleOnMgmtLink`, used when the receive link is gone).
    pub(crate) fn disposition(disposition: &Disposition, lock_token: uuid::Uuid) -> Self {
        let request = Request::new(Operation::UpdateDisposition)
            .entry(key::DISPOSITION_STATUS, text(disposition.status().as_str()))
            .entry(key::LOCK_TOKENS, lock_tokens(lock_token));
        match disposition {
            Disposition::Complete => request,
            Disposition::Abandon(properties) if properties.is_empty() => request,
            Disposition::Abandon(properties) => {
                let mut map = OrderedMap::new();
                for (key, value) in properties {
                    map.insert(Value::String(key.0.clone()), value.clone());
                }
                request.entry(key::PROPERTIES_TO_MODIFY, Value::Map(map))
            }
            Disposition::DeadLetter {
                reason,
                description,
            } => request
                .entry(key::DEAD_LETTER_REASON, text(reason))
                .entry(key::DEAD_LETTER_DESCRIPTION, text(description)),
        }
    }

    /// A session operation (`renew-session-lock`, `get-session-state`, `set-session-state`)
    /// on `session_id` (Python `_servicebus_session.py`: `session-id` first).
    pub(crate) fn session(operation: Operation, session_id: &str) -> Self {
        Request::new(operation).entry(key::SESSION_ID, text(session_id))
    }

    /// The AMQP message: `operation` and the server timeout (and the associated link) as
    /// application properties, the body map as the value.
    pub(crate) fn into_message(self) -> Message<AmqpValue<Value>> {
        let mut properties = ApplicationProperties::builder()
            .insert(
                request_property::OPERATION,
                SimpleValue::String(self.operation.as_str().into()),
            )
            .insert(
                request_property::SERVER_TIMEOUT,
                SimpleValue::Uint(SERVER_TIMEOUT_MS),
            );
        if let Some(link) = self.associated_link {
            properties = properties.insert(
                request_property::ASSOCIATED_LINK_NAME,
                SimpleValue::String(link),
            );
        }
        Message::builder()
            .application_properties(properties.build())
            .body(AmqpValue(Value::Map(self.body)))
            .build()
    }
}

fn text(s: &str) -> Value {
    Value::String(s.to_owned())
}

fn lock_tokens(lock_token: uuid::Uuid) -> Value {
    Value::Array(Array(vec![Value::Uuid(to_amqp_uuid(lock_token))]))
}

/// A `$management` reply as the client reads it: status, condition, and the body's entries.
#[derive(Debug)]
pub(crate) struct Reply<'a> {
    /// The status code (0 when absent).
    pub(crate) status: i64,
    /// The error condition, if any.
    pub(crate) condition: Option<String>,
    message: &'a AnyMessage,
}

impl<'a> Reply<'a> {
    /// Reads the status and condition of `message`.
    pub(crate) fn read(message: &'a AnyMessage) -> Self {
        Reply {
            status: int_property(
                message,
                &[reply_property::STATUS_CODE, cbs::reply::STATUS_CODE],
            )
            .unwrap_or(0),
            condition: text_property(
                message,
                &[reply_property::ERROR_CONDITION, cbs::reply::ERROR_CONDITION],
            ),
            message,
        }
    }

    /// The status description (empty when absent).
    pub(crate) fn description(&self) -> String {
        text_property(
            self.message,
            &[
                reply_property::STATUS_DESCRIPTION,
                cbs::reply::STATUS_DESCRIPTION,
            ],
        )
        .unwrap_or_default()
    }

    /// True for a map body.
    fn has_map_body(&self) -> bool {
        matches!(&self.message.body, Body::Value(AmqpValue(Value::Map(_))))
    }

    /// The body entry `key` (a string or symbol key), if the body is a map holding one.
    pub(crate) fn entry(&self, key: &str) -> Option<&'a Value> {
        let Body::Value(AmqpValue(Value::Map(map))) = &self.message.body else {
            return None;
        };
        map_entry(map, key)
    }

    /// Statuses a retry may clear: request timeout, internal error, service unavailable (Go
    /// `internal/errors.go` `GetRecoveryKind`: 408, 503 and 500 need no recovery, only a
    /// retry), and the busy conditions.
    fn is_transient(&self) -> bool {
        matches!(
            i32::try_from(self.status),
            Ok(code::REQUEST_TIMEOUT | code::INTERNAL_SERVER_ERROR | code::SERVICE_UNAVAILABLE)
        ) || self
            .condition
            .as_deref()
            .is_some_and(super::error::is_busy_condition)
    }

    fn is(&self, status: i32) -> bool {
        self.status == i64::from(status)
    }
}

/// The entry `key` (a string or symbol key) of an AMQP map.
fn map_entry<'a>(map: &'a OrderedMap<Value, Value>, key: &str) -> Option<&'a Value> {
    map.iter().find_map(|(k, v)| match k {
        Value::String(k) if k == key => Some(v),
        Value::Symbol(k) if k.0 == key => Some(v),
        _ => None,
    })
}

/// The messages of a peek reply. 204, 202, and 404 with `com.microsoft:message-not-found` are
/// an empty page (.NET `AmqpReceiver.PeekMessagesInternalAsync`, Python
/// `_common/mgmt_handlers.py` `peek_op`).
pub(crate) fn peek_page(message: &AnyMessage) -> Result<Vec<PeekedMessage>, ServiceBusError> {
    let reply = Reply::read(message);
    if reply.is(code::NO_CONTENT)
        || reply.is(code::ACCEPTED)
        || (reply.is(code::NOT_FOUND)
            && reply.condition.as_deref() == Some(condition::MESSAGE_NOT_FOUND))
    {
        return Ok(Vec::new());
    }
    if !reply.is(code::OK) {
        return Err(peek_error(&reply));
    }
    if !reply.has_map_body() {
        return Err(malformed("no map body"));
    }
    let messages = match reply.entry(key::MESSAGES) {
        Some(Value::List(list) | Value::Array(Array(list))) => list,
        _ => return Err(malformed("no messages")),
    };
    messages.iter().map(peeked).collect()
}

/// A peek refused: not found, unauthorized, transient, or the broker's condition.
fn peek_error(reply: &Reply<'_>) -> ServiceBusError {
    let (status, description) = (reply.status, reply.description());
    if reply.is(code::NOT_FOUND) {
        ServiceBusError::NotFound(description)
    } else if reply.is(code::UNAUTHORIZED) {
        ServiceBusError::Unauthorized {
            status,
            description,
        }
    } else if reply.is_transient() {
        ServiceBusError::Connection(format!("peek answered {status}: {description}"))
    } else {
        ServiceBusError::Broker {
            condition: reply
                .condition
                .clone()
                .unwrap_or_else(|| status.to_string()),
            description,
        }
    }
}

fn malformed(what: &str) -> ServiceBusError {
    ServiceBusError::Broker {
        condition: "peek-message".into(),
        description: format!("malformed reply: {what}"),
    }
}

/// One entry of a peek reply: the encoded message and its broker state.
fn peeked(entry: &Value) -> Result<PeekedMessage, ServiceBusError> {
    let Value::Map(entry) = entry else {
        return Err(malformed("an entry is not a map"));
    };
    let encoded = entry
        .iter()
        .find_map(|(k, v)| match (k, v) {
            (Value::String(k), Value::Binary(b)) if k == key::MESSAGE => Some(b),
            _ => None,
        })
        .ok_or_else(|| malformed("an entry has no message"))?;
    let message = sb_amqp::decode_message(encoded).map_err(|e| malformed(&e.to_string()))?;
    let Received { message, .. } = from_amqp(&message, &[]);
    Ok(PeekedMessage {
        delivery_count: message.delivery_count,
        sequence_number: message
            .sequence_number
            .ok_or_else(|| malformed("no sequence number"))?,
        message,
    })
}

/// What a settlement does, as `com.microsoft:update-disposition` says it.
#[derive(Debug, Clone)]
pub(crate) enum Disposition {
    Complete,
    Abandon(Fields),
    DeadLetter { reason: String, description: String },
}

impl Disposition {
    /// The `disposition-status` that says it.
    fn status(&self) -> DispositionStatus {
        match self {
            Disposition::Complete => DispositionStatus::Completed,
            Disposition::Abandon(_) => DispositionStatus::Abandoned,
            Disposition::DeadLetter { .. } => DispositionStatus::Suspended,
        }
    }
}

/// Reads an `update-disposition` reply.
/// True for a `401` reply: the service no longer honours the token put for the node.
pub(crate) fn is_unauthorized(reply: &AnyMessage) -> bool {
    Reply::read(reply).is(code::UNAUTHORIZED)
}

/// True for a 2xx reply: the node answered as a healthy one does.
pub(crate) fn is_success(reply: &AnyMessage) -> bool {
    (200..300).contains(&Reply::read(reply).status)
}

/// True for a reply saying the service is busy: `503`, or `com.microsoft:server-busy`
/// (what a throttled namespace answers).
pub(crate) fn is_busy(reply: &AnyMessage) -> bool {
    let reply = Reply::read(reply);
    reply.is(code::SERVICE_UNAVAILABLE)
        || reply.condition.as_deref() == Some(condition::SERVER_BUSY)
}

pub(crate) fn disposition_reply(reply: &AnyMessage) -> Result<(), SettlementError> {
    lock_reply(&Reply::read(reply))
}

/// The lock-related part of a renew or update-disposition reply: `Ok(())` for 200.
fn lock_reply(reply: &Reply<'_>) -> Result<(), SettlementError> {
    if reply.is(code::GONE)
        || matches!(
            reply.condition.as_deref(),
            Some(condition::MESSAGE_LOCK_LOST | condition::SESSION_LOCK_LOST)
        )
    {
        return Err(SettlementError::LockLost);
    }
    if reply.is(code::OK) {
        return Ok(());
    }
    let (status, description) = (reply.status, reply.description());
    if reply.is_transient() {
        return Err(SettlementError::Transient(ServiceBusError::Broker {
            condition: reply
                .condition
                .clone()
                .unwrap_or_else(|| status.to_string()),
            description: format!("$management answered {status}: {description}"),
        }));
    }
    Err(SettlementError::Permanent {
        condition: reply
            .condition
            .clone()
            .unwrap_or_else(|| status.to_string()),
        description,
    })
}

/// The body entry `key` of a session operation's reply (after its status was checked):
/// `Ok(None)` when absent.
pub(crate) fn session_reply(
    reply: &AnyMessage,
    key: &str,
) -> Result<Option<Value>, SettlementError> {
    let reply = Reply::read(reply);
    lock_reply(&reply)?;
    Ok(reply.entry(key).cloned())
}

/// Reads a `renew-lock` reply: the new expiry.
pub(crate) fn renew_reply(reply: &AnyMessage) -> Result<SystemTime, SettlementError> {
    let reply = Reply::read(reply);
    lock_reply(&reply)?;
    if !reply.has_map_body() {
        return Err(SettlementError::Transient(ServiceBusError::Link(
            "renew-lock reply has no map body".into(),
        )));
    }
    let first = match reply.entry(key::EXPIRATIONS) {
        Some(Value::Array(Array(expirations))) => expirations.first(),
        _ => None,
    };
    if let Some(Value::Timestamp(ts)) = first {
        return Ok(timestamp_to_system(ts));
    }
    Err(SettlementError::Transient(ServiceBusError::Link(
        "renew-lock reply has no expiration".into(),
    )))
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
            reply(404, Some(condition::MESSAGE_NOT_FOUND)),
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
                Err(SettlementError::Transient(_))
            ));
            assert!(peek_page(&reply(status, None)).unwrap_err().is_transient());
        }
        assert!(matches!(
            disposition_reply(&reply(400, Some(sb_amqp::condition::SERVER_BUSY))),
            Err(SettlementError::Transient(_))
        ));
        assert!(matches!(
            disposition_reply(&reply(410, Some(sb_amqp::condition::MESSAGE_LOCK_LOST))),
            Err(SettlementError::LockLost)
        ));
        assert!(matches!(
            disposition_reply(&reply(400, Some("amqp:invalid-field"))),
            Err(SettlementError::Permanent { .. })
        ));
        assert!(disposition_reply(&reply(200, None)).is_ok());
    }
}
