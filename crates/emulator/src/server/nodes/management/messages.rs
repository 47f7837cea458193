//! The message operations of `$management`: renew locks, peek, settle by lock token
//! (`update-disposition`), schedule and cancel, receive deferred messages by sequence number.

use std::time::SystemTime;

use bytes::Bytes;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::Array;
use sb_amqp::condition;
use sb_amqp::servicebus::management::{key, status};
use sb_amqp::types::messaging::Body;
use sb_amqp::types::primitives::Binary;
use uuid::Uuid;

use super::Command;
use crate::server::codec::{self, key_text, to_timestamp};
use crate::server::nodes::body::{long, map_get, properties_of, text, tokens, values};
use crate::server::nodes::{Reply, map};
use crate::{
    BrokerMessage, DispositionStatus, Entity, Error, Properties, ReceiveMode, ReceivedMessage,
};

/// `renew-lock`: the new expiries, in the order of the tokens.
pub(super) fn renew_lock(entity: &Entity, lock_tokens: &[Uuid]) -> Reply {
    Reply::from_result(entity.renew_lock(lock_tokens).map(|expirations| {
        let stamps = expirations
            .into_iter()
            .map(|t: SystemTime| Value::Timestamp(to_timestamp(t)))
            .collect();
        Some(map(vec![(key::EXPIRATIONS, Value::Array(Array(stamps)))]))
    }))
}

/// `peek-message`'s fields: from sequence number 0 and one message unless told otherwise.
pub(super) fn parse_peek(body: &Body<Value>) -> Command {
    let from_sequence_number = map_get(body, key::FROM_SEQUENCE_NUMBER)
        .map_or(Some(0), long)
        .unwrap_or(0);
    let message_count = match map_get(body, key::MESSAGE_COUNT) {
        Some(Value::Int(n)) => usize::try_from(*n).unwrap_or(1),
        Some(Value::Long(n)) => usize::try_from(*n).unwrap_or(1),
        _ => 1,
    };
    Command::Peek {
        from_sequence_number,
        message_count,
    }
}

/// `peek-message`: the messages, or `204 No Content` past the last one.
pub(super) fn peek(entity: &Entity, from_sequence_number: i64, message_count: usize) -> Reply {
    match entity.peek(from_sequence_number, message_count) {
        Ok(messages) if messages.is_empty() => Reply::no_content(),
        Ok(messages) => Reply::from_result(
            message_list(&messages, false).map(|list| Some(map(vec![(key::MESSAGES, list)]))),
        ),
        Err(error) => Reply::error(&error),
    }
}

/// An `update-disposition` request.
#[derive(Debug)]
pub(super) struct Disposition {
    status: DispositionStatus,
    lock_tokens: Vec<Uuid>,
    dead_letter_reason: Option<String>,
    dead_letter_description: Option<String>,
    properties_to_modify: Properties,
}

impl Disposition {
    /// Reads the request; `400 amqp:invalid-field` for a status Service Bus does not have.
    pub(super) fn parse(body: &Body<Value>) -> Result<Disposition, Reply> {
        let field = |name| map_get(body, name);
        let Some(status) =
            text(field(key::DISPOSITION_STATUS)).and_then(|s| DispositionStatus::parse(&s))
        else {
            return Err(Reply::new(
                status::BAD_REQUEST,
                "unknown disposition-status",
                Some(condition::INVALID_FIELD),
            ));
        };
        Ok(Disposition {
            status,
            lock_tokens: tokens(field(key::LOCK_TOKENS)),
            dead_letter_reason: text(field(key::DEAD_LETTER_REASON)),
            dead_letter_description: text(field(key::DEAD_LETTER_DESCRIPTION)),
            properties_to_modify: properties_of(field(key::PROPERTIES_TO_MODIFY)),
        })
    }

    /// Settles every token in order.
    pub(super) async fn apply(self, entity: &Entity) -> Reply {
        let settled = entity
            .update_disposition(
                self.status,
                &self.lock_tokens,
                self.dead_letter_reason,
                self.dead_letter_description,
                self.properties_to_modify,
            )
            .await;
        Reply::from_result(settled.map(|()| None))
    }
}

