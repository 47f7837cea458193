//! Accepting connections: [`Listener`] (TCP, TLS, WebSockets), the server handshake
//! (protocol headers, SASL as a server, the `open` exchange) and [`ServerOptions`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp_types::definitions::Fields;
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::connection::ServerConnection;
use crate::core::open::{local_open, read_open, start};
use crate::core::sasl;
use crate::core::{BoxIo, FramedIo, unique_name};
use crate::error::{AmqpError, Error, Result, condition};
use crate::frame::{AMQP_HEADER, Frame, SASL_HEADER};
use crate::performative::{Close, Open};
use crate::sasl::{SaslIdentity, SaslServer};

/// Options for the server role.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// `container-id` in our `open`.
    pub container_id: String,
    /// Largest frame we accept.
    pub max_frame_size: u32,
    /// Highest channel we accept.
    pub channel_max: u16,
    /// Our idle timeout (the client must send at least this often).
    pub idle_timeout: Option<Duration>,
    /// SASL mechanisms and credential check.
    pub sasl: SaslServer,
    /// TLS server configuration; `None` serves plain TCP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `properties` in our `open`.
    pub properties: Option<Fields>,
    /// Time allowed for TLS, headers, SASL and `open` before the socket is dropped.
    pub handshake_timeout: Duration,
    /// Bytes all unfinished incoming deliveries of one connection may hold together, across
    /// its sessions and links; the link whose transfer would pass it is detached with
    /// `amqp:resource-limit-exceeded` (`0`: unbounded). Default
    /// [`DEFAULT_MAX_UNFINISHED_BYTES`](crate::DEFAULT_MAX_UNFINISHED_BYTES).
    pub max_unfinished_bytes: u64,
    /// When set, gives each connection's bound as it opens, in place of
    /// `max_unfinished_bytes`: for a server whose limit follows state that changes while it
    /// runs (an emulator whose entities, and their message sizes, are created at run time).
    pub max_unfinished_bytes_at_open: Option<UnfinishedBytesBound>,
}

/// A function giving a connection's unfinished-bytes bound when the connection opens
/// ([`ServerOptions::max_unfinished_bytes_at_open`]).
#[derive(Clone)]
pub struct UnfinishedBytesBound(Arc<dyn Fn() -> u64 + Send + Sync>);

impl UnfinishedBytesBound {
    /// A bound computed by `f` for each connection.
    pub fn new(f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Self(Arc::new(f))
    }

    /// The bound for a connection opening now.
    pub fn get(&self) -> u64 {
        (self.0)()
    }
}

impl std::fmt::Debug for UnfinishedBytesBound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UnfinishedBytesBound(..)")
    }
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            container_id: unique_name("sb-amqp-server"),
            max_frame_size: 256 * 1024,
            channel_max: 255,
            idle_timeout: None,
            sasl: SaslServer::default(),
            tls: None,
            properties: None,
            handshake_timeout: Duration::from_secs(30),
            max_unfinished_bytes: crate::DEFAULT_MAX_UNFINISHED_BYTES,
            max_unfinished_bytes_at_open: None,
        }
    }
}

impl ServerOptions {
    /// Our `open` with these limits, carrying `properties` (none when refusing a client).
    fn open(&self, properties: Option<Fields>) -> Open {
        local_open(
            &self.container_id,
            None,
            self.max_frame_size,
            self.channel_max,
            self.idle_timeout,
            properties,
        )
    }
}

/// A TCP listener for AMQP connections (plain, TLS, or over WebSockets).
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    opts: Arc<ServerOptions>,
    serving: Serving,
}

/// What a listener's connections speak.
#[derive(Debug, Clone)]
enum Serving {
    /// AMQP from the protocol header on.
    Amqp,
    /// AMQP over WebSockets on this path.
    WebSocket(Arc<str>),
    /// Either, told apart by the client's first bytes: the AMQP header, or an HTTP upgrade on
    /// this path.
    Both(Arc<str>),
}

impl Listener {
    /// Binds to `addr` (use `127.0.0.1:0` in tests).
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f() -> sb_amqp::Result<()> {
    /// use sb_amqp::{ConnectionEvent, LinkAnswer, Listener, ServerOptions};
    /// let listener = Listener::bind("127.0.0.1:0", ServerOptions::default()).await?;
    /// let mut conn = listener.accept().await?.handshake().await?;
    /// while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
    ///     if req.is_peer_sender() {
    ///         let receiver = req.accept_receiver(LinkAnswer::default().credit(10)).await?;
    ///         let delivery = receiver.recv().await?;
    ///         receiver.accept(&delivery).await?;
    ///     } else {
    ///         let sender = req.accept_sender(LinkAnswer::default()).await?;
    ///         sender.send_settled(sb_amqp::Sendable::raw(&b"\x00\x53\x77\x45"[..])).await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// I/O errors.
    pub async fn bind(addr: impl ToSocketAddrs, opts: ServerOptions) -> Result<Self> {
        Self::bind_serving(addr, opts, Serving::Amqp).await
    }

    /// Binds to `addr` for AMQP over WebSockets on `path` (Service Bus uses
    /// [`crate::WEBSOCKET_PATH`]), subprotocol `AMQPWSB10`; with [`ServerOptions::tls`] set it
    /// serves `wss`. The handshake then runs as on a plain listener. Needs the `websockets`
    /// feature: without it every connection's handshake fails, naming the feature.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn bind_websocket(
        addr: impl ToSocketAddrs,
        path: &str,
        opts: ServerOptions,
    ) -> Result<Self> {
        Self::bind_serving(addr, opts, Serving::WebSocket(Arc::from(path))).await
    }

