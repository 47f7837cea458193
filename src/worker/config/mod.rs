//! [`WorkerConfig`]: a configuration file (`worker.json`; `worker.toml` with the `toml` feature)
//! with environment overrides (`SB_INBOX_*`, or a prefix of the service's own), read section by
//! section and validated as a whole, so one run reports every mistake.
//!
//! # Layout
//! - [`keys`](Key): every key with its variable, as typed constants ([`ENV_VARS`] lists them
//!   for `--help` and the docs), and the keys that [`Moved`].
//! - `reader`: reads a value from its variable or the file and collects problems
//!   ([`ConfigErrors`], in `error`).
//! - One module per section: `consumers` (`consumer` or `[[consumers]]`), `broker`
//!   (`[servicebus]`, [`BrokerAddress`]), `runtime` (`[runtime]` and session mode), `retry`,
//!   `outbox` (the destination and its relay), `entity` (the entity's TTL, lock duration and max
//!   delivery count), `retention` (checked against the replay horizon) and `envelope` (how each
//!   consumer reads its deliveries).

mod broker;
mod consumers;
mod entity;
mod envelope;
mod error;
mod keys;
mod outbox;
mod reader;
mod retention;
mod retry;
mod runtime;
mod unknown;

use std::path::Path;

use serde::Deserialize;

pub use broker::BrokerAddress;
pub use entity::DeclaredEntity;
pub use error::{ConfigError, ConfigErrors};
pub use keys::{DEFAULT_ENV_PREFIX, ENV_VARS, KEYS, Key, MOVED, Moved};
pub use unknown::UnknownVariable;

use super::{ConsumerConfig, ReplayHorizon};
use crate::relay::RelayConfig;
use crate::retention::RetentionConfig;
use crate::runtime::{RetryPolicy, RuntimeConfig, SessionConfig};
use crate::servicebus::TrustRoots;
use crate::store::StoreUrl;
use reader::Reader;

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
    /// How long the client waits after the service answered busy.
    pub server_busy_wait: std::time::Duration,
    /// The certificate authorities trusted for `amqps`/`wss` (`servicebus.ca_file`,
    /// `servicebus.native_roots`).
    pub trust: TrustRoots,
    /// The HTTP proxy AMQP over WebSockets goes through (`HTTPS_PROXY`, `NO_PROXY`).
    pub proxy: crate::servicebus::ProxyConfig,
    /// The entity the first consumer consumes.
    pub entity: String,
    /// Every consumer the worker hosts, in file order: the top-level `consumer` on
    /// `servicebus.entity`, or each `[[consumers]]` entry (name, entity, and concurrency and
    /// prefetch defaulting to `runtime.*`); the other `runtime.*` settings apply to all.
    pub consumers: Vec<ConsumerConfig>,
    /// Port for `/healthz` and `/readyz`.
    pub health_port: Option<u16>,
    /// Delayed retries for transient failures (copies go to [`WorkerConfig::entity`], which must
    /// be a queue); `None` abandons them.
    pub retry: Option<RetryPolicy>,
    /// The outbox relay.
    pub relay: RelayConfig,
    /// Retention, when inbox rows are to be deleted; it covers [`WorkerConfig::horizon`].
    pub retention: Option<RetentionConfig>,
    /// The replay horizon, when `[entity]` gives the entity's TTL, lock duration and max
    /// delivery count.
    pub horizon: Option<ReplayHorizon>,
    /// What `[entity]` says of the first consumer's entity, checked at start-up against the
    /// entity read from the management API ([`crate::worker::entity_check`]).
    pub declared_entity: DeclaredEntity,
    /// Session mode (`servicebus.sessions = true`), for every consumer.
    pub sessions: Option<SessionConfig>,
}

/// `worker.toml` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    consumer: Option<String>,
    store: Option<String>,
    #[serde(default)]
    servicebus: broker::ServiceBusFile,
    #[serde(default)]
    runtime: runtime::RuntimeFile,
    #[serde(default)]
    health: HealthFile,
    #[serde(default)]
    outbox: outbox::OutboxFile,
    #[serde(default)]
    retry: retry::RetryFile,
    #[serde(default)]
    entity: entity::EntityFile,
    #[serde(default)]
    retention: entity::RetentionFile,
    #[serde(default)]
    consumers: Vec<consumers::ConsumerFile>,
    #[serde(default)]
    envelope: envelope::EnvelopeFile,
}

