//! The namespace: queues and topics by name, and the dead-letter forwarders whose timers run
//! on every operation.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::SystemTime;

use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::message::BrokerMessage;

use super::{MessageQueue, Topic};

#[derive(Debug, Clone)]
pub(super) enum Node {
    Queue(Arc<MessageQueue>),
    Topic(Arc<Topic>),
}

pub(super) struct Namespace {
    pub(super) name: String,
    pub(super) clock: Clock,
    /// Queues and topics by lower-case name (created and deleted at run time by the HTTP
    /// management API; never held across another lock).
    pub(super) nodes: RwLock<HashMap<String, Node>>,
    /// Queues and subscriptions with `ForwardDeadLetteredMessagesTo`: their timers are
    /// processed on every operation, so a message they dead-letter by lock expiry or TTL
    /// reaches its target without waiting for an operation on the source.
    pub(super) dlq_forwarders: RwLock<Vec<Arc<MessageQueue>>>,
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("entities", &self.nodes().len())
            .finish_non_exhaustive()
    }
}

impl Namespace {
    pub(super) fn node(&self, name: &str) -> Result<Node> {
        self.nodes()
            .get(&name.to_ascii_lowercase())
            .cloned()
            .ok_or_else(|| Error::NotFound {
                entity: name.to_owned(),
            })
    }

    pub(super) fn nodes(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Node>> {
        self.nodes.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn nodes_mut(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Node>> {
        self.nodes.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn forwarders(&self) -> Vec<Arc<MessageQueue>> {
        self.dlq_forwarders
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Registers or forgets `queue` as a dead-letter forwarder, after its properties changed.
    pub(super) fn track_forwarder(&self, queue: &Arc<MessageQueue>) {
        let mut list = self
            .dlq_forwarders
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        list.retain(|q| !Arc::ptr_eq(q, queue));
        if queue.props().forward_dead_lettered_messages_to.is_some() {
            list.push(queue.clone());
        }
    }

    /// Forgets `queue` as a dead-letter forwarder (it was deleted).
    pub(super) fn untrack_forwarder(&self, queue: &Arc<MessageQueue>) {
        self.dlq_forwarders
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|q| !Arc::ptr_eq(q, queue));
    }

    /// Processes the timers of every dead-letter forwarder and forwards what they dead-letter.
    pub(super) fn tick_forwarders(&self, now: SystemTime) {
        for queue in &self.forwarders() {
            let (forwards, dirty) = {
                let mut st = queue.lock();
                st.tick(now);
                (
                    std::mem::take(&mut st.forwards),
                    std::mem::take(&mut st.dirty),
                )
            };
            if dirty {
                queue.notify.notify_waiters();
            }
            if !forwards.is_empty() {
                self.forward_dead_letters(queue, forwards);
            }
        }
    }

    /// The earliest timer of any dead-letter forwarder.
    pub(super) fn forwarders_next_due(&self) -> Option<SystemTime> {
        self.forwarders()
            .iter()
            .filter_map(|q| q.lock().next_due(false))
            .min()
    }

    /// Passes dead-lettered messages on to `ForwardDeadLetteredMessagesTo`.
    pub(super) fn forward_dead_letters(&self, queue: &MessageQueue, messages: Vec<BrokerMessage>) {
        let Some(target) = queue.props().forward_dead_lettered_messages_to else {
            return;
        };
        for msg in messages {
            let result = self
                .node(&target)
                .and_then(|node| self.route(&node, msg, 1));
            if let Err(error) = result {
                tracing::warn!(entity = %queue.path, target = %target, %error, "Dead-lettered message could not be forwarded.");
            }
        }
    }
}
