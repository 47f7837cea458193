use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::host::is_subscription;
use super::{ConsumerConfig, ReplayHorizon};
use crate::ports::MAX_RETENTION_BATCH;
use crate::relay::RelayConfig;
use crate::retention::RetentionConfig;
use crate::runtime::{ConsumerName, JitterSource, RetryPolicy, RuntimeConfig, SessionConfig};
use crate::servicebus::{ConnectionString, Transport};
use crate::store::StoreUrl;

/// The environment variables that override `worker.toml`, with the file key each one replaces.
pub const ENV_VARS: &[(&str, &str, &str)] = &[
    (
        "SB_INBOX_CONSUMER",
        "consumer",
        "stable consumer name (half of the inbox key)",
    ),
    (
        "SB_INBOX_STORE",
        "store",
        "store URL: postgres://…, sqlite://PATH, sqlite::memory:",
    ),
    (
        "SB_INBOX_SERVICEBUS_CONNECTION",
        "servicebus.connection",
        "connection string (SAS or emulator)",
    ),
    (
        "SB_INBOX_SERVICEBUS_NAMESPACE",
        "servicebus.namespace",
        "NAME.servicebus.windows.net: Entra ID (AZURE_CLIENT_ID: user-assigned identity)",
    ),
    (
        "SB_INBOX_SERVICEBUS_TRANSPORT",
        "servicebus.transport",
        "amqp (TCP, 5671) or websockets (wss://HOST:443); default: the connection string's TransportType, else amqp",
    ),
    (
        "SB_INBOX_ENTITY",
        "servicebus.entity",
        "queue, or TOPIC/Subscriptions/SUBSCRIPTION",
    ),
    (
        "SB_INBOX_SESSIONS",
        "servicebus.sessions",
        "true: session mode (the entity requires sessions; each session in order, one message at a time)",
    ),
    (
        "SB_INBOX_MAX_SESSIONS",
        "runtime.max_sessions",
        "session mode: sessions processed at once (default 8)",
    ),
    (
        "SB_INBOX_SESSION_IDLE_SECS",
        "runtime.session_idle_secs",
        "session mode: release a session quiet this long and take the next (default 5)",
    ),
    (
        "SB_INBOX_CONCURRENCY",
        "runtime.concurrency",
        "deliveries handled at once (default 8)",
    ),
    (
        "SB_INBOX_PREFETCH",
        "runtime.prefetch",
        "deliveries received ahead (default 0)",
    ),
    (
        "SB_INBOX_LOCK_MARGIN_SECS",
        "runtime.lock_margin_secs",
        "renew this long before expiry (default 10)",
    ),
    (
        "SB_INBOX_MAX_PROCESSING_SECS",
        "runtime.max_processing_secs",
        "longest a delivery is handled before it is cancelled, rolled back and abandoned (default 300)",
    ),
    (
        "SB_INBOX_BATCH_SIZE",
        "runtime.batch_size",
        "deliveries per database transaction, a savepoint each (default 1: no batching)",
    ),
    (
        "SB_INBOX_BATCH_LINGER_MS",
        "runtime.batch_linger_ms",
        "how long a batch waits for more deliveries after its first (default 5)",
    ),
    (
        "SB_INBOX_SHUTDOWN_GRACE_SECS",
        "runtime.shutdown_grace_secs",
        "drain time on SIGTERM (default 30)",
    ),
    (
        "SB_INBOX_RETRY_MAX_RETRIES",
        "retry.max_retries",
        "delayed retries before RetriesExhausted (default 0: off, abandon)",
    ),
    (
        "SB_INBOX_RETRY_BASE_DELAY_SECS",
        "retry.base_delay_secs",
        "first delayed retry waits this long (default 10)",
    ),
    (
        "SB_INBOX_RETRY_MAX_DELAY_SECS",
        "retry.max_delay_secs",
        "longest delayed-retry wait (default 600)",
    ),
    (
        "SB_INBOX_RETRY_JITTER_PERCENT",
        "retry.jitter_percent",
        "shorten each delay by up to this % (default 20)",
    ),
    (
        "SB_INBOX_HEALTH_PORT",
        "health.port",
        "serve /healthz and /readyz on this port",
    ),
    (
        "SB_INBOX_OUTBOX_DESTINATION",
        "outbox.destination",
        "queue or topic the consumer's events go to",
    ),
    (
        "SB_INBOX_OUTBOX_BATCH",
        "outbox.batch_size",
        "rows the relay claims per pass (default 100)",
    ),
    (
        "SB_INBOX_OUTBOX_POLL_MS",
        "outbox.poll_interval_ms",
        "relay poll interval when idle (default 500)",
    ),
    (
        "SB_INBOX_OUTBOX_LEASE_SECS",
        "outbox.lease_secs",
        "how long a claim reserves rows (default 60)",
    ),
    (
        "SB_INBOX_RETENTION_SECS",
        "retention.retention_secs",
        "delete inbox rows older than this",
    ),
    (
        "SB_INBOX_RETENTION_BATCH",
        "retention.batch_size",
        "rows per delete (default 1000, max 4000)",
    ),
    (
        "SB_INBOX_RETENTION_INTERVAL_SECS",
        "retention.interval_secs",
        "time between sweeps (default 300)",
    ),
    (
        "SB_INBOX_MESSAGE_TTL_SECS",
        "retention.message_ttl_secs",
        "the entity's DefaultMessageTimeToLive",
    ),
    (
        "SB_INBOX_LOCK_DURATION_SECS",
        "retention.lock_duration_secs",
        "the entity's LockDuration",
    ),
    (
        "SB_INBOX_MAX_DELIVERY_COUNT",
        "retention.max_delivery_count",
        "the entity's MaxDeliveryCount",
    ),
    (
        "SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS",
        "retention.dlq_resubmit_window_secs",
        "how long DLQ resubmission stays allowed (default 604800: 7 days; `dlq resubmit` refuses older dead letters)",
    ),
];

