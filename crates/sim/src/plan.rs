//! What one seed decides before the run starts: the workload, the configuration and the fault
//! schedule. Everything the run does later draws from streams derived from the same seed.

use std::time::Duration;

use rand::rngs::SmallRng;
use rand::{Rng as _, SeedableRng as _};

/// Which kinds of faults a run draws from (`SIM_FAULTS=net,broker,...`; `all` by default).
///
/// `all` is the five kinds of the first runs; process crashes are opt-in (`all,process`):
/// a crash changes everything after it, and every seed kept as a regression case (and every
/// figure in the README) was found without them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mix {
    /// Connection cuts, partitions, delay changes.
    pub net: bool,
    /// Forced detaches, ended sessions, throttling, refused renewals and settlements.
    pub broker: bool,
    /// Store outages, failed and ambiguous commits.
    pub store: bool,
    /// Handler panics, transient errors, slowness.
    pub handler: bool,
    /// Host clock steps (the client's lock arithmetic).
    pub clock: bool,
    /// Process crashes (the consumer's tasks dropped mid-await, its connections cut), each
    /// followed by a restart from the durable state.
    pub process: bool,
    /// Not a fault: the consumer runs in `sb_inbox`'s `Worker` (its start checks, its relay and
    /// retention, its self-sizing receive window), as users and the CLI run it, instead of the
    /// bare `Runtime` beside a relay of the simulator's (`worker`; opt-in, as `process`).
    pub worker: bool,
    /// Not a fault: `orders` requires sessions, each message belongs to one of a few sessions
    /// and the runtime runs in session mode (`sessions`; opt-in; no delayed retries, which
    /// session mode refuses).
    pub sessions: bool,
    /// Not a fault: the Worker (implied) runs retention on a replay horizon short enough to
    /// pass within a run and true of `orders` (a short TTL, expired messages dead-lettered, a
    /// low max delivery count, no resubmission window), so its deletes run while messages may
    /// still come back (`retention`; opt-in).
    pub retention: bool,
}

impl Mix {
    /// The five kinds of the first runs (`all`): every kind but process crashes.
    pub const ALL: Mix = Mix {
        net: true,
        broker: true,
        store: true,
        handler: true,
        clock: true,
        process: false,
        worker: false,
        sessions: false,
        retention: false,
    };

    /// Parses `net,broker,store,handler,clock,process` (any subset; `all` is every kind but
    /// `process`), `worker`, `sessions` and `retention`.
    ///
    /// # Errors
    /// The unknown name.
    pub fn parse(text: &str) -> Result<Mix, String> {
        let mut mix = Mix {
            net: false,
            broker: false,
            store: false,
            handler: false,
            clock: false,
            process: false,
            worker: false,
            sessions: false,
            retention: false,
        };
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "all" => {
                    mix = Mix {
                        process: mix.process,
                        worker: mix.worker,
                        sessions: mix.sessions,
                        retention: mix.retention,
                        ..Mix::ALL
                    }
                }
                "net" => mix.net = true,
                "broker" => mix.broker = true,
                "store" => mix.store = true,
                "handler" => mix.handler = true,
                "clock" => mix.clock = true,
                "process" => mix.process = true,
                "worker" => mix.worker = true,
                "sessions" => mix.sessions = true,
                "retention" => mix.retention = true,
                other => return Err(format!("unknown fault kind {other:?}")),
            }
        }
        Ok(mix)
    }

    /// The mix named by `SIM_FAULTS`, else all.
    pub fn from_env() -> Mix {
        std::env::var("SIM_FAULTS")
            .ok()
            .and_then(|v| Mix::parse(&v).ok())
            .unwrap_or(Mix::ALL)
    }
}

