//! Session receivers: a receive link bound to one message session, its session lock and state.
//!
//! On the wire (Python `azure-servicebus` `_pyamqp_transport.py` `create_source` / `on_attach`,
//! JS `@azure/service-bus` `src/session/messageSession.ts`): the attach's source filter
//! `com.microsoft:session-filter` names the session, or is `null` for the next available one;
//! the reply's source filter carries the accepted session id and its link property
//! `com.microsoft:locked-until-utc` the session lock's expiry in .NET ticks. The lock is renewed
//! with `com.microsoft:renew-session-lock` on `$management`; the session's deliveries are
//! settled on their link only (.NET `AmqpReceiver`), and their locks are the session lock.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use sb_amqp::codec::Value;
use sb_amqp::types::primitives::Binary;

use sb_amqp::servicebus::link;
use sb_amqp::servicebus::management::{Operation, key};

use super::ServiceBusError;
use super::amqp_message::timestamp_to_system;
use super::delivery::ServiceBusDelivery;
use super::management::{self, Request};
use super::receive_link::ReceiverInner;
use super::receiver::ServiceBusReceiver;
use super::session_lock::{NO_SESSION, SessionLock, SessionRequest};
use super::settlement_error::settle_error;
use crate::{ReceiveError, SettlementError};

/// Deliveries a session link keeps in flight: the one handled, nothing ahead of it (V1). With
/// a message fetched ahead, an abandon put the abandoned message behind the fetched one unless
/// the caller gave that back first, and that the service then redelivers the abandoned one
/// first is shown only against our emulator; .NET drains a session link's credit after a
/// receive "to ensure FIFO ordering within each session"
/// (`AmqpReceiver.ReceiveMessagesAsyncInternal`), and the prefetch/abandon reordering is known
/// (Azure/azure-sdk-for-java#36478, #30027). A session's messages are handled one at a time, so
/// what one credit costs is a round trip per message of one session.
const SESSION_PIPELINE: u32 = 1;

/// Whether a session attach failed only because no session became available.
fn is_no_session(error: &ReceiveError) -> bool {
    matches!(error, ReceiveError::Transient(ServiceBusError::Timeout(why)) if why == NO_SESSION)
}

// Renewing is a `$management` request on the receiver's link, so it lives with the session
// receiver rather than with the lock, which the receiver and its deliveries share.
impl SessionLock {
    /// `com.microsoft:renew-session-lock`; a lost session link means a lost lock.
    pub(super) async fn renew(
        &self,
        receiver: &ReceiverInner,
    ) -> Result<SystemTime, SettlementError> {
        let request = Request::session(Operation::RenewSessionLock, &self.id);
        let reply = session_management(receiver, request).await?;
        let until = match management::session_reply(&reply, key::EXPIRATION)? {
            Some(Value::Timestamp(ts)) => timestamp_to_system(&ts),
            _ => {
                return Err(SettlementError::Transient(ServiceBusError::Link(
                    "renew-session-lock reply has no expiration".into(),
                )));
            }
        };
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
        Ok(until)
    }
}

/// A `$management` session operation on the receiver's entity.
async fn session_management(
    receiver: &ReceiverInner,
    request: Request,
) -> Result<sb_amqp::AnyMessage, SettlementError> {
    receiver
        .client
        .management(&receiver.entity, request)
        .await
        .map_err(settle_error)
}

/// A receiver holding one message session: its deliveries come in the session's order and
/// their locks are the session lock.
///
/// Made by [`super::ServiceBusClient::accept_next_session`] or
/// [`super::ServiceBusClient::accept_session`]. A detached link is not re-attached: the
/// session lock ended with it, so its receives fail and its deliveries' settlements report the
/// lock lost (the commit of whatever was handled is fenced); accept a session again.
/// [`ServiceBusSessionReceiver::close`] releases the session for other receivers.
#[derive(Debug, Clone)]
pub struct ServiceBusSessionReceiver {
    receiver: ServiceBusReceiver,
    lock: Arc<SessionLock>,
}

impl super::ServiceBusClient {
    /// Accepts the next available session of `entity` (one with messages whose session no
    /// other receiver holds), waiting up to `wait`; `Ok(None)` when none became available.
    ///
    /// # Errors
    /// [`ReceiveError::Transient`] for connection failures; [`ReceiveError::Permanent`] for an
    /// entity that does not require sessions, or refused rights.
    pub async fn accept_next_session(
        &self,
        entity: &str,
        wait: Duration,
    ) -> Result<Option<ServiceBusSessionReceiver>, ReceiveError> {
        let request = SessionRequest {
            session_id: None,
            wait,
        };
        match ServiceBusSessionReceiver::accept(self, entity, &request).await {
            Err(error) if is_no_session(&error) => Ok(None),
            accepted => accepted.map(Some),
        }
    }

