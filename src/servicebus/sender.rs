use std::sync::Arc;
use std::time::Duration;

use sb_amqp::{Outcome, Sendable, SenderOptions, unique_name};
use tokio::sync::Mutex;

use super::amqp_message::to_amqp;
use super::{ServiceBusClient, ServiceBusError};
use crate::Message;

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
}

impl ServiceBusSender {
    pub(crate) fn new(client: ServiceBusClient, entity: &str) -> Self {
        ServiceBusSender {
            inner: Arc::new(SenderInner {
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
        self.send_with_ttl(message, None).await
    }

    /// As [`ServiceBusSender::send`], with a time-to-live.
    ///
    /// # Errors
    /// [`SendError`] with the message handed back.
    pub async fn send_with_ttl(
        &self,
        message: Message,
        ttl: Option<Duration>,
    ) -> Result<(), SendError> {
        let fail = |error: SendErrorKind, message: Message| SendError {
            entity: self.inner.entity.clone(),
            error,
            message: Box::new(message),
        };
        let sendable = match Sendable::message(&to_amqp(&message, ttl)) {
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
