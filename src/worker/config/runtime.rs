//! `[runtime]`: how each consumer's runtime runs (slots, prefetch, locks, batching, drain), and
//! session mode (`servicebus.sessions` with the `runtime.*` session keys).

use std::time::Duration;

use serde::Deserialize;

use super::keys::{
    BATCH_LINGER_MS, BATCH_SIZE, CIRCUIT_CONSECUTIVE_FAILURES, CIRCUIT_ENABLED,
    CIRCUIT_FAILURE_RATE_PERCENT, CIRCUIT_PROBE_MAX_SECS, CIRCUIT_PROBE_MIN_MS,
    CIRCUIT_WINDOW_SECS, CONCURRENCY, LOCK_MARGIN_SECS, MAX_PANICS, MAX_PROCESSING_SECS,
    MAX_SESSIONS, PREFETCH, SESSION_IDLE_SECS, SESSIONS, SHUTDOWN_GRACE_SECS,
    TRANSIENT_HOLD_MAX_MS, UNKNOWN_CONTRACTS,
};
use super::reader::{Reader, to_usize};
use crate::runtime::{
    CircuitConfig, ConsumerName, DEFAULT_BATCH_LINGER, DEFAULT_TRANSIENT_HOLD_MAX, RuntimeConfig,
    SessionConfig, UnknownContracts,
};

/// The `[runtime]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RuntimeFile {
    concurrency: Option<u64>,
    prefetch: Option<u64>,
    lock_margin_secs: Option<u64>,
    max_processing_secs: Option<u64>,
    shutdown_grace_secs: Option<u64>,
    batch_size: Option<u64>,
    batch_linger_ms: Option<u64>,
    max_sessions: Option<u64>,
    session_idle_secs: Option<u64>,
    max_panics: Option<u64>,
    transient_hold_max_ms: Option<u64>,
    unknown_contracts: Option<String>,
    circuit: Option<CircuitFile>,
}

/// The `[runtime.circuit]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CircuitFile {
    enabled: Option<bool>,
    consecutive_failures: Option<u64>,
    failure_rate_percent: Option<u64>,
    window_secs: Option<u64>,
    probe_min_ms: Option<u64>,
    probe_max_secs: Option<u64>,
}

/// The `[runtime]` settings every consumer shares; concurrency and prefetch are the defaults
/// of `[[consumers]]` entries.
#[derive(Debug, Clone)]
pub(super) struct RuntimeSection {
    pub(super) concurrency: u64,
    pub(super) prefetch: u64,
    lock_margin_secs: u64,
    shutdown_grace: Duration,
    max_processing: Duration,
    pub(super) batch_size: usize,
    batch_linger: Duration,
    max_panics: u32,
    transient_hold_max: Duration,
    /// The default of `[[consumers]]` entries.
    pub(super) unknown_contracts: UnknownContracts,
    circuit: CircuitConfig,
}

