//! The simulated network: every connection is a pair of in-memory byte streams joined by two
//! delay lines (one per direction) whose per-chunk delays come from the seed. The network can
//! cut every live connection (both ends read EOF, as after a reset), or hold every byte in
//! flight until a partition heals (a half-open path: nothing arrives, nothing fails).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};
use sb_amqp::BoxIo;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How much one end buffers (a TCP window's analogue).
const WINDOW: usize = 64 * 1024;

/// The simulated network shared by every host of one run.
#[derive(Debug, Clone)]
pub struct Net {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    rng: SmallRng,
    /// One-way delay of a chunk: uniform in `[min, max]` microseconds.
    delay_us: (u64, u64),
    /// Nothing is delivered before this instant (a partition being healed).
    held_until: Option<Instant>,
    /// Each live connection's owner (the salt of the client that opened it) and its cut.
    live: Vec<(u64, CancellationToken)>,
    opened: u64,
    cut: u64,
}

impl Net {
    /// A network whose delays are drawn from `seed`.
    pub fn new(seed: u64) -> Self {
        Net {
            state: Arc::new(Mutex::new(State {
                rng: SmallRng::seed_from_u64(seed),
                delay_us: (200, 2_000),
                held_until: None,
                live: Vec::new(),
                opened: 0,
                cut: 0,
            })),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A new connection opened by `owner` (a client's salt): the client's end and the
    /// server's end.
    pub fn connect(&self, owner: u64) -> (BoxIo, BoxIo) {
        let (client, client_far) = tokio::io::duplex(WINDOW);
        let (server, server_far) = tokio::io::duplex(WINDOW);
        let cut = CancellationToken::new();
        // Each direction draws its delays from a generator of its own, so that the order in
        // which connections happen to read does not shift another connection's delays.
        let (up, down) = {
            let mut state = self.state();
            state.live.retain(|(_, t)| !t.is_cancelled());
            state.live.push((owner, cut.clone()));
            state.opened += 1;
            (state.rng.random::<u64>(), state.rng.random::<u64>())
        };
        let (client_read, client_write) = tokio::io::split(client_far);
        let (server_read, server_write) = tokio::io::split(server_far);
        self.line(client_read, server_write, cut.clone(), up);
        self.line(server_read, client_write, cut, down);
        (Box::new(client), Box::new(server))
    }

    /// One direction: chunks read from `from` arrive at `to` after their delay, in order.
    fn line(
        &self,
        mut from: ReadHalf<DuplexStream>,
        mut to: WriteHalf<DuplexStream>,
        cut: CancellationToken,
        seed: u64,
    ) {
        let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
        let net = self.clone();
        let reading = cut.clone();
        tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut last = Instant::now();
            let mut buf = vec![0u8; WINDOW];
            loop {
                let n = tokio::select! {
                    biased;
                    () = reading.cancelled() => return,
                    n = from.read(&mut buf) => n.unwrap_or(0),
                };
                if n == 0 {
                    return;
                }
                // In order, as TCP: never before the chunk ahead of it.
                last = last.max(Instant::now() + net.draw_delay(&mut rng));
                if tx.send((last, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        });
        let net = self.clone();
        tokio::spawn(async move {
            while let Some((at, chunk)) = tokio::select! {
                biased;
                () = cut.cancelled() => None,
                next = rx.recv() => next,
            } {
                loop {
                    let due = net.held_until().map_or(at, |h| h.max(at));
                    if due <= Instant::now() {
                        break;
                    }
                    tokio::select! {
                        biased;
                        () = cut.cancelled() => return,
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                if to.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            if !cut.is_cancelled() {
                let _ = to.shutdown().await;
            }
        });
    }

    fn draw_delay(&self, rng: &mut SmallRng) -> Duration {
        let (min, max) = self.state().delay_us;
        Duration::from_micros(rng.random_range(min..=max))
    }

    fn held_until(&self) -> Option<Instant> {
        self.state().held_until.filter(|h| *h > Instant::now())
    }

    /// Sets the one-way delay range.
    pub fn set_delay(&self, min: Duration, max: Duration) {
        let min = u64::try_from(min.as_micros()).unwrap_or(u64::MAX);
        let max = u64::try_from(max.as_micros()).unwrap_or(u64::MAX).max(min);
        self.state().delay_us = (min, max);
    }

    /// Holds every byte in flight or sent from now until `duration` has passed.
    pub fn partition(&self, duration: Duration) {
        let until = Instant::now() + duration;
        let mut state = self.state();
        state.held_until = Some(state.held_until.map_or(until, |h| h.max(until)));
    }

    /// Cuts every live connection: both ends read EOF and writes fail. Returns how many.
    pub fn cut_all(&self) -> usize {
        let mut state = self.state();
        let live: Vec<_> = state
            .live
            .drain(..)
            .filter(|(_, t)| !t.is_cancelled())
            .collect();
        for (_, token) in &live {
            token.cancel();
        }
        state.cut += live.len() as u64;
        live.len()
    }

    /// Cuts one live connection chosen by the seed; false when none is live.
    pub fn cut_one(&self) -> bool {
        let mut state = self.state();
        state.live.retain(|(_, t)| !t.is_cancelled());
        if state.live.is_empty() {
            return false;
        }
        let live = state.live.len();
        let i = state.rng.random_range(0..live);
        let (_, token) = state.live.remove(i);
        token.cancel();
        state.cut += 1;
        true
    }

    /// Cuts every live connection `owner` opened (its process died: the kernel closes its
    /// sockets). Returns how many.
    pub fn cut_owner(&self, owner: u64) -> usize {
        let mut state = self.state();
        let (theirs, others): (Vec<_>, Vec<_>) = state
            .live
            .drain(..)
            .filter(|(_, t)| !t.is_cancelled())
            .partition(|(o, _)| *o == owner);
        state.live = others;
        for (_, token) in &theirs {
            token.cancel();
        }
        state.cut += theirs.len() as u64;
        theirs.len()
    }

    /// Connections opened and cut so far.
    pub fn counts(&self) -> (u64, u64) {
        let state = self.state();
        (state.opened, state.cut)
    }
}
