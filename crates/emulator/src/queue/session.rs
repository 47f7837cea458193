//! One message session's record in a session-enabled queue or subscription: who holds its lock
//! until when, and its state. The operations on sessions are in `sessions` (an `impl
//! QueueState`); the record is a file of its own so that [`super::QueueState`], which holds the
//! records, and those operations import each other in no circle (issue 46).

use std::time::SystemTime;

use bytes::Bytes;

/// A message session of a session-enabled queue or subscription.
#[derive(Debug, Default)]
pub(super) struct Session {
    pub(super) locked_until: Option<SystemTime>,
    /// Which acceptance holds the lock: raised by every accept, so a link that lost the
    /// session (its lock expired and another receiver took it) can neither take messages nor
    /// release the newer holder's lock.
    pub(super) holder: u64,
    pub(super) state: Option<Bytes>,
    /// When the state was last set (`get-message-sessions` with `last-updated-time`).
    pub(super) state_updated: Option<SystemTime>,
}
