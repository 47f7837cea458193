//! The crate's error type.

use sb_amqp::condition;

use crate::config::ConfigError;

/// A specialized `Result` for broker operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors returned by the broker core.
///
/// Each variant maps to the AMQP error condition a real Service Bus namespace sends
/// ([`Error::condition`]), so the wire layer can translate without matching on text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No queue, topic, subscription or rule has this name (permanent; `amqp:not-found`).
    ///
    /// Worded as the service words it: `@azure/core-amqp`'s `translate` (`src/errors.ts`) tells
    /// a missing entity from other `amqp:not-found` errors by this description.
    #[error("The messaging entity '{entity}' could not be found.")]
    NotFound {
        /// The name or address that was looked up.
        entity: String,
    },
    /// The lock token is unknown, already settled or its lock expired
    /// (permanent for this delivery; `com.microsoft:message-lock-lost`).
    #[error("message lock lost: {lock_token}")]
    LockLost {
        /// The token the caller presented.
        lock_token: uuid::Uuid,
    },
    /// Another receiver holds this session's lock (transient;
    /// `com.microsoft:session-cannot-be-locked`).
    #[error("session {session_id:?} is locked by another receiver")]
    SessionCannotBeLocked {
        /// The session id.
        session_id: String,
    },
    /// The session lock expired or was released (permanent for this receiver;
    /// `com.microsoft:session-lock-lost`).
    #[error("session lock lost: {session_id:?}")]
    SessionLockLost {
        /// The session id.
        session_id: String,
    },
    /// The message is larger than the entity's maximum message size
    /// (permanent; `amqp:link:message-size-exceeded`).
    #[error("message of {size} bytes exceeds the maximum message size of {max} bytes")]
    MessageSizeExceeded {
        /// The message size in bytes (the length of its payload).
        size: usize,
        /// The entity's limit in bytes.
        max: usize,
    },
    /// No deferred (or scheduled) message has this sequence number
    /// (permanent; `com.microsoft:message-not-found`).
    #[error("message not found: sequence number {sequence_number}")]
    MessageNotFound {
        /// The sequence number that was asked for.
        sequence_number: i64,
    },
    /// The address cannot name an entity (permanent; `amqp:invalid-field`).
    #[error("invalid address {address:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        address: String,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// The operation does not apply to this entity, e.g. receiving from a topic or sending to a
    /// dead-letter queue (permanent; `amqp:not-allowed`).
    #[error("{operation} is not allowed on {entity}: {reason}")]
    NotAllowed {
        /// The operation attempted.
        operation: &'static str,
        /// The entity path.
        entity: String,
        /// Why it is not allowed.
        reason: &'static str,
    },
    /// A rule (or other sub-entity) of this name exists already (permanent;
    /// `com.microsoft:entity-already-exists`).
    #[error("{entity} already exists")]
    AlreadyExists {
        /// The path of the existing sub-entity, e.g. `t/Subscriptions/s/Rules/r`.
        entity: String,
    },
    /// A rule cannot be created as described: bad name, unparsable or unsupported SQL filter
    /// (permanent; `amqp:invalid-field`).
    #[error("invalid rule {rule:?}: {reason}")]
    InvalidRule {
        /// The rule name.
        rule: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A fault hook refused the operation (transient; `com.microsoft:server-busy`).
    #[error("{operation} refused by an injected fault")]
    Refused {
        /// The refused operation (`disposition`).
        operation: &'static str,
    },
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),

    /// The AMQP server failed (bind, encode).
    #[error("server error: {0}")]
    Server(String),
}

impl Error {
    /// The AMQP error condition Service Bus sends for this error.
    pub fn condition(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => condition::NOT_FOUND,
            Error::LockLost { .. } => condition::MESSAGE_LOCK_LOST,
            Error::SessionCannotBeLocked { .. } => condition::SESSION_CANNOT_BE_LOCKED,
            Error::SessionLockLost { .. } => condition::SESSION_LOCK_LOST,
            Error::MessageSizeExceeded { .. } => condition::MESSAGE_SIZE_EXCEEDED,
            Error::MessageNotFound { .. } => condition::MESSAGE_NOT_FOUND,
            Error::InvalidAddress { .. } | Error::InvalidRule { .. } => condition::INVALID_FIELD,
            Error::AlreadyExists { .. } => condition::ENTITY_ALREADY_EXISTS,
            Error::NotAllowed { .. } => condition::NOT_ALLOWED,
            Error::Refused { .. } => condition::SERVER_BUSY,
            Error::Config(_) | Error::Server(_) => condition::INTERNAL_ERROR,
        }
    }

    /// Whether the lock was lost (unknown, settled or expired token, or a refused renewal).
    pub fn is_lock_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }

    /// Whether the entity does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound { .. })
    }

    /// Whether retrying the same operation may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Refused { .. } | Error::SessionCannotBeLocked { .. }
        )
    }
}
