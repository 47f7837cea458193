//! Application handles: [`Connection`], [`Session`], [`Sender`], [`Receiver`].
//!
//! Handles are cheap front ends of the connection driver. Dropping one detaches, ends or
//! closes it in the background without touching its siblings.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use fe2o3_amqp_types::definitions::{Fields, Handle, ReceiverSettleMode, Role, SenderSettleMode};
use fe2o3_amqp_types::messaging::{FilterSet, Source, Target, TargetArchetype};
use fe2o3_amqp_types::performatives::{ChannelMax, MaxFrameSize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::connection::{BoxIo, FramedIo};
use crate::delivery::{Delivery, IncomingDisposition, LinkFlow, Outcome, Sendable};
use crate::driver::{
    self, Command, CreditOp, LinkEvent, LinkSetup, Reply, SendReport, Stats, Track,
};
use crate::error::{AmqpError, Error, Result};
use crate::frame::{AMQP_HEADER, FrameBody, SASL_HEADER};
use crate::performative::{Attach, Open, Performative};
use crate::sasl::{self, SaslClient};
use crate::transport::{self, Address};

/// Shared plumbing from a handle to its connection driver.
#[derive(Debug, Clone)]
pub(crate) struct ConnCtx {
    pub(crate) cmd: mpsc::UnboundedSender<Command>,
    pub(crate) terminal: watch::Receiver<Option<Error>>,
}

impl ConnCtx {
    pub(crate) fn err(&self) -> Error {
        self.terminal
            .borrow()
            .clone()
            .unwrap_or(Error::ConnectionLost)
    }

    pub(crate) fn send(&self, c: Command) -> Result<()> {
        self.cmd.send(c).map_err(|_| self.err())
    }

    pub(crate) async fn call<T>(&self, f: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (tx, rx) = oneshot::channel();
        self.send(f(tx))?;
        rx.await.map_err(|_| self.err())?
    }
}

/// Options for a client connection.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    /// `container-id` sent in `open`.
    pub container_id: String,
    /// `hostname` sent in `open` and `sasl-init` (defaults to the URL's host).
    pub hostname: Option<String>,
    /// Largest frame we accept.
    pub max_frame_size: u32,
    /// Highest channel number we accept.
    pub channel_max: u16,
    /// Our idle timeout: the peer must send something at least this often.
    pub idle_timeout: Option<Duration>,
    /// SASL override; `None` derives it from the URL (PLAIN with user info, else ANONYMOUS).
    pub sasl: Option<SaslClient>,
    /// TLS client configuration for `amqps`; `None` uses [`transport::default_tls_config`].
    pub tls_config: Option<Arc<rustls::ClientConfig>>,
    /// `properties` sent in `open`.
    pub properties: Option<Fields>,
}

impl Default for ConnectionOptions {
    fn default() -> Self {
        Self {
            container_id: unique_name("sb-amqp"),
            hostname: None,
            max_frame_size: 256 * 1024,
            channel_max: 255,
            idle_timeout: None,
            sasl: None,
            tls_config: None,
            properties: None,
        }
    }
}

/// A process-unique name with a prefix (for link names and container ids).
pub fn unique_name(prefix: &str) -> String {
    use std::sync::atomic::AtomicU64;
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{:x}-{}",
        std::process::id(),
        t & 0xffff_ffff,
        N.fetch_add(1, Ordering::Relaxed)
    )
}

#[derive(Debug)]
pub(crate) struct ConnInner {
    pub(crate) ctx: ConnCtx,
    pub(crate) remote_open: Open,
    pub(crate) stats: Arc<Stats>,
}

impl Drop for ConnInner {
    fn drop(&mut self) {
        // The driver may already be gone; then there is nothing to close.
        let _ = self.ctx.cmd.send(Command::Close {
            error: None,
            reply: None,
        });
    }
}

/// An open AMQP connection (client or server side).
///
/// Cloning is cheap; the connection closes when the last clone and every session and link
/// opened from it are dropped, or on [`Connection::close`].
#[derive(Debug, Clone)]
pub struct Connection {
    pub(crate) inner: Arc<ConnInner>,
}

pub(crate) fn local_open(
    container_id: &str,
    hostname: Option<String>,
    max_frame_size: u32,
    channel_max: u16,
    idle: Option<Duration>,
    properties: Option<Fields>,
) -> Open {
    Open {
        container_id: container_id.to_string(),
        hostname,
        max_frame_size: MaxFrameSize(max_frame_size),
        channel_max: ChannelMax(channel_max),
        idle_time_out: idle.map(|d| d.as_millis().min(u128::from(u32::MAX)) as u32),
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties,
    }
}

