//! [`ConfiguredWorker`]: a [`WorkerConfig`] hosted for the service's own handlers, with what
//! a production worker needs before and around [`Worker::run`]: the broker client from the
//! configuration, health endpoints from the start, the store opened with backoff and its schema
//! checked while `/readyz` says why not yet, then the consumers, the relay, retention (checked
//! against the replay horizon) and the drain.

use std::future::Future;
use std::pin::Pin;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::entity_check;
use super::health::{self, Condition, Readiness};
use super::open::{self, OpenStore};
use super::{BrokerAddress, ConsumerConfig, Worker, WorkerConfig, WorkerError, WorkerStats};
use crate::ports::StoreError;
use crate::runtime::Handler;
use crate::servicebus::ServiceBusClient;
#[cfg(feature = "entra")]
use sb_servicebus::entra::{EntraCredential, EntraMode};

/// A check of the service's own schema, run after the core migrations are found applied; an
/// error keeps the worker not ready (and retrying) with the error as the reason.
type SchemaCheck<S> =
    Box<dyn Fn(S) -> Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>> + Send + Sync>;

/// Hosts the consumers a [`WorkerConfig`] lists with the service's own handlers: built by
/// [`Worker::from_config`].
///
/// [`ConfiguredWorker::run`]:
/// 1. builds the Service Bus client from `servicebus.*` (connection string, or Entra ID with
///    the `entra` feature), its trust roots and proxy;
/// 2. serves `/livez`, `/healthz` and `/readyz` from the start: on `health.port` (the built-in
///    server), on a listener given with [`ConfiguredWorker::health`], and in any case on the
///    [`Readiness`] given with [`ConfiguredWorker::readiness`], for the service's own router;
/// 3. opens the store (`store`) and checks that its migrations are applied (plus the service's
///    own [`ConfiguredWorker::schema_check`]), retrying with backoff while `/readyz` names the
///    cause: a first deployment or a fail-over at start leaves a live, not-ready process;
/// 4. runs a [`Worker`] with a handler for each configured consumer, the relay, delayed
///    retries, session mode and retention as configured; retention is refused unless it
///    covers the replay horizon, inside [`Worker::run`];
/// 5. on `shutdown`, drains and returns the counters.
///
/// # Examples
/// ```no_run
/// # #[allow(dead_code)]
/// # async fn example<H: sb_inbox::Handler<sb_inbox::PgTx>>(make: impl Fn() -> H) -> Result<(), Box<dyn std::error::Error>> {
/// use sb_inbox::PgStore;
/// use sb_inbox::worker::{Readiness, Worker, WorkerConfig};
///
/// let config = WorkerConfig::load_with_prefix(
///     Some("orders-worker.json".as_ref()),
///     "ORDERS_",
///     &|name| std::env::var(name).ok(),
/// )?;
/// let readiness = Readiness::new(); // mount `readiness.respond(path)` on your router
/// let shutdown = tokio_util::sync::CancellationToken::new();
/// let stats = Worker::<PgStore>::from_config(config)
///     .readiness(readiness.clone())
///     .run(shutdown, |_consumer| make())
///     .await?;
/// println!("{:?}", stats.total());
/// # Ok(()) }
/// ```
pub struct ConfiguredWorker<S> {
    config: WorkerConfig,
    readiness: Readiness,
    health: Option<TcpListener>,
    schema_check: Option<SchemaCheck<S>>,
}

impl<S> std::fmt::Debug for ConfiguredWorker<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfiguredWorker")
            .field("config", &self.config)
            .field("readiness", &self.readiness)
            .finish_non_exhaustive()
    }
}

impl<S: OpenStore + 'static> Worker<S> {
    /// A worker hosting what `config` describes, on a store of type `S` opened from
    /// `config.store` when it runs: see [`ConfiguredWorker`].
    pub fn from_config(config: WorkerConfig) -> ConfiguredWorker<S> {
        ConfiguredWorker {
            config,
            readiness: Readiness::new(),
            health: None,
            schema_check: None,
        }
    }
}

