//! Server role: a [`Listener`] yields [`IncomingConnection`]s; after the handshake a
//! [`ServerConnection`] yields [`ConnectionEvent`]s, e.g. a [`LinkRequest`] for every link a
//! client attaches. Each accepted link is a [`Sender`] or [`Receiver`] handle, the same types
//! as on the client side.
//!
//! Sessions a client begins are accepted automatically (Python clients pipeline `begin` and
//! `attach` before seeing our `open`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp_types::definitions::{Fields, Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{Source, TargetArchetype};
use serde_amqp::primitives::{Array, Symbol};
use tokio::net::{TcpListener, TcpStream, ToSocketAddrs};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::client::{
    ConnCtx, ConnInner, Connection, LinkCore, LinkParts, Receiver, Sender, local_open, read_open,
    start, unique_name,
};
use crate::connection::{BoxIo, FramedIo};
use crate::delivery::LinkFlow;
use crate::driver::{Command, LinkSetup};
use crate::error::{AmqpError, Error, Result, condition};
use crate::frame::{AMQP_HEADER, Frame, SASL_HEADER};
use crate::performative::{Attach, Open};
use crate::sasl::{self, SaslIdentity, SaslServer};

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
        }
    }
}

/// A TCP listener for AMQP connections (plain, TLS, or over WebSockets).
#[derive(Debug)]
pub struct Listener {
    tcp: TcpListener,
    opts: Arc<ServerOptions>,
    /// `Some(path)`: AMQP over WebSockets served on `path`.
    websocket: Option<Arc<str>>,
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
        Ok(Self {
            tcp: TcpListener::bind(addr).await?,
            opts: Arc::new(opts),
            websocket: None,
        })
    }

    /// Binds to `addr` for AMQP over WebSockets on `path` (Service Bus uses
    /// [`crate::WEBSOCKET_PATH`]), subprotocol `AMQPWSB10`; with [`ServerOptions::tls`] set it
    /// serves `wss`. The handshake then runs as on a plain listener.
    ///
    /// # Errors
    /// I/O errors.
    pub async fn bind_websocket(
        addr: impl ToSocketAddrs,
        path: &str,
        opts: ServerOptions,
    ) -> Result<Self> {
        Ok(Self {
            tcp: TcpListener::bind(addr).await?,
            opts: Arc::new(opts),
            websocket: Some(Arc::from(path)),
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
            websocket: self.websocket.clone(),
        })
    }
}

/// A TCP connection that has not done the AMQP handshake yet.
#[derive(Debug)]
pub struct IncomingConnection {
    tcp: TcpStream,
    peer: SocketAddr,
    opts: Arc<ServerOptions>,
    websocket: Option<Arc<str>>,
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
        let limit = self.opts.handshake_timeout;
        tokio::time::timeout(limit, self.handshake_inner())
            .await
            .map_err(|_| Error::Timeout)?
    }

    async fn handshake_inner(self) -> Result<ServerConnection> {
        let io: BoxIo = match &self.opts.tls {
            Some(cfg) => Box::new(
                tokio_rustls::TlsAcceptor::from(cfg.clone())
                    .accept(self.tcp)
                    .await
                    .map_err(|e| Error::Tls(e.to_string()))?,
            ),
            None => Box::new(self.tcp),
        };
        let io = match &self.websocket {
            Some(path) => crate::websocket::server(io, path).await?,
            None => io,
        };
        serve_io(io, self.opts).await
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
            let id = sasl::server(&mut f, &opts.sasl).await?;
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
        let remote = read_open(&mut f).await?;
        let open: Open = local_open(
            &opts.container_id,
            None,
            opts.max_frame_size,
            opts.channel_max,
            opts.idle_timeout,
            opts.properties.clone(),
        );
        f.write_frame(&Frame::amqp(0, open.clone())).await?;
        tracing::debug!(peer = %remote.container_id, "Connection open.");
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = start(
            f,
            &open,
            remote,
            opts.idle_timeout,
            Some(tx),
            tracing::Span::current(),
        );
        Ok(ServerConnection {
            conn,
            events: rx,
            identity,
        })
    }
    .instrument(span)
    .await
}

/// Something a client did that the application answers.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// The client attached a link.
    Link(LinkRequest),
}

/// A connection accepted by the server.
#[derive(Debug)]
pub struct ServerConnection {
    conn: Connection,
    events: mpsc::UnboundedReceiver<ConnectionEvent>,
    identity: SaslIdentity,
}

