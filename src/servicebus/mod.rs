//! Azure Service Bus for the runtime: the `sb-servicebus` client behind the ports.
//!
//! The client is its own crate, `sb-servicebus` (usable without the inbox); everything it
//! exports is re-exported here under the paths this module always had
//! (`sb_inbox::servicebus::ServiceBusClient`, `ConnectionString`, …). What is the inbox's:
//!
//! # Layout
//! - `receiver`: the runtime's [`Receiver`](crate::Receiver) port on
//!   [`ServiceBusReceiver`], and its [`Delivery`](crate::Delivery):
//!   [`ServiceBusDelivery`], the client's delivery with the message as a [`crate::Message`].
//! - `session`: [`SessionSource`](crate::ports::SessionSource) /
//!   [`SessionReceiver`](crate::ports::SessionReceiver) on [`ServiceBusSessionSource`] /
//!   [`ServiceBusSessionReceiver`].
//! - [`ServiceBusSenderPort`]: the runtime's [`Sender`](crate::Sender) port, any destination,
//!   one [`ServiceBusSender`] each (formerly `ServiceBusPublisher`, kept as a deprecated
//!   alias).
//! - `convert`: [`crate::Message`] ⇄ the client's messages, and the client's settlement and
//!   receive errors as the ports' ([`crate::SettleError`], [`crate::ReceiveError`], causes
//!   kept).
//! - [`resubmission`]: the copy of a dead letter to send again, keyed as the original.

mod convert;
mod receiver;
mod resubmit;
mod sender_port;
mod session;

pub use receiver::ServiceBusDelivery;
pub use resubmit::{RESUBMISSION_PROPERTY, resubmission, resubmission_of};
#[cfg(feature = "entra")]
pub use sb_servicebus::EntraProvider;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub use sb_servicebus::fuzzing;
pub use sb_servicebus::{
    AccessToken, ConnectionString, ConnectionStringError, Credential,
    DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, DEFAULT_LINK_IDLE_GUARD,
    DEFAULT_SERVER_BUSY_WAIT, DEFAULT_TIMEOUT, HttpProxy, PeekedMessage, ProxyConfig, ProxyError,
    RetryOptions, SERVICE_BUS_SCOPE, SasProvider, SasToken, SendError, SendErrorKind, SendOptions,
    ServiceBusClient, ServiceBusError, ServiceBusMessage, ServiceBusReceivedMessage,
    ServiceBusReceiver, ServiceBusSender, ServiceBusSessionReceiver, ServiceBusSessionSource,
    SettlementError, TYPED_MESSAGE_ID_PREFIX, TokenFuture, TokenProvider, TokenType, Transport,
    TrustError, TrustRoots, admin, error, sign_sas, window,
};
#[allow(deprecated)]
pub use sender_port::{SENDER_IDLE, ServiceBusPublisher, ServiceBusSenderPort};
