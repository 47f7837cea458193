//! Connection liveness between our client and our server: heartbeats, idle time-outs, a
//! lost socket and a remote close reaching every pending operation.

use std::time::Duration;

use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::{
    AmqpError, Connection, ConnectionEvent, ConnectionOptions, Error, LinkAnswer, ReceiverOptions,
    SaslClient, Sendable, ServerOptions, condition,
};
use tokio::sync::mpsc;

use crate::support::*;

#[tokio::test]
async fn heartbeats_both_ways() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let opts = ServerOptions {
        idle_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    let addr = spawn_server(opts, move |conn| {
        let tx = tx.clone();
        async move {
            // The client must keep us alive with empty frames at half our timeout.
            conn.connection().wait_heartbeats(3).await.unwrap();
            tx.send(conn.connection().heartbeats_received()).unwrap();
            std::future::pending::<()>().await;
        }
    })
    .await;
    let conn = Connection::open_with(
        &url(addr),
        ConnectionOptions {
            idle_timeout: Some(Duration::from_millis(200)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(conn.remote_open().idle_time_out, Some(200));
    conn.wait_heartbeats(3).await.unwrap();
    assert!(rx.recv().await.unwrap() >= 3);
    assert!(conn.heartbeats_sent() >= 3);
    assert!(conn.error().is_none());
    let s = conn.begin().await.unwrap();
    s.end().await.unwrap();
}

/// A peer that answers `open` and then goes silent: pending operations fail with
/// `IdleTimeout` and we close with `amqp:resource-limit-exceeded`.
#[tokio::test]
async fn silent_peer_trips_idle_timeout() {
    use sb_amqp::{Frame, FrameBody, FramedIo};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (closed_tx, mut closed_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let (tcp, _) = l.accept().await.unwrap();
        let mut f = FramedIo::new(Box::new(tcp), 65536);
        f.read_header().await.unwrap();
        f.write_header(sb_amqp::frame::AMQP_HEADER).await.unwrap();
        let open = match f.read_frame().await.unwrap().unwrap().body {
            FrameBody::Amqp(p, _) => match *p {
                sb_amqp::performative::Performative::Open(o) => o,
                _ => panic!(),
            },
            _ => panic!(),
        };
        let mut mine = open.clone();
        mine.idle_time_out = None;
        f.write_frame(&Frame::amqp(0, mine)).await.unwrap();
        // Read (and ignore) everything; never answer.
        while let Ok(Some(fr)) = f.read_frame().await {
            if let FrameBody::Amqp(p, _) = fr.body
                && let sb_amqp::performative::Performative::Close(c) = *p
            {
                closed_tx.send(c).unwrap();
            }
        }
    });
    let conn = Connection::open_with(
        &url(addr),
        ConnectionOptions {
            idle_timeout: Some(Duration::from_millis(150)),
            sasl: Some(SaslClient::None),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let e = conn.begin().await.unwrap_err();
    assert!(matches!(e, Error::IdleTimeout), "{e:?}");
    assert!(e.is_transient());
    let close = closed_rx.recv().await.unwrap();
    let err: AmqpError = close.error.unwrap().into();
    assert_eq!(err.condition, condition::RESOURCE_LIMIT_EXCEEDED);
}

#[tokio::test]
async fn socket_loss_fails_every_pending_operation() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        let mut keep = Vec::new();
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            if req.is_peer_sender() {
                // no credit: the client's send waits
                keep.push(tokio::spawn({
                    let r = req.accept_receiver(LinkAnswer::default()).await.unwrap();
                    async move {
                        let _r = r;
                        std::future::pending::<()>().await
                    }
                }));
            } else {
                let s = req
                    .accept_sender(LinkAnswer::default().manual_drain())
                    .await
                    .unwrap();
                keep.push(tokio::spawn(async move {
                    if s.remote_attach().rcv_settle_mode == ReceiverSettleMode::Second {
                        s.wait_credit().await.unwrap();
                        s.send_no_wait(data_message(b"x")).await.unwrap();
                        // never answer the client's disposition
                    }
                    std::future::pending::<()>().await
                }));
            }
        }
    })
    .await;
    let proxy = Proxy::start(addr).await;
    let conn = connect(proxy.addr).await;
    let session = conn.begin().await.unwrap();
    let sender = open_sender(&session, "s", "q").await;
    let receiver = open_receiver(&session, "r", "q").await;
    let drainer = open_receiver(&session, "d", "q").await;
    let peek = session
        .attach_receiver(
            ReceiverOptions::new("p", "q")
                .rcv_settle_mode(ReceiverSettleMode::Second)
                .credit(1),
        )
        .await
        .unwrap();
    let d = peek.recv().await.unwrap();
    drainer.set_credit(3).await.unwrap();

    let send = tokio::spawn(async move { sender.send(data_message(b"x")).await });
    let recv = tokio::spawn(async move { receiver.recv().await });
    let drain = tokio::spawn(async move { drainer.drain().await });
    let settle = tokio::spawn(async move { peek.accept(&d).await });
    let begin = {
        let c = conn.clone();
        tokio::spawn(async move {
            // Give the other operations a head start by waiting on a future that never
            // completes until the connection dies.
            c.closed().await
        })
    };
    tokio::task::yield_now().await;
    proxy.kill();
    for e in [
        send.await.unwrap().unwrap_err(),
        recv.await.unwrap().unwrap_err(),
        drain.await.unwrap().unwrap_err(),
        settle.await.unwrap().unwrap_err(),
        begin.await.unwrap(),
    ] {
        assert!(matches!(e, Error::ConnectionLost | Error::Io(_)), "{e:?}");
        assert!(e.is_connection_error());
    }
    assert!(conn.begin().await.is_err());
}

