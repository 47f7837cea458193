//! [`Worker`]: one process hosting one or more consumers over one Service Bus client and one
//! store, with the outbox relay, retention, health endpoints, telemetry and drain shared.

use std::fmt;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::consumer::ConsumerConfig;
use super::error::{HostingError, WorkerError};
use super::health::{self, Commits, Ping, Readiness};
use super::horizon::ReplayHorizon;
use crate::envelope::Contract;
use crate::ports::{OutboxStore, RetentionStore, Store};
use crate::relay::{Relay, RelayConfig};
use crate::retention::{RetentionConfig, RetentionTask};
use crate::runtime::{
    Clock, ConsumerName, Handler, Runtime, RuntimeConfig, RuntimeError, StatsSnapshot,
};
use crate::runtime::{DelayedRetry, RetryPolicy, SessionConfig};
use crate::servicebus::{
    ServiceBusClient, ServiceBusReceiver, ServiceBusSenderPort, ServiceBusSessionSource, window,
};
use crate::telemetry;

/// How long the relay and retention get to finish their current batch after the runtime has
/// drained: one send's timeout and a little. A relay stopped harder only causes duplicates.
pub const BACKGROUND_STOP: Duration = Duration::from_secs(35);

/// What each hosted consumer did, in the order they were added.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Each consumer's counters.
    pub consumers: Vec<(ConsumerName, StatsSnapshot)>,
}

impl WorkerStats {
    /// The counters of consumer `name`, if hosted.
    pub fn consumer(&self, name: &str) -> Option<&StatsSnapshot> {
        self.consumers
            .iter()
            .find(|(consumer, _)| consumer.as_str() == name)
            .map(|(_, stats)| stats)
    }

    /// All consumers' counters added up.
    pub fn total(&self) -> StatsSnapshot {
        let mut total = StatsSnapshot::default();
        for (_, stats) in &self.consumers {
            total += *stats;
        }
        total
    }
}

type Started = JoinHandle<Result<StatsSnapshot, RuntimeError>>;
type Start<S> = Box<
    dyn FnOnce(Feed, S, RuntimeConfig, Clock, Readiness, Commits, CancellationToken) -> Started
        + Send,
>;

/// Where a hosted consumer's deliveries come from.
enum Feed {
    Plain(ServiceBusReceiver),
    Sessions(ServiceBusSessionSource, SessionConfig),
}

struct Hosted<S> {
    config: ConsumerConfig,
    start: Start<S>,
    // Found when the handler was added (its contracts are not kept); refused by `run`.
    envelope_problem: Option<HostingError>,
}

/// A worker hosting one or more consumers in one process.
///
/// Each consumer has its own entity, consumer name (its inbox key), handler, concurrency and
/// prefetch; all share one [`ServiceBusClient`] (one AMQP connection) and one store. Beside them
/// run the outbox relay (always: any row in the outbox is published), retention when
/// configured, and the `/healthz` and `/readyz` endpoints when given a listener. On `shutdown`
/// every consumer drains (in-flight deliveries finish within their grace, prefetched ones are
/// released), then the relay and retention finish their batch.
///
/// The reference worker (`sb-inbox run`, in the `sb-inbox-cli` crate) is built on it, from
/// `worker.toml`.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example<H1, H2>(orders: H1, payments: H2) -> Result<(), Box<dyn std::error::Error>>
/// # where H1: sb_inbox::Handler<sb_inbox::PgTx>, H2: sb_inbox::Handler<sb_inbox::PgTx> {
/// use sb_inbox::servicebus::ServiceBusClient;
/// use sb_inbox::worker::{ConsumerConfig, Worker};
/// use sb_inbox::{ConsumerName, PgStore};
///
/// let client = ServiceBusClient::from_connection_string(&"Endpoint=sb://…".parse()?);
/// let store = PgStore::connect("postgres://postgres@127.0.0.1/app", 10).await?;
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// let stats = Worker::new(client, store)
///     .consumer(ConsumerConfig::new(ConsumerName::new("shop.orders")?, "orders"), orders)
///     .consumer(
///         ConsumerConfig::new(ConsumerName::new("shop.payments")?, "payments").with_concurrency(2),
///         payments,
///     )
///     .run(shutdown)
///     .await?;
/// println!("{:?}", stats.total());
/// # Ok(()) }
/// ```
pub struct Worker<S> {
    client: ServiceBusClient,
    store: S,
    consumers: Vec<Hosted<S>>,
    relay: RelayConfig,
    retention: Option<(RetentionConfig, ReplayHorizon)>,
    retry: Option<RetryPolicy>,
    sessions: Option<SessionConfig>,
    health: Option<TcpListener>,
    readiness: Readiness,
    clock: Option<Clock>,
}

