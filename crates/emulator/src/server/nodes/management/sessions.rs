//! The session operations of `$management`: renew a session lock, get and set session state,
//! list sessions.
//!
//! Request and reply keys as Python's `_servicebus_session.py`, `_session_browser.py` and
//! `mgmt_handlers.py` use them (`session-id`, `session-state`, `expiration`,
//! `last-updated-time`, `skip`, `top`, `sessions-ids`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::Array;
use sb_amqp::condition;
use sb_amqp::servicebus::management::{key, status};
use sb_amqp::types::messaging::Body;
use sb_amqp::types::primitives::Binary;

use crate::server::codec::to_timestamp;
use crate::server::nodes::body::{count, map_get};
use crate::server::nodes::{Reply, map};
use crate::{Entity, Error};

/// `last-updated-time` at or past this (.NET `DateTime.MaxValue` in milliseconds, as Python's
/// `_session_browser.py` sends it) asks for the default listing: sessions with messages or
/// state.
const LIST_ALL_SESSIONS_MS: i64 = 253_402_300_800_000;

/// The session id a session operation needs.
fn session_id(entity: &Entity, session_id: Option<String>) -> Result<String, Error> {
    session_id.ok_or_else(|| Error::NotAllowed {
        operation: "session operation",
        entity: entity.path().to_owned(),
        reason: "the request needs a session-id",
    })
}

/// `renew-session-lock`: the new expiry.
pub(super) fn renew_lock(entity: &Entity, id: Option<String>) -> Reply {
    let renewed = session_id(entity, id).and_then(|id| entity.renew_session_lock(&id));
    Reply::from_result(renewed.map(|until| {
        Some(map(vec![(
            key::EXPIRATION,
            Value::Timestamp(to_timestamp(until)),
        )]))
    }))
}

/// `get-session-state`: the state, `null` when there is none.
pub(super) fn state(entity: &Entity, id: Option<String>) -> Reply {
    let state = session_id(entity, id).and_then(|id| entity.session_state(&id));
    Reply::from_result(state.map(|state| {
        let state = state.map_or(Value::Null, |b| Value::Binary(Binary::from(b.to_vec())));
        Some(map(vec![(key::SESSION_STATE, state)]))
    }))
}

/// `set-session-state`'s state: binary, or anything else to clear it.
pub(super) fn parse_state(value: Option<&Value>) -> Option<Bytes> {
    match value {
        Some(Value::Binary(b)) => Some(Bytes::from(b.to_vec())),
        _ => None,
    }
}

/// `set-session-state`.
pub(super) fn set_state(entity: &Entity, id: Option<String>, state: Option<Bytes>) -> Reply {
    let set = session_id(entity, id).and_then(|id| entity.set_session_state(&id, state));
    Reply::from_result(set.map(|()| None))
}

/// A `get-message-sessions` request: one page of the session listing.
#[derive(Debug)]
pub(super) struct SessionPage {
    skip: usize,
    top: usize,
    updated_after: Option<SystemTime>,
}

impl SessionPage {
    /// Reads `skip`, `top` and `last-updated-time`.
    pub(super) fn parse(body: &Body<Value>) -> SessionPage {
        let field = |name| map_get(body, name);
        let updated_after = match field(key::LAST_UPDATED_TIME) {
            Some(Value::Timestamp(t)) if t.milliseconds() < LIST_ALL_SESSIONS_MS => Some(
                UNIX_EPOCH
                    + Duration::from_millis(u64::try_from(t.milliseconds()).unwrap_or_default()),
            ),
            _ => None,
        };
        SessionPage {
            skip: count(field(key::SKIP)).unwrap_or(0),
            top: count(field(key::TOP)).unwrap_or(usize::MAX),
            updated_after,
        }
    }

    /// The page of session ids and the next `skip`; `204` with
    /// `com.microsoft:session-not-found` for an empty page, as the service answers it
    /// (Python's `list_sessions_op`).
    pub(super) fn apply(self, entity: &Entity) -> Reply {
        let ids = match entity.message_sessions(self.updated_after) {
            Ok(ids) => ids,
            Err(error) => return Reply::error(&error),
        };
        let page: Vec<Value> = ids
            .into_iter()
            .skip(self.skip)
            .take(self.top)
            .map(Value::String)
            .collect();
        if page.is_empty() {
            return Reply::new(
                status::NO_CONTENT,
                "No Content",
                Some(condition::SESSION_NOT_FOUND),
            );
        }
        let next = i32::try_from(self.skip + page.len()).unwrap_or(i32::MAX);
        Reply::ok(Some(map(vec![
            (key::SKIP, Value::Int(next)),
            (key::SESSIONS_IDS, Value::Array(Array(page))),
        ])))
    }
}
