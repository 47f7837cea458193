//! Model-based test of link and session identity (issue 39, F1/F2): random sequences of
//! attach, detach (either side), end (either side), begin, send, credit and settle across
//! several links and two sessions, run on the real engine (client and server in one process
//! over an in-memory stream) and checked against a small reference model:
//! - every transfer arrives on the link it was addressed to, or the send is refused;
//! - every disposition reaches the delivery it was meant for, or is refused;
//! - credit lands on its own link, or is refused;
//! - an ended session's handle attaches nothing.
//!
//! Handles outlive their links on purpose: the engine reuses the lowest free handle number
//! and channel, so a stale handle's command would otherwise act on whatever took its number.
//!
//! `SB_AMQP_MODEL_SEQUENCES` sets how many sequences run (default 10 000); `SB_AMQP_MODEL_SEED`
//! runs the one sequence of that seed (to replay a failure).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use sb_amqp::{
    AmqpError, Connection, ConnectionEvent, ConnectionOptions, Error, LinkAnswer, Outcome,
    Receiver, ReceiverOptions, SaslClient, Sendable, Sender, SenderOptions, ServerConnection,
    ServerOptions, Session, Settler, condition, serve_io,
};

const DEFAULT_SEQUENCES: u64 = 10_000;
/// Operations that act, per sequence: short sequences, many of them.
const OPS: usize = 12;
/// Longest a single operation may take in virtual time (the clock is paused, so a hung
/// operation is reported at once, not after a wall-clock wait).
const OP_LIMIT: Duration = Duration::from_secs(600);

/// xorshift64*: tiny, seeded, the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One link the client attached, with both ends' handles (kept after the link is gone).
struct ModelLink {
    name: String,
    slot: usize,
    attached: bool,
    /// Client-to-server links: the client's sender, the server's receiver.
    sender: Option<Sender>,
    server_rx: Option<Receiver>,
    /// Server-to-client links: the client's receiver (and its settler), the server's sender.
    receiver: Option<Receiver>,
    settler: Option<Settler>,
    server_tx: Option<Sender>,
    /// What the model expects next on this link: bodies on the server's receiver, tags on the
    /// client's receiver, settled tags on the server's sender.
    to_server: VecDeque<Bytes>,
    to_client: VecDeque<Bytes>,
    settled: Vec<Bytes>,
    /// Credit the client granted that the server has not used.
    credit: u32,
}

impl ModelLink {
    fn new(name: String, slot: usize) -> Self {
        Self {
            name,
            slot,
            attached: true,
            sender: None,
            server_rx: None,
            receiver: None,
            settler: None,
            server_tx: None,
            to_server: VecDeque::new(),
            to_client: VecDeque::new(),
            settled: Vec::new(),
            credit: 0,
        }
    }
}

/// A delivery the client received and has not settled.
struct Held {
    link: usize,
    delivery_id: u32,
    tag: Bytes,
}

#[derive(Default)]
struct Slot {
    session: Option<Session>,
    /// The server's channel for this session, known once a link was attached on it.
    server_channel: Option<u16>,
}

struct World {
    client: Connection,
    server: ServerConnection,
    _control: Session,
    probe: Receiver,
    _probe_server: Sender,
    slots: [Slot; 2],
    stale_sessions: Vec<Session>,
    links: Vec<ModelLink>,
    held: Vec<Held>,
    next_id: u64,
    rng: Rng,
    log: Vec<String>,
    /// The last operation wrote something the peer answers with nothing: the check first
    /// makes a round trip. (Begin, end, attach and detach wait for the peer's answer.)
    unanswered: bool,
}

type Check = std::result::Result<(), String>;

fn fail<T>(what: impl Into<String>) -> std::result::Result<T, String> {
    Err(what.into())
}

fn refused(e: &Error) -> bool {
    matches!(e, Error::LinkDetached(_) | Error::SessionEnded(_))
}

