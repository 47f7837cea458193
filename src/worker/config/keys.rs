//! Every `worker.toml` key with the environment variable that overrides it, as typed constants:
//! a misspelt key is a compile error, never a silently lost override.

use std::fmt;

/// The prefix of the environment variables that override the file's keys, unless
/// [`super::WorkerConfig::load_with_prefix`] names another.
pub const DEFAULT_ENV_PREFIX: &str = "SB_INBOX_";

/// One configuration key: where it sits in `worker.toml`, the `SB_INBOX_*` variable that
/// overrides it, and what it means (the `--help` line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key {
    /// The environment variable.
    pub env: &'static str,
    /// Where it sits in `worker.toml`: `section.name`, or `name` at the top level.
    pub file: &'static str,
    /// What the value means, for `--help` and the docs.
    pub meaning: &'static str,
}

impl Key {
    const fn new(env: &'static str, file: &'static str, meaning: &'static str) -> Key {
        Key { env, file, meaning }
    }

    /// `(variable, file key, meaning)`, the row [`ENV_VARS`] lists.
    pub const fn row(self) -> (&'static str, &'static str, &'static str) {
        (self.env, self.file, self.meaning)
    }
}

/// `file.key (SB_INBOX_VARIABLE)`: how problems name the key.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.file, self.env)
    }
}

/// A key that moved to another section: the old place is still read, with a warning naming the
/// new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Moved {
    /// Where the key used to sit.
    pub old: &'static str,
    /// Where it sits now.
    pub new: Key,
}

