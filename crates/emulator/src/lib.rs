//! sb-emulator: the broker core of our Azure Service Bus emulator.
//!
//! An in-memory namespace of queues, topics and subscriptions with Service Bus semantics
//! (peek-lock, lock expiry and renewal, delivery counts, `MaxDeliveryCount`, dead-letter
//! subqueues, TTL, duplicate detection, scheduled and deferred messages, correlation and SQL
//! filters, `ForwardTo`), configured from Microsoft's emulator `Config.json`. It knows nothing
//! of AMQP: the wire layer stores each encoded message in [`BrokerMessage::payload`] and maps
//! links, dispositions and management requests onto [`Entity`] methods.
//!
//! # Layout
//! - [`config`](Config): `Config.json` parsing and validation with path-aware errors
//!   ([`Config`], [`ConfigError`]); ISO-8601 durations ([`parse_iso8601_duration`]).
//! - `broker`: [`Broker`], the namespace; [`Broker::entity`] resolves a link address
//!   ([`Address`]) to an [`Entity`] handle that sends, receives (waiting on the injected
//!   [`Clock`]), settles, renews, peeks, schedules and injects faults.
//! - `queue`: the storage of one queue or subscription behind the handle: subqueues, locks,
//!   timers, sessions ([`SessionLock`]), [`Settlement`], [`EntityCounts`].
//! - Messages: [`BrokerMessage`], [`ReceivedMessage`], [`PropertyValue`].
//! - Filters: [`Filter`], [`CorrelationFilter`], [`SqlFilter`] (a documented subset), [`Rule`]
//!   with its [`SqlRuleAction`].
//! - `server`: the AMQP side ([`Emulator`], [`EmulatorOptions`]): the listeners, links, `$cbs`,
//!   `$management`, faults; it serves `http` on the connections that speak HTTP.
//! - `http`: the HTTP management API; it asks the server for keys and injected faults through
//!   its own `http::Host` trait and names no server module.
//! - `sas`: shared access signature validation, for `$cbs` and the management API.
//! - Errors: [`Error`] with [`Error::condition`] giving the AMQP error condition.
//!
//! # Examples
//! ```
//! use std::time::Duration;
//! use sb_emulator::{Broker, BrokerMessage, Config, ReceiveMode};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), sb_emulator::Error> {
//! let config = Config::from_json(r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns",
//!     "Queues":[{"Name":"orders","Properties":{"LockDuration":"PT5S","MaxDeliveryCount":2}}],
//!     "Topics":[]}],"Logging":{"Type":"File"}}}"#)?;
//! let broker = Broker::new(config)?;
//! let orders = broker.entity("orders")?;
//! orders.send(BrokerMessage::new("payload"))?;
//! let msg = orders.receive(ReceiveMode::PeekLock, Some(Duration::from_secs(1))).await?.unwrap();
//! orders.abandon(msg.lock_token.unwrap(), Default::default()).await?;
//! let again = orders.try_receive(ReceiveMode::PeekLock)?.unwrap();
//! assert_eq!(again.delivery_count, 1);
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings))))]

mod address;
mod broker;
mod clock;
mod config;
mod duration;
mod error;
mod filter;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod message;
mod queue;
mod rights;
mod sas;
mod server;
mod sql_filter;

pub use address::{Address, EntityPath};
pub use broker::{
    Broker, DescribedProperties, DispositionStatus, Entity, EntityDescription, SendOutcome,
};
pub use clock::Clock;
pub use config::{
    Config, ConfigError, DEFAULT_DUPLICATE_DETECTION_WINDOW, DEFAULT_LOCK_DURATION,
    DEFAULT_MAX_DELIVERY_COUNT, DEFAULT_MAX_MESSAGE_SIZE, DEFAULT_MESSAGE_TIME_TO_LIVE,
    EntityProperties, NamespaceConfig, QueueConfig, SERVICE_DUPLICATE_DETECTION_WINDOW,
    SERVICE_MAX_DELIVERY_COUNT, SERVICE_MESSAGE_TIME_TO_LIVE, SubscriptionConfig, TopicConfig,
    TopicProperties,
};
pub use duration::{format_iso8601_duration, parse_iso8601_duration};
pub use error::{Error, Result};
pub use filter::{CorrelationFilter, Filter, Rule};
pub use message::{
    BrokerMessage, DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, MAX_DELIVERY_COUNT_EXCEEDED,
    MessageState, Properties, PropertyValue, ReceiveMode, ReceivedMessage, TTL_EXPIRED,
};
pub use queue::{EntityCounts, SessionLock, Settlement};
pub use rights::{Right, Rights, SharedAccessPolicy};
pub use server::{
    DEFAULT_LINK_IDLE_TIMEOUT, Emulator, EmulatorOptions, EmulatorStats, Fault, FaultSpec, KEY,
    KEY_NAME, LinkInfo, LinkRole, ManagementFault, ManagementFaultKind, ManagementFaultSpec,
    ManagementRequest, SERVICE_CHANNEL_MAX, SERVICE_IDLE_TIMEOUT, SERVICE_MAX_FRAME_SIZE,
    SettlementAttempt, TLS_CA_FILE, TLS_CERT_FILE, TLS_KEY_FILE, TlsIdentity, TlsListen,
    start_from_json,
};
pub use sql_filter::{SqlError, SqlFilter, SqlRuleAction};
