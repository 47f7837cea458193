//! [`Grants`]: the audiences one connection's put-tokens granted, with expiry and rights, and
//! the checks links and `$management` requests make against them. A file of its own so the
//! emulator-wide [`super::Survival`] can revoke a connection's tokens without naming the
//! connection's whole state (issue 46: no conn_state <-> survival circle).

use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use crate::{Clock, Right, Rights};

/// What one put-token granted.
#[derive(Debug)]
struct Grant {
    /// Audience path (lowercase, no host).
    path: String,
    expires: Option<SystemTime>,
    rights: Rights,
}

/// The audiences one connection's put-tokens granted.
#[derive(Debug)]
pub(crate) struct Grants {
    granted: Mutex<Vec<Grant>>,
    clock: Clock,
    /// `--max-token-lifetime`: no grant outlives this.
    max_token_lifetime: Option<Duration>,
}

impl Grants {
    pub(crate) fn new(clock: Clock, max_token_lifetime: Option<Duration>) -> Self {
        Grants {
            granted: Mutex::new(Vec::new()),
            clock,
            max_token_lifetime,
        }
    }

    /// Records a put-token for `audience` valid until `expires` (`None`: the token carries no
    /// expiry), capped by `--max-token-lifetime`, with the signing key's `rights`. A fresh
    /// token replaces the older one.
    pub(crate) fn grant(&self, audience: &str, expires: Option<SystemTime>, rights: Rights) {
        let path = audience_path(audience);
        let expires = capped_expiry(expires, self.clock.now(), self.max_token_lifetime);
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
fn audience_path(audience: &str) -> String {
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

/// Token expiry per grant: `min(token expiry, grant time + cap)`; `None` never expires.
fn capped_expiry(
    token: Option<SystemTime>,
    now: SystemTime,
    cap: Option<Duration>,
) -> Option<SystemTime> {
    let capped = cap.and_then(|cap| now.checked_add(cap));
    match (token, capped) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn audiences_cover_their_entity_and_its_sub_paths() {
        let state = Grants::new(crate::Clock::new(), None);
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
        let state = Grants::new(crate::Clock::new(), None);
        state.grant(
            "sb://localhost:5699/q1/$management",
            None,
            crate::Rights::ALL,
        );
        assert!(state.is_granted("q1/$management", None));
        assert!(!state.is_granted("q1", None));
        assert!(!state.is_granted("q1/$DeadLetterQueue", None));
        let state = Grants::new(crate::Clock::new(), None);
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
