//! Azure Service Bus over our AMQP engine: connection strings, tokens, receiver and sender.
//!
//! # Layout
//! - [`ConnectionString`]: `Endpoint=sb://…;SharedAccessKeyName=…;…`, printable without secrets.
//! - [`TokenProvider`]: tokens per audience ([`SasProvider`] signs with [`sign_sas`];
//!   [`EntraProvider`] gets Microsoft Entra ID tokens), put on `$cbs` before each link and
//!   refreshed before expiry.
//! - [`ServiceBusClient`]: one connection, re-established only after connection-level
//!   failures; a link the service detaches is re-attached on it (`error::recovery` classifies
//!   detaches as the SDKs do); `$cbs` and `$management` (`node`) re-attach on demand.
//! - [`ServiceBusReceiver`] / [`ServiceBusDelivery`]: the runtime's `Receiver` / `Delivery`
//!   ports: peek-lock, renew-lock on `$management`, settlement that awaits the broker's outcome.
//! - [`ServiceBusSender`]: sends that await `accepted`, with typed rejections and scheduled
//!   enqueue times; [`ServiceBusPublisher`]: the runtime's `Sender` port, any destination.
//! - [`ServiceBusClient::peek`] / [`PeekedMessage`]: `$management` peek-message, e.g. of a
//!   dead-letter queue.

mod amqp_message;
mod auth;
mod cbs;
mod client;
mod connection_string;
mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod management;
mod node;
mod peek;
mod receiver;
mod sas;
mod sender;
mod session;
mod telemetry;

pub use amqp_message::TYPED_MESSAGE_ID_PREFIX;
#[cfg(feature = "entra")]
pub use auth::EntraProvider;
pub use auth::{
    AccessToken, SERVICE_BUS_SCOPE, SasProvider, TokenFuture, TokenProvider, TokenType,
};
pub use client::{DEFAULT_TIMEOUT, ServiceBusClient};
pub use connection_string::{ConnectionString, ConnectionStringError, Credential, Transport};
pub use error::ServiceBusError;
pub use peek::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, PeekedMessage};
pub use receiver::{ServiceBusDelivery, ServiceBusReceiver};
pub use sas::{SasToken, sign_sas};
pub use sender::{SendError, SendErrorKind, SendOptions, ServiceBusPublisher, ServiceBusSender};
pub use session::{ServiceBusSessionReceiver, ServiceBusSessionSource};
