//! One run: build the world from the plan, let it run under faults, wait for the backlog to
//! drain, then check the invariants against what the broker and the database hold.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sb_emulator::PropertyValue as EmuValue;
use sb_inbox::Message;
use sb_inbox::servicebus::{ServiceBusClient, ServiceBusMessage};
use tokio::time::Instant;

use crate::Trace;
use crate::handler::{self, SimHandler};
use crate::host::{self, Current, Process, crash_and_restart, current};
use crate::plan::{self, Fault, Mix, Plan};
use crate::process::Life;
use crate::world::{World, skip_kind, world};

/// After the faults stop, the backlog must drain within this much virtual time, plus the time
/// the handlers spent in their planned slowness (`handler::Seen::slept`). The SQLite store has
/// one writer and a handler's pause is inside its transaction, so the pauses add up instead of
/// overlapping: a plan with 250 messages, 9.5 % of attempts slow by up to 24 s, sleeps about
/// 280 s in total (seeds 1725, 2394, 2452, 2865, 3973, 4433, 4443, 5853 of the first 10 000-seed
/// run failed a fixed 300 s bound only for that). What the runtime itself adds must still fit
/// in the 300 s.
pub const DRAIN_BOUND: Duration = Duration::from_secs(300);
/// Once the backlog drained, the kill switch must have closed (or passed its probe) within this.
pub const SWITCH_BOUND: Duration = Duration::from_secs(60);
/// Every run simulates at least this much virtual time.
pub const MIN_VIRTUAL: Duration = Duration::from_secs(60);
/// What one run found.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// The hash of the event trace.
    pub trace_hash: u64,
    /// The event trace.
    pub trace: Vec<String>,
    /// Invariants broken (empty: the run passed).
    pub violations: Vec<String>,
    /// Virtual time simulated.
    pub virtual_time: Duration,
    /// Distinct logical messages sent.
    pub messages: usize,
    /// Faults applied.
    pub faults: usize,
    /// Outbox rows that reached their destination more than once under their id (relay
    /// at-least-once: a send whose answer was lost, or a crash between a send and its mark).
    /// Allowed, counted: Service Bus's duplicate detection is what makes these "once".
    pub outbox_again: usize,
    /// With retention: inbox rows it had deleted when the backlog drained, at least (while
    /// messages could still come back).
    pub retention_early: u64,
}

impl Report {
    /// True when every invariant held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations, the last trace lines and the replay command.
    pub fn explain(&self, mix: &str) -> String {
        let tail: Vec<&String> = self.trace.iter().rev().take(40).collect();
        let mut out = format!(
            "seed {} failed ({} messages, {:.0} s virtual):\n",
            self.seed,
            self.messages,
            self.virtual_time.as_secs_f64()
        );
        for v in &self.violations {
            out.push_str(&format!("  violation: {v}\n"));
        }
        out.push_str("  last events:\n");
        for line in tail.into_iter().rev() {
            out.push_str(&format!("    {line}\n"));
        }
        out.push_str(&format!(
            "  replay: SIM_SEED={} SIM_FAULTS={mix} cargo run --release -p sim -- --seed {}\n",
            self.seed, self.seed
        ));
        out
    }
}

