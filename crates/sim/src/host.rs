//! The consumer's process: the bare `Runtime` and relay, or `sb_inbox`'s `Worker` (which hosts
//! them as users run it), started on the world's durable state; crashed as a SIGKILL would and
//! restarted (`SIM_FAULTS=process`).

use std::sync::Arc;
use std::time::Duration;

use sb_inbox::relay::{Relay, RelayConfig};
use sb_inbox::retention::RetentionConfig;
use sb_inbox::runtime::{DelayedRetry, JitterSource, RetryPolicy, SessionConfig};
use sb_inbox::servicebus::{ServiceBusClient, ServiceBusSenderPort, ServiceBusSessionSource};
use sb_inbox::worker::{ConsumerConfig, Readiness, ReplayHorizon, Worker};
use sb_inbox::{Circuit, CircuitPhase, ConsumerName, Runtime, RuntimeConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::handler::{self, SimHandler};
use crate::plan;
use crate::process::Life;
use crate::store::FaultyStore;
use crate::world::{World, skip_kind};

/// The consumer name.
const CONSUMER: &str = "sim.consumer";
/// Deliveries a handler may panic on before the runtime dead-letters (`max_panics`).
pub const MAX_PANICS: u32 = 3;

/// One incarnation of the consumer's process: its runtime and relay (or its worker) on a
/// client of its own.
pub(crate) struct Process {
    number: u64,
    life: Life,
    /// Its client's salt (the owner of its connections).
    salt: u64,
    shutdown: CancellationToken,
    /// The runtime's and the relay's tasks, or the worker's.
    tasks: Vec<JoinHandle<()>>,
    /// Its kill switch.
    pub(crate) switch: Switch,
}

/// How a process's kill switch is watched: the bare runtime's own handle, or the worker's
/// readiness (the `circuit:` condition of `/readyz`), as an operator sees it.
#[derive(Debug, Clone)]
pub(crate) enum Switch {
    Runtime(Circuit),
    Worker(Readiness),
}

impl Switch {
    /// Why the switch still holds deliveries back for want of a store answer (open, probing
    /// the store), or `None` (closed, or the probe passed and a trial delivery may start).
    pub(crate) async fn open(&self) -> Option<String> {
        match self {
            Switch::Runtime(circuit) => (circuit.phase() == CircuitPhase::Open)
                .then(|| circuit.problem().unwrap_or_default()),
            Switch::Worker(readiness) => readiness
                .not_ready()
                .await
                .into_iter()
                .find(|(name, why)| name.starts_with("circuit:") && why.contains("probing"))
                .map(|(_, why)| why),
        }
    }

    /// How often it tripped and its finished pauses (the bare runtime's; the worker does not
    /// show them).
    pub(crate) fn trips(&self) -> String {
        match self {
            Switch::Runtime(circuit) => {
                let (trips, paused) = circuit.trips();
                format!("kill switch tripped {trips} times, paused {paused:?}")
            }
            Switch::Worker(_) => "kill switch (worker): trips not shown".to_owned(),
        }
    }
}

/// What a process is made of.
struct Parts {
    client: ServiceBusClient,
    store: FaultyStore,
    handler: SimHandler,
    clock: sb_inbox::Clock,
    shutdown: CancellationToken,
}

/// A process's tasks and its kill switch.
type Started = (Vec<JoinHandle<()>>, Switch);

impl Process {
    /// Starts process `number` on the run's durable state (the broker, the database): a new
    /// client, runtime and relay (or worker), with clocks reading the run's time.
    pub(crate) fn start(
        world: &Arc<World>,
        handler: &SimHandler,
        number: u64,
    ) -> Result<Process, String> {
        let life = Life::new();
        // The first process's client keeps the salt (and jitter seed) of the runs before crashes.
        let salt = if number == 0 { 1 } else { 100 + number };
        let parts = Parts {
            client: world
                .client(salt, life.clone())
                .map_err(|e| format!("client: {e}"))?,
            store: world.store.for_process(life.clone()),
            handler: handler.for_process(life.clone()),
            clock: sb_inbox::Clock::starting_at(world.anchor + world.start.elapsed()),
            shutdown: CancellationToken::new(),
        };
        let shutdown = parts.shutdown.clone();
        let (tasks, switch) = if world.plan.worker {
            worker(world, parts).map_err(|e| format!("worker: {e}"))?
        } else {
            bare(world, parts).map_err(|e| format!("runtime: {e}"))?
        };
        let host = if world.plan.worker {
            "worker"
        } else {
            "runtime"
        };
        world
            .trace
            .push(format!("process {number} started ({host})"));
        Ok(Process {
            number,
            life,
            salt,
            shutdown,
            tasks,
            switch,
        })
    }

    /// Kills the process as a SIGKILL would: no drain, no settlement. Its store handle and
    /// connections die first, so that nothing its tasks do from now on reaches the world
    /// (`crate::process`); then its runtime's and relay's tasks are dropped mid-await.
    fn kill(self, world: &World) -> String {
        let rolled_back = self.life.kill();
        let cut = world.net.cut_owner(self.salt);
        for task in &self.tasks {
            task.abort();
        }
        format!(
            "process {} crashed: {rolled_back} open transactions rolled back, {cut} connections cut; {}",
            self.number,
            self.switch.trips()
        )
    }

    /// Stops the process as a shutdown does (drain, then the relay's last batch); false when
    /// it did not stop within 120 s.
    pub(crate) async fn stop(self) -> bool {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(120), async {
            for task in self.tasks {
                let _ = task.await;
            }
        })
        .await
        .is_ok()
    }
}

