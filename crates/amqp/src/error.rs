//! The crate's error type.
//!
//! Every error that comes from the peer keeps the AMQP condition symbol
//! ([`AmqpError::condition`]) so callers can branch on it without parsing text.

use std::sync::Arc;

use fe2o3_amqp_types::definitions::{self, ErrorCondition, Fields};
use serde_amqp::primitives::Symbol;

/// `Result` with the crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Well-known AMQP and Service Bus error condition symbols: the one place they are spelled
/// (re-exported as [`crate::servicebus::condition`]).
///
/// Sources: AMQP 1.0 §2.8.15–2.8.18 (`amqp:…`); Python `azure-servicebus`
/// `_common/constants.py` (`ERROR_CODE_*`), .NET `AmqpClientConstants` and Go `azservicebus`
/// `internal/errors.go` (`com.microsoft:…`).
pub mod condition {
    /// `amqp:internal-error`
    pub const INTERNAL_ERROR: &str = "amqp:internal-error";
    /// `amqp:not-found`
    pub const NOT_FOUND: &str = "amqp:not-found";
    /// `amqp:unauthorized-access`
    pub const UNAUTHORIZED_ACCESS: &str = "amqp:unauthorized-access";
    /// `amqp:decode-error`
    pub const DECODE_ERROR: &str = "amqp:decode-error";
    /// `amqp:resource-limit-exceeded`
    pub const RESOURCE_LIMIT_EXCEEDED: &str = "amqp:resource-limit-exceeded";
    /// `amqp:not-allowed`
    pub const NOT_ALLOWED: &str = "amqp:not-allowed";
    /// `amqp:invalid-field`
    pub const INVALID_FIELD: &str = "amqp:invalid-field";
    /// `amqp:not-implemented`
    pub const NOT_IMPLEMENTED: &str = "amqp:not-implemented";
    /// `amqp:precondition-failed`
    pub const PRECONDITION_FAILED: &str = "amqp:precondition-failed";
    /// `amqp:connection:forced`
    pub const CONNECTION_FORCED: &str = "amqp:connection:forced";
    /// `amqp:connection:framing-error`
    pub const FRAMING_ERROR: &str = "amqp:connection:framing-error";
    /// `amqp:session:window-violation`
    pub const WINDOW_VIOLATION: &str = "amqp:session:window-violation";
    /// `amqp:session:unattached-handle`
    pub const UNATTACHED_HANDLE: &str = "amqp:session:unattached-handle";
    /// `amqp:link:detach-forced`
    pub const DETACH_FORCED: &str = "amqp:link:detach-forced";
    /// `amqp:link:message-size-exceeded`
    pub const MESSAGE_SIZE_EXCEEDED: &str = "amqp:link:message-size-exceeded";
    /// `amqp:link:stolen`
    pub const LINK_STOLEN: &str = "amqp:link:stolen";
    /// `com.microsoft:message-lock-lost`
    pub const MESSAGE_LOCK_LOST: &str = "com.microsoft:message-lock-lost";
    /// `com.microsoft:server-busy`
    pub const SERVER_BUSY: &str = "com.microsoft:server-busy";
    /// `com.microsoft:timeout`
    pub const TIMEOUT: &str = "com.microsoft:timeout";
    /// `com.microsoft:dead-letter`
    pub const DEAD_LETTER: &str = "com.microsoft:dead-letter";
    /// `com.microsoft:message-not-found`: no message with that sequence number (or a peek past
    /// the last one).
    pub const MESSAGE_NOT_FOUND: &str = "com.microsoft:message-not-found";
    /// `com.microsoft:session-lock-lost`: the session lock expired or the session was taken.
    pub const SESSION_LOCK_LOST: &str = "com.microsoft:session-lock-lost";
    /// `com.microsoft:session-cannot-be-locked`: another receiver holds the session.
    pub const SESSION_CANNOT_BE_LOCKED: &str = "com.microsoft:session-cannot-be-locked";
    /// `com.microsoft:session-not-found`: no such session (or none with messages).
    pub const SESSION_NOT_FOUND: &str = "com.microsoft:session-not-found";
    /// `com.microsoft:entity-disabled`: the entity is disabled.
    pub const ENTITY_DISABLED: &str = "com.microsoft:entity-disabled";
    /// `com.microsoft:entity-already-exists`: an entity or rule with that name exists.
    pub const ENTITY_ALREADY_EXISTS: &str = "com.microsoft:entity-already-exists";
    /// `com.microsoft:operation-cancelled`: the service gave up on an operation.
    pub const OPERATION_CANCELLED: &str = "com.microsoft:operation-cancelled";
}

/// An AMQP `error` as carried by `close`, `end`, `detach` and `rejected`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmqpError {
    /// The condition symbol, e.g. `amqp:not-found` or `com.microsoft:message-lock-lost`.
    pub condition: String,
    /// Human readable description.
    pub description: Option<String>,
    /// Extra information (`fields`).
    pub info: Option<Fields>,
}