    /// Accepts the session `session_id` of `entity` (even one without messages yet).
    ///
    /// # Errors
    /// [`ReceiveError::Transient`] while another receiver holds the session
    /// (`com.microsoft:session-cannot-be-locked`) or the connection fails;
    /// [`ReceiveError::Permanent`] for an entity that does not require sessions.
    pub async fn accept_session(
        &self,
        entity: &str,
        session_id: &str,
    ) -> Result<ServiceBusSessionReceiver, ReceiveError> {
        let request = SessionRequest {
            session_id: Some(session_id.to_owned()),
            wait: Duration::ZERO,
        };
        ServiceBusSessionReceiver::accept(self, entity, &request).await
    }
}

/// .NET ticks as a time (Python `_pyamqp_transport.py` `on_attach`).
fn from_ticks(ticks: i64) -> SystemTime {
    let hundred_ns = u64::try_from(ticks.saturating_sub(link::TICKS_AT_UNIX_EPOCH)).unwrap_or(0);
    UNIX_EPOCH + Duration::from_nanos(hundred_ns.saturating_mul(100))
}

impl ServiceBusSessionReceiver {
    async fn accept(
        client: &super::ServiceBusClient,
        entity: &str,
        request: &SessionRequest,
    ) -> Result<Self, ReceiveError> {
        // Pipelined by one: the session's next message may be on its way while one is handled
        // (a caller still takes them one at a time, in order), so a broker far away costs
        // a round trip per message less.
        let receiver =
            ServiceBusReceiver::new(client.clone(), entity, 0).with_capacity(SESSION_PIPELINE);
        let link = match receiver.attach_with(Some(request)).await {
            // Refused as unauthorized (the service's view of the token expired, e.g. after it
            // detached the previous session link for that): once more with a fresh token. A
            // receiver of its own per session would otherwise forget that it must refresh.
            Err(ReceiveError::Transient(_))
                if receiver.inner().reauthorize.load(Ordering::Acquire) =>
            {
                receiver.attach_with(Some(request)).await?
            }
            attached => attached?,
        };
        let remote = link.receiver.remote_attach();
        let id = remote
            .source
            .as_ref()
            .and_then(|s| s.filter.as_ref())
            .and_then(|f| f.iter().find(|(k, _)| k.0 == link::SESSION_FILTER))
            .and_then(|(_, v)| match v {
                Value::String(s) => Some(s.clone()),
                Value::Symbol(s) => Some(s.0.clone()),
                _ => None,
            })
            .or_else(|| request.session_id.clone());
        let Some(id) = id else {
            // The service always names the session it locked; without it nothing can be
            // renewed or settled safely.
            let _ = link.receiver.detach().await;
            return Err(ReceiveError::Transient(ServiceBusError::Link(
                "the session attach reply names no session".into(),
            )));
        };
        let locked_until = remote
            .properties
            .as_ref()
            .and_then(|p| p.iter().find(|(k, _)| k.0 == link::LOCKED_UNTIL_UTC))
            .and_then(|(_, v)| match v {
                Value::Long(t) => Some(from_ticks(*t)),
                Value::Timestamp(ts) => Some(timestamp_to_system(ts)),
                _ => None,
            })
            // Unknown: the renewal margin then renews at once.
            .unwrap_or_else(|| client.now());
        let lock = Arc::new(SessionLock {
            id,
            locked_until: StdMutex::new(locked_until),
        });
        let inner = receiver.inner().clone();
        let _ = inner.session.set(lock.clone());
        inner.set_current(&link);
        *inner.link.lock().await = Some(link);
        Ok(ServiceBusSessionReceiver { receiver, lock })
    }

    /// The accepted session's id.
    pub fn session_id(&self) -> &str {
        &self.lock.id
    }

    /// When the session lock runs out unless renewed, as last reported by the service.
    pub fn locked_until(&self) -> SystemTime {
        self.lock.locked_until()
    }

    /// The receiver of the session's link (its entity, its telemetry names).
    pub fn receiver(&self) -> &ServiceBusReceiver {
        &self.receiver
    }

    /// True while the session link is attached: false once the session is lost or closed.
    pub fn is_attached(&self) -> bool {
        self.receiver.is_attached()
    }

    /// Renews the session lock (`com.microsoft:renew-session-lock`); returns the new expiry.
    ///
    /// # Errors
    /// [`SettlementError::LockLost`] once the session lock expired or the session was released.
    pub async fn renew_session_lock(&self) -> Result<SystemTime, SettlementError> {
        self.lock.renew(self.receiver.inner()).await
    }

    /// The session state (`com.microsoft:get-session-state`); `None` when none was set.
    ///
    /// # Errors
    /// [`SettlementError::LockLost`] without the session lock.
    pub async fn state(&self) -> Result<Option<Vec<u8>>, SettlementError> {
        let reply = self
            .management(self.request(Operation::GetSessionState))
            .await?;
        Ok(
            match management::session_reply(&reply, key::SESSION_STATE)? {
                Some(Value::Binary(b)) => Some(b.to_vec()),
                _ => None,
            },
        )
    }