pub(crate) async fn read_open(f: &mut FramedIo) -> Result<Open> {
    match f.read_frame().await? {
        Some(fr) => match fr.body {
            FrameBody::Amqp(p, _) => match *p {
                Performative::Open(o) => Ok(o),
                Performative::Close(c) => Err(Error::ConnectionClosed(c.error.map(Into::into))),
                other => Err(Error::Protocol(format!(
                    "expected open, got {}",
                    other.name()
                ))),
            },
            _ => Err(Error::Protocol("expected open".into())),
        },
        None => Err(Error::ConnectionLost),
    }
}

pub(crate) fn start(
    mut f: FramedIo,
    local: &Open,
    remote: Open,
    idle: Option<Duration>,
    events: Option<mpsc::UnboundedSender<crate::server::ConnectionEvent>>,
    span: tracing::Span,
) -> Connection {
    let neg = driver::Negotiated {
        peer_max_frame_size: remote
            .max_frame_size
            .0
            .max(crate::frame::MIN_MAX_FRAME_SIZE),
        channel_max: local.channel_max.0.min(remote.channel_max.0),
        local_idle: idle,
        remote_idle: remote
            .idle_time_out
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(u64::from(ms))),
    };
    f.set_max_frame_size(local.max_frame_size.0);
    let (r, w) = f.split();
    let self_ref: driver::SelfRef = Arc::default();
    let (ctx, stats) = driver::spawn(r, w, neg, events, self_ref.clone(), span);
    let inner = Arc::new(ConnInner {
        ctx,
        remote_open: remote,
        stats,
    });
    // Cannot fail: set once, right here.
    let _ = self_ref.set(Arc::downgrade(&inner));
    Connection { inner }
}

impl Connection {
    /// Connects to `amqp://[user:pass@]host[:port]`, `amqps://…`, or `ws[s]://host[:port][/path]`
    /// (AMQP over WebSockets) with default options.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f() -> sb_amqp::Result<()> {
    /// let conn = sb_amqp::Connection::open("amqp://guest:guest@127.0.0.1:5672").await?;
    /// let session = conn.begin().await?;
    /// session.end().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// Address, I/O, TLS, SASL and protocol errors.
    pub async fn open(url: &str) -> Result<Self> {
        Self::open_with(url, ConnectionOptions::default()).await
    }

    /// Connects with explicit options.
    ///
    /// # Errors
    /// Address, I/O, TLS, SASL and protocol errors.
    pub async fn open_with(url: &str, opts: ConnectionOptions) -> Result<Self> {
        let a = Address::parse(url)?;
        let tls = if a.tls {
            Some(match &opts.tls_config {
                Some(c) => c.clone(),
                None => transport::default_tls_config()?,
            })
        } else {
            None
        };
        let io = transport::connect_to(&a, tls).await?;
        let mut opts = opts;
        if opts.sasl.is_none() {
            opts.sasl = Some(a.sasl.clone());
        }
        if opts.hostname.is_none() {
            opts.hostname = Some(a.host.clone());
        }
        Self::open_io(io, opts).await
    }

    /// Runs the protocol on an already connected stream (TCP, TLS or in-memory).
    ///
    /// # Errors
    /// I/O, SASL and protocol errors.
    pub async fn open_io(io: BoxIo, opts: ConnectionOptions) -> Result<Self> {
        let span =
            tracing::info_span!("amqp_connection", role = "client", container = %opts.container_id);
        async {
            let mut f = FramedIo::new(io, opts.max_frame_size);
            let host = opts.hostname.clone().unwrap_or_else(|| "localhost".into());
            let sasl = opts.sasl.clone().unwrap_or(SaslClient::Anonymous);
            if sasl != SaslClient::None {
                f.write_header(SASL_HEADER).await?;
                let h = f.read_header().await?.ok_or(Error::ConnectionLost)?;
                if h != SASL_HEADER {
                    return Err(Error::Protocol(format!(
                        "peer answered SASL header with {h:?}"
                    )));
                }
                sasl::client(&mut f, &sasl, &host).await?;
            }
            f.write_header(AMQP_HEADER).await?;
            let h = f.read_header().await?.ok_or(Error::ConnectionLost)?;
            if h != AMQP_HEADER {
                return Err(Error::Protocol(format!(
                    "peer answered AMQP header with {h:?}"
                )));
            }
            let open = local_open(
                &opts.container_id,
                Some(host),
                opts.max_frame_size,
                opts.channel_max,
                opts.idle_timeout,
                opts.properties.clone(),
            );
            f.write_frame(&crate::frame::Frame::amqp(0, open.clone()))
                .await?;
            let remote = read_open(&mut f).await?;
            tracing::debug!(peer = %remote.container_id, "Connection open.");
            Ok(start(
                f,
                &open,
                remote,
                opts.idle_timeout,
                None,
                tracing::Span::current(),
            ))
        }
        .instrument(span)
        .await
    }