impl<S: OpenStore + 'static> ConfiguredWorker<S> {
    /// Reports on `readiness` (shared with the service, which serves it on its own router with
    /// [`Readiness::respond`]) instead of a readiness of its own.
    #[must_use]
    pub fn readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    /// Serves the health endpoints on `listener` instead of binding `health.port` (tests pass
    /// a listener on an ephemeral port).
    #[must_use]
    pub fn health(mut self, listener: TcpListener) -> Self {
        self.health = Some(listener);
        self
    }

    /// Also requires `check` to pass before the worker consumes (the service's own tables are
    /// migrated, say); until it does, the worker stays not ready and retries, naming its error.
    /// `check` gets a clone of the store (a handle on its pool):
    /// `.schema_check(|store| async move { my_tables(&store).await })`.
    ///
    /// Not an `AsyncFn(&S)`: the worker's future must be `Send` (it is spawned), and stable Rust
    /// cannot require an `AsyncFn`'s future to be `Send`; a closure that returns a `Send` future
    /// of its own is the closest, with no `Box::pin` or lifetime at the call site.
    #[must_use]
    pub fn schema_check<F, Fut>(mut self, check: F) -> Self
    where
        F: Fn(S) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        self.schema_check = Some(Box::new(move |store| Box::pin(check(store))));
        self
    }

    /// The configuration being hosted.
    pub fn config(&self) -> &WorkerConfig {
        &self.config
    }

    /// Runs until `shutdown`, with `handler(consumer)` as the handler of each configured
    /// consumer; see [`ConfiguredWorker`] for the steps. A shutdown before the store opened
    /// ends it with nothing processed.
    ///
    /// # Errors
    /// [`WorkerError`]: the health port cannot be bound, the broker address or trust roots
    /// cannot be used, the store URL names a store this build lacks, the consumers or the
    /// retention are refused, or a receiver fails for good. A store that does not answer or is
    /// not migrated yet is not an error: it is retried.
    pub async fn run<H, F>(
        self,
        shutdown: CancellationToken,
        mut handler: F,
    ) -> Result<WorkerStats, WorkerError>
    where
        H: Handler<S::Tx>,
        F: FnMut(&ConsumerConfig) -> H,
    {
        let ConfiguredWorker {
            config,
            readiness,
            health,
            schema_check,
        } = self;
        let health = health_listener(health, config.health_port).await?;
        hosts_its_store::<S>(&config)?;
        // Before anything is opened: an envelope that cannot reach the handler is a mistake
        // in the configuration, which waiting for the store would only hide.
        let mut hosted = Vec::with_capacity(config.consumers.len());
        for consumer in &config.consumers {
            let handler = handler(consumer);
            if let Some(problem) = super::host::envelope_problem(consumer, handler.contracts()) {
                return Err(WorkerError::Config(problem));
            }
            hosted.push((consumer.clone(), handler));
        }
        let client = broker_client(&config.broker)?
            .with_server_busy_wait(config.server_busy_wait)
            .with_trust(&config.trust)
            .map_err(WorkerError::Trust)?
            .with_proxy(&config.proxy);
        // Served from the start, before the store opens; the Worker adds its probes to it.
        let store_ready = readiness.condition("store", "opening");
        let _stop_health = health::serve_while(health, &readiness);
        // The entity's real settings before anything is received (issue 33): a copy in
        // `[entity]` that disagrees refuses the start; what was read gives the replay horizon.
        // Every hosted entity is checked, and the longest horizon bounds retention (issue 40,
        // M5); each consumer gets its own entity's lock duration. Bounded
        // (entity_check::START_CHECK_BOUND) and given up on shutdown: a SIGTERM while the
        // management API stalls ends the worker at once, as before the store opened.
        let checked = tokio::select! {
            checked = entity_check::at_start(&config, &readiness) => checked?,
            () = shutdown.cancelled() => return Ok(WorkerStats::default()),
        };
        let horizon = checked.horizon.or(config.horizon);
        let Some(store) = open_store(&config, schema_check.as_ref(), &store_ready, &shutdown).await
        else {
            return Ok(WorkerStats::default());
        };
        let mut worker = Worker::new(client, store)
            .relay(config.relay.clone())
            .readiness(readiness);
        if let (Some(retention), Some(horizon)) = (config.retention, horizon) {
            worker = worker.retention(retention, horizon);
        }
        if let Some(sessions) = &config.sessions {
            worker = worker.sessions(sessions.clone());
        }
        if let Some(policy) = &config.retry {
            worker = worker.delayed_retries(policy.clone());
        }
        for (mut consumer, handler) in hosted {
            if let Some(lock) = checked.lock_durations.get(&consumer.entity) {
                consumer.runtime.lock_duration = Some(*lock);
            }
            worker = worker.consumer(consumer, handler);
        }
        tracing::info!(consumers = config.consumers.len(), store = %config.store, "Worker started.");
        let stats = worker.run(shutdown).await?;
        tracing::info!(stats = ?stats.total(), "Worker stopped.");
        Ok(stats)
    }
}