/// One problem in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file key (and its environment variable).
    pub field: String,
    /// What is wrong.
    pub problem: String,
}

/// Every problem found, so one run reports them all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid worker configuration ({} problem(s)):",
            self.0.len()
        )?;
        for error in &self.0 {
            write!(f, "\n  - {}: {}", error.field, error.problem)?;
        }
        Ok(())
    }
}

/// How the worker reaches Service Bus.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum BrokerAddress {
    /// A connection string (SAS key, SAS token, or the emulator).
    Connection(ConnectionString),
    /// A namespace host with Microsoft Entra ID tokens.
    Namespace {
        /// `NAME.servicebus.windows.net`.
        host: String,
        /// A user-assigned managed identity's client id (`AZURE_CLIENT_ID`); `None` for the
        /// system-assigned identity, workload identity or developer tools.
        client_id: Option<String>,
        /// TCP or WebSockets (`servicebus.transport`).
        transport: Transport,
    },
}

/// Dedupe retention and the replay horizon it must cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// Inbox rows older than this may be deleted.
    pub retention: Duration,
    /// What the retention must cover.
    pub horizon: ReplayHorizon,
    /// Rows per delete statement.
    pub batch_size: usize,
    /// Time between sweeps.
    pub interval: Duration,
}

impl Retention {
    /// The retention task's settings: the configured retention, batch and interval.
    pub fn task_config(&self) -> RetentionConfig {
        let mut config = RetentionConfig::new(self.retention);
        config.batch_size = self.batch_size;
        config.interval = self.interval;
        config
    }
}

/// The validated worker configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkerConfig {
    /// The runtime settings (consumer, concurrency, prefetch, lock margin, grace) of the first
    /// consumer (the only one without `[[consumers]]`).
    pub runtime: RuntimeConfig,
    /// The store.
    pub store: StoreUrl,
    /// The broker.
    pub broker: BrokerAddress,
    /// The entity the first consumer consumes.
    pub entity: String,
    /// Every consumer the worker hosts, in file order: the top-level `consumer` on
    /// `servicebus.entity`, or each `[[consumers]]` entry (name, entity, and concurrency and
    /// prefetch defaulting to `runtime.*`); the other `runtime.*` settings apply to all.
    pub consumers: Vec<ConsumerConfig>,
    /// Port for `/healthz` and `/readyz`.
    pub health_port: Option<u16>,
    /// Where the inventory consumer's `inventory.stock-reserved.v1` events go (through the
    /// outbox); none are written without it.
    pub outbox_destination: Option<String>,
    /// Delayed retries for transient failures (copies go to [`WorkerConfig::entity`], which must
    /// be a queue); `None` abandons them.
    pub retry: Option<RetryPolicy>,
    /// The outbox relay.
    pub relay: RelayConfig,
    /// Retention, when inbox rows are to be deleted.
    pub retention: Option<Retention>,
    /// Session mode (`servicebus.sessions = true`), for every consumer.
    pub sessions: Option<SessionConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    consumer: Option<String>,
    store: Option<String>,
    #[serde(default)]
    servicebus: ServiceBus,
    #[serde(default)]
    runtime: Runtime,
    #[serde(default)]
    health: Health,
    #[serde(default)]
    outbox: Outbox,
    #[serde(default)]
    retry: RetryFile,
    #[serde(default)]
    retention: RetentionFile,
    #[serde(default)]
    consumers: Vec<ConsumerFile>,
}