    /// The peer's `open`.
    pub fn remote_open(&self) -> &Open {
        &self.inner.remote_open
    }

    /// Begins a session with default windows.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn begin(&self) -> Result<Session> {
        self.begin_with(SessionOptions::default()).await
    }

    /// Begins a session.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn begin_with(&self, opts: SessionOptions) -> Result<Session> {
        let channel = self
            .inner
            .ctx
            .call(|reply| Command::Begin {
                incoming_window: opts.incoming_window,
                outgoing_window: opts.outgoing_window,
                reply,
            })
            .await?;
        Ok(Session {
            inner: Arc::new(SessionInner {
                conn: self.inner.clone(),
                channel,
            }),
        })
    }

    /// Closes the connection (with an optional error) and waits for the peer's `close`.
    ///
    /// # Errors
    /// The peer's close error, or the error that already ended the connection.
    pub async fn close_with(&self, error: Option<AmqpError>) -> Result<()> {
        let r = self
            .inner
            .ctx
            .call(|reply| Command::Close {
                error,
                reply: Some(reply),
            })
            .await;
        match r {
            Err(Error::ConnectionClosed(None)) => Ok(()),
            r => r,
        }
    }

    /// Closes the connection cleanly and waits for the peer's `close`.
    ///
    /// # Errors
    /// See [`Connection::close_with`].
    pub async fn close(&self) -> Result<()> {
        self.close_with(None).await
    }

    /// Waits until the connection ends and returns why.
    pub async fn closed(&self) -> Error {
        let mut rx = self.inner.ctx.terminal.clone();
        match rx.wait_for(|e| e.is_some()).await {
            Ok(e) => e.clone().unwrap_or(Error::ConnectionLost),
            Err(_) => Error::ConnectionLost,
        }
    }

    /// The error that ended the connection, if it has ended.
    pub fn error(&self) -> Option<Error> {
        self.inner.ctx.terminal.borrow().clone()
    }

    /// Number of empty (heartbeat) frames received so far.
    pub fn heartbeats_received(&self) -> u64 {
        self.inner.stats.heartbeats_received.load(Ordering::Relaxed)
    }

    /// Number of empty (heartbeat) frames sent so far.
    pub fn heartbeats_sent(&self) -> u64 {
        self.inner.stats.heartbeats_sent.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` heartbeats were received.
    ///
    /// # Errors
    /// The connection's error if it ends first.
    pub async fn wait_heartbeats(&self, n: u64) -> Result<()> {
        loop {
            let notified = self.inner.stats.heartbeat_notify.notified();
            if self.heartbeats_received() >= n {
                return Ok(());
            }
            if let Some(e) = self.error() {
                return Err(e);
            }
            tokio::select! {
                _ = notified => {}
                e = self.closed() => return Err(e),
            }
        }
    }
}

/// Session windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Transfer frames the peer may send before we widen the window again.
    pub incoming_window: u32,
    /// Our advertised outgoing window.
    pub outgoing_window: u32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            incoming_window: 2048,
            outgoing_window: 2048,
        }
    }
}

#[derive(Debug)]
pub(crate) struct SessionInner {
    conn: Arc<ConnInner>,
    channel: u16,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        // The driver may already be gone; then the session is gone too.
        let _ = self.conn.ctx.cmd.send(Command::End {
            channel: self.channel,
            error: None,
            reply: None,
        });
    }
}

/// A session. Links keep it alive; it ends when the last handle is dropped or on
/// [`Session::end`].
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl Session {
    /// The local channel number.
    pub fn channel(&self) -> u16 {
        self.inner.channel
    }

    /// The connection this session belongs to.
    pub fn connection(&self) -> Connection {
        Connection {
            inner: self.inner.conn.clone(),
        }
    }

    async fn attach(
        &self,
        attach: Attach,
        auto_credit: Option<u32>,
        auto_drain: bool,
    ) -> Result<LinkParts> {
        let (etx, erx) = mpsc::unbounded_channel();
        let (ftx, frx) = watch::channel(LinkFlow::default());
        let ctx = self.inner.conn.ctx.clone();
        let channel = self.inner.channel;
        let name = attach.name.clone();
        let (handle, remote) = ctx
            .call(|reply| Command::Attach {
                channel,
                attach: Box::new(attach.clone()),
                setup: LinkSetup {
                    events: etx,
                    flow: ftx,
                    auto_credit,
                    auto_drain,
                },
                reply,
            })
            .await?;
        let mut local = attach;
        local.handle = Handle(handle);
        Ok(LinkParts {
            core: LinkCore {
                ctx,
                channel,
                handle,
                name,
                detached: false,
                _session: Some(self.inner.clone()),
                _conn: None,
            },
            events: erx,
            flow: frx,
            local: Box::new(local),
            remote,
        })
    }

    /// Attaches a sending link.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f(session: sb_amqp::Session) -> sb_amqp::Result<()> {
    /// use sb_amqp::{SenderOptions, Sendable};
    /// let sender = session.attach_sender(SenderOptions::new("s1", "queue-a")).await?;
    /// let outcome = sender.send(Sendable::raw(&b"\x00\x53\x77\xa1\x02hi"[..])).await?;
    /// assert!(outcome.is_accepted());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::AttachRefused`] with the peer's condition, or session/connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %opts.name, channel = self.inner.channel))]
    pub async fn attach_sender(&self, opts: SenderOptions) -> Result<Sender> {
        let auto_drain = opts.auto_drain;
        let p = self.attach(opts.into_attach(), None, auto_drain).await?;
        Ok(Sender::from_parts(p))
    }

    /// Attaches a receiving link.
    ///
    /// # Errors
    /// [`Error::AttachRefused`] with the peer's condition, or session/connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %opts.name, channel = self.inner.channel))]
    pub async fn attach_receiver(&self, opts: ReceiverOptions) -> Result<Receiver> {
        let auto = opts.auto_credit;
        let initial = opts.credit;
        let p = self.attach(opts.into_attach(), auto, true).await?;
        let r = Receiver::from_parts(p);
        let c = auto.or(initial);
        if let Some(c) = c.filter(|c| *c > 0) {
            r.set_credit(c).await?;
        }
        Ok(r)
    }

    /// Ends the session and waits for the peer's `end`.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn end(self) -> Result<()> {
        let channel = self.inner.channel;
        self.inner
            .conn
            .ctx
            .call(|reply| Command::End {
                channel,
                error: None,
                reply: Some(reply),
            })
            .await
    }
}