impl File {
    /// The file at `path`, or an empty one without a path: JSON when its name ends in `.json`
    /// (serde_json is a dependency anyway), else TOML (the `toml` feature; the `sb-inbox`
    /// binary has it). One schema for both: the keys and sections are the same.
    fn read(path: Option<&Path>) -> Result<File, ConfigErrors> {
        let Some(path) = path else {
            return Ok(File::default());
        };
        let fail = |problem| ConfigErrors::single("--config", problem);
        let text = std::fs::read_to_string(path)
            .map_err(|e| fail(format!("cannot read {}: {e}", path.display())))?;
        if path
            .extension()
            .is_some_and(|ext| ext.eq_ignore_ascii_case("json"))
        {
            return serde_json::from_str::<File>(&text)
                .map_err(|e| fail(format!("{}: {e}", path.display())));
        }
        Self::toml(path, &text).map_err(fail)
    }

    #[cfg(feature = "toml")]
    fn toml(path: &Path, text: &str) -> Result<File, String> {
        toml::from_str::<File>(text).map_err(|e| format!("{}: {}", path.display(), e.message()))
    }

    #[cfg(not(feature = "toml"))]
    fn toml(path: &Path, _text: &str) -> Result<File, String> {
        Err(format!(
            "{}: TOML configuration needs the `toml` cargo feature; write it as JSON (a `.json` \
             file) or turn the feature on",
            path.display()
        ))
    }
}

/// The `[health]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    port: Option<u64>,
}

impl WorkerConfig {
    /// Reads `path` (if given), applies the environment overrides from `env`, and validates.
    ///
    /// Keys in their old place (`[retention]`'s entity keys, see [`MOVED`]) are read with a
    /// warning naming the new key.
    ///
    /// # Errors
    /// [`ConfigErrors`] listing every problem: unreadable or unknown file keys, missing values,
    /// bad numbers, an invalid consumer name, store URL or connection string, a lock margin not
    /// shorter than the lock, retention shorter than the replay horizon.
    pub fn load(
        path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        Self::load_with_prefix(path, DEFAULT_ENV_PREFIX, env)
    }

    /// As [`WorkerConfig::load`], with the overrides read from variables named `prefix` + the
    /// key's name instead of `SB_INBOX_` + it (`ORDERS_STORE` for `store` with prefix
    /// `ORDERS_`), so two services on one host, or a service with its own naming, keep theirs
    /// apart. Variables that are not keys' overrides (`AZURE_CLIENT_ID`, `HTTPS_PROXY`) keep
    /// their standard names. Problems name each key by the variable read (`runtime.concurrency
    /// (ORDERS_CONCURRENCY)`), hints included.
    ///
    /// # Examples
    /// ```
    /// use sb_inbox::worker::WorkerConfig;
    /// let env = |name: &str| match name {
    ///     "ORDERS_STORE" => Some("sqlite::memory:".to_owned()),
    ///     "ORDERS_CONSUMER" => Some("shop.orders".to_owned()),
    ///     "ORDERS_SERVICEBUS_CONNECTION" => Some(
    ///         "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=s;UseDevelopmentEmulator=true"
    ///             .to_owned(),
    ///     ),
    ///     "ORDERS_ENTITY" => Some("orders".to_owned()),
    ///     _ => None,
    /// };
    /// let config = WorkerConfig::load_with_prefix(None, "ORDERS_", &env).unwrap();
    /// assert_eq!(config.consumers[0].name().as_str(), "shop.orders");
    /// ```
    ///
    /// # Errors
    /// As [`WorkerConfig::load`].
    pub fn load_with_prefix(
        path: Option<&Path>,
        prefix: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Self, ConfigErrors> {
        let prefixed = |name: &str| match name.strip_prefix(DEFAULT_ENV_PREFIX) {
            Some(key) => env(&format!("{prefix}{key}")),
            None => env(name),
        };
        let env: &dyn Fn(&str) -> Option<String> = &prefixed;
        let file = File::read(path)?;
        // Sections are read in this order so problems are listed roughly as the file reads.
        let mut r = Reader::new(env, prefix);
        let listed = !file.consumers.is_empty();
        let consumer = consumers::single_name(&mut r, file.consumer, listed);
        let store = store(&mut r, file.store);
        let broker = broker::address(&mut r, &file.servicebus);
        let server_busy_wait = broker::server_busy_wait(&mut r, &file.servicebus);
        let trust = broker::trust(&mut r, &file.servicebus);
        let proxy = broker::proxy(&mut r);
        let entity = broker::entity(&mut r, &file.servicebus, broker.as_ref(), listed);
        let runtime = runtime::RuntimeSection::read(&mut r, &file.runtime);
        let envelope = envelope::top_level(&mut r, &file.envelope);
        // Port 0 picks a free port, logged at start-up.
        let health_port = r
            .number(keys::HEALTH_PORT, file.health.port, 0..=65_535)
            .and_then(|p| u16::try_from(p).ok());
        outbox::refuse_destination(&mut r, &file.outbox);
        let listed = consumers::listed(&mut r, &file.consumers, &runtime);
        let subscription = consumers::subscription(&listed, entity.as_deref());
        let retry = retry::policy(&mut r, &file.retry, subscription);
        let batched = runtime.batch_size > 1;
        let sessions_on = file.servicebus.sessions;
        let sessions =
            runtime::sessions(&mut r, sessions_on, &file.runtime, retry.is_some(), batched);
        let relay = outbox::relay(&mut r, &file.outbox);
        let entity_settings = entity::EntitySettings::read(&mut r, &file.entity, &file.retention);
        runtime.check_margin(&mut r, entity_settings.lock_duration_secs);
        let retry_span = retry::span(retry.as_ref());
        let retention = retention::RetentionSection::read(
            &mut r,
            &file.retention,
            &entity_settings,
            retry_span,
        );
        let lock_duration = entity_settings.lock_duration();
        let consumers = consumers::hosted(
            (consumer, entity),
            listed,
            &runtime,
            lock_duration,
            envelope.as_ref(),
        );
        let (Some(first), Some(store), Some(broker), false) =
            (consumers.first().cloned(), store, broker, r.has_errors())
        else {
            return Err(ConfigErrors(r.into_errors()));
        };
        Ok(WorkerConfig {
            trust,
            proxy,
            runtime: first.runtime,
            store,
            broker,
            server_busy_wait,
            entity: first.entity,
            consumers,
            health_port,
            retry,
            relay,
            retention: retention.retention,
            horizon: retention.horizon,
            declared_entity: entity_settings.declared(retry_span, retention.dlq_window),
            sessions,
        })
    }
}

impl WorkerConfig {
    /// [`WorkerConfig::load_with_prefix`] from the process environment, after warning (a
    /// `tracing` warning each) about every set variable under `prefix` that is no key's
    /// override, naming the nearest key's: a misspelt override is ignored, and the warning is
    /// how an operator learns it. Call it after installing the subscriber.
    ///
    /// # Errors
    /// As [`WorkerConfig::load`].
    pub fn load_from_env(path: Option<&Path>, prefix: &str) -> Result<Self, ConfigErrors> {
        let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
        for unknown in Self::unknown_variables(prefix, names) {
            tracing::warn!(
                variable = %unknown.name,
                nearest = %unknown.nearest,
                "An environment variable under the configuration's prefix is no setting; it is ignored."
            );
        }
        Self::load_with_prefix(path, prefix, &|name| std::env::var(name).ok())
    }

