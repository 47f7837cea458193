//! Azure Service Bus over our AMQP engine: connection strings, tokens, receiver and sender.
//!
//! Connection strings, SAS signing, trust roots, proxies and [`ServiceBusError`] are the
//! `sb-servicebus` crate's (re-exported here); the rest of the client follows it (issue 32).
//!
//! # Layout
//! - [`ConnectionString`]: `Endpoint=sb://…;SharedAccessKeyName=…;…`, printable without secrets.
//! - [`TokenProvider`]: tokens per audience ([`SasProvider`] signs with [`sign_sas`];
//!   [`EntraProvider`] gets Microsoft Entra ID tokens), put on `$cbs` before each link and
//!   refreshed before expiry.
//! - [`ServiceBusClient`]: one connection, re-established only after connection-level
//!   failures; a link the service detaches is re-attached on it (`error::recovery` classifies
//!   detaches as the SDKs do); `$cbs` and `$management` (`node`) re-attach on demand.
//! - [`ServiceBusReceiver`] (`receiver`) / [`ServiceBusDelivery`] (`delivery`): the runtime's
//!   `Receiver` / `Delivery` ports: peek-lock, renew-lock on `$management`; `settlement`
//!   settles on the link or by lock token and awaits the broker's outcome.
//! - `management` / `cbs`: the request/response nodes' requests and replies as named structs;
//!   every wire name comes from [`sb_amqp::servicebus`], shared with the emulator.
//! - [`ServiceBusSender`]: sends to one entity that await `accepted`, with typed rejections and
//!   scheduled enqueue times (the SDKs' sender); [`ServiceBusSenderPort`]: the runtime's
//!   `Sender` port, any destination, one `ServiceBusSender` each (formerly
//!   `ServiceBusPublisher`, kept as a deprecated alias).
//! - `limits`: what a peer can make the client buffer (receive and node links' `max-message-size`,
//!   the connection-wide bound on unfinished deliveries).
//! - [`ServiceBusClient::peek`] / [`PeekedMessage`]: `$management` peek-message, e.g. of a
//!   dead-letter queue; [`resubmission`]: the copy of a dead letter to send again.

pub mod admin;
mod amqp_message;
mod auth;
mod busy;
mod cbs;
mod client;
mod delivery;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod limits;
mod lock_clock;
mod management;
mod node;
mod peek;
mod receiver;
mod resubmit;
mod sender;
mod sender_port;
mod session;
mod settlement;
mod telemetry;

// The connection-level pieces are the sb-servicebus crate's; these names keep this module's
// paths (`super::error::recovery`, `sb_inbox::servicebus::ConnectionString`) working.
use sb_servicebus::error;

pub use amqp_message::TYPED_MESSAGE_ID_PREFIX;
#[cfg(feature = "entra")]
pub use auth::EntraProvider;
pub use auth::{
    AccessToken, SERVICE_BUS_SCOPE, SasProvider, TokenFuture, TokenProvider, TokenType,
};
pub use client::{DEFAULT_SERVER_BUSY_WAIT, DEFAULT_TIMEOUT, ServiceBusClient};
pub use delivery::ServiceBusDelivery;
pub use peek::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, PeekedMessage};
pub use receiver::{DEFAULT_LINK_IDLE_GUARD, ServiceBusReceiver};
pub use resubmit::{RESUBMISSION_PROPERTY, resubmission};
pub use sb_servicebus::{
    ConnectionString, ConnectionStringError, Credential, HttpProxy, ProxyConfig, ProxyError,
    SasToken, ServiceBusError, Transport, TrustError, TrustRoots, sign_sas,
};
pub use sender::{SendError, SendErrorKind, SendOptions, ServiceBusSender};
#[allow(deprecated)]
pub use sender_port::{ServiceBusPublisher, ServiceBusSenderPort};
pub use session::{ServiceBusSessionReceiver, ServiceBusSessionSource};