/// The relay's settings: a short poll, so that a run's rows go out within it.
fn relay_config() -> RelayConfig {
    RelayConfig::default().with_poll_interval(Duration::from_millis(500))
}

/// The bare `Runtime` and a `Relay` beside it, each a task.
fn bare(world: &World, parts: Parts) -> Result<Started, Box<dyn std::error::Error>> {
    let Parts {
        client,
        store,
        handler,
        clock,
        shutdown,
    } = parts;
    let mut config = runtime_config(&world.plan)?;
    let router = handler::router(handler, world.trace.clone())?;
    if let Some(sessions) = session_config(&world.plan) {
        let source = ServiceBusSessionSource::new(client.clone(), "orders");
        let runtime =
            Runtime::for_sessions_with_clock(source, store.clone(), router, config, clock);
        let switch = Switch::Runtime(runtime.circuit());
        let running = tokio::spawn({
            let shutdown = shutdown.clone();
            let trace = world.trace.clone();
            async move {
                if let Err(e) = runtime.run_sessions(sessions, shutdown).await {
                    trace.push(format!("runtime failed: {e}"));
                }
            }
        });
        let relay = Relay::with_clock(
            store,
            ServiceBusSenderPort::new(client),
            relay_config(),
            clock,
        );
        let relaying = tokio::spawn(async move { relay.run(shutdown).await });
        return Ok((vec![running, relaying], switch));
    }
    if world.plan.delayed_retry {
        config.delayed_retry = Some(DelayedRetry::new(
            retry_policy(&world.plan)?,
            ServiceBusSenderPort::new(client.clone()),
            "orders",
        ));
    }
    let held = u32::try_from(config.held()).unwrap_or(u32::MAX);
    let receiver = client.receiver("orders", 0).with_capacity(held);
    let runtime = Runtime::with_clock(receiver, store.clone(), router, config, clock);
    let switch = Switch::Runtime(runtime.circuit());
    let running = tokio::spawn({
        let shutdown = shutdown.clone();
        let trace = world.trace.clone();
        async move {
            if let Err(e) = runtime.run(shutdown).await {
                trace.push(format!("runtime failed: {e}"));
            }
        }
    });
    let relay = Relay::with_clock(
        store,
        ServiceBusSenderPort::new(client),
        relay_config(),
        clock,
    );
    let relaying = tokio::spawn(async move { relay.run(shutdown).await });
    Ok((vec![running, relaying], switch))
}

