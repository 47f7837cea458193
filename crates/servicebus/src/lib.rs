//! sb-servicebus: the Azure Service Bus client on the `sb-amqp` engine, as it leaves the
//! `sb-inbox` crate (issue 32).
//!
//! This first part holds what the connection needs and nothing of the inbox: it depends on
//! `sb-amqp` only. The client itself (`ServiceBusClient`, receiver, sender, `$cbs` and
//! `$management` nodes) still lives in `sb-inbox`'s `servicebus` module, which re-exports
//! everything here under its old paths (`sb_inbox::servicebus::ConnectionString` etc.).
//!
//! # Layout
//! - [`ConnectionString`]: `Endpoint=sb://…;SharedAccessKeyName=…;…`, printable without
//!   secrets; [`Credential`], [`Transport`].
//! - [`sign_sas`] / [`SasToken`]: shared access signatures, as the SDKs sign them.
//! - [`TrustRoots`]: the certificate authorities the TLS connection trusts.
//! - [`ProxyConfig`]: AMQP over WebSockets through an HTTP proxy.
//! - [`ServiceBusError`] and [`error`]: failures, and how a client recovers from each AMQP
//!   failure ([`error::recovery`]) as the official SDKs classify them.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod connection_string;
pub mod error;
mod proxy;
mod sas;
mod trust;

pub use connection_string::{ConnectionString, ConnectionStringError, Credential, Transport};
pub use error::ServiceBusError;
pub use proxy::{ProxyConfig, ProxyError};
pub use sas::{SasToken, sign_sas};
pub use sb_amqp::HttpProxy;
pub use trust::{TrustError, TrustRoots};
