//! The sending side of the broker port: [`Sender`] and why a send fails.

use std::future::Future;
use std::time::SystemTime;

use super::{Cause, Message};

/// Why a send failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendFailure {
    /// Throttling or a broken connection. The outcome may be unknown (the broker may have
    /// enqueued the message), so a retry must resend the same message id.
    #[error("transient send failure: {0}")]
    Transient(#[source] Cause),
    /// The broker refused the message for good (too large, entity not found, denied).
    #[error("send refused: {0}")]
    Permanent(#[source] Cause),
}

super::error::transient_or_permanent!(SendFailure);

/// Sends messages to named destinations and waits for the broker to accept each.
///
/// The outbox relay and delayed retries publish through this port; the Service Bus client
/// implements it. It sends a message as given: a handler forwarding a message it received
/// sends [`Message::forwardable`], without the inbox's own properties.
pub trait Sender: Send + Sync + 'static {
    /// Sends `message` to `destination` (a queue or topic). With `scheduled_enqueue_time` the
    /// broker keeps the message invisible until then. `Ok` means the broker accepted it.
    fn send(
        &self,
        destination: &str,
        message: Message,
        scheduled_enqueue_time: Option<SystemTime>,
    ) -> impl Future<Output = Result<(), SendFailure>> + Send;
}
