//! The AMQP side of the emulator: a listener on the sb-amqp engine that maps Service Bus links,
//! `$cbs` and `$management` onto the [`Broker`].
//!
//! # Layout
//! - [`Emulator`]: start on an address, print the connection string, inspect, inject faults,
//!   drop connections, shut down.
//! - `options`: [`EmulatorOptions`] and the service's limits.
//! - `conn_state`: per-connection state: grants, reply-link routes, held message locks.
//! - `grants`: what a connection's put-tokens granted (audiences, expiry, rights).
//! - `listeners`: binding the AMQP, WebSocket, TLS and HTTP listeners.
//! - `connection`: the accept loop, connections, and routing each link to its handler.
//! - `codec`: AMQP messages ⇄ [`crate::BrokerMessage`], delivery annotations and batches.
//! - `nodes`: `$cbs` and `<entity>/$management` request handling (commands parsed, then
//!   applied).
//! - `links`: entity links: deliveries with lock tokens, dispositions, sends.
//! - `sessions`: session receiver links.
//! - `control`: what the service does to live entity links: the idle timer, token expiry,
//!   forced detaches ([`Emulator::force_detach_link`]), per-operation fault draws.
//! - `faults`: `--fault NAME=P` ([`Fault`], [`FaultSpec`]) and the seeded generator.
//! - `latency`: `--latency MS`, a one-way delay on every connection's bytes.

mod codec;
mod conn_state;
pub(crate) mod connection;
mod control;
mod faults;
mod grants;
mod latency;
mod links;
mod listeners;
pub(crate) mod nodes;
mod options;
mod request_log;
mod sessions;
mod survival;
mod tls;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use sb_amqp::types::definitions::Fields;
use sb_amqp::{AmqpError, ServerOptions};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::{Broker, Config, Error};
pub(crate) use conn_state::ConnState;
use control::Registry;
pub use control::{LinkInfo, LinkRole};
use faults::Faults;
pub use faults::{Fault, FaultSpec, ManagementFault, ManagementFaultKind, ManagementFaultSpec};
use listeners::{Addresses, Listeners};
pub use options::{
    DEFAULT_LINK_IDLE_TIMEOUT, EmulatorOptions, KEY, KEY_NAME, SERVICE_CHANNEL_MAX,
    SERVICE_IDLE_TIMEOUT, SERVICE_MAX_FRAME_SIZE,
};
pub use request_log::ManagementRequest;
use request_log::RequestLog;
pub(crate) use survival::Survival;
pub use survival::{EmulatorStats, SettlementAttempt};
pub use tls::{
    CA_FILE as TLS_CA_FILE, CERT_FILE as TLS_CERT_FILE, KEY_FILE as TLS_KEY_FILE, TlsIdentity,
    TlsListen,
};

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
    /// The TLS listener's address and the generated CA file, when
    /// [`EmulatorOptions::tls_listen`] is set.
    tls: Option<(SocketAddr, Option<std::path::PathBuf>)>,
    /// The plain HTTP management listener's address ([`EmulatorOptions::http_listen`]).
    http_addr: Option<SocketAddr>,
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
    survival: Arc<Survival>,
    /// Every connection's `$management` requests ([`Emulator::management_requests`]).
    requests: Arc<RequestLog>,
    /// How late entity attaches are answered, in milliseconds (changeable while running).
    attach_delay_ms: std::sync::atomic::AtomicU64,
    /// The AMQP server side's options, for connections served from a stream
    /// ([`Emulator::serve_stream`]).
    server: Arc<ServerOptions>,
}