/// One fault, applied at its time.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Every live connection is cut.
    CutAll,
    /// One live connection (seeded pick) is cut.
    CutOne,
    /// Nothing is delivered for this long (bytes are held, not lost).
    Partition(Duration),
    /// The one-way delay range changes.
    Delay(Duration, Duration),
    /// The emulator detaches every link of the entity (`amqp:link:detach-forced`).
    DetachEntity(&'static str),
    /// The emulator ends every session with links.
    EndSessions,
    /// The namespace answers busy for this long.
    Throttle(Duration),
    /// The next N renewals on `orders` are refused (locks lost).
    RefuseRenewals(u32),
    /// The next N settlements on `orders` are refused.
    RefuseDispositions(u32),
    /// Every transaction fails to begin (unavailable) for this long.
    StoreOutage(Duration),
    /// Outages in a row: each (outage, gap before the next), a database that flaps.
    StoreFlap(Vec<(Duration, Duration)>),
    /// The next N commits fail (nothing committed).
    FailCommits(u32),
    /// The next commit commits, then reports a broken connection.
    AmbiguousCommit,
    /// The client host's clock steps by this many seconds (negative: back).
    ClockStep(i64),
}

/// The AMQP type of a message's `message-id`. Producers other than ours send ulong, uuid and
/// binary ids (AMQP 1.0 core, 3.2.4 `message-id-ulong`, `-uuid`, `-binary`; Service Bus keeps the
/// type: "MessageId ... can be one of the AMQP-defined types", learn.microsoft.com/azure/
/// service-bus-messaging/service-bus-amqp-dotnet, "Message properties"); the runtime keys them
/// `amqp:ulong:N`, `amqp:uuid:…`, `amqp:binary:<hex>` (`TYPED_MESSAGE_ID_PREFIX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// `message-id-ulong`: the message's index.
    Ulong,
    /// `message-id-uuid`: the index in the last six bytes.
    Uuid,
    /// `message-id-binary`: the bytes of `m-{index}`.
    Binary,
}

/// What the handler does to one message, beyond its business effect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HandlerFaults {
    /// Chance of a panic per attempt.
    pub panic: f64,
    /// Chance of a transient error per attempt.
    pub transient: f64,
    /// Chance of a slow attempt per attempt, and its longest pause.
    pub slow: f64,
    /// The longest slow pause.
    pub slow_max: Duration,
}

/// Everything a seed decides up front.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The seed.
    pub seed: u64,
    /// Distinct logical messages sent.
    pub messages: usize,
    /// Indices sent twice under the same message id.
    pub duplicates: Vec<usize>,
    /// Indices whose body does not decode (dead-lettered `InvalidPayload`).
    pub poison: Vec<usize>,
    /// Indices whose handler always panics (dead-lettered `HandlerPanicked`).
    pub panicky: Vec<usize>,
    /// Indices sent as the old contract version `v0`, upcast to `v1` by the router.
    pub old_version: Vec<usize>,
    /// Indices (among `old_version`) whose upcaster panics (dead-lettered `HandlerPanicked`).
    pub upcast_panicky: Vec<usize>,
    /// When the producer sends each message (virtual time from the start).
    pub send_over: Duration,
    /// Faults are applied only before this instant.
    pub faults_until: Duration,
    /// The fault schedule, in time order.
    pub faults: Vec<(Duration, Fault)>,
    /// Per-attempt handler faults.
    pub handler: HandlerFaults,
    /// Runtime settings.
    pub concurrency: usize,
    /// Runtime prefetch.
    pub prefetch: usize,
    /// Deliveries per transaction.
    pub batch_size: usize,
    /// Delayed retries instead of abandons.
    pub delayed_retry: bool,
    /// Their retries before `RetriesExhausted`.
    pub retries: u32,
    /// Indices whose handler swallows a failed statement (a `CHECK` violation) on every attempt
    /// and returns `Ok`: the runtime must not commit their work (dead-lettered
    /// `PermanentStoreError`). Handler faults only.
    pub swallowing: Vec<usize>,
    /// Indices sent with a typed (non-string) AMQP message id, by a producer beside ours.
    pub typed: std::collections::BTreeMap<usize, IdKind>,
    /// When the consumer's process crashes, and how long it stays down before its restart
    /// (process faults only; from a stream of their own, so the other draws stay as they were).
    pub crashes: Vec<(Duration, Duration)>,
    /// The consumer runs in the `Worker` ([`Mix::worker`], or implied by [`Mix::retention`]).
    pub worker: bool,
    /// Retention on a short, true replay horizon ([`Mix::retention`]).
    pub retention: bool,
    /// In session mode ([`Mix::sessions`]): how many sessions the messages are spread over
    /// (message `i` is in session `s-{i % n}`), and how many the runtime takes at once.
    pub sessions: Option<(usize, usize)>,
    /// Every id under which a typed message may show (its inbox key, the broker's text of its
    /// id) to its name `m-{index}`.
    aliases: std::collections::BTreeMap<String, usize>,
}

