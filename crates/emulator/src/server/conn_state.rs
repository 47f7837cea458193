//! [`ConnState`]: what one client connection holds: the audiences its put-tokens granted
//! (with expiry and rights) and the routes to its reply links.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sb_amqp::AnyMessage;
use tokio::sync::mpsc;

use super::control;
use super::faults::Faults;
use super::request_log::RequestLog;
use super::survival::Survival;
use crate::{Clock, Entity, Right, Rights};
use uuid::Uuid;

/// What one put-token granted.
#[derive(Debug)]
struct Grant {
    /// Audience path (lowercase, no host).
    path: String,
    expires: Option<SystemTime>,
    rights: Rights,
}

/// Per-connection state shared by its links.
#[derive(Debug)]
pub(crate) struct ConnState {
    /// Audiences granted by put-token, with their expiry and rights.
    granted: Mutex<Vec<Grant>>,
    /// Reply links by target address, link name, and `node:<node>`.
    pub(super) replies: Mutex<HashMap<String, mpsc::UnboundedSender<AnyMessage>>>,
    clock: Clock,
    /// `--max-token-lifetime`: no grant outlives this.
    max_token_lifetime: Option<Duration>,
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
            granted: Mutex::new(Vec::new()),
            replies: Mutex::new(HashMap::new()),
            clock,
            max_token_lifetime,
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

    /// Records a put-token for `audience` valid until `expires` (`None`: the token carries no
    /// expiry), capped by `--max-token-lifetime`, with the signing key's `rights`. A fresh
    /// token replaces the older one.
    pub(crate) fn grant(&self, audience: &str, expires: Option<SystemTime>, rights: Rights) {
        let path = audience_path(audience);
        let expires = control::capped_expiry(expires, self.clock.now(), self.max_token_lifetime);
        if let Ok(mut granted) = self.granted.lock() {
            granted.retain(|g| g.path != path);
            granted.push(Grant {
                path,
                expires,
                rights,
            });
        }
    }

    /// When access to `entity` with `right` (any right: `None`) ends: the latest expiry of
    /// the grants covering it (same path or a parent path); `None` when such a grant never
    /// expires; the epoch when none covers it.
    pub(crate) fn token_expiry(&self, entity: &str, right: Option<Right>) -> Option<SystemTime> {
        let entity = entity.trim_matches('/').to_ascii_lowercase();
        let Ok(granted) = self.granted.lock() else {
            return Some(SystemTime::UNIX_EPOCH);
        };
        let mut latest = Some(SystemTime::UNIX_EPOCH);
        for grant in granted.iter() {
            if covers(&grant.path, &entity) && right.is_none_or(|r| grant.rights.allows(r)) {
                latest = match (latest, grant.expires) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            }
        }
        latest
    }

    /// True when an unexpired grant covers `entity` with `right` (any right: `None`).
    pub(crate) fn is_granted(&self, entity: &str, right: Option<Right>) -> bool {
        self.token_expiry(entity, right)
            .is_none_or(|expiry| expiry > self.clock.now())
    }

    /// Why `entity` may not be used with `right`: no valid token, or a token without the
    /// right (the service: "Unauthorized access. 'Listen' claim(s) are required to perform
    /// this operation. Resource: 'sb://…/queue'.", azure-sdk-for-python issue 23487).
    pub(crate) fn refusal(&self, entity: &str, right: Right) -> Option<String> {
        if !self.is_granted(entity, None) {
            return Some(format!("no valid token was put on $cbs for {entity}"));
        }
        (!self.is_granted(entity, Some(right))).then(|| {
            format!(
                "Unauthorized access. '{right}' claim(s) are required to perform this operation. Resource: '{entity}'."
            )
        })
    }

