//! The AMQP side of the emulator: a listener on the sb-amqp engine that maps Service Bus links,
//! `$cbs` and `$management` onto the [`Broker`].
//!
//! # Layout
//! - [`Emulator`]: start on an address, print the connection string, inspect, inject faults,
//!   drop connections, shut down.
//! - `codec`: AMQP messages ⇄ [`crate::BrokerMessage`], delivery annotations and batches.
//! - `sas`: shared access signature validation for `$cbs` put-token.
//! - `nodes`: `$cbs` and `<entity>/$management` request handling.
//! - `rules`: the subscription rule operations of `$management`.
//! - `links`: entity links: deliveries with lock tokens, dispositions, sends.
//! - `sessions`: session receiver links and the session operations of `$management`.
//! - `control`: what the service does to live entity links: the idle timer, token expiry,
//!   forced detaches ([`Emulator::force_detach_link`]), per-operation fault draws.
//! - `faults`: `--fault NAME=P` ([`Fault`], [`FaultSpec`]) and the seeded generator.

mod codec;
mod control;
mod faults;
mod links;
pub(crate) mod nodes;
mod rules;
mod sas;
mod sessions;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sb_amqp::types::definitions::Fields;
use sb_amqp::{
    AmqpError, AnyMessage, ConnectionEvent, LinkRequest, Listener, ServerOptions, condition,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Broker, Clock, Config, Error, Right, Rights, SharedAccessPolicy};
use control::{ControlContext, LinkControl, Registry};
pub use control::{LinkInfo, LinkRole};
use faults::Faults;
pub use faults::{Fault, FaultSpec};

/// The key name the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY_NAME: &str = "RootManageSharedAccessKey";
/// The key the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY: &str = "SAS_KEY_VALUE";

/// The service's `open`: max-frame-size 65536, channel-max 4999, idle-time-out 120000 ms, as
/// Service Bus answers (an `Open` received from the service, azure-sdk-for-java issue 31966:
/// `maxFrameSize=65536, channelMax=4999, idleTimeOut=120000`).
pub const SERVICE_MAX_FRAME_SIZE: u32 = 65_536;
/// See [`SERVICE_MAX_FRAME_SIZE`].
pub const SERVICE_CHANNEL_MAX: u16 = 4_999;
/// See [`SERVICE_MAX_FRAME_SIZE`]; a connection silent for longer is closed.
pub const SERVICE_IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// Service Bus force-detaches a link without transfers, flows or dispositions for 10 minutes
/// ("AmqpMessageConsumer.IdleTimerExpired: Idle timeout: 00:10:00").
pub const DEFAULT_LINK_IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// How an [`Emulator`] serves. Strict by default, like the service: idle links are
/// force-detached after [`DEFAULT_LINK_IDLE_TIMEOUT`], links are detached when their token
/// expires, and `open` carries the service's limits.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_emulator::{EmulatorOptions, Fault};
/// let options = EmulatorOptions::default()
///     .with_link_idle_timeout(Duration::from_secs(3))
///     .with_max_token_lifetime(Duration::from_secs(10))
///     .with_fault(Fault::BusySettle, 0.02)
///     .with_fault_seed(7);
/// assert_eq!(options.link_idle_timeout, Some(Duration::from_secs(3)));
/// ```
#[derive(Debug, Clone)]
pub struct EmulatorOptions {
    /// Address to bind, e.g. `127.0.0.1:0` for an ephemeral port.
    pub listen: String,
    /// The shared access key name tokens must be signed with.
    pub key_name: String,
    /// The shared access key.
    pub key: String,
    /// Accept JWTs on `$cbs` without validating them (Entra ID clients in development).
    pub accept_jwt: bool,
    /// Entity links idle this long are force-detached (`None`: never; the service has no such
    /// switch).
    pub link_idle_timeout: Option<Duration>,
    /// Caps how long a put token is honoured, whatever its own expiry.
    pub max_token_lifetime: Option<Duration>,
    /// Faults drawn per operation.
    pub faults: Vec<FaultSpec>,
    /// Seed of the fault draws; `None` picks one (logged) at start.
    pub fault_seed: Option<u64>,
    /// Also serve AMQP over WebSockets (plain `ws`, path `/$servicebus/websocket`,
    /// subprotocol `AMQPWSB10`) on this address.
    pub websocket_listen: Option<String>,
    /// Keys beside the root key ([`EmulatorOptions::key_name`], all rights), each with its
    /// rights (`SharedAccessPolicies` in `Config.json`).
    pub policies: Vec<SharedAccessPolicy>,
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            listen: "127.0.0.1:0".into(),
            key_name: KEY_NAME.into(),
            key: KEY.into(),
            accept_jwt: false,
            link_idle_timeout: Some(DEFAULT_LINK_IDLE_TIMEOUT),
            max_token_lifetime: None,
            faults: Vec::new(),
            fault_seed: None,
            websocket_listen: None,
            policies: Vec::new(),
        }
    }
}

