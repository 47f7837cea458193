//! The connection driver: one task per connection owns every session and link state machine
//! and the write half of the socket. Handles talk to it through [`Command`]s.
//!
//! A separate reader task parses frames so that a large write never waits on our own reads.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{Fields, Handle, Role};
use fe2o3_amqp_types::messaging::DeliveryState;
use serde_bytes::ByteBuf;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::connection::{FrameReader, FrameWriter};
use crate::delivery::{Delivery, IncomingDisposition, LinkFlow, Sendable};
use crate::error::{AmqpError, Error, Result, condition};
use crate::frame::{Frame, FrameBody};
use crate::performative::{
    Attach, Begin, Close, Detach, Disposition, End, Flow, Performative, Transfer,
};
use crate::server::{ConnectionEvent, LinkRequest};

/// Result of a send as reported by the driver.
#[derive(Debug)]
pub(crate) struct SendReport {
    pub(crate) delivery_id: u32,
    pub(crate) state: Option<DeliveryState>,
}

/// How the driver reports a send back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Track {
    /// Pre-settled: reply once written.
    Settled,
    /// Reply with the peer's outcome; settle automatically if the peer does not.
    Await,
    /// Reply once written; the peer's dispositions go to the link's event queue.
    Events,
}

pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// What a link handle needs from the driver.
#[derive(Debug)]
pub(crate) struct LinkSetup {
    pub(crate) events: mpsc::UnboundedSender<LinkEvent>,
    pub(crate) flow: watch::Sender<LinkFlow>,
    pub(crate) auto_credit: Option<u32>,
    pub(crate) auto_drain: bool,
}

/// Events for one link handle.
#[derive(Debug)]
pub(crate) enum LinkEvent {
    Delivery(Delivery),
    Disposition(IncomingDisposition),
    /// The link is gone: detached by the peer, its session ended or the connection died.
    Gone(Error),
}

#[derive(Debug)]
pub(crate) enum CreditOp {
    Set(u32),
    Add(u32),
}

#[derive(Debug)]
pub(crate) enum Command {
    Begin {
        incoming_window: u32,
        outgoing_window: u32,
        reply: Reply<u16>,
    },
    End {
        channel: u16,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    Attach {
        channel: u16,
        attach: Box<Attach>,
        setup: LinkSetup,
        reply: Reply<(u32, Box<Attach>)>,
    },
    AnswerAttach {
        channel: u16,
        remote_handle: u32,
        attach: Box<Attach>,
        setup: Option<LinkSetup>,
        reject: Option<AmqpError>,
        reply: Reply<u32>,
    },
    Detach {
        channel: u16,
        handle: u32,
        /// The link's name: a handle is reused once its link is gone, and a late detach (a
        /// link dropped after the peer detached it) must not end the link that has it now.
        name: String,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    Send {
        channel: u16,
        handle: u32,
        send: Sendable,
        track: Track,
        reply: Reply<SendReport>,
    },
    Credit {
        channel: u16,
        handle: u32,
        op: CreditOp,
        drain: bool,
        reply: Reply<()>,
    },
    AnswerDrain {
        channel: u16,
        handle: u32,
    },
    Dispose {
        channel: u16,
        role: Role,
        delivery_id: u32,
        settled: bool,
        state: Option<DeliveryState>,
        reply: Reply<Option<DeliveryState>>,
    },
    Close {
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    },
    /// How many incoming deliveries of the session wait for their settlement.
    Unsettled {
        channel: u16,
        reply: Reply<usize>,
    },
}

/// Counters readable from handles.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) heartbeats_received: AtomicU64,
    pub(crate) heartbeats_sent: AtomicU64,
    pub(crate) heartbeat_notify: tokio::sync::Notify,
}

struct PendingSend {
    send: Sendable,
    track: Track,
    reply: Reply<SendReport>,
    started: Option<(u32, Bytes)>,
    offset: usize,
}

struct Partial {
    delivery_id: u32,
    tag: Bytes,
    format: u32,
    settled: bool,
    state: Option<DeliveryState>,
    buf: BytesMut,
    oversize: bool,
}

struct Link {
    name: String,
    role: Role,
    remote_handle: Option<u32>,
    max_message_size: u64,
    /// Our own `max-message-size`: larger incoming deliveries are rejected, not buffered.
    max_incoming: u64,
    delivery_count: u32,
    credit: u32,
    drain: bool,
    available: u32,
    next_tag: u64,
    pending: VecDeque<PendingSend>,
    partial: Option<Partial>,
    setup: LinkSetup,
    attach_waiter: Option<Reply<(u32, Box<Attach>)>>,
    refused: Option<Box<Attach>>,
    detach_sent: bool,
    detach_waiters: Vec<Reply<()>>,
    drain_waiter: Option<Reply<()>>,
}

impl Link {
    fn publish_flow(&self) {
        self.setup.flow.send_replace(LinkFlow {
            credit: self.credit,
            delivery_count: self.delivery_count,
            drain: self.drain,
            available: self.available,
        });
    }