impl<S> fmt::Debug for Worker<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field(
                "consumers",
                &self.consumers.iter().map(|c| &c.config).collect::<Vec<_>>(),
            )
            .field("relay", &self.relay)
            .field("retention", &self.retention)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl<S> Worker<S>
where
    S: Store + OutboxStore + RetentionStore + Ping + Clone,
{
    /// A worker over `client` and `store`, with no consumers yet, the default relay, no
    /// retention, no delayed retries and no health endpoints. The store must be migrated and
    /// its pool large enough for every consumer's concurrency, plus two.
    pub fn new(client: ServiceBusClient, store: S) -> Self {
        Worker {
            client,
            store,
            consumers: Vec::new(),
            relay: RelayConfig::default(),
            retention: None,
            retry: None,
            sessions: None,
            health: None,
            readiness: Readiness::new(),
            clock: None,
        }
    }

    /// Hosts `handler` as the consumer `config` describes.
    #[must_use]
    pub fn consumer<H: Handler<S::Tx>>(mut self, config: ConsumerConfig, handler: H) -> Self {
        let envelope_problem = envelope_problem(&config, handler.contracts());
        let start: Start<S> = Box::new(
            move |feed, store, runtime_config, clock, readiness, commits, stop| {
                tokio::spawn(async move {
                    let name = runtime_config.consumer.to_string();
                    match feed {
                        Feed::Plain(receiver) => {
                            let runtime = Runtime::with_clock(
                                receiver.clone(),
                                store,
                                handler,
                                runtime_config,
                                clock,
                            );
                            probe(&runtime, &readiness, &commits, &name);
                            let result = runtime.run(stop.clone()).await;
                            // One consumer failing for good stops the others: the process restarts
                            // whole.
                            if result.is_err() {
                                stop.cancel();
                            }
                            receiver.close().await;
                            result.map(|()| runtime.stats().snapshot())
                        }
                        Feed::Sessions(source, sessions) => {
                            let runtime = Runtime::for_sessions_with_clock(
                                source,
                                store,
                                handler,
                                runtime_config,
                                clock,
                            );
                            probe(&runtime, &readiness, &commits, &name);
                            let result = runtime.run_sessions(sessions, stop.clone()).await;
                            if result.is_err() {
                                stop.cancel();
                            }
                            result.map(|()| runtime.stats().snapshot())
                        }
                    }
                })
            },
        );
        self.consumers.push(Hosted {
            config,
            start,
            envelope_problem,
        });
        self
    }

    /// The outbox relay's settings.
    #[must_use]
    pub fn relay(mut self, relay: RelayConfig) -> Self {
        self.relay = relay;
        self
    }

    /// Deletes inbox and dispatched outbox rows past the retention, which must cover the
    /// entities' replay `horizon` (the longest of the hosted entities'): [`Worker::run`] refuses
    /// to start otherwise, since an inbox row deleted before its message can no longer come
    /// back is what lets a late redelivery take effect twice.
    #[must_use]
    pub fn retention(mut self, retention: RetentionConfig, horizon: ReplayHorizon) -> Self {
        self.retention = Some((retention, horizon));
        self
    }

    /// Delayed retries for transient failures: each consumer's copies go back to its own
    /// entity, which must be a queue.
    #[must_use]
    pub fn delayed_retries(mut self, policy: RetryPolicy) -> Self {
        self.retry = Some(policy);
        self
    }

    /// Session mode for every consumer: each entity must require sessions, and messages of
    /// one session are handled one at a time, in order (see [`Runtime::run_sessions`]).
    /// Delayed retries are refused with it.
    #[must_use]
    pub fn sessions(mut self, sessions: SessionConfig) -> Self {
        self.sessions = Some(sessions);
        self
    }

    /// Serves `/healthz` and `/readyz` on `listener` while the worker runs.
    #[must_use]
    pub fn health(mut self, listener: TcpListener) -> Self {
        self.health = Some(listener);
        self
    }

    /// Reports on `readiness` instead of a readiness of its own: when it runs, the worker adds
    /// its `broker` and `store` probes to it (replacing conditions of those names) and leaves
    /// the caller's other conditions in place. For a caller that serves `/readyz` itself before
    /// the worker exists (e.g. while the store is still being opened, as `sb-inbox run` does).
    #[must_use]
    pub fn readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Reads `clock` instead of the system's, in every hosted runtime, the relay and retention:
    /// a deterministic simulation (`crates/sim`) runs the worker on tokio's paused clock
    /// anchored where the broker's clock starts.
    #[must_use]
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = Some(clock);
        self
    }

    /// Runs every consumer until `shutdown` (or until one fails for good), drains them all,
    /// then stops the relay and retention.
    ///
    /// # Errors
    /// [`WorkerError::Config`] with no consumer, two with one name or on one entity (different
    /// subscriptions of a topic are different entities), or delayed retries on a
    /// subscription; [`WorkerError::Retention`] when the retention does not cover the replay
    /// horizon; [`WorkerError::Runtime`] when a receiver fails for good (the other consumers
    /// are drained first).
    pub async fn run(self, shutdown: CancellationToken) -> Result<WorkerStats, WorkerError> {
        let Worker {
            client,
            store,
            consumers,
            relay,
            retention,
            retry,
            sessions,
            health,
            readiness,
            clock,
        } = self;
        let clock = clock.unwrap_or_default();
        check(&consumers, retry.as_ref(), sessions.is_some())?;
        // Here, not only in the configuration: a worker built in code deletes rows too.
        let retention = match retention {
            Some((retention, horizon)) => {
                horizon.check(retention.retention)?;
                Some(retention)
            }
            None => None,
        };
        // The relay and retention serve the whole store, so every hosted consumer's series
        // carries their readings under its own name: a dashboard filtered to any one consumer
        // shows its worker's outbox; added across consumers the same rows would count twice.
        let names: Vec<String> = consumers
            .iter()
            .map(|c| c.config.name().as_str().to_owned())
            .collect();
        let background = Background::start(&client, &store, relay, retention, clock, &names);
        let commits = Commits::default();
        readiness.probe("store", {
            let (store, commits) = (store.clone(), commits.clone());
            move || {
                let (store, last) = (store.clone(), commits.last());
                async move { health::store_ready(&store, last).await }
            }
        });
        let _stop_health = health::serve_while(health, &readiness);
        let stop = shutdown.child_token();
        let shared = Shared {
            client: &client,
            store: &store,
            retry: retry.as_ref(),
            sessions: sessions.as_ref(),
            readiness: &readiness,
            commits: &commits,
            stop: &stop,
            clock,
        };
        let (running, receivers) = shared.start(consumers);
        // Not ready while a receive link re-attaches after the service detached it.
        readiness.probe("broker", {
            let client = client.clone();
            move || {
                let ready = client.is_connected() && receivers.iter().all(|r| r.is_attached());
                async move {
                    ready.then_some(()).ok_or_else(|| {
                        "not connected to Service Bus, or a receive link is re-attaching".to_owned()
                    })
                }
            }
        });
        let result = collect(running, &stop).await;
        background.stop().await;
        result
    }

    /// [`Worker::run`] until the process receives SIGTERM or SIGINT (see [`shutdown_signal`]),
    /// then drains: in-flight deliveries finish and are settled, prefetched ones are released,
    /// so a rolling deploy leaves nothing to come back by lock expiry.
    ///
    /// # Errors
    /// As [`Worker::run`], and [`WorkerError::Signal`] when the signal handlers cannot be
    /// installed.
    ///
    /// [`shutdown_signal`]: super::shutdown_signal
    pub async fn run_until_shutdown(self) -> Result<WorkerStats, WorkerError> {
        let shutdown = super::shutdown_signal()?;
        self.run(shutdown).await
    }
}