/// Runs seed `seed` with faults from `mix`, on a fresh current-thread runtime with paused time.
///
/// # Panics
/// When the runtime cannot be built (out of resources).
pub fn run(seed: u64, mix: Mix) -> Report {
    quiet_simulated_panics();
    let plan = Arc::new(Plan::new(seed, mix));
    let progress = Arc::new(Progress::default());
    let (done, result) = std::sync::mpsc::channel();
    let (thread_plan, thread_progress) = (plan.clone(), progress.clone());
    // On a thread of its own, so that a run spinning at one virtual instant (a busy loop: no
    // timer ever lets the paused clock advance) is reported instead of hanging the caller.
    let spawned = std::thread::Builder::new()
        .name(format!("sim-{seed}"))
        .spawn(move || {
            let _ = done.send(run_here(thread_plan, thread_progress));
        });
    let hang = |why: String| Report {
        seed,
        trace_hash: 0,
        trace: progress.trace(),
        violations: vec![why],
        virtual_time: Duration::from_millis(progress.at.load(Ordering::Acquire)),
        messages: plan.messages,
        faults: plan.faults.len(),
        outbox_again: 0,
        retention_early: 0,
    };
    if let Err(error) = spawned {
        return hang(format!("cannot start the run's thread: {error}"));
    }
    match result.recv_timeout(wall_limit()) {
        Ok(report) => report,
        Err(_) => hang(format!(
            "hang: no result after {:?} of wall time; virtual time stuck near {} ms (a busy loop at one instant, or far too many events); the run's thread still spins: exit the process",
            wall_limit(),
            progress.at.load(Ordering::Acquire)
        )),
    }
}

/// How long one run may take on the wall clock (`SIM_WALL_LIMIT_SECS`, 120 s by default).
fn wall_limit() -> Duration {
    Duration::from_secs(
        std::env::var("SIM_WALL_LIMIT_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(120),
    )
}

/// How far a run got, readable from outside its thread.
#[derive(Debug, Default)]
struct Progress {
    /// Virtual milliseconds since the start, updated every virtual second.
    at: std::sync::atomic::AtomicU64,
    trace: std::sync::Mutex<Option<Trace>>,
}

impl Progress {
    fn trace(&self) -> Vec<String> {
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(Trace::snapshot)
            .unwrap_or_default()
    }
}

fn run_here(plan: Arc<Plan>, progress: Arc<Progress>) -> Report {
    #[cfg(tokio_unstable)]
    let seed = plan.seed;
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_time().start_paused(true);
    // tokio's own choices (`select!` branch order) are seeded only under `tokio_unstable`.
    #[cfg(tokio_unstable)]
    let _ = builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    #[allow(clippy::expect_used)]
    let runtime = builder.build().expect("a current-thread runtime");
    runtime.block_on(simulate(plan, progress))
}

/// Keeps the planned handler panics off stderr; other panics still print.
fn quiet_simulated_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let simulated = info
                .payload()
                .downcast_ref::<String>()
                .is_some_and(|m| m.starts_with("simulated handler panic"));
            if !simulated {
                previous(info);
            }
        }));
    });
}

async fn simulate(plan: Arc<Plan>, progress: Arc<Progress>) -> Report {
    match world(plan.clone()).await {
        Ok(world) => {
            *progress
                .trace
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(world.trace.clone());
            drive(world, progress).await
        }
        Err(error) => Report {
            seed: plan.seed,
            trace_hash: 0,
            trace: Vec::new(),
            violations: vec![format!("setup failed: {error}")],
            virtual_time: Duration::ZERO,
            messages: plan.messages,
            faults: 0,
            outbox_again: 0,
            retention_early: 0,
        },
    }
}

