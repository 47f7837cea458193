//! The worker: configuration (file + environment) and the replay-horizon guard.
//!
//! # Layout
//! - [`WorkerConfig`]: `worker.toml` with `SB_INBOX_*` environment overrides, validated as a
//!   whole so one run reports every mistake.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.
//! - [`run`]: the reference inventory consumer on Service Bus and the configured store.

mod config;
mod health;
mod horizon;
mod run;

pub use config::{BrokerAddress, ConfigError, ConfigErrors, ENV_VARS, Retention, WorkerConfig};
pub use health::Ping;
pub use horizon::{ReplayHorizon, RetentionTooShort};
pub use run::{WorkerError, run, run_with};