#[tokio::test]
async fn remote_close_error_reaches_pending_operations() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        if let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
            s.wait_credit().await.unwrap();
            conn.connection()
                .close_with(Some(AmqpError::new(condition::CONNECTION_FORCED, None)))
                .await
                .ok();
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let r = s
        .attach_receiver(ReceiverOptions::new("r", "q").credit(1))
        .await
        .unwrap();
    let e = r.recv().await.unwrap_err();
    assert_eq!(e.condition(), Some(condition::CONNECTION_FORCED), "{e:?}");
    assert!(e.is_transient());
}

/// A server ends the client's session while the connection lives (Service Bus may): the
/// client's handle reports it ended; a new session (on the freed channel) works, and dropping
/// the old handle does not end the new session that took its channel number.
#[tokio::test]
async fn a_session_the_server_ends_is_reported_and_its_channel_reused_safely() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            let mut first = true;
            while let Some(ConnectionEvent::Link(request)) = conn.next_event().await {
                let channel = request.channel();
                let _sender = request
                    .accept_receiver(LinkAnswer::default().credit(10))
                    .await
                    .unwrap();
                if first {
                    first = false;
                    conn.connection()
                        .end_session(
                            channel,
                            Some(AmqpError::new(condition::INTERNAL_ERROR, None)),
                        )
                        .await
                        .unwrap();
                }
                tx.send(channel).unwrap();
                // Keep the link task alive.
                tokio::spawn(async move {
                    let _keep = _sender;
                    std::future::pending::<()>().await
                });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let old = conn.begin().await.unwrap();
    assert!(!old.is_ended());
    let _first = open_sender(&old, "s1", "q").await;
    rx.recv().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while !old.is_ended() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the client sees the session ended");
    assert!(conn.error().is_none(), "the connection lives");
    let new = conn.begin().await.unwrap();
    assert_eq!(new.channel(), old.channel(), "the channel is reused");
    drop(_first);
    drop(old);
    // The old handle's drop went to the driver before this attach: had it ended the channel's
    // session, the attach could not be answered.
    let _second = tokio::time::timeout(
        Duration::from_secs(5),
        new.attach_sender(sb_amqp::SenderOptions::new("s2", "q")),
    )
    .await
    .expect("the attach is answered")
    .expect("the new session takes links");
    rx.recv().await.unwrap();
    assert!(
        !new.is_ended(),
        "dropping the old handle left the new session alone"
    );
}

/// What the server hands the F2 test: its connection, and each link's server end with its
/// server-side channel.
enum ServerEnd {
    Conn(Connection),
    Sender(u16, sb_amqp::Sender),
    Receiver(u16, sb_amqp::Receiver),
}

