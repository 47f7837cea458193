//! Message sessions on the wire: session-filtered receiver links and the session operations of
//! `$management`, as the official SDKs expect them.
//!
//! What the SDKs send and read (the sources this follows):
//! - Python `azure-servicebus` 7.15 `_common/constants.py` (`com.microsoft:session-filter`,
//!   `com.microsoft:locked-until-utc`, the `session-id` / `session-state` / `expiration` /
//!   `sessions-ids` map keys) and `_transport/_pyamqp_transport.py` (`create_source` puts the
//!   filter as a plain string, `None` for the next available session; `on_attach` reads the
//!   session id from the reply's source filter and `locked-until-utc` from the reply's link
//!   properties as .NET ticks; `com.microsoft:timeout` in the attach's link properties bounds
//!   the wait for a next available session).
//! - JS `@azure/service-bus` `src/session/messageSession.ts` (the same filter and property).
//! - `com.microsoft:session-cannot-be-locked` when another receiver holds the session,
//!   `com.microsoft:timeout` when no session becomes available in time,
//!   `com.microsoft:session-lock-lost` once the session lock expired (Python's
//!   `_ERROR_CODE_TO_ERROR_MAPPING`).
//! - A plain receiver on a session entity: the service refuses it with "It is not possible for
//!   an entity that requires sessions to create a non-sessionful message receiver" (seen in
//!   Azure/azure-service-bus#326, paolosalvatori/ServiceBusExplorer#136), `amqp:not-allowed`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::Array;
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::{Body, Source};
use sb_amqp::types::primitives::{Binary, Symbol};
use sb_amqp::{LinkAnswer, LinkRequest};
use tokio_util::sync::CancellationToken;

use super::codec::to_timestamp;
use super::control::LinkControl;
use super::links::{Feed, deliver_to_client};
use super::nodes::{Reply, count, error_reply, map, map_get};
use super::wire_error;
use crate::{Entity, Error};

const SESSION_FILTER: &str = "com.microsoft:session-filter";
const LOCKED_UNTIL: &str = "com.microsoft:locked-until-utc";
const OPERATION_TIMEOUT: &str = "com.microsoft:timeout";
/// How long the service waits for a next available session when the client does not say
/// (its default operation timeout; Python waits 65 s for the attach reply).
const DEFAULT_ACCEPT_WAIT: Duration = Duration::from_secs(60);
/// .NET ticks (100 ns) from 0001-01-01 to the Unix epoch (Python's `DATETIMEOFFSET_EPOCH`).
const TICKS_AT_UNIX_EPOCH: i64 = 621_355_968_000_000_000;

/// What the client's attach asks for: `None` without a session filter, `Some(None)` for the
/// next available session, `Some(Some(id))` for a named one.
fn requested_session(request: &LinkRequest) -> Option<Option<String>> {
    let filter = request.remote_attach().source.as_ref()?.filter.as_ref()?;
    let (_, value) = filter.iter().find(|(k, _)| k.0 == SESSION_FILTER)?;
    Some(match value {
        Value::String(s) => Some(s.clone()),
        Value::Symbol(s) => Some(s.0.clone()),
        Value::Described(d) => match &d.value {
            Value::String(s) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    })
}

/// Whether this link is this module's: a receiving link that asks for a session or reads from
/// a session entity (which refuses it without one).
pub(crate) fn is_session_link(request: &LinkRequest, entity: &Entity) -> bool {
    !request.is_peer_sender() && (entity.requires_session() || requested_session(request).is_some())
}

/// The client's `com.microsoft:timeout` link property (milliseconds).
fn accept_wait(request: &LinkRequest) -> Duration {
    request
        .remote_attach()
        .properties
        .as_ref()
        .and_then(|p| p.iter().find(|(k, _)| k.0 == OPERATION_TIMEOUT))
        .and_then(|(_, v)| match v {
            Value::Uint(ms) => Some(u64::from(*ms)),
            Value::Ulong(ms) => Some(*ms),
            Value::Int(ms) => u64::try_from(*ms).ok(),
            Value::Long(ms) => u64::try_from(*ms).ok(),
            _ => None,
        })
        .map_or(DEFAULT_ACCEPT_WAIT, Duration::from_millis)
}

fn ticks(time: SystemTime) -> i64 {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let hundred_ns = i64::try_from(since.as_nanos() / 100).unwrap_or(i64::MAX);
    TICKS_AT_UNIX_EPOCH.saturating_add(hundred_ns)
}

fn refuse(condition: &str, description: &str) -> sb_amqp::AmqpError {
    wire_error(condition, Some(description.to_owned()))
}

/// Serves a session receiver link: locks the session, answers the attach with its id and lock
/// expiry, delivers its messages in order, and releases the session when the link ends.
pub(crate) async fn serve(
    request: LinkRequest,
    entity: Entity,
    control: LinkControl,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let Some(wanted) = requested_session(&request) else {
        return request
            .reject(refuse(
                sb_amqp::condition::NOT_ALLOWED,
                "It is not possible for an entity that requires sessions to create a non-sessionful message receiver.",
            ))
            .await;
    };
    if !entity.requires_session() {
        return request
            .reject(refuse(
                sb_amqp::condition::NOT_ALLOWED,
                "A sessionful message receiver cannot be created on an entity that does not require sessions.",
            ))
            .await;
    }
    let wait = accept_wait(&request);
    let accepted = tokio::select! {
        () = stop.cancelled() => return Ok(()),
        accepted = entity.accept_session(wanted.as_deref(), Some(wait)) => accepted,
    };
    let lock = match accepted {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            return request
                .reject(refuse(
                    OPERATION_TIMEOUT,
                    "no session with messages became available within the operation timeout",
                ))
                .await;
        }
        Err(error) => {
            return request
                .reject(wire_error(error.condition(), Some(error.to_string())))
                .await;
        }
    };
    control.claim_session(&lock.session_id);
    let answer = answer(&request, &entity, &lock);
    let feed = Feed::Session(lock);
    let served = deliver_to_client(request, &entity, answer, &feed, control, stop).await;
    // The session is free for the next receiver once this link is gone, unless this link lost
    // it meanwhile: then it belongs to a newer receiver.
    if let Feed::Session(lock) = &feed {
        let _ = entity.release_held_session(lock);
    }
    served
}