/// The relay and retention beside the consumers, with the gauges that read them.
struct Background {
    tasks: Vec<JoinHandle<()>>,
    // They stop after the drain, or when the worker's future is dropped.
    stop: tokio_util::sync::DropGuard,
    _outbox_gauges: telemetry::hooks::OutboxGauges,
    _retention_counter: Option<telemetry::hooks::RetentionCounter>,
}

impl Background {
    /// Starts the relay (always) and retention (when configured) over `store`, reported under
    /// every consumer's `names`.
    fn start<S>(
        client: &ServiceBusClient,
        store: &S,
        relay: RelayConfig,
        retention: Option<RetentionConfig>,
        clock: Clock,
        names: &[String],
    ) -> Self
    where
        S: OutboxStore + RetentionStore + Clone,
    {
        let stop_background = CancellationToken::new();
        let relay = Relay::with_clock(
            store.clone(),
            ServiceBusSenderPort::new(client.clone()),
            relay,
            clock,
        );
        // They read the relay's last backlog sample and live as long as the worker.
        let relay_stats = relay.stats();
        let _outbox_gauges = telemetry::hooks::observe_outbox(names, move || {
            relay_stats.snapshot().backlog.unwrap_or_default()
        });
        let mut _retention_counter = None;
        let mut background = vec![tokio::spawn({
            let stop = stop_background.clone();
            async move { relay.run(stop).await }
        })];
        if let Some(retention) = retention {
            let task = RetentionTask::with_clock(store.clone(), retention, clock);
            let stats = task.stats();
            _retention_counter = Some(telemetry::hooks::observe_retention(names, move || {
                stats.snapshot().inbox_deleted
            }));
            let stop = stop_background.clone();
            background.push(tokio::spawn(async move { task.run(stop).await }));
        }
        Background {
            tasks: background,
            stop: stop_background.drop_guard(),
            _outbox_gauges,
            _retention_counter,
        }
    }

