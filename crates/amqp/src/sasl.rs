//! SASL layer: frames, the client exchange (ANONYMOUS, PLAIN) and the server exchange
//! (a configurable mechanism list, e.g. MSSBCBS, PLAIN, ANONYMOUS).
//!
//! This file holds [`SaslFrame`] (what the frame layer carries) and the exchanges' settings
//! ([`SaslClient`], [`SaslServer`], [`SaslIdentity`]); the exchanges themselves run on the
//! connection core (`core::sasl`, beside the `open` exchange). The frames sit below the frame
//! layer and the exchanges above it, so neither imports the other (issue 46).

use std::sync::Arc;

use bytes::BytesMut;
use fe2o3_amqp_types::sasl::{SaslChallenge, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};

use crate::error::{Error, Result};
use crate::performative::{decode_as, descriptor_code, encode_into};

/// A SASL frame body.
#[derive(Debug, Clone)]
#[allow(missing_docs)]
pub enum SaslFrame {
    Mechanisms(SaslMechanisms),
    Init(SaslInit),
    Challenge(SaslChallenge),
    Response(SaslResponse),
    Outcome(SaslOutcome),
}

impl SaslFrame {
    /// Decodes a SASL frame body.
    ///
    /// # Errors
    /// [`Error::Decode`] for unknown descriptors or malformed fields.
    pub fn decode(b: &[u8]) -> Result<Self> {
        Ok(match descriptor_code(b)? {
            0x40 => SaslFrame::Mechanisms(decode_as(b)?),
            0x41 => SaslFrame::Init(decode_as(b)?),
            0x42 => SaslFrame::Challenge(decode_as(b)?),
            0x43 => SaslFrame::Response(decode_as(b)?),
            0x44 => SaslFrame::Outcome(decode_as(b)?),
            c => return Err(Error::Decode(format!("unknown SASL frame {c:#x}"))),
        })
    }

    /// Appends the encoded body to `dst`.
    ///
    /// # Errors
    /// [`Error::Encode`] if a field does not encode.
    pub fn encode(&self, dst: &mut BytesMut) -> Result<()> {
        match self {
            SaslFrame::Mechanisms(v) => encode_into(v, dst),
            SaslFrame::Init(v) => encode_into(v, dst),
            SaslFrame::Challenge(v) => encode_into(v, dst),
            SaslFrame::Response(v) => encode_into(v, dst),
            SaslFrame::Outcome(v) => encode_into(v, dst),
        }
    }
}

/// Client-side SASL choice.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SaslClient {
    /// No SASL layer: send the AMQP header directly.
    None,
    /// `ANONYMOUS`.
    Anonymous,
    /// `PLAIN` with a user name and password.
    Plain {
        /// User name.
        username: String,
        /// Password.
        password: String,
    },
}

/// What the client presented during the server-side SASL exchange.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SaslIdentity {
    /// The mechanism the client chose (`None` if it skipped SASL).
    pub mechanism: Option<String>,
    /// PLAIN user name.
    pub username: Option<String>,
    /// PLAIN password.
    pub password: Option<String>,
    /// Hostname from `sasl-init`.
    pub hostname: Option<String>,
}

/// Decides whether a client's credentials are accepted.
pub type Authenticator = Arc<dyn Fn(&SaslIdentity) -> bool + Send + Sync>;

/// Server-side SASL configuration.
#[derive(Clone)]
pub struct SaslServer {
    /// Offered mechanisms, in preference order.
    pub mechanisms: Vec<String>,
    /// Accept clients that skip SASL and send the plain AMQP header.
    pub allow_no_sasl: bool,
    /// Credential check; `None` accepts everyone.
    pub authenticator: Option<Authenticator>,
}

impl std::fmt::Debug for SaslServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslServer")
            .field("mechanisms", &self.mechanisms)
            .field("allow_no_sasl", &self.allow_no_sasl)
            .field("authenticator", &self.authenticator.is_some())
            .finish()
    }
}

impl Default for SaslServer {
    /// Offers `MSSBCBS`, `PLAIN`, `ANONYMOUS` (what Service Bus clients expect) and accepts all.
    fn default() -> Self {
        Self {
            mechanisms: vec!["MSSBCBS".into(), "PLAIN".into(), "ANONYMOUS".into()],
            allow_no_sasl: true,
            authenticator: None,
        }
    }
}