pub(super) const CONSUMER: Key = Key::new(
    "SB_INBOX_CONSUMER",
    "consumer",
    "stable consumer name (half of the inbox key)",
);
pub(super) const STORE: Key = Key::new(
    "SB_INBOX_STORE",
    "store",
    "store URL: postgres://…, sqlite://PATH, sqlite::memory:",
);
pub(super) const CONNECTION: Key = Key::new(
    "SB_INBOX_SERVICEBUS_CONNECTION",
    "servicebus.connection",
    "connection string (SAS or emulator)",
);
pub(super) const NAMESPACE: Key = Key::new(
    "SB_INBOX_SERVICEBUS_NAMESPACE",
    "servicebus.namespace",
    "NAME.servicebus.windows.net: Entra ID (AZURE_CLIENT_ID: user-assigned identity)",
);
pub(super) const TRANSPORT: Key = Key::new(
    "SB_INBOX_SERVICEBUS_TRANSPORT",
    "servicebus.transport",
    "amqp (TCP, 5671) or websockets (wss://HOST:443); default: the connection string's TransportType, else amqp",
);
pub(super) const CA_FILE: Key = Key::new(
    "SB_INBOX_SERVICEBUS_CA_FILE",
    "servicebus.ca_file",
    "PEM bundle of extra CAs trusted for amqps/wss (an inspecting proxy's, a test emulator's); default: SSL_CERT_FILE",
);
pub(super) const NATIVE_ROOTS: Key = Key::new(
    "SB_INBOX_SERVICEBUS_NATIVE_ROOTS",
    "servicebus.native_roots",
    "true: also trust the operating system's certificate store (default: Mozilla's roots only)",
);
pub(super) const ENTITY: Key = Key::new(
    "SB_INBOX_ENTITY",
    "servicebus.entity",
    "queue, or TOPIC/Subscriptions/SUBSCRIPTION",
);
pub(super) const SESSIONS: Key = Key::new(
    "SB_INBOX_SESSIONS",
    "servicebus.sessions",
    "true: session mode (the entity requires sessions; each session in order, one message at a time)",
);
pub(super) const MAX_SESSIONS: Key = Key::new(
    "SB_INBOX_MAX_SESSIONS",
    "runtime.max_sessions",
    "session mode: sessions processed at once (default 8)",
);
pub(super) const SESSION_IDLE_SECS: Key = Key::new(
    "SB_INBOX_SESSION_IDLE_SECS",
    "runtime.session_idle_secs",
    "session mode: release a session quiet this long and take the next (default 5)",
);
pub(super) const CONCURRENCY: Key = Key::new(
    "SB_INBOX_CONCURRENCY",
    "runtime.concurrency",
    "deliveries handled at once (default 8)",
);
pub(super) const PREFETCH: Key = Key::new(
    "SB_INBOX_PREFETCH",
    "runtime.prefetch",
    "deliveries received ahead (default 0)",
);
pub(super) const LOCK_MARGIN_SECS: Key = Key::new(
    "SB_INBOX_LOCK_MARGIN_SECS",
    "runtime.lock_margin_secs",
    "renew this long before expiry (default 10)",
);
pub(super) const MAX_PROCESSING_SECS: Key = Key::new(
    "SB_INBOX_MAX_PROCESSING_SECS",
    "runtime.max_processing_secs",
    "longest a delivery is handled before it is cancelled, rolled back and abandoned (default 300)",
);
pub(super) const BATCH_SIZE: Key = Key::new(
    "SB_INBOX_BATCH_SIZE",
    "runtime.batch_size",
    "deliveries per database transaction, a savepoint each (default 1: no batching)",
);
pub(super) const BATCH_LINGER_MS: Key = Key::new(
    "SB_INBOX_BATCH_LINGER_MS",
    "runtime.batch_linger_ms",
    "how long a batch waits for more deliveries after its first, only while every other slot runs a batch (default 5)",
);
pub(super) const SERVER_BUSY_WAIT_MS: Key = Key::new(
    "SB_INBOX_SERVICEBUS_SERVER_BUSY_WAIT_MS",
    "servicebus.server_busy_wait_ms",
    "after the service answers busy, every operation of the worker's client waits this long (default 10000, .NET's client-wide wait; Java waits 4000)",
);
pub(super) const MAX_PANICS: Key = Key::new(
    "SB_INBOX_MAX_PANICS",
    "runtime.max_panics",
    "a handler panic on a delivery numbered this or later dead-letters it HandlerPanicked; earlier ones are abandoned (default 3)",
);
pub(super) const UNKNOWN_CONTRACTS: Key = Key::new(
    "SB_INBOX_UNKNOWN_CONTRACTS",
    "runtime.unknown_contracts",
    "a contract name no handler accepts: dead-letter (UnsupportedContract, the default) or complete (counted; for topics carrying other teams' events); consumers[].unknown_contracts per consumer",
);
pub(super) const TRANSIENT_HOLD_MAX_MS: Key = Key::new(
    "SB_INBOX_TRANSIENT_HOLD_MAX_MS",
    "runtime.transient_hold_max_ms",
    "longest hold (lock kept) of a transient failure before its abandon, growing from 250 ms with the delivery count; 0: abandon at once (default 5000)",
);
pub(super) const CIRCUIT_ENABLED: Key = Key::new(
    "SB_INBOX_CIRCUIT_ENABLED",
    "runtime.circuit.enabled",
    "kill switch: pause deliveries while the store fails for every message alike (default true)",
);
pub(super) const CIRCUIT_CONSECUTIVE_FAILURES: Key = Key::new(
    "SB_INBOX_CIRCUIT_CONSECUTIVE_FAILURES",
    "runtime.circuit.consecutive_failures",
    "systemic store failures in a row that pause deliveries (default 5)",
);
pub(super) const CIRCUIT_FAILURE_RATE_PERCENT: Key = Key::new(
    "SB_INBOX_CIRCUIT_FAILURE_RATE_PERCENT",
    "runtime.circuit.failure_rate_percent",
    "or: share of systemic failures among at least 20 store answers in the window that pauses deliveries; 100: off (default 50)",
);
pub(super) const CIRCUIT_WINDOW_SECS: Key = Key::new(
    "SB_INBOX_CIRCUIT_WINDOW_SECS",
    "runtime.circuit.window_secs",
    "the failure rate's window (default 30)",
);
pub(super) const CIRCUIT_PROBE_MIN_MS: Key = Key::new(
    "SB_INBOX_CIRCUIT_PROBE_MIN_MS",
    "runtime.circuit.probe_min_ms",
    "first store probe after a pause; doubles up to the max (default 1000)",
);
pub(super) const CIRCUIT_PROBE_MAX_SECS: Key = Key::new(
    "SB_INBOX_CIRCUIT_PROBE_MAX_SECS",
    "runtime.circuit.probe_max_secs",
    "longest wait between store probes while paused (default 30)",
);
pub(super) const SHUTDOWN_GRACE_SECS: Key = Key::new(
    "SB_INBOX_SHUTDOWN_GRACE_SECS",
    "runtime.shutdown_grace_secs",
    "drain time on SIGTERM (default 30)",
);
pub(super) const RETRY_MAX_RETRIES: Key = Key::new(
    "SB_INBOX_RETRY_MAX_RETRIES",
    "retry.max_retries",
    "delayed retries before RetriesExhausted (default 0: off, abandon)",
);
pub(super) const RETRY_BASE_DELAY_SECS: Key = Key::new(
    "SB_INBOX_RETRY_BASE_DELAY_SECS",
    "retry.base_delay_secs",
    "first delayed retry waits this long (default 10)",
);
pub(super) const RETRY_MAX_DELAY_SECS: Key = Key::new(
    "SB_INBOX_RETRY_MAX_DELAY_SECS",
    "retry.max_delay_secs",
    "longest delayed-retry wait (default 600)",
);
pub(super) const RETRY_JITTER_PERCENT: Key = Key::new(
    "SB_INBOX_RETRY_JITTER_PERCENT",
    "retry.jitter_percent",
    "shorten each delay by up to this % (default 20)",
);
pub(super) const HEALTH_PORT: Key = Key::new(
    "SB_INBOX_HEALTH_PORT",
    "health.port",
    "serve /healthz and /readyz on this port",
);
pub(super) const OUTBOX_BATCH: Key = Key::new(
    "SB_INBOX_OUTBOX_BATCH",
    "outbox.batch_size",
    "rows the relay claims per pass at least (default 100; more, up to 4000, for a distant broker)",
);
pub(super) const OUTBOX_POLL_MS: Key = Key::new(
    "SB_INBOX_OUTBOX_POLL_MS",
    "outbox.poll_interval_ms",
    "relay poll interval when idle (default 500)",
);
pub(super) const OUTBOX_LEASE_SECS: Key = Key::new(
    "SB_INBOX_OUTBOX_LEASE_SECS",
    "outbox.lease_secs",
    "how long a claim reserves rows (default 60)",
);
pub(super) const OUTBOX_ORDERED: Key = Key::new(
    "SB_INBOX_OUTBOX_ORDERED",
    "outbox.ordered",
    "publish each destination's rows without a session id in write order (default false; session rows always are)",
);
pub(super) const RETENTION_SECS: Key = Key::new(
    "SB_INBOX_RETENTION_SECS",
    "retention.retention_secs",
    "delete inbox rows older than this",
);
pub(super) const RETENTION_BATCH: Key = Key::new(
    "SB_INBOX_RETENTION_BATCH",
    "retention.batch_size",
    "rows per delete (default 1000, max 4000)",
);
pub(super) const RETENTION_INTERVAL_SECS: Key = Key::new(
    "SB_INBOX_RETENTION_INTERVAL_SECS",
    "retention.interval_secs",
    "time between sweeps (default 300)",
);
pub(super) const MESSAGE_TTL_SECS: Key = Key::new(
    "SB_INBOX_MESSAGE_TTL_SECS",
    "entity.message_ttl_secs",
    "the entity's DefaultMessageTimeToLive",
);
pub(super) const LOCK_DURATION_SECS: Key = Key::new(
    "SB_INBOX_LOCK_DURATION_SECS",
    "entity.lock_duration_secs",
    "the entity's LockDuration",
);
pub(super) const MAX_DELIVERY_COUNT: Key = Key::new(
    "SB_INBOX_MAX_DELIVERY_COUNT",
    "entity.max_delivery_count",
    "the entity's MaxDeliveryCount",
);
pub(super) const DLQ_RESUBMIT_WINDOW_SECS: Key = Key::new(
    "SB_INBOX_DLQ_RESUBMIT_WINDOW_SECS",
    "retention.dlq_resubmit_window_secs",
    "how long DLQ resubmission stays allowed (default 604800: 7 days; `dlq resubmit` refuses older dead letters)",
);