/// One `[[consumers]]` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumerFile {
    name: Option<String>,
    entity: Option<String>,
    concurrency: Option<u64>,
    prefetch: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetryFile {
    max_retries: Option<u64>,
    base_delay_secs: Option<u64>,
    max_delay_secs: Option<u64>,
    jitter_percent: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ServiceBus {
    connection: Option<String>,
    namespace: Option<String>,
    transport: Option<String>,
    entity: Option<String>,
    sessions: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Runtime {
    concurrency: Option<u64>,
    prefetch: Option<u64>,
    lock_margin_secs: Option<u64>,
    max_processing_secs: Option<u64>,
    shutdown_grace_secs: Option<u64>,
    batch_size: Option<u64>,
    batch_linger_ms: Option<u64>,
    max_sessions: Option<u64>,
    session_idle_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Health {
    port: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Outbox {
    destination: Option<String>,
    batch_size: Option<u64>,
    poll_interval_ms: Option<u64>,
    lease_secs: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionFile {
    retention_secs: Option<u64>,
    message_ttl_secs: Option<u64>,
    lock_duration_secs: Option<u64>,
    max_delivery_count: Option<u64>,
    dlq_resubmit_window_secs: Option<u64>,
    batch_size: Option<u64>,
    interval_secs: Option<u64>,
}

/// Collects problems while reading values.
struct Reader<'a> {
    env: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<ConfigError>,
}

impl Reader<'_> {
    fn field(key: &str) -> String {
        match ENV_VARS.iter().find(|(_, file_key, _)| *file_key == key) {
            Some((var, _, _)) => format!("{key} ({var})"),
            None => key.to_owned(),
        }
    }

    fn fail(&mut self, key: &str, problem: impl Into<String>) {
        self.errors.push(ConfigError {
            field: Self::field(key),
            problem: problem.into(),
        });
    }

    fn env_of(&self, key: &str) -> Option<String> {
        let (var, _, _) = ENV_VARS.iter().find(|(_, file_key, _)| *file_key == key)?;
        (self.env)(var).filter(|v| !v.is_empty())
    }

    fn text(&mut self, key: &str, file: Option<String>) -> Option<String> {
        self.env_of(key).or(file)
    }

    fn flag(&mut self, key: &str, file: Option<bool>) -> Option<bool> {
        match self.env_of(key) {
            Some(text) => match text.trim().to_ascii_lowercase().as_str() {
                "true" | "1" | "yes" => Some(true),
                "false" | "0" | "no" => Some(false),
                _ => {
                    self.fail(key, format!("{text:?} is not true or false"));
                    None
                }
            },
            None => file,
        }
    }

    fn number(&mut self, key: &str, file: Option<u64>, min: u64, max: u64) -> Option<u64> {
        let value = match self.env_of(key) {
            Some(text) => match text.trim().parse::<u64>() {
                Ok(n) => Some(n),
                Err(_) => {
                    self.fail(key, format!("{text:?} is not a whole number"));
                    return None;
                }
            },
            None => file,
        }?;
        if !(min..=max).contains(&value) {
            self.fail(key, format!("{value} is outside {min}..={max}"));
            return None;
        }
        Some(value)
    }
}

impl WorkerConfig {
    /// Reads `path` (if given), applies the environment overrides from `env`, and validates.
    ///
    /// # Errors
    /// [`ConfigErrors`] listing every problem: unreadable or unknown file keys, missing values,
    /// bad numbers, an invalid consumer name, store URL or connection string, a lock margin not
    /// shorter than the lock, retention shorter than the replay horizon.
    pub fn load(
        path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        let file = match path {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    single("--config", format!("cannot read {}: {e}", path.display()))
                })?;
                toml::from_str::<File>(&text).map_err(|e| {
                    single("--config", format!("{}: {}", path.display(), e.message()))
                })?
            }
            None => File::default(),
        };
        let mut r = Reader {
            env,
            errors: Vec::new(),
        };

        let listed = !file.consumers.is_empty();
        let consumer = match r.text("consumer", file.consumer) {
            Some(_) if listed => {
                r.fail(
                    "consumer",
                    "give either consumer (and servicebus.entity) or [[consumers]], not both",
                );
                None
            }
            Some(name) => ConsumerName::new(name)
                .map_err(|e| r.fail("consumer", e.to_string()))
                .ok(),
            None if listed => None,
            None => {
                r.fail("consumer", "required (or [[consumers]])");
                None
            }
        };
        let store = match r.text("store", file.store) {
            Some(url) => url
                .parse::<StoreUrl>()
                .map_err(|e| r.fail("store", e.to_string()))
                .ok(),
            None => {
                r.fail("store", "required");
                None
            }
        };
        let connection = r.text("servicebus.connection", file.servicebus.connection);
        let namespace = r.text("servicebus.namespace", file.servicebus.namespace);
        let transport = r
            .text("servicebus.transport", file.servicebus.transport)
            .and_then(|t| {
                t.parse::<Transport>()
                    .map_err(|_| {
                        r.fail(
                            "servicebus.transport",
                            format!("{t:?} is not amqp or websockets"),
                        )
                    })
                    .ok()
            });
        let broker = match (connection, namespace) {
            (Some(cs), None) => cs
                .parse::<ConnectionString>()
                .map(|cs| match transport {
                    Some(transport) => cs.with_transport(transport),
                    None => cs,
                })
                .map(BrokerAddress::Connection)
                .map_err(|e| r.fail("servicebus.connection", e.to_string()))
                .ok(),
            (None, Some(ns)) if ns.contains('.') && !ns.contains('/') => {
                Some(BrokerAddress::Namespace {
                    host: ns,
                    client_id: (r.env)("AZURE_CLIENT_ID").filter(|id| !id.is_empty()),
                    transport: transport.unwrap_or_default(),
                })
            }
            (None, Some(ns)) => {
                r.fail(
                    "servicebus.namespace",
                    format!("{ns:?} is not a host name like NAME.servicebus.windows.net"),
                );
                None
            }
            (Some(_), Some(_)) => {
                r.fail(
                    "servicebus.connection",
                    "give a connection string or a namespace, not both",
                );
                None
            }
            (None, None) => {
                r.fail(
                    "servicebus.connection",
                    "required (or servicebus.namespace)",
                );
                None
            }
        };
        let top_entity = r.text("servicebus.entity", file.servicebus.entity);
        if listed && top_entity.is_some() {
            r.fail(
                "servicebus.entity",
                "each [[consumers]] entry names its entity: remove servicebus.entity",
            );
        }
        let entity = top_entity.or_else(|| match &broker {
            Some(BrokerAddress::Connection(cs)) if !listed => cs.entity_path().map(str::to_owned),
            _ => None,
        });
        if entity.is_none() && !listed {
            r.fail(
                "servicebus.entity",
                "required (or EntityPath in the connection string, or [[consumers]])",
            );
        }

        let concurrency = r
            .number("runtime.concurrency", file.runtime.concurrency, 1, 1024)
            .unwrap_or(8);
        let prefetch = r
            .number("runtime.prefetch", file.runtime.prefetch, 0, 10_000)
            .unwrap_or(0);
        let margin = r
            .number(
                "runtime.lock_margin_secs",
                file.runtime.lock_margin_secs,
                1,
                3600,
            )
            .unwrap_or(10);
        let grace = r
            .number(
                "runtime.shutdown_grace_secs",
                file.runtime.shutdown_grace_secs,
                0,
                3600,
            )
            .unwrap_or(30);
        let max_processing = r
            .number(
                "runtime.max_processing_secs",
                file.runtime.max_processing_secs,
                1,
                86_400,
            )
            .unwrap_or(300);
        let batch = r
            .number("runtime.batch_size", file.runtime.batch_size, 1, 1000)
            .map_or(1, to_usize);
        let batch_linger = r
            .number(
                "runtime.batch_linger_ms",
                file.runtime.batch_linger_ms,
                0,
                10_000,
            )
            .map_or(crate::runtime::DEFAULT_BATCH_LINGER, Duration::from_millis);
        // Port 0 picks a free port, logged at start-up.
        let health_port = r
            .number("health.port", file.health.port, 0, 65_535)
            .and_then(|p| u16::try_from(p).ok());
        let outbox_destination = r.text("outbox.destination", file.outbox.destination);
        let listed = listed_consumers(&mut r, &file.consumers, concurrency, prefetch);
        let subscription = listed
            .iter()
            .filter_map(|(_, entity, _, _)| entity.as_deref())
            .chain(entity.as_deref())
            .find(|entity| is_subscription(entity));
        let retry = retry_policy(&mut r, &file.retry, subscription);
        let sessions = session_config(
            &mut r,
            file.servicebus.sessions,
            &file.runtime,
            retry.is_some(),
            batch > 1,
        );
        let relay_defaults = RelayConfig::default();
        let relay = RelayConfig {
            batch_size: r
                .number("outbox.batch_size", file.outbox.batch_size, 1, 1000)
                .map_or(relay_defaults.batch_size, to_usize),
            poll_interval: r
                .number(
                    "outbox.poll_interval_ms",
                    file.outbox.poll_interval_ms,
                    10,
                    60_000,
                )
                .map_or(relay_defaults.poll_interval, Duration::from_millis),
            lease: r
                .number("outbox.lease_secs", file.outbox.lease_secs, 5, 3600)
                .map_or(relay_defaults.lease, Duration::from_secs),
        };

        let lock_duration = r.number(
            "retention.lock_duration_secs",
            file.retention.lock_duration_secs,
            1,
            300,
        );
        if let Some(lock) = lock_duration
            && margin >= lock
        {
            r.fail(
                "runtime.lock_margin_secs",
                format!("{margin} s must be shorter than the lock duration {lock} s"),
            );
        }
        let retention = r.number(
            "retention.retention_secs",
            file.retention.retention_secs,
            1,
            u64::from(u32::MAX),
        );
        let ttl = r.number(
            "retention.message_ttl_secs",
            file.retention.message_ttl_secs,
            1,
            u64::MAX,
        );
        let max_delivery = r.number(
            "retention.max_delivery_count",
            file.retention.max_delivery_count,
            1,
            2000,
        );
        let dlq_window = r.number(
            "retention.dlq_resubmit_window_secs",
            file.retention.dlq_resubmit_window_secs,
            0,
            u64::MAX,
        );
        let task_defaults = RetentionConfig::new(Duration::ZERO);
        let batch_size = r
            .number(
                "retention.batch_size",
                file.retention.batch_size,
                1,
                MAX_RETENTION_BATCH as u64,
            )
            .map(to_usize);
        let interval = r
            .number(
                "retention.interval_secs",
                file.retention.interval_secs,
                1,
                86_400,
            )
            .map(Duration::from_secs);
        if retention.is_none() {
            for (key, set) in [
                ("retention.batch_size", batch_size.is_some()),
                ("retention.interval_secs", interval.is_some()),
            ] {
                if set {
                    r.fail(
                        key,
                        "has no effect without retention.retention_secs (SB_INBOX_RETENTION_SECS): nothing is deleted",
                    );
                }
            }
        }
        let retention = match retention {
            None => None,
            Some(retention) => {
                for (key, value) in [
                    ("retention.message_ttl_secs", ttl),
                    ("retention.lock_duration_secs", lock_duration),
                    ("retention.max_delivery_count", max_delivery),
                ] {
                    if value.is_none() {
                        r.fail(
                            key,
                            "required when retention is set: the replay horizon is derived from it",
                        );
                    }
                }
                match (ttl, lock_duration, max_delivery) {
                    (Some(ttl), Some(lock), Some(max)) => {
                        let horizon = ReplayHorizon {
                            message_ttl: Duration::from_secs(ttl),
                            lock_duration: Duration::from_secs(lock),
                            max_delivery_count: u32::try_from(max).unwrap_or(u32::MAX),
                            retry_span: retry.as_ref().map_or(Duration::ZERO, |policy| {
                                policy.max_delay().saturating_mul(policy.max_retries())
                            }),
                            dlq_resubmit_window: dlq_window.map_or(
                                crate::ops::dlq::DEFAULT_RESUBMIT_WINDOW,
                                Duration::from_secs,
                            ),
                        };
                        let retention = Duration::from_secs(retention);
                        if let Err(error) = horizon.check(retention) {
                            r.fail("retention.retention_secs", error.to_string());
                        }
                        Some(Retention {
                            retention,
                            horizon,
                            batch_size: batch_size.unwrap_or(task_defaults.batch_size),
                            interval: interval.unwrap_or(task_defaults.interval),
                        })
                    }
                    _ => None,
                }
            }
        };

        let runtime_for = |name: ConsumerName, concurrency: u64, prefetch: u64| {
            let mut runtime = RuntimeConfig::new(name);
            runtime.concurrency = usize::try_from(concurrency).unwrap_or(8);
            runtime.prefetch = usize::try_from(prefetch).unwrap_or(0);
            runtime.lock_margin = Duration::from_secs(margin);
            runtime.lock_duration = lock_duration.map(Duration::from_secs);
            runtime.max_processing = Duration::from_secs(max_processing);
            runtime.shutdown_grace = Duration::from_secs(grace);
            runtime.batch_size = batch;
            runtime.batch_linger = batch_linger;
            runtime
        };
        let consumers: Vec<ConsumerConfig> = match (consumer, entity) {
            (Some(name), Some(entity)) => vec![ConsumerConfig {
                entity,
                runtime: runtime_for(name, concurrency, prefetch),
            }],
            _ => listed
                .into_iter()
                .filter_map(|(name, entity, concurrency, prefetch)| {
                    Some(ConsumerConfig {
                        entity: entity?,
                        runtime: runtime_for(name?, concurrency, prefetch),
                    })
                })
                .collect(),
        };
        match (
            r.errors.is_empty(),
            consumers.first().cloned(),
            store,
            broker,
        ) {
            (true, Some(first), Some(store), Some(broker)) => Ok(WorkerConfig {
                runtime: first.runtime,
                store,
                broker,
                entity: first.entity,
                consumers,
                health_port,
                outbox_destination,
                retry,
                relay,
                retention,
                sessions,
            }),
            _ => Err(ConfigErrors(r.errors)),
        }
    }
}