/// The health endpoint's listener: the one given, else one bound on `port` when configured.
async fn health_listener(
    given: Option<TcpListener>,
    port: Option<u16>,
) -> Result<Option<TcpListener>, WorkerError> {
    Ok(match (given, port) {
        (Some(listener), _) => Some(listener),
        (None, Some(port)) => Some(
            TcpListener::bind(("0.0.0.0", port))
                .await
                .map_err(|source| WorkerError::Health { port, source })?,
        ),
        (None, None) => None,
    })
}

/// The configured store is compiled in and of the kind this worker hosts.
fn hosts_its_store<S: OpenStore>(config: &WorkerConfig) -> Result<(), WorkerError> {
    config.store.ensure_compiled_in()?;
    if !S::accepts(&config.store) {
        return Err(WorkerError::Store(StoreError::configuration(format!(
            "the store URL names a {} store, and this worker hosts another kind",
            config.store.feature()
        ))));
    }
    Ok(())
}

impl<S: OpenStore + 'static> ConfiguredWorker<S> {
    /// [`ConfiguredWorker::run`] until the process receives SIGTERM or SIGINT (see
    /// [`super::shutdown_signal`]), then drains: in-flight deliveries finish and are settled,
    /// prefetched ones are released, so a rolling deploy leaves nothing to come back by lock
    /// expiry.
    ///
    /// # Errors
    /// As [`ConfiguredWorker::run`], and [`WorkerError::Signal`] when the signal handlers
    /// cannot be installed.
    pub async fn run_until_shutdown<H, F>(self, handler: F) -> Result<WorkerStats, WorkerError>
    where
        H: Handler<S::Tx>,
        F: FnMut(&ConsumerConfig) -> H,
    {
        let shutdown = super::shutdown_signal()?;
        self.run(shutdown, handler).await
    }
}

/// Opens the store and checks its schema until both succeed (see [`open::until_open`]); `None`
/// when `shutdown` comes first. The condition stays as the last failure said: the worker's
/// `store` probe replaces it when the worker runs.
async fn open_store<S: OpenStore>(
    config: &WorkerConfig,
    schema_check: Option<&SchemaCheck<S>>,
    store_ready: &Condition,
    shutdown: &CancellationToken,
) -> Option<S> {
    // Every consumer's handlers at once, plus the relay and retention.
    let pool = u32::try_from(
        config
            .consumers
            .iter()
            .map(|c| c.runtime.concurrency)
            .sum::<usize>(),
    )
    .unwrap_or(u32::MAX)
    .saturating_add(2);
    let open = || async {
        let store = S::open(&config.store, pool).await?;
        open::check_schema(&store).await?;
        if let Some(check) = schema_check {
            check(store.clone()).await?;
        }
        Ok(store)
    };
    open::until_open(open, store_ready, shutdown).await
}