    /// Binds to `addr` for AMQP and AMQP over WebSockets (on `path`) on the same port, as one
    /// TLS listener serves `amqps` and `wss`: each connection's first bytes (after TLS, when
    /// [`ServerOptions::tls`] is set) say which, the AMQP protocol header or an HTTP request.
    /// Without the `websockets` feature a WebSocket upgrade fails its handshake, naming the
    /// feature.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn bind_amqp_and_websocket(
        addr: impl ToSocketAddrs,
        path: &str,
        opts: ServerOptions,
    ) -> Result<Self> {
        Self::bind_serving(addr, opts, Serving::Both(Arc::from(path))).await
    }

    async fn bind_serving(
        addr: impl ToSocketAddrs,
        opts: ServerOptions,
        serving: Serving,
    ) -> Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(addr).await?,
            opts: Arc::new(opts),
            serving,
        })
    }

    /// The bound address.
    ///
    /// # Errors
    /// I/O errors.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.tcp.local_addr()?)
    }

    /// Accepts the next TCP connection. Run [`IncomingConnection::handshake`] on it, usually
    /// in a task of its own.
    ///
    /// # Errors
    /// I/O errors from `accept`.
    pub async fn accept(&self) -> Result<IncomingConnection> {
        let (tcp, peer) = self.tcp.accept().await?;
        tcp.set_nodelay(true)?;
        Ok(IncomingConnection {
            tcp,
            peer,
            opts: self.opts.clone(),
            serving: self.serving.clone(),
        })
    }
}

/// A TCP connection that has not done the AMQP handshake yet.
#[derive(Debug)]
pub struct IncomingConnection {
    tcp: TcpStream,
    peer: SocketAddr,
    opts: Arc<ServerOptions>,
    serving: Serving,
}

impl IncomingConnection {
    /// The client's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// Runs TLS (if configured), the WebSocket upgrade (on a WebSocket listener), protocol
    /// headers, SASL and the `open` exchange.
    ///
    /// # Errors
    /// TLS, SASL, I/O and protocol errors; [`Error::Timeout`] after
    /// [`ServerOptions::handshake_timeout`].
    pub async fn handshake(self) -> Result<ServerConnection> {
        self.handshake_through(|io| io).await
    }

    /// As [`IncomingConnection::handshake`], with the AMQP byte stream (under TLS and the
    /// WebSocket framing, above nothing else) passed through `wrap` first: a broker that
    /// shapes its traffic (an emulator's injected network delay) wraps it here.
    ///
    /// # Errors
    /// As [`IncomingConnection::handshake`].
    pub async fn handshake_through(
        self,
        wrap: impl FnOnce(BoxIo) -> BoxIo + Send,
    ) -> Result<ServerConnection> {
        let limit = self.opts.handshake_timeout;
        tokio::time::timeout(limit, self.handshake_inner(wrap))
            .await
            .map_err(|_| Error::Timeout)?
    }

    async fn handshake_inner(
        self,
        wrap: impl FnOnce(BoxIo) -> BoxIo + Send,
    ) -> Result<ServerConnection> {
        match self.handshake_or_http_inner(wrap).await? {
            Accepted::Amqp(conn) => Ok(conn),
            Accepted::Http(_) => Err(Error::Protocol(
                "an HTTP request other than the WebSocket upgrade".to_owned(),
            )),
        }
    }

    /// As [`IncomingConnection::handshake_through`], except that on a listener serving AMQP
    /// and WebSockets ([`Listener::bind_amqp_and_websocket`]) an HTTP request for any path
    /// but the WebSocket path is handed back unread ([`Accepted::Http`], after TLS), so the
    /// caller can serve other HTTP on the same port, as Service Bus serves its management API
    /// beside `amqps` and `wss`.
    ///
    /// # Errors
    /// As [`IncomingConnection::handshake`].
    pub async fn handshake_or_http(
        self,
        wrap: impl FnOnce(BoxIo) -> BoxIo + Send,
    ) -> Result<Accepted> {
        let limit = self.opts.handshake_timeout;
        tokio::time::timeout(limit, self.handshake_or_http_inner(wrap))
            .await
            .map_err(|_| Error::Timeout)?
    }