pub(super) const ENVELOPE_KIND: Key = Key::new(
    "SB_INBOX_ENVELOPE",
    "envelope.kind",
    "how deliveries are read: subject (default: subject = name.vN), masstransit, nservicebus, cloudevents, raw",
);
pub(super) const ENVELOPE_TYPES: Key = Key::new(
    "SB_INBOX_ENVELOPE_TYPES",
    "envelope.types",
    "table: a foreign type name = its contract (name.vN); the variable takes TYPE=CONTRACT pairs separated by ; (unmapped types that are not name.vN: dead-lettered UnsupportedContract)",
);
pub(super) const ENVELOPE_CONTRACT: Key = Key::new(
    "SB_INBOX_ENVELOPE_CONTRACT",
    "envelope.contract",
    "raw envelope: every message is this contract (name.vN)",
);
pub(super) const ENVELOPE_CONTRACT_FROM: Key = Key::new(
    "SB_INBOX_ENVELOPE_CONTRACT_FROM",
    "envelope.contract_from",
    "raw envelope: the contract (or with version_from, its name) from property:NAME or pointer:/JSON/POINTER",
);
pub(super) const ENVELOPE_VERSION_FROM: Key = Key::new(
    "SB_INBOX_ENVELOPE_VERSION_FROM",
    "envelope.version_from",
    "raw envelope: the contract version (2, \"2\" or \"v2\") from property:NAME or pointer:/PATH",
);
pub(super) const ENVELOPE_ID_FROM: Key = Key::new(
    "SB_INBOX_ENVELOPE_ID_FROM",
    "envelope.id_from",
    "raw envelope: the message id (the inbox key) from property:NAME or pointer:/PATH (default: the broker message id)",
);

