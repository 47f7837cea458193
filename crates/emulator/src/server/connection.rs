//! Serving connections: the accept loop, one task per connection, and the routing of each
//! attached link to `$cbs`, `<entity>/$management` or an entity link.

use std::sync::{Arc, Mutex};

use sb_amqp::servicebus::{cbs, management};
use sb_amqp::{AmqpError, ConnectionEvent, LinkRequest, Listener, condition};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::control::{ControlContext, LinkControl};
use super::links::EntityLink;
use super::survival::Attached;
use super::{ConnState, LinkRole, Shared, links, nodes, sessions, wire_error};
use crate::address::link_path;

pub(super) async fn accept_loop(
    listener: Listener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    tracker: TaskTracker,
) {
    loop {
        let incoming = tokio::select! {
            () = shutdown.cancelled() => return,
            incoming = listener.accept() => incoming,
        };
        let Ok(incoming) = incoming else { continue };
        let token = shutdown.child_token();
        if let Ok(mut list) = connections.lock() {
            list.retain(|t| !t.is_cancelled());
            list.push(token.clone());
        }
        let (shared, tracker2) = (shared.clone(), tracker.clone());
        tracker.spawn(async move {
            serve_connection(incoming, shared, token, tracker2).await;
        });
    }
}

async fn serve_connection(
    incoming: sb_amqp::IncomingConnection,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let peer = incoming.peer_addr();
    let latency = shared.options.latency;
    let conn = match incoming
        .handshake_or_http(|io| super::latency::delayed(io, latency))
        .await
    {
        Ok(sb_amqp::Accepted::Amqp(conn)) => conn,
        // The management API shares the TLS port with amqps and wss, as on the service.
        Ok(sb_amqp::Accepted::Http(io)) => {
            crate::http::serve(io, shared.broker.clone(), shared.clone()).await;
            return;
        }
        Err(error) => {
            tracing::debug!(%peer, %error, "Handshake failed.");
            return;
        }
    };
    serve_open(conn, &peer.to_string(), shared, stop, tracker).await;
}

/// Serves one AMQP connection given as a byte stream ([`super::Emulator::serve_stream`]):
/// the server handshake (bounded by the handshake timeout), then as any accepted connection.
pub(super) async fn serve_stream(
    io: sb_amqp::BoxIo,
    peer: String,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let io = super::latency::delayed(io, shared.options.latency);
    let limit = shared.server.handshake_timeout;
    let conn = match tokio::time::timeout(limit, sb_amqp::serve_io(io, shared.server.clone())).await
    {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "Handshake failed.");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "Handshake timed out.");
            return;
        }
    };
    serve_open(conn, &peer, shared, stop, tracker).await;
}

/// Serves an open connection until it ends or `stop`: each link in a task of its own.
async fn serve_open(
    mut conn: sb_amqp::ServerConnection,
    peer: &str,
    shared: Arc<Shared>,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let state = Arc::new(
        ConnState::new(shared.broker.clock(), shared.options.max_token_lifetime)
            .with_service(shared.survival.clone(), shared.faults.clone())
            .with_request_log(shared.requests.clone()),
    );
    let live = shared
        .survival
        .opened(conn.connection().clone(), &state.grants);
    let links = CancellationToken::new();
    // This connection's link tasks, so its locks are dropped only after they applied what
    // the client settled before the end.
    let link_tasks = TaskTracker::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => {
                // A client that already went needs no close frame.
                let _ = conn.connection().close_with(Some(wire_error(condition::CONNECTION_FORCED, Some("dropped by the emulator".to_owned())))).await;
                break;
            }
            event = conn.next_event() => event,
        };
        let Some(ConnectionEvent::Link(request)) = event else {
            break;
        };
        let control = ControlContext {
            registry: shared.registry.clone(),
            faults: shared.faults.clone(),
            idle_timeout: shared.options.link_idle_timeout,
            clock: shared.broker.clock(),
            state: state.clone(),
            connection: stop.clone(),
            live: live.clone(),
            channel: request.channel(),
        };
        let (shared, links) = (shared.clone(), links.clone());
        tracker.spawn(link_tasks.track_future(async move {
            if let Err(error) = serve_link(request, &shared, control, links).await {
                tracing::debug!(%error, "Link ended.");
            }
        }));
    }
    links.cancel();
    shared.survival.closed(&live);
    if shared.options.keep_locks_on_connection_loss {
        return;
    }
    link_tasks.close();
    // Bounded: a link task blocked on a client that stopped reading must not keep the locks.
    let _ = tokio::time::timeout(LINK_END_WAIT, link_tasks.wait()).await;
    let dropped = state.drop_locks();
    if dropped > 0 {
        tracing::info!(%peer, dropped, "Connection ended; its message locks are dropped.");
    }
}

