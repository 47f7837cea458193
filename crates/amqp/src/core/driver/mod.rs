//! The connection driver: one task per connection owns every session and link state machine
//! and the write half of the socket. Handles talk to it through [`Command`]s; a separate reader
//! task parses frames so that a large write never waits on our own reads.
//!
//! # Layout
//! - this file: the task, its loop (frames, commands, timers), writing and closing.
//! - `session_state`, `link_state`: what the driver keeps per session and per link.
//! - `channels`: frame dispatch and the session lifecycle (`begin`, `end`).
//! - `attach`: link lifecycle (`attach`, `detach`) from either side.
//! - `flow`: credit, windows and drain.
//! - `transfer`: incoming deliveries and the outgoing pump.
//! - `budget`: the connection-wide bound on bytes held in unfinished incoming deliveries.
//! - `disposition`: settlement both ways; the dispositions handles queue in one turn leave as
//!   ranges of contiguous delivery ids.
//! - `commands`: dispatch of handle commands to the modules above.

mod attach;
mod budget;
mod channels;
mod commands;
mod disposition;
mod flow;
mod link_state;
mod session_state;
mod transfer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::command::ConnInner;
use super::command::{Command, ConnCtx, DeliveryDisposition, Reply, Stats};
use super::framed_io::{FrameReader, FrameWriter};
use super::link::PeerAttach;
use crate::error::{AmqpError, Error, Result, condition};
use crate::frame::Frame;
use crate::performative::{Close, Performative};
use session_state::Session;

/// Connection-level parameters negotiated by `open`.
#[derive(Debug, Clone)]
pub(crate) struct Negotiated {
    pub(crate) peer_max_frame_size: u32,
    pub(crate) channel_max: u16,
    pub(crate) local_idle: Option<Duration>,
    pub(crate) remote_idle: Option<Duration>,
    /// Bytes all unfinished incoming deliveries may hold together (`0`: unbounded); not
    /// negotiated, our own limit.
    pub(crate) max_unfinished_bytes: u64,
}

/// The connection handle, for peer links to keep it alive (weak: the driver must not).
pub(crate) type SelfRef = Arc<std::sync::OnceLock<std::sync::Weak<ConnInner>>>;

pub(crate) struct Driver {
    cmd_rx: mpsc::UnboundedReceiver<Command>,
    cmd_weak: mpsc::WeakUnboundedSender<Command>,
    terminal: watch::Sender<Option<Error>>,
    frames: mpsc::Receiver<Result<Option<Frame>>>,
    writer: FrameWriter,
    neg: Negotiated,
    // Ordered: sessions fail in channel order when the connection ends (a seeded run replays).
    sessions: BTreeMap<u16, Session>,
    remote_channels: BTreeMap<u16, u16>,
    /// Remote channels whose session has ended and that no `begin` reused yet: a frame that
    /// crossed our `end` on the wire (the legal end/begin race) is dropped, not fatal.
    ended_channels: BTreeSet<u16>,
    /// Where peer-initiated links go (server role); `None` refuses them (client role).
    peer_links: Option<mpsc::UnboundedSender<PeerAttach>>,
    self_ref: SelfRef,
    stats: Arc<Stats>,
    last_recv: Instant,
    last_sent: Instant,
    close_sent: bool,
    close_deadline: Option<Instant>,
    close_waiters: Vec<Reply<()>>,
    /// Dispositions handles asked for in this turn, written as ranges before anything else.
    queued_dispositions: Vec<DeliveryDisposition>,
    finished: Option<Error>,
    /// What unfinished incoming deliveries hold, across every session and link.
    budget: budget::Budget,
}

/// How long we wait for the peer's `close` after sending ours.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How many queued commands one turn of the loop takes before it flushes.
const COMMAND_BATCH: usize = 64;

/// How many frames the reader queued one turn of the loop takes (after the one it woke for)
/// before it flushes: the reader's whole queue.
const FRAME_BATCH: usize = READ_QUEUE;

/// Frames the reader task may parse ahead of the driver.
const READ_QUEUE: usize = 64;