/// Every key, in `--help` order.
pub const KEYS: [Key; 50] = [
    CONSUMER,
    STORE,
    CONNECTION,
    NAMESPACE,
    TRANSPORT,
    SERVER_BUSY_WAIT_MS,
    CA_FILE,
    NATIVE_ROOTS,
    ENTITY,
    ENVELOPE_KIND,
    ENVELOPE_TYPES,
    ENVELOPE_CONTRACT,
    ENVELOPE_CONTRACT_FROM,
    ENVELOPE_VERSION_FROM,
    ENVELOPE_ID_FROM,
    SESSIONS,
    MAX_SESSIONS,
    SESSION_IDLE_SECS,
    CONCURRENCY,
    PREFETCH,
    LOCK_MARGIN_SECS,
    MAX_PROCESSING_SECS,
    BATCH_SIZE,
    BATCH_LINGER_MS,
    MAX_PANICS,
    TRANSIENT_HOLD_MAX_MS,
    UNKNOWN_CONTRACTS,
    CIRCUIT_ENABLED,
    CIRCUIT_CONSECUTIVE_FAILURES,
    CIRCUIT_FAILURE_RATE_PERCENT,
    CIRCUIT_WINDOW_SECS,
    CIRCUIT_PROBE_MIN_MS,
    CIRCUIT_PROBE_MAX_SECS,
    SHUTDOWN_GRACE_SECS,
    RETRY_MAX_RETRIES,
    RETRY_BASE_DELAY_SECS,
    RETRY_MAX_DELAY_SECS,
    RETRY_JITTER_PERCENT,
    HEALTH_PORT,
    OUTBOX_BATCH,
    OUTBOX_POLL_MS,
    OUTBOX_LEASE_SECS,
    OUTBOX_ORDERED,
    RETENTION_SECS,
    RETENTION_BATCH,
    RETENTION_INTERVAL_SECS,
    MESSAGE_TTL_SECS,
    LOCK_DURATION_SECS,
    MAX_DELIVERY_COUNT,
    DLQ_RESUBMIT_WINDOW_SECS,
];

/// `[retention]`'s old `message_ttl_secs`.
pub(super) const OLD_MESSAGE_TTL_SECS: Moved = Moved {
    old: "retention.message_ttl_secs",
    new: MESSAGE_TTL_SECS,
};
/// `[retention]`'s old `lock_duration_secs`.
pub(super) const OLD_LOCK_DURATION_SECS: Moved = Moved {
    old: "retention.lock_duration_secs",
    new: LOCK_DURATION_SECS,
};
/// `[retention]`'s old `max_delivery_count`.
pub(super) const OLD_MAX_DELIVERY_COUNT: Moved = Moved {
    old: "retention.max_delivery_count",
    new: MAX_DELIVERY_COUNT,
};

/// The keys that moved to `[entity]`: read from `[retention]` still, with a warning.
pub const MOVED: [Moved; 3] = [
    OLD_MESSAGE_TTL_SECS,
    OLD_LOCK_DURATION_SECS,
    OLD_MAX_DELIVERY_COUNT,
];

const fn rows<const N: usize>(keys: [Key; N]) -> [(&'static str, &'static str, &'static str); N] {
    let mut rows = [("", "", ""); N];
    let mut i = 0;
    while i < N {
        rows[i] = keys[i].row();
        i += 1;
    }
    rows
}

const ROWS: [(&str, &str, &str); KEYS.len()] = rows(KEYS);

/// The environment variables that override `worker.toml`, with the file key each one replaces
/// and its meaning: [`KEYS`] as `(variable, file key, meaning)`.
pub const ENV_VARS: &[(&str, &str, &str)] = &ROWS;