    /// Stops the tasks and waits for them to finish their batch.
    async fn stop(self) {
        let Background { tasks, stop, .. } = self;
        drop(stop);
        stop_tasks(tasks).await;
    }
}

/// What every hosted consumer shares.
struct Shared<'a, S> {
    client: &'a ServiceBusClient,
    store: &'a S,
    retry: Option<&'a RetryPolicy>,
    sessions: Option<&'a SessionConfig>,
    readiness: &'a Readiness,
    commits: &'a Commits,
    stop: &'a CancellationToken,
    clock: Clock,
}

impl<S: Clone> Shared<'_, S> {
    /// Starts each consumer on its feed; returns their tasks and the plain receivers (whose
    /// links the broker probe watches).
    fn start(
        &self,
        consumers: Vec<Hosted<S>>,
    ) -> (Vec<(ConsumerName, Started)>, Vec<ServiceBusReceiver>) {
        let mut running = Vec::with_capacity(consumers.len());
        let mut receivers = Vec::with_capacity(consumers.len());
        for Hosted { config, start, .. } in consumers {
            let mut runtime = config.runtime;
            if let Some(policy) = self.retry {
                runtime.delayed_retry = Some(DelayedRetry::new(
                    policy.clone(),
                    ServiceBusSenderPort::new(self.client.clone()),
                    config.entity.clone(),
                ));
            }
            // The link keeps what the runtime holds in flight (its slots plus its prefetch):
            // each delivery arrives with a slot waiting for it, which keeps its lock from
            // receipt, and the broker's distance costs a round trip per window, not per message.
            // Without a prefetch the window sizes itself (sb_servicebus::window) between the
            // slots and the ceiling, and the runtime holds up to that ceiling.
            let auto = self.sessions.is_none() && runtime.prefetch == 0;
            let slots = runtime.held();
            if auto {
                runtime.prefetch = auto_ceiling(slots).saturating_sub(slots);
            }
            let feed = match self.sessions {
                Some(sessions) => Feed::Sessions(
                    ServiceBusSessionSource::new(self.client.clone(), &config.entity),
                    sessions.clone(),
                ),
                None => {
                    let capacity = u32::try_from(runtime.held()).unwrap_or(u32::MAX);
                    let mut receiver = self
                        .client
                        .receiver(&config.entity, 0)
                        .with_capacity(capacity);
                    if auto {
                        receiver =
                            receiver.with_auto_window(u32::try_from(slots).unwrap_or(u32::MAX));
                    }
                    receivers.push(receiver.clone());
                    Feed::Plain(receiver)
                }
            };
            tracing::info!(entity = %config.entity, consumer = %runtime.consumer, envelope = runtime.envelope.kind(), delayed_retries = self.retry.map_or(0, RetryPolicy::max_retries), "Consumer started.");
            let name = runtime.consumer.clone();
            let task = start(
                feed,
                self.store.clone(),
                runtime,
                self.clock,
                self.readiness.clone(),
                self.commits.clone(),
                self.stop.clone(),
            );
            running.push((name, task));
        }
        (running, receivers)
    }
}