impl Shared {
    /// What every connection of an emulator serving `broker` shares.
    fn new(broker: Broker, options: EmulatorOptions, server: ServerOptions) -> Arc<Shared> {
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
            server: Arc::new(server),
            broker,
            faults: Arc::new(Faults::new(&options.faults, seed)),
            survival: Arc::new(Survival::new(options.throttle)),
            attach_delay_ms: Default::default(),
            requests: Arc::default(),
            options: Arc::new(options),
            registry: Arc::new(Registry::default()),
        });
        shared.set_attach_delay(shared.options.attach_delay);
        shared
    }

    fn set_attach_delay(&self, delay: std::time::Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.attach_delay_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn attach_delay(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.attach_delay_ms
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}

/// The management API's view of the emulator: its keys and the faults injected into it.
impl crate::http::Host for Shared {
    fn key(&self, name: &str) -> Option<(&str, crate::Rights)> {
        self.options.key(name)
    }

    fn accepts_jwt(&self) -> bool {
        self.options.accept_jwt
    }

    fn injected_fault(&self) -> Option<crate::http::Injected> {
        self.survival.management_fault().map(|fault| match fault {
            ManagementFault::Status(status) => crate::http::Injected::Status(status),
            ManagementFault::Stall => crate::http::Injected::Stall,
        })
    }
}

impl Emulator {
    /// Binds and serves `broker`.
    ///
    /// # Errors
    /// [`Error::Server`] when the address cannot be bound.
    pub async fn start(broker: Broker, options: EmulatorOptions) -> Result<Emulator, Error> {
        let server = server_options(&broker);
        let listeners = Listeners::bind(&options, &server).await?;
        let emulator = Emulator::new(listeners.addresses()?, Shared::new(broker, options, server));
        emulator.accept_on(listeners);
        let (addr, websocket, tls, http) = (
            emulator.addr,
            emulator.websocket_addr,
            emulator.tls.as_ref().map(|(addr, _)| *addr),
            emulator.http_addr,
        );
        tracing::info!(%addr, ?websocket, ?tls, ?http, "Service Bus emulator listening.");
        Ok(emulator)
    }

    /// An emulator at `addresses` serving `shared`, accepting nothing yet.
    fn new(addresses: Addresses, shared: Arc<Shared>) -> Emulator {
        Emulator {
            addr: addresses.amqp,
            websocket_addr: addresses.websocket,
            tls: addresses.tls,
            http_addr: addresses.http,
            shared,
            shutdown: CancellationToken::new(),
            connections: Arc::new(Mutex::new(Vec::new())),
            tracker: TaskTracker::new(),
        }
    }

    /// Spawns one accept loop per listener.
    fn accept_on(&self, listeners: Listeners) {
        let amqp = std::iter::once(listeners.amqp)
            .chain(listeners.websocket)
            .chain(listeners.tls.map(|(listener, _)| listener));
        for listener in amqp {
            self.tracker.spawn(connection::accept_loop(
                listener,
                self.shared.clone(),
                self.shutdown.clone(),
                self.connections.clone(),
                self.tracker.clone(),
            ));
        }
        if let Some(listener) = listeners.http {
            self.tracker.spawn(http_accept_loop(
                listener,
                self.shared.clone(),
                self.shutdown.clone(),
                self.tracker.clone(),
            ));
        }
    }

    /// An emulator serving `broker` that listens on nothing: its connections are byte streams
    /// handed to [`Emulator::serve_stream`] (an in-memory or simulated network). The listen
    /// addresses of `options` are not bound; [`Emulator::local_addr`] is `0.0.0.0:0`.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), sb_emulator::Error> {
    /// let config = sb_emulator::Config::from_json(r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"}],"Topics":[]}],"Logging":{"Type":"File"}}}"#)?;
    /// let emulator = sb_emulator::Emulator::without_listener(sb_emulator::Broker::new(config)?, Default::default());
    /// let (client_end, server_end) = tokio::io::duplex(64 * 1024);
    /// emulator.serve_stream(Box::new(server_end), "in-memory");
    /// # drop(client_end);
    /// emulator.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn without_listener(broker: Broker, options: EmulatorOptions) -> Emulator {
        let server = server_options(&broker);
        Emulator::new(Addresses::none(), Shared::new(broker, options, server))
    }

    /// Serves one client connection whose bytes are `io` (any stream: one end of
    /// [`tokio::io::duplex`], a simulated link), in a task of its own, exactly as a connection
    /// accepted on the AMQP listener: handshake, links, faults, [`Emulator::drop_all_connections`].
    /// `peer` names the client in logs.
    pub fn serve_stream(&self, io: sb_amqp::BoxIo, peer: &str) {
        let token = self.shutdown.child_token();
        if let Ok(mut list) = self.connections.lock() {
            list.retain(|t| !t.is_cancelled());
            list.push(token.clone());
        }
        self.tracker.spawn(connection::serve_stream(
            io,
            peer.to_owned(),
            self.shared.clone(),
            token,
            self.tracker.clone(),
        ));
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

    /// The plain HTTP management listener's address, when [`EmulatorOptions::http_listen`]
    /// is set.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// The TLS listener's address (`amqps`, `wss` and HTTPS management), when
    /// [`EmulatorOptions::tls_listen`] is set.
    pub fn tls_addr(&self) -> Option<SocketAddr> {
        self.tls.as_ref().map(|(addr, _)| *addr)
    }

    /// The generated CA certificate (PEM) clients trust to verify the TLS listener, when the
    /// emulator generated its certificate ([`TlsIdentity::Generate`]).
    pub fn tls_ca_file(&self) -> Option<&std::path::Path> {
        self.tls.as_ref().and_then(|(_, ca)| ca.as_deref())
    }

    /// The connection string for AMQP over TLS (`amqps`) on the TLS listener: `localhost`
    /// (the name its generated certificate carries), no `UseDevelopmentEmulator`, so clients
    /// use TLS and verify the certificate.
    pub fn tls_connection_string(&self) -> Option<String> {
        self.tls_string("")
    }

    /// The connection string for AMQP over secure WebSockets (`wss`) on the TLS listener.
    pub fn tls_websocket_connection_string(&self) -> Option<String> {
        self.tls_string("TransportType=AmqpWebSockets;")
    }

    fn tls_string(&self, transport: &str) -> Option<String> {
        self.tls_addr().map(|addr| {
            format!(
                "Endpoint=sb://localhost:{}/;SharedAccessKeyName={};SharedAccessKey={};{transport}",
                addr.port(),
                self.shared.options.key_name,
                self.shared.options.key
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

    /// The latest `$management` requests of every connection (up to 1000), oldest first:
    /// which operation, on which entity, for which link.
    pub fn management_requests(&self) -> Vec<ManagementRequest> {
        self.shared.requests.list()
    }

    /// Loses link `id` (from [`Emulator::links`]) without a detach, as the service sometimes
    /// does: from now on nothing is delivered, settled or answered on it, while the
    /// connection and its other links live on; only the client's own detach (or the end of
    /// the connection) ends it. False when it is not live.
    pub fn blackhole_link(&self, id: u64) -> bool {
        self.shared.registry.black_hole(id)
    }

    /// Answers every later entity attach `delay` late (`Duration::ZERO`: at once), like a
    /// service whose links churn or whose entity is moving between nodes; see
    /// [`EmulatorOptions::with_attach_delay`].
    pub fn set_attach_delay(&self, delay: std::time::Duration) {
        self.shared.set_attach_delay(delay);
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

    /// Ends every AMQP session that has links, on every live connection, with
    /// `amqp:internal-error`, while the connections stay open (the service may; .NET rebuilds
    /// the session, `AmqpConnectionScope` opens one per link). Returns how many.
    pub async fn end_sessions(&self) -> usize {
        self.shared.survival.end_sessions().await
    }

    /// Answers the next `times` `put-token` requests with `status` (503, 500, 408: what
    /// `$cbs` answers during a gateway upgrade) instead of handling them.
    pub fn refuse_put_tokens(&self, times: usize, status: i32) {
        self.shared.survival.refuse_put_tokens(times, status);
    }

    /// Throttles the namespace for `duration`: dispositions and sends are answered
    /// `rejected{com.microsoft:server-busy}`, `$management` requests 503 with that condition,
    /// and nothing is applied (Microsoft's "Throttling operations on Azure Service Bus").
    pub fn throttle(&self, duration: std::time::Duration) {
        self.shared.survival.throttle(duration);
    }

    /// As [`Emulator::throttle`], from the next settlement attempt on (so a test can throttle
    /// exactly what a worker settles next).
    pub fn throttle_from_next_settlement(&self, duration: std::time::Duration) {
        self.shared.survival.throttle_from_next_settlement(duration);
    }

    /// Forgets the token put for `audience` (`sb://host/q/$management`, or its path) on every
    /// connection, as when the service stops honouring it: requests on it are refused 401
    /// until a fresh put-token. Returns how many grants went.
    pub fn revoke_token(&self, audience: &str) -> usize {
        self.shared.survival.revoke_token(audience)
    }

    /// Steps the broker's clock by `secs` seconds (back when negative) while it runs, as an NTP
    /// correction or a resumed VM steps a host's clock: every broker timestamp from now on
    /// (locked-until, enqueued time) moves with it. False unless the broker was made with a
    /// [`crate::Clock::steppable`] clock (the `sb-emulator` binary's always is).
    pub fn step_clock(&self, secs: i64) -> bool {
        self.shared.broker.clock().step(secs)
    }

    /// Answers the next management API (HTTP) requests with `faults` instead of handling
    /// them, one each, in order: a status (429 throttled, 5xx failing) or a stall. What the
    /// service's management API does under throttling or an outage, for testing that a client
    /// retries and stays bounded (protocol3 F4).
    pub fn fail_management_requests(&self, faults: impl IntoIterator<Item = ManagementFault>) {
        self.shared.survival.fail_management_requests(faults);
    }

    /// Answers the next `<entity>/$management` node (AMQP) requests with `faults` instead of
    /// handling them, one each, in order: a status with the condition the service pairs with it
    /// (503 `com.microsoft:server-busy` and the throttling text, 408 `com.microsoft:timeout`,
    /// 500 and others `amqp:internal-error`), or a stall (never answered). The SDKs read the
    /// reply's `errorCondition` (else its status) into the same exceptions as a link error's
    /// condition and retry server-busy and timeouts (.NET `AmqpExceptionHelper.ToMessagingContractException`,
    /// `ConditionToStatusMap`: server-busy ↔ 503, timeout ↔ 408).
    pub fn fail_management_node_requests(&self, faults: impl IntoIterator<Item = ManagementFault>) {
        self.shared.survival.fail_node_requests(faults);
    }

    /// `--management-fault FAULT[xN]`: the next `spec.times` requests of the HTTP management
    /// API and, separately, of the `$management` nodes are answered with `spec`'s fault.
    pub fn inject_management_fault(&self, spec: ManagementFaultSpec) {
        let times = spec.times;
        self.fail_management_requests(std::iter::repeat_n(spec.fault.http(), times));
        self.fail_management_node_requests(std::iter::repeat_n(spec.fault.node(), times));
    }

    /// Leaves the next `times` link dispositions unanswered and unapplied (`--settlement-timeouts`):
    /// the client's settlement times out, and the message stays locked until its lock runs
    /// out or the client settles it again (by lock token, say).
    pub fn leave_settlements_unanswered(&self, times: usize) {
        self.shared.survival.leave_settlements_unanswered(times);
    }

    /// Answers the next `times` link dispositions `rejected{com.microsoft:timeout}` without
    /// applying them, as the service does for an operation that ran past its time.
    pub fn time_out_settlements(&self, times: usize) {
        self.shared.survival.time_out_settlements(times);
    }

    /// Detaches every receive link attached from now on with `amqp:internal-error`, `after`
    /// its attach was answered (`None`: stop): links that attach fine and fail right after, as
    /// a service node in trouble does (protocol3 F6).
    pub fn detach_new_receive_links(&self, after: Option<std::time::Duration>) {
        self.shared
            .survival
            .detach_new_receive_links(after, survival::ReceiverDetach::InternalError);
    }

    /// Force-detaches every receive link attached from now on `after` its attach was answered
    /// (`None`: stop), with `amqp:link:detach-forced` and the service's "InnerMessageReceiver
    /// was closed" text: what the service does when it closes its side of a consumer (a gateway
    /// or broker node moving the entity; Azure/azure-sdk-for-js#22963,
    /// Azure/azure-sdk-for-java#6280). Every re-attached link goes the same way.
    pub fn force_detach_new_receive_links(&self, after: Option<std::time::Duration>) {
        self.shared
            .survival
            .detach_new_receive_links(after, survival::ReceiverDetach::Forced);
    }

    /// Sticks every live connection on `amqp:internal-error`: every attach on it is refused
    /// with that condition from now on, while new connections work. Returns how many.
    pub fn stick_internal_error(&self) -> usize {
        self.shared.survival.stick_internal_error()
    }

    /// Connections, sessions and links opened since the start.
    pub fn stats(&self) -> EmulatorStats {
        self.shared.survival.stats()
    }

    /// Every settlement attempt (disposition or `update-disposition`) seen, oldest first.
    pub fn settlement_attempts(&self) -> Vec<SettlementAttempt> {
        self.shared.survival.settlement_attempts()
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

/// The AMQP server options of an emulator serving `broker`: the service's limits.
fn server_options(broker: &Broker) -> ServerOptions {
    ServerOptions {
        container_id: format!("sb-emulator-{}", broker.namespace()),
        max_frame_size: SERVICE_MAX_FRAME_SIZE,
        channel_max: SERVICE_CHANNEL_MAX,
        idle_timeout: Some(SERVICE_IDLE_TIMEOUT),
        max_unfinished_bytes_at_open: Some({
            let broker = broker.clone();
            sb_amqp::UnfinishedBytesBound::new(move || max_unfinished_bytes(&broker))
        }),
        ..ServerOptions::default()
    }
}

/// Accepts plain HTTP management connections until shutdown.
async fn http_accept_loop(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((tcp, _)) = accepted else { continue };
        let (broker, host, stop) = (shared.broker.clone(), shared.clone(), shutdown.clone());
        tracker.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                () = crate::http::serve(Box::new(tcp), broker, host) => {}
            }
        });
    }
}

/// The bytes one connection's unfinished deliveries may hold together: the engine's default,
/// or room for two of the largest deliveries an entity link or its `$management` link takes
/// when an entity is larger (`MaxMessageSizeInKilobytes`). Computed as each connection opens,
/// from the entities then present: one created at run time (HTTP or `$management`) with a
/// larger size takes its messages on connections opened after it.
fn max_unfinished_bytes(broker: &Broker) -> u64 {
    let largest = broker
        .entity_paths()
        .iter()
        .filter_map(|path| broker.resolve(path).ok())
        .map(|entity| nodes::Node::Management(entity.path().to_owned()).max_request_size(broker))
        .max()
        .unwrap_or(0);
    sb_amqp::DEFAULT_MAX_UNFINISHED_BYTES.max(largest.saturating_mul(2))
}

/// An error as the emulator puts it on the wire: `info` is always present (an empty map when
/// there is nothing to add). Python's pyamqp reads `error[2]` unconditionally on send
/// dispositions, management dispositions and `close`, and fails with `IndexError` when the
/// encoder drops a trailing null `info` (AMQP allows it; real Service Bus always writes it).
pub(crate) fn wire_error(condition: &str, description: Option<String>) -> AmqpError {
    AmqpError::new(condition, description).with_info(Fields::default())
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
    fn wire_errors_always_carry_info() {
        let error = wire_error(sb_amqp::condition::MESSAGE_SIZE_EXCEEDED, None);
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
