//! A queue or subscription as the broker holds it: its state behind one mutex and its
//! waiting receivers.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::config::EntityProperties;
use crate::queue::QueueState;

/// A queue or subscription: its state and its waiting receivers.
#[derive(Debug)]
pub(super) struct MessageQueue {
    pub(super) path: String,
    pub(super) props: EntityProperties,
    /// Subscriptions do not show scheduled messages in peek (they stay with the topic).
    pub(super) is_subscription: bool,
    pub(super) state: Mutex<QueueState>,
    pub(super) notify: Notify,
}

impl MessageQueue {
    pub(super) fn new(path: String, props: EntityProperties, is_subscription: bool) -> Self {
        MessageQueue {
            state: Mutex::new(QueueState::new(path.clone(), props.clone())),
            path,
            props,
            is_subscription,
            notify: Notify::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic under the lock cannot leave the state half-updated in a way that matters for
        // a test emulator; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