    fn fail(&mut self, err: &Error) {
        if let Some(w) = self.attach_waiter.take() {
            let _ = w.send(Err(err.clone())); // the handle may be gone; nothing to tell then
        }
        for p in self.pending.drain(..) {
            let _ = p.reply.send(Err(err.clone())); // same: the caller may have given up
        }
        if let Some(w) = self.drain_waiter.take() {
            let _ = w.send(Err(err.clone())); // same
        }
        for w in self.detach_waiters.drain(..) {
            let _ = w.send(Ok(())); // the link is gone either way
        }
        let _ = self.setup.events.send(LinkEvent::Gone(err.clone())); // handle may be dropped
    }
}

struct OutUnsettled {
    handle: u32,
    tag: Bytes,
    waiter: Option<Reply<SendReport>>,
}

struct InUnsettled {
    handle: u32,
    waiter: Option<Reply<Option<DeliveryState>>>,
}

struct PendingRemote {
    flow: Option<Flow>,
    initial_delivery_count: Option<u32>,
    max_message_size: Option<u64>,
}

struct Session {
    remote_channel: Option<u16>,
    next_outgoing_id: u32,
    initial_outgoing_id: u32,
    incoming_window: u32,
    max_incoming_window: u32,
    outgoing_window: u32,
    next_incoming_id: u32,
    remote_incoming_window: u32,
    next_delivery_id: u32,
    links: HashMap<u32, Link>,
    by_remote: HashMap<u32, u32>,
    pending_remote: HashMap<u32, PendingRemote>,
    unsettled_out: HashMap<u32, OutUnsettled>,
    unsettled_in: HashMap<u32, InUnsettled>,
    begin_waiter: Option<Reply<u16>>,
    end_sent: bool,
    end_waiters: Vec<Reply<()>>,
}

impl Session {
    fn new(incoming_window: u32, outgoing_window: u32) -> Self {
        Self {
            remote_channel: None,
            next_outgoing_id: 0,
            initial_outgoing_id: 0,
            incoming_window,
            max_incoming_window: incoming_window,
            outgoing_window,
            next_incoming_id: 0,
            remote_incoming_window: 0,
            next_delivery_id: 0,
            links: HashMap::new(),
            by_remote: HashMap::new(),
            pending_remote: HashMap::new(),
            unsettled_out: HashMap::new(),
            unsettled_in: HashMap::new(),
            begin_waiter: None,
            end_sent: false,
            end_waiters: Vec::new(),
        }
    }

    fn free_handle(&self) -> u32 {
        (0..).find(|h| !self.links.contains_key(h)).unwrap_or(0)
    }

    fn fail(&mut self, err: &Error) {
        if let Some(w) = self.begin_waiter.take() {
            let _ = w.send(Err(err.clone())); // the caller may have given up
        }
        for (_, mut l) in self.links.drain() {
            l.fail(err);
        }
        for (_, u) in self.unsettled_out.drain() {
            if let Some(w) = u.waiter {
                let _ = w.send(Err(err.clone())); // the caller may have given up
            }
        }
        for (_, u) in self.unsettled_in.drain() {
            if let Some(w) = u.waiter {
                let _ = w.send(Err(err.clone())); // the caller may have given up
            }
        }
        for w in self.end_waiters.drain(..) {
            let _ = w.send(Ok(())); // ended either way
        }
    }

    fn flow_frame(&self) -> Flow {
        Flow {
            next_incoming_id: self.remote_channel.map(|_| self.next_incoming_id),
            incoming_window: self.incoming_window,
            next_outgoing_id: self.next_outgoing_id,
            outgoing_window: self.outgoing_window,
            handle: None,
            delivery_count: None,
            link_credit: None,
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }
    }

    fn link_flow_frame(&self, handle: u32) -> Flow {
        let mut f = self.flow_frame();
        if let Some(l) = self.links.get(&handle) {
            f.handle = Some(Handle(handle));
            f.delivery_count = Some(l.delivery_count);
            f.link_credit = Some(l.credit);
            f.drain = l.drain;
            if l.role == Role::Sender {
                f.available = Some(l.pending.len() as u32);
            }
        }
        f
    }
}

/// Connection-level parameters negotiated by `open`.
#[derive(Debug, Clone)]
pub(crate) struct Negotiated {
    pub(crate) peer_max_frame_size: u32,
    pub(crate) channel_max: u16,
    pub(crate) local_idle: Option<Duration>,
    pub(crate) remote_idle: Option<Duration>,
}

pub(crate) struct Driver {
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    cmd_weak: mpsc::WeakUnboundedSender<Command>,
    terminal: watch::Sender<Option<Error>>,
    frames: mpsc::Receiver<Result<Option<Frame>>>,
    writer: FrameWriter,
    neg: Negotiated,
    sessions: HashMap<u16, Session>,
    remote_channels: HashMap<u16, u16>,
    /// Remote channels whose session has ended and that no `begin` reused yet: a frame that
    /// crossed our `end` on the wire (the legal end/begin race) is dropped, not fatal.
    ended_channels: HashSet<u16>,
    events: Option<mpsc::UnboundedSender<ConnectionEvent>>,
    /// The connection handle, for link requests to keep it alive (weak: the driver must not).
    self_ref: SelfRef,
    stats: Arc<Stats>,
    last_recv: Instant,
    last_sent: Instant,
    close_sent: bool,
    close_deadline: Option<Instant>,
    close_waiters: Vec<Reply<()>>,
    finished: Option<Error>,
}

/// How long we wait for the peer's `close` after sending ours.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Starts the reader and driver tasks.
pub(crate) type SelfRef = Arc<std::sync::OnceLock<std::sync::Weak<crate::client::ConnInner>>>;

pub(crate) fn spawn(
    reader: FrameReader,
    writer: FrameWriter,
    neg: Negotiated,
    events: Option<mpsc::UnboundedSender<ConnectionEvent>>,
    self_ref: SelfRef,
    span: tracing::Span,
) -> (crate::client::ConnCtx, Arc<Stats>) {
    use tracing::Instrument;
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (terminal, terminal_rx) = watch::channel(None);
    let (ftx, frx) = mpsc::channel(64);
    let stats = Arc::new(Stats::default());
    let reader_task = tokio::spawn(read_loop(reader, ftx).instrument(span.clone()));
    let ctx = crate::client::ConnCtx {
        cmd: cmd_tx.clone(),
        terminal: terminal_rx,
    };
    let driver = Driver {
        cmd_rx,
        cmd_weak: cmd_tx.downgrade(),
        terminal,
        frames: frx,
        writer,
        neg,
        sessions: HashMap::new(),
        remote_channels: HashMap::new(),
        ended_channels: HashSet::new(),
        events,
        self_ref,
        stats: stats.clone(),
        last_recv: Instant::now(),
        last_sent: Instant::now(),
        close_sent: false,
        close_deadline: None,
        close_waiters: Vec::new(),
        finished: None,
    };
    drop(cmd_tx);
    tokio::spawn(
        async move {
            driver.run().await;
            reader_task.abort();
        }
        .instrument(span),
    );
    (ctx, stats)
}

async fn read_loop(mut reader: FrameReader, tx: mpsc::Sender<Result<Option<Frame>>>) {
    loop {
        let r = reader.read_frame().await;
        let stop = !matches!(r, Ok(Some(_)));
        if tx.send(r).await.is_err() || stop {
            return;
        }
    }
}

fn wrapping_diff(a: u32, b: u32) -> u32 {
    // serial-number arithmetic: credit left = a - b, never negative
    let d = a.wrapping_sub(b);
    if d > u32::MAX / 2 { 0 } else { d }
}

impl Driver {
    async fn run(mut self) {
        let err = self.run_inner().await;
        tracing::debug!(error = %err, "Connection driver stopped.");
        let _ = self.writer.flush().await; // best effort: the socket may be gone
        self.writer.shutdown().await;
        self.terminal.send_replace(Some(err.clone()));
        for (_, mut s) in self.sessions.drain() {
            s.fail(&err);
        }
        for w in self.close_waiters.drain(..) {
            let r = match &err {
                Error::ConnectionClosed(None) => Ok(()),
                e => Err(e.clone()),
            };
            let _ = w.send(r); // the caller may have given up
        }
    }