pub(crate) struct LinkParts {
    pub(crate) core: LinkCore,
    pub(crate) events: mpsc::UnboundedReceiver<LinkEvent>,
    pub(crate) flow: watch::Receiver<LinkFlow>,
    pub(crate) local: Box<Attach>,
    pub(crate) remote: Box<Attach>,
}

#[derive(Debug)]
pub(crate) struct LinkCore {
    pub(crate) ctx: ConnCtx,
    pub(crate) channel: u16,
    pub(crate) handle: u32,
    pub(crate) name: String,
    pub(crate) detached: bool,
    pub(crate) _session: Option<Arc<SessionInner>>,
    pub(crate) _conn: Option<Arc<ConnInner>>,
}

impl Drop for LinkCore {
    fn drop(&mut self) {
        if !self.detached {
            // The driver may already be gone; then the link is gone too.
            let _ = self.ctx.cmd.send(Command::Detach {
                channel: self.channel,
                handle: self.handle,
                name: std::mem::take(&mut self.name),
                error: None,
                reply: None,
            });
        }
    }
}

impl LinkCore {
    async fn detach(&mut self, error: Option<AmqpError>) -> Result<()> {
        self.detached = true;
        let (channel, handle, name) = (self.channel, self.handle, self.name.clone());
        self.ctx
            .call(|reply| Command::Detach {
                channel,
                handle,
                name,
                error,
                reply: Some(reply),
            })
            .await
    }
}

/// A link handle's view of its event queue and credit state, shareable between tasks.
#[derive(Debug)]
pub(crate) struct LinkEvents {
    rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<LinkEvent>>,
    gone: std::sync::Mutex<Option<Error>>,
    flow: watch::Receiver<LinkFlow>,
    flow_wait: tokio::sync::Mutex<watch::Receiver<LinkFlow>>,
}

impl LinkEvents {
    fn new(rx: mpsc::UnboundedReceiver<LinkEvent>, flow: watch::Receiver<LinkFlow>) -> Self {
        Self {
            rx: tokio::sync::Mutex::new(rx),
            gone: std::sync::Mutex::new(None),
            flow_wait: tokio::sync::Mutex::new(flow.clone()),
            flow,
        }
    }

    fn gone(&self) -> Option<Error> {
        self.gone.lock().ok().and_then(|g| g.clone())
    }

    fn set_gone(&self, e: &Error) {
        if let Ok(mut g) = self.gone.lock() {
            *g = Some(e.clone());
        }
    }

    /// Next event `pick` accepts; other kinds are skipped. `Gone` ends the link for good.
    async fn next<T>(&self, ctx: &ConnCtx, pick: impl Fn(LinkEvent) -> Option<T>) -> Result<T> {
        if let Some(e) = self.gone() {
            return Err(e);
        }
        let mut rx = self.rx.lock().await;
        loop {
            match rx.recv().await {
                Some(LinkEvent::Gone(e)) => {
                    self.set_gone(&e);
                    return Err(e);
                }
                Some(ev) => {
                    if let Some(v) = pick(ev) {
                        return Ok(v);
                    }
                }
                None => return Err(self.gone().unwrap_or_else(|| ctx.err())),
            }
        }
    }

