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

/// The entity path of a link address: scheme, host and port stripped.
pub(crate) fn link_path(address: &str) -> String {
    let rest = match address.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, p)| p),
        None => address,
    };
    rest.trim_matches('/').to_owned()
}

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
    let live = shared.survival.opened(conn.connection().clone(), &state);
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

async fn serve_link(
    request: LinkRequest,
    shared: &Shared,
    control: ControlContext,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
    let (broker, options, state) = (
        shared.broker.clone(),
        shared.options.clone(),
        control.state.clone(),
    );
    let address = if request.is_peer_sender() {
        request.target_address().map(str::to_owned)
    } else {
        request.source_address().map(str::to_owned)
    };
    let path = link_path(address.as_deref().unwrap_or_default());
    let lower = path.to_ascii_lowercase();
    if let Some(error) = control.live.attach_refusal() {
        return request.reject(error).await;
    }
    let management_suffix = format!("/{}", management::NODE_SUFFIX);
    let kind = if lower == cbs::NODE {
        Attached::Cbs
    } else if lower.ends_with(&management_suffix) {
        Attached::Management
    } else {
        Attached::Entity
    };
    // A request/response pair counts once, by its request link.
    let counted = (request.is_peer_sender() || kind == Attached::Entity).then_some(kind);
    shared
        .survival
        .attached(&control.live, control.channel, counted);
    if lower == cbs::NODE {
        return nodes::serve(request, nodes::Node::Cbs, broker, options, state, stop).await;
    }
    if let Some(entity) = lower
        .strip_suffix(&management_suffix)
        .map(|_| &path[..path.len() - management_suffix.len()])
    {
        let entity = entity.to_owned();
        // Each operation checks its own right (`nodes`); the link needs some valid token for
        // its own path: a token for `q1` or for `q1/$management` (the JavaScript SDK puts the
        // latter before its management link, `src/core/managementClient.ts`).
        if !state.is_granted(&path, None) {
            return request.reject(unauthorized(&path)).await;
        }
        return nodes::serve(
            request,
            nodes::Node::Management(entity),
            broker,
            options,
            state,
            stop,
        )
        .await;
    }
    let entity = match broker.entity(&path) {
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
    if let Some(why) = state.refusal(&path, role.right()) {
        return request
            .reject(wire_error(condition::UNAUTHORIZED_ACCESS, Some(why)))
            .await;
    }
    let control = LinkControl::new(control, request.name(), &path, role);
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