/// How long a connection's end waits for its link tasks before dropping their locks.
const LINK_END_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where a link attaches: `$cbs`, an entity's `$management` node (the entity's path), or an
/// entity.
enum Target {
    Cbs,
    Management(String),
    Entity,
}

impl Target {
    /// The target of `path` (keywords compare case-insensitively).
    fn of(path: &str) -> Target {
        let lower = path.to_ascii_lowercase();
        let suffix = format!("/{}", management::NODE_SUFFIX);
        if lower == cbs::NODE {
            Target::Cbs
        } else if lower.ends_with(&suffix) {
            // ASCII lowercasing keeps every byte offset, so the suffix cuts `path` there too.
            Target::Management(path[..path.len() - suffix.len()].to_owned())
        } else {
            Target::Entity
        }
    }

    fn kind(&self) -> Attached {
        match self {
            Target::Cbs => Attached::Cbs,
            Target::Management(_) => Attached::Management,
            Target::Entity => Attached::Entity,
        }
    }
}

/// Serves one attached link: refused while the connection refuses attaches, else counted and
/// routed to `$cbs`, a `$management` node or an entity.
async fn serve_link(
    request: LinkRequest,
    shared: &Shared,
    control: ControlContext,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let address = if request.is_peer_sender() {
        request.target_address()
    } else {
        request.source_address()
    };
    let path = link_path(address.unwrap_or_default());
    if let Some(error) = control.live.attach_refusal() {
        return request.reject(error).await;
    }
    let target = Target::of(&path);
    // A request/response pair counts once, by its request link.
    let counted =
        (request.is_peer_sender() || matches!(target, Target::Entity)).then_some(target.kind());
    shared
        .survival
        .attached(&control.live, control.channel, counted);
    let state = control.state.clone();
    match target {
        Target::Cbs => serve_node(request, nodes::Node::Cbs, shared, state, stop).await,
        Target::Management(entity) => {
            // Each operation checks its own right (`nodes`); the link needs some valid token
            // for its own path: a token for `q1` or for `q1/$management` (the JavaScript SDK
            // puts the latter before its management link, `src/core/managementClient.ts`).
            if !state.grants.is_granted(&path, None) {
                return request.reject(unauthorized(&path)).await;
            }
            let node = nodes::Node::Management(entity);
            serve_node(request, node, shared, state, stop).await
        }
        Target::Entity => serve_entity(request, &path, shared, control, stop).await,
    }
}

async fn serve_node(
    request: LinkRequest,
    node: nodes::Node,
    shared: &Shared,
    state: Arc<ConnState>,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let (broker, options) = (shared.broker.clone(), shared.options.clone());
    nodes::serve(request, node, broker, options, state, stop).await
}

/// Serves an entity link: the entity must exist and the connection's token grant the link's
/// right (Send for a sender, Listen for a receiver); session links go to `sessions`.
async fn serve_entity(
    request: LinkRequest,
    path: &str,
    shared: &Shared,
    control: ControlContext,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let entity = match shared.broker.entity(path) {
        Ok(entity) => entity,
        Err(error) => {
            return request
                .reject(wire_error(error.condition(), Some(error.to_string())))
                .await;
        }
    };
    let role = if request.is_peer_sender() {
        LinkRole::Sender
    } else {
        LinkRole::Receiver
    };
    if let Some(why) = control.state.grants.refusal(path, role.right()) {
        return request
            .reject(wire_error(condition::UNAUTHORIZED_ACCESS, Some(why)))
            .await;
    }
    let control = LinkControl::new(control, request.name(), path, role);
    let session = sessions::is_session_link(&request, &entity);
    let link = EntityLink {
        request,
        entity,
        control,
        stop,
        answer_delay: shared.attach_delay(),
    };
    if session {
        return sessions::serve(link).await;
    }
    links::serve(link).await
}

fn unauthorized(path: &str) -> AmqpError {
    wire_error(
        condition::UNAUTHORIZED_ACCESS,
        Some(format!(
            "no valid token was put on $cbs for {path} (or a parent path)"
        )),
    )
}
