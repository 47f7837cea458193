//! Message sessions as the runtime sees them: a [`SessionSource`] hands out sessions, each a
//! [`SessionReceiver`] of ordered deliveries under one session lock.

use std::future::Future;
use std::time::{Duration, SystemTime};

use super::{Delivery, ReceiveError, SettleError, Source};

/// One accepted message session: its deliveries in order, and the session lock that is their
/// lock (renewing it renews theirs; losing it loses theirs).
pub trait SessionReceiver: Send + Sync + 'static {
    /// The delivery type; its [`Delivery::renew_lock`] renews the session lock and its
    /// [`Delivery::locked_until`] is the session lock's expiry.
    type Delivery: Delivery;
    /// The session id.
    fn session_id(&self) -> &str;
    /// When the session lock runs out unless renewed.
    fn locked_until(&self) -> SystemTime;
    /// Renews the session lock; returns the new expiry.
    fn renew(&self) -> impl Future<Output = Result<SystemTime, SettleError>> + Send;
    /// The session's next delivery within `wait`; `Ok(None)` when the session stayed quiet.
    /// An error means the session is lost (its lock with it).
    fn receive(
        &self,
        wait: Duration,
    ) -> impl Future<Output = Result<Option<Self::Delivery>, ReceiveError>> + Send;
    /// Releases the session for other receivers.
    fn close(&self) -> impl Future<Output = ()> + Send;
    /// Gives back the session's deliveries received ahead of the one just handled, keeping
    /// the session: after an abandon, the abandoned message must come again before them. The
    /// default does nothing: a receiver that holds nothing ahead has nothing to give back.
    fn give_back_ahead(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// A session-enabled queue or subscription: hands out sessions no other receiver holds.
pub trait SessionSource: Send + Sync + 'static {
    /// The session type.
    type Session: SessionReceiver;
    /// Where the deliveries come from; telemetry labels spans and metrics with it.
    fn source(&self) -> Source {
        Source::default()
    }
    /// Accepts the next available session, waiting a bounded time; `Ok(None)` when none
    /// became available meanwhile.
    fn accept_next(
        &self,
    ) -> impl Future<Output = Result<Option<Self::Session>, ReceiveError>> + Send;
}