    fn next_deadline(&self) -> Instant {
        let far = Instant::now() + Duration::from_secs(3600);
        let hb = self
            .neg
            .remote_idle
            .map(|d| self.last_sent + d / 2)
            .unwrap_or(far);
        let idle = self
            .neg
            .local_idle
            .map(|d| self.last_recv + d)
            .unwrap_or(far);
        hb.min(idle).min(self.close_deadline.unwrap_or(far))
    }

    async fn run_inner(&mut self) -> Error {
        let mut cmds_open = true;
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                f = self.frames.recv() => {
                    self.last_recv = Instant::now();
                    match f {
                        Some(Ok(Some(frame))) => {
                            if let Err(e) = self.on_frame(frame) {
                                tracing::warn!(error = %e, "Protocol error from peer; closing.");
                                let cond = match &e {
                                    Error::Decode(_) => condition::DECODE_ERROR,
                                    _ => condition::FRAMING_ERROR,
                                };
                                self.send_close(Some(AmqpError::new(cond, Some(e.to_string()))));
                                return e;
                            }
                        }
                        Some(Ok(None)) | None => {
                            return self.finished.take().unwrap_or(Error::ConnectionLost);
                        }
                        Some(Err(e)) => {
                            let cond = match &e {
                                Error::Decode(_) => Some(condition::DECODE_ERROR),
                                Error::Protocol(_) => Some(condition::FRAMING_ERROR),
                                _ => None,
                            };
                            if let Some(c) = cond {
                                self.send_close(Some(AmqpError::new(c, Some(e.to_string()))));
                            }
                            return self.finished.take().unwrap_or(e);
                        }
                    }
                }
                c = self.cmd_rx.recv(), if cmds_open => match c {
                    Some(c) => {
                        self.on_command(c);
                        // Batch what is already queued so one flush covers many frames.
                        for _ in 0..64 {
                            match self.cmd_rx.try_recv() {
                                Ok(c) => self.on_command(c),
                                Err(_) => break,
                            }
                        }
                    }
                    None => {
                        cmds_open = false;
                        self.send_close(None);
                    }
                },
                _ = tokio::time::sleep_until(deadline) => {
                    let now = Instant::now();
                    if self.close_deadline.is_some_and(|d| now >= d) {
                        tracing::warn!("Peer did not answer our close; dropping the connection.");
                        return Error::ConnectionClosed(None);
                    }
                    if let Some(d) = self.neg.local_idle
                        && now >= self.last_recv + d {
                            tracing::warn!(idle_ms = d.as_millis() as u64, "Peer went silent; closing.");
                            self.send_close(Some(AmqpError::new(
                                condition::RESOURCE_LIMIT_EXCEEDED,
                                Some("local-idle-timeout expired".to_string()),
                            )));
                            return Error::IdleTimeout;
                        }
                    if let Some(d) = self.neg.remote_idle
                        && now >= self.last_sent + d / 2 && self.writer.pending() == 0 {
                            let _ = self.writer.buffer(&Frame::heartbeat()); // cannot fail: no body
                            self.stats.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
                        }
                }
            }
            if self.writer.pending() > 0 {
                if let Err(e) = self.writer.flush().await {
                    return e;
                }
                self.last_sent = Instant::now();
            }
            if let Some(e) = self.finished.take() {
                return e;
            }
        }
    }

    fn write(&mut self, channel: u16, p: impl Into<Performative>) {
        let p = p.into();
        tracing::trace!(channel, performative = p.name(), "Send.");
        if let Err(e) = self.writer.buffer(&Frame::amqp(channel, p)) {
            tracing::error!(error = %e, "Failed to encode a frame.");
        }
    }

    fn send_close(&mut self, error: Option<AmqpError>) {
        if !self.close_sent {
            self.close_sent = true;
            self.close_deadline = Some(Instant::now() + CLOSE_TIMEOUT);
            self.write(
                0,
                Close {
                    error: error.map(Into::into),
                },
            );
        }
    }

    fn on_frame(&mut self, frame: Frame) -> Result<()> {
        let (p, payload) = match frame.body {
            FrameBody::Empty => {
                self.stats
                    .heartbeats_received
                    .fetch_add(1, Ordering::Relaxed);
                self.stats.heartbeat_notify.notify_waiters();
                return Ok(());
            }
            FrameBody::Sasl(_) => return Err(Error::Protocol("SASL frame after open".into())),
            FrameBody::Amqp(p, payload) => (*p, payload),
        };
        tracing::trace!(
            channel = frame.channel,
            performative = p.name(),
            "Received."
        );
        let ch = frame.channel;
        match p {
            Performative::Open(_) => Err(Error::Protocol("second open".into())),
            Performative::Close(c) => {
                let remote = c.error.map(AmqpError::from);
                if !self.close_sent {
                    self.send_close(None);
                    self.finished = Some(Error::ConnectionClosed(remote));
                } else {
                    self.finished = Some(match remote {
                        Some(e) => Error::ConnectionClosed(Some(e)),
                        None => Error::ConnectionClosed(None),
                    });
                }
                Ok(())
            }
            Performative::Begin(b) => {
                self.on_begin(ch, b);
                Ok(())
            }
            Performative::End(e) => {
                self.on_end(ch, e);
                Ok(())
            }
            other => {
                let Some(&local) = self.remote_channels.get(&ch) else {
                    if self.ended_channels.contains(&ch) {
                        tracing::debug!(
                            channel = ch,
                            performative = other.name(),
                            "Frame on an ended channel dropped."
                        );
                        return Ok(());
                    }
                    return Err(Error::Protocol(format!("frame on unknown channel {ch}")));
                };
                match other {
                    Performative::Attach(a) => self.on_attach(local, a),
                    Performative::Flow(f) => self.on_flow(local, f),
                    Performative::Transfer(t) => self.on_transfer(local, t, payload),
                    Performative::Disposition(d) => self.on_disposition(local, d),
                    Performative::Detach(d) => self.on_detach(local, d),
                    _ => {}
                }
                Ok(())
            }
        }
    }

    fn on_begin(&mut self, ch: u16, b: Begin) {
        let local = match b.remote_channel {
            Some(local) if self.sessions.contains_key(&local) => local,
            _ => {
                // Peer-initiated session: accept it with default windows.
                let Some(local) =
                    (0..=self.neg.channel_max).find(|c| !self.sessions.contains_key(c))
                else {
                    self.send_close(Some(AmqpError::new(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        Some("no free channel".to_string()),
                    )));
                    return;
                };
                let s = Session::new(2048, 2048);
                self.write(
                    local,
                    Begin {
                        remote_channel: Some(ch),
                        next_outgoing_id: s.next_outgoing_id,
                        incoming_window: s.incoming_window,
                        outgoing_window: s.outgoing_window,
                        handle_max: Default::default(),
                        offered_capabilities: None,
                        desired_capabilities: None,
                        properties: None,
                    },
                );
                self.sessions.insert(local, s);
                local
            }
        };
        self.remote_channels.insert(ch, local);
        self.ended_channels.remove(&ch);
        if let Some(s) = self.sessions.get_mut(&local) {
            s.remote_channel = Some(ch);
            s.next_incoming_id = b.next_outgoing_id;
            s.remote_incoming_window = b.incoming_window;
            if let Some(w) = s.begin_waiter.take() {
                let _ = w.send(Ok(local)); // the caller may have given up; End follows on drop
            }
        }
    }

    fn on_end(&mut self, ch: u16, e: End) {
        let Some(local) = self.remote_channels.remove(&ch) else {
            return;
        };
        self.ended_channels.insert(ch);
        let Some(mut s) = self.sessions.remove(&local) else {
            return;
        };
        let remote = e.error.map(AmqpError::from);
        if !s.end_sent {
            self.write(local, End { error: None });
        }
        s.fail(&Error::SessionEnded(remote));
    }

    fn on_attach(&mut self, local: u16, a: Attach) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let remote_handle = a.handle.0;
        let ours = s
            .links
            .iter()
            .find(|(_, l)| l.name == a.name && l.remote_handle.is_none() && l.role != a.role)
            .map(|(h, _)| *h);
        if let Some(h) = ours {
            s.by_remote.insert(remote_handle, h);
            let Some(l) = s.links.get_mut(&h) else {
                return;
            };
            l.remote_handle = Some(remote_handle);
            l.max_message_size = a.max_message_size.unwrap_or(0);
            let refused = match l.role {
                Role::Sender => a.target.is_none(),
                Role::Receiver => {
                    l.delivery_count = a.initial_delivery_count.unwrap_or(0);
                    a.source.is_none()
                }
            };
            if refused {
                // A detach with the reason follows; answer the attach then.
                l.refused = Some(Box::new(a));
            } else if let Some(w) = l.attach_waiter.take() {
                let _ = w.send(Ok((h, Box::new(a)))); // dropped caller: handle detaches itself
            }
            return;
        }
        // Peer-initiated link.
        match self.events.as_ref().zip(self.cmd_weak.upgrade()) {
            Some((events, cmd)) => {
                s.pending_remote.insert(
                    remote_handle,
                    PendingRemote {
                        flow: None,
                        initial_delivery_count: a.initial_delivery_count,
                        max_message_size: a.max_message_size,
                    },
                );
                let ctx = crate::client::ConnCtx {
                    cmd,
                    terminal: self.terminal.subscribe(),
                };
                let conn = self.self_ref.get().and_then(std::sync::Weak::upgrade);
                let req = LinkRequest::new(ctx, conn, local, a);
                if events.send(ConnectionEvent::Link(req)).is_err() {
                    tracing::debug!("Link request dropped: nobody listens for events.");
                }
            }
            None => {
                // Client role: refuse links the peer opens.
                let h = s.free_handle();
                let mut reply = a.clone();
                reply.handle = Handle(h);
                reply.role = match a.role {
                    Role::Sender => Role::Receiver,
                    Role::Receiver => Role::Sender,
                };
                reply.source = None;
                reply.target = None;
                reply.initial_delivery_count = Some(0);
                self.write(local, reply);
                self.write(
                    local,
                    Detach {
                        handle: Handle(h),
                        closed: true,
                        error: Some(
                            AmqpError::new(
                                condition::NOT_IMPLEMENTED,
                                Some("this endpoint accepts no links".to_string()),
                            )
                            .into(),
                        ),
                    },
                );
            }
        }
    }

    fn on_flow(&mut self, local: u16, f: Flow) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let base = f.next_incoming_id.unwrap_or(s.initial_outgoing_id);
        s.remote_incoming_window =
            wrapping_diff(base.wrapping_add(f.incoming_window), s.next_outgoing_id);
        let mut echo_handle = None;
        if let Some(rh) = f.handle.as_ref().map(|h| h.0) {
            if let Some(p) = s.pending_remote.get_mut(&rh) {
                p.flow = Some(f);
                return;
            }
            let Some(&h) = s.by_remote.get(&rh) else {
                return;
            };
            let Some(l) = s.links.get_mut(&h) else {
                return;
            };
            apply_link_flow(l, &f);
            if f.echo {
                echo_handle = Some(h);
            }
            self.pump(local, h);
            self.maybe_answer_drain(local, h);
        } else if f.echo {
            let fr = s.flow_frame();
            self.write(local, fr);
        }
        if let Some(h) = echo_handle
            && let Some(s) = self.sessions.get(&local)
        {
            let fr = s.link_flow_frame(h);
            self.write(local, fr);
        }
        // The session window may have opened: pump every sender.
        let handles: Vec<u32> = self
            .sessions
            .get(&local)
            .map(|s| {
                s.links
                    .iter()
                    .filter(|(_, l)| l.role == Role::Sender && !l.pending.is_empty())
                    .map(|(h, _)| *h)
                    .collect()
            })
            .unwrap_or_default();
        for h in handles {
            self.pump(local, h);
        }
    }

    fn maybe_answer_drain(&mut self, local: u16, h: u32) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let Some(l) = s.links.get_mut(&h) else {
            return;
        };
        if l.role == Role::Sender && l.drain && l.setup.auto_drain && l.pending.is_empty() {
            l.delivery_count = l.delivery_count.wrapping_add(l.credit);
            l.credit = 0;
            l.publish_flow();
            let fr = s.link_flow_frame(h);
            self.write(local, fr);
        }
    }

    fn on_transfer(&mut self, local: u16, t: Transfer, payload: Bytes) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        s.next_incoming_id = s.next_incoming_id.wrapping_add(1);
        s.incoming_window = s.incoming_window.saturating_sub(1);
        let mut session_flow = None;
        if s.incoming_window < s.max_incoming_window / 2 {
            s.incoming_window = s.max_incoming_window;
            session_flow = Some(s.flow_frame());
        }
        let Some(&h) = s.by_remote.get(&t.handle.0) else {
            tracing::debug!(handle = t.handle.0, "Transfer on unknown handle dropped.");
            if let Some(f) = session_flow {
                self.write(local, f);
            }
            return;
        };
        let Some(l) = s.links.get_mut(&h) else {
            return;
        };
        if l.partial.is_none() {
            l.delivery_count = l.delivery_count.wrapping_add(1);
            l.credit = l.credit.saturating_sub(1);
            l.partial = Some(Partial {
                delivery_id: t.delivery_id.unwrap_or(0),
                tag: t
                    .delivery_tag
                    .as_ref()
                    .map(|b| Bytes::copy_from_slice(b))
                    .unwrap_or_default(),
                format: t.message_format.unwrap_or(0),
                settled: false,
                state: None,
                buf: BytesMut::new(),
                oversize: false,
            });
        }
        let mut complete = None;
        if let Some(p) = l.partial.as_mut() {
            if l.max_incoming > 0 && (p.buf.len() + payload.len()) as u64 > l.max_incoming {
                p.oversize = true;
                p.buf = BytesMut::new();
            }
            if !p.oversize {
                p.buf.extend_from_slice(&payload);
            }
            if t.settled == Some(true) {
                p.settled = true;
            }
            if t.state.is_some() {
                p.state = t.state.clone();
            }
            if t.aborted {
                l.partial = None;
            } else if !t.more {
                complete = l.partial.take();
            }
        }
        let mut flow_out = session_flow;
        let mut oversize_reject = None;
        let max_incoming = l.max_incoming;
        let complete = match complete {
            Some(p) if p.oversize => {
                tracing::debug!(
                    delivery_id = p.delivery_id,
                    limit = l.max_incoming,
                    "Delivery above max-message-size rejected."
                );
                if !p.settled {
                    oversize_reject = Some(p.delivery_id);
                }
                None
            }
            other => other,
        };
        if let Some(p) = complete {
            let d = Delivery {
                delivery_id: p.delivery_id,
                delivery_tag: p.tag,
                message_format: p.format,
                settled: p.settled,
                state: p.state,
                payload: p.buf.freeze(),
            };
            if !d.settled {
                s.unsettled_in.insert(
                    d.delivery_id,
                    InUnsettled {
                        handle: h,
                        waiter: None,
                    },
                );
            }
            let _ = l.setup.events.send(LinkEvent::Delivery(d)); // handle dropped: detach pending
            if let Some(n) = l.setup.auto_credit
                && l.credit <= n / 2
            {
                l.credit = n;
                flow_out = None;
                l.publish_flow();
                let fr = s.link_flow_frame(h);
                self.write(local, fr);
            }
        }
        if let Some(l) = self
            .sessions
            .get_mut(&local)
            .and_then(|s| s.links.get_mut(&h))
        {
            if l.drain && l.credit == 0 {
                l.drain = false;
                if let Some(w) = l.drain_waiter.take() {
                    let _ = w.send(Ok(())); // the caller may have given up
                }
            }
            l.publish_flow();
        }
        if let Some(f) = flow_out {
            self.write(local, f);
        }
        if let Some(id) = oversize_reject {
            self.write(
                local,
                Disposition {
                    role: Role::Receiver,
                    first: id,
                    last: None,
                    settled: true,
                    state: Some(
                        // `info` written (empty): Python's pyamqp reads the error's third
                        // field unconditionally and fails on a two-field error.
                        crate::delivery::Outcome::Rejected(Some(
                            AmqpError::new(
                                condition::MESSAGE_SIZE_EXCEEDED,
                                Some(format!("message larger than {max_incoming} bytes")),
                            )
                            .with_info(Fields::default()),
                        ))
                        .into(),
                    ),
                    batchable: false,
                },
            );
        }
    }

    fn on_disposition(&mut self, local: u16, d: Disposition) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let first = d.first;
        let last = d.last.unwrap_or(first);
        let in_range = |id: u32| {
            wrapping_diff(id, first) <= wrapping_diff(last, first)
                && wrapping_diff(last, id) <= wrapping_diff(last, first)
        };
        let mut out_frames = Vec::new();
        match d.role {
            Role::Receiver => {
                let ids: Vec<u32> = s
                    .unsettled_out
                    .keys()
                    .copied()
                    .filter(|i| in_range(*i))
                    .collect();
                for id in ids {
                    let Some(u) = s.unsettled_out.get_mut(&id) else {
                        continue;
                    };
                    if let Some(w) = u.waiter.take() {
                        if !d.settled {
                            out_frames.push(Disposition {
                                role: Role::Sender,
                                first: id,
                                last: None,
                                settled: true,
                                state: d.state.clone(),
                                batchable: false,
                            });
                        }
                        s.unsettled_out.remove(&id);
                        let _ = w.send(Ok(SendReport {
                            delivery_id: id,
                            state: d.state.clone(),
                        })); // the caller may have given up
                    } else {
                        let ev = IncomingDisposition {
                            delivery_id: id,
                            delivery_tag: u.tag.clone(),
                            state: d.state.clone(),
                            settled: d.settled,
                        };
                        let handle = u.handle;
                        if d.settled {
                            s.unsettled_out.remove(&id);
                        }
                        if let Some(l) = s.links.get(&handle) {
                            let _ = l.setup.events.send(LinkEvent::Disposition(ev)); // handle gone
                        }
                    }
                }
            }
            Role::Sender => {
                if d.settled {
                    let ids: Vec<u32> = s
                        .unsettled_in
                        .keys()
                        .copied()
                        .filter(|i| in_range(*i))
                        .collect();
                    for id in ids {
                        if let Some(Some(w)) = s.unsettled_in.remove(&id).map(|u| u.waiter) {
                            let _ = w.send(Ok(d.state.clone())); // the caller may have given up
                        }
                    }
                }
            }
        }
        for f in out_frames {
            self.write(local, f);
        }
    }

    fn on_detach(&mut self, local: u16, d: Detach) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let rh = d.handle.0;
        let remote = d.error.map(AmqpError::from);
        if s.pending_remote.remove(&rh).is_some() {
            // Peer gave up before the application answered; the answer will fail.
            return;
        }
        let Some(h) = s.by_remote.remove(&rh) else {
            return;
        };
        let Some(mut l) = s.links.remove(&h) else {
            return;
        };
        if !l.detach_sent {
            self.write(
                local,
                Detach {
                    handle: Handle(h),
                    closed: d.closed,
                    error: None,
                },
            );
        }
        let err = if l.refused.is_some() || l.attach_waiter.is_some() {
            Error::AttachRefused(remote.clone())
        } else {
            Error::LinkDetached(remote.clone())
        };
        if let Some(s) = self.sessions.get_mut(&local) {
            let ids: Vec<u32> = s
                .unsettled_out
                .iter()
                .filter(|(_, u)| u.handle == h)
                .map(|(i, _)| *i)
                .collect();
            for id in ids {
                if let Some(Some(w)) = s.unsettled_out.remove(&id).map(|u| u.waiter) {
                    let _ = w.send(Err(err.clone())); // the caller may have given up
                }
            }
            let ids: Vec<u32> = s
                .unsettled_in
                .iter()
                .filter(|(_, u)| u.handle == h)
                .map(|(i, _)| *i)
                .collect();
            for id in ids {
                if let Some(Some(w)) = s.unsettled_in.remove(&id).map(|u| u.waiter) {
                    let _ = w.send(Err(err.clone())); // the caller may have given up
                }
            }
        }
        l.fail(&err);
    }

    fn pump(&mut self, local: u16, h: u32) {
        let max_frame = self.neg.peer_max_frame_size.min(1024 * 1024) as usize;
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let mut frames: Vec<(Transfer, Bytes)> = Vec::new();
        while let Some(l) = s.links.get_mut(&h) {
            let Some(front) = l.pending.front_mut() else {
                break;
            };
            // A send whose caller gave up before it started is dropped, not sent late.
            if front.started.is_none() && front.reply.is_closed() {
                l.pending.pop_front();
                continue;
            }
            if front.started.is_none() && l.credit == 0 {
                break;
            }
            if s.remote_incoming_window == 0 {
                break;
            }
            let first = front.started.is_none();
            if first {
                let id = s.next_delivery_id;
                s.next_delivery_id = id.wrapping_add(1);
                let tag = match &front.send.delivery_tag {
                    Some(t) => t.clone(),
                    None => {
                        l.next_tag += 1;
                        Bytes::copy_from_slice(&l.next_tag.to_be_bytes())
                    }
                };
                front.started = Some((id, tag));
                l.credit -= 1;
                l.delivery_count = l.delivery_count.wrapping_add(1);
            }
            let Some((id, tag)) = front.started.clone() else {
                break;
            };
            let mut t = Transfer {
                handle: Handle(h),
                delivery_id: Some(id),
                delivery_tag: if first {
                    Some(ByteBuf::from(tag.to_vec()))
                } else {
                    None
                },
                message_format: if first {
                    Some(front.send.message_format)
                } else {
                    None
                },
                settled: if first {
                    Some(front.track == Track::Settled)
                } else {
                    None
                },
                more: true,
                rcv_settle_mode: None,
                state: None,
                resume: false,
                aborted: false,
                batchable: false,
            };
            let mut probe = BytesMut::new();
            let overhead = match crate::performative::encode_into(&t, &mut probe) {
                Ok(()) => probe.len() + 8,
                Err(_) => max_frame,
            };
            let room = max_frame.saturating_sub(overhead);
            let total = front.send.payload.len();
            if room == 0 && total > front.offset {
                if let Some(p) = l.pending.pop_front() {
                    let _ = p
                        .reply
                        .send(Err(Error::Encode("max-frame-size too small".into())));
                }
                continue;
            }
            let end = (front.offset + room).min(total);
            let chunk = front.send.payload.slice(front.offset..end);
            front.offset = end;
            t.more = end < total;
            let done = !t.more;
            frames.push((t, chunk));
            s.next_outgoing_id = s.next_outgoing_id.wrapping_add(1);
            s.remote_incoming_window -= 1;
            if done && let Some(p) = l.pending.pop_front() {
                match p.track {
                    Track::Settled => {
                        let _ = p.reply.send(Ok(SendReport {
                            delivery_id: id,
                            state: None,
                        })); // the caller may have given up
                    }
                    Track::Await => {
                        s.unsettled_out.insert(
                            id,
                            OutUnsettled {
                                handle: h,
                                tag,
                                waiter: Some(p.reply),
                            },
                        );
                    }
                    Track::Events => {
                        s.unsettled_out.insert(
                            id,
                            OutUnsettled {
                                handle: h,
                                tag,
                                waiter: None,
                            },
                        );
                        let _ = p.reply.send(Ok(SendReport {
                            delivery_id: id,
                            state: None,
                        })); // the caller may have given up
                    }
                }
            }
        }
        if let Some(l) = s.links.get(&h) {
            l.publish_flow();
        }
        for (t, chunk) in frames {
            if let Err(e) = self.writer.buffer(&Frame {
                channel: local,
                body: FrameBody::Amqp(Box::new(Performative::Transfer(t)), chunk),
            }) {
                tracing::error!(error = %e, "Failed to encode a transfer.");
            }
        }
    }

    fn on_command(&mut self, c: Command) {
        match c {
            Command::Begin {
                incoming_window,
                outgoing_window,
                reply,
            } => {
                if self.close_sent {
                    let _ = reply.send(Err(Error::ConnectionClosed(None))); // caller may be gone
                    return;
                }
                let Some(local) =
                    (0..=self.neg.channel_max).find(|c| !self.sessions.contains_key(c))
                else {
                    let _ = reply.send(Err(Error::IllegalState("no free channel"))); // same
                    return;
                };
                let mut s = Session::new(incoming_window, outgoing_window);
                s.begin_waiter = Some(reply);
                self.write(
                    local,
                    Begin {
                        remote_channel: None,
                        next_outgoing_id: s.next_outgoing_id,
                        incoming_window,
                        outgoing_window,
                        handle_max: Default::default(),
                        offered_capabilities: None,
                        desired_capabilities: None,
                        properties: None,
                    },
                );
                self.sessions.insert(local, s);
            }
            Command::End {
                channel,
                error,
                reply,
            } => {
                let Some(s) = self.sessions.get_mut(&channel) else {
                    if let Some(r) = reply {
                        let _ = r.send(Ok(())); // already ended
                    }
                    return;
                };
                if let Some(r) = reply {
                    s.end_waiters.push(r);
                }
                if !s.end_sent {
                    s.end_sent = true;
                    self.write(
                        channel,
                        End {
                            error: error.map(Into::into),
                        },
                    );
                }
            }
            Command::Attach {
                channel,
                mut attach,
                setup,
                reply,
            } => {
                let Some(s) = self.sessions.get_mut(&channel) else {
                    let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
                    return;
                };
                if s.end_sent {
                    let _ = reply.send(Err(Error::SessionEnded(None))); // same
                    return;
                }
                let h = s.free_handle();
                attach.handle = Handle(h);
                let link = new_link(&attach, setup, Some(reply));
                s.links.insert(h, link);
                self.write(channel, *attach);
            }
            Command::AnswerAttach {
                channel,
                remote_handle,
                mut attach,
                setup,
                reject,
                reply,
            } => {
                let Some(s) = self.sessions.get_mut(&channel) else {
                    let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
                    return;
                };
                let Some(pending) = s.pending_remote.remove(&remote_handle) else {
                    let _ = reply.send(Err(Error::LinkDetached(None))); // same
                    return;
                };
                let h = s.free_handle();
                attach.handle = Handle(h);
                match (reject, setup) {
                    (None, Some(setup)) => {
                        let mut link = new_link(&attach, setup, None);
                        link.remote_handle = Some(remote_handle);
                        link.max_message_size = pending.max_message_size.unwrap_or(0);
                        if link.role == Role::Receiver {
                            link.delivery_count = pending.initial_delivery_count.unwrap_or(0);
                        }
                        s.by_remote.insert(remote_handle, h);
                        s.links.insert(h, link);
                        self.write(channel, *attach);
                        if let Some(s) = self.sessions.get_mut(&channel)
                            && let Some(l) = s.links.get_mut(&h)
                        {
                            if let Some(f) = pending.flow {
                                apply_link_flow(l, &f);
                            }
                            if l.role == Role::Receiver
                                && let Some(n) = l.setup.auto_credit
                            {
                                l.credit = n;
                                l.publish_flow();
                                let fr = s.link_flow_frame(h);
                                self.write(channel, fr);
                            }
                        }
                        self.pump(channel, h);
                        self.maybe_answer_drain(channel, h);
                        let _ = reply.send(Ok(h)); // caller gone: its handle drop detaches
                    }
                    (err, _) => {
                        if attach.role == Role::Sender {
                            attach.source = None;
                        } else {
                            attach.target = None;
                        }
                        self.write(channel, *attach);
                        self.write(
                            channel,
                            Detach {
                                handle: Handle(h),
                                closed: true,
                                error: err.map(Into::into),
                            },
                        );
                        // The handle number stays in use until the peer's detach arrives; we
                        // do not track it, so a peer that never answers only leaks a number.
                        let _ = reply.send(Ok(h)); // caller may be gone
                    }
                }
            }
            Command::Detach {
                channel,
                handle,
                name,
                error,
                reply,
            } => {
                let Some(l) = self
                    .sessions
                    .get_mut(&channel)
                    .and_then(|s| s.links.get_mut(&handle))
                    .filter(|l| l.name == name)
                else {
                    if let Some(r) = reply {
                        let _ = r.send(Ok(())); // already gone
                    }
                    return;
                };
                if let Some(r) = reply {
                    l.detach_waiters.push(r);
                }
                if !l.detach_sent {
                    l.detach_sent = true;
                    self.write(
                        channel,
                        Detach {
                            handle: Handle(handle),
                            closed: true,
                            error: error.map(Into::into),
                        },
                    );
                }
            }
            Command::Send {
                channel,
                handle,
                send,
                track,
                reply,
            } => {
                let Some(l) = self
                    .sessions
                    .get_mut(&channel)
                    .and_then(|s| s.links.get_mut(&handle))
                else {
                    let _ = reply.send(Err(Error::LinkDetached(None))); // caller may be gone
                    return;
                };
                if l.role != Role::Sender || l.detach_sent {
                    let _ = reply.send(Err(Error::IllegalState("link is not an attached sender"))); // same
                    return;
                }
                if l.max_message_size > 0 && send.payload.len() as u64 > l.max_message_size {
                    let _ = reply.send(Err(Error::Rejected(Some(AmqpError::new(
                        condition::MESSAGE_SIZE_EXCEEDED,
                        Some(format!("peer accepts at most {} bytes", l.max_message_size)),
                    ))))); // same
                    return;
                }
                l.pending.push_back(PendingSend {
                    send,
                    track,
                    reply,
                    started: None,
                    offset: 0,
                });
                self.pump(channel, handle);
            }
            Command::Credit {
                channel,
                handle,
                op,
                drain,
                reply,
            } => {
                let Some(s) = self.sessions.get_mut(&channel) else {
                    let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
                    return;
                };
                let Some(l) = s.links.get_mut(&handle) else {
                    let _ = reply.send(Err(Error::LinkDetached(None))); // same
                    return;
                };
                if l.role != Role::Receiver {
                    let _ = reply.send(Err(Error::IllegalState("link is not a receiver"))); // same
                    return;
                }
                match op {
                    CreditOp::Set(n) => l.credit = n,
                    CreditOp::Add(n) => l.credit = l.credit.saturating_add(n),
                }
                l.drain = drain;
                if drain && l.credit > 0 {
                    l.drain_waiter = Some(reply);
                } else {
                    l.drain = false;
                    let _ = reply.send(Ok(())); // same
                }
                l.publish_flow();
                let fr = s.link_flow_frame(handle);
                self.write(channel, fr);
            }
            Command::AnswerDrain { channel, handle } => {
                if let Some(l) = self
                    .sessions
                    .get_mut(&channel)
                    .and_then(|s| s.links.get_mut(&handle))
                {
                    l.drain = true;
                    let auto = l.setup.auto_drain;
                    l.setup.auto_drain = true;
                    self.maybe_answer_drain(channel, handle);
                    if let Some(l) = self
                        .sessions
                        .get_mut(&channel)
                        .and_then(|s| s.links.get_mut(&handle))
                    {
                        l.setup.auto_drain = auto;
                    }
                }
            }
            Command::Dispose {
                channel,
                role,
                delivery_id,
                settled,
                state,
                reply,
            } => {
                let Some(s) = self.sessions.get_mut(&channel) else {
                    let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
                    return;
                };
                match role {
                    Role::Receiver => {
                        let Some(u) = s.unsettled_in.get_mut(&delivery_id) else {
                            let _ =
                                reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                            return;
                        };
                        if settled {
                            s.unsettled_in.remove(&delivery_id);
                            let _ = reply.send(Ok(None)); // same
                        } else {
                            u.waiter = Some(reply);
                        }
                    }
                    Role::Sender => {
                        if s.unsettled_out.remove(&delivery_id).is_none() {
                            let _ =
                                reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                            return;
                        }
                        let _ = reply.send(Ok(None)); // same
                    }
                }
                self.write(
                    channel,
                    Disposition {
                        role,
                        first: delivery_id,
                        last: None,
                        settled,
                        state,
                        batchable: false,
                    },
                );
            }
            Command::Unsettled { channel, reply } => {
                let count = self
                    .sessions
                    .get(&channel)
                    .map_or(0, |s| s.unsettled_in.len());
                let _ = reply.send(Ok(count)); // the caller may have given up
            }
            Command::Close { error, reply } => {
                if let Some(r) = reply {
                    self.close_waiters.push(r);
                }
                self.send_close(error);
            }
        }
    }
}

