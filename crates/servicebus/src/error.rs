//! [`ServiceBusError`] and how the client recovers from each AMQP failure (link, connection,
//! token, or none), as the SDKs classify them.

use sb_amqp::servicebus::condition::{self, ENTITY_DISABLED, OPERATION_CANCELLED};

/// A Service Bus client failure.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceBusError {
    /// The connection or a link failed; reconnecting or re-attaching may help. Transient.
    #[error("connection failed: {0}")]
    Connection(String),
    /// `$cbs` refused the token (status code and description). Permanent until the credential
    /// changes.
    #[error("authorization refused ({status}): {description}")]
    Unauthorized {
        /// The CBS status code.
        status: i64,
        /// The CBS status description.
        description: String,
    },
    /// The entity does not exist. Permanent.
    #[error("entity not found: {0}")]
    NotFound(String),
    /// The broker refused with a condition; transient unless the condition is one of the
    /// permanent ones (not-allowed, entity-disabled, message-size-exceeded).
    #[error("broker error {condition}: {description}")]
    Broker {
        /// The AMQP error condition.
        condition: String,
        /// Its description.
        description: String,
    },
    /// Acquiring a token failed.
    #[error("token acquisition failed: {0}")]
    Token(String),
    /// The service did not answer in time; the operation's outcome is unknown. Transient.
    #[error("{0}")]
    Timeout(String),
    /// A link the operation needs is gone (a session link, and the session lock with it), or
    /// the service's answer lacks what the operation needs. Transient.
    #[error("{0}")]
    Link(String),
}

/// What a link or connection failure calls for.
///
/// The SDKs' classification: Go `azservicebus/internal/errors.go` (`GetRecoveryKind`: any
/// detach → link recovery; not-found, not-allowed, entity-disabled, message-size-exceeded →
/// fatal), .NET `AmqpExceptionHelper.TranslateException` (unknown conditions → transient
/// `ServiceBusException`), and the service's idle detach (`amqp:link:detach-forced`,
/// "IdleTimerExpired", Azure/azure-sdk-for-python#18795). Unlike Go we keep the connection
/// for `amqp:internal-error` on a detach: only the link failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Re-attach the failed link on the same connection after a jittered backoff.
    Link,
    /// The token for the entity expired or was refused: put a fresh token, then re-attach
    /// once; a second refusal right after a fresh token is fatal.
    Reauthorize,
    /// The connection is gone: open a new one.
    Connection,
    /// Retrying cannot help.
    Fatal,
}

/// Conditions no retry clears.
fn is_fatal_condition(condition: &str) -> bool {
    matches!(
        condition,
        condition::NOT_FOUND
            | condition::NOT_ALLOWED
            | ENTITY_DISABLED
            | condition::MESSAGE_SIZE_EXCEEDED
    )
}

/// Conditions of a disposition or send outcome a retry may clear: the service was busy or
/// timed out (Go `amqpConditionsToRecoveryKind`: server-busy, timeout, operation-cancelled
/// need no recovery, only a retry).
pub fn is_busy_condition(condition: &str) -> bool {
    matches!(
        condition,
        condition::SERVER_BUSY | condition::TIMEOUT | OPERATION_CANCELLED
    )
}

/// The one condition that sets the client-wide busy pause ([`crate::busy`]): .NET
/// `ServiceBusRetryPolicy.RunOperation` sets its server-busy state only for
/// `ServiceBusFailureReason.ServiceBusy`; `com.microsoft:timeout` is `ServiceTimeout` there
/// (`AmqpReceiver.OpenReceiverLinkAsync`: "translated to a ServiceBusException with
/// ServiceBusFailureReason.ServiceTimeout") and only retried, as Go retries timeout and
/// operation-cancelled without a pause (`azservicebus/internal/errors.go`
/// `amqpConditionsToRecoveryKind`). protocol3 F5.
pub(crate) fn is_server_busy(condition: &str) -> bool {
    condition == condition::SERVER_BUSY
}

/// `amqp:internal-error`, `amqp:unknown-error`, or a condition this client does not know: a
/// link may clear it by re-attaching, but repeated on one connection it calls for a new
/// connection (issue 29 item 9; see `client::POISONED_AFTER` for what the SDKs do).
pub fn is_internal_condition(c: &str) -> bool {
    !(is_fatal_condition(c)
        || is_busy_condition(c)
        || matches!(
            c,
            condition::UNAUTHORIZED_ACCESS
                | condition::DETACH_FORCED
                | condition::LINK_STOLEN
                | condition::MESSAGE_LOCK_LOST
                | condition::SESSION_LOCK_LOST
                | condition::SESSION_CANNOT_BE_LOCKED
                | condition::CONNECTION_FORCED
        ))
}

/// The service's detach when the token that authorised a link expired:
/// `amqp:link:detach-forced` with "… Code: RenewToken. Details: Unauthorized access. …"
/// (azure-sdk-for-python issue 23487), not `amqp:unauthorized-access`.
fn is_token_expiry(error: &sb_amqp::Error) -> bool {
    error.amqp_error().is_some_and(|e| {
        e.condition == condition::DETACH_FORCED
            && e.description
                .as_deref()
                .is_some_and(|d| d.contains("RenewToken"))
    })
}