impl AmqpError {
    /// Builds an error with a condition and a description.
    pub fn new(condition: impl Into<String>, description: impl Into<Option<String>>) -> Self {
        Self {
            condition: condition.into(),
            description: description.into(),
            info: None,
        }
    }

    /// Attaches `info` fields.
    #[must_use]
    pub fn with_info(mut self, info: Fields) -> Self {
        self.info = Some(info);
        self
    }

    /// True for `com.microsoft:message-lock-lost`.
    pub fn is_lock_lost(&self) -> bool {
        self.condition == condition::MESSAGE_LOCK_LOST
    }

    /// True for conditions a retry may clear (server busy, timeout, forced detach or close,
    /// resource limits, internal errors).
    pub fn is_transient(&self) -> bool {
        matches!(
            self.condition.as_str(),
            condition::SERVER_BUSY
                | condition::TIMEOUT
                | condition::DETACH_FORCED
                | condition::CONNECTION_FORCED
                | condition::RESOURCE_LIMIT_EXCEEDED
                | condition::INTERNAL_ERROR
        )
    }
}

impl std::fmt::Display for AmqpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.description {
            Some(d) => write!(f, "{}: {}", self.condition, d),
            None => f.write_str(&self.condition),
        }
    }
}

/// The symbol a condition stands for: the codec's own `From<&…> for Symbol` per kind, so the
/// error type needs no codec (it sits below `decode`; issue 46).
fn condition_symbol(cond: &ErrorCondition) -> String {
    let symbol = match cond {
        ErrorCondition::AmqpError(c) => Symbol::from(c),
        ErrorCondition::ConnectionError(c) => Symbol::from(c),
        ErrorCondition::SessionError(c) => Symbol::from(c),
        ErrorCondition::LinkError(c) => Symbol::from(c),
        ErrorCondition::Custom(s) => s.clone(),
        // A variant behind a codec feature this crate does not enable (`transaction`), which a
        // dependent may turn on: keep the debug form rather than fail to build.
        #[allow(unreachable_patterns)]
        _ => return format!("{cond:?}"),
    };
    symbol.0
}

/// The condition a symbol names: the kinds tried in the order the codec's own
/// `Deserialize for ErrorCondition` tries them (`definitions/error_cond.rs`), else `Custom`.
fn symbol_condition(s: &str) -> ErrorCondition {
    use definitions::{AmqpError as Amqp, ConnectionError, LinkError, SessionError};
    if let Ok(c) = Amqp::try_from(s) {
        ErrorCondition::AmqpError(c)
    } else if let Ok(c) = ConnectionError::try_from(s) {
        ErrorCondition::ConnectionError(c)
    } else if let Ok(c) = SessionError::try_from(s) {
        ErrorCondition::SessionError(c)
    } else if let Ok(c) = LinkError::try_from(s) {
        ErrorCondition::LinkError(c)
    } else {
        ErrorCondition::Custom(Symbol::from(s))
    }
}

impl From<definitions::Error> for AmqpError {
    fn from(e: definitions::Error) -> Self {
        Self {
            condition: condition_symbol(&e.condition),
            description: e.description,
            info: e.info.map(|b| *b),
        }
    }
}

impl From<AmqpError> for definitions::Error {
    fn from(e: AmqpError) -> Self {
        definitions::Error {
            condition: symbol_condition(&e.condition),
            description: e.description,
            info: e.info.map(Box::new),
        }
    }
}

/// The crate's error type.
///
/// Errors that come from the peer carry an [`AmqpError`] with the condition symbol.
/// [`Error::is_transient`] tells whether a retry (usually on a new link or connection)
/// may succeed; everything else is permanent for the operation that failed.
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Socket error (transient).
    #[error("I/O error: {0}")]
    Io(Arc<std::io::Error>),
    /// TLS setup or handshake failure.
    #[error("TLS error: {0}")]
    Tls(String),
    /// The HTTP proxy refused the `CONNECT` tunnel or did not answer in HTTP.
    #[error("HTTP proxy: {0}")]
    Proxy(String),
    /// The URL or address could not be parsed.
    #[error("invalid address: {0}")]
    InvalidAddress(String),
    /// Bytes from the peer could not be decoded.
    #[error("decode error: {0}")]
    Decode(String),
    /// A value could not be encoded.
    #[error("encode error: {0}")]
    Encode(String),
    /// The peer broke the protocol (bad frame, unexpected performative, bad header).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// SASL authentication failed (outcome code given).
    #[error("SASL authentication failed (code {0})")]
    Sasl(u8),
    /// The connection was closed, by the peer (with its error, if any) or locally.
    #[error("connection closed{}", fmt_opt(.0))]
    ConnectionClosed(Option<AmqpError>),
    /// The socket ended without a `close` (transient).
    #[error("connection lost")]
    ConnectionLost,
    /// The peer sent nothing within the idle timeout (transient).
    #[error("idle timeout: the peer went silent")]
    IdleTimeout,
    /// The session ended (by the peer, with its error, if any).
    #[error("session ended{}", fmt_opt(.0))]
    SessionEnded(Option<AmqpError>),
    /// The link was detached (by the peer, with its error, if any).
    #[error("link detached{}", fmt_opt(.0))]
    LinkDetached(Option<AmqpError>),
    /// The peer refused the attach: it answered with a null terminus and detached.
    #[error("attach refused{}", fmt_opt(.0))]
    AttachRefused(Option<AmqpError>),
    /// The peer rejected a message (request/response helper, `Outcome::into_result`).
    #[error("message rejected{}", fmt_opt(.0))]
    Rejected(Option<AmqpError>),
    /// The peer released or modified a message where acceptance was required.
    #[error("message not accepted: {0}")]
    NotAccepted(String),
    /// The operation is not valid in the current state (e.g. send on a receiver).
    #[error("illegal state: {0}")]
    IllegalState(&'static str),
    /// An operation timed out.
    #[error("timed out")]
    Timeout,
}

