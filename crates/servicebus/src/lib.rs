//! sb-servicebus: an Azure Service Bus client on the `sb-amqp` engine, usable on its own.
//!
//! Peek-lock receive with every settlement awaited (complete, abandon, dead-letter, release:
//! `Ok` means the broker applied it, an error keeps the broker's condition), lock renewal,
//! message sessions, sends that await `accepted`, `$management` peeks, the HTTPS management
//! API, SAS and Microsoft Entra ID tokens, AMQP over WebSockets through a proxy, and
//! OpenTelemetry spans and metrics named per the messaging semantic conventions. It depends on
//! nothing of `sb-inbox`, which builds its Idempotent Consumer runtime on it.
//!
//! # Examples
//! Send, receive and settle (against a namespace or the emulator):
//! ```no_run
//! use sb_servicebus::{ServiceBusClient, ServiceBusMessage};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let cs = "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true";
//! let client = ServiceBusClient::from_connection_string(&cs.parse()?);
//! let message = ServiceBusMessage::new(r#"{"orderId":"o-1"}"#)
//!     .with_message_id("m-1")
//!     .with_subject("orders.order-placed.v1");
//! client.sender("orders").send(message).await?;
//!
//! let receiver = client.receiver("orders", 0);
//! if let Some(delivery) = receiver.receive_message().await? {
//!     println!("{:?} delivered {} times before", delivery.message().message_id, delivery.delivery_count());
//!     match delivery.message().subject.as_deref() {
//!         Some("orders.order-placed.v1") => delivery.complete().await?,
//!         _ => delivery.dead_letter("UnknownSubject", "no handler for this subject").await?,
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//! - [`ConnectionString`]: `Endpoint=sb://…;SharedAccessKeyName=…;…`, printable without
//!   secrets; [`Credential`], [`Transport`]. [`sign_sas`] / [`SasToken`]: shared access
//!   signatures, as the SDKs sign them. [`TrustRoots`]: the certificate authorities the TLS
//!   connection trusts. [`ProxyConfig`]: AMQP over WebSockets through an HTTP proxy.
//! - [`TokenProvider`]: tokens per audience ([`SasProvider`]; `EntraProvider` with feature
//!   `entra`, over `entra::EntraCredential`), put on `$cbs` before each link and refreshed
//!   before expiry.
//! - [`ServiceBusClient`]: one connection, re-established only after connection-level
//!   failures; a link the service detaches is re-attached on it ([`error::recovery`]
//!   classifies failures as the SDKs do); [`RetryOptions`] say how sends and settlements
//!   retry.
//! - [`ServiceBusReceiver`] / [`ServiceBusDelivery`]: peek-lock receive, renew-lock on
//!   `$management`, settlement on the link or by lock token, awaiting the broker's outcome
//!   ([`SettlementError`], [`ReceiveError`]).
//! - [`ServiceBusSessionReceiver`] / [`ServiceBusSessionSource`]: message sessions.
//! - [`ServiceBusSender`]: sends to one entity that await `accepted`, typed rejections
//!   ([`SendError`]) and scheduled enqueue times ([`SendOptions`]).
//! - [`ServiceBusMessage`] (to send), [`ServiceBusReceivedMessage`] (as received, with the
//!   broker's state), [`PropertyValue`].
//! - [`ServiceBusClient::peek`] / [`PeekedMessage`]: `$management` peek-message, e.g. of a
//!   dead-letter queue. `admin` (feature `admin`): the HTTPS management API (entity settings).
//! - Inside, files import one way, down (`.ci/legible` counts the circles): the links
//!   (`sender`, `receiver`, `session`, each making its own link in an `impl ServiceBusClient`
//!   block) import the `client` (connection, tokens, `$management`), which imports the
//!   connection's `scope`, `cbs` and `management`, never a link. A delivery reaches what its
//!   link shares through `receive_link` and `session_lock`, which its receiver and the session
//!   receiver import as well; `settlement` extends the delivery, and the types both sides need
//!   (settlement attempts, dead-letter outcomes, send options) sit below them.
//! - [`names`]: every span, attribute and metric name the client emits;
//!   [`trace_context`]: the W3C Trace Context propagator it reads and writes producers'
//!   context with.
//!
//! # Features
//! None is on by default: AMQP over TCP and TLS, SAS tokens, Mozilla's trust roots.
//! - `admin`: the HTTPS management API (`admin`), over quick-xml.
//! - `websockets`: AMQP over WebSockets (`Transport::AmqpWebSockets`), sb-amqp's
//!   `websockets` (tokio-tungstenite's handshake). Without it such a client fails to connect,
//!   naming the feature.
//! - `native-roots`: the operating system's trust store (`TrustRoots::with_native_roots`),
//!   through rustls-native-certs; also trusted by Entra ID's HTTP client.
//! - `entra`: Microsoft Entra ID tokens (`entra`, `EntraProvider`,
//!   `ServiceBusClient::with_entra`) through `azure_identity` over reqwest.
//! - `fuzzing`: entry points for cargo-fuzz targets (not public API).
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// docs.rs (all features, `--cfg docsrs`): each feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "admin")]
pub mod admin;
mod amqp_message;
mod auth;
mod busy;
mod cbs;
mod client;
mod connection_string;
mod connector;
mod delivery;
#[cfg(feature = "entra")]
pub mod entra;
pub mod error;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod limits;
mod lock_clock;
mod management;
mod message;
pub mod names;
mod node;
mod peek;
mod propagation;
mod proxy;
mod receive_error;
mod receive_link;
mod receiver;
mod retry;
mod sas;
mod scope;
mod sender;
mod session;
mod session_lock;
mod settlement;
mod settlement_error;
mod telemetry;
pub mod trace_context;
mod trust;
pub mod window;

