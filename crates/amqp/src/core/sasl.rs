//! The SASL exchanges both roles run on [`FramedIo`] after both SASL headers were exchanged,
//! as `open` is the exchange both run after it: the client's (ANONYMOUS, PLAIN) and the
//! server's (the configured mechanism list, an optional credential check). The SASL frames and
//! settings sit below the frame layer (`crate::sasl`); the exchanges sit here, above it.

use fe2o3_amqp_types::sasl::{SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
use serde_amqp::primitives::{Array, Binary, Symbol};

use super::framed_io::FramedIo;
use crate::error::{Error, Result};
use crate::frame::{Frame, FrameBody};
use crate::sasl::{SaslClient, SaslFrame, SaslIdentity, SaslServer};

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
