//! The `open` exchange both roles share: our `open`, reading the peer's, and starting the
//! driver with what was negotiated.

use std::sync::Arc;
use std::time::Duration;

use fe2o3_amqp_types::definitions::Fields;
use fe2o3_amqp_types::performatives::{ChannelMax, MaxFrameSize};
use tokio::sync::mpsc;

use super::command::ConnInner;
use super::connection::Connection;
use super::driver;
use super::framed_io::FramedIo;
use super::link::PeerAttach;
use crate::error::{Error, Result};
use crate::frame::FrameBody;
use crate::performative::{Open, Performative};

/// Our `open` performative.
pub(crate) fn local_open(
    container_id: &str,
    hostname: Option<String>,
    max_frame_size: u32,
    channel_max: u16,
    idle: Option<Duration>,
    properties: Option<Fields>,
) -> Open {
    Open {
        container_id: container_id.to_string(),
        hostname,
        max_frame_size: MaxFrameSize(max_frame_size),
        channel_max: ChannelMax(channel_max),
        idle_time_out: idle.map(|d| d.as_millis().min(u128::from(u32::MAX)) as u32),
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties,
    }
}

/// Reads the peer's `open` (a `close` instead is the peer refusing the connection).
pub(crate) async fn read_open(f: &mut FramedIo) -> Result<Open> {
    match f.read_frame().await? {
        Some(fr) => match fr.body {
            FrameBody::Amqp(p, _) => match *p {
                Performative::Open(o) => Ok(o),
                Performative::Close(c) => Err(Error::ConnectionClosed(c.error.map(Into::into))),
                other => Err(Error::Protocol(format!(
                    "expected open, got {}",
                    other.name()
                ))),
            },
            _ => Err(Error::Protocol("expected open".into())),
        },
        None => Err(Error::ConnectionLost),
    }
}

/// Starts the driver on a stream whose `open` exchange is done; peer-initiated links go to
/// `peer_links` (the server role), or are refused when it is `None` (the client role).
pub(crate) fn start(
    mut f: FramedIo,
    local: &Open,
    remote: Open,
    idle: Option<Duration>,
    max_unfinished_bytes: u64,
    peer_links: Option<mpsc::UnboundedSender<PeerAttach>>,
    span: tracing::Span,
) -> Connection {
    let neg = driver::Negotiated {
        peer_max_frame_size: remote
            .max_frame_size
            .0
            .max(crate::frame::MIN_MAX_FRAME_SIZE),
        channel_max: local.channel_max.0.min(remote.channel_max.0),
        local_idle: idle,
        remote_idle: remote
            .idle_time_out
            .filter(|ms| *ms > 0)
            .map(|ms| Duration::from_millis(u64::from(ms))),
        max_unfinished_bytes,
    };
    f.set_max_frame_size(local.max_frame_size.0);
    let (r, w) = f.split();
    let self_ref: driver::SelfRef = Arc::default();
    let (ctx, stats) = driver::spawn(r, w, neg, peer_links, self_ref.clone(), span);
    let inner = Arc::new(ConnInner {
        ctx,
        remote_open: remote,
        stats,
    });
    // Cannot fail: set once, right here.
    let _ = self_ref.set(Arc::downgrade(&inner));
    Connection { inner }
}