impl RuntimeSection {
    /// Reads the section, each value with its default.
    pub(super) fn read(r: &mut Reader<'_>, file: &RuntimeFile) -> Self {
        let concurrency = r.number(CONCURRENCY, file.concurrency, 1..=1024);
        let prefetch = r.number(PREFETCH, file.prefetch, 0..=10_000);
        let margin = r.number(LOCK_MARGIN_SECS, file.lock_margin_secs, 1..=3600);
        let grace = r.number(SHUTDOWN_GRACE_SECS, file.shutdown_grace_secs, 0..=3600);
        let max_processing = r.number(MAX_PROCESSING_SECS, file.max_processing_secs, 1..=86_400);
        let batch = r.number(BATCH_SIZE, file.batch_size, 1..=1000);
        let linger = r.number(BATCH_LINGER_MS, file.batch_linger_ms, 0..=10_000);
        let max_panics = r.number(MAX_PANICS, file.max_panics, 1..=1000);
        let hold = r.number(
            TRANSIENT_HOLD_MAX_MS,
            file.transient_hold_max_ms,
            0..=60_000,
        );
        let circuit = circuit(r, file.circuit.as_ref().unwrap_or(&CircuitFile::default()));
        let unknown = r.text(UNKNOWN_CONTRACTS, file.unknown_contracts.clone());
        let unknown_contracts = unknown
            .and_then(|text| {
                text.parse()
                    .map_err(|e: crate::runtime::UnknownContractsParseError| {
                        r.fail(UNKNOWN_CONTRACTS, e.to_string());
                    })
                    .ok()
            })
            .unwrap_or_default();
        RuntimeSection {
            unknown_contracts,
            max_panics: max_panics.map_or(3, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            transient_hold_max: hold.map_or(DEFAULT_TRANSIENT_HOLD_MAX, Duration::from_millis),
            circuit,
            concurrency: concurrency.unwrap_or(8),
            prefetch: prefetch.unwrap_or(0),
            lock_margin_secs: margin.unwrap_or(10),
            shutdown_grace: Duration::from_secs(grace.unwrap_or(30)),
            max_processing: Duration::from_secs(max_processing.unwrap_or(300)),
            batch_size: batch.map_or(1, to_usize),
            batch_linger: linger.map_or(DEFAULT_BATCH_LINGER, Duration::from_millis),
        }
    }

    /// Refuses a lock margin not shorter than the entity's lock: renewal would come too late.
    pub(super) fn check_margin(&self, r: &mut Reader<'_>, lock_duration_secs: Option<u64>) {
        let margin = self.lock_margin_secs;
        if let Some(lock) = lock_duration_secs
            && margin >= lock
        {
            r.fail(
                LOCK_MARGIN_SECS,
                format!("{margin} s must be shorter than the lock duration {lock} s"),
            );
        }
    }

    /// The runtime settings of consumer `name` with its own concurrency, prefetch and
    /// unknown-contract outcome.
    pub(super) fn for_consumer(
        &self,
        name: ConsumerName,
        (concurrency, prefetch): (u64, u64),
        unknown_contracts: UnknownContracts,
        lock_duration: Option<Duration>,
    ) -> RuntimeConfig {
        let mut runtime = RuntimeConfig::new(name).with_unknown_contracts(unknown_contracts);
        runtime.concurrency = usize::try_from(concurrency).unwrap_or(8);
        runtime.prefetch = usize::try_from(prefetch).unwrap_or(0);
        runtime.lock_margin = Duration::from_secs(self.lock_margin_secs);
        runtime.lock_duration = lock_duration;
        runtime.max_processing = self.max_processing;
        runtime.shutdown_grace = self.shutdown_grace;
        runtime.batch_size = self.batch_size;
        runtime.batch_linger = self.batch_linger;
        runtime.max_panics = self.max_panics;
        runtime.transient_hold_max = self.transient_hold_max;
        runtime.circuit = self.circuit.clone();
        runtime
    }
}

/// `[runtime.circuit]`, each value with its default; a probe minimum above the maximum is
/// refused.
fn circuit(r: &mut Reader<'_>, file: &CircuitFile) -> CircuitConfig {
    let defaults = CircuitConfig::default();
    let enabled = r.flag(CIRCUIT_ENABLED, file.enabled);
    let consecutive = r.number(
        CIRCUIT_CONSECUTIVE_FAILURES,
        file.consecutive_failures,
        1..=10_000,
    );
    let rate = r.number(
        CIRCUIT_FAILURE_RATE_PERCENT,
        file.failure_rate_percent,
        1..=100,
    );
    let window = r.number(CIRCUIT_WINDOW_SECS, file.window_secs, 1..=3600);
    let probe_min = r.number(CIRCUIT_PROBE_MIN_MS, file.probe_min_ms, 10..=600_000);
    let probe_max = r.number(CIRCUIT_PROBE_MAX_SECS, file.probe_max_secs, 1..=3600);
    let config = CircuitConfig {
        enabled: enabled.unwrap_or(defaults.enabled),
        consecutive: consecutive.map_or(defaults.consecutive, |n| {
            u32::try_from(n).unwrap_or(u32::MAX)
        }),
        failure_rate_percent: rate.map_or(defaults.failure_rate_percent, |n| {
            u8::try_from(n).unwrap_or(100)
        }),
        window: window.map_or(defaults.window, Duration::from_secs),
        probe_min: probe_min.map_or(defaults.probe_min, Duration::from_millis),
        probe_max: probe_max.map_or(defaults.probe_max, Duration::from_secs),
    };
    if config.probe_min > config.probe_max {
        r.fail(
            CIRCUIT_PROBE_MIN_MS,
            format!(
                "{} ms must not exceed {} ({} s)",
                config.probe_min.as_millis(),
                CIRCUIT_PROBE_MAX_SECS,
                config.probe_max.as_secs()
            ),
        );
    }
    config
}

/// `servicebus.sessions` with `runtime.max_sessions` and `runtime.session_idle_secs`; the
/// session keys without session mode, and delayed retries or batched transactions with it, are
/// refused.
pub(super) fn sessions(
    r: &mut Reader<'_>,
    sessions: Option<bool>,
    file: &RuntimeFile,
    retry: bool,
    batched: bool,
) -> Option<SessionConfig> {
    let on = r.flag(SESSIONS, sessions) == Some(true);
    let defaults = SessionConfig::default();
    let max = r.number(MAX_SESSIONS, file.max_sessions, 1..=1024);
    let idle = r.number(SESSION_IDLE_SECS, file.session_idle_secs, 1..=3600);
    if !on {
        let without = format!("{} = true ({})", SESSIONS.file, SESSIONS.env);
        r.refuse_orphans(
            &[
                (MAX_SESSIONS, max.is_some()),
                (SESSION_IDLE_SECS, idle.is_some()),
            ],
            &without,
        );
        return None;
    }
    if retry {
        r.fail(
            SESSIONS,
            "delayed retries cannot keep a session's order (a retry copy goes to the end of its session): set retry.max_retries = 0",
        );
    }
    if batched {
        r.fail(
            BATCH_SIZE,
            "session mode handles a session's messages one at a time, each in its own transaction: batched transactions do not apply with servicebus.sessions = true",
        );
    }
    Some(SessionConfig {
        max_sessions: max.map_or(defaults.max_sessions, to_usize),
        idle: idle.map_or(defaults.idle, Duration::from_secs),
    })
}
