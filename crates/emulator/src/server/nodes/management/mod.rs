//! `<entity>/$management`: each request is parsed into a [`Command`], then applied to the
//! entity, as mini-redis parses a frame into a command and applies it to the database.
//!
//! # Layout
//! - this file: [`answer`], [`Command`] with its `parse` and `apply` dispatch.
//! - `messages`: the message operations (renew-lock, peek, update-disposition, schedule,
//!   cancel, receive by sequence number).
//! - `sessions`: the session operations.
//! - `rules`: the subscription rule operations and rule descriptions.

mod messages;
mod rules;
mod sessions;

use bytes::Bytes;
use sb_amqp::AnyMessage;
use sb_amqp::codec::Value;
use sb_amqp::condition;
use sb_amqp::servicebus::management::{Operation, key, request};
use sb_amqp::types::messaging::Body;
use uuid::Uuid;

use super::Reply;
use super::body::{app_text, body_value, longs, map_get, text, tokens};
use crate::{Broker, BrokerMessage, Entity, ReceiveMode, Rule};
use messages::Disposition;
use sessions::SessionPage;

/// The status of a reply to an operation this emulator does not have (HTTP's 501).
const NOT_IMPLEMENTED: i32 = 501;

/// Answers one `$management` request for `entity`: resolve, parse, apply.
pub(super) async fn answer(request: &AnyMessage, broker: &Broker, entity: &str) -> Reply {
    let entity = match broker.entity(entity) {
        Ok(entity) => entity,
        Err(error) => return Reply::error(&error),
    };
    let operation = app_text(request, request::OPERATION).unwrap_or_default();
    match Command::parse(&operation, &request.body) {
        Ok(command) => command.apply(&entity).await,
        Err(reply) => reply,
    }
}

/// A `$management` request, parsed.
#[derive(Debug)]
enum Command {
    /// `renew-lock`.
    RenewLock { lock_tokens: Vec<Uuid> },
    /// `peek-message`.
    Peek {
        from_sequence_number: i64,
        message_count: usize,
    },
    /// `update-disposition`.
    UpdateDisposition(Disposition),
    /// `schedule-message`.
    Schedule { messages: Vec<BrokerMessage> },
    /// `cancel-scheduled-message`.
    CancelScheduled { sequence_numbers: Vec<i64> },
    /// `receive-by-sequence-number`.
    ReceiveDeferred {
        sequence_numbers: Vec<i64>,
        mode: ReceiveMode,
    },
    /// `renew-session-lock` (the session id is checked when applied).
    RenewSessionLock { session_id: Option<String> },
    /// `get-session-state`.
    GetSessionState { session_id: Option<String> },
    /// `set-session-state` (`None` clears it).
    SetSessionState {
        session_id: Option<String>,
        state: Option<Bytes>,
    },
    /// `get-message-sessions`.
    GetMessageSessions(SessionPage),
    /// `add-rule`.
    AddRule(Rule),
    /// `remove-rule`.
    RemoveRule { name: String },
    /// `enumerate-rules`.
    EnumerateRules { skip: usize, top: usize },
    /// `batch-delete-messages`.
    BatchDelete {
        count: usize,
        older_than: std::time::SystemTime,
        session_id: Option<String>,
    },
}

impl Command {
    /// Reads the operation and its body; the reply to send instead when the request cannot
    /// become a command (unknown operation, undecodable fields).
    fn parse(operation: &str, body: &Body<Value>) -> Result<Command, Reply> {
        let Some(operation) = Operation::from_name(operation) else {
            return Err(Reply::new(
                NOT_IMPLEMENTED,
                format!("operation {operation} is not supported"),
                Some(condition::NOT_IMPLEMENTED),
            ));
        };
        let field = |name| map_get(body, name);
        let session_id = || text(field(key::SESSION_ID));
        let invalid_rule = |error| Reply::error(&error);
        Ok(match operation {
            Operation::RenewLock => Command::RenewLock {
                lock_tokens: tokens(field(key::LOCK_TOKENS)),
            },
            Operation::PeekMessage => messages::parse_peek(body),
            Operation::UpdateDisposition => Command::UpdateDisposition(Disposition::parse(body)?),
            Operation::ScheduleMessage => Command::Schedule {
                messages: messages::parse_scheduled(body)?,
            },
            Operation::CancelScheduledMessage => Command::CancelScheduled {
                sequence_numbers: longs(field(key::SEQUENCE_NUMBERS)),
            },
            Operation::ReceiveBySequenceNumber => Command::ReceiveDeferred {
                sequence_numbers: longs(field(key::SEQUENCE_NUMBERS)),
                mode: messages::settle_mode(field(key::RECEIVER_SETTLE_MODE)),
            },
            Operation::RenewSessionLock => Command::RenewSessionLock {
                session_id: session_id(),
            },
            Operation::GetSessionState => Command::GetSessionState {
                session_id: session_id(),
            },
            Operation::SetSessionState => Command::SetSessionState {
                session_id: session_id(),
                state: sessions::parse_state(field(key::SESSION_STATE)),
            },
            Operation::GetMessageSessions => Command::GetMessageSessions(SessionPage::parse(body)),
            Operation::AddRule => {
                Command::AddRule(rules::parse_rule(body_value(body)).map_err(invalid_rule)?)
            }
            Operation::RemoveRule => Command::RemoveRule {
                name: rules::rule_name(body_value(body)).map_err(invalid_rule)?,
            },
            Operation::EnumerateRules => {
                let (skip, top) = rules::page(body_value(body));
                Command::EnumerateRules { skip, top }
            }
            Operation::BatchDeleteMessages => messages::parse_batch_delete(body)?,
        })
    }

    /// Applies the command to `entity` and says how it went.
    async fn apply(self, entity: &Entity) -> Reply {
        match self {
            Command::RenewLock { lock_tokens } => messages::renew_lock(entity, &lock_tokens),
            Command::Peek {
                from_sequence_number,
                message_count,
            } => messages::peek(entity, from_sequence_number, message_count),
            Command::UpdateDisposition(disposition) => disposition.apply(entity).await,
            Command::Schedule { messages } => messages::schedule(entity, messages),
            Command::CancelScheduled { sequence_numbers } => {
                Reply::from_result(entity.cancel_scheduled(&sequence_numbers).map(|()| None))
            }
            Command::ReceiveDeferred {
                sequence_numbers,
                mode,
            } => messages::receive_deferred(entity, &sequence_numbers, mode),
            Command::RenewSessionLock { session_id } => sessions::renew_lock(entity, session_id),
            Command::GetSessionState { session_id } => sessions::state(entity, session_id),
            Command::SetSessionState { session_id, state } => {
                sessions::set_state(entity, session_id, state)
            }
            Command::GetMessageSessions(page) => page.apply(entity),
            Command::AddRule(rule) => Reply::from_result(entity.add_rule(rule).map(|()| None)),
            Command::RemoveRule { name } => {
                Reply::from_result(entity.remove_rule(&name).map(|()| None))
            }
            Command::EnumerateRules { skip, top } => rules::enumerate(entity, skip, top),
            Command::BatchDelete {
                count,
                older_than,
                session_id,
            } => messages::batch_delete(entity, count, older_than, session_id.as_deref()),
        }
    }
}