/// `sb_inbox`'s `Worker` hosting the consumer as users run it: its start checks, its relay,
/// retention, delayed retries when planned, and its self-sizing receive window when the plan's
/// prefetch is 0. Retention's horizon is `orders`' as configured ([`replay_horizon`]): by
/// default an hour's TTL plus a thousand 10 s locks plus the resubmission window, longer than
/// any run (it sweeps and deletes nothing); with [`plan::Plan::retention`] a short one, which
/// passes within a run.
fn worker(world: &World, parts: Parts) -> Result<Started, Box<dyn std::error::Error>> {
    let Parts {
        client,
        store,
        handler,
        clock,
        shutdown,
    } = parts;
    let mut consumer = ConsumerConfig::new(ConsumerName::new(CONSUMER)?, "orders");
    consumer.runtime = runtime_config(&world.plan)?;
    let horizon = replay_horizon(&world.plan);
    let mut retention = RetentionConfig::new(horizon.span());
    retention.interval = Duration::from_secs(if world.plan.retention { 10 } else { 20 });
    let readiness = Readiness::new();
    let mut worker = Worker::new(client, store)
        .readiness(readiness.clone())
        .consumer(consumer, handler::router(handler, world.trace.clone())?)
        .relay(relay_config())
        .retention(retention, horizon)
        .clock(clock);
    if world.plan.delayed_retry {
        worker = worker.delayed_retries(retry_policy(&world.plan)?);
    }
    if let Some(sessions) = session_config(&world.plan) {
        worker = worker.sessions(sessions);
    }
    let trace = world.trace.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = worker.run(shutdown).await {
            trace.push(format!("worker failed: {e}"));
        }
    });
    Ok((vec![task], Switch::Worker(readiness)))
}

/// The replay horizon of `orders` as the plan configures it: its TTL, lock duration and max
/// delivery count, the delayed retries' span (retries × the longest delay), and, with
/// retention, no resubmission window (nothing in a run resubmits a dead letter).
pub(crate) fn replay_horizon(plan: &plan::Plan) -> ReplayHorizon {
    let (ttl, max_delivery) = plan.orders_limits();
    let retry_span = if plan.delayed_retry {
        plan::RETRY_MAX_DELAY.saturating_mul(plan.retries)
    } else {
        Duration::ZERO
    };
    let horizon = ReplayHorizon::new(
        ttl.unwrap_or(sb_emulator::DEFAULT_MESSAGE_TIME_TO_LIVE),
        plan::LOCK_DURATION,
        max_delivery,
    )
    .with_retry_span(retry_span);
    if plan.retention {
        horizon.with_dlq_resubmit_window(Duration::ZERO)
    } else {
        horizon
    }
}

/// The process now running, if any (none between a crash and its restart).
pub(crate) type Current = Arc<std::sync::Mutex<Option<Process>>>;

pub(crate) fn current(current: &Current) -> std::sync::MutexGuard<'_, Option<Process>> {
    current
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Crashes the consumer's process at the plan's instants, and restarts it after its downtime.
pub(crate) async fn crash_and_restart(world: Arc<World>, handler: SimHandler, running: Current) {
    for (n, (at, down)) in world.plan.crashes.iter().enumerate() {
        tokio::time::sleep_until(world.start + *at).await;
        if skip_kind("process") {
            world.trace.push("crash skipped (SIM_SKIP)");
            continue;
        }
        let killed = current(&running).take();
        if let Some(process) = killed {
            world.trace.push(process.kill(&world));
        }
        tokio::time::sleep(*down).await;
        let number = u64::try_from(n).unwrap_or(u64::MAX).saturating_add(1);
        match Process::start(&world, &handler, number) {
            Ok(process) => *current(&running) = Some(process),
            Err(e) => world
                .trace
                .push(format!("process {number} did not start: {e}")),
        }
    }
}

/// The runtime's settings from the plan (delayed retries apart).
fn runtime_config(plan: &plan::Plan) -> Result<RuntimeConfig, Box<dyn std::error::Error>> {
    let mut config = RuntimeConfig::new(ConsumerName::new(CONSUMER)?);
    config.concurrency = plan.concurrency;
    config.prefetch = plan.prefetch;
    config.batch_size = plan.batch_size;
    config.lock_margin = Duration::from_secs(3);
    config.lock_duration = Some(plan::LOCK_DURATION);
    config.max_panics = MAX_PANICS;
    config.jitter = JitterSource::seeded(plan.seed ^ 0x1177e7);
    Ok(config)
}

/// Session mode's settings from the plan, in session mode; a short idle, so that a session's
/// slot moves on to the others within a run.
fn session_config(plan: &plan::Plan) -> Option<SessionConfig> {
    let (_, at_once) = plan.sessions?;
    Some(
        SessionConfig::default()
            .with_max_sessions(at_once)
            .with_idle(Duration::from_secs(2)),
    )
}

/// The delayed retries' policy from the plan.
fn retry_policy(plan: &plan::Plan) -> Result<RetryPolicy, Box<dyn std::error::Error>> {
    Ok(
        RetryPolicy::new(plan.retries, Duration::from_secs(1), plan::RETRY_MAX_DELAY)?
            .with_jitter(0.2, JitterSource::seeded(plan.seed ^ 0x7e7))?,
    )
}
