//! Message sessions on the wire: session-filtered receiver links, as the official SDKs expect
//! them (the session operations of `$management` are `nodes::management::sessions`).
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

use sb_amqp::codec::Value;
use sb_amqp::servicebus::link::{
    LOCKED_UNTIL_UTC, OPERATION_TIMEOUT, SESSION_FILTER, TICKS_AT_UNIX_EPOCH,
};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::Source;
use sb_amqp::types::primitives::Symbol;
use sb_amqp::{LinkAnswer, LinkRequest, condition};

use super::links::{EntityLink, Feed, answer_late, deliver_to_client};
use super::wire_error;
use crate::Entity;

/// How long the service waits for a next available session when the client does not say
/// (its default operation timeout; Python waits 65 s for the attach reply).
const DEFAULT_ACCEPT_WAIT: Duration = Duration::from_secs(60);

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
pub(crate) async fn serve(link: EntityLink) -> Result<(), sb_amqp::Error> {
    let EntityLink {
        request,
        entity,
        control,
        stop,
        answer_delay,
    } = link;
    let Some(wanted) = requested_session(&request) else {
        return request
            .reject(refuse(
                condition::NOT_ALLOWED,
                "It is not possible for an entity that requires sessions to create a non-sessionful message receiver.",
            ))
            .await;
    };
    if !entity.requires_session() {
        return request
            .reject(refuse(
                condition::NOT_ALLOWED,
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
                    condition::TIMEOUT,
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
    if !answer_late(answer_delay, &stop).await {
        let _ = entity.release_held_session(&lock);
        return Ok(());
    }
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
        Symbol::from(LOCKED_UNTIL_UTC),
        Value::Long(ticks(lock.locked_until)),
    );
    let mut answer = LinkAnswer::default()
        .initial_delivery_count(0)
        .max_message_size(u64::try_from(entity.max_message_size()).unwrap_or(u64::MAX));
    answer.source = Some(source);
    answer.properties = Some(properties);
    answer
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
