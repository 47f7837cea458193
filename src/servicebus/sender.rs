use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use sb_amqp::{Outcome, Sendable, SenderOptions, unique_name};
use tokio::sync::Mutex;

use tracing::Instrument as _;

use super::amqp_message::to_amqp;
use super::telemetry::{EntityTelemetry, Kind};
use super::{ServiceBusClient, ServiceBusError};
use crate::telemetry::names::{attr, error, span};
use crate::telemetry::propagation::stamp;
use crate::{Message, SendFailure, Sender};

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
    pub message: Box<Message>,
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

/// Per-message send options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendOptions {
    /// The message's time-to-live (the entity's default when `None`).
    pub time_to_live: Option<Duration>,
    /// Keep the message invisible until this time (Service Bus scheduled messages).
    pub scheduled_enqueue_time: Option<SystemTime>,
}

impl SendOptions {
    /// Options that schedule the message for `at`.
    pub fn scheduled(at: SystemTime) -> Self {
        SendOptions {
            time_to_live: None,
            scheduled_enqueue_time: Some(at),
        }
    }
}

/// A sender that awaits the broker's `accepted` for every message.
#[derive(Debug, Clone)]
pub struct ServiceBusSender {
    inner: Arc<SenderInner>,
}

#[derive(Debug)]
struct SenderInner {
    client: ServiceBusClient,
    entity: String,
    link: Mutex<Option<(u64, sb_amqp::Sender)>>,
    telemetry: EntityTelemetry,
}

impl ServiceBusSender {
    pub(crate) fn new(client: ServiceBusClient, entity: &str) -> Self {
        ServiceBusSender {
            inner: Arc::new(SenderInner {
                telemetry: EntityTelemetry::new(entity, client.host()),
                client,
                entity: entity.to_owned(),
                link: Mutex::new(None),
            }),
        }
    }

    /// Sends one message and waits for the broker to accept it.
    ///
    /// # Errors
    /// [`SendError`] with the message handed back.
    pub async fn send(&self, message: Message) -> Result<(), SendError> {
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
        mut message: Message,
        options: &SendOptions,
    ) -> Result<(), SendError> {
        let operation = self.inner.telemetry.start(span::SEND, Kind::Send);
        if let Some(id) = &message.message_id {
            operation.span.record(attr::MESSAGE_ID, id.as_str());
        }
        stamp(&mut message, &operation.span);
        let sent = self
            .send_now(message, options)
            .instrument(operation.span.clone())
            .await;
        operation.end(sent.as_ref().err().map(|failed| failed.error.error_type()));
        sent
    }

    async fn send_now(&self, message: Message, options: &SendOptions) -> Result<(), SendError> {
        let fail = |error: SendErrorKind, message: Message| SendError {
            entity: self.inner.entity.clone(),
            error,
            message: Box::new(message),
        };
        let sendable = match Sendable::message(&to_amqp(&message, options)) {
            Ok(sendable) => sendable,
            Err(error) => {
                return Err(fail(
                    SendErrorKind::Refused {
                        condition: "encode".into(),
                        description: error.to_string(),
                    },
                    message,
                ));
            }
        };
        let mut guard = self.inner.link.lock().await;
        if guard.is_none() {
            match self.attach().await {
                Ok(link) => *guard = Some(link),
                Err(error) => return Err(fail(kind_of(&error), message)),
            }
        }
        let Some((generation, sender)) = guard.as_ref() else {
            return Err(fail(SendErrorKind::Connection("no link".into()), message));
        };
        let Ok(sent) = tokio::time::timeout(SEND_TIMEOUT, sender.send(sendable)).await else {
            return Err(fail(
                SendErrorKind::Connection(
                    "the broker did not answer in time; the message may have been enqueued".into(),
                ),
                message,
            ));
        };
        match sent {
            Ok(Outcome::Accepted) => Ok(()),
            Ok(Outcome::Rejected(Some(error))) => {
                let description = error.description.clone().unwrap_or_default();
                let kind = match error.condition.as_str() {
                    sb_amqp::condition::MESSAGE_SIZE_EXCEEDED => {
                        SendErrorKind::SizeExceeded(description)
                    }
                    sb_amqp::condition::NOT_FOUND => SendErrorKind::NotFound(description),
                    sb_amqp::condition::SERVER_BUSY => SendErrorKind::Throttled(description),
                    condition => SendErrorKind::Refused {
                        condition: condition.to_owned(),
                        description,
                    },
                };
                Err(fail(kind, message))
            }
            Ok(other) => Err(fail(
                SendErrorKind::Refused {
                    condition: format!("{other:?}"),
                    description: "not accepted".into(),
                },
                message,
            )),
            Err(error) => {
                let generation = *generation;
                *guard = None;
                self.inner.client.reset(generation).await;
                Err(fail(kind_of(&ServiceBusError::from_amqp(&error)), message))
            }
        }
    }

    async fn attach(&self) -> Result<(u64, sb_amqp::Sender), ServiceBusError> {
        let link = self.inner.client.link().await?;
        self.inner
            .client
            .authorize(&link, &self.inner.entity)
            .await?;
        let options = SenderOptions::new(unique_name("sb-inbox-sender"), self.inner.entity.clone());
        let sender = link
            .session
            .attach_sender(options)
            .await
            .map_err(|e| ServiceBusError::from_amqp(&e))?;
        Ok((link.generation, sender))
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

/// The runtime's [`Sender`] port on one client: one sender link per destination, attached on
/// first use and kept.
#[derive(Debug, Clone)]
pub struct ServiceBusPublisher {
    client: ServiceBusClient,
    senders: Arc<StdMutex<HashMap<String, ServiceBusSender>>>,
}

impl ServiceBusPublisher {
    pub(crate) fn new(client: ServiceBusClient) -> Self {
        ServiceBusPublisher {
            client,
            senders: Arc::default(),
        }
    }

    fn sender(&self, destination: &str) -> ServiceBusSender {
        let mut senders = self
            .senders
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        senders
            .entry(destination.to_owned())
            .or_insert_with(|| self.client.sender(destination))
            .clone()
    }
}

impl Sender for ServiceBusPublisher {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        scheduled_enqueue_time: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        let options = SendOptions {
            time_to_live: None,
            scheduled_enqueue_time,
        };
        self.sender(destination)
            .send_with(message, &options)
            .await
            .map_err(|failed| {
                if failed.error.is_transient() {
                    SendFailure::Transient(failed.to_string())
                } else {
                    SendFailure::Permanent(failed.to_string())
                }
            })
    }
}