/// Starts the reader and driver tasks.
pub(crate) fn spawn(
    reader: FrameReader,
    writer: FrameWriter,
    neg: Negotiated,
    peer_links: Option<mpsc::UnboundedSender<PeerAttach>>,
    self_ref: SelfRef,
    span: tracing::Span,
) -> (ConnCtx, Arc<Stats>) {
    use tracing::Instrument;
    let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
    let (terminal, terminal_rx) = watch::channel(None);
    let (ftx, frx) = mpsc::channel(READ_QUEUE);
    let stats = Arc::new(Stats::default());
    let reader_task = tokio::spawn(read_loop(reader, ftx).instrument(span.clone()));
    let ctx = ConnCtx {
        cmd: cmd_tx.clone(),
        terminal: terminal_rx,
    };
    let budget = budget::Budget::new(neg.max_unfinished_bytes);
    let driver = Driver {
        cmd_rx,
        cmd_weak: cmd_tx.downgrade(),
        terminal,
        frames: frx,
        writer,
        neg,
        sessions: BTreeMap::new(),
        remote_channels: BTreeMap::new(),
        ended_channels: BTreeSet::new(),
        peer_links,
        self_ref,
        stats: stats.clone(),
        last_recv: Instant::now(),
        last_sent: Instant::now(),
        close_sent: false,
        close_deadline: None,
        close_waiters: Vec::new(),
        queued_dispositions: Vec::new(),
        finished: None,
        budget,
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

/// Serial-number arithmetic: `a - b`, never negative (e.g. credit left).
fn wrapping_diff(a: u32, b: u32) -> u32 {
    let d = a.wrapping_sub(b);
    if d > u32::MAX / 2 { 0 } else { d }
}

impl Driver {
    async fn run(mut self) {
        let err = self.run_inner().await;
        tracing::debug!(error = %err, "Connection driver stopped.");
        self.flush_dispositions();
        let _ = self.writer.flush().await; // best effort: the socket may be gone
        self.writer.shutdown().await;
        self.terminal.send_replace(Some(err.clone()));
        for (_, mut s) in std::mem::take(&mut self.sessions) {
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

    /// The loop: frames first, then commands, then timers; flushes once per turn. Returns why
    /// the connection ended.
    async fn run_inner(&mut self) -> Error {
        let mut cmds_open = true;
        loop {
            let deadline = self.next_deadline();
            let stop = tokio::select! {
                biased;
                f = self.frames.recv() => self.on_reads(f, cmds_open),
                c = self.cmd_rx.recv(), if cmds_open => {
                    match c {
                        Some(c) => self.on_commands(c),
                        None => {
                            cmds_open = false;
                            self.send_close(None);
                        }
                    }
                    None
                }
                _ = tokio::time::sleep_until(deadline) => self.on_timer(),
            };
            if let Some(e) = stop {
                return e;
            }
            if cmds_open && self.finished.is_none() && self.has_output() {
                // Tasks woken together with this one (settlements whose commits ended in one
                // poll of the I/O driver) queue their commands first and leave in this write,
                // not in one write each (issue 42: a write per disposition).
                tokio::task::yield_now().await;
                self.drain_commands();
            }
            self.flush_dispositions();
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

    /// Something waits to be written.
    fn has_output(&self) -> bool {
        self.writer.pending() > 0 || !self.queued_dispositions.is_empty()
    }

    /// One result of the reader task; `Some` ends the connection.
    fn on_read(&mut self, f: Option<Result<Option<Frame>>>) -> Option<Error> {
        self.last_recv = Instant::now();
        match f {
            Some(Ok(Some(frame))) => {
                let e = self.on_frame(frame).err()?;
                tracing::warn!(error = %e, "Protocol error from peer; closing.");
                let cond = match &e {
                    Error::Decode(_) => condition::DECODE_ERROR,
                    _ => condition::FRAMING_ERROR,
                };
                self.send_close(Some(AmqpError::new(cond, Some(e.to_string()))));
                Some(e)
            }
            Some(Ok(None)) | None => Some(self.finished.take().unwrap_or(Error::ConnectionLost)),
            Some(Err(e)) => {
                let cond = match &e {
                    Error::Decode(_) => Some(condition::DECODE_ERROR),
                    Error::Protocol(_) => Some(condition::FRAMING_ERROR),
                    _ => None,
                };
                if let Some(c) = cond {
                    self.send_close(Some(AmqpError::new(c, Some(e.to_string()))));
                }
                Some(self.finished.take().unwrap_or(e))
            }
        }
    }

    /// Runs `first` and what else is already queued, so one flush covers many frames (and
    /// settlements asked for together leave in one disposition).
    fn on_commands(&mut self, first: Command) {
        self.on_command(first);
        self.drain_commands();
    }

    /// Runs the commands already queued, at most [`COMMAND_BATCH`]; a closed queue is left for
    /// the loop's `recv` to notice.
    fn drain_commands(&mut self) {
        for _ in 0..COMMAND_BATCH {
            match self.cmd_rx.try_recv() {
                Ok(c) => self.on_command(c),
                Err(_) => break,
            }
        }
    }

    /// Takes `first` and the frames the reader has already queued behind it, then the commands
    /// queued meanwhile, so that what they all answer (dispositions, flows, transfers) leaves in
    /// one write: a frame per turn cost a write syscall per frame (issue 42, the worker's CPU).
    /// `Some` ends the connection.
    fn on_reads(&mut self, first: Option<Result<Option<Frame>>>, cmds_open: bool) -> Option<Error> {
        if let Some(e) = self.on_read(first) {
            return Some(e);
        }
        for _ in 0..FRAME_BATCH {
            // A frame that ended the connection (the peer's `close`) is the turn's last.
            if self.finished.is_some() {
                return None;
            }
            match self.frames.try_recv() {
                Ok(f) => {
                    if let Some(e) = self.on_read(Some(f)) {
                        return Some(e);
                    }
                }
                // Empty, or the reader is gone: the next turn's `recv` sees the end.
                Err(_) => break,
            }
        }
        if cmds_open {
            self.drain_commands();
        }
        None
    }

    /// A deadline passed: the close timeout, our idle timeout, or time for a heartbeat.
    fn on_timer(&mut self) -> Option<Error> {
        let now = Instant::now();
        if self.close_deadline.is_some_and(|d| now >= d) {
            tracing::warn!("Peer did not answer our close; dropping the connection.");
            return Some(Error::ConnectionClosed(None));
        }
        if let Some(d) = self.neg.local_idle
            && now >= self.last_recv + d
        {
            tracing::warn!(idle_ms = d.as_millis() as u64, "Peer went silent; closing.");
            self.send_close(Some(AmqpError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                Some("local-idle-timeout expired".to_string()),
            )));
            return Some(Error::IdleTimeout);
        }
        if let Some(d) = self.neg.remote_idle
            && now >= self.last_sent + d / 2
            && self.writer.pending() == 0
        {
            let _ = self.writer.buffer(&Frame::heartbeat()); // cannot fail: no body
            self.stats.heartbeats_sent.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    /// Buffers a frame, after the dispositions queued before it.
    fn write(&mut self, channel: u16, p: impl Into<Performative>) {
        self.flush_dispositions();
        self.write_now(channel, p);
    }

    fn write_now(&mut self, channel: u16, p: impl Into<Performative>) {
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
}