async fn next_server_sender(rx: &mut mpsc::UnboundedReceiver<ServerEnd>) -> (u16, sb_amqp::Sender) {
    match rx.recv().await {
        Some(ServerEnd::Sender(ch, s)) => (ch, s),
        _ => panic!("expected a server sender"),
    }
}

async fn next_server_receiver(
    rx: &mut mpsc::UnboundedReceiver<ServerEnd>,
) -> (u16, sb_amqp::Receiver) {
    match rx.recv().await {
        Some(ServerEnd::Receiver(ch, r)) => (ch, r),
        _ => panic!("expected a server receiver"),
    }
}

/// Issue 39, F2: the server ends a session with several links in use and a new session takes
/// its channel, its links the same handle numbers and its deliveries the same ids. The old
/// session's sender and settler are refused; nothing reaches the new session's links.
#[tokio::test]
async fn handles_of_an_ended_session_never_act_on_the_session_that_took_its_channel() {
    use futures_util::FutureExt;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            tx.send(ServerEnd::Conn(conn.connection().clone())).unwrap();
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let ch = req.channel();
                let end = if req.is_peer_sender() {
                    let answer = LinkAnswer::default().credit(10);
                    ServerEnd::Receiver(ch, req.accept_receiver(answer).await.unwrap())
                } else {
                    ServerEnd::Sender(ch, req.accept_sender(LinkAnswer::default()).await.unwrap())
                };
                tx.send(end).unwrap();
            }
        }
    })
    .await;
    let client = connect(addr).await;
    let Some(ServerEnd::Conn(server)) = rx.recv().await else {
        panic!("no server connection");
    };
    let old = client.begin().await.unwrap();
    let r1 = open_receiver(&old, "r1", "q1").await;
    let (server_channel, server_r1) = next_server_sender(&mut rx).await;
    r1.set_credit(1).await.unwrap();
    server_r1
        .send_no_wait(Sendable::raw(&b"old"[..]).tag(&b"old"[..]))
        .await
        .unwrap();
    let d1 = r1.recv().await.unwrap();
    let settler1 = r1.settler();
    let s1 = open_sender(&old, "s1", "q1").await;
    let _server_s1 = next_server_receiver(&mut rx).await;
    let error = AmqpError::new(condition::INTERNAL_ERROR, None);
    server
        .end_session(server_channel, Some(error))
        .await
        .unwrap();
    assert!(matches!(r1.recv().await, Err(Error::SessionEnded(_))));
    let new = client.begin().await.unwrap();
    assert_eq!(new.channel(), old.channel(), "the channel is reused");
    let r2 = open_receiver(&new, "r2", "q2").await;
    assert_eq!(r2.local_attach().handle, r1.local_attach().handle);
    let (_, server_r2) = next_server_sender(&mut rx).await;
    r2.set_credit(1).await.unwrap();
    server_r2
        .send_no_wait(Sendable::raw(&b"new"[..]).tag(&b"new"[..]))
        .await
        .unwrap();
    let d2 = r2.recv().await.unwrap();
    assert_eq!(d2.delivery_id, d1.delivery_id, "delivery ids restart");
    let s2 = open_sender(&new, "s2", "q2").await;
    assert_eq!(s2.local_attach().handle, s1.local_attach().handle);
    let (_, server_s2) = next_server_receiver(&mut rx).await;

    let e = settler1
        .settle(d1.delivery_id, sb_amqp::Outcome::Accepted)
        .await
        .unwrap_err();
    assert!(matches!(e, Error::SessionEnded(_)), "{e:?}");
    let e = s1.send_settled(data_message(b"for q1")).await.unwrap_err();
    assert!(
        matches!(e, Error::SessionEnded(_) | Error::LinkDetached(_)),
        "{e:?}"
    );
    // The new links work, and s2's send is a round trip behind anything the stale handles
    // could have written: nothing of theirs arrived.
    s2.send_settled(data_message(b"for q2")).await.unwrap();
    assert_eq!(body_bytes(&server_s2.recv().await.unwrap()), b"for q2");
    assert!(server_s2.try_recv().unwrap().is_none());
    assert!(
        server_r2.next_disposition().now_or_never().is_none(),
        "the new session's delivery is still unsettled"
    );
    r2.accept(&d2).await.unwrap();
    let d = server_r2.next_disposition().await.unwrap();
    assert_eq!(&d.delivery_tag[..], b"new");
}
