//! Azure Service Bus: connection strings and token signing (the AMQP client comes with the
//! engine crate).
//!
//! # Layout
//! - [`ConnectionString`]: `Endpoint=sb://…;SharedAccessKeyName=…;…`, printable without secrets.
//! - [`sign_sas`]: shared access signatures per audience, for `$cbs` put-token.

mod connection_string;
mod sas;

pub use connection_string::{ConnectionString, ConnectionStringError, Credential};
pub use sas::{SasToken, sign_sas};
