//! sb-inbox: the Idempotent Consumer for Azure Service Bus.
//!
//! Repeated delivery of one logical message produces one business effect: a peek-lock
//! receiver keeps each message's lock alive while one database transaction inserts
//! `(consumer, message_id)` into the inbox, applies the business rows and writes outgoing
//! messages to a local outbox; only after commit is the message completed.
//!
//! # Layout
//! - [`ports`]: the traits the runtime depends on ([`Receiver`], [`Delivery`], [`Store`], [`Tx`]).
//! - [`runtime`]: outcomes, lock keeping, settlement after commit ([`Runtime`]).
//! - [`store`]: SQL Server / Azure SQL ([`MssqlStore`]), PostgreSQL ([`PgStore`]) and SQLite
//!   ([`SqliteStore`]).
//! - [`servicebus`]: the Service Bus client on our AMQP engine (the runtime's receiver and sender).
//! - [`entra`]: Microsoft Entra ID tokens for Azure SQL and Service Bus.
//! - [`worker`]: the worker's configuration and run loop; [`demo`]: `sb-inbox demo`.
//! - [`relay`]: the outbox relay (claim with a lease, publish under the stable message id,
//!   mark dispatched).
//! - [`retention`]: batched deletes of inbox and dispatched outbox rows past the retention.
//! - [`inventory`]: the reference consumer, written on the public API only.
//! - [`ops`]: operator commands (publish orders, dead-letter peek and resubmit).
//! - [`telemetry`]: OpenTelemetry names, trace-context propagation, OTLP export set-up.
//! - `testing` (feature `test-util`): an in-memory receiver with fault injection.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

pub mod demo;
pub mod entra;
pub mod inventory;
pub mod ops;
pub mod ports;
pub mod relay;
pub mod retention;
pub mod runtime;
pub mod servicebus;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
pub mod worker;

pub use ports::{
    Delivery, DuplicateScope, ErrorKind, Message, OutboxBacklog, OutboxLease, OutboxMessage,
    OutboxRow, OutboxStore, PropertyValue, ReceiveError, Receiver, RetentionStore, SendFailure,
    Sender, SettleError, Source, Store, StoreError, Tx, VersionCheck,
};
pub use runtime::{
    Clock, ConsumerName, ConsumerNameError, Context, Contract, ContractParseError,
    DeadLetterReason, DecodeError, Handled, Handler, HandlerError, IdempotencyKey, Json,
    JsonContract, JsonHandler, LockKeeper, Outcome, Rejection, Report, Runtime, RuntimeConfig,
    RuntimeError, Settlement, Stats, StatsSnapshot,
};
pub use store::{MssqlStore, MssqlTx, PgStore, PgTx, SqliteStore, SqliteTx};
