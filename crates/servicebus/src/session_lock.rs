//! A session link as the receiver attaches it ([`SessionRequest`]), the refusals it classifies
//! itself ([`session_refusal`]), and the [`SessionLock`] the session receiver, its link and its
//! deliveries share.
//!
//! Below the receiver, its deliveries and the session receiver: each of them imports these, so
//! that none of them has to import another upward (the renewal of the lock is the session
//! receiver's, in `session`).

use std::sync::Mutex as StdMutex;
use std::time::{Duration, SystemTime};

use sb_amqp::ReceiverOptions;
use sb_amqp::codec::Value;
use sb_amqp::servicebus::{condition, link};
use sb_amqp::types::definitions::Fields;
use sb_amqp::types::messaging::FilterSet;
use sb_amqp::types::primitives::Symbol;

use crate::{ReceiveError, ServiceBusError};

/// A session receiver's receive after its link was lost.
pub(super) const SESSION_LINK_GONE: &str =
    "the session's link is gone, and the session lock with it";

/// The attach of a next available session timed out: no session became available.
pub(super) const NO_SESSION: &str = "no session became available";

/// A refused session attach the session receiver classifies itself: no session available in
/// time, or the session held by another receiver (both worth trying again later).
pub(super) fn session_refusal(error: &sb_amqp::Error) -> Option<ReceiveError> {
    // A pending accept the service ends without an error is no session either: .NET's
    // `AmqpReceiver.OpenReceiverLinkAsync` (azure-sdk-for-net `src/Amqp/AmqpReceiver.cs`) lets
    // the `OperationCanceledException` of a session link closed while opening become a
    // `TimeoutException`, which `ServiceBusSessionReceiver.CreateSessionReceiverAsync` reports
    // as `ServiceBusFailureReason.ServiceTimeout`, the reason its session processor answers by
    // accepting again at once. As an error it would grow a caller's backoff to 30 s.
    if matches!(
        error,
        sb_amqp::Error::AttachRefused(None) | sb_amqp::Error::LinkDetached(None)
    ) {
        return Some(no_session());
    }
    match error.condition() {
        // The attach's operation timeout ran out: the service answers with the same symbol.
        Some(condition::TIMEOUT) => Some(no_session()),
        Some(condition::SESSION_CANNOT_BE_LOCKED) => {
            Some(ReceiveError::Transient(ServiceBusError::from_amqp(error)))
        }
        _ => None,
    }
}

fn no_session() -> ReceiveError {
    ReceiveError::Transient(ServiceBusError::Timeout(NO_SESSION.to_owned()))
}

/// What a session attach asks for.
#[derive(Debug)]
pub(super) struct SessionRequest {
    /// `None`: the next available session.
    pub(super) session_id: Option<String>,
    /// How long the service may wait for a next available session.
    pub(super) wait: Duration,
}

impl SessionRequest {
    pub(super) fn apply(&self, options: ReceiverOptions) -> ReceiverOptions {
        let mut filter = FilterSet::default();
        filter.insert(
            Symbol::from(link::SESSION_FILTER),
            self.session_id.clone().map_or(Value::Null, Value::String),
        );
        let mut properties = Fields::default();
        let ms = u32::try_from(self.wait.as_millis()).unwrap_or(u32::MAX);
        properties.insert(Symbol::from(link::OPERATION_TIMEOUT), Value::Uint(ms));
        let mut options = options.filter(filter);
        options.properties = Some(properties);
        options
    }
}

/// A session lock as the client knows it.
#[derive(Debug)]
pub(super) struct SessionLock {
    pub(super) id: String,
    pub(super) locked_until: StdMutex<SystemTime>,
}

impl SessionLock {
    /// The session's id.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    pub(super) fn locked_until(&self) -> SystemTime {
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