impl EmulatorOptions {
    /// Force-detaches entity links idle for `timeout` (`Duration::ZERO` turns it off).
    #[must_use]
    pub fn with_link_idle_timeout(mut self, timeout: Duration) -> Self {
        self.link_idle_timeout = (!timeout.is_zero()).then_some(timeout);
        self
    }

    /// Honours no token for longer than `lifetime` after it was put.
    #[must_use]
    pub fn with_max_token_lifetime(mut self, lifetime: Duration) -> Self {
        self.max_token_lifetime = Some(lifetime);
        self
    }

    /// Injects `fault` with `probability` per operation (replacing an earlier setting).
    #[must_use]
    pub fn with_fault(mut self, fault: Fault, probability: f64) -> Self {
        self.faults.retain(|f| f.fault != fault);
        self.faults.push(FaultSpec { fault, probability });
        self
    }

    /// Seeds the fault draws, so a run can be replayed.
    #[must_use]
    pub fn with_fault_seed(mut self, seed: u64) -> Self {
        self.fault_seed = Some(seed);
        self
    }

    /// Binds `addr` (e.g. `127.0.0.1:0`).
    #[must_use]
    pub fn with_listen(mut self, addr: impl Into<String>) -> Self {
        self.listen = addr.into();
        self
    }

    /// Accepts tokens signed with `policy`'s key, with its rights only.
    #[must_use]
    pub fn with_policy(mut self, policy: SharedAccessPolicy) -> Self {
        self.policies.push(policy);
        self
    }

    /// The key named `name` and its rights: the root key has every right.
    pub(crate) fn key(&self, name: &str) -> Option<(&str, Rights)> {
        if name == self.key_name {
            return Some((&self.key, Rights::ALL));
        }
        self.policies
            .iter()
            .find(|p| p.name == name)
            .map(|p| (p.key.as_str(), p.rights))
    }

    /// Also serves AMQP over WebSockets (plain `ws`) on `addr`.
    #[must_use]
    pub fn with_websocket_listen(mut self, addr: impl Into<String>) -> Self {
        self.websocket_listen = Some(addr.into());
        self
    }
}

/// A running emulator.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), sb_emulator::Error> {
/// let config = sb_emulator::Config::from_json(r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"}],"Topics":[]}],"Logging":{"Type":"File"}}}"#)?;
/// let emulator = sb_emulator::Emulator::start(sb_emulator::Broker::new(config)?, Default::default()).await?;
/// assert!(emulator.connection_string().ends_with("UseDevelopmentEmulator=true;"));
/// emulator.shutdown().await;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Emulator {
    addr: SocketAddr,
    websocket_addr: Option<SocketAddr>,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    tracker: TaskTracker,
}

/// What every connection of one emulator shares.
#[derive(Debug)]
struct Shared {
    broker: Broker,
    options: Arc<EmulatorOptions>,
    registry: Arc<Registry>,
    faults: Arc<Faults>,
}

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
    replies: Mutex<HashMap<String, mpsc::UnboundedSender<AnyMessage>>>,
    clock: Clock,
    /// `--max-token-lifetime`: no grant outlives this.
    max_token_lifetime: Option<Duration>,
}

impl ConnState {
    pub(crate) fn new(clock: Clock, max_token_lifetime: Option<Duration>) -> Self {
        ConnState {
            granted: Mutex::new(Vec::new()),
            replies: Mutex::new(HashMap::new()),
            clock,
            max_token_lifetime,
        }
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

/// The entity path of a link address: scheme, host and port stripped.
pub(crate) fn link_path(address: &str) -> String {
    let rest = match address.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, p)| p),
        None => address,
    };
    rest.trim_matches('/').to_owned()
}

