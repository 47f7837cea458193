//! Test support shared by the integration-test binaries, one file per concept, built on the
//! product's own builders.
//!
//! # Layout
//! - `stores`: real stores with resources of their own, row counts and backdating per provider
//!   (re-exported here: `support::pg_store`).
//! - `emulator`: in-process emulators configured with `sb_emulator::Config`'s builders, and our
//!   client for them.
//! - `orders`: `orders.order-placed.v1` messages serialised by `ops::send::OrderMessage`.
//! - `handlers`: handler wrappers (flaky, slow, gated), small handlers and store wrappers.
//! - `runtime`: the runtime over the in-memory broker: configurations, a runtime on the
//!   test's clock, deliveries handed over one at a time or in batches.
//! - `cli`: the built `sb-inbox` binary as a child process.
//! - `pg_cluster`: a throwaway PostgreSQL cluster a test may stop and start.
// Each binary uses part of the tree; an item unused by one is used by another.
#![allow(dead_code, unreachable_pub)]

pub mod cli;
pub mod emulator;
pub mod handlers;
pub mod orders;
pub mod pg_cluster;
pub mod runtime;
pub mod stores;

pub use stores::*;

/// Installs a test-writer tracing subscriber once.
pub fn init_tracing() {
    // A second call finds the subscriber installed: that is the "once".
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_test_writer()
        .try_init();
}