/// Classifies an engine error from a link or connection operation.
pub fn recovery(error: &sb_amqp::Error) -> Recovery {
    if error.is_connection_error() || matches!(error, sb_amqp::Error::SessionEnded(_)) {
        // A lost session is rebuilt with the connection scope (`ConnectionScope::observe`).
        return Recovery::Connection;
    }
    if is_token_expiry(error) {
        return Recovery::Reauthorize;
    }
    match error.condition() {
        Some(condition::UNAUTHORIZED_ACCESS) => Recovery::Reauthorize,
        Some(c) if is_fatal_condition(c) => Recovery::Fatal,
        // detach-forced, server-busy, timeout, internal-error, unknown-error,
        // operation-cancelled, link stolen, and anything new: the link is worth re-attaching.
        _ => match error {
            sb_amqp::Error::InvalidAddress(_) | sb_amqp::Error::Encode(_) => Recovery::Fatal,
            sb_amqp::Error::Protocol(_) | sb_amqp::Error::Decode(_) | sb_amqp::Error::Tls(_) => {
                Recovery::Connection
            }
            _ => Recovery::Link,
        },
    }
}

impl ServiceBusError {
    /// True when retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ServiceBusError::Connection(_)
            | ServiceBusError::Token(_)
            | ServiceBusError::Timeout(_)
            | ServiceBusError::Link(_) => true,
            ServiceBusError::Broker { condition, .. } => !is_fatal_condition(condition),
            _ => false,
        }
    }

    /// The engine's failure as the client reports it: `amqp:not-found` and
    /// `amqp:unauthorized-access` typed, another broker condition with its symbol and
    /// description, a connection-level failure as [`ServiceBusError::Connection`].
    pub fn from_amqp(error: &sb_amqp::Error) -> Self {
        match error.amqp_error() {
            Some(e) if e.condition == condition::NOT_FOUND => {
                ServiceBusError::NotFound(e.description.clone().unwrap_or_default())
            }
            Some(e) if e.condition == condition::UNAUTHORIZED_ACCESS => {
                ServiceBusError::Unauthorized {
                    status: 401,
                    description: e.description.clone().unwrap_or_default(),
                }
            }
            Some(e) if !error.is_connection_error() => ServiceBusError::Broker {
                condition: e.condition.clone(),
                description: e.description.clone().unwrap_or_default(),
            },
            _ => ServiceBusError::Connection(error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sb_amqp::{AmqpError, Error};

    fn detached(condition: &str) -> Error {
        Error::LinkDetached(Some(AmqpError::new(condition, None)))
    }

    #[test]
    fn detaches_the_sdks_retry_re_attach_the_link() {
        for c in [
            condition::DETACH_FORCED,
            condition::SERVER_BUSY,
            condition::TIMEOUT,
            condition::INTERNAL_ERROR,
            "amqp:unknown-error",
            OPERATION_CANCELLED,
            condition::LINK_STOLEN,
            "vendor:never-seen",
        ] {
            assert_eq!(recovery(&detached(c)), Recovery::Link, "{c}");
            assert!(
                ServiceBusError::from_amqp(&detached(c)).is_transient(),
                "{c}"
            );
        }
        assert_eq!(recovery(&Error::LinkDetached(None)), Recovery::Link);
        assert_eq!(recovery(&Error::Timeout), Recovery::Link);
    }

    #[test]
    fn unauthorized_re_authorizes_and_permanent_conditions_are_fatal() {
        assert_eq!(
            recovery(&detached(condition::UNAUTHORIZED_ACCESS)),
            Recovery::Reauthorize
        );
        for c in [
            condition::NOT_FOUND,
            condition::NOT_ALLOWED,
            ENTITY_DISABLED,
            condition::MESSAGE_SIZE_EXCEEDED,
        ] {
            assert_eq!(recovery(&detached(c)), Recovery::Fatal, "{c}");
            assert!(
                !ServiceBusError::from_amqp(&detached(c)).is_transient(),
                "{c}"
            );
        }
    }

    #[test]
    fn the_services_token_expiry_detach_re_authorizes() {
        let expired = Error::LinkDetached(Some(AmqpError::new(
            condition::DETACH_FORCED,
            Some(
                "The link 'r' is force detached. Code: RenewToken. Details: Unauthorized access."
                    .into(),
            ),
        )));
        assert_eq!(recovery(&expired), Recovery::Reauthorize);
        // The idle detach is the same condition without "RenewToken": only the link.
        assert_eq!(
            recovery(&detached(condition::DETACH_FORCED)),
            Recovery::Link
        );
    }

    #[test]
    fn internal_and_unknown_conditions_count_toward_a_new_connection() {
        for c in [
            condition::INTERNAL_ERROR,
            "amqp:unknown-error",
            "vendor:never-seen",
        ] {
            assert!(is_internal_condition(c), "{c}");
        }
        for c in [
            condition::SERVER_BUSY,
            condition::TIMEOUT,
            condition::DETACH_FORCED,
            condition::UNAUTHORIZED_ACCESS,
            condition::NOT_FOUND,
            condition::LINK_STOLEN,
            condition::MESSAGE_LOCK_LOST,
        ] {
            assert!(!is_internal_condition(c), "{c}");
        }
    }

    #[test]
    fn only_connection_level_errors_reconnect() {
        assert_eq!(recovery(&Error::ConnectionLost), Recovery::Connection);
        assert_eq!(recovery(&Error::IdleTimeout), Recovery::Connection);
        assert_eq!(
            recovery(&Error::ConnectionClosed(Some(AmqpError::new(
                condition::CONNECTION_FORCED,
                None
            )))),
            Recovery::Connection
        );
        assert_eq!(recovery(&Error::SessionEnded(None)), Recovery::Connection);
    }
}