impl World {
    async fn new(seed: u64) -> World {
        let (a, b) = tokio::io::duplex(1 << 16);
        let opts = ConnectionOptions {
            sasl: Some(SaslClient::None),
            ..Default::default()
        };
        let server_opts = Arc::new(ServerOptions::default());
        let (server, client) = tokio::join!(
            serve_io(Box::new(b), server_opts),
            Connection::open_io(Box::new(a), opts)
        );
        let (mut server, client) = (server.unwrap(), client.unwrap());
        // A session the model never touches: its drain round trip orders the checks after
        // everything either side wrote before.
        let control = client.begin().await.unwrap();
        let (probe, probe_server) = tokio::join!(
            control.attach_receiver(ReceiverOptions::new("probe", "probe")),
            async {
                let Some(ConnectionEvent::Link(req)) = server.next_event().await else {
                    panic!("no probe link");
                };
                req.accept_sender(LinkAnswer::default()).await.unwrap()
            }
        );
        World {
            client,
            server,
            _control: control,
            probe: probe.unwrap(),
            _probe_server: probe_server,
            slots: Default::default(),
            stale_sessions: Vec::new(),
            links: Vec::new(),
            held: Vec::new(),
            next_id: 0,
            rng: Rng::new(seed),
            log: Vec::new(),
            unanswered: false,
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Every link the model holds attached on `slot` is gone (its session ended).
    fn end_slot(&mut self, slot: usize) {
        for l in self.links.iter_mut().filter(|l| l.slot == slot) {
            l.attached = false;
        }
        self.slots[slot].server_channel = None;
        if let Some(s) = self.slots[slot].session.take() {
            self.stale_sessions.push(s);
        }
    }

    async fn step(&mut self) -> Check {
        let op = self.rng.below(12);
        self.unanswered |= (6..=10).contains(&op);
        match op {
            0 => self.begin().await,
            1 => self.end(true).await,
            2 => self.end(false).await,
            3 | 4 => self.attach().await,
            5 => self.detach().await,
            6 => self.send().await,
            7 => self.credit().await,
            8 | 9 => self.server_send().await,
            10 => self.settle().await,
            _ => self.stale_attach().await,
        }
    }

    async fn begin(&mut self) -> Check {
        let Some(slot) = (0..2).find(|s| self.slots[*s].session.is_none()) else {
            return Ok(());
        };
        let s = self
            .client
            .begin()
            .await
            .map_err(|e| format!("begin: {e}"))?;
        self.log
            .push(format!("begin slot {slot} on channel {}", s.channel()));
        self.slots[slot].session = Some(s);
        Ok(())
    }

    /// Ends a session from the client's side or the server's.
    async fn end(&mut self, by_client: bool) -> Check {
        let slot = self.rng.below(2);
        let Some(session) = self.slots[slot].session.clone() else {
            return Ok(());
        };
        if by_client {
            self.log.push(format!("client ends slot {slot}"));
            session.end().await.map_err(|e| format!("end: {e}"))?;
        } else {
            let Some(ch) = self.slots[slot].server_channel else {
                return Ok(());
            };
            self.log.push(format!("server ends slot {slot}"));
            let error = AmqpError::new(condition::INTERNAL_ERROR, None);
            self.server
                .connection()
                .end_session(ch, Some(error))
                .await
                .map_err(|e| format!("server end: {e}"))?;
        }
        self.end_slot(slot);
        Ok(())
    }

    async fn attach(&mut self) -> Check {
        let slot = self.rng.below(2);
        let Some(session) = self.slots[slot].session.clone() else {
            return Ok(());
        };
        let outgoing = self.rng.below(2) == 0;
        let name = format!("l{}", self.links.len());
        self.log.push(format!(
            "attach {name} ({}) on slot {slot}",
            if outgoing { "out" } else { "in" }
        ));
        let mut link = ModelLink::new(name.clone(), slot);
        let server = &mut self.server;
        let accept = async {
            let Some(ConnectionEvent::Link(req)) = server.next_event().await else {
                return fail("no link request");
            };
            let ch = req.channel();
            if req.is_peer_sender() {
                let r = req.accept_receiver(LinkAnswer::default().credit(8)).await;
                Ok((ch, Some(r.map_err(|e| e.to_string())?), None))
            } else {
                let s = req.accept_sender(LinkAnswer::default()).await;
                Ok((ch, None, Some(s.map_err(|e| e.to_string())?)))
            }
        };
        if outgoing {
            let (ours, theirs) = tokio::join!(
                session.attach_sender(SenderOptions::new(&name, &name)),
                accept
            );
            link.sender = Some(ours.map_err(|e| format!("attach: {e}"))?);
            let (ch, rx, _) = theirs?;
            link.server_rx = rx;
            self.slots[slot].server_channel = Some(ch);
        } else {
            let (ours, theirs) = tokio::join!(
                session.attach_receiver(ReceiverOptions::new(&name, &name)),
                accept
            );
            let r = ours.map_err(|e| format!("attach: {e}"))?;
            link.settler = Some(r.settler());
            link.receiver = Some(r);
            let (ch, _, tx) = theirs?;
            link.server_tx = tx;
            self.slots[slot].server_channel = Some(ch);
        }
        self.links.push(link);
        Ok(())
    }

    /// Detaches an attached link from the client's side or the server's; the other side's
    /// handles stay (stale) where the model keeps them.
    async fn detach(&mut self) -> Check {
        let attached: Vec<usize> = (0..self.links.len())
            .filter(|i| self.links[*i].attached)
            .collect();
        if attached.is_empty() {
            return Ok(());
        }
        let i = attached[self.rng.below(attached.len())];
        let by_client = self.rng.below(2) == 0;
        let l = &mut self.links[i];
        self.log.push(format!(
            "{} detaches {}",
            if by_client { "client" } else { "server" },
            l.name
        ));
        let forced = || AmqpError::new(condition::DETACH_FORCED, None);
        let r = match (by_client, l.sender.take(), l.receiver.take()) {
            (true, Some(s), _) => s.detach().await,
            (true, _, Some(r)) => r.detach().await,
            (false, s, r) => {
                l.sender = s;
                l.receiver = r;
                match (l.server_rx.take(), l.server_tx.take()) {
                    (Some(rx), _) => rx.detach_with_error(forced()).await,
                    (_, Some(tx)) => tx.detach_with_error(forced()).await,
                    _ => return fail("link without a server end"),
                }
            }
            _ => return fail("link without a client end"),
        };
        r.map_err(|e| format!("detach: {e}"))?;
        l.attached = false;
        Ok(())
    }

    /// Sends on any client sender, attached or not.
    async fn send(&mut self) -> Check {
        let senders: Vec<usize> = (0..self.links.len())
            .filter(|i| self.links[*i].sender.is_some())
            .collect();
        if senders.is_empty() {
            return Ok(());
        }
        let i = senders[self.rng.below(senders.len())];
        let id = self.id();
        let body = Bytes::from(format!("{}#{id}", self.links[i].name));
        let l = &mut self.links[i];
        self.log
            .push(format!("send {body:?} (attached: {})", l.attached));
        let Some(sender) = l.sender.as_ref() else {
            return Ok(());
        };
        match (
            sender.send_settled(Sendable::raw(body.clone())).await,
            l.attached,
        ) {
            (Ok(_), true) => {
                l.to_server.push_back(body);
                Ok(())
            }
            (Err(e), false) if refused(&e) => Ok(()),
            (r, attached) => fail(format!("send on {} (attached: {attached}): {r:?}", l.name)),
        }
    }

    /// Grants credit on any client receiver, attached or not.
    async fn credit(&mut self) -> Check {
        let receivers: Vec<usize> = (0..self.links.len())
            .filter(|i| self.links[*i].receiver.is_some())
            .collect();
        if receivers.is_empty() {
            return Ok(());
        }
        let i = receivers[self.rng.below(receivers.len())];
        let n = 1 + self.rng.below(3) as u32;
        let l = &mut self.links[i];
        self.log.push(format!(
            "credit {n} on {} (attached: {})",
            l.name, l.attached
        ));
        let Some(receiver) = l.receiver.as_ref() else {
            return Ok(());
        };
        match (receiver.add_credit(n).await, l.attached) {
            (Ok(()), true) => {
                l.credit += n;
                Ok(())
            }
            (Err(e), false) if refused(&e) => Ok(()),
            (r, attached) => fail(format!(
                "credit on {} (attached: {attached}): {r:?}",
                l.name
            )),
        }
    }

    /// The server sends, unsettled, on an attached link the client gave credit to.
    async fn server_send(&mut self) -> Check {
        let ready: Vec<usize> = (0..self.links.len())
            .filter(|i| {
                let l = &self.links[*i];
                l.attached && l.server_tx.is_some() && l.credit > 0
            })
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let i = ready[self.rng.below(ready.len())];
        let id = self.id();
        let tag = Bytes::from(format!("{}#{id}", self.links[i].name));
        let l = &mut self.links[i];
        self.log.push(format!("server sends {tag:?}"));
        let Some(tx) = l.server_tx.as_ref() else {
            return Ok(());
        };
        tx.send_no_wait(Sendable::raw(&b"m"[..]).tag(tag.clone()))
            .await
            .map_err(|e| format!("server send on {}: {e}", l.name))?;
        l.credit -= 1;
        l.to_client.push_back(tag);
        Ok(())
    }

    /// Settles a held delivery through its link's settler, attached or not.
    async fn settle(&mut self) -> Check {
        if self.held.is_empty() {
            return Ok(());
        }
        let h = self.held.swap_remove(self.rng.below(self.held.len()));
        let l = &mut self.links[h.link];
        self.log.push(format!(
            "settle {:?} (delivery {}, attached: {})",
            h.tag, h.delivery_id, l.attached
        ));
        let Some(settler) = l.settler.as_ref() else {
            return fail("a held delivery without a settler");
        };
        match (
            settler.settle(h.delivery_id, Outcome::Accepted).await,
            l.attached,
        ) {
            (Ok(_), true) => {
                l.settled.push(h.tag);
                Ok(())
            }
            (Err(e), false) if refused(&e) => Ok(()),
            (r, attached) => fail(format!(
                "settle {:?} on {} (attached: {attached}): {r:?}",
                h.tag, l.name
            )),
        }
    }

    /// An ended session's handle attaches nothing, whatever session took its channel.
    async fn stale_attach(&mut self) -> Check {
        if self.stale_sessions.is_empty() {
            return Ok(());
        }
        let s = &self.stale_sessions[self.rng.below(self.stale_sessions.len())];
        self.log.push(format!(
            "attach on an ended session (channel {})",
            s.channel()
        ));
        match s.attach_sender(SenderOptions::new("stale", "stale")).await {
            Err(Error::SessionEnded(_)) => Ok(()),
            r => fail(format!("attach on an ended session: {r:?}")),
        }
    }

    /// After a round trip (everything either side wrote before has been read), every link's
    /// queues hold exactly what the model expects.
    async fn check(&mut self) -> Check {
        if std::mem::take(&mut self.unanswered) {
            self.probe
                .drain_with(1)
                .await
                .map_err(|e| format!("probe: {e}"))?;
        }
        for i in 0..self.links.len() {
            self.check_link(i)?;
        }
        Ok(())
    }

    fn check_link(&mut self, i: usize) -> Check {
        let l = &mut self.links[i];
        if let Some(rx) = &l.server_rx {
            while let Ok(Some(d)) = rx.try_recv() {
                match l.to_server.pop_front() {
                    Some(b) if b == d.payload => {}
                    other => {
                        return fail(format!(
                            "{} received {:?}, expected {other:?}",
                            l.name, d.payload
                        ));
                    }
                }
            }
        }
        if !l.to_server.is_empty() {
            return fail(format!("{} never received {:?}", l.name, l.to_server));
        }
        if let Some(r) = &l.receiver {
            while let Ok(Some(d)) = r.try_recv() {
                match l.to_client.pop_front() {
                    Some(t) if t == d.delivery_tag => self.held.push(Held {
                        link: i,
                        delivery_id: d.delivery_id,
                        tag: t,
                    }),
                    other => {
                        return fail(format!(
                            "{} received {:?}, expected {other:?}",
                            l.name, d.delivery_tag
                        ));
                    }
                }
            }
        }
        if !l.to_client.is_empty() {
            return fail(format!("{} never received {:?}", l.name, l.to_client));
        }
        if let Some(tx) = &l.server_tx {
            while let Some(Ok(d)) = tx.next_disposition().now_or_never() {
                let Some(at) = l.settled.iter().position(|t| *t == d.delivery_tag) else {
                    return fail(format!(
                        "{} got a disposition for {:?}, which the client did not settle there",
                        l.name, d.delivery_tag
                    ));
                };
                l.settled.swap_remove(at);
            }
            if l.attached && tx.flow().credit != l.credit {
                return fail(format!(
                    "{} has credit {} at the server, the client gave {}",
                    l.name,
                    tx.flow().credit,
                    l.credit
                ));
            }
        }
        if !l.settled.is_empty() {
            return fail(format!("{} never saw {:?} settled", l.name, l.settled));
        }
        Ok(())
    }
}

/// Runs one sequence; on failure, what went wrong and the operations that led there.
async fn run_sequence(seed: u64) -> Check {
    let mut w = World::new(seed).await;
    // Operations that find nothing to act on (no session to end, say) are drawn again; each
    // one that acts is followed by the check.
    let mut draws = 0;
    while w.log.len() < OPS && draws < 4 * OPS {
        draws += 1;
        let step = async {
            let before = w.log.len();
            w.step().await?;
            if w.log.len() == before {
                return Ok(());
            }
            w.check().await
        };
        match tokio::time::timeout(OP_LIMIT, step).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return fail(format!("{e}\n  after: {}", w.log.join("\n  "))),
            Err(_) => return fail(format!("hung\n  after: {}", w.log.join("\n  "))),
        }
    }
    let _ = w.client.close().await; // the sequence is over; the peer may already be gone
    Ok(())
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[tokio::test(start_paused = true)]
async fn stale_handles_never_act_on_the_links_that_took_their_numbers() {
    let seeds = match env_u64("SB_AMQP_MODEL_SEED") {
        Some(seed) => seed..seed + 1,
        None => 0..env_u64("SB_AMQP_MODEL_SEQUENCES").unwrap_or(DEFAULT_SEQUENCES),
    };
    let started = std::time::Instant::now();
    let count = seeds.end - seeds.start;
    for seed in seeds {
        if let Err(e) = run_sequence(seed).await {
            panic!("sequence {seed} failed: {e}");
        }
    }
    eprintln!(
        "{count} sequences of {OPS} operations in {:?}",
        started.elapsed()
    );
}