/// `servicebus.sessions` with `runtime.max_sessions` and `runtime.session_idle_secs`; the
/// session keys without session mode, and delayed retries or batched transactions with it, are
/// refused.
fn session_config(
    r: &mut Reader<'_>,
    sessions: Option<bool>,
    runtime: &Runtime,
    retry: bool,
    batched: bool,
) -> Option<SessionConfig> {
    let on = r.flag("servicebus.sessions", sessions) == Some(true);
    let defaults = SessionConfig::default();
    let max = r.number("runtime.max_sessions", runtime.max_sessions, 1, 1024);
    let idle = r.number(
        "runtime.session_idle_secs",
        runtime.session_idle_secs,
        1,
        3600,
    );
    if !on {
        for (key, set) in [
            ("runtime.max_sessions", max.is_some()),
            ("runtime.session_idle_secs", idle.is_some()),
        ] {
            if set {
                r.fail(
                    key,
                    "has no effect without servicebus.sessions = true (SB_INBOX_SESSIONS)",
                );
            }
        }
        return None;
    }
    if retry {
        r.fail(
            "servicebus.sessions",
            "delayed retries cannot keep a session's order (a retry copy goes to the end of its session): set retry.max_retries = 0",
        );
    }
    if batched {
        r.fail(
            "runtime.batch_size",
            "session mode handles a session's messages one at a time, each in its own transaction: batched transactions do not apply with servicebus.sessions = true",
        );
    }
    Some(SessionConfig {
        max_sessions: max.map_or(defaults.max_sessions, to_usize),
        idle: idle.map_or(defaults.idle, Duration::from_secs),
    })
}

