//! sb-inbox: the Idempotent Consumer for Azure Service Bus.
//!
//! Repeated delivery of one logical message produces one business effect: a peek-lock
//! receiver keeps each message's lock alive while one database transaction inserts
//! `(consumer, message_id)` into the inbox, applies the business rows and writes outgoing
//! messages to a local outbox; only after commit is the message completed.
//!
//! # From message to commit
//!
//! 1. A [`worker::Worker`] hosts each consumer: a peek-lock receiver on its entity
//!    (queue or subscription) over one Service Bus connection, and a [`Runtime`] with the
//!    consumer's [`ConsumerName`], concurrency and prefetch.
//! 2. The runtime checks the envelope: a usable message id (the logical id of a delayed-retry
//!    copy or a resubmitted dead letter), a subject naming a [`Contract`] the handler accepts.
//!    Anything else is dead-lettered at once, with a reason and no database work.
//! 3. The handler decodes the body ([`Handler::decode`]; with [`JsonHandler`] and
//!    [`JsonContract`], serde does it and a bad body is `InvalidPayload`).
//! 4. While a [`LockKeeper`] renews the lock, the runtime opens one transaction on the
//!    [`Store`] and inserts `(consumer, message id)` into the inbox. A second copy meets the
//!    primary key and is a [`Outcome::Duplicate`]: the database, not a lookup, decides.
//! 5. The handler applies the business change in that transaction: its rows, optionally a
//!    business idempotency key ([`Tx::claim_business_key`]), an aggregate version check
//!    ([`Tx::advance_version`], [`Handled::Stale`]) and outgoing messages in the outbox
//!    ([`Tx::append_outbox`]).
//! 6. The commit happens only if the lock is still held (a lost lock rolls back: someone else
//!    may have the message). Only after the commit is the message completed; every failure is
//!    classified into abandon (or a delayed retry) or dead-letter ([`Outcome`]).
//! 7. Beside the consumers, the outbox [`relay`] publishes committed outbox rows under their
//!    stable message ids and [`retention`] deletes inbox rows older than the replay horizon.
//!
//! The same path, in process (an in-memory broker from the `test-util` feature, SQLite):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use sb_inbox::testing::MemoryBroker;
//! use sb_inbox::{
//!     Clock, ConsumerName, Context, Handled, HandlerError, Json, JsonContract, JsonHandler,
//!     Message, Outcome, Runtime, RuntimeConfig, SqliteStore, Tx,
//! };
//!
//! #[derive(serde::Deserialize)]
//! #[serde(rename_all = "camelCase")]
//! struct OrderPlaced {
//!     order_id: String,
//! }
//!
//! impl JsonContract for OrderPlaced {
//!     const NAME: &'static str = "orders.order-placed";
//!     const VERSION: u32 = 1;
//! }
//!
//! struct Orders;
//!
//! impl<T: Tx> JsonHandler<T> for Orders {
//!     type Message = OrderPlaced;
//!
//!     async fn handle(
//!         &self,
//!         ctx: &Context<'_, OrderPlaced>,
//!         order: &OrderPlaced,
//!         tx: &mut T,
//!     ) -> Result<Handled, HandlerError> {
//!         let key = format!("order:{}", order.order_id);
//!         tx.claim_business_key(ctx.consumer.as_str(), &key, ctx.logical_id()).await?;
//!         Ok(Handled::Processed)
//!     }
//! }
//!
//! let store = SqliteStore::open_in_memory()?;
//! store.migrate().await?;
//! let broker = MemoryBroker::new(Clock::new());
//! let body = r#"{"orderId":"o-1"}"#;
//! broker.send_copies(Message::new("m-1", "orders.order-placed.v1", body), 2);
//! broker.send(Message::new("m-2", "orders.order-placed.v1", body)); // republished
//! broker.send(Message::new("m-3", "orders.order-placed.v1", "{nope"));
//! let config = RuntimeConfig::new(ConsumerName::new("shop.orders")?);
//! let runtime = Runtime::new(broker.receiver(), store, Json::new(Orders), config);
//! let mut outcomes = Vec::new();
//! while let Some(delivery) = broker.try_receive() {
//!     outcomes.push(runtime.process(delivery).await.outcome);
//! }
//! assert_eq!(outcomes[0], Outcome::Processed);
//! assert!(matches!(outcomes[1], Outcome::Duplicate(_))); // the inbox key
//! assert!(matches!(outcomes[2], Outcome::Duplicate(_))); // the business key
//! assert!(matches!(outcomes[3], Outcome::Permanent(_))); // InvalidPayload
//! # Ok(()) }
//! ```
//!
//! # Layout
//! - [`ports`]: the traits the runtime depends on ([`Receiver`], [`Delivery`], [`Store`], [`Tx`]).
//! - [`runtime`]: outcomes, lock keeping, settlement after commit ([`Runtime`]).
//! - [`envelope`]: the .NET dialects: envelope readers (ours, MassTransit, NServiceBus,
//!   CloudEvents, raw) and the outbox's envelope writers.
//! - [`store`]: SQL Server / Azure SQL (`MssqlStore`), PostgreSQL (`PgStore`) and SQLite
//!   (`SqliteStore`), each behind its cargo feature.
//! - [`servicebus`]: the Service Bus client (the `sb-servicebus` crate, re-exported) as the
//!   runtime's receiver, session source and sender.
//! - `entra` (feature `entra`): Microsoft Entra ID tokens for Azure SQL and Service Bus
//!   (`sb-servicebus`'s).
//! - [`relay`]: the outbox relay (claim with a lease, publish under the stable message id,
//!   mark dispatched).
//! - [`retention`]: batched deletes of inbox and dispatched outbox rows past the retention.
//! - [`telemetry`]: OpenTelemetry names, trace-context propagation, log and OTLP export set-up.
//! - [`worker`]: the hosting API: [`worker::Worker`] hosts consumers with the relay,
//!   retention (checked against the replay horizon), health and drain shared;
//!   [`worker::Worker::from_config`] hosts the service's own handlers from a
//!   [`worker::WorkerConfig`] (a JSON file, TOML with the `toml` feature, and environment
//!   overrides under a prefix), opening the store with backoff and checking its schema;
//!   [`worker::Readiness::respond`] answers `/livez` and `/readyz` on the service's own router.
//! - `testing` (feature `test-util`): `ContextBuilder` and `RecordingTx` for handler unit tests
//!   without a database, the store conformance suite (`testing::conformance::run`), an
//!   in-memory broker with fault injection.
//!
//! Errors keep their cause: [`HandlerError`] holds the error that made a handler fail as its
//! `source`, and `?` converts store, driver, I/O and JSON errors (see [`HandlerError`]).
//!
//! The application is another crate, `sb-inbox-cli` (not published): the `sb-inbox` binary,
//! the demo, operator commands, the reference consumer and the reference worker, all on this
//! library's public API.
//!
//! # Cargo features
//! None is on by default: a service names its store and what else it uses.
//!
//! | feature | what it adds |
//! |---|---|
//! | `postgres` | `PgStore` (tokio-postgres, bb8, rustls); `tokio_postgres` re-exported with uuid and JSON parameters; `testing::TestDb` with `test-util` |
//! | `sqlx-postgres` | `SqlxPgStore` (sqlx 0.9): a handler's sqlx queries on the inbox transaction (`SqlxPgTx::conn`); `sqlx` re-exported |
//! | `postgres-chrono` | `chrono` parameters for `tokio_postgres` |
//! | `sqlite` | `SqliteStore` (rusqlite, SQLite bundled) |
//! | `mssql` | `MssqlStore` (tiberius, bb8, `tiberius` re-exported); turns on `entra` for Azure SQL logins |
//! | `entra` | `entra`: Entra ID tokens (sb-servicebus's `entra`: azure_identity, reqwest), `ServiceBusClient::with_entra` |
//! | `websockets` | AMQP over WebSockets (`servicebus.transport = "websockets"`, `TransportType=AmqpWebSockets`; tokio-tungstenite's handshake). Without it such a configuration is refused at load |
//! | `native-roots` | the operating system's trust store for Service Bus TLS (`servicebus.native_roots`; rustls-native-certs). Without it: Mozilla's roots (webpki-roots) and `servicebus.ca_file` |
//! | `toml` | `worker.toml` files for [`worker::WorkerConfig`] (JSON files need no feature) |
//! | `serde` | `serde::Deserialize` on the public configuration types |
//! | `logs` | `telemetry::init` and `telemetry::init_default`: the log subscriber and the OpenTelemetry SDK providers (tracing-subscriber, opentelemetry_sdk) |
//! | `otlp` | OTLP/gRPC export in `telemetry::init` (tonic); turns on `logs` |
//! | `conformance` | `conformance`: the store conformance suite alone (`conformance::run(store)`, `conformance::CHECKS`), stable, for a third-party store's tests and tools such as `sb-inbox verify` |
//! | `test-util` | `testing`: `ContextBuilder` (also with an envelope), `RecordingTx` (with the service's own operations, `recording_tx!`), the store conformance suite, the in-memory broker |
//!
//! `sb-inbox = { version = "0.1", default-features = false, features = ["postgres"] }`
//! compiles neither tiberius nor rusqlite, azure_identity, tonic, clap, toml or the emulator,
//! nor WebSockets or the OS trust store. Of tokio the library enables only what it uses (`rt`,
//! `macros`, `net`, `time`, `sync`, `io-util`, `signal`): the service's `#[tokio::main]` picks
//! its scheduler (`rt-multi-thread` is the service's to enable). TLS is rustls on ring
//! throughout. The worker's start-up read of its entity needs sb-servicebus's management API
//! (`admin`, quick-xml), which the library always enables.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]
// docs.rs (all features, `--cfg docsrs`): each feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// The library: what a consumer of the crate builds on. Its modules import from where items
// live (`crate::runtime::…`, `crate::ports::…`); the re-exports below are for users only.
/// Microsoft Entra ID tokens: `sb-servicebus`'s, shared by the Service Bus client and the SQL
/// Server store.
#[cfg(feature = "entra")]
pub use sb_servicebus::entra;
/// The store conformance suite (feature `conformance`, also under `test-util` as
/// `testing::conformance`): what every [`Store`] must do, for a third-party store's tests and
/// for `sb-inbox verify`'s check of a user's database.
#[cfg(any(test, feature = "conformance"))]
#[path = "testing/conformance.rs"]
pub mod conformance;
pub mod envelope;
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