/// The body of message `i`.
fn body(plan: &Plan, i: usize) -> (u32, String) {
    if plan.poison.contains(&i) {
        (1, "{nope".to_owned())
    } else if plan.old_version.contains(&i) {
        let explode = plan.upcast_panicky.contains(&i);
        (0, format!(r#"{{"id":"m-{i}","explode":{explode}}}"#))
    } else {
        (1, format!(r#"{{"id":"m-{i}"}}"#))
    }
}

async fn produce(world: Arc<World>, client: ServiceBusClient) {
    let plan = &world.plan;
    let sender = client.sender("orders");
    let step = plan.send_over / u32::try_from(plan.messages.max(1)).unwrap_or(u32::MAX);
    for i in 0..plan.messages {
        tokio::time::sleep_until(world.start + step * u32::try_from(i).unwrap_or(0)).await;
        let copies = if plan.duplicates.contains(&i) { 2 } else { 1 };
        if let Some(&kind) = plan.typed.get(&i) {
            for _ in 0..copies {
                let sent = send_typed(&world, i, kind);
                world
                    .trace
                    .push(format!("sent m-{i} ({kind:?} id): {sent}"));
            }
            continue;
        }
        for _ in 0..copies {
            let (version, body) = body(plan, i);
            let mut message = Message::new(
                format!("m-{i}"),
                format!("{}.v{version}", handler::CONTRACT),
                body,
            );
            if let Some(session) = plan.session(i) {
                message = message.with_session_id(session);
            }
            // Until the broker took it: every message is surely enqueued (maybe twice).
            let mut tries = 0u32;
            loop {
                tries += 1;
                match sender.send(ServiceBusMessage::from(message.clone())).await {
                    Ok(()) => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            world.trace.push(format!("sent m-{i} after {tries} tries"));
        }
    }
    world.trace.push("producer done");
}

/// Sends message `i` with a typed `message-id` straight into the broker's `orders`, as a
/// producer on another SDK would (ours sends string ids only): the AMQP message our client
/// would send, but with `kind`'s id. Not over the simulated network: the typed id, not that
/// producer's connection, is what is under test.
fn send_typed(world: &World, i: usize, kind: plan::IdKind) -> String {
    use sb_amqp::types::messaging::{Data, Message as AmqpMessage, MessageId, Properties};
    use sb_amqp::types::primitives::{Binary, Symbol, Uuid};
    let (version, body) = body(&world.plan, i);
    let subject = format!("{}.v{version}", handler::CONTRACT);
    let id = match kind {
        plan::IdKind::Ulong => MessageId::Ulong(i as u64),
        plan::IdKind::Uuid => MessageId::Uuid(Uuid::from(plan::uuid_bytes(i))),
        plan::IdKind::Binary => MessageId::Binary(Binary::from(plan::name(i).into_bytes())),
    };
    let message = AmqpMessage {
        header: None,
        delivery_annotations: None,
        message_annotations: None,
        properties: Some(Properties {
            message_id: Some(id),
            subject: Some(subject.clone()),
            content_type: Some(Symbol::from("application/json")),
            ..Properties::default()
        }),
        application_properties: None,
        body: Data(Binary::from(body.into_bytes())),
        footer: None,
    };
    let payload = match sb_amqp::encode_message(&message) {
        Ok(p) => p,
        Err(e) => return format!("not encoded: {e}"),
    };
    // The broker reads the fields it needs from the sender's message (the emulator's codec
    // does the same for a message that arrives over AMQP).
    let mut stored = sb_emulator::BrokerMessage::new(payload);
    stored.message_id = Some(plan::typed_text(i, kind));
    stored.subject = Some(subject);
    stored.content_type = Some("application/json".to_owned());
    stored.session_id = world.plan.session(i);
    match world
        .emulator
        .broker()
        .entity("orders")
        .and_then(|e| e.send(stored))
    {
        Ok(_) => "enqueued".to_owned(),
        Err(e) => format!("refused: {e}"),
    }
}

async fn inject(world: Arc<World>) {
    for (at, fault) in world.plan.faults.clone() {
        tokio::time::sleep_until(world.start + at).await;
        let what = apply(&world, &fault).await;
        world.trace.push(format!("fault {fault:?}: {what}"));
    }
    tokio::time::sleep_until(world.start + world.plan.faults_until).await;
    world
        .net
        .set_delay(Duration::from_micros(200), Duration::from_millis(2));
    world.trace.push("faults stop");
}

/// The fault kinds `SIM_SKIP` names (`net,broker,store,clock`) are scheduled as usual but
/// not applied: the same seed with one kind left out, to tell which kind a failure needs.
fn skipped(fault: &Fault) -> bool {
    let kind = match fault {
        Fault::CutAll | Fault::CutOne | Fault::Partition(_) | Fault::Delay(..) => "net",
        Fault::DetachEntity(_)
        | Fault::EndSessions
        | Fault::Throttle(_)
        | Fault::RefuseRenewals(_)
        | Fault::RefuseDispositions(_) => "broker",
        Fault::StoreOutage(_)
        | Fault::StoreFlap(_)
        | Fault::FailCommits(_)
        | Fault::AmbiguousCommit => "store",
        Fault::ClockStep(_) => "clock",
    };
    skip_kind(kind)
}

async fn apply(world: &World, fault: &Fault) -> String {
    use sb_amqp::{AmqpError, condition};
    if skipped(fault) {
        return "skipped (SIM_SKIP)".to_owned();
    }
    let entity = |name: &str| world.emulator.broker().entity(name);
    match fault {
        Fault::CutAll => format!("{} cut", world.net.cut_all()),
        Fault::CutOne => format!("{}", world.net.cut_one()),
        Fault::Partition(d) => {
            world.net.partition(*d);
            String::new()
        }
        Fault::Delay(lo, hi) => {
            world.net.set_delay(*lo, *hi);
            String::new()
        }
        Fault::DetachEntity(name) => {
            let error = AmqpError::new(condition::DETACH_FORCED, Some("simulated".to_owned()));
            format!(
                "{} detached",
                world.emulator.force_detach_entity(name, error)
            )
        }
        Fault::EndSessions => format!("{} ended", world.emulator.end_sessions().await),
        Fault::Throttle(d) => {
            world.emulator.throttle(*d);
            String::new()
        }
        Fault::RefuseRenewals(n) => {
            format!("{:?}", entity("orders").map(|e| e.refuse_renewals(*n)))
        }
        Fault::RefuseDispositions(n) => {
            format!("{:?}", entity("orders").map(|e| e.refuse_dispositions(*n)))
        }
        Fault::StoreOutage(d) => {
            world.store.faults.outage(*d);
            String::new()
        }
        Fault::StoreFlap(steps) => {
            let (faults, steps) = (world.store.faults.clone(), steps.clone());
            tokio::spawn(async move {
                for (outage, gap) in steps {
                    faults.outage(outage);
                    tokio::time::sleep(outage + gap).await;
                }
            });
            String::new()
        }
        Fault::FailCommits(n) => {
            world.store.faults.fail_commits(*n);
            String::new()
        }
        Fault::AmbiguousCommit => {
            world.store.faults.ambiguous_commit();
            String::new()
        }
        Fault::ClockStep(secs) => {
            world.clock_step_ms.fetch_add(secs * 1000, Ordering::AcqRel);
            String::new()
        }
    }
}

async fn drive(world: World, progress: Arc<Progress>) -> Report {
    let world = Arc::new(world);
    let plan = world.plan.clone();
    let handler = SimHandler::new(plan.clone(), world.trace.clone());
    let seen = handler.seen.clone();
    let producer = match world.client(2, Life::new()) {
        Ok(p) => p,
        Err(e) => return failed(&plan, format!("client: {e}")),
    };
    let first = match Process::start(&world, &handler, 0) {
        Ok(p) => p,
        Err(e) => return failed(&plan, e),
    };
    let running: Current = Arc::new(std::sync::Mutex::new(Some(first)));
    let producing = tokio::spawn(produce(world.clone(), producer));
    let injecting = tokio::spawn(inject(world.clone()));
    let crashing = tokio::spawn(crash_and_restart(
        world.clone(),
        handler.clone(),
        running.clone(),
    ));
    let tasks_done =
        || producing.is_finished() && injecting.is_finished() && crashing.is_finished();
    let drained = wait_drained(&world, &progress, &seen, tasks_done).await;
    world.trace.push(format!(
        "drained: {drained} (handlers slept {:?} in all)",
        slept(&seen)
    ));
    let switch = current(&running).as_ref().map(|p| p.switch.clone());
    let still_open = match (&switch, drained) {
        (Some(switch), true) => kill_switch_recovers(&world, switch).await,
        _ => None,
    };
    let (retention_early, retention) = match (plan.retention, drained) {
        (true, true) => retention_deletes(&world).await,
        _ => (0, None),
    };
    // The census after shutdown would show the handlers that finished since; this is the state
    // that failed the bound.
    let at_deadline = world.emulator.broker().entity("orders").map(|e| e.counts());
    producing.abort();
    injecting.abort();
    crashing.abort();
    let last = current(&running).take();
    let stopped = match last {
        Some(process) => process.stop().await,
        None => true,
    };
    if !stopped {
        world
            .trace
            .push("runtime or relay did not stop within 120 s");
    }
    census(&world);
    let virtual_time = world.start.elapsed();
    let (mut violations, outbox_again) =
        check(&world, &seen, drained, &format!("{at_deadline:?}")).await;
    if !stopped {
        violations.push("shutdown: the runtime or relay did not stop within 120 s".to_owned());
    }
    violations.extend(still_open);
    violations.extend(retention);
    Report {
        seed: plan.seed,
        trace_hash: world.trace.hash(),
        trace: world.trace.snapshot(),
        violations,
        virtual_time,
        messages: plan.messages,
        faults: plan.faults.len() + plan.crashes.len(),
        outbox_again,
        retention_early,
    }
}

/// The handlers' planned pauses so far: the drain bound stretches by them.
fn slept(seen: &std::sync::Mutex<handler::Seen>) -> Duration {
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .slept
}

/// Waits, one virtual second at a time, until the run's tasks are done and the entities drained
/// (true, not before `MIN_VIRTUAL`), or until the drain bound passed (false).
async fn wait_drained(
    world: &World,
    progress: &Progress,
    seen: &std::sync::Mutex<handler::Seen>,
    tasks_done: impl Fn() -> bool,
) -> bool {
    let plan = &world.plan;
    let deadline = world.start + plan.faults_until.max(plan.send_over) + DRAIN_BOUND;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = Instant::now();
        let at = u64::try_from((now - world.start).as_millis()).unwrap_or(u64::MAX);
        progress.at.store(at, Ordering::Release);
        let done = tasks_done() && drained(world).await;
        if done && now >= world.start + MIN_VIRTUAL {
            return true;
        }
        if now >= deadline + slept(seen) {
            return false;
        }
    }
}

/// Each entity's counts, in the trace.
fn census(world: &World) {
    for name in ["orders", "out-a", "out-b"] {
        if let Ok(e) = world.emulator.broker().entity(name) {
            let c = e.counts();
            world.trace.push(format!(
                "census {name}: sent {} completed {} active {} locked {} scheduled {} dead-lettered {}",
                c.sent, c.completed, c.active, c.locked, c.scheduled, c.dead_lettered_total
            ));
        }
    }
}

/// The kill switch recovers: once the faults stopped and the backlog drained, the store answers
/// its probe within `SWITCH_BOUND` (its probes back off to 30 s apart). A switch whose probe
/// passed but that saw no trial delivery (nothing left to receive) has recovered.
async fn kill_switch_recovers(world: &World, switch: &host::Switch) -> Option<String> {
    let until = Instant::now() + SWITCH_BOUND;
    loop {
        let open = switch.open().await;
        match open {
            None => {
                world.trace.push(switch.trips());
                return None;
            }
            Some(why) if Instant::now() >= until => {
                return Some(format!(
                    "kill switch: still open {SWITCH_BOUND:?} after the backlog drained: {why}"
                ));
            }
            Some(_) => tokio::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// The inbox rows (processed and verdicts) left in the database.
async fn inbox_rows(world: &World) -> u64 {
    world
        .store
        .inner
        .with_connection(|c| c.query_row("SELECT count(*) FROM sb_inbox", [], |r| r.get(0)))
        .await
        .unwrap_or(u64::MAX)
}

/// With retention ([`Plan::retention`]): how many inbox rows retention deleted before the
/// backlog drained (while messages could still come back: any that did took effect twice,
/// which the effects show), then that it deletes every row once the horizon passed: within
/// the horizon and two sweeps of the drain, no row is left (each is older than the horizon).
async fn retention_deletes(world: &World) -> (u64, Option<String>) {
    let horizon = host::replay_horizon(&world.plan).span();
    let rows = world.store.inner.with_connection(|c| {
        c.query_row("SELECT count(DISTINCT id) FROM sim_effects", [], |r| {
            r.get::<_, u64>(0)
        })
    });
    let processed = rows.await.unwrap_or(0);
    let left = inbox_rows(world).await;
    // A lower bound: the rows left include the verdicts of messages dead-lettered by history.
    let early = processed.saturating_sub(left);
    world.trace.push(format!(
        "retention: at least {early} inbox rows deleted before the drain ({processed} messages processed, {left} rows left; horizon {horizon:?})"
    ));
    let until = Instant::now() + horizon + Duration::from_secs(30);
    loop {
        let left = inbox_rows(world).await;
        if left == 0 {
            world
                .trace
                .push("retention: every inbox row deleted after the horizon");
            return (early, None);
        }
        if Instant::now() >= until {
            return (
                early,
                Some(format!(
                    "retention: {left} inbox rows left {:?} after the backlog drained (horizon {horizon:?})",
                    horizon + Duration::from_secs(30)
                )),
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn failed(plan: &Plan, why: String) -> Report {
    Report {
        seed: plan.seed,
        trace_hash: 0,
        trace: Vec::new(),
        violations: vec![why],
        virtual_time: Duration::ZERO,
        messages: plan.messages,
        faults: 0,
        outbox_again: 0,
        retention_early: 0,
    }
}

/// The model's name (`m-N`) of a broker message: from the runtime's logical-id property on
/// retry copies, else from its id (a typed id's key or text names its message too).
fn logical_id(plan: &Plan, m: &sb_emulator::ReceivedMessage) -> String {
    let id = match m
        .message
        .application_properties
        .get(sb_inbox::runtime::LOGICAL_ID_PROPERTY)
    {
        Some(EmuValue::String(id)) => id.clone(),
        _ => m.message.message_id.clone().unwrap_or_default(),
    };
    plan.name_of(&id)
}

fn peek_all(world: &World, entity: &str) -> Vec<sb_emulator::ReceivedMessage> {
    world
        .emulator
        .broker()
        .entity(entity)
        .and_then(|e| e.peek(0, 100_000))
        .unwrap_or_default()
}

/// Effects committed per logical id.
async fn effects(world: &World) -> BTreeMap<String, u32> {
    world
        .store
        .inner
        .with_connection(|c| {
            let mut stmt = c.prepare("SELECT id, count(*) FROM sim_effects GROUP BY id")?;
            let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, u32>(1)?)))?;
            rows.collect::<rusqlite::Result<BTreeMap<_, _>>>()
        })
        .await
        .unwrap_or_default()
}

async fn drained(world: &World) -> bool {
    let Ok(orders) = world.emulator.broker().entity("orders") else {
        return false;
    };
    let c = orders.counts();
    if c.active + c.locked + c.scheduled > 0 {
        return false;
    }
    if !sb_inbox::OutboxStore::outbox_backlog(&world.store.inner)
        .await
        .is_ok_and(|b| b.pending == 0)
    {
        return false;
    }
    let effects = effects(world).await;
    let dead: BTreeSet<String> = peek_all(world, "orders/$DeadLetterQueue")
        .iter()
        .map(|m| logical_id(&world.plan, m))
        .collect();
    (0..world.plan.messages)
        .map(|i| format!("m-{i}"))
        .all(|id| effects.contains_key(&id) || dead.contains(&id))
}

/// The invariants, judged from the broker's and the database's final state and what the
/// handler saw; and how many outbox rows arrived again (allowed, counted).
async fn check(
    world: &World,
    seen: &std::sync::Mutex<handler::Seen>,
    drained: bool,
    at_deadline: &str,
) -> (Vec<String>, usize) {
    let plan = &world.plan;
    let effects = effects(world).await;
    let session_violations = check_session_order(world).await;
    let seen = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut violations = Vec::new();
    let mut dead: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in peek_all(world, "orders/$DeadLetterQueue") {
        let reason = m.dead_letter_reason().unwrap_or("?").to_owned();
        dead.entry(logical_id(plan, &m)).or_default().push(reason);
    }
    if !drained {
        violations.push(format!(
            "liveness: the backlog did not drain within {DRAIN_BOUND:?} (plus {:?} of handler slowness) after the faults stopped ({at_deadline})",
            seen.slept
        ));
    }
    for i in 0..plan.messages {
        let id = format!("m-{i}");
        let n = effects.get(&id).copied().unwrap_or(0);
        let reasons = dead.remove(&id).unwrap_or_default();
        check_message(world, &seen, i, n, &reasons, drained, &mut violations);
    }
    for (id, reasons) in dead {
        violations.push(format!(
            "{id}: unknown message dead-lettered on orders ({reasons:?}): misrouted"
        ));
    }
    violations.extend(seen.wrong_identity.iter().map(|w| format!("identity: {w}")));
    let (outbox_violations, outbox_again) = check_outbox(world, &effects, drained);
    violations.extend(outbox_violations);
    violations.extend(session_violations);
    if seen.max_running > plan.concurrency {
        violations.push(format!(
            "window: {} handlers at once, concurrency {}",
            seen.max_running, plan.concurrency
        ));
    }
    (violations, outbox_again)
}

/// One planned message's invariants: at most one effect, never both processed and
/// dead-lettered, not lost once drained, each dead letter for a reason its plan allows.
fn check_message(
    world: &World,
    seen: &handler::Seen,
    i: usize,
    n: u32,
    reasons: &[String],
    drained: bool,
    violations: &mut Vec<String>,
) {
    let plan = &world.plan;
    let id = format!("m-{i}");
    let (_, panics, transients) = seen.attempts.get(&id).copied().unwrap_or_default();
    // A commit made to fail (a deadlock victim, a broken connection) is the message's own
    // transient failure, not a systemic one: retrying it may exhaust its retries.
    let transients = transients + world.store.faults.failed_commits(&id);
    if n > 1 {
        violations.push(format!("{id}: {n} business effects"));
    }
    // Never both, whatever the copies: a message the producer sent twice is two broker
    // messages with their own retries and panic counts (as is a delayed retry's copy beside an
    // original whose completion failed), but a dead letter decided by a copy's history
    // (`RetriesExhausted`, `HandlerPanicked`) is recorded as the message's inbox row first, so
    // its twin meets it (seeds 1326, 1568 needed an allowance for producer duplicates before
    // those verdicts; they pass without it).
    // With retention's short horizon the broker expires a copy left unsettled (a completion
    // that failed, a twin) and dead-letters one redelivered too often: its rules, which no
    // runtime can prevent, beside the one effect.
    let broker_rule = |r: &String| {
        plan.retention && (r == "TTLExpiredException" || r == "MaxDeliveryCountExceeded")
    };
    if n > 0 && reasons.iter().any(|r| !broker_rule(r)) {
        violations.push(format!("{id}: processed and dead-lettered ({reasons:?})"));
    }
    // Several dead letters of one message are its several broker copies (planned
    // duplicates, a send retried after its answer was lost, delayed-retry copies): each
    // is judged by its reason below.
    if drained && n == 0 && reasons.is_empty() {
        violations.push(format!("{id}: lost (neither processed nor dead-lettered)"));
    }
    for reason in reasons {
        let allowed = match reason.as_str() {
            "InvalidPayload" => plan.poison.contains(&i),
            // Dead-lettered on the delivery numbered `MAX_PANICS` or later that panicked.
            "HandlerPanicked" => {
                (panics >= 1 || plan.upcast_panicky.contains(&i)) && !plan.poison.contains(&i)
            }
            // The error its handler swallowed is a CHECK violation: permanent.
            "PermanentStoreError" => plan.swallowing.contains(&i),
            // Under delayed retries a panic is retried as a transient failure is.
            "RetriesExhausted" => transients + panics > 0 || plan.upcast_panicky.contains(&i),
            // With retention's short horizon `orders` expires messages and dead-letters at a
            // low delivery count: the broker's rules, whatever the runtime does.
            "TTLExpiredException" | "MaxDeliveryCountExceeded" => plan.retention,
            _ => false,
        };
        if !allowed {
            violations.push(format!(
                "{id}: dead-lettered {reason} (panics {panics}, transient errors {transients}, poison {})",
                plan.poison.contains(&i)
            ));
        }
    }
    if plan.swallowing.contains(&i) && n > 0 {
        violations.push(format!(
            "{id}: committed although its handler swallowed a failed statement"
        ));
    }
    if plan.poison.contains(&i) && n > 0 {
        violations.push(format!("{id}: poison processed"));
    }
}

/// Session order: each session's messages took effect in the order they were sent, which is
/// their index order (the producer sends one message at a time, each once the broker took the
/// one before). Effects are numbered as they are written, and SQLite has one writer, so their
/// numbers are their commit order.
async fn check_session_order(world: &World) -> Vec<String> {
    let plan = &world.plan;
    if plan.sessions.is_none() {
        return Vec::new();
    }
    let committed: Vec<String> = world
        .store
        .inner
        .with_connection(|c| {
            let mut stmt = c.prepare("SELECT id FROM sim_effects ORDER BY seq")?;
            let rows = stmt.query_map([], |r| r.get::<_, String>(0))?;
            rows.collect::<rusqlite::Result<Vec<_>>>()
        })
        .await
        .unwrap_or_default();
    session_order(plan, &committed)
}

/// The session order violations of effects `committed` in that order (logical ids): a message
/// that took effect after one of its session sent after it.
pub fn session_order(plan: &Plan, committed: &[String]) -> Vec<String> {
    let mut latest: BTreeMap<String, usize> = BTreeMap::new();
    let mut violations = Vec::new();
    for i in committed.iter().filter_map(|id| plan.index_of(id)) {
        let Some(session) = plan.session(i) else {
            continue;
        };
        match latest.get(&session) {
            Some(&after) if after > i => violations.push(format!(
                "session order: in {session}, m-{i} took effect after m-{after}, which was sent after it"
            )),
            _ => {
                latest.insert(session, i);
            }
        }
    }
    violations
}

/// Every committed outbox row reaches its own destination, and nothing else arrives there:
/// no row in the wrong queue (a misroute), none of a message that never took effect (a row of
/// a rolled-back transaction relayed), and once drained none missing (lost). A row sent again
/// (its send's answer lost, or its process crashed before marking it) arrives twice under its
/// one id: the relay is at-least-once and the emulator has no duplicate detection (which is
/// what makes that "once" on Service Bus), so those are allowed and counted (returned, and in
/// the trace).
fn check_outbox(
    world: &World,
    effects: &BTreeMap<String, u32>,
    drained: bool,
) -> (Vec<String>, usize) {
    let seed = world.plan.seed;
    let mut violations = Vec::new();
    let mut arrived: BTreeSet<String> = BTreeSet::new();
    let mut again = 0usize;
    for dest in ["out-a", "out-b"] {
        for m in peek_all(world, dest) {
            let id = m.message.message_id.clone().unwrap_or_default();
            match id.strip_suffix(":out") {
                Some(source) if handler::destination(seed, source) == dest => {
                    again += usize::from(!arrived.insert(source.to_owned()));
                    if !effects.contains_key(source) {
                        violations.push(format!(
                            "{dest}: {id:?} relayed, but {source} never took effect (a row of a rolled-back transaction)"
                        ));
                    }
                }
                _ => violations.push(format!("{dest}: misrouted message {id:?}")),
            }
        }
    }
    world
        .trace
        .push(format!("outbox: {again} rows arrived again under their id"));
    if drained {
        for id in effects.keys() {
            if !arrived.contains(id) {
                violations.push(format!(
                    "{id}: outbox row never reached {}",
                    handler::destination(seed, id)
                ));
            }
        }
    }
    (violations, again)
}