/// The queue's lock duration (short, so that lock loss happens within a run).
pub const LOCK_DURATION: Duration = Duration::from_secs(10);
/// The queue's max delivery count: high, so that only the runtime's own rules dead-letter.
pub const MAX_DELIVERY_COUNT: u32 = 1000;
/// With retention ([`Mix::retention`]): `orders`' message TTL (expired messages are
/// dead-lettered `TTLExpiredException`) and max delivery count, so that its replay horizon
/// (TTL + lock duration × max delivery count + delayed retries) passes within a run.
pub const RETENTION_TTL: Duration = Duration::from_secs(120);
/// With retention: `orders`' max delivery count (see [`RETENTION_TTL`]).
pub const RETENTION_MAX_DELIVERY_COUNT: u32 = 10;
/// The delayed retries' longest delay (`host::retry_policy`): a copy comes at most this much
/// later per retry (the jitter only shortens it).
pub const RETRY_MAX_DELAY: Duration = Duration::from_secs(10);

impl Plan {
    /// `orders`' message TTL and max delivery count as configured for this plan (`None`: the
    /// emulator's default TTL).
    pub fn orders_limits(&self) -> (Option<Duration>, u32) {
        if self.retention {
            (Some(RETENTION_TTL), RETENTION_MAX_DELIVERY_COUNT)
        } else {
            (None, MAX_DELIVERY_COUNT)
        }
    }
}

impl Plan {
    /// The plan of `seed` drawing faults from `mix`.
    pub fn new(seed: u64, mix: Mix) -> Plan {
        let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_9a1a);
        let messages = rng.random_range(200..=260);
        let pick = |rng: &mut SmallRng, p: f64| -> Vec<usize> {
            (0..messages).filter(|_| rng.random_bool(p)).collect()
        };
        let duplicates = pick(&mut rng, 0.05);
        let poison = pick(&mut rng, 0.02);
        let panicky = if mix.handler {
            pick(&mut rng, 0.01)
        } else {
            Vec::new()
        };
        let old_version = pick(&mut rng, 0.05);
        let upcast_panicky: Vec<usize> = if mix.handler {
            old_version
                .iter()
                .copied()
                .filter(|_| rng.random_bool(0.2))
                .collect()
        } else {
            Vec::new()
        };
        let faults_until = Duration::from_secs(rng.random_range(20..=90));
        let faults = schedule(&mut rng, mix, faults_until);
        let handler = HandlerFaults::draw(&mut rng, mix.handler);
        // A stream of its own, so that the draws above (and every seed's faults) stay as they were.
        let mut typed_rng = SmallRng::seed_from_u64(seed ^ 0x7e_1d_1d);
        let typed = typed_ids(&mut typed_rng, messages);
        let swallowing: Vec<usize> = if mix.handler {
            (0..messages)
                .filter(|_| typed_rng.random_bool(0.02))
                .collect()
        } else {
            Vec::new()
        };
        let crashes = if mix.process {
            crashes(seed, faults_until)
        } else {
            Vec::new()
        };
        let aliases = aliases(&typed);
        let sessions = mix.sessions.then(|| {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0x5e55_1075);
            (rng.random_range(1..=12), rng.random_range(1..=4))
        });
        Plan {
            crashes,
            worker: mix.worker || mix.retention,
            retention: mix.retention,
            sessions,
            swallowing,
            typed,
            aliases,
            seed,
            messages,
            duplicates,
            poison,
            panicky,
            old_version,
            upcast_panicky,
            send_over: Duration::from_secs(rng.random_range(5..=40)),
            faults_until,
            faults,
            handler,
            concurrency: rng.random_range(1..=8),
            prefetch: rng.random_range(0..=4),
            // Session mode handles one message per transaction (it refuses batches).
            batch_size: if rng.random_bool(0.25) {
                rng.random_range(2..=8)
            } else {
                1
            }
            .min(if mix.sessions { 1 } else { usize::MAX }),
            // Drawn in every mode, so that the draws after it stay as they were.
            delayed_retry: rng.random_bool(0.25) && !mix.sessions,
            retries: rng.random_range(1..=3),
        }
    }
}