    /// Like [`LinkEvents::next`] without waiting; `Ok(None)` if nothing is queued or another
    /// task is waiting on the queue.
    fn try_next<T>(
        &self,
        ctx: &ConnCtx,
        pick: impl Fn(LinkEvent) -> Option<T>,
    ) -> Result<Option<T>> {
        if let Some(e) = self.gone() {
            return Err(e);
        }
        let Ok(mut rx) = self.rx.try_lock() else {
            return Ok(None);
        };
        loop {
            match rx.try_recv() {
                Ok(LinkEvent::Gone(e)) => {
                    self.set_gone(&e);
                    return Err(e);
                }
                Ok(ev) => {
                    if let Some(v) = pick(ev) {
                        return Ok(Some(v));
                    }
                }
                Err(mpsc::error::TryRecvError::Empty) => return Ok(None),
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Err(self.gone().unwrap_or_else(|| ctx.err()));
                }
            }
        }
    }

    /// Why the link is gone: the queued detach/end/close error, else the connection's.
    fn gone_error(&self, ctx: &ConnCtx) -> Error {
        if let Some(e) = self.gone() {
            return e;
        }
        if let Ok(mut rx) = self.rx.try_lock() {
            while let Ok(ev) = rx.try_recv() {
                if let LinkEvent::Gone(e) = ev {
                    self.set_gone(&e);
                    return e;
                }
            }
        }
        ctx.err()
    }

    fn flow(&self) -> LinkFlow {
        *self.flow.borrow()
    }

    async fn flow_changed(&self, ctx: &ConnCtx) -> Result<LinkFlow> {
        let mut w = self.flow_wait.lock().await;
        if w.changed().await.is_err() {
            return Err(self.gone_error(ctx));
        }
        Ok(*w.borrow_and_update())
    }

    async fn wait_credit(&self, ctx: &ConnCtx) -> Result<LinkFlow> {
        let mut w = self.flow_wait.lock().await;
        let r = w.wait_for(|f| f.credit > 0).await.map(|f| *f);
        r.map_err(|_| self.gone_error(ctx))
    }
}

fn source(address: Option<String>) -> Source {
    Source {
        address,
        ..Default::default()
    }
}

fn target(address: Option<String>) -> TargetArchetype {
    TargetArchetype::Target(Target {
        address,
        ..Default::default()
    })
}

/// Options for [`Session::attach_sender`].
#[derive(Debug, Clone)]
pub struct SenderOptions {
    /// Link name.
    pub name: String,
    /// Target address.
    pub target: Option<String>,
    /// Source address.
    pub source: Option<String>,
    /// Sender settle mode (default `unsettled`; `settled` for fire-and-forget links).
    pub snd_settle_mode: SenderSettleMode,
    /// Receiver settle mode we ask for.
    pub rcv_settle_mode: ReceiverSettleMode,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Answer a receiver's drain automatically when nothing is queued (default true).
    pub auto_drain: bool,
}

impl SenderOptions {
    /// A sender named `name` to `target`.
    pub fn new(name: impl Into<String>, target: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            target: Some(target.into()),
            source: None,
            snd_settle_mode: SenderSettleMode::Unsettled,
            rcv_settle_mode: ReceiverSettleMode::First,
            properties: None,
            auto_drain: true,
        }
    }

    /// Sets the sender settle mode.
    #[must_use]
    pub fn snd_settle_mode(mut self, m: SenderSettleMode) -> Self {
        self.snd_settle_mode = m;
        self
    }

    /// Sets the receiver settle mode we ask for.
    #[must_use]
    pub fn rcv_settle_mode(mut self, m: ReceiverSettleMode) -> Self {
        self.rcv_settle_mode = m;
        self
    }

    /// Sets the source address.
    #[must_use]
    pub fn source(mut self, s: impl Into<String>) -> Self {
        self.source = Some(s.into());
        self
    }

    /// Sets link properties.
    #[must_use]
    pub fn properties(mut self, p: Fields) -> Self {
        self.properties = Some(p);
        self
    }

    fn into_attach(self) -> Attach {
        Attach {
            name: self.name,
            handle: Handle(0),
            role: Role::Sender,
            snd_settle_mode: self.snd_settle_mode,
            rcv_settle_mode: self.rcv_settle_mode,
            source: Some(Box::new(source(self.source))),
            target: Some(Box::new(target(self.target))),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: self.properties,
        }
    }
}