impl Emulator {
    /// Binds and serves `broker`.
    ///
    /// # Errors
    /// [`Error::Server`] when the address cannot be bound.
    pub async fn start(broker: Broker, options: EmulatorOptions) -> Result<Emulator, Error> {
        let server = ServerOptions {
            container_id: format!("sb-emulator-{}", broker.namespace()),
            max_frame_size: SERVICE_MAX_FRAME_SIZE,
            channel_max: SERVICE_CHANNEL_MAX,
            idle_timeout: Some(SERVICE_IDLE_TIMEOUT),
            ..ServerOptions::default()
        };
        let listener = Listener::bind(options.listen.as_str(), server.clone())
            .await
            .map_err(|e| Error::Server(format!("cannot listen on {}: {e}", options.listen)))?;
        let websocket = match &options.websocket_listen {
            Some(addr) => Some(
                Listener::bind_websocket(addr.as_str(), sb_amqp::WEBSOCKET_PATH, server)
                    .await
                    .map_err(|e| Error::Server(format!("cannot listen on {addr}: {e}")))?,
            ),
            None => None,
        };
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(e.to_string()))?;
        let websocket_addr = websocket
            .as_ref()
            .map(Listener::local_addr)
            .transpose()
            .map_err(|e| Error::Server(e.to_string()))?;
        let seed = options.fault_seed.unwrap_or_else(|| {
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        });
        if !options.faults.is_empty() {
            let faults: Vec<String> = options
                .faults
                .iter()
                .map(|f| format!("{}={}", f.fault, f.probability))
                .collect();
            tracing::info!(
                ?faults,
                seed,
                "Fault injection on (replay with --fault-seed)."
            );
        }
        let shared = Arc::new(Shared {
            broker,
            faults: Arc::new(Faults::new(&options.faults, seed)),
            options: Arc::new(options),
            registry: Arc::new(Registry::default()),
        });
        let emulator = Emulator {
            addr,
            websocket_addr,
            shared: shared.clone(),
            shutdown: CancellationToken::new(),
            connections: Arc::new(Mutex::new(Vec::new())),
            tracker: TaskTracker::new(),
        };
        for listener in std::iter::once(listener).chain(websocket) {
            emulator.tracker.spawn(accept_loop(
                listener,
                shared.clone(),
                emulator.shutdown.clone(),
                emulator.connections.clone(),
                emulator.tracker.clone(),
            ));
        }
        tracing::info!(%addr, websocket = ?websocket_addr, "Service Bus emulator listening.");
        Ok(emulator)
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The connection string clients use (plain AMQP, this port).
    pub fn connection_string(&self) -> String {
        format!(
            "Endpoint=sb://{};SharedAccessKeyName={};SharedAccessKey={};UseDevelopmentEmulator=true;",
            self.addr, self.shared.options.key_name, self.shared.options.key
        )
    }

    /// The WebSocket listener's address, when [`EmulatorOptions::websocket_listen`] is set.
    pub fn websocket_addr(&self) -> Option<SocketAddr> {
        self.websocket_addr
    }

    /// The connection string for AMQP over WebSockets (`TransportType=AmqpWebSockets`, plain
    /// `ws` on the WebSocket port), when [`EmulatorOptions::websocket_listen`] is set.
    pub fn websocket_connection_string(&self) -> Option<String> {
        self.websocket_addr.map(|addr| {
            format!(
                "Endpoint=sb://{addr};SharedAccessKeyName={};SharedAccessKey={};UseDevelopmentEmulator=true;TransportType=AmqpWebSockets;",
                self.shared.options.key_name, self.shared.options.key
            )
        })
    }

    /// The broker, for inspection and fault hooks.
    pub fn broker(&self) -> &Broker {
        &self.shared.broker
    }

    /// The live entity links (not `$cbs` / `$management`), oldest first. A link leaves the
    /// list as soon as the client's detach is answered, or when the emulator starts detaching
    /// it (before the client can see that detach).
    pub fn links(&self) -> Vec<LinkInfo> {
        self.shared.registry.list()
    }

