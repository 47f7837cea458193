//! The one door from untrusted bytes to `serde_amqp`: every frame body, performative, SASL
//! frame, message section and `$cbs`/`$management` body the crate decodes passes
//! [`validate_encoding`] first, then the upstream deserializer.
//!
//! # Layout
//! - `validate`: the structural walk and its [`EncodingError`].
//! - `measure`: [`value_len`], where an encoded value ends (the frame layer's split).
//! - `Wire`: the types the crate decodes, a closed set. Upstream `serde_amqp` 0.18 has two
//!   `unreachable!()`s in `Deserializer::deserialize_byte_buf` / `deserialize_bytes` (de.rs) on
//!   a state a previous value leaves behind: decoding a borrowed `SymbolRef` or a `LazyValue`
//!   never resets it, so binary data after one panics, from a well-formed encoding
//!   (`tests::borrowed_symbol_then_binary_panics_upstream`,
//!   `tests::lazy_value_then_bytes_panics_upstream`). No structural check can see that; the type
//!   can. Only owned types reviewed to contain neither get an impl (`DeserializeOwned` already
//!   rules out `SymbolRef<'de>`; `LazyValue` is kept out by the list).

mod measure;
mod validate;

#[cfg(test)]
mod tests;

use fe2o3_amqp_types::definitions::ErrorCondition;
use fe2o3_amqp_types::messaging::Body;
use fe2o3_amqp_types::messaging::Message;
use fe2o3_amqp_types::messaging::message::__private::Deserializable;
use fe2o3_amqp_types::performatives::{
    Attach, Begin, Close, Detach, Disposition, End, Flow, Open, Transfer,
};
use fe2o3_amqp_types::sasl::{SaslChallenge, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
use serde::de::DeserializeOwned;
use serde_amqp::Value;
use serde_amqp::primitives::Symbol;

use crate::error::{Error, Result};

pub use measure::value_len;
pub use validate::{EncodingError, MAX_NESTING, validate_encoding};

/// A type the crate decodes from untrusted bytes: owned, and free of `SymbolRef` and
/// `LazyValue` (see the module docs). Crate-private, so the list below is the whole set;
/// adding a type means checking its fields.
pub(crate) trait Wire: DeserializeOwned {}

macro_rules! wire {
    ($($t:ty),* $(,)?) => {
        $(
            impl Wire for $t {}
        )*
    };
}

wire!(
    Open,
    Begin,
    Attach,
    Flow,
    Transfer,
    Disposition,
    Detach,
    End,
    Close,
    SaslMechanisms,
    SaslInit,
    SaslChallenge,
    SaslResponse,
    SaslOutcome,
    // `delivery::AnyMessage`, spelled out: the codec door sits below the values it decodes.
    Deserializable<Message<Body<Value>>>,
    Symbol,
    ErrorCondition,
);

/// Validates `b` ([`validate_encoding`]), then decodes it with `serde_amqp`.
///
/// # Errors
/// [`Error::Decode`] when the encoding breaks a bound or the value does not decode as `T`.
pub(crate) fn decode<T: Wire>(b: &[u8]) -> Result<T> {
    validate_encoding(b).map_err(|e| Error::Decode(e.to_string()))?;
    serde_amqp::from_slice(b).map_err(|e| Error::Decode(e.to_string()))
}