impl ServerConnection {
    /// The connection handle (close it, watch it, begin server-initiated sessions).
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The client's `open`.
    pub fn remote_open(&self) -> &Open {
        self.conn.remote_open()
    }

    /// What the client presented in SASL.
    pub fn sasl_identity(&self) -> &SaslIdentity {
        &self.identity
    }

    /// Next event; `None` once the connection ended.
    pub async fn next_event(&mut self) -> Option<ConnectionEvent> {
        self.events.recv().await
    }
}

/// How to answer a client's attach.
#[derive(Debug, Clone)]
pub struct LinkAnswer {
    /// `initial-delivery-count` when we are the sender (Python requires it).
    pub initial_delivery_count: u32,
    /// `max-message-size` to advertise.
    pub max_message_size: Option<u64>,
    /// Sender settle mode; `None` echoes the client's.
    pub snd_settle_mode: Option<SenderSettleMode>,
    /// Receiver settle mode; `None` echoes the client's.
    pub rcv_settle_mode: Option<ReceiverSettleMode>,
    /// Source to answer with; `None` echoes the client's.
    pub source: Option<Source>,
    /// Target to answer with; `None` echoes the client's.
    pub target: Option<TargetArchetype>,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Offered capabilities.
    pub offered_capabilities: Option<Vec<String>>,
    /// Receiving links: keep this much credit topped up.
    pub auto_credit: Option<u32>,
    /// Sending links: answer drain automatically when nothing is queued (default true).
    pub auto_drain: bool,
}

impl Default for LinkAnswer {
    fn default() -> Self {
        Self {
            initial_delivery_count: 0,
            max_message_size: None,
            snd_settle_mode: None,
            rcv_settle_mode: None,
            source: None,
            target: None,
            properties: None,
            offered_capabilities: None,
            auto_credit: None,
            auto_drain: true,
        }
    }
}

impl LinkAnswer {
    /// Grants (and keeps topping up) `n` credit on a receiving link.
    #[must_use]
    pub fn credit(mut self, n: u32) -> Self {
        self.auto_credit = Some(n);
        self
    }

    /// Sets `max-message-size`.
    #[must_use]
    pub fn max_message_size(mut self, n: u64) -> Self {
        self.max_message_size = Some(n);
        self
    }

    /// Sets the receiver settle mode (e.g. `first` for a client asking `second` on send).
    #[must_use]
    pub fn rcv_settle_mode(mut self, m: ReceiverSettleMode) -> Self {
        self.rcv_settle_mode = Some(m);
        self
    }

    /// Sets the sender settle mode.
    #[must_use]
    pub fn snd_settle_mode(mut self, m: SenderSettleMode) -> Self {
        self.snd_settle_mode = Some(m);
        self
    }

    /// Sets `initial-delivery-count`.
    #[must_use]
    pub fn initial_delivery_count(mut self, n: u32) -> Self {
        self.initial_delivery_count = n;
        self
    }

    /// Leaves drain answers to the application ([`Sender::answer_drain`]).
    #[must_use]
    pub fn manual_drain(mut self) -> Self {
        self.auto_drain = false;
        self
    }
}

/// A client's attach waiting for the application's answer.
///
/// Dropping it unanswered refuses the link with `amqp:not-found`.
#[derive(Debug)]
pub struct LinkRequest {
    ctx: ConnCtx,
    conn: Option<Arc<ConnInner>>,
    channel: u16,
    remote: Box<Attach>,
    answered: bool,
}

impl LinkRequest {
    pub(crate) fn new(
        ctx: ConnCtx,
        conn: Option<Arc<ConnInner>>,
        channel: u16,
        remote: Attach,
    ) -> Self {
        Self {
            ctx,
            conn,
            channel,
            remote: Box::new(remote),
            answered: false,
        }
    }

    /// Link name.
    pub fn name(&self) -> &str {
        &self.remote.name
    }

    /// The client's attach.
    pub fn remote_attach(&self) -> &Attach {
        &self.remote
    }

    /// True if the client sends on this link (answer with [`LinkRequest::accept_receiver`]).
    pub fn is_peer_sender(&self) -> bool {
        self.remote.role == Role::Sender
    }

    /// The client's source address.
    pub fn source_address(&self) -> Option<&str> {
        self.remote
            .source
            .as_ref()
            .and_then(|s| s.address.as_deref())
    }

    /// The client's target address.
    pub fn target_address(&self) -> Option<&str> {
        match self.remote.target.as_deref() {
            Some(TargetArchetype::Target(t)) => t.address.as_deref(),
            _ => None,
        }
    }

