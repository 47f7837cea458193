//! [`ReceiveError`]: why a receive (or a session accept) failed, and whether receiving again
//! may help.

use crate::ServiceBusError;

/// Why a receive failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ReceiveError {
    /// The link or the connection failed; the next receive re-attaches (after a backoff).
    #[error("transient receive failure: {0}")]
    Transient(#[source] ServiceBusError),
    /// The receiver cannot go on (entity gone, access refused, an entity without sessions).
    #[error("receiver failed: {0}")]
    Permanent(#[source] ServiceBusError),
}

impl ReceiveError {
    /// True when receiving again may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, ReceiveError::Transient(_))
    }

    /// The underlying client error.
    pub fn cause(&self) -> &ServiceBusError {
        match self {
            ReceiveError::Transient(error) | ReceiveError::Permanent(error) => error,
        }
    }
}
