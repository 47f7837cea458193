//! The worker: configuration (file + environment) and the replay-horizon guard.
//!
//! # Layout
//! - [`WorkerConfig`]: `worker.toml` with `SB_INBOX_*` environment overrides, validated as a
//!   whole so one run reports every mistake.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.
//! - [`Worker`]: hosts one or more consumers (each a [`ConsumerConfig`] and a handler) over one
//!   Service Bus client and one store, with the outbox relay, retention, health endpoints
//!   (readiness composed on a [`Readiness`]), telemetry and drain shared.
//! - [`run`]: the reference worker (`sb-inbox run`): it opens the store with retries ([`open`]),
//!   reporting [`Readiness`] on `/readyz` meanwhile, then hosts the inventory consumer in a
//!   [`Worker`] as `worker.toml` says.

mod config;
pub mod entity_check;
mod health;
mod horizon;
mod host;
mod open;
mod run;

pub use config::{
    BrokerAddress, ConfigError, ConfigErrors, ENV_VARS, KEYS, Key, MOVED, Moved, WorkerConfig,
};
pub use entity_check::{DeclaredEntity, EntityCheckError, EntitySource};
pub use health::{Condition, PROBE_TIMEOUT, Ping, Readiness, STORE_EVIDENCE, store_ready};
pub use horizon::{ReplayHorizon, RetentionTooShort};
pub use host::{ConsumerConfig, Worker, WorkerStats};
pub use run::{BACKGROUND_STOP, WorkerError, run, run_with};