/// Each `[[consumers]]` entry: its name and entity (`None` after a reported problem), and its
/// concurrency and prefetch (`runtime.*` when not given).
fn listed_consumers(
    r: &mut Reader<'_>,
    entries: &[ConsumerFile],
    concurrency: u64,
    prefetch: u64,
) -> Vec<(Option<ConsumerName>, Option<String>, u64, u64)> {
    let mut listed: Vec<(Option<ConsumerName>, Option<String>, u64, u64)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        let key = |field: &str| format!("consumers[{i}].{field}");
        let name = match &entry.name {
            Some(name) => ConsumerName::new(name.clone())
                .map_err(|e| r.fail(&key("name"), e.to_string()))
                .ok(),
            None => {
                r.fail(&key("name"), "required");
                None
            }
        };
        if let Some(name) = &name
            && listed
                .iter()
                .any(|(other, ..)| other.as_ref() == Some(name))
        {
            r.fail(
                &key("name"),
                format!("{name} is listed twice: each consumer needs its own name (its inbox key)"),
            );
        }
        let entity = entry.entity.clone().filter(|e| !e.is_empty());
        if entity.is_none() {
            r.fail(
                &key("entity"),
                "required: a queue or TOPIC/Subscriptions/SUBSCRIPTION",
            );
        }
        let concurrency = r
            .number(&key("concurrency"), entry.concurrency, 1, 1024)
            .unwrap_or(concurrency);
        let prefetch = r
            .number(&key("prefetch"), entry.prefetch, 0, 10_000)
            .unwrap_or(prefetch);
        listed.push((name, entity, concurrency, prefetch));
    }
    listed
}

