//! Time-dependent behaviour on in-memory streams with tokio's paused clock: the real idle
//! timeouts clients use (JS asks for 60 s) run in virtual time, deterministically.

use std::sync::Arc;
use std::time::Duration;

use sb_amqp::{
    Connection, ConnectionOptions, Error, Frame, FrameBody, FramedIo, SaslClient, ServerOptions,
    condition, serve_io,
};
use tokio::time::Instant;

#[tokio::test(start_paused = true)]
async fn sixty_second_idle_timeouts_keep_both_sides_alive() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let server_opts = Arc::new(ServerOptions {
        idle_timeout: Some(Duration::from_secs(60)),
        ..Default::default()
    });
    let client_opts = ConnectionOptions {
        idle_timeout: Some(Duration::from_secs(60)),
        sasl: Some(SaslClient::Anonymous),
        ..Default::default()
    };
    let (server, client) = tokio::join!(
        serve_io(Box::new(b), server_opts),
        Connection::open_io(Box::new(a), client_opts)
    );
    let (server, client) = (server.unwrap(), client.unwrap());
    let start = Instant::now();
    let (s, c) = tokio::join!(
        server.connection().wait_heartbeats(4),
        client.wait_heartbeats(4)
    );
    s.unwrap();
    c.unwrap();
    // Four heartbeats each way at half the peer's 60 s timeout: at least two virtual minutes.
    assert!(
        start.elapsed() >= Duration::from_secs(120),
        "{:?}",
        start.elapsed()
    );
    assert!(server.connection().error().is_none());
    assert!(client.error().is_none());
    let session = client.begin().await.unwrap();
    session.end().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn silent_peer_detected_after_idle_timeout() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let mut f = FramedIo::new(Box::new(b), 65536);
        f.read_header().await.unwrap();
        f.write_header(sb_amqp::frame::AMQP_HEADER).await.unwrap();
        let Some(Frame {
            body: FrameBody::Amqp(p, _),
            ..
        }) = f.read_frame().await.unwrap()
        else {
            panic!()
        };
        let sb_amqp::performative::Performative::Open(mut open) = *p else {
            panic!()
        };
        open.idle_time_out = None;
        f.write_frame(&Frame::amqp(0, open)).await.unwrap();
        let mut closed_tx = Some(closed_tx);
        while let Ok(Some(fr)) = f.read_frame().await {
            if let FrameBody::Amqp(p, _) = fr.body
                && let sb_amqp::performative::Performative::Close(c) = *p
                && let Some(tx) = closed_tx.take()
            {
                tx.send(c).unwrap();
            }
        }
    });
    let conn = Connection::open_io(
        Box::new(a),
        ConnectionOptions {
            idle_timeout: Some(Duration::from_secs(60)),
            sasl: Some(SaslClient::None),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let start = Instant::now();
    let e = conn.begin().await.unwrap_err();
    assert!(matches!(e, Error::IdleTimeout), "{e:?}");
    assert!(start.elapsed() >= Duration::from_secs(60));
    assert!(start.elapsed() < Duration::from_secs(61));
    let close = closed_rx.await.unwrap();
    let err: sb_amqp::AmqpError = close.error.unwrap().into();
    assert_eq!(err.condition, condition::RESOURCE_LIMIT_EXCEEDED);
    assert!(matches!(conn.closed().await, Error::IdleTimeout));
}
