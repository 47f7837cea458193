//! Test tools (feature `test-util`): handler unit tests without a database, an in-memory
//! broker with fault injection, and the store conformance suite.
//!
//! # Layout
//! - [`ContextBuilder`]: the [`crate::Context`] the runtime would hand a handler for one
//!   message, and [`ContextBuilder::handle`] to run a handler on it.
//! - [`RecordingTx`]: a [`crate::Tx`] double that records inbox rows, business keys, versions
//!   and outbox rows, with the stores' duplicate, stale and first-error behaviour, and can be
//!   told to fail ([`TxOp`]).
//! - `TestDb` (with `postgres`): a fresh, migrated schema per test and process and
//!   `TestDb::run`, which runs messages through a handler for real (runtime, transactions,
//!   outbox) and reports the outcomes, dead letters and outbox rows; `TestDb::run_sqlx` for a
//!   handler on the sqlx store (`sqlx-postgres`). `SqliteTestDb` (with `sqlite`): the same on a
//!   fresh SQLite file.
//! - [`RecordingTx::record`] and [`recording_tx!`](crate::recording_tx): the service's own
//!   extension trait's methods, recorded beside the built-in operations, with no hand-written
//!   wrapper.
//! - [`ContextBuilder::with_envelope`]: a MassTransit, NServiceBus or CloudEvents fixture
//!   opened as the runtime opens it.
//! - [`conformance`]: the checks every [`crate::Store`] must pass, run on our three stores and
//!   exported for a third-party store: `testing::conformance::run(store)`.
//! - [`MemoryBroker`]: implements the [`crate::Receiver`] port with peek-lock semantics (lock
//!   duration, expiry and redelivery with delivery count + 1, max delivery count, dead-letter
//!   subqueue) on an injected [`crate::Clock`], so runtime tests are deterministic under
//!   tokio's paused time. It implements the [`crate::Sender`] port too: scheduled messages
//!   become receivable at their time on that clock. It is a test tool, not the demo broker:
//!   the demo runs on the Service Bus emulator.

/// The store conformance suite ([`crate::conformance`], feature `conformance`).
pub use crate::conformance;
mod context;
#[cfg(any(feature = "postgres", feature = "sqlite"))]
mod database;
mod delegate;
mod memory;
mod recording;

pub use context::{ContextBuilder, ContextError};
#[cfg(feature = "sqlite")]
pub use database::SqliteTestDb;
#[cfg(feature = "postgres")]
pub use database::{DEFAULT_DATABASE_URL, TestDb};
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub use database::{RunReport, TestDbError};
pub use memory::{
    BrokerCounts, DeadLettered, MemoryBroker, MemoryDelivery, MemoryReceiver, RenewFault,
    SentMessage,
};
pub use recording::{RecordingTx, TxOp};