/// Options for [`Session::attach_receiver`].
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// Link name.
    pub name: String,
    /// Source address.
    pub source: Option<String>,
    /// Target address (the reply address for request/response).
    pub target: Option<String>,
    /// Receiver settle mode (`first` settles on disposition; `second` waits for the peer).
    pub rcv_settle_mode: ReceiverSettleMode,
    /// Sender settle mode we ask for.
    pub snd_settle_mode: SenderSettleMode,
    /// Source filter set.
    pub filter: Option<FilterSet>,
    /// Keep this much credit topped up automatically (refilled at half).
    pub auto_credit: Option<u32>,
    /// Credit granted once after attach (ignored with `auto_credit`).
    pub credit: Option<u32>,
    /// Link properties.
    pub properties: Option<Fields>,
    /// Our `max-message-size`: larger deliveries are rejected with
    /// `amqp:link:message-size-exceeded` without being buffered.
    pub max_message_size: Option<u64>,
}

impl ReceiverOptions {
    /// A receiver named `name` from `source`, granting no credit until asked.
    pub fn new(name: impl Into<String>, source: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            source: Some(source.into()),
            target: None,
            rcv_settle_mode: ReceiverSettleMode::First,
            snd_settle_mode: SenderSettleMode::Unsettled,
            filter: None,
            auto_credit: None,
            credit: None,
            properties: None,
            max_message_size: None,
        }
    }

    /// Sets our `max-message-size`.
    #[must_use]
    pub fn max_message_size(mut self, n: u64) -> Self {
        self.max_message_size = Some(n);
        self
    }

    /// Sets the receiver settle mode.
    #[must_use]
    pub fn rcv_settle_mode(mut self, m: ReceiverSettleMode) -> Self {
        self.rcv_settle_mode = m;
        self
    }

    /// Sets the sender settle mode we ask for.
    #[must_use]
    pub fn snd_settle_mode(mut self, m: SenderSettleMode) -> Self {
        self.snd_settle_mode = m;
        self
    }

    /// Sets the target address.
    #[must_use]
    pub fn target(mut self, t: impl Into<String>) -> Self {
        self.target = Some(t.into());
        self
    }

    /// Keeps `n` credit topped up automatically.
    #[must_use]
    pub fn auto_credit(mut self, n: u32) -> Self {
        self.auto_credit = Some(n);
        self
    }

    /// Grants `n` credit once after attaching.
    #[must_use]
    pub fn credit(mut self, n: u32) -> Self {
        self.credit = Some(n);
        self
    }

    /// Sets the source filter set.
    #[must_use]
    pub fn filter(mut self, f: FilterSet) -> Self {
        self.filter = Some(f);
        self
    }

    fn into_attach(self) -> Attach {
        let mut src = source(self.source);
        src.filter = self.filter;
        Attach {
            name: self.name,
            handle: Handle(0),
            role: Role::Receiver,
            snd_settle_mode: self.snd_settle_mode,
            rcv_settle_mode: self.rcv_settle_mode,
            source: Some(Box::new(src)),
            target: Some(Box::new(target(self.target))),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: None,
            max_message_size: self.max_message_size,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: self.properties,
        }
    }
}

fn address_of_source(a: &Attach) -> Option<&str> {
    a.source.as_ref().and_then(|s| s.address.as_deref())
}

fn address_of_target(a: &Attach) -> Option<&str> {
    match a.target.as_deref() {
        Some(TargetArchetype::Target(t)) => t.address.as_deref(),
        _ => None,
    }
}

/// A sending link (client side, or a server-side link a client receives from).
#[derive(Debug)]
pub struct Sender {
    core: LinkCore,
    events: LinkEvents,
    local: Box<Attach>,
    remote: Box<Attach>,
}

impl Sender {
    pub(crate) fn from_parts(p: LinkParts) -> Self {
        Self {
            core: p.core,
            events: LinkEvents::new(p.events, p.flow),
            local: p.local,
            remote: p.remote,
        }
    }

    /// Link name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Our `attach`.
    pub fn local_attach(&self) -> &Attach {
        &self.local
    }

    /// The peer's `attach`.
    pub fn remote_attach(&self) -> &Attach {
        &self.remote
    }

    /// Target address (ours).
    pub fn target_address(&self) -> Option<&str> {
        address_of_target(&self.local)
    }

    /// The peer's `max-message-size` (0 = unlimited).
    pub fn max_message_size(&self) -> u64 {
        self.remote.max_message_size.unwrap_or(0)
    }

    async fn send_tracked(&self, send: Sendable, track: Track) -> Result<SendReport> {
        let (channel, handle) = (self.core.channel, self.core.handle);
        self.core
            .ctx
            .call(|reply| Command::Send {
                channel,
                handle,
                send,
                track,
                reply,
            })
            .await
    }