fn fmt_opt(e: &Option<AmqpError>) -> String {
    match e {
        Some(e) => format!(": {e}"),
        None => String::new(),
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl Error {
    /// The peer's error, if the error came from the peer.
    pub fn amqp_error(&self) -> Option<&AmqpError> {
        match self {
            Error::ConnectionClosed(e)
            | Error::SessionEnded(e)
            | Error::LinkDetached(e)
            | Error::AttachRefused(e)
            | Error::Rejected(e) => e.as_ref(),
            _ => None,
        }
    }

    /// The peer's condition symbol, if any.
    pub fn condition(&self) -> Option<&str> {
        self.amqp_error().map(|e| e.condition.as_str())
    }

    /// True if the peer reported `com.microsoft:message-lock-lost`.
    pub fn is_lock_lost(&self) -> bool {
        self.amqp_error().is_some_and(AmqpError::is_lock_lost)
    }

    /// True if retrying (on a new link or connection) may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Io(_) | Error::ConnectionLost | Error::IdleTimeout | Error::Timeout => true,
            other => other.amqp_error().is_some_and(AmqpError::is_transient),
        }
    }

    /// True if the whole connection is gone (every handle on it fails from now on).
    pub fn is_connection_error(&self) -> bool {
        matches!(
            self,
            Error::Io(_) | Error::ConnectionLost | Error::IdleTimeout | Error::ConnectionClosed(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn condition_round_trip_keeps_symbol() {
        for c in [
            condition::MESSAGE_LOCK_LOST,
            condition::NOT_FOUND,
            condition::MESSAGE_SIZE_EXCEEDED,
            "vendor:custom",
        ] {
            let e: definitions::Error = AmqpError::new(c, None).into();
            let back: AmqpError = e.into();
            assert_eq!(back.condition, c);
        }
    }

    #[test]
    fn symbols_map_to_the_codecs_condition_kinds() {
        use definitions::{AmqpError as Amqp, ConnectionError, LinkError, SessionError};
        let cases = [
            (
                condition::NOT_FOUND,
                ErrorCondition::AmqpError(Amqp::NotFound),
            ),
            (
                condition::CONNECTION_FORCED,
                ErrorCondition::ConnectionError(ConnectionError::ConnectionForced),
            ),
            (
                "amqp:session:window-violation",
                ErrorCondition::SessionError(SessionError::WindowViolation),
            ),
            (
                condition::DETACH_FORCED,
                ErrorCondition::LinkError(LinkError::DetachForced),
            ),
            (
                condition::MESSAGE_LOCK_LOST,
                ErrorCondition::Custom(Symbol::from(condition::MESSAGE_LOCK_LOST)),
            ),
        ];
        for (symbol, kind) in cases {
            let wire: definitions::Error = AmqpError::new(symbol, None).into();
            assert_eq!(wire.condition, kind, "{symbol}");
            // The codec reads the encoded condition back as the same kind.
            let bytes = serde_amqp::to_vec(&wire.condition).unwrap();
            let read: ErrorCondition = crate::decode::decode(&bytes).unwrap();
            assert_eq!(read, kind, "{symbol}");
            assert_eq!(AmqpError::from(wire).condition, symbol);
        }
    }

    #[test]
    fn predicates() {
        let e = Error::Rejected(Some(AmqpError::new(condition::MESSAGE_LOCK_LOST, None)));
        assert!(e.is_lock_lost());
        assert!(!e.is_transient());
        assert!(Error::ConnectionLost.is_transient());
        assert_eq!(e.condition(), Some(condition::MESSAGE_LOCK_LOST));
    }
}
