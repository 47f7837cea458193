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

mod codec;
mod links;
mod nodes;
mod rules;
mod sas;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use sb_amqp::types::definitions::Fields;
use sb_amqp::{
    AmqpError, AnyMessage, ConnectionEvent, LinkRequest, Listener, ServerOptions, condition,
};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Broker, Config, Error};

/// The key name the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY_NAME: &str = "RootManageSharedAccessKey";
/// The key the emulator's connection string uses, as Microsoft's emulator does.
pub const KEY: &str = "SAS_KEY_VALUE";

/// How an [`Emulator`] serves.
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
}

impl Default for EmulatorOptions {
    fn default() -> Self {
        EmulatorOptions {
            listen: "127.0.0.1:0".into(),
            key_name: KEY_NAME.into(),
            key: KEY.into(),
            accept_jwt: false,
        }
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
    broker: Broker,
    options: Arc<EmulatorOptions>,
    shutdown: CancellationToken,
    connections: Arc<Mutex<Vec<CancellationToken>>>,
    tracker: TaskTracker,
}

/// Per-connection state shared by its links.
#[derive(Debug, Default)]
pub(crate) struct ConnState {
    /// Audience paths (lowercase, no host) granted by put-token.
    granted: Mutex<Vec<String>>,
    /// Reply links by target address, link name, and `node:<node>`.
    replies: Mutex<HashMap<String, mpsc::UnboundedSender<AnyMessage>>>,
}

impl ConnState {
    pub(crate) fn grant(&self, audience: &str) {
        let path = audience_path(audience);
        if let Ok(mut granted) = self.granted.lock() {
            granted.push(path);
        }
    }

    /// True when a granted audience covers the link path `path` (`q1`, `q1/$management`,
    /// `t/Subscriptions/s/$DeadLetterQueue`): the same path or a parent of it.
    ///
    /// Service Bus reads a token's audience as a URI prefix: a token for `sb://ns/q1` covers
    /// `q1`, its dead-letter queue and its `$management` node, while a token for
    /// `sb://ns/q1/$management` covers only that node. The JavaScript SDK puts the latter
    /// before its management link (`ManagementClient`'s audience is
    /// `${endpoint}${entityPath}/$management` in `@azure/service-bus` 7.9
    /// `src/core/managementClient.ts`), so the check is made on the link's own path.
    pub(crate) fn is_granted(&self, path: &str) -> bool {
        let path = path.trim_matches('/').to_ascii_lowercase();
        self.granted
            .lock()
            .is_ok_and(|granted| granted.iter().any(|audience| covers(audience, &path)))
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
    /// [`Error::Config`] when the address cannot be bound.
    pub async fn start(broker: Broker, options: EmulatorOptions) -> Result<Emulator, Error> {
        let server = ServerOptions {
            container_id: format!("sb-emulator-{}", broker.namespace()),
            ..ServerOptions::default()
        };
        let listener = Listener::bind(options.listen.as_str(), server)
            .await
            .map_err(|e| Error::Server(format!("cannot listen on {}: {e}", options.listen)))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(e.to_string()))?;
        let emulator = Emulator {
            addr,
            broker,
            options: Arc::new(options),
            shutdown: CancellationToken::new(),
            connections: Arc::new(Mutex::new(Vec::new())),
            tracker: TaskTracker::new(),
        };
        let (broker, options, shutdown, connections, tracker) = (
            emulator.broker.clone(),
            emulator.options.clone(),
            emulator.shutdown.clone(),
            emulator.connections.clone(),
            emulator.tracker.clone(),
        );
        emulator.tracker.spawn(async move {
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
                let (broker, options, tracker2) =
                    (broker.clone(), options.clone(), tracker.clone());
                tracker.spawn(async move {
                    serve_connection(incoming, broker, options, token, tracker2).await;
                });
            }
        });
        tracing::info!(%addr, "Service Bus emulator listening.");
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
            self.addr, self.options.key_name, self.options.key
        )
    }

    /// The broker, for inspection and fault hooks.
    pub fn broker(&self) -> &Broker {
        &self.broker
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

async fn serve_connection(
    incoming: sb_amqp::IncomingConnection,
    broker: Broker,
    options: Arc<EmulatorOptions>,
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
    let state = Arc::new(ConnState::default());
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
        let (broker, options, state, links) = (
            broker.clone(),
            options.clone(),
            state.clone(),
            links.clone(),
        );
        tracker.spawn(async move {
            if let Err(error) = serve_link(request, broker, options, state, links).await {
                tracing::debug!(%error, "Link ended.");
            }
        });
    }
    links.cancel();
}

async fn serve_link(
    request: LinkRequest,
    broker: Broker,
    options: Arc<EmulatorOptions>,
    state: Arc<ConnState>,
    stop: CancellationToken,
) -> Result<(), sb_amqp::Error> {
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
        if !state.is_granted(&path) {
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
    if !state.is_granted(&path) {
        return request.reject(unauthorized(&path)).await;
    }
    links::serve(request, entity, stop).await
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
        let state = ConnState::default();
        state.grant("sb://127.0.0.1:5699/Orders");
        for path in [
            "orders",
            "Orders/$management",
            "orders/$DeadLetterQueue",
            "orders/$DeadLetterQueue/$management",
        ] {
            assert!(state.is_granted(path), "{path}");
        }
        for path in ["orders2", "order", "other/$management", "$cbs"] {
            assert!(!state.is_granted(path), "{path}");
        }
    }

    #[test]
    fn a_management_audience_covers_only_the_management_node() {
        // What the JavaScript SDK puts before its management link.
        let state = ConnState::default();
        state.grant("sb://localhost:5699/q1/$management");
        assert!(state.is_granted("q1/$management"));
        assert!(!state.is_granted("q1"));
        assert!(!state.is_granted("q1/$DeadLetterQueue"));
        let state = ConnState::default();
        state.grant("amqp://localhost/t1/Subscriptions/s1/$DeadLetterQueue");
        assert!(state.is_granted("t1/subscriptions/s1/$deadletterqueue/$management"));
        assert!(!state.is_granted("t1/Subscriptions/s1"));
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
