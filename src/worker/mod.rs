//! The worker: configuration (file + environment) and the replay-horizon guard.
//!
//! # Layout
//! - [`WorkerConfig`]: `worker.toml` with `SB_INBOX_*` environment overrides, validated as a
//!   whole so one run reports every mistake.
//! - [`ReplayHorizon`]: how long after processing a message can come back, and the check that
//!   dedupe retention covers it.

mod config;
mod horizon;

pub use config::{BrokerAddress, ConfigError, ConfigErrors, ENV_VARS, Retention, WorkerConfig};
pub use horizon::{ReplayHorizon, RetentionTooShort};
