//! A queue or subscription as the broker holds it: its state behind one mutex and its
//! waiting receivers.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};

use std::time::SystemTime;

use tokio::sync::Notify;

use crate::config::EntityProperties;
use crate::queue::QueueState;

/// A queue or subscription: its state and its waiting receivers.
#[derive(Debug)]
pub(super) struct MessageQueue {
    pub(super) path: String,
    /// Replaced by the HTTP management API's updates (read a copy with [`MessageQueue::props`]).
    props: RwLock<EntityProperties>,
    /// Subscriptions do not show scheduled messages in peek (they stay with the topic).
    pub(super) is_subscription: bool,
    /// When the HTTP management API says it was created and last updated.
    pub(super) times: RwLock<Times>,
    pub(super) state: Mutex<QueueState>,
    pub(super) notify: Notify,
}

impl MessageQueue {
    pub(super) fn new(
        path: String,
        props: EntityProperties,
        is_subscription: bool,
        created: SystemTime,
    ) -> Self {
        MessageQueue {
            times: RwLock::new(Times::new(created)),
            state: Mutex::new(QueueState::new(path.clone(), props.clone())),
            path,
            props: RwLock::new(props),
            is_subscription,
            notify: Notify::new(),
        }
    }

    /// The current properties.
    pub(super) fn props(&self) -> EntityProperties {
        self.props
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replaces the properties; the timers and limits of the state take them from now on.
    pub(super) fn set_props(&self, props: EntityProperties, now: SystemTime) {
        self.lock().props = props.clone();
        self.times
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .updated = now;
        *self.props.write().unwrap_or_else(PoisonError::into_inner) = props;
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic under the lock cannot leave the state half-updated in a way that matters for
        // a test emulator; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// An entity's creation and last update times (the management API's `CreatedAt`, `UpdatedAt`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Times {
    pub(super) created: SystemTime,
    pub(super) updated: SystemTime,
}

impl Times {
    pub(super) fn new(created: SystemTime) -> Self {
        Times {
            created,
            updated: created,
        }
    }
}