impl HandlerFaults {
    /// The handler's fault rates, drawn from `rng` when `on` (none drawn otherwise).
    fn draw(rng: &mut SmallRng, on: bool) -> HandlerFaults {
        if on {
            HandlerFaults {
                panic: rng.random_range(0.0..0.05),
                transient: rng.random_range(0.0..0.1),
                slow: rng.random_range(0.0..0.1),
                slow_max: Duration::from_millis(rng.random_range(100..=25_000)),
            }
        } else {
            HandlerFaults {
                panic: 0.0,
                transient: 0.0,
                slow: 0.0,
                slow_max: Duration::ZERO,
            }
        }
    }
}

/// The messages sent with a typed message id (one in ten), and each one's kind.
fn typed_ids(rng: &mut SmallRng, messages: usize) -> std::collections::BTreeMap<usize, IdKind> {
    let mut typed = std::collections::BTreeMap::new();
    for i in 0..messages {
        if rng.random_bool(0.1) {
            let kinds = [IdKind::Ulong, IdKind::Uuid, IdKind::Binary];
            typed.insert(i, kinds[rng.random_range(0..kinds.len())]);
        }
    }
    typed
}

/// Every spelling of a typed message's id (its key, its text), to its index.
fn aliases(
    typed: &std::collections::BTreeMap<usize, IdKind>,
) -> std::collections::BTreeMap<String, usize> {
    let mut aliases = std::collections::BTreeMap::new();
    for (&i, &kind) in typed {
        aliases.insert(typed_key(i, kind), i);
        aliases.insert(typed_text(i, kind), i);
    }
    aliases
}

impl Plan {
    /// The key the runtime must use for message `i` (`ctx.logical_id()`, a copy's logical-id
    /// property): `m-{i}`, or its typed key.
    pub fn key(&self, i: usize) -> String {
        match self.typed.get(&i) {
            Some(&kind) => typed_key(i, kind),
            None => name(i),
        }
    }

    /// The message an id names: `m-{i}`, a typed message's key or the broker's text of its id.
    pub fn index_of(&self, id: &str) -> Option<usize> {
        if let Some(&i) = self.aliases.get(id) {
            return Some(i);
        }
        let i: usize = id.strip_prefix("m-")?.parse().ok()?;
        (i < self.messages).then_some(i)
    }

    /// The session of message `i`, in session mode.
    pub fn session(&self, i: usize) -> Option<String> {
        self.sessions.map(|(n, _)| format!("s-{}", i % n.max(1)))
    }

    /// The name the model knows message `id` by (`m-{i}`), or `id` itself when it names none.
    pub fn name_of(&self, id: &str) -> String {
        self.index_of(id).map_or_else(|| id.to_owned(), name)
    }
}

/// The model's name of message `i`; also the id its body carries.
pub fn name(i: usize) -> String {
    format!("m-{i}")
}

/// The uuid of typed message `i`: its index in the last six bytes.
pub fn uuid_bytes(i: usize) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[8..].copy_from_slice(&(i as u64).to_be_bytes());
    b
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn uuid_text(i: usize) -> String {
    let h = hex(&uuid_bytes(i));
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// The inbox key of typed message `i` (`sb-servicebus`'s `message_id_key`).
fn typed_key(i: usize, kind: IdKind) -> String {
    let kind_name = match kind {
        IdKind::Ulong => "ulong",
        IdKind::Uuid => "uuid",
        IdKind::Binary => "binary",
    };
    format!("amqp:{kind_name}:{}", typed_text(i, kind))
}

/// The text Service Bus (and the emulator) shows for typed message `i`'s id.
pub fn typed_text(i: usize, kind: IdKind) -> String {
    match kind {
        IdKind::Ulong => i.to_string(),
        IdKind::Uuid => uuid_text(i),
        IdKind::Binary => hex(name(i).as_bytes()),
    }
}

/// One to four crashes before `until`, each down for up to 10 s (a container's restart).
fn crashes(seed: u64, until: Duration) -> Vec<(Duration, Duration)> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0xc0_ffee_dead);
    let until_ms = u64::try_from(until.as_millis()).unwrap_or(u64::MAX).max(1);
    let mut crashes: Vec<(Duration, Duration)> = (0..rng.random_range(1..=4))
        .map(|_| {
            (
                Duration::from_millis(rng.random_range(0..until_ms)),
                Duration::from_millis(rng.random_range(0..=10_000)),
            )
        })
        .collect();
    crashes.sort_by_key(|(at, _)| *at);
    crashes
}

