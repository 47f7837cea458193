//! The receiving side of the broker port: a peek-locked [`Delivery`] with its settlements, the
//! [`Receiver`] that yields them, and the errors of both.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::SystemTime;

use super::{Cause, Message, PropertyValue};

/// Why a lock renewal or a settlement failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SettleError {
    /// The lock expired or is unknown to the broker: the message will be redelivered and nothing
    /// can settle this delivery any more. Permanent for this delivery.
    #[error("message lock lost")]
    LockLost,
    /// The broker or the connection failed in a way that may pass (timeout, throttling,
    /// connection loss). The outcome of the operation is unknown.
    #[error("transient broker failure: {0}")]
    Transient(#[source] Cause),
    /// The broker refused the operation with an error condition: trying again gets the same
    /// answer.
    #[error("broker refused: {condition}: {description}")]
    Permanent {
        /// The broker's error condition symbol.
        condition: String,
        /// The broker's description.
        description: String,
    },
}

impl SettleError {
    /// A transient failure caused by `cause` (a typed error, or a text).
    pub fn transient(cause: impl Into<Cause>) -> Self {
        SettleError::Transient(cause.into())
    }

    /// True when the lock is gone for good.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, SettleError::LockLost)
    }

    /// True when retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SettleError::Transient(_))
    }

    /// True when the broker refused the operation for good.
    pub fn is_permanent(&self) -> bool {
        matches!(self, SettleError::Permanent { .. })
    }
}

/// A received, peek-locked delivery.
///
/// The runtime shares one delivery between the handler's task and its lock keeper, hence `Sync`.
/// Every operation awaits the broker's answer: a settlement that returns `Ok` was accepted.
pub trait Delivery: Send + Sync + 'static {
    /// The message as the producer sent it.
    fn message(&self) -> &Message;
    /// How many times this message was delivered before (0 on the first delivery).
    fn delivery_count(&self) -> u32;
    /// The broker's lock token.
    fn lock_token(&self) -> uuid::Uuid;
    /// When the lock runs out, as last reported by the broker.
    fn locked_until(&self) -> SystemTime;
    /// When the broker accepted the message, if it says (telemetry: end-to-end age).
    fn enqueued_time(&self) -> Option<SystemTime> {
        None
    }
    /// Renews the lock; returns the new expiry.
    fn renew_lock(&self) -> impl Future<Output = Result<SystemTime, SettleError>> + Send;
    /// Completes (removes) the message.
    fn complete(&self) -> impl Future<Output = Result<(), SettleError>> + Send;
    /// Abandons the message: it becomes available again with its delivery count raised, and the
    /// given properties are merged into its application properties.
    fn abandon(
        &self,
        properties: BTreeMap<String, PropertyValue>,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
    /// Gives the message back unprocessed without counting a delivery attempt (AMQP
    /// `released`): for a delivery received but never started (shutdown, a paused kill
    /// switch), or failed while the kill switch is open. Service Bus does
    /// not raise the delivery count on `released` (the Service Bus team in
    /// <https://github.com/Azure/amqpnetlite/issues/342>), unlike an abandon.
    fn release(&self) -> impl Future<Output = Result<(), SettleError>> + Send;
    /// Moves the message to the dead-letter subqueue with a reason and a description.
    fn dead_letter(
        &self,
        reason: &str,
        description: &str,
    ) -> impl Future<Output = Result<(), SettleError>> + Send;
}

/// Why a receive failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The connection failed; receiving again may succeed after recovery.
    #[error("transient receive failure: {0}")]
    Transient(#[source] Cause),
    /// The receiver cannot go on (entity gone, access denied).
    #[error("receiver failed: {0}")]
    Permanent(#[source] Cause),
}

super::error::transient_or_permanent!(ReceiveError);

/// Where a [`Receiver`]'s deliveries come from, as telemetry names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Source {
    /// `messaging.system`, e.g. `servicebus`.
    pub system: String,
    /// The queue or topic name.
    pub destination: String,
    /// The subscription name, for a topic subscription.
    pub subscription: Option<String>,
    /// The broker's host name.
    pub server_address: Option<String>,
}

impl Source {
    /// A source on `system` reading `destination`.
    pub fn new(system: impl Into<String>, destination: impl Into<String>) -> Self {
        Source {
            system: system.into(),
            destination: destination.into(),
            subscription: None,
            server_address: None,
        }
    }
}

/// A source of peek-locked deliveries (a queue or a subscription).
pub trait Receiver: Send + Sync + 'static {
    /// The delivery type.
    type Delivery: Delivery;
    /// Where the deliveries come from; telemetry labels spans and metrics with it.
    fn source(&self) -> Source {
        Source::default()
    }
    /// Waits for the next delivery; `Ok(None)` once the receiver is closed for good.
    fn receive(&self) -> impl Future<Output = Result<Option<Self::Delivery>, ReceiveError>> + Send;
    /// As [`Receiver::receive`], asking the broker for this one delivery only (one credit, not
    /// the receiver's window): the runtime calls it for the kill switch's half-open trial, the
    /// one delivery it will take before it pauses again. More would be locked by the broker
    /// only to be released (or, should the release fail, left to expire and counted). The
    /// default is [`Receiver::receive`]: right for a receiver that holds nothing ahead.
    fn receive_one(
        &self,
    ) -> impl Future<Output = Result<Option<Self::Delivery>, ReceiveError>> + Send {
        self.receive()
    }
    /// Stops holding deliveries ahead of the runtime: withdraws outstanding credit and gives
    /// back (releases) what arrived and was not handed out, so nothing waits locked for a
    /// runtime that has paused (the kill switch). The next [`Receiver::receive`] resumes. The
    /// default does nothing: a receiver that holds nothing ahead has nothing to give back.
    fn pause(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}
