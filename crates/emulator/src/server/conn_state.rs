//! [`ConnState`]: what one client connection holds: the audiences its put-tokens granted
//! ([`Grants`]), the routes to its reply links and the message locks its links delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_amqp::AnyMessage;
use tokio::sync::mpsc;

use super::faults::Faults;
use super::grants::Grants;
use super::request_log::RequestLog;
use super::survival::Survival;
use crate::{Clock, Entity};
use uuid::Uuid;

/// Per-connection state shared by its links.
#[derive(Debug)]
pub(crate) struct ConnState {
    /// Audiences granted by put-token, with their expiry and rights.
    pub(crate) grants: Arc<Grants>,
    /// Reply links by target address, link name, and `node:<node>`.
    pub(super) replies: Mutex<HashMap<String, mpsc::UnboundedSender<AnyMessage>>>,
    /// The emulator's injected connection-level faults and counters.
    pub(crate) survival: Arc<Survival>,
    /// The emulator's per-operation fault draws (`--fault cbs-busy`).
    pub(crate) faults: Arc<Faults>,
    /// Where `$management` requests are recorded (the emulator's log, shared by connections).
    pub(super) requests: Arc<RequestLog>,
    /// Message locks delivered on this connection's links, dropped when it ends.
    held_locks: Mutex<Vec<(Entity, Uuid)>>,
}

/// Held locks recorded before the settled ones are pruned.
const HELD_LOCKS_PRUNE_AT: usize = 4_096;

impl ConnState {
    pub(crate) fn new(clock: Clock, max_token_lifetime: Option<Duration>) -> Self {
        ConnState {
            grants: Arc::new(Grants::new(clock, max_token_lifetime)),
            replies: Mutex::new(HashMap::new()),
            requests: Arc::default(),
            held_locks: Mutex::new(Vec::new()),
            survival: Arc::default(),
            faults: Arc::new(Faults::new(&[], 0)),
        }
    }

    /// The same state reporting to the emulator's `survival` and drawing from its `faults`.
    pub(crate) fn with_service(mut self, survival: Arc<Survival>, faults: Arc<Faults>) -> Self {
        self.survival = survival;
        self.faults = faults;
        self
    }

    /// A peek-lock delivery of `entity` under `lock_token` went out on this connection.
    pub(crate) fn hold_lock(&self, entity: &Entity, lock_token: Uuid) {
        let Ok(mut held) = self.held_locks.lock() else {
            return;
        };
        if held.len() >= HELD_LOCKS_PRUNE_AT {
            held.retain(|(entity, token)| entity.is_locked(*token));
        }
        held.push((entity.clone(), lock_token));
    }

    /// The connection is gone: every lock still held by a delivery made on it is dropped, and
    /// its message is delivered again (delivery count + 1, dead-lettered at
    /// `MaxDeliveryCount`), as the service does: "If the reason is a broken network
    /// connection, the lock is dropped since Service Bus doesn't support recovery of existing
    /// AMQP links on a different connection" (Microsoft Learn, "Message transfers, locks, and
    /// settlement"). Settling such a message by its lock token afterwards reports the lock
    /// lost. Returns how many locks were dropped.
    pub(crate) fn drop_locks(&self) -> usize {
        let held = match self.held_locks.lock() {
            Ok(mut held) => std::mem::take(&mut *held),
            Err(_) => return 0,
        };
        held.into_iter()
            .filter(|(entity, token)| entity.expire_lock(*token).is_ok())
            .count()
    }

    /// Records this connection's `$management` requests in `log`.
    pub(crate) fn with_request_log(mut self, log: Arc<RequestLog>) -> Self {
        self.requests = log;
        self
    }

    pub(crate) fn route(&self, keys: &[String]) -> Option<mpsc::UnboundedSender<AnyMessage>> {
        let replies = self.replies.lock().ok()?;
        keys.iter().find_map(|k| replies.get(k).cloned())
    }
}