    /// Sends unsettled and waits for the peer's outcome (settling it if the peer does not).
    ///
    /// Waits for credit first. A peer that settles without a state counts as accepted.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors; a rejection is an `Ok(Outcome::Rejected)`.
    #[tracing::instrument(level = "trace", skip_all, fields(link = %self.core.name))]
    pub async fn send(&self, send: Sendable) -> Result<Outcome> {
        let r = self.send_tracked(send, Track::Await).await?;
        Ok(r.state
            .as_ref()
            .and_then(Outcome::from_state)
            .unwrap_or(Outcome::Accepted))
    }

    /// Sends pre-settled; returns the delivery id once written.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn send_settled(&self, send: Sendable) -> Result<u32> {
        Ok(self.send_tracked(send, Track::Settled).await?.delivery_id)
    }

    /// Sends unsettled without waiting for the outcome: returns the delivery id once written.
    /// The peer's dispositions arrive through [`Sender::next_disposition`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn send_no_wait(&self, send: Sendable) -> Result<u32> {
        Ok(self.send_tracked(send, Track::Events).await?.delivery_id)
    }

    /// Next disposition from the peer for a delivery sent with [`Sender::send_no_wait`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] once the link is gone, or the connection's error.
    pub async fn next_disposition(&self) -> Result<IncomingDisposition> {
        self.events
            .next(&self.core.ctx, |ev| match ev {
                LinkEvent::Disposition(d) => Some(d),
                _ => None,
            })
            .await
    }

    /// Settles a delivery the peer disposed without settling (receiver settle mode
    /// `second`), with the outcome we choose (e.g. the same type, or
    /// `rejected{com.microsoft:message-lock-lost}`).
    ///
    /// # Errors
    /// [`Error::IllegalState`] for an unknown or already settled delivery.
    pub async fn settle(&self, delivery_id: u32, outcome: Outcome) -> Result<()> {
        let channel = self.core.channel;
        self.core
            .ctx
            .call(|reply| Command::Dispose {
                channel,
                role: Role::Sender,
                delivery_id,
                settled: true,
                state: Some(outcome.into()),
                reply,
            })
            .await
            .map(|_| ())
    }

    /// Credit and drain state as last seen.
    pub fn flow(&self) -> LinkFlow {
        self.events.flow()
    }

    /// Waits for the next change of credit or drain state.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] (or the session's/connection's error) once the link is gone.
    pub async fn flow_changed(&self) -> Result<LinkFlow> {
        self.events.flow_changed(&self.core.ctx).await
    }

    /// Waits until the receiver granted credit.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] (or the session's/connection's error) once the link is gone.
    pub async fn wait_credit(&self) -> Result<LinkFlow> {
        self.events.wait_credit(&self.core.ctx).await
    }

    /// Answers a receiver's drain request: spends the remaining credit and reports it.
    ///
    /// # Errors
    /// The connection's error if it ended.
    pub fn answer_drain(&self) -> Result<()> {
        self.core.ctx.send(Command::AnswerDrain {
            channel: self.core.channel,
            handle: self.core.handle,
        })
    }

    /// Detaches (closing the link) and waits for the peer's detach.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn detach(mut self) -> Result<()> {
        self.core.detach(None).await
    }

    /// Detaches with an error condition.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn detach_with_error(mut self, error: AmqpError) -> Result<()> {
        self.core.detach(Some(error)).await
    }
}

/// A receiving link (client side, or a server-side link a client sends to).
#[derive(Debug)]
pub struct Receiver {
    core: LinkCore,
    events: LinkEvents,
    local: Box<Attach>,
    remote: Box<Attach>,
}

impl Receiver {
    pub(crate) fn from_parts(p: LinkParts) -> Self {
        Self {
            core: p.core,
            events: LinkEvents::new(p.events, p.flow),
            local: p.local,
            remote: p.remote,
        }
    }

    /// Link name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Our `attach`.
    pub fn local_attach(&self) -> &Attach {
        &self.local
    }

    /// The peer's `attach`.
    pub fn remote_attach(&self) -> &Attach {
        &self.remote
    }

    /// Source address (ours).
    pub fn source_address(&self) -> Option<&str> {
        address_of_source(&self.local)
    }

    /// Target address (ours).
    pub fn target_address(&self) -> Option<&str> {
        address_of_target(&self.local)
    }

    async fn credit(&self, op: CreditOp, drain: bool) -> Result<()> {
        let (channel, handle) = (self.core.channel, self.core.handle);
        self.core
            .ctx
            .call(|reply| Command::Credit {
                channel,
                handle,
                op,
                drain,
                reply,
            })
            .await
    }