/// The delayed-retry policy, or `None` when `retry.max_retries` is 0 (the default: abandon).
/// `subscription` is a consumed subscription, if any: copies cannot go back to one.
fn retry_policy(
    r: &mut Reader<'_>,
    file: &RetryFile,
    subscription: Option<&str>,
) -> Option<RetryPolicy> {
    const DAY: u64 = 86_400;
    let max_retries = r
        .number("retry.max_retries", file.max_retries, 0, 100)
        .unwrap_or(0);
    let base = r.number("retry.base_delay_secs", file.base_delay_secs, 1, 7 * DAY);
    let max = r.number("retry.max_delay_secs", file.max_delay_secs, 1, 7 * DAY);
    let jitter = r.number("retry.jitter_percent", file.jitter_percent, 0, 100);
    if max_retries == 0 {
        return None;
    }
    if subscription.is_some() {
        r.fail(
            "retry.max_retries",
            "delayed retries need a queue: a copy sent to the topic would reach every \
             subscription. Forward the subscription to a queue (ForwardTo) and consume the queue, \
             or set 0 (abandon)",
        );
        return None;
    }
    let (base, max) = (base.unwrap_or(10), max.unwrap_or(600));
    let policy = RetryPolicy::new(
        u32::try_from(max_retries).unwrap_or(u32::MAX),
        Duration::from_secs(base),
        Duration::from_secs(max),
    )
    .and_then(|policy| {
        let fraction = f64::from(u32::try_from(jitter.unwrap_or(20)).unwrap_or(100)) / 100.0;
        policy.with_jitter(fraction, JitterSource::random())
    });
    match policy {
        Ok(policy) => Some(policy),
        Err(_) => {
            r.fail(
                "retry.max_delay_secs",
                format!("{max} s must not be shorter than retry.base_delay_secs {base} s"),
            );
            None
        }
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

fn single(field: &str, problem: String) -> ConfigErrors {
    ConfigErrors(vec![ConfigError {
        field: field.to_owned(),
        problem,
    }])
}

#[cfg(test)]
#[allow(clippy::unwrap_in_result)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn load(toml: &str, env: &[(&str, &str)]) -> Result<WorkerConfig, ConfigErrors> {
        let dir = std::env::temp_dir().join(format!(
            "sb-inbox-config-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker.toml");
        std::fs::write(&path, toml).unwrap();
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let result = WorkerConfig::load(Some(&path), &|name| env.get(name).cloned());
        let _ = std::fs::remove_dir_all(&dir);
        result
    }

    const GOOD: &str = r#"
consumer = "inventory.order-placed.v1"
store = "sqlite://inbox.db"
[servicebus]
connection = "Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true"
entity = "orders"
[runtime]
concurrency = 4
"#;

    #[test]
    fn file_values_and_defaults() {
        let config = load(GOOD, &[]).unwrap();
        assert_eq!(
            config.runtime.consumer.as_str(),
            "inventory.order-placed.v1"
        );
        assert_eq!(
            (config.runtime.concurrency, config.runtime.prefetch),
            (4, 0)
        );
        assert_eq!(config.runtime.lock_margin, Duration::from_secs(10));
        assert_eq!(config.entity, "orders");
        assert!(matches!(config.broker, BrokerAddress::Connection(_)));
        assert!(!format!("{config:?}").contains("SECRET"));
    }

    #[test]
    fn namespace_means_entra_id_with_the_identity_from_azure_client_id() {
        let toml = GOOD.replace(
            "connection = \"Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true\"",
            "namespace = \"contoso.servicebus.windows.net\"",
        );
        let config = load(&toml, &[("AZURE_CLIENT_ID", "1111-2222")]).unwrap();
        assert_eq!(
            config.broker,
            BrokerAddress::Namespace {
                host: "contoso.servicebus.windows.net".into(),
                client_id: Some("1111-2222".into()),
                transport: Transport::Amqp,
            }
        );
        let config = load(&toml, &[("SB_INBOX_SERVICEBUS_TRANSPORT", "websockets")]).unwrap();
        assert!(matches!(
            config.broker,
            BrokerAddress::Namespace {
                transport: Transport::AmqpWebSockets,
                ..
            }
        ));
        let problems = load(&toml, &[("SB_INBOX_SERVICEBUS_TRANSPORT", "http")])
            .unwrap_err()
            .to_string();
        assert!(
            problems.contains("servicebus.transport (SB_INBOX_SERVICEBUS_TRANSPORT): \"http\" is not amqp or websockets"),
            "{problems}"
        );
        let config = load(&toml, &[]).unwrap();
        assert!(matches!(
            config.broker,
            BrokerAddress::Namespace {
                client_id: None,
                ..
            }
        ));
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = load(
            GOOD,
            &[
                ("SB_INBOX_CONCURRENCY", "16"),
                ("SB_INBOX_ENTITY", "t/Subscriptions/s"),
            ],
        )
        .unwrap();
        assert_eq!(config.runtime.concurrency, 16);
        assert_eq!(config.entity, "t/Subscriptions/s");
    }

    #[test]
    fn batching_is_off_by_default_and_set_by_file_or_environment() {
        let config = load(GOOD, &[]).unwrap();
        assert_eq!(config.runtime.batch_size, 1);
        assert_eq!(config.runtime.batch_linger, Duration::from_millis(5));
        let file = format!("{GOOD}\nbatch_size = 64\nbatch_linger_ms = 20\n");
        let config = load(&file, &[("SB_INBOX_BATCH_SIZE", "16")]).unwrap();
        assert_eq!(config.runtime.batch_size, 16);
        assert_eq!(config.runtime.batch_linger, Duration::from_millis(20));
        let problems = load(GOOD, &[("SB_INBOX_BATCH_SIZE", "0")])
            .unwrap_err()
            .to_string();
        assert!(
            problems.contains("runtime.batch_size (SB_INBOX_BATCH_SIZE)"),
            "{problems}"
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let errors = load(
            "consumer = \"Bad Name\"\n[runtime]\nconcurrency = 0\n",
            &[
                ("SB_INBOX_PREFETCH", "lots"),
                ("SB_INBOX_STORE", "mysql://u:pw@h/d"),
            ],
        )
        .unwrap_err();
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "consumer (SB_INBOX_CONSUMER)",
                "store (SB_INBOX_STORE)",
                "servicebus.connection (SB_INBOX_SERVICEBUS_CONNECTION)",
                "servicebus.entity (SB_INBOX_ENTITY)",
                "runtime.concurrency (SB_INBOX_CONCURRENCY)",
                "runtime.prefetch (SB_INBOX_PREFETCH)",
            ]
        );
        assert!(!errors.to_string().contains("pw@"), "{errors}");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let errors = load("consumer = \"a\"\nconcurency = 3\n", &[]).unwrap_err();
        assert!(errors.to_string().contains("concurency"), "{errors}");
    }

    #[test]
    fn retention_needs_the_horizon_and_must_cover_it() {
        let retention = format!("{GOOD}[retention]\nretention_secs = 3600\n");
        let errors = load(&retention, &[]).unwrap_err();
        assert_eq!(errors.0.len(), 3, "{errors}");
        let short = format!(
            "{GOOD}[retention]\nretention_secs = 3600\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\n"
        );
        // TTL + lock × count + the default 7-day DLQ resubmission window.
        let errors = load(&short, &[]).unwrap_err();
        assert!(errors.to_string().contains("at least 691800"), "{errors}");
        let config = load(&short, &[("SB_INBOX_RETENTION_SECS", "691800")]).unwrap();
        assert_eq!(
            config.retention.unwrap().retention,
            Duration::from_secs(691_800)
        );
        let no_window = [
            ("SB_INBOX_RETENTION_SECS", "87000"),
            ("SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS", "0"),
        ];
        assert!(load(&short, &no_window).is_ok());
    }

    #[test]
    fn session_mode_from_file_or_env_with_its_keys_and_without_retries() {
        assert!(load(GOOD, &[]).unwrap().sessions.is_none());
        let on = format!("{GOOD}max_sessions = 3\n");
        let on = on.replace(
            "entity = \"orders\"",
            "entity = \"orders\"\nsessions = true",
        );
        let sessions = load(&on, &[]).unwrap().sessions.unwrap();
        assert_eq!(sessions.max_sessions, 3);
        assert_eq!(sessions.idle, Duration::from_secs(5));
        let from_env = load(
            GOOD,
            &[
                ("SB_INBOX_SESSIONS", "true"),
                ("SB_INBOX_SESSION_IDLE_SECS", "2"),
            ],
        )
        .unwrap()
        .sessions
        .unwrap();
        assert_eq!(from_env.idle, Duration::from_secs(2));
        assert_eq!(from_env.max_sessions, 8);
        let text = |errors: ConfigErrors| errors.to_string();
        let bad = text(load(GOOD, &[("SB_INBOX_SESSIONS", "maybe")]).unwrap_err());
        assert!(
            bad.contains("servicebus.sessions (SB_INBOX_SESSIONS)"),
            "{bad}"
        );
        let orphan = text(load(GOOD, &[("SB_INBOX_MAX_SESSIONS", "2")]).unwrap_err());
        assert!(
            orphan.contains("has no effect without servicebus.sessions"),
            "{orphan}"
        );
        let with_retries = text(
            load(
                GOOD,
                &[
                    ("SB_INBOX_SESSIONS", "1"),
                    ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
                ],
            )
            .unwrap_err(),
        );
        assert!(
            with_retries.contains("cannot keep a session's order"),
            "{with_retries}"
        );
    }

    #[test]
    fn session_mode_refuses_batched_transactions() {
        let batched = ConfigErrors::to_string(
            &load(
                GOOD,
                &[("SB_INBOX_SESSIONS", "true"), ("SB_INBOX_BATCH_SIZE", "16")],
            )
            .unwrap_err(),
        );
        assert!(
            batched.contains("runtime.batch_size (SB_INBOX_BATCH_SIZE)")
                && batched.contains("one at a time"),
            "{batched}"
        );
        let single = load(
            GOOD,
            &[("SB_INBOX_SESSIONS", "true"), ("SB_INBOX_BATCH_SIZE", "1")],
        )
        .unwrap();
        assert!(single.sessions.is_some());
    }

    #[test]
    fn delayed_retries_are_off_by_default_and_validated() {
        assert!(load(GOOD, &[]).unwrap().retry.is_none());
        let config = load(
            &format!("{GOOD}[retry]\nmax_retries = 4\nbase_delay_secs = 5\n"),
            &[("SB_INBOX_RETRY_JITTER_PERCENT", "0")],
        )
        .unwrap();
        let policy = config.retry.unwrap();
        assert_eq!(
            (
                policy.max_retries(),
                policy.base_delay(),
                policy.max_delay()
            ),
            (4, Duration::from_secs(5), Duration::from_secs(600))
        );
        assert_eq!(policy.delay(3), Duration::from_secs(20));

        let errors = load(
            GOOD,
            &[
                ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
                ("SB_INBOX_RETRY_BASE_DELAY_SECS", "60"),
                ("SB_INBOX_RETRY_MAX_DELAY_SECS", "30"),
                ("SB_INBOX_RETRY_JITTER_PERCENT", "101"),
            ],
        )
        .unwrap_err();
        let fields: Vec<&str> = errors.0.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "retry.jitter_percent (SB_INBOX_RETRY_JITTER_PERCENT)",
                "retry.max_delay_secs (SB_INBOX_RETRY_MAX_DELAY_SECS)",
            ],
            "{errors}"
        );

        let errors = load(
            GOOD,
            &[
                ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
                ("SB_INBOX_ENTITY", "orders/Subscriptions/inventory"),
            ],
        )
        .unwrap_err();
        assert!(errors.to_string().contains("ForwardTo"), "{errors}");
        let off = load(
            GOOD,
            &[("SB_INBOX_ENTITY", "orders/Subscriptions/inventory")],
        )
        .unwrap();
        assert!(off.retry.is_none());
    }

    #[test]
    fn delayed_retries_lengthen_the_replay_horizon() {
        let retention = format!(
            "{GOOD}[retention]\nretention_secs = 87000\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\ndlq_resubmit_window_secs = 0\n"
        );
        assert!(load(&retention, &[]).is_ok());
        let errors = load(
            &retention,
            &[
                ("SB_INBOX_RETRY_MAX_RETRIES", "5"),
                ("SB_INBOX_RETRY_MAX_DELAY_SECS", "600"),
            ],
        )
        .unwrap_err();
        assert!(errors.to_string().contains("at least 90000"), "{errors}");
    }

    #[test]
    fn relay_and_retention_settings_have_defaults_and_bounds() {
        let config = load(GOOD, &[]).unwrap();
        assert_eq!(config.relay, RelayConfig::default());
        let horizon = "[retention]\nretention_secs = 172800\nmessage_ttl_secs = 86400\nlock_duration_secs = 60\nmax_delivery_count = 10\ndlq_resubmit_window_secs = 0\n";
        let config = load(
            &format!("{GOOD}[outbox]\nbatch_size = 50\n{horizon}interval_secs = 60\n"),
            &[
                ("SB_INBOX_OUTBOX_POLL_MS", "250"),
                ("SB_INBOX_OUTBOX_LEASE_SECS", "30"),
                ("SB_INBOX_RETENTION_BATCH", "4000"),
            ],
        )
        .unwrap();
        assert_eq!(
            config.relay,
            RelayConfig {
                batch_size: 50,
                poll_interval: Duration::from_millis(250),
                lease: Duration::from_secs(30),
            }
        );
        let task = config.retention.unwrap().task_config();
        assert_eq!(
            (task.retention, task.batch_size, task.interval),
            (Duration::from_secs(172_800), 4000, Duration::from_secs(60))
        );
        let defaults = load(&format!("{GOOD}{horizon}"), &[]).unwrap();
        let task = defaults.retention.unwrap().task_config();
        assert_eq!(
            (task.batch_size, task.interval),
            (1000, Duration::from_secs(300))
        );

        let errors = load(
            GOOD,
            &[
                ("SB_INBOX_OUTBOX_BATCH", "0"),
                ("SB_INBOX_OUTBOX_LEASE_SECS", "1"),
                ("SB_INBOX_RETENTION_BATCH", "5000"),
                ("SB_INBOX_RETENTION_INTERVAL_SECS", "60"),
            ],
        )
        .unwrap_err();
        let problems: Vec<String> = errors
            .0
            .iter()
            .map(|e| format!("{}: {}", e.field, e.problem))
            .collect();
        assert_eq!(
            problems,
            [
                "outbox.batch_size (SB_INBOX_OUTBOX_BATCH): 0 is outside 1..=1000",
                "outbox.lease_secs (SB_INBOX_OUTBOX_LEASE_SECS): 1 is outside 5..=3600",
                "retention.batch_size (SB_INBOX_RETENTION_BATCH): 5000 is outside 1..=4000",
                "retention.interval_secs (SB_INBOX_RETENTION_INTERVAL_SECS): has no effect without retention.retention_secs (SB_INBOX_RETENTION_SECS): nothing is deleted",
            ]
        );
    }

    #[test]
    fn lock_margin_must_be_shorter_than_the_lock() {
        let errors = load(GOOD, &[("SB_INBOX_LOCK_DURATION_SECS", "5")]).unwrap_err();
        assert!(
            errors
                .to_string()
                .contains("shorter than the lock duration"),
            "{errors}"
        );
    }

    const LISTED: &str = r#"