    /// Forgets the grant of `audience` (a revoked token); returns how many went (0 or 1).
    pub(crate) fn revoke(&self, audience: &str) -> usize {
        let path = audience_path(audience);
        let Ok(mut granted) = self.granted.lock() else {
            return 0;
        };
        let before = granted.len();
        granted.retain(|g| g.path != path);
        before - granted.len()
    }

    pub(crate) fn route(&self, keys: &[String]) -> Option<mpsc::UnboundedSender<AnyMessage>> {
        let replies = self.replies.lock().ok()?;
        keys.iter().find_map(|k| replies.get(k).cloned())
    }
}

/// Whether the granted audience path `audience` covers `path` (both lowercase, no host): equal,
/// or a parent at a segment boundary (`q1` covers `q1/$management`, not `q10`). The empty path
/// (a token for the whole namespace) covers everything.
fn covers(audience: &str, path: &str) -> bool {
    audience.is_empty()
        || path == audience
        || path
            .strip_prefix(audience)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// An audience's entity path, lowercase: `sb://host:port/a/b`, `amqp://host/a/b` → `a/b`;
/// `sb://host` → `` (the namespace). An audience without a scheme is a path already (`a/b`);
/// one whose first segment names a host with a port (`host:5672/a/b`) drops it, since entity
/// names cannot contain `:`.
pub(crate) fn audience_path(audience: &str) -> String {
    let path = match audience.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, p)| p),
        None => match audience.trim_start_matches('/').split_once('/') {
            Some((host, p)) if host.contains(':') => p,
            _ if !audience.contains('/') && audience.contains(':') => "",
            _ => audience,
        },
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    path.trim_matches('/').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audiences_cover_their_entity_and_its_sub_paths() {
        let state = ConnState::new(crate::Clock::new(), None);
        state.grant("sb://127.0.0.1:5699/Orders", None, crate::Rights::ALL);
        for path in [
            "orders",
            "Orders/$management",
            "orders/$DeadLetterQueue",
            "orders/$DeadLetterQueue/$management",
        ] {
            assert!(state.is_granted(path, None), "{path}");
        }
        for path in ["orders2", "order", "other/$management", "$cbs"] {
            assert!(!state.is_granted(path, None), "{path}");
        }
    }

    #[test]
    fn a_management_audience_covers_only_the_management_node() {
        // What the JavaScript SDK puts before its management link.
        let state = ConnState::new(crate::Clock::new(), None);
        state.grant(
            "sb://localhost:5699/q1/$management",
            None,
            crate::Rights::ALL,
        );
        assert!(state.is_granted("q1/$management", None));
        assert!(!state.is_granted("q1", None));
        assert!(!state.is_granted("q1/$DeadLetterQueue", None));
        let state = ConnState::new(crate::Clock::new(), None);
        state.grant(
            "amqp://localhost/t1/Subscriptions/s1/$DeadLetterQueue",
            None,
            crate::Rights::ALL,
        );
        assert!(state.is_granted("t1/subscriptions/s1/$deadletterqueue/$management", None));
        assert!(!state.is_granted("t1/Subscriptions/s1", None));
    }

    #[test]
    fn audience_forms() {
        for (audience, path) in [
            ("sb://host:5699/q1", "q1"),
            ("sb://host/q1/", "q1"),
            ("sb://host", ""),
            ("sb://host/", ""),
            (
                "amqps://ns.servicebus.windows.net/T/Subscriptions/S",
                "t/subscriptions/s",
            ),
            ("q1", "q1"),
            ("/q1/$management", "q1/$management"),
            ("my.queue/$management", "my.queue/$management"),
            ("host:5699/q1", "q1"),
            ("host:5699", ""),
            ("sb://host/q1?x=1", "q1"),
        ] {
            assert_eq!(audience_path(audience), path, "{audience}");
        }
        // A namespace token covers everything; a sibling name is no parent.
        assert!(covers("", "q1/$management"));
        assert!(!covers("q1", "q10"));
        assert!(!covers("q1/$management", "q1"));
    }
}
