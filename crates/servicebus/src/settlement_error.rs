//! [`SettlementError`]: why a lock renewal or a settlement failed, in the three words a caller
//! acts on (lock lost, transient, refused), keeping the broker's condition.

use sb_amqp::servicebus::condition;

use crate::ServiceBusError;
use crate::names::error;

/// Why a lock renewal or a settlement (complete, abandon, dead-letter, release) failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum SettlementError {
    /// The lock expired or is unknown to the broker (`com.microsoft:message-lock-lost`,
    /// `com.microsoft:session-lock-lost`): the message will be delivered again and nothing can
    /// settle this delivery any more.
    #[error("message lock lost")]
    LockLost,
    /// The broker or the connection failed in a way that may pass (timeout, throttling,
    /// connection loss). The outcome of the operation is unknown.
    #[error("transient broker failure: {0}")]
    Transient(#[source] ServiceBusError),
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

impl SettlementError {
    /// True when the lock is gone for good.
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, SettlementError::LockLost)
    }

    /// True when retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SettlementError::Transient(_))
    }

    /// The bounded `error.type` telemetry reports for this error.
    pub fn error_type(&self) -> &'static str {
        match self {
            SettlementError::LockLost => error::LOCK_LOST,
            SettlementError::Transient(_) => error::TRANSIENT,
            SettlementError::Permanent { .. } => error::REFUSED,
        }
    }
}

/// One settlement attempt's result (the delivery's settlement loop and its release read it).
pub(super) enum Attempt {
    Done,
    /// The delivery's link is gone: settle by lock token instead.
    LinkGone,
    /// Timed out, or no answer: worth another try while the lock lasts.
    Retry(ServiceBusError),
    /// The service answered busy: another try after the client-wide busy pause.
    Busy(ServiceBusError),
    Failed(SettlementError),
}

/// A `$management` request failure as a settlement error, keeping the broker's condition.
pub(super) fn settle_error(error: ServiceBusError) -> SettlementError {
    if error.is_transient() {
        SettlementError::Transient(error)
    } else {
        let condition = match &error {
            ServiceBusError::Broker { condition, .. } => condition.clone(),
            ServiceBusError::NotFound(_) => condition::NOT_FOUND.to_owned(),
            _ => condition::UNAUTHORIZED_ACCESS.to_owned(),
        };
        SettlementError::Permanent {
            condition,
            description: error.to_string(),
        }
    }
}
