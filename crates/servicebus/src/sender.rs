//! [`ServiceBusSender`]: sends to one entity, awaiting the broker's outcome, with typed
//! rejections ([`SendError`] hands the message back) and scheduled enqueue times.

use std::sync::Arc;
use std::time::Duration;

use sb_amqp::{Outcome, Sendable, SenderOptions, unique_name};
use tokio::sync::Mutex;

use tracing::Instrument as _;

use super::amqp_message::to_amqp;
use super::error::{Recovery, is_busy_condition, is_server_busy, recovery};
use super::telemetry::{EntityTelemetry, Kind};
use super::{ServiceBusClient, ServiceBusError};
use crate::names::{attr, error, span};
use crate::propagation::stamp;
use crate::{SendOptions, ServiceBusMessage};

/// How long a send waits for the broker's outcome (Service Bus's own server timeout is 30 s).
const SEND_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a send failed. The message is handed back.
#[derive(Debug, thiserror::Error)]
#[error("send to {entity} failed: {error}")]
pub struct SendError {
    /// The entity.
    pub entity: String,
    /// What went wrong.
    pub error: SendErrorKind,
    /// The message, to retry or record.
    pub message: Box<ServiceBusMessage>,
}

/// The kinds of send failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendErrorKind {
    /// Larger than the entity's maximum message size. Permanent.
    #[error("message size exceeded: {0}")]
    SizeExceeded(String),
    /// The entity does not exist. Permanent.
    #[error("entity not found: {0}")]
    NotFound(String),
    /// The namespace is throttling. Transient.
    #[error("server busy: {0}")]
    Throttled(String),
    /// Any other refusal.
    #[error("refused {condition}: {description}")]
    Refused {
        /// AMQP condition.
        condition: String,
        /// Description.
        description: String,
    },
    /// Connection failure: the outcome is unknown (the message may have been enqueued).
    #[error("connection failed: {0}")]
    Connection(String),
}

impl SendErrorKind {
    /// True when retrying may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SendErrorKind::Throttled(_) | SendErrorKind::Connection(_)
        )
    }

    /// The bounded `error.type` telemetry reports for this failure.
    pub fn error_type(&self) -> &'static str {
        match self {
            SendErrorKind::SizeExceeded(_) => error::SIZE_EXCEEDED,
            SendErrorKind::NotFound(_) => error::NOT_FOUND,
            SendErrorKind::Throttled(_) => error::SERVER_BUSY,
            SendErrorKind::Refused { .. } => error::REFUSED,
            SendErrorKind::Connection(_) => error::TRANSIENT,
        }
    }
}

/// A sender bound to one entity that awaits the broker's `accepted` for every message (the
/// SDKs' `ServiceBusSender`). A send the service's detach interrupted is tried again on a
/// re-attached link, as the client's [`RetryOptions`](crate::RetryOptions) say.
#[derive(Debug, Clone)]
pub struct ServiceBusSender {
    inner: Arc<SenderInner>,
}

#[derive(Debug)]
struct SenderInner {
    client: ServiceBusClient,
    entity: String,
    /// Held only to attach or swap the link: sends share it, so several can await the broker's
    /// answer at once (the relay sends concurrently).
    link: Mutex<Option<Arc<sb_amqp::Sender>>>,
    /// Links attached so far ([`ServiceBusSender::links_attached`]).
    attached: std::sync::atomic::AtomicU64,
    telemetry: EntityTelemetry,
}

// Made here rather than in `client`: the sender holds a client to reach its connection, so the
// client does not import its links (no import circle between the two).
impl ServiceBusClient {
    /// A sender to `entity`.
    pub fn sender(&self, entity: &str) -> ServiceBusSender {
        ServiceBusSender::new(self.clone(), entity)
    }
}

impl ServiceBusSender {
    pub(crate) fn new(client: ServiceBusClient, entity: &str) -> Self {
        ServiceBusSender {
            inner: Arc::new(SenderInner {
                telemetry: EntityTelemetry::new(entity, client.host()),
                client,
                entity: entity.to_owned(),
                link: Mutex::new(None),
                attached: std::sync::atomic::AtomicU64::new(0),
            }),
        }
    }