    /// Sets the session state (`com.microsoft:set-session-state`); `None` clears it.
    ///
    /// # Errors
    /// [`SettlementError::LockLost`] without the session lock.
    pub async fn set_state(&self, state: Option<&[u8]>) -> Result<(), SettlementError> {
        let value = state.map_or(Value::Null, |b| Value::Binary(Binary::from(b.to_vec())));
        let request = self
            .request(Operation::SetSessionState)
            .entry(key::SESSION_STATE, value);
        let reply = self.management(request).await?;
        management::session_reply(&reply, key::SESSION_STATE).map(drop)
    }

    /// `operation` on this session.
    fn request(&self, operation: Operation) -> Request {
        Request::session(operation, &self.lock.id)
    }

    async fn management(&self, request: Request) -> Result<sb_amqp::AnyMessage, SettlementError> {
        session_management(self.receiver.inner(), request).await
    }

    /// The session's next delivery, waiting at most `wait`; `Ok(None)` when the session
    /// stayed quiet that long.
    ///
    /// # Errors
    /// [`ReceiveError::Transient`] once the session link is gone (the session lock with it).
    pub async fn receive(
        &self,
        wait: Duration,
    ) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        match tokio::time::timeout(wait, self.receiver.receive_message()).await {
            Ok(received) => received,
            Err(_) => Ok(None),
        }
    }

    /// Releases the session for other receivers: gives back what was received but not
    /// handed out, then detaches.
    pub async fn close(&self) {
        self.receiver.close().await;
    }
}

impl ServiceBusSessionReceiver {
    /// Gives back the session's deliveries received ahead of the one in hand (released, no
    /// delivery counted), keeping the session: after an abandon, the abandoned message must
    /// come again before them.
    pub async fn give_back_ahead(&self) {
        self.receiver.withdraw().await;
    }
}

/// The sessions of one session-enabled queue or subscription: each
/// [`ServiceBusSessionSource::accept_next`] accepts the next session no other receiver holds.
#[derive(Debug, Clone)]
pub struct ServiceBusSessionSource {
    client: super::ServiceBusClient,
    entity: String,
    wait: Duration,
    names: crate::EntityNames,
}

impl ServiceBusSessionSource {
    /// How long an accept waits for a session by default: 60 s, .NET's
    /// `ServiceBusRetryOptions.TryTimeout` default, which its session processor passes as the
    /// accept's operation timeout (azure-sdk-for-net `src/Primitives/ServiceBusRetryOptions.cs`,
    /// `src/Processor/SessionReceiverManager.cs`). Shorter waits churn links on idle entities:
    /// each expired accept is a detached link and a new attach.
    pub const ACCEPT_WAIT: Duration = Duration::from_secs(60);

    /// Sessions of `entity`; each accept waits up to [`Self::ACCEPT_WAIT`] for a session to
    /// become available.
    pub fn new(client: super::ServiceBusClient, entity: &str) -> Self {
        let names = client.receiver(entity, 0).names().clone();
        ServiceBusSessionSource {
            client,
            entity: entity.to_owned(),
            wait: Self::ACCEPT_WAIT,
            names,
        }
    }

    /// Each accept waits up to `wait` for a session to become available.
    #[must_use]
    pub fn with_accept_wait(mut self, wait: Duration) -> Self {
        self.wait = wait;
        self
    }
}

impl ServiceBusSessionSource {
    /// The entity as telemetry names it.
    pub fn names(&self) -> &crate::EntityNames {
        &self.names
    }

    /// Accepts the next available session, waiting up to the accept wait; `Ok(None)` when
    /// none became available meanwhile.
    ///
    /// # Errors
    /// As [`super::ServiceBusClient::accept_next_session`].
    pub async fn accept_next(&self) -> Result<Option<ServiceBusSessionReceiver>, ReceiveError> {
        self.client
            .accept_next_session(&self.entity, self.wait)
            .await
    }
}

#[cfg(test)]
mod tests {
    use sb_amqp::servicebus::condition;

    use super::super::session_lock::session_refusal;
    use super::*;

    /// Issue 29 item 8: a pending next-session accept the service closes without an error is
    /// "no session yet" (a session processor accepts again at once), not a failure that backs off.
    #[test]
    fn an_accept_closed_without_an_error_is_no_session_yet() {
        for closed in [
            sb_amqp::Error::AttachRefused(None),
            sb_amqp::Error::LinkDetached(None),
        ] {
            let refusal = session_refusal(&closed);
            assert!(
                refusal.as_ref().is_some_and(is_no_session),
                "{closed}: {refusal:?}"
            );
        }
        // An error the service names still counts as a failure of its own.
        let busy = sb_amqp::Error::AttachRefused(Some(sb_amqp::AmqpError::new(
            condition::SERVER_BUSY,
            None,
        )));
        assert!(session_refusal(&busy).is_none());
    }
}