pub use amqp_message::UnusableMessage;
#[cfg(feature = "entra")]
pub use auth::EntraProvider;
pub use auth::{
    AccessToken, SERVICE_BUS_SCOPE, SasProvider, TokenFuture, TokenProvider, TokenType,
};
pub use client::{DEFAULT_SERVER_BUSY_WAIT, DEFAULT_TIMEOUT, ServiceBusClient};
pub use connection_string::{ConnectionString, ConnectionStringError, Credential, Transport};
pub use connector::{ConnectFuture, Connector, WallClock};
pub use delivery::ServiceBusDelivery;
pub use error::ServiceBusError;
pub use message::{
    PropertyValue, SendOptions, ServiceBusMessage, ServiceBusReceivedMessage,
    TYPED_MESSAGE_ID_PREFIX,
};
pub use peek::{DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, PeekedMessage};
pub use proxy::{ProxyConfig, ProxyError};
pub use receive_error::ReceiveError;
pub use receiver::{DEFAULT_LINK_IDLE_GUARD, ServiceBusReceiver};
pub use retry::RetryOptions;
pub use sas::{SasToken, sign_sas};
pub use sb_amqp::HttpProxy;
pub use sender::{SendError, SendErrorKind, ServiceBusSender};
pub use session::{ServiceBusSessionReceiver, ServiceBusSessionSource};
pub use settlement_error::SettlementError;
pub use telemetry::EntityNames;
pub use trust::{TrustError, TrustRoots};

/// The dead-letter reasons the receiver writes itself, for deliveries it cannot hand out.
pub mod dead_letter_reason {
    /// A string message id starting with
    /// [`TYPED_MESSAGE_ID_PREFIX`](crate::TYPED_MESSAGE_ID_PREFIX): it could pose as an id of
    /// another AMQP type.
    pub const INVALID_MESSAGE_ID: &str = "InvalidMessageId";
    /// The AMQP message does not decode: every delivery of it would fail the same way.
    pub const UNDECODABLE_MESSAGE: &str = "UndecodableMessage";
}

/// The README's Rust code blocks, compiled as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