fn schedule(rng: &mut SmallRng, mix: Mix, until: Duration) -> Vec<(Duration, Fault)> {
    let count = rng.random_range(0..=12);
    let mut faults = Vec::new();
    let kinds: Vec<u8> = [
        (mix.net, [0u8, 1, 2, 3].as_slice()),
        (mix.broker, &[4, 5, 6, 7, 8, 13]),
        (mix.store, &[9, 10, 11, 14, 14]),
        (mix.clock, &[12]),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .flat_map(|(_, k)| k.iter().copied())
    .collect();
    if kinds.is_empty() {
        return faults;
    }
    let ms =
        |rng: &mut SmallRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    for _ in 0..count {
        let at = Duration::from_millis(rng.random_range(0..until.as_millis() as u64));
        let fault = match kinds[rng.random_range(0..kinds.len())] {
            0 => Fault::CutAll,
            1 => Fault::CutOne,
            2 => Fault::Partition(ms(rng, 100, 30_000)),
            3 => {
                let lo = ms(rng, 0, 50);
                Fault::Delay(lo, lo + ms(rng, 0, 500))
            }
            4 => Fault::DetachEntity(["orders", "out-a", "out-b"][rng.random_range(0..3)]),
            5 => Fault::EndSessions,
            6 => Fault::Throttle(ms(rng, 100, 15_000)),
            7 => Fault::RefuseRenewals(rng.random_range(1..=5)),
            8 => Fault::RefuseDispositions(rng.random_range(1..=5)),
            // Long enough for the kill switch to open and probe several times.
            9 => Fault::StoreOutage(ms(rng, 1_000, 60_000)),
            10 => Fault::FailCommits(rng.random_range(1..=5)),
            11 => Fault::AmbiguousCommit,
            12 => Fault::ClockStep(rng.random_range(-120..=120)),
            14 => Fault::StoreFlap(
                (0..rng.random_range(2..=8))
                    .map(|_| (ms(rng, 500, 8_000), ms(rng, 200, 4_000)))
                    .collect(),
            ),
            _ => Fault::DetachEntity("orders"),
        };
        // Faults stop in time: a partition ends before `until` as well.
        let fault = match fault {
            Fault::Partition(d) => Fault::Partition(d.min(until.saturating_sub(at))),
            Fault::StoreOutage(d) => Fault::StoreOutage(d.min(until.saturating_sub(at))),
            Fault::Throttle(d) => Fault::Throttle(d.min(until.saturating_sub(at))),
            Fault::StoreFlap(steps) => {
                let mut left = until.saturating_sub(at);
                let mut kept = Vec::new();
                for (outage, gap) in steps {
                    if outage + gap > left {
                        break;
                    }
                    left -= outage + gap;
                    kept.push((outage, gap));
                }
                Fault::StoreFlap(kept)
            }
            other => other,
        };
        faults.push((at, fault));
    }
    faults.sort_by_key(|(at, _)| *at);
    faults
}

/// A number in `[0, 1)` decided by `(seed, key, attempt)` alone, whatever ran before: the
/// handler's fault draws do not depend on the order deliveries arrive in.
pub fn draw(seed: u64, key: &str, attempt: u32, salt: u64) -> f64 {
    use std::hash::{Hash as _, Hasher as _};
    // SipHash with fixed keys: the same on every run and platform.
    let mut h = std::hash::DefaultHasher::new();
    (seed, key, attempt, salt).hash(&mut h);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