    /// Sets the link credit to `n` (sends a `flow`).
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn set_credit(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Set(n), false).await
    }

    /// Adds `n` to the link credit.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn add_credit(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Add(n), false).await
    }

    /// Asks the sender to drain: it sends what it can, then spends the rest of the credit.
    /// Returns when the credit is zero. Deliveries that arrived stay queued for
    /// [`Receiver::recv`].
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn drain(&self) -> Result<()> {
        self.credit(CreditOp::Add(0), true).await
    }

    /// Sets the credit to `n` and asks the sender to drain, in one `flow`; returns when the
    /// credit is zero.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn drain_with(&self, n: u32) -> Result<()> {
        self.credit(CreditOp::Set(n), true).await
    }

    /// Credit state as last seen.
    pub fn flow(&self) -> LinkFlow {
        self.events.flow()
    }

    /// Waits for the next delivery.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] with the peer's condition once the link is gone, or the
    /// connection's error.
    pub async fn recv(&self) -> Result<Delivery> {
        self.events
            .next(&self.core.ctx, |ev| match ev {
                LinkEvent::Delivery(d) => Some(d),
                _ => None,
            })
            .await
    }

    /// Returns a delivery if one is queued (`Ok(None)` also while another task waits in
    /// [`Receiver::recv`]).
    ///
    /// # Errors
    /// As [`Receiver::recv`].
    pub fn try_recv(&self) -> Result<Option<Delivery>> {
        self.events.try_next(&self.core.ctx, |ev| match ev {
            LinkEvent::Delivery(d) => Some(d),
            _ => None,
        })
    }

    /// Sends a disposition with `outcome`.
    ///
    /// With receiver settle mode `first` the disposition is settled and this returns
    /// `Ok(None)` once written. With `second` it is unsettled and this waits for the peer's
    /// settled reply and returns the peer's outcome (e.g. `rejected` with
    /// `com.microsoft:message-lock-lost`). A pre-settled delivery needs nothing: `Ok(None)`.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors; [`Error::IllegalState`] for a delivery
    /// already settled.
    #[tracing::instrument(level = "trace", skip_all, fields(link = %self.core.name, delivery_id = d.delivery_id))]
    pub async fn settle(&self, d: &Delivery, outcome: Outcome) -> Result<Option<Outcome>> {
        if d.settled {
            return Ok(None);
        }
        let settled = self.local.rcv_settle_mode == ReceiverSettleMode::First;
        let channel = self.core.channel;
        let delivery_id = d.delivery_id;
        let state = self
            .core
            .ctx
            .call(|reply| Command::Dispose {
                channel,
                role: Role::Receiver,
                delivery_id,
                settled,
                state: Some(outcome.into()),
                reply,
            })
            .await?;
        Ok(state.as_ref().and_then(Outcome::from_state))
    }

    /// `settle(d, Outcome::Accepted)`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn accept(&self, d: &Delivery) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Accepted).await
    }

    /// `settle(d, Outcome::Rejected(error))`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn reject(&self, d: &Delivery, error: Option<AmqpError>) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Rejected(error)).await
    }

    /// `settle(d, Outcome::Released)`.
    ///
    /// # Errors
    /// As [`Receiver::settle`].
    pub async fn release(&self, d: &Delivery) -> Result<Option<Outcome>> {
        self.settle(d, Outcome::Released).await
    }

    /// Detaches (closing the link) and waits for the peer's detach.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn detach(mut self) -> Result<()> {
        self.core.detach(None).await
    }

    /// Detaches with an error condition.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn detach_with_error(mut self, error: AmqpError) -> Result<()> {
        self.core.detach(Some(error)).await
    }
}

/// Settles deliveries of one [`Receiver`] from any task, while another task waits in
/// [`Receiver::recv`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Settler {
    ctx: ConnCtx,
    channel: u16,
    settle_first: bool,
}

impl Receiver {
    /// A settlement handle for this link's deliveries.
    pub fn settler(&self) -> Settler {
        Settler {
            ctx: self.core.ctx.clone(),
            channel: self.core.channel,
            settle_first: self.local.rcv_settle_mode == ReceiverSettleMode::First,
        }
    }
}

impl Settler {
    /// As [`Receiver::settle`], by delivery id: with receiver settle mode `second` it waits for
    /// the peer's settled reply and returns the peer's outcome.
    ///
    /// # Errors
    /// [`Error::LinkDetached`] and connection errors.
    pub async fn settle(&self, delivery_id: u32, outcome: Outcome) -> Result<Option<Outcome>> {
        let (channel, settled) = (self.channel, self.settle_first);
        let state = self
            .ctx
            .call(|reply| Command::Dispose {
                channel,
                role: Role::Receiver,
                delivery_id,
                settled,
                state: Some(outcome.into()),
                reply,
            })
            .await?;
        Ok(state.as_ref().and_then(Outcome::from_state))
    }

    /// How many received deliveries of this link's session are not settled yet (tests check
    /// that nothing is left behind).
    ///
    /// # Errors
    /// The connection's error if it ended.
    pub async fn unsettled(&self) -> Result<usize> {
        let channel = self.channel;
        self.ctx
            .call(|reply| Command::Unsettled { channel, reply })
            .await
    }
}
