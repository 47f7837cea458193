//! [`ConnectionScope`]: what every link of a client shares (one AMQP connection, its session,
//! its request/response nodes and the tokens kept fresh on it), and the bookkeeping that
//! replaces a connection whose links keep failing.
//!
//! Below the client and its links: the client opens and replaces scopes, the links (and `$cbs`)
//! hold one and report their failures to it ([`ConnectionScope::observe`]), never the client.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use sb_amqp::types::messaging::{Message, SerializableBody};
use sb_amqp::{AnyMessage, Connection, Session};
use tokio_util::sync::CancellationToken;

use super::node::Node;

/// Link failures of one connection with `amqp:internal-error` or an unknown condition within
/// [`POISON_WINDOW`] after which the connection is replaced (issue 29 item 9;
/// docs/servicebus-amqp.md records Go recovering the connection for internal and unknown
/// errors, while the `azservicebus/internal/errors.go` read for this change calls
/// `amqp:internal-error` fatal: we keep the link for a few tries, then move, rather than
/// either). The count is the project's own policy; protocol3 F6: only link-level outcomes
/// count, within a window, and only a healthy answer of the same kind of operation clears it
/// (an attach that works, or a `$management` reply of any status, is no sign that the links
/// that keep failing are fine).
const POISONED_AFTER: usize = 3;
/// How far back internal errors count toward [`POISONED_AFTER`].
const POISON_WINDOW: Duration = Duration::from_secs(120);

/// The kind of operation a link outcome belongs to: a healthy answer clears the internal
/// errors of its own kind only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkKind {
    /// Entity send and receive links.
    Entity,
    /// `$cbs` and `<entity>/$management` request/response links.
    Node,
}

/// Internal errors seen on one connection, by kind, within [`POISON_WINDOW`].
#[derive(Debug, Default)]
pub(super) struct InternalErrors {
    seen: std::collections::VecDeque<(tokio::time::Instant, LinkKind)>,
    /// Reached [`POISONED_AFTER`] once: the connection is not used again.
    poisoned: bool,
}

/// What every link of a client shares: one AMQP connection to the namespace, its session, its
/// request/response nodes (`$cbs`, `<entity>/$management`) and the tokens kept fresh on it
/// (.NET `AmqpConnectionScope`). Replaced as a whole after a connection-level failure.
#[derive(Debug)]
pub(crate) struct ConnectionScope {
    pub(crate) connection: Connection,
    pub(crate) session: Session,
    /// `$cbs` and `<entity>/$management`, attached on first use and re-attached after a
    /// failure.
    pub(super) nodes: StdMutex<HashMap<String, Arc<Node>>>,
    /// Audiences whose token is put and kept fresh on this connection.
    pub(super) refreshing: StdMutex<HashSet<String>>,
    /// Ends this connection's refresh tasks when it is replaced, dropped, or the client goes.
    pub(super) stop: CancellationToken,
    /// The service ended our AMQP session (the connection may live on): the next caller
    /// begins a new session.
    pub(super) session_ended: AtomicBool,
    /// Link failures with `amqp:internal-error` or an unknown condition lately: at
    /// [`POISONED_AFTER`] within [`POISON_WINDOW`] the connection is replaced.
    pub(super) internal_errors: StdMutex<InternalErrors>,
    /// One put-token at a time per audience (azure-amqp `Singleton`): concurrent callers wait
    /// for the first one's token instead of putting their own.
    pub(super) authorizing: StdMutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl Drop for ConnectionScope {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl ConnectionScope {
    pub(super) fn is_healthy(&self) -> bool {
        self.connection.error().is_none()
            && !self.session.is_ended()
            && !self.session_ended.load(Ordering::Acquire)
            && !self.is_poisoned()
    }

    pub(super) fn is_poisoned(&self) -> bool {
        self.internal_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .poisoned
    }

    /// Takes note of a failure of an entity link on this connection: an ended session makes
    /// the next caller begin a new one; repeated internal errors move to a new connection.
    pub(crate) fn observe(&self, error: &sb_amqp::Error) {
        self.observe_as(error, LinkKind::Entity);
    }

    /// As [`ConnectionScope::observe`], for a link of `kind`.
    pub(crate) fn observe_as(&self, error: &sb_amqp::Error, kind: LinkKind) {
        if matches!(error, sb_amqp::Error::SessionEnded(_)) {
            if !self.session_ended.swap(true, Ordering::AcqRel) {
                tracing::warn!(%error, "The service ended the AMQP session; beginning a new one.");
            }
            return;
        }
        if is_internal_error(error) {
            let now = tokio::time::Instant::now();
            let mut errors = self
                .internal_errors
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            errors
                .seen
                .retain(|(at, _)| now.saturating_duration_since(*at) < POISON_WINDOW);
            errors.seen.push_back((now, kind));
            let count = errors.seen.len();
            if count >= POISONED_AFTER && !errors.poisoned {
                errors.poisoned = true;
                tracing::warn!(%error, count, window = ?POISON_WINDOW, "Repeated internal errors on one connection; moving to a new connection.");
            }
        }
    }

    /// A link of `kind` on this connection answered as a healthy one does (a delivery, a
    /// successful `$management` reply): its kind's internal errors are forgotten.
    pub(crate) fn observe_healthy(&self, kind: LinkKind) {
        self.internal_errors
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .seen
            .retain(|(_, k)| *k != kind);
    }

    pub(super) fn authorizing(&self, audience: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.authorizing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(audience.to_owned())
            .or_default()
            .clone()
    }

    pub(super) fn node(&self, address: &str) -> Arc<Node> {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        nodes
            .entry(address.to_owned())
            .or_insert_with(|| Arc::new(Node::new(address)))
            .clone()
    }

    /// Marks `audience` as refreshed here; true for the first caller only.
    pub(super) fn start_refreshing(&self, audience: &str) -> bool {
        self.refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(audience.to_owned())
    }

    pub(super) fn is_refreshing(&self, audience: &str) -> bool {
        self.refreshing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(audience)
    }

    /// Sends a request to `address` on this connection.
    pub(crate) async fn request<B: SerializableBody>(
        &self,
        address: &str,
        request: Message<B>,
        timeout: Duration,
    ) -> Result<AnyMessage, sb_amqp::Error> {
        let replied = self
            .node(address)
            .request(&self.session, request, timeout)
            .await;
        if let Err(error) = &replied {
            self.observe_as(error, LinkKind::Node);
        }
        replied
    }
}

/// `amqp:internal-error`, `amqp:unknown-error` or a condition we do not know, on a link: what
/// counts toward [`POISONED_AFTER`].
fn is_internal_error(error: &sb_amqp::Error) -> bool {
    match error.condition() {
        Some(c) => crate::error::is_internal_condition(c),
        None => false,
    }
}
