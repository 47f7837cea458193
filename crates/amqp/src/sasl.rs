//! SASL layer: frames, the client exchange (ANONYMOUS, PLAIN) and the server exchange
//! (a configurable mechanism list, e.g. MSSBCBS, PLAIN, ANONYMOUS).

use std::sync::Arc;

use bytes::BytesMut;
use fe2o3_amqp_types::sasl::{
    SaslChallenge, SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse,
};
use serde_amqp::primitives::{Array, Binary, Symbol};

use crate::core::FramedIo;
use crate::error::{Error, Result};
use crate::frame::{Frame, FrameBody};
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

async fn next_sasl(io: &mut FramedIo) -> Result<SaslFrame> {
    match io.read_frame().await? {
        Some(Frame {
            body: FrameBody::Sasl(s),
            ..
        }) => Ok(s),
        Some(_) => Err(Error::Protocol("expected a SASL frame".into())),
        None => Err(Error::ConnectionLost),
    }
}

fn sasl_frame(s: SaslFrame) -> Frame {
    Frame {
        channel: 0,
        body: FrameBody::Sasl(s),
    }
}

/// Ends the SASL exchange with a `sys-perm` outcome: the peer sent bytes that do not decode, so
/// retrying the same exchange cannot succeed.
pub(crate) async fn fail(io: &mut FramedIo) -> Result<()> {
    io.write_frame(&sasl_frame(SaslFrame::Outcome(SaslOutcome {
        code: SaslCode::SysPerm,
        additional_data: None,
    })))
    .await
}

/// Runs the client side of the SASL exchange, after both SASL headers were exchanged.
pub(crate) async fn client(io: &mut FramedIo, sasl: &SaslClient, hostname: &str) -> Result<()> {
    let SaslFrame::Mechanisms(mechs) = next_sasl(io).await? else {
        return Err(Error::Protocol("expected sasl-mechanisms".into()));
    };
    let offered: Vec<String> = mechs
        .sasl_server_mechanisms
        .0
        .iter()
        .map(|s| s.0.clone())
        .collect();
    let (mechanism, initial) = match sasl {
        SaslClient::Plain { username, password } => {
            let mut resp = Vec::with_capacity(username.len() + password.len() + 2);
            resp.push(0);
            resp.extend_from_slice(username.as_bytes());
            resp.push(0);
            resp.extend_from_slice(password.as_bytes());
            ("PLAIN", Some(Binary::from(resp)))
        }
        _ => ("ANONYMOUS", None),
    };
    if !offered.iter().any(|m| m == mechanism) {
        return Err(Error::Protocol(format!(
            "server does not offer {mechanism} (offers {offered:?})"
        )));
    }
    io.write_frame(&sasl_frame(SaslFrame::Init(SaslInit {
        mechanism: Symbol::from(mechanism),
        initial_response: initial,
        hostname: Some(hostname.to_string()),
    })))
    .await?;
    loop {
        match next_sasl(io).await? {
            SaslFrame::Outcome(o) => {
                return match o.code {
                    SaslCode::Ok => Ok(()),
                    c => Err(Error::Sasl(c as u8)),
                };
            }
            SaslFrame::Challenge(_) => {
                io.write_frame(&sasl_frame(SaslFrame::Response(SaslResponse {
                    response: Binary::from(Vec::new()),
                })))
                .await?;
            }
            _ => return Err(Error::Protocol("unexpected SASL frame".into())),
        }
    }
}

/// Runs the server side of the SASL exchange, after both SASL headers were exchanged.
pub(crate) async fn server(io: &mut FramedIo, cfg: &SaslServer) -> Result<SaslIdentity> {
    let mechs: Vec<Symbol> = cfg
        .mechanisms
        .iter()
        .map(|m| Symbol::from(m.as_str()))
        .collect();
    io.write_frame(&sasl_frame(SaslFrame::Mechanisms(SaslMechanisms {
        sasl_server_mechanisms: Array(mechs),
    })))
    .await?;
    let SaslFrame::Init(init) = next_sasl(io).await? else {
        return Err(Error::Protocol("expected sasl-init".into()));
    };
    let mut id = SaslIdentity {
        mechanism: Some(init.mechanism.0.clone()),
        hostname: init.hostname.clone(),
        ..Default::default()
    };
    let offered = cfg.mechanisms.contains(&init.mechanism.0);
    if offered
        && init.mechanism.0 == "PLAIN"
        && let Some(resp) = &init.initial_response
    {
        let mut parts = resp.as_ref().split(|b| *b == 0).skip(1);
        id.username = parts
            .next()
            .map(|u| String::from_utf8_lossy(u).into_owned());
        id.password = parts
            .next()
            .map(|p| String::from_utf8_lossy(p).into_owned());
    }
    let ok = offered && cfg.authenticator.as_ref().is_none_or(|auth| auth(&id));
    io.write_frame(&sasl_frame(SaslFrame::Outcome(SaslOutcome {
        code: if ok { SaslCode::Ok } else { SaslCode::Auth },
        additional_data: None,
    })))
    .await?;
    if ok {
        Ok(id)
    } else {
        Err(Error::Sasl(SaslCode::Auth as u8))
    }
}