    /// Detaches link `id` (from [`Emulator::links`]) with `error`, e.g.
    /// `AmqpError::new(condition::DETACH_FORCED, …)`; false when it is not live (no longer
    /// listed).
    pub fn force_detach_link(&self, id: u64, error: AmqpError) -> bool {
        self.shared.registry.detach(id, error)
    }

    /// Detaches every live link attached to `entity` (the path as the client attached it,
    /// case-insensitive: `orders`, `orders/$DeadLetterQueue`, `t/Subscriptions/s`) with
    /// `error`; returns how many were asked to.
    pub fn force_detach_entity(&self, entity: &str, error: AmqpError) -> usize {
        self.shared.registry.detach_entity(entity, &error)
    }

    /// Closes every client connection now (with `amqp:connection:forced`); new connections
    /// are still accepted.
    pub fn drop_all_connections(&self) {
        if let Ok(mut list) = self.connections.lock() {
            for token in list.drain(..) {
                token.cancel();
            }
        }
    }

    /// Stops accepting, closes every connection and waits (at most 10 s) for their tasks.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tracker.close();
        // A link task blocked on a client that stopped reading must not hold the process.
        if tokio::time::timeout(std::time::Duration::from_secs(10), self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.tracker.len(),
                "Emulator tasks still running after shutdown."
            );
        }
    }
}

async fn accept_loop(
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
    let mut conn = match incoming.handshake().await {
        Ok(conn) => conn,
        Err(error) => {
            tracing::debug!(%peer, %error, "Handshake failed.");
            return;
        }
    };
    let state = Arc::new(ConnState::new(
        shared.broker.clock(),
        shared.options.max_token_lifetime,
    ));
    let links = CancellationToken::new();
    loop {
        let event = tokio::select! {
            () = stop.cancelled() => {
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
        };
        let (shared, links) = (shared.clone(), links.clone());
        tracker.spawn(async move {
            if let Err(error) = serve_link(request, &shared, control, links).await {
                tracing::debug!(%error, "Link ended.");
            }
        });
    }
    links.cancel();
}

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
    if lower == "$cbs" {
        return nodes::serve(request, nodes::Node::Cbs, broker, options, state, stop).await;
    }
    if let Some(entity) = lower
        .strip_suffix("/$management")
        .map(|_| &path[..path.len() - "/$management".len()])
    {
        let entity = entity.to_owned();
        // Each operation checks its own right (nodes.rs); the link needs some valid token for
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
    if sessions::is_session_link(&request, &entity) {
        return sessions::serve(request, entity, control, stop).await;
    }
    links::serve(request, entity, control, stop).await
}

/// An error as the emulator puts it on the wire: `info` is always present (an empty map when
/// there is nothing to add). Python's pyamqp reads `error[2]` unconditionally on send
/// dispositions, management dispositions and `close`, and fails with `IndexError` when the
/// encoder drops a trailing null `info` (AMQP allows it; real Service Bus always writes it).
pub(crate) fn wire_error(condition: &str, description: Option<String>) -> AmqpError {
    AmqpError::new(condition, description).with_info(Fields::default())
}

fn unauthorized(path: &str) -> AmqpError {
    wire_error(
        condition::UNAUTHORIZED_ACCESS,
        Some(format!(
            "no valid token was put on $cbs for {path} (or a parent path)"
        )),
    )
}

/// Starts an emulator from a `Config.json` text on `listen`.
///
/// # Errors
/// Config and bind errors.
pub async fn start_from_json(json: &str, listen: &str) -> Result<Emulator, Error> {
    let broker = Broker::new(Config::from_json(json)?)?;
    Emulator::start(
        broker,
        EmulatorOptions {
            listen: listen.to_owned(),
            ..EmulatorOptions::default()
        },
    )
    .await
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

    #[test]
    fn wire_errors_always_carry_info() {
        let error = wire_error(condition::MESSAGE_SIZE_EXCEEDED, None);
        let encoded =
            sb_amqp::codec::to_vec(&sb_amqp::types::definitions::Error::from(error)).unwrap();
        // error{condition, description: null, info: {}}: three fields, the last an empty map.
        assert_eq!(&encoded[..3], &[0x00, 0x53, 0x1d]);
        assert_eq!(encoded[5], 3, "{encoded:02x?}");
        assert!(
            encoded.ends_with(&[0x40, 0xc1, 0x01, 0x00]),
            "{encoded:02x?}"
        );
    }
}