    fn answer_attach(&self, a: &LinkAnswer, role: Role) -> Attach {
        let r = &self.remote;
        Attach {
            name: r.name.clone(),
            handle: Handle(0),
            role: role.clone(),
            snd_settle_mode: a
                .snd_settle_mode
                .clone()
                .unwrap_or(r.snd_settle_mode.clone()),
            rcv_settle_mode: a
                .rcv_settle_mode
                .clone()
                .unwrap_or(r.rcv_settle_mode.clone()),
            source: a.source.clone().map(Box::new).or_else(|| r.source.clone()),
            target: a.target.clone().map(Box::new).or_else(|| r.target.clone()),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: (role == Role::Sender).then_some(a.initial_delivery_count),
            max_message_size: a.max_message_size,
            offered_capabilities: a
                .offered_capabilities
                .as_ref()
                .map(|v| Array(v.iter().map(|s| Symbol::from(s.as_str())).collect())),
            desired_capabilities: None,
            properties: a.properties.clone(),
        }
    }

    #[tracing::instrument(level = "debug", skip_all, fields(link = %self.remote.name, channel = self.channel))]
    async fn accept(mut self, a: LinkAnswer, role: Role) -> Result<LinkParts> {
        self.answered = true;
        let attach = self.answer_attach(&a, role);
        let (etx, erx) = mpsc::unbounded_channel();
        let (ftx, frx) = watch::channel(LinkFlow::default());
        let channel = self.channel;
        let remote_handle = self.remote.handle.0;
        let handle = self
            .ctx
            .call(|reply| Command::AnswerAttach {
                channel,
                remote_handle,
                attach: Box::new(attach.clone()),
                setup: Some(LinkSetup {
                    events: etx,
                    flow: ftx,
                    auto_credit: a.auto_credit,
                    auto_drain: a.auto_drain,
                }),
                reject: None,
                reply,
            })
            .await?;
        let mut local = attach;
        local.handle = Handle(handle);
        Ok(LinkParts {
            core: LinkCore {
                ctx: self.ctx.clone(),
                channel,
                handle,
                name: self.remote.name.clone(),
                detached: false,
                _session: None,
                _conn: self.conn.clone(),
            },
            events: erx,
            flow: frx,
            local: Box::new(local),
            remote: self.remote.clone(),
        })
    }

    /// Accepts a link on which the client receives: we send.
    ///
    /// # Errors
    /// [`Error::IllegalState`] if the client is the sender; connection errors.
    pub async fn accept_sender(self, answer: LinkAnswer) -> Result<Sender> {
        if self.is_peer_sender() {
            return Err(Error::IllegalState("the client sends on this link"));
        }
        Ok(Sender::from_parts(self.accept(answer, Role::Sender).await?))
    }

    /// Accepts a link on which the client sends: we receive.
    ///
    /// # Errors
    /// [`Error::IllegalState`] if the client is the receiver; connection errors.
    pub async fn accept_receiver(self, answer: LinkAnswer) -> Result<Receiver> {
        if !self.is_peer_sender() {
            return Err(Error::IllegalState("the client receives on this link"));
        }
        Ok(Receiver::from_parts(
            self.accept(answer, Role::Receiver).await?,
        ))
    }

    fn reject_command(&self, error: AmqpError, reply: crate::driver::Reply<u32>) -> Command {
        let role = if self.is_peer_sender() {
            Role::Receiver
        } else {
            Role::Sender
        };
        Command::AnswerAttach {
            channel: self.channel,
            remote_handle: self.remote.handle.0,
            attach: Box::new(self.answer_attach(&LinkAnswer::default(), role)),
            setup: None,
            reject: Some(error),
            reply,
        }
    }

    /// Refuses the link: completes the attach, then detaches with `error`
    /// (e.g. `amqp:not-found` for an unknown entity).
    ///
    /// # Errors
    /// Connection errors.
    pub async fn reject(mut self, error: AmqpError) -> Result<()> {
        self.answered = true;
        let (tx, rx) = oneshot::channel();
        self.ctx.send(self.reject_command(error, tx))?;
        rx.await.map_err(|_| self.ctx.err())?.map(|_| ())
    }
}

impl Drop for LinkRequest {
    fn drop(&mut self) {
        if !self.answered {
            let (tx, _rx) = oneshot::channel();
            let cmd = self.reject_command(
                AmqpError::new(condition::NOT_FOUND, Some("link not served".to_string())),
                tx,
            );
            // The connection may already be gone; then there is nothing to refuse.
            let _ = self.ctx.cmd.send(cmd);
        }
    }
}