/// The most a self-sizing receive window may reach for a runtime handling `slots` deliveries
/// at once: [`window::AUTO_WINDOW_CEILING`], or twice the slots when that is more.
fn auto_ceiling(slots: usize) -> usize {
    let ceiling = usize::try_from(window::AUTO_WINDOW_CEILING).unwrap_or(usize::MAX);
    ceiling.max(slots.saturating_mul(2))
}

/// Waits for every consumer; the first failure wins, after all have drained.
async fn collect(
    running: Vec<(ConsumerName, Started)>,
    stop: &CancellationToken,
) -> Result<WorkerStats, WorkerError> {
    let mut stats = WorkerStats::default();
    let mut failure = None;
    for (name, task) in running {
        match task.await {
            Ok(Ok(snapshot)) => {
                tracing::info!(consumer = %name, stats = ?snapshot, "Consumer stopped.");
                stats.consumers.push((name, snapshot));
            }
            Ok(Err(error)) => {
                failure.get_or_insert(WorkerError::Runtime(error));
            }
            Err(join) => {
                stop.cancel();
                failure.get_or_insert(WorkerError::Consumer { name, source: join });
            }
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(stats),
    }
}

/// The consumer's readiness conditions: its store fitness, its kill switch and its stuck handler
/// slots; its
/// commits show the store works even when its pool has no free connection.
fn probe<R, S, H>(
    runtime: &Runtime<R, S, H>,
    readiness: &Readiness,
    commits: &Commits,
    name: &str,
) {
    commits.add(runtime.store_health());
    // Not ready while the store refuses this consumer's statements (code rolled
    // out before `migrate`, a missing grant) or while handler slots are stuck
    // past the maximum processing time.
    let health = runtime.store_health();
    readiness.probe(&format!("store_schema:{name}"), move || {
        let problem = health.problem();
        async move { problem.map_or(Ok(()), Err) }
    });
    // Not ready while the kill switch holds deliveries back: says why, and how long.
    let circuit = runtime.circuit();
    readiness.probe(&format!("circuit:{name}"), move || {
        let paused = circuit.problem();
        async move { paused.map_or(Ok(()), Err) }
    });
    let slots = runtime.slots();
    readiness.probe(&format!("slots:{name}"), move || {
        let stuck = slots.stuck();
        async move {
            match stuck {
                0 => Ok(()),
                n => Err(format!(
                    "{n} handler slots stuck past the maximum processing time"
                )),
            }
        }
    });
}

/// Refuses what cannot run: no consumer, one name twice (they would share an inbox key), two
/// names on one entity (a redelivery to the other would apply the effect again), a
/// delayed retry whose copy would go to a topic, delayed retries in session mode.
fn check<S>(
    consumers: &[Hosted<S>],
    retry: Option<&RetryPolicy>,
    sessions: bool,
) -> Result<(), WorkerError> {
    for (i, hosted) in consumers.iter().enumerate() {
        let name = hosted.config.name();
        if let Some(problem) = &hosted.envelope_problem {
            return Err(problem.clone().into());
        }
        if consumers[..i]
            .iter()
            .any(|other| other.config.name() == name)
        {
            return Err(HostingError::HostedTwice(name.clone()).into());
        }
        if let Some(other) = consumers[..i]
            .iter()
            .find(|other| same_entity(&other.config.entity, &hosted.config.entity))
        {
            return Err(HostingError::SharedEntity {
                first: other.config.name().clone(),
                second: name.clone(),
                entity: hosted.config.entity.clone(),
            }
            .into());
        }
        if retry.is_some() && is_subscription(&hosted.config.entity) {
            return Err(HostingError::RetryOnSubscription {
                name: name.clone(),
                entity: hosted.config.entity.clone(),
            }
            .into());
        }
    }
    if sessions && retry.is_some() {
        return Err(HostingError::RetryWithSessions.into());
    }
    if consumers.is_empty() {
        return Err(HostingError::NoConsumer.into());
    }
    Ok(())
}

/// What makes the consumer's envelope dead-letter messages it was meant to take, known before
/// anything is received: an empty type map, an entry naming a contract the handler does not
/// take, or a contract of the handler no entry maps to. Contracts are matched by name where an
/// entry leaves the version to the envelope; a handler's contract counts as mapped when an
/// entry names any version of it (another version is an upcaster's route, reached by that
/// name's messages).
pub(super) fn envelope_problem(
    config: &ConsumerConfig,
    contracts: &[Contract],
) -> Option<HostingError> {
    let envelope = &config.runtime.envelope;
    let types = envelope.type_map()?;
    let name = config.name().clone();
    if types.is_empty() {
        return Some(HostingError::EmptyTypeMap {
            name,
            kind: envelope.kind(),
        });
    }
    for (type_name, contract, version) in types.entries() {
        let taken = contracts
            .iter()
            .any(|c| c.name() == contract && version.is_none_or(|v| c.version() == v));
        if !taken {
            return Some(HostingError::UnroutedType {
                name,
                type_name: type_name.to_owned(),
                contract: match version {
                    Some(v) => Contract::new(contract, v).to_string(),
                    None => contract.to_owned(),
                },
                accepted: contracts
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
    }
    // A raw envelope's field commonly carries contract names already (`name.vN` resolves to
    // itself), so a route without an entry can still be reached there.
    if envelope.kind() == "raw" {
        return None;
    }
    let unmapped = contracts
        .iter()
        .find(|c| !types.entries().any(|(_, contract, _)| c.name() == contract))?;
    Some(HostingError::UnmappedContract {
        name,
        kind: envelope.kind(),
        contract: unmapped.to_string(),
    })
}

/// Whether two entity paths name the same entity: the broker resolves names
/// case-insensitively (as our emulator does, `crates/emulator/src/address.rs`), and a leading or
/// trailing `/` names the same path. Two subscriptions of one topic are two entities.
fn same_entity(a: &str, b: &str) -> bool {
    a.trim_matches('/')
        .eq_ignore_ascii_case(b.trim_matches('/'))
}

/// Whether `entity` is `TOPIC/Subscriptions/SUBSCRIPTION`.
pub(crate) fn is_subscription(entity: &str) -> bool {
    entity.to_ascii_lowercase().contains("/subscriptions/")
}

/// Waits for the background tasks to finish their batch, at most [`BACKGROUND_STOP`] in all.
async fn stop_tasks(tasks: Vec<JoinHandle<()>>) {
    let deadline = tokio::time::Instant::now() + BACKGROUND_STOP;
    for mut task in tasks {
        match tokio::time::timeout_at(deadline, &mut task).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "A background task failed."),
            Err(_) => {
                tracing::warn!("A background task did not stop in time; aborting it.");
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_entity;

    #[test]
    fn one_entity_however_spelled_two_subscriptions_are_two() {
        assert!(same_entity("orders", "Orders"));
        assert!(same_entity("/orders/", "orders"));
        assert!(same_entity(
            "events/Subscriptions/billing",
            "EVENTS/subscriptions/Billing"
        ));
        assert!(!same_entity(
            "events/Subscriptions/billing",
            "events/Subscriptions/shipping"
        ));
        assert!(!same_entity("orders", "orders-v2"));
    }

    mod envelope {
        #![allow(clippy::unwrap_used)]
        use std::sync::Arc;

        use super::super::{ConsumerConfig, envelope_problem};
        use crate::envelope::Contract;
        use crate::envelope::{MassTransit, NServiceBus, TypeMap};
        use crate::runtime::ConsumerName;
        use crate::worker::HostingError;

        const PLACED: &str = "urn:message:Shop.Contracts:OrderPlaced";

        fn consumer(reader: Arc<dyn crate::envelope::EnvelopeReader>) -> ConsumerConfig {
            ConsumerConfig::new(ConsumerName::new("shop.orders").unwrap(), "orders")
                .with_envelope(reader)
        }

        fn masstransit(pairs: &[(&str, &str)]) -> ConsumerConfig {
            let mut types = TypeMap::new();
            for (type_name, contract) in pairs {
                types.insert(type_name, contract).unwrap();
            }
            consumer(Arc::new(MassTransit::new(types).unwrap()))
        }

        fn placed(version: u32) -> Contract {
            Contract::new("orders.order-placed", version)
        }

        /// An empty map dead-letters everything a MassTransit peer sends: refused.
        #[test]
        fn an_empty_type_map_is_refused() {
            let problem = envelope_problem(&masstransit(&[]), &[placed(1)]);
            assert!(
                matches!(
                    problem,
                    Some(HostingError::EmptyTypeMap {
                        kind: "masstransit",
                        ..
                    })
                ),
                "{problem:?}"
            );
        }

        /// A typo in the map's contract names the type map key and what the handler takes.
        #[test]
        fn a_type_mapped_to_a_contract_no_route_takes_is_refused_naming_the_key() {
            let problem = envelope_problem(
                &masstransit(&[(PLACED, "orders.order-placd.v1")]),
                &[placed(1)],
            )
            .unwrap();
            assert!(
                matches!(&problem, HostingError::UnroutedType { type_name, contract, .. }
                    if type_name == PLACED && contract == "orders.order-placd.v1"),
                "{problem:?}"
            );
            let text = problem.to_string();
            assert!(text.contains(PLACED), "{text}");
            assert!(text.contains("orders.order-placed.v1"), "{text}");
        }

        /// A route no type reaches is refused, naming the contract.
        #[test]
        fn a_route_no_type_reaches_is_refused() {
            let cancelled = Contract::new("orders.order-cancelled", 1);
            let problem = envelope_problem(
                &masstransit(&[(PLACED, "orders.order-placed.v1")]),
                &[placed(1), cancelled],
            );
            assert!(
                matches!(&problem, Some(HostingError::UnmappedContract { contract, .. })
                    if contract == "orders.order-cancelled.v1"),
                "{problem:?}"
            );
        }

        /// An upcaster's older version shares its name with a mapped one; an entry without a
        /// version (NServiceBus) takes every version of its name; the subject envelope has no
        /// map to check.
        #[test]
        fn matching_maps_upcasts_and_the_subject_envelope_pass() {
            let map = masstransit(&[(PLACED, "orders.order-placed.v2")]);
            assert_eq!(envelope_problem(&map, &[placed(1), placed(2)]), None);
            let nsb = consumer(Arc::new(NServiceBus::new(
                TypeMap::new()
                    .with("Shop.Contracts.OrderPlaced", "orders.order-placed")
                    .unwrap(),
            )));
            assert_eq!(envelope_problem(&nsb, &[placed(1), placed(2)]), None);
            let subject = ConsumerConfig::new(ConsumerName::new("shop.orders").unwrap(), "orders");
            assert_eq!(envelope_problem(&subject, &[placed(1)]), None);
        }
    }
}