    async fn handshake_or_http_inner(
        self,
        wrap: impl FnOnce(BoxIo) -> BoxIo + Send,
    ) -> Result<Accepted> {
        let io: BoxIo = match &self.opts.tls {
            Some(cfg) => Box::new(
                tokio_rustls::TlsAcceptor::from(cfg.clone())
                    .accept(self.tcp)
                    .await
                    .map_err(|e| Error::Tls(e.to_string()))?,
            ),
            None => Box::new(self.tcp),
        };
        let io = match &self.serving {
            Serving::Amqp => io,
            Serving::WebSocket(path) => crate::websocket::server(io, path).await?,
            Serving::Both(path) => match super::sniff::sniff(io, path).await? {
                (super::sniff::Opening::Amqp, io) => io,
                (super::sniff::Opening::WebSocket, io) => {
                    crate::websocket::server(io, path).await?
                }
                (super::sniff::Opening::Http, io) => return Ok(Accepted::Http(io)),
            },
        };
        Ok(Accepted::Amqp(serve_io(wrap(io), self.opts).await?))
    }
}

/// What [`IncomingConnection::handshake_or_http`] found on a connection.
pub enum Accepted {
    /// An AMQP connection (directly or over WebSockets), open.
    Amqp(ServerConnection),
    /// An HTTP request that is not a WebSocket upgrade: the stream (after TLS) with nothing
    /// consumed.
    Http(BoxIo),
}

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Accepted::Amqp(conn) => f.debug_tuple("Amqp").field(conn).finish(),
            Accepted::Http(_) => f.write_str("Http(..)"),
        }
    }
}

/// Runs the server handshake on any stream (in-memory streams in tests).
///
/// # Errors
/// SASL, I/O and protocol errors.
pub async fn serve_io(io: BoxIo, opts: Arc<ServerOptions>) -> Result<ServerConnection> {
    let span =
        tracing::info_span!("amqp_connection", role = "server", container = %opts.container_id);
    async move {
        let mut f = FramedIo::new(io, opts.max_frame_size);
        let h = f.read_header().await?.ok_or(Error::ConnectionLost)?;
        let identity = if h == SASL_HEADER {
            f.write_header(SASL_HEADER).await?;
            let id = match sasl::server(&mut f, &opts.sasl).await {
                Err(Error::Decode(detail)) => {
                    refuse_undecodable(&mut f, &opts, true, &detail).await;
                    return Err(Error::Decode(detail));
                }
                id => id?,
            };
            let h2 = f.read_header().await?.ok_or(Error::ConnectionLost)?;
            if h2 != AMQP_HEADER {
                f.write_header(AMQP_HEADER).await?;
                return Err(Error::Protocol(format!(
                    "unsupported header {h2:?} after SASL"
                )));
            }
            f.write_header(AMQP_HEADER).await?;
            id
        } else if h == AMQP_HEADER && opts.sasl.allow_no_sasl {
            f.write_header(AMQP_HEADER).await?;
            SaslIdentity::default()
        } else {
            f.write_header(SASL_HEADER).await?;
            return Err(Error::Protocol(format!(
                "unsupported protocol header {h:?}"
            )));
        };
        let remote = match read_open(&mut f).await {
            Err(Error::Decode(detail)) => {
                refuse_undecodable(&mut f, &opts, false, &detail).await;
                return Err(Error::Decode(detail));
            }
            remote => remote?,
        };
        let open = opts.open(opts.properties.clone());
        f.write_frame(&Frame::amqp(0, open.clone())).await?;
        tracing::debug!(peer = %remote.container_id, "Connection open.");
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = start(
            f,
            &open,
            remote,
            opts.idle_timeout,
            opts.max_unfinished_bytes_at_open
                .as_ref()
                .map_or(opts.max_unfinished_bytes, UnfinishedBytesBound::get),
            Some(tx),
            tracing::Span::current(),
        );
        Ok(ServerConnection::new(conn, rx, identity))
    }
    .instrument(span)
    .await
}

/// Tells a client whose bytes did not decode before the connection opened why it is dropped:
/// `open` then `close` with `amqp:decode-error` (what the spec asks of a peer refusing a
/// connection before open), preceded in the SASL phase by a `sys-perm` outcome and the AMQP
/// header, since a close frame only exists in the AMQP layer. Best effort: the socket is
/// dropped next either way.
async fn refuse_undecodable(f: &mut FramedIo, opts: &ServerOptions, in_sasl: bool, detail: &str) {
    tracing::info!(error = %detail, "Undecodable bytes before open; closing.");
    let refused = async {
        if in_sasl {
            sasl::fail(f).await?;
            f.write_header(AMQP_HEADER).await?;
        }
        let open = opts.open(None);
        f.write_frame(&Frame::amqp(0, open)).await?;
        let error = AmqpError::new(condition::DECODE_ERROR, Some(detail.to_owned()));
        f.write_frame(&Frame::amqp(
            0,
            Close {
                error: Some(error.into()),
            },
        ))
        .await
    };
    if let Err(error) = refused.await {
        tracing::debug!(%error, "Could not send the decode error.");
    }
}