    /// How many links this sender has attached so far: 1 after its first send, one more each
    /// time it replaced a link the service detached (idle for 10 minutes, its token expired)
    /// or lost with its connection. `sb-inbox verify` reads it to tell a sender that survived
    /// a detach from one that was never detached.
    pub fn links_attached(&self) -> u64 {
        self.inner
            .attached
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sends one message and waits for the broker to accept it.
    ///
    /// # Errors
    /// [`SendError`] with the message handed back.
    pub async fn send(&self, message: impl Into<ServiceBusMessage>) -> Result<(), SendError> {
        self.send_with(message, &SendOptions::default()).await
    }

    /// As [`ServiceBusSender::send`], with a time-to-live or a scheduled enqueue time.
    ///
    /// Under a `send {entity}` producer span whose context the message carries as
    /// `traceparent` and `Diagnostic-Id` (unless it carries a `traceparent` already).
    ///
    /// # Errors
    /// [`SendError`] with the message handed back.
    pub async fn send_with(
        &self,
        message: impl Into<ServiceBusMessage>,
        options: &SendOptions,
    ) -> Result<(), SendError> {
        let mut message = message.into();
        let operation = self.inner.telemetry.start(span::SEND, Kind::Send);
        if let Some(id) = &message.message_id {
            operation.span.record(attr::MESSAGE_ID, id.as_str());
        }
        stamp(&mut message.application_properties, &operation.span);
        let sent = self
            .send_now(message, options)
            .instrument(operation.span.clone())
            .await;
        operation.end(sent.as_ref().err().map(|failed| failed.error.error_type()));
        sent
    }

    /// Sends `message`: encodes it once, then per attempt waits out a busy client, takes the
    /// link (attaching one), transfers and reads the broker's outcome; a failed link is
    /// forgotten and the send tried again after a pause while the retry policy allows.
    async fn send_now(
        &self,
        message: ServiceBusMessage,
        options: &SendOptions,
    ) -> Result<(), SendError> {
        let sendable = match Sendable::message(&to_amqp(&message, options)) {
            Ok(sendable) => sendable,
            Err(error) => {
                let refused = SendErrorKind::Refused {
                    condition: "encode".into(),
                    description: error.to_string(),
                };
                return Err(self.fail(refused, message));
            }
        };
        // The link is re-attached (on the same connection) after the service detached it, idle
        // or busy, and the send tried again: the SDKs' senders retry the same way (Go
        // `azservicebus/sender.go` `links.Retry`). A send whose outcome was lost may thus be
        // enqueued twice; message ids let consumers recognise the copy.
        let mut retry = SendRetry::new(self.inner.client.retry());
        loop {
            // After a busy answer every operation of the client waits (.NET
            // `ServiceBusRetryPolicy`'s client-wide server-busy state).
            self.inner.client.busy().wait_out().await;
            let sender = match self.usable_link(&mut retry).await {
                Ok(Some(sender)) => sender,
                Ok(None) => continue,
                Err(error) => return Err(self.fail(kind_of(&error), message)),
            };
            let error = match self.transfer(&sender, &sendable).await {
                Ok(answered) => return answered.map_err(|kind| self.fail(kind, message)),
                Err(error) => error,
            };
            self.forget_failed_link(&sender, &error).await;
            if !retry.after_link_failure(&error) {
                let kind = kind_of(&ServiceBusError::from_amqp(&error));
                return Err(self.fail(kind, message));
            }
            let delay = retry.backoff.next_delay();
            tracing::warn!(entity = %self.inner.entity, %error, ?delay, "Send link failed; re-attaching.");
            tokio::time::sleep(delay).await;
        }
    }

    /// A failed send, the message handed back.
    fn fail(&self, error: SendErrorKind, message: ServiceBusMessage) -> SendError {
        SendError {
            entity: self.inner.entity.clone(),
            error,
            message: Box::new(message),
        }
    }

    /// The link to send on: the cached one while it is attached, else a new one. `Ok(None)`
    /// when the attach failed in a way worth another attempt (after its pause).
    async fn usable_link(
        &self,
        retry: &mut SendRetry,
    ) -> Result<Option<Arc<sb_amqp::Sender>>, ServiceBusError> {
        let mut guard = self.inner.link.lock().await;
        // A link the service detached meanwhile (idle for 10 minutes, say) is replaced
        // before this send, not after a failed one and a pause: azure-amqp reuses a cached
        // link only while it is open (`FaultTolerantAmqpObject.TryGetOpenedObject`), pyamqp
        // checks the link's state before every transfer (`SenderLink._check_if_closed`).
        if guard.as_ref().is_some_and(|link| !link.is_attached()) {
            tracing::debug!(entity = %self.inner.entity, "Send link detached meanwhile; attaching a new one.");
            *guard = None;
        }
        if let Some(link) = guard.as_ref() {
            return Ok(Some(link.clone()));
        }
        match self.attach(retry.fresh).await {
            Ok(link) => {
                let link = Arc::new(link);
                self.inner
                    .attached
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                *guard = Some(link.clone());
                Ok(Some(link))
            }
            // The token put on this connection ran out before its refresh (the service
            // may honour less than its lifetime): once more with a fresh one.
            Err(ServiceBusError::Broker { ref condition, .. })
                if !retry.fresh && condition == sb_amqp::condition::UNAUTHORIZED_ACCESS =>
            {
                retry.fresh = true;
                Ok(None)
            }
            // The connection or session went under us (a drop, an ended session):
            // the next attempt sets up anew.
            Err(error) if error.is_transient() && retry.attempt < retry.attempts => {
                retry.attempt += 1;
                let delay = retry.backoff.next_delay();
                tracing::warn!(entity = %self.inner.entity, %error, ?delay, "Send link attach failed; retrying.");
                tokio::time::sleep(delay).await;
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Transfers on `sender` and reads the broker's answer: `Ok` with the send's result (an
    /// outcome, an unanswered send, a message too large for the link), `Err` when the link
    /// failed and another attempt may help.
    async fn transfer(
        &self,
        sender: &sb_amqp::Sender,
        sendable: &Sendable,
    ) -> Result<Result<(), SendErrorKind>, sb_amqp::Error> {
        let Ok(sent) = tokio::time::timeout(SEND_TIMEOUT, sender.send(sendable.clone())).await
        else {
            return Ok(Err(SendErrorKind::Connection(
                "the broker did not answer in time; the message may have been enqueued".into(),
            )));
        };
        match sent {
            Ok(outcome) => {
                if let Outcome::Rejected(Some(e)) = &outcome
                    && is_server_busy(&e.condition)
                {
                    self.inner.client.busy().set();
                }
                Ok(outcome_result(outcome))
            }
            // The engine's own size check: the link is fine, the message is not.
            Err(error) if error.condition() == Some(sb_amqp::condition::MESSAGE_SIZE_EXCEEDED) => {
                Ok(Err(SendErrorKind::SizeExceeded(error.to_string())))
            }
            Err(error) => Err(error),
        }
    }

    /// Tells the client of a link failure and forgets the failed link (only that one: a
    /// concurrent send may have re-attached already).
    async fn forget_failed_link(&self, sender: &Arc<sb_amqp::Sender>, error: &sb_amqp::Error) {
        let client = &self.inner.client;
        client.observe(error);
        if error.condition().is_some_and(is_server_busy) {
            client.busy().set();
        }
        let mut guard = self.inner.link.lock().await;
        if guard.as_ref().is_some_and(|link| Arc::ptr_eq(link, sender)) {
            *guard = None;
        }
    }

    async fn attach(&self, fresh: bool) -> Result<sb_amqp::Sender, ServiceBusError> {
        let client = &self.inner.client;
        let conn = client.connection().await?;
        client.authorize(&conn, &self.inner.entity, fresh).await?;
        let options = SenderOptions::new(
            unique_name("sb-servicebus-sender"),
            self.inner.entity.clone(),
        );
        tokio::time::timeout(client.timeout(), conn.session.attach_sender(options))
            .await
            .map_err(|_| {
                ServiceBusError::Connection("the service did not answer the attach in time".into())
            })?
            .inspect_err(|e| {
                conn.observe(e);
                if e.condition().is_some_and(is_server_busy) {
                    client.busy().set();
                }
            })
            .map_err(|e| match (recovery(&e), e.amqp_error()) {
                // Refused for want of a valid token (a `$cbs` refusal is `Unauthorized`).
                (Recovery::Reauthorize, Some(error)) => ServiceBusError::Broker {
                    condition: error.condition.clone(),
                    description: error.description.clone().unwrap_or_default(),
                },
                _ => ServiceBusError::from_amqp(&e),
            })
    }
}

/// The broker's outcome of a send.
fn outcome_result(outcome: Outcome) -> Result<(), SendErrorKind> {
    match outcome {
        Outcome::Accepted => Ok(()),
        Outcome::Rejected(Some(error)) => {
            let description = error.description.clone().unwrap_or_default();
            Err(match error.condition.as_str() {
                sb_amqp::condition::MESSAGE_SIZE_EXCEEDED => {
                    SendErrorKind::SizeExceeded(description)
                }
                sb_amqp::condition::NOT_FOUND => SendErrorKind::NotFound(description),
                condition if is_busy_condition(condition) => SendErrorKind::Throttled(description),
                condition => SendErrorKind::Refused {
                    condition: condition.to_owned(),
                    description,
                },
            })
        }
        other => Err(SendErrorKind::Refused {
            condition: format!("{other:?}"),
            description: "not accepted".into(),
        }),
    }
}

fn kind_of(error: &ServiceBusError) -> SendErrorKind {
    match error {
        ServiceBusError::NotFound(d) => SendErrorKind::NotFound(d.clone()),
        // Refused until the credential or its role assignment changes: not a connection problem.
        ServiceBusError::Unauthorized { .. } => SendErrorKind::Refused {
            condition: sb_amqp::condition::UNAUTHORIZED_ACCESS.to_owned(),
            description: error.to_string(),
        },
        ServiceBusError::Broker { condition, .. } if is_busy_condition(condition) => {
            SendErrorKind::Throttled(error.to_string())
        }
        // A link the service detached (and kept detaching): worth trying again later.
        ServiceBusError::Broker { condition, .. }
            if error.is_transient() && condition != sb_amqp::condition::UNAUTHORIZED_ACCESS =>
        {
            SendErrorKind::Connection(error.to_string())
        }
        ServiceBusError::Broker {
            condition,
            description,
        } => SendErrorKind::Refused {
            condition: condition.clone(),
            description: description.clone(),
        },
        other => SendErrorKind::Connection(other.to_string()),
    }
}

/// Where a send stands in its retries: the attempt, its pauses, and whether the token was put
/// afresh already.
struct SendRetry {
    fresh: bool,
    backoff: crate::retry::Backoff,
    attempt: u32,
    attempts: u32,
}

impl SendRetry {
    fn new(options: &crate::RetryOptions) -> Self {
        SendRetry {
            fresh: false,
            backoff: options.backoff(),
            attempt: 1,
            attempts: options.tries(),
        }
    }

    /// After a failed link: whether another attempt is due (an unauthorized one once, with a
    /// fresh token; a fatal one never), counting it.
    fn after_link_failure(&mut self, error: &sb_amqp::Error) -> bool {
        let retry = match recovery(error) {
            Recovery::Link | Recovery::Connection => true,
            Recovery::Reauthorize => !std::mem::replace(&mut self.fresh, true),
            Recovery::Fatal => false,
        };
        if !retry || self.attempt >= self.attempts {
            return false;
        }
        self.attempt += 1;
        true
    }
}