fn apply_link_flow(l: &mut Link, f: &Flow) {
    match l.role {
        Role::Sender => {
            let rdc = f.delivery_count.unwrap_or(l.delivery_count);
            let credit = f.link_credit.unwrap_or(0);
            l.credit = wrapping_diff(rdc.wrapping_add(credit), l.delivery_count);
            l.drain = f.drain;
        }
        Role::Receiver => {
            if let Some(dc) = f.delivery_count {
                let limit = l.delivery_count.wrapping_add(l.credit);
                l.credit = wrapping_diff(limit, dc);
                l.delivery_count = dc;
            }
            // Lenient: RabbitMQ 3.10 answers a drain with `link-credit = 0` without advancing
            // `delivery-count`; the sender's word on its remaining credit wins.
            if f.drain && f.link_credit == Some(0) {
                l.credit = 0;
            }
            l.available = f.available.unwrap_or(0);
            if l.drain && l.credit == 0 {
                l.drain = false;
                if let Some(w) = l.drain_waiter.take() {
                    let _ = w.send(Ok(())); // the caller may have given up
                }
            }
        }
    }
    l.publish_flow();
}

fn new_link(a: &Attach, setup: LinkSetup, waiter: Option<Reply<(u32, Box<Attach>)>>) -> Link {
    Link {
        name: a.name.clone(),
        role: a.role.clone(),
        remote_handle: None,
        max_message_size: 0,
        max_incoming: a.max_message_size.unwrap_or(0),
        delivery_count: a.initial_delivery_count.unwrap_or(0),
        credit: 0,
        drain: false,
        available: 0,
        next_tag: 0,
        pending: VecDeque::new(),
        partial: None,
        setup,
        attach_waiter: waiter,
        refused: None,
        detach_sent: false,
        detach_waiters: Vec::new(),
        drain_waiter: None,
    }
}