/// `schedule-message`'s messages, each an encoded message in a `message` entry;
/// `400 amqp:decode-error` when one is missing or does not decode.
pub(super) fn parse_scheduled(body: &Body<Value>) -> Result<Vec<BrokerMessage>, Reply> {
    let mut messages = Vec::new();
    for item in values(map_get(body, key::MESSAGES)) {
        let Value::Map(entry) = item else { continue };
        let encoded = entry
            .iter()
            .find(|(k, _)| key_text(k) == Some(key::MESSAGE))
            .and_then(|(_, v)| match v {
                Value::Binary(b) => Some(Bytes::from(b.to_vec())),
                _ => None,
            });
        match encoded.map(codec::broker_message) {
            Some(Ok(message)) => messages.push(message),
            _ => {
                return Err(Reply::new(
                    status::BAD_REQUEST,
                    "schedule-message needs encoded messages",
                    Some(condition::DECODE_ERROR),
                ));
            }
        }
    }
    Ok(messages)
}

/// `schedule-message`: the sequence numbers of the scheduled messages.
pub(super) fn schedule(entity: &Entity, messages: Vec<BrokerMessage>) -> Reply {
    Reply::from_result(entity.schedule(messages).map(|seqs| {
        Some(map(vec![(
            key::SEQUENCE_NUMBERS,
            Value::Array(Array(seqs.into_iter().map(Value::Long).collect())),
        )]))
    }))
}

/// `receiver-settle-mode`: 0 is receive-and-delete, anything else peek-lock.
pub(super) fn settle_mode(value: Option<&Value>) -> ReceiveMode {
    match value {
        Some(Value::Uint(0)) => ReceiveMode::ReceiveAndDelete,
        _ => ReceiveMode::PeekLock,
    }
}

/// `receive-by-sequence-number`: the deferred messages with their lock tokens.
pub(super) fn receive_deferred(
    entity: &Entity,
    sequence_numbers: &[i64],
    mode: ReceiveMode,
) -> Reply {
    Reply::from_result(
        entity
            .receive_deferred(sequence_numbers, mode)
            .and_then(|messages| message_list(&messages, true))
            .map(|list| Some(map(vec![(key::MESSAGES, list)]))),
    )
}

/// Messages as a reply's `messages` list: each encoded as delivered, with its lock token
/// when asked.
fn message_list(messages: &[ReceivedMessage], with_lock: bool) -> Result<Value, Error> {
    let mut list = Vec::new();
    for received in messages {
        let encoded = codec::delivered(received).map_err(|e| Error::Server(e.to_string()))?;
        let mut entries = vec![(key::MESSAGE, Value::Binary(Binary::from(encoded.to_vec())))];
        if with_lock && let Some(token) = received.lock_token {
            entries.push((key::LOCK_TOKEN, Value::Uuid(codec::to_uuid(token))));
        }
        list.push(map(entries));
    }
    Ok(Value::List(list))
}

/// Reads `batch-delete-messages`: `message-count` (int, at least 1), `enqueued-time-utc`
/// (timestamp; JS 7.10 beta `ManagementClient._deleteMessages` sends the caller's time or now)
/// and, on a session receiver, `session-id`.
pub(super) fn parse_batch_delete(body: &Body<Value>) -> Result<Command, Reply> {
    let count = match map_get(body, key::MESSAGE_COUNT) {
        Some(Value::Int(n)) => usize::try_from(*n).ok(),
        Some(Value::Long(n)) => usize::try_from(*n).ok(),
        Some(Value::Uint(n)) => usize::try_from(*n).ok(),
        _ => None,
    }
    .filter(|n| *n > 0)
    .ok_or_else(|| {
        Reply::new(
            status::BAD_REQUEST,
            "message-count must be a number greater than 0",
            Some(condition::INVALID_FIELD),
        )
    })?;
    let older_than = match map_get(body, key::ENQUEUED_TIME_UTC) {
        Some(Value::Timestamp(ts)) => codec::to_system(ts),
        _ => SystemTime::now(),
    };
    Ok(Command::BatchDelete {
        count,
        older_than,
        session_id: text(map_get(body, key::SESSION_ID)),
    })
}

/// `batch-delete-messages`: `200 {message-count}`, or `204` with `message-not-found` when
/// nothing was deleted (what JS `_deleteMessages` reads as zero).
pub(super) fn batch_delete(
    entity: &Entity,
    count: usize,
    older_than: SystemTime,
    session_id: Option<&str>,
) -> Reply {
    match entity.delete_messages(count, older_than, session_id) {
        Ok(0) => Reply::new(
            status::NO_CONTENT,
            "No messages to delete",
            Some(condition::MESSAGE_NOT_FOUND),
        ),
        Ok(deleted) => Reply::ok(Some(map(vec![(
            key::MESSAGE_COUNT,
            Value::Int(i32::try_from(deleted).unwrap_or(i32::MAX)),
        )]))),
        Err(error) => Reply::error(&error),
    }
}