/// README's Rust code blocks ("Use it in your service"), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

/// docs/consumers.md's Rust code blocks (the router, strict JSON), compiled as doc tests: the
/// guide moved out of README.md keeps its examples checked.
#[cfg(doctest)]
#[doc = include_str!("../docs/consumers.md")]
struct ConsumersDoctests;

/// docs/envelopes.md's Rust code blocks (publishing to .NET consumers), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/envelopes.md")]
struct EnvelopesDoctests;

/// docs/how-it-works.md's Rust code blocks (the outbox relay), compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/how-it-works.md")]
struct HowItWorksDoctests;

/// docs/testing.md's Rust code blocks (`recording_tx!`, envelope fixtures, `TestDb`), compiled
/// and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/testing.md")]
struct TestingDoctests;

/// docs/client.md's Rust code block (`sb-servicebus` alone), compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../docs/client.md")]
struct ClientDoctests;

pub use envelope::{Contract, ContractParseError, DeadLetterReason, Rejection};
pub use ports::{
    BacklogSample, DelegateTx, Delivery, DuplicateScope, ErrorKind, INBOX_PROPERTY_PREFIX,
    InboxEntry, Message, OutboxBacklog, OutboxClaim, OutboxLease, OutboxMessage, OutboxRow,
    OutboxStore, PropertyValue, ReceiveError, Receiver, RetentionStore, Savepoint, SendFailure,
    Sender, SessionReceiver, SessionSource, SettleError, Source, Store, StoreError, StoreTx, Tx,
    UnreadableRow, Verdict, VersionCheck,
};
pub use runtime::{
    BoxError, Circuit, CircuitConfig, CircuitPhase, Clock, ConsumerName, ConsumerNameError,
    Context, DecodeError, Handled, Handler, HandlerError, HandlerExt, IdempotencyKey, Json,
    JsonContract, JsonHandler, Layer, LockKeeper, Outcome, Report, Router, RouterBuilder,
    RouterError, Runtime, RuntimeConfig, RuntimeError, SessionConfig, Settlement, Stats,
    StatsSnapshot, UnknownContracts, UpcastError,
};
/// sqlx as the `sqlx-postgres` store builds it (PostgreSQL, tokio, rustls; `uuid` and JSON
/// types): a handler's queries on [`SqlxPgTx::conn`] need no second, version-matched
/// dependency.
#[cfg(feature = "sqlx-postgres")]
pub use sqlx;
#[cfg(feature = "mssql")]
pub use store::{MssqlStore, MssqlTx};
#[cfg(feature = "postgres")]
pub use store::{PgStore, PgTx};
#[cfg(feature = "sqlite")]
pub use store::{SqliteStore, SqliteTx};
#[cfg(feature = "sqlx-postgres")]
pub use store::{SqlxPgStore, SqlxPgTx};
/// The SQL Server driver as the store builds it: a handler's own SQL on [`MssqlTx`] binds its
/// `tiberius::ToSql` types without a second, version-matched dependency.
#[cfg(feature = "mssql")]
pub use tiberius;
/// The PostgreSQL driver as the store builds it, with `uuid` and `serde_json` parameters (and
/// `chrono` with the `postgres-chrono` feature): a handler's own SQL on [`PgTx`] binds these
/// types (`tokio_postgres::types::ToSql`) and reads [`tokio_postgres::Row`]s without a second,
/// version-matched dependency.
#[cfg(feature = "postgres")]
pub use tokio_postgres;