/// The Service Bus client for `broker`: a connection string's key, or Entra ID tokens for a
/// namespace (refused when this build lacks the `entra` feature).
fn broker_client(broker: &BrokerAddress) -> Result<ServiceBusClient, WorkerError> {
    Ok(match broker {
        BrokerAddress::Connection(cs) => ServiceBusClient::from_connection_string(cs),
        #[cfg(feature = "entra")]
        BrokerAddress::Namespace {
            host,
            client_id,
            transport,
        } => ServiceBusClient::with_entra_over(
            host,
            EntraCredential::new(EntraMode::Default, client_id.clone()),
            *transport,
        ),
        #[cfg(not(feature = "entra"))]
        BrokerAddress::Namespace { host, .. } => {
            return Err(WorkerError::Broker(format!(
                "{host}: a namespace without a connection string takes Entra ID tokens, and this \
                 build has no `entra` cargo feature"
            )));
        }
    })
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::ports::{ErrorKind, Tx};
    use crate::store::SqliteStore;

    struct Nothing;

    impl<T: Tx> crate::runtime::JsonHandler<T> for Nothing {
        type Message = serde_json::Value;

        async fn handle(
            &self,
            _ctx: &crate::runtime::Context<'_, serde_json::Value>,
            _message: &serde_json::Value,
            _tx: &mut T,
        ) -> Result<crate::runtime::Handled, crate::runtime::HandlerError> {
            Ok(crate::runtime::Handled::Processed)
        }
    }

    impl crate::runtime::JsonContract for serde_json::Value {
        const NAME: &'static str = "any.thing";
        const VERSION: u32 = 1;
    }

    /// A worker config under the `SVC_` prefix: consumer `svc.things` on `things` of a local
    /// emulator's namespace, plus `vars`.
    fn svc_config(vars: &[(&str, &str)]) -> WorkerConfig {
        let env = |name: &str| {
            let fixed = match name {
                "SVC_CONSUMER" => Some("svc.things"),
                "SVC_ENTITY" => Some("things"),
                "SVC_SERVICEBUS_CONNECTION" => Some(
                    "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;\
                     UseDevelopmentEmulator=true",
                ),
                _ => None,
            };
            fixed
                .or_else(|| vars.iter().find(|(key, _)| *key == name).map(|(_, v)| *v))
                .map(str::to_owned)
        };
        WorkerConfig::load_with_prefix(None, "SVC_", &env).unwrap()
    }

    /// A URL of another store is refused at once, not retried as a store that is not up yet.
    #[tokio::test]
    async fn a_url_of_another_store_is_refused_before_any_retry() {
        let config = svc_config(&[("SVC_STORE", "postgres://postgres@127.0.0.1:1/none")]);
        let result = Worker::<SqliteStore>::from_config(config)
            .run(CancellationToken::new(), |_| {
                crate::runtime::Json::new(Nothing)
            })
            .await;
        match result {
            Err(WorkerError::Store(error)) => {
                assert_eq!(error.kind(), ErrorKind::Configuration, "{error}");
            }
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    /// A type map whose contract no route takes refuses the start at once, naming the type,
    /// before the store (here: nowhere to be found) is tried.
    #[tokio::test]
    async fn a_type_map_the_handler_does_not_match_refuses_the_start() {
        let config = svc_config(&[
            ("SVC_STORE", "sqlite:///nonexistent/dir/inbox.db"),
            ("SVC_ENVELOPE", "masstransit"),
            (
                "SVC_ENVELOPE_TYPES",
                "urn:message:Things:Thing=any.thnig.v1",
            ),
        ]);
        // Bounded: without the check the worker would retry the missing store for ever.
        let result = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            Worker::<SqliteStore>::from_config(config).run(CancellationToken::new(), |_| {
                crate::runtime::Json::new(Nothing)
            }),
        )
        .await
        .expect("refused at once, not retried");
        match result {
            Err(WorkerError::Config(super::super::HostingError::UnroutedType {
                type_name,
                contract,
                ..
            })) => {
                assert_eq!(type_name, "urn:message:Things:Thing");
                assert_eq!(contract, "any.thnig.v1");
            }
            other => panic!("expected the mismatch to be refused, got {other:?}"),
        }
    }
}