store = "sqlite://inbox.db"
[servicebus]
connection = "Endpoint=sb://localhost:5699;SharedAccessKeyName=k;SharedAccessKey=SECRET;UseDevelopmentEmulator=true"
[runtime]
concurrency = 4
prefetch = 2
lock_margin_secs = 5
[[consumers]]
name = "shop.inventory"
entity = "orders"
[[consumers]]
name = "shop.payments"
entity = "payments/Subscriptions/ledger"
concurrency = 1
prefetch = 0
"#;

    #[test]
    fn consumers_listed_take_runtime_settings_as_defaults() {
        let config = load(LISTED, &[]).unwrap();
        let got: Vec<_> = config
            .consumers
            .iter()
            .map(|c| {
                (
                    c.name().as_str(),
                    c.entity.as_str(),
                    c.runtime.concurrency,
                    c.runtime.prefetch,
                    c.runtime.lock_margin,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("shop.inventory", "orders", 4, 2, Duration::from_secs(5)),
                (
                    "shop.payments",
                    "payments/Subscriptions/ledger",
                    1,
                    0,
                    Duration::from_secs(5)
                ),
            ]
        );
        // The first consumer doubles as the single-consumer fields.
        assert_eq!(
            (config.runtime.consumer.as_str(), config.entity.as_str()),
            ("shop.inventory", "orders")
        );
        // Without [[consumers]], the top-level keys make the only one.
        let single = load(GOOD, &[]).unwrap();
        assert_eq!(single.consumers.len(), 1);
        assert_eq!(single.consumers[0].entity, "orders");
    }

    #[test]
    fn consumers_listed_are_checked_entry_by_entry() {
        let fields = |toml: &str, env: &[(&str, &str)]| -> Vec<String> {
            load(toml, env)
                .unwrap_err()
                .0
                .into_iter()
                .map(|e| e.field)
                .collect()
        };
        let bad = format!(
            "{LISTED}[[consumers]]\nname = \"shop.inventory\"\n[[consumers]]\nname = \"Bad Name\"\nentity = \"x\"\nconcurrency = 0\n"
        );
        assert_eq!(
            fields(&bad, &[]),
            [
                "consumers[2].name",
                "consumers[2].entity",
                "consumers[3].name",
                "consumers[3].concurrency"
            ]
        );
        // Top-level consumer or entity beside the list is ambiguous.
        assert_eq!(
            fields(
                LISTED,
                &[("SB_INBOX_CONSUMER", "x"), ("SB_INBOX_ENTITY", "y")]
            ),
            [
                "consumer (SB_INBOX_CONSUMER)",
                "servicebus.entity (SB_INBOX_ENTITY)"
            ]
        );
        // Delayed retries refuse a subscription anywhere in the list.
        assert_eq!(
            fields(LISTED, &[("SB_INBOX_RETRY_MAX_RETRIES", "3")]),
            ["retry.max_retries (SB_INBOX_RETRY_MAX_RETRIES)"]
        );
    }
}