fn answer(request: &LinkRequest, entity: &Entity, lock: &crate::SessionLock) -> LinkAnswer {
    let mut source: Source = request
        .remote_attach()
        .source
        .as_deref()
        .cloned()
        .unwrap_or_default();
    let mut filter = source.filter.take().unwrap_or_default();
    filter.insert(
        Symbol::from(SESSION_FILTER),
        Value::String(lock.session_id.clone()),
    );
    source.filter = Some(filter);
    let mut properties = Fields::default();
    properties.insert(
        Symbol::from(LOCKED_UNTIL),
        Value::Long(ticks(lock.locked_until)),
    );
    let mut answer = LinkAnswer::default()
        .initial_delivery_count(0)
        .max_message_size(u64::try_from(entity.max_message_size()).unwrap_or(u64::MAX));
    answer.source = Some(source);
    answer.properties = Some(properties);
    answer
}

/// The session id of a `$management` request (`session-id`).
fn session_id(entity: &Entity, body: Option<&Value>) -> Result<String, Error> {
    match body {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Symbol(s)) => Ok(s.0.clone()),
        _ => Err(Error::NotAllowed {
            operation: "session operation",
            entity: entity.path().to_owned(),
            reason: "the request needs a session-id",
        }),
    }
}

/// `last-updated-time` at or past this (.NET `DateTime.MaxValue` in milliseconds, as Python's
/// `_session_browser.py` sends it) asks for the default listing: sessions with messages or
/// state.
const LIST_ALL_SESSIONS_MS: i64 = 253_402_300_800_000;

/// The session operations of `$management`; `None` for any other operation.
///
/// Request and reply keys as Python's `_servicebus_session.py`, `_session_browser.py` and
/// `mgmt_handlers.py` use them (`session-id`, `session-state`, `expiration`, `last-updated-time`,
/// `skip`, `top`, `sessions-ids`).
pub(crate) fn management(operation: &str, entity: &Entity, body: &Body<Value>) -> Option<Reply> {
    let field = |name: &str| map_get(body, name);
    let id = || session_id(entity, field("session-id"));
    let result = match operation {
        "com.microsoft:renew-session-lock" => id()
            .and_then(|id| entity.renew_session_lock(&id))
            .map(|until| {
                Some(map(vec![(
                    "expiration",
                    Value::Timestamp(to_timestamp(until)),
                )]))
            }),
        "com.microsoft:get-session-state" => {
            id().and_then(|id| entity.session_state(&id)).map(|state| {
                let state = state.map_or(Value::Null, |b| Value::Binary(Binary::from(b.to_vec())));
                Some(map(vec![("session-state", state)]))
            })
        }
        "com.microsoft:set-session-state" => id().and_then(|id| {
            let state = match field("session-state") {
                Some(Value::Binary(b)) => Some(Bytes::from(b.to_vec())),
                _ => None,
            };
            entity.set_session_state(&id, state).map(|()| None)
        }),
        "com.microsoft:get-message-sessions" => return Some(message_sessions(entity, &field)),
        _ => return None,
    };
    Some(result.map_or_else(|e| error_reply(&e), |v| (200, "OK".into(), None, v)))
}

fn message_sessions<'a>(entity: &Entity, field: &impl Fn(&str) -> Option<&'a Value>) -> Reply {
    let number = |name: &str| count(field(name));
    let skip = number("skip").unwrap_or(0);
    let top = number("top").unwrap_or(usize::MAX);
    let updated_after = match field("last-updated-time") {
        Some(Value::Timestamp(t)) if t.milliseconds() < LIST_ALL_SESSIONS_MS => Some(
            UNIX_EPOCH + Duration::from_millis(u64::try_from(t.milliseconds()).unwrap_or_default()),
        ),
        _ => None,
    };
    let ids = match entity.message_sessions(updated_after) {
        Ok(ids) => ids,
        Err(error) => return error_reply(&error),
    };
    let page: Vec<Value> = ids
        .into_iter()
        .skip(skip)
        .take(top)
        .map(Value::String)
        .collect();
    if page.is_empty() {
        // As the service answers an empty page (Python's `list_sessions_op`).
        return (
            204,
            "No Content".into(),
            Some("com.microsoft:session-not-found"),
            None,
        );
    }
    let next = i32::try_from(skip + page.len()).unwrap_or(i32::MAX);
    (
        200,
        "OK".into(),
        None,
        Some(map(vec![
            ("skip", Value::Int(next)),
            ("sessions-ids", Value::Array(Array(page))),
        ])),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locked_until_is_in_dotnet_ticks() {
        // Python's on_attach: (ticks - DATETIMEOFFSET_EPOCH) / 10_000_000 = Unix seconds.
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!((ticks(t) - TICKS_AT_UNIX_EPOCH) / 10_000_000, 1_700_000_000);
    }
}