    /// The variables among `names` that start with `prefix` and are no key's override, each
    /// with the nearest key's variable: what [`WorkerConfig::load_from_env`] warns about, for a
    /// service that reads its environment some other way.
    ///
    /// # Examples
    /// ```
    /// use sb_inbox::worker::WorkerConfig;
    /// let unknown = WorkerConfig::unknown_variables("ORDERS_", ["ORDERS_CONCURENCY", "ORDERS_STORE", "PATH"]);
    /// assert_eq!(unknown.len(), 1);
    /// assert_eq!(unknown[0].nearest, "ORDERS_CONCURRENCY");
    /// ```
    pub fn unknown_variables<I, S>(prefix: &str, names: I) -> Vec<UnknownVariable>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        unknown::unknown(prefix, names)
    }
}

impl WorkerConfig {
    /// Only the top-level envelope of the configuration at `path` (if given) with the
    /// `SB_INBOX_ENVELOPE*` overrides in `env`: what tools that copy a consumer's messages (dead
    /// letter resubmission) need to key copies as the consumer does, without the rest of the
    /// worker's settings. The subject-versioned envelope when none is configured.
    ///
    /// # Errors
    /// [`ConfigErrors`] for an unreadable file or an unusable `[envelope]`.
    pub fn load_envelope(
        path: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<std::sync::Arc<dyn crate::envelope::EnvelopeReader>, ConfigErrors> {
        let file = File::read(path)?;
        let mut r = Reader::new(env, DEFAULT_ENV_PREFIX);
        let reader = envelope::top_level(&mut r, &file.envelope);
        if r.has_errors() {
            return Err(ConfigErrors(r.into_errors()));
        }
        Ok(reader.unwrap_or_else(|| std::sync::Arc::new(crate::envelope::SubjectVersioned)))
    }
}

/// The store URL: required, and one of the stores this build knows.
fn store(r: &mut Reader<'_>, file: Option<String>) -> Option<StoreUrl> {
    let Some(url) = r.text(keys::STORE, file) else {
        r.fail(keys::STORE, "required");
        return None;
    };
    url.parse::<StoreUrl>()
        .map_err(|e| r.fail(keys::STORE, e.to_string()))
        .ok()
}

#[cfg(test)]
mod tests;
