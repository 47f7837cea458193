//! Our client against our server, in-process on 127.0.0.1:0.

use std::time::Duration;

use bytes::Bytes;
use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::types::messaging::{Message, MessageId};
use sb_amqp::types::primitives::{Binary, Uuid};
use sb_amqp::{
    AmqpError, BATCH_MESSAGE_FORMAT, Connection, ConnectionEvent, ConnectionOptions, Error,
    LinkAnswer, Outcome, ReceiverOptions, RequestResponse, SaslClient, Sendable, SenderOptions,
    ServerOptions, condition,
};
use tokio::sync::mpsc;

use crate::support::*;

#[tokio::test]
async fn send_awaits_accept_with_raw_bytes_tag_and_format() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                assert!(req.is_peer_sender());
                assert_eq!(req.target_address(), Some("q1"));
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10).max_message_size(1 << 20))
                    .await
                    .unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(d) = r.recv().await {
                        tx.send(d.clone()).unwrap();
                        r.accept(&d).await.unwrap();
                    }
                });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    let sender = session
        .attach_sender(SenderOptions::new("s1", "q1"))
        .await
        .unwrap();
    assert_eq!(sender.max_message_size(), 1 << 20);
    let msg = data_message(b"hello");
    let raw = msg.payload.clone();
    let outcome = sender
        .send(msg.tag(Bytes::from_static(b"tag-1")))
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Accepted);
    let d = rx.recv().await.unwrap();
    assert_eq!(d.payload, raw, "message bytes kept intact");
    assert_eq!(&d.delivery_tag[..], b"tag-1");
    assert_eq!(d.message_format, 0);
    assert!(!d.settled);
    assert_eq!(body_bytes(&d), b"hello");

    // Batch format and pre-settled send.
    let id = sender
        .send_settled(data_message(b"batch").format(BATCH_MESSAGE_FORMAT))
        .await
        .unwrap();
    let d = rx.recv().await.unwrap();
    assert_eq!(d.delivery_id, id);
    assert_eq!(d.message_format, BATCH_MESSAGE_FORMAT);
    assert!(d.settled);
    conn.close().await.unwrap();
}

#[tokio::test]
async fn server_rejects_transfer_with_condition() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            let r = req
                .accept_receiver(LinkAnswer::default().credit(10))
                .await
                .unwrap();
            tokio::spawn(async move {
                while let Ok(d) = r.recv().await {
                    let o = if d.payload.len() > 100 {
                        Outcome::Rejected(Some(AmqpError::new(
                            condition::MESSAGE_SIZE_EXCEEDED,
                            Some("too big".to_string()),
                        )))
                    } else {
                        Outcome::Released
                    };
                    r.settle(&d, o).await.unwrap();
                }
            });
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    let o = sender.send(data_message(&[0u8; 200])).await.unwrap();
    let e = o.error().unwrap();
    assert_eq!(e.condition, condition::MESSAGE_SIZE_EXCEEDED);
    assert_eq!(e.description.as_deref(), Some("too big"));
    assert!(matches!(
        o.clone().into_result(),
        Err(Error::Rejected(Some(_)))
    ));
    assert_eq!(
        sender.send(data_message(b"x")).await.unwrap(),
        Outcome::Released
    );
}

#[tokio::test]
async fn refused_attach_surfaces_condition() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            if req.name() == "dropped" {
                drop(req);
                continue;
            }
            req.reject(AmqpError::new(
                condition::NOT_FOUND,
                Some("no such entity".to_string()),
            ))
            .await
            .unwrap();
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let e = s
        .attach_sender(SenderOptions::new("s", "nope"))
        .await
        .unwrap_err();
    assert!(matches!(e, Error::AttachRefused(_)), "{e:?}");
    assert_eq!(e.condition(), Some(condition::NOT_FOUND));
    let e = s
        .attach_receiver(ReceiverOptions::new("r", "nope"))
        .await
        .unwrap_err();
    assert_eq!(e.condition(), Some(condition::NOT_FOUND));
    let e = s
        .attach_receiver(ReceiverOptions::new("dropped", "x"))
        .await
        .unwrap_err();
    assert_eq!(e.condition(), Some(condition::NOT_FOUND));
    // The session still works after refusals.
    let e = s
        .attach_sender(SenderOptions::new("s2", "nope"))
        .await
        .unwrap_err();
    assert_eq!(e.condition(), Some(condition::NOT_FOUND));
}

/// Peek-lock shape: server sends unsettled with a chosen tag, the client disposes unsettled
/// (rcv-settle-mode second) and the server picks the settled reply.
#[tokio::test]
async fn server_chooses_settled_reply_to_client_disposition() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            assert_eq!(
                req.remote_attach().rcv_settle_mode,
                ReceiverSettleMode::Second
            );
            let s = req
                .accept_sender(LinkAnswer::default().initial_delivery_count(0))
                .await
                .unwrap();
            tokio::spawn(async move {
                s.wait_credit().await.unwrap();
                let lock = [7u8; 16];
                let id1 = s
                    .send_no_wait(data_message(b"m1").tag(Bytes::copy_from_slice(&lock)))
                    .await
                    .unwrap();
                let id2 = s.send_no_wait(data_message(b"m2")).await.unwrap();
                let mut seen = 0;
                while seen < 2 {
                    let d = s.next_disposition().await.unwrap();
                    assert!(!d.settled);
                    if d.delivery_id == id1 {
                        assert_eq!(&d.delivery_tag[..], &lock[..]);
                        // lock lost
                        s.settle(
                            id1,
                            Outcome::Rejected(Some(AmqpError::new(
                                condition::MESSAGE_LOCK_LOST,
                                None,
                            ))),
                        )
                        .await
                        .unwrap();
                    } else {
                        assert_eq!(d.delivery_id, id2);
                        s.settle(id2, d.outcome().unwrap().same_type())
                            .await
                            .unwrap();
                    }
                    seen += 1;
                }
                // keep the link open until the client goes away
                let _ = s.next_disposition().await;
            });
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    let r = session
        .attach_receiver(
            ReceiverOptions::new("peek", "q1")
                .rcv_settle_mode(ReceiverSettleMode::Second)
                .credit(5),
        )
        .await
        .unwrap();
    assert_eq!(r.remote_attach().initial_delivery_count, Some(0));
    let d1 = r.recv().await.unwrap();
    let d2 = r.recv().await.unwrap();
    assert_eq!(&d1.delivery_tag[..], &[7u8; 16]);
    let reply = r.accept(&d1).await.unwrap().unwrap();
    assert!(reply.error().unwrap().is_lock_lost());
    let reply = r
        .settle(
            &d2,
            Outcome::Rejected(Some(AmqpError::new(condition::DEAD_LETTER, None))),
        )
        .await
        .unwrap();
    assert_eq!(reply, Some(Outcome::Rejected(None)));
    // A second settle of the same delivery is an error, not a hang.
    assert!(matches!(r.accept(&d1).await, Err(Error::IllegalState(_))));
}

#[tokio::test]
async fn presettled_server_send_and_auto_settle_client_side() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
            tokio::spawn(async move {
                s.wait_credit().await.unwrap();
                s.send_settled(data_message(b"pre")).await.unwrap();
                // unsettled; client in mode second settles unsettled-disposition -> we answer
                let o = s.send(data_message(b"un")).await.unwrap();
                assert_eq!(o, Outcome::Accepted);
                let _ = s.next_disposition().await;
            });
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    let r = session
        .attach_receiver(
            ReceiverOptions::new("r", "q")
                .rcv_settle_mode(ReceiverSettleMode::Second)
                .credit(2),
        )
        .await
        .unwrap();
    let d = r.recv().await.unwrap();
    assert!(d.settled);
    assert_eq!(r.accept(&d).await.unwrap(), None);
    let d = r.recv().await.unwrap();
    assert!(!d.settled);
    // Server's `send` auto-settles with the same outcome.
    assert_eq!(r.accept(&d).await.unwrap(), Some(Outcome::Accepted));
}

#[tokio::test]
async fn drain_auto_and_manual() {
    let (flow_tx, mut flow_rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let flow_tx = flow_tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let flow_tx = flow_tx.clone();
                if req.name() == "auto" {
                    let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                    tokio::spawn(async move {
                        let _keep = s;
                        std::future::pending::<()>().await;
                    });
                } else {
                    let s = req
                        .accept_sender(LinkAnswer::default().manual_drain())
                        .await
                        .unwrap();
                    tokio::spawn(async move {
                        loop {
                            let f = s.flow_changed().await.unwrap();
                            if f.drain {
                                flow_tx.send(f).unwrap();
                                s.send_settled(data_message(b"a")).await.unwrap();
                                s.send_settled(data_message(b"b")).await.unwrap();
                                s.answer_drain().unwrap();
                                break;
                            }
                        }
                        let _ = s.next_disposition().await;
                    });
                }
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    // Auto: nothing queued on the server, drain completes at once.
    let r = session
        .attach_receiver(ReceiverOptions::new("auto", "q"))
        .await
        .unwrap();
    r.set_credit(5).await.unwrap();
    assert_eq!(r.flow().credit, 5);
    r.drain().await.unwrap();
    assert_eq!(r.flow().credit, 0);
    assert_eq!(r.flow().delivery_count, 5);

    // Manual: the server reads credit and drain, sends two, then answers.
    let r = session
        .attach_receiver(ReceiverOptions::new("manual", "q"))
        .await
        .unwrap();
    r.set_credit(10).await.unwrap();
    r.drain().await.unwrap();
    let f = flow_rx.recv().await.unwrap();
    assert_eq!(f.credit, 10);
    assert!(f.drain);
    assert_eq!(body_bytes(&r.try_recv().unwrap().unwrap()), b"a");
    assert_eq!(body_bytes(&r.try_recv().unwrap().unwrap()), b"b");
    assert!(r.try_recv().unwrap().is_none());
    assert_eq!(r.flow().credit, 0);
    assert_eq!(r.flow().delivery_count, 10);
}

#[tokio::test]
async fn multi_frame_transfers_both_ways() {
    let big: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
    let opts = ServerOptions {
        max_frame_size: 4096,
        ..Default::default()
    };
    let addr = spawn_server(opts, |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            if req.is_peer_sender() {
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10))
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    // echo size back through the outcome: accept if intact
                    while let Ok(d) = r.recv().await {
                        let ok = body_bytes(&d)
                            .iter()
                            .enumerate()
                            .all(|(i, b)| *b == (i % 251) as u8)
                            && body_bytes(&d).len() == 1 << 20;
                        let o = if ok {
                            Outcome::Accepted
                        } else {
                            Outcome::Released
                        };
                        r.settle(&d, o).await.unwrap();
                    }
                });
            } else {
                let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                tokio::spawn(async move {
                    s.wait_credit().await.unwrap();
                    let big: Vec<u8> = (0..(1 << 20)).map(|i| (i % 251) as u8).collect();
                    let o = s.send(data_message(&big)).await.unwrap();
                    assert_eq!(o, Outcome::Accepted);
                    let _ = s.next_disposition().await;
                });
            }
        }
    })
    .await;
    let conn = Connection::open_with(
        &url(addr),
        ConnectionOptions {
            max_frame_size: 8192,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(conn.remote_open().max_frame_size.0, 4096);
    let session = conn.begin().await.unwrap();
    let sender = session
        .attach_sender(SenderOptions::new("s", "q"))
        .await
        .unwrap();
    assert_eq!(
        sender.send(data_message(&big)).await.unwrap(),
        Outcome::Accepted
    );
    let r = session
        .attach_receiver(ReceiverOptions::new("r", "q").credit(1))
        .await
        .unwrap();
    let d = r.recv().await.unwrap();
    assert_eq!(body_bytes(&d), big);
    r.accept(&d).await.unwrap();
}

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
    let sender = session
        .attach_sender(SenderOptions::new("s", "q"))
        .await
        .unwrap();
    let receiver = session
        .attach_receiver(ReceiverOptions::new("r", "q"))
        .await
        .unwrap();
    let drainer = session
        .attach_receiver(ReceiverOptions::new("d", "q"))
        .await
        .unwrap();
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

/// The `$cbs`-style node: replies carry `correlation-id` = request `message-id`; the first
/// request is cancelled before its reply arrives, and its late reply must not reach the
/// second request.
#[tokio::test]
async fn request_response_correlates_and_survives_cancellation() {
    let (seen_tx, mut seen_rx) = mpsc::unbounded_channel::<MessageId>();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let seen_tx = seen_tx.clone();
        async move {
            let (reply_tx, mut reply_rx) = mpsc::unbounded_channel::<Bytes>();
            let mut reply_tx = Some(reply_tx);
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                if req.is_peer_sender() {
                    assert_eq!(req.target_address(), Some("$cbs"));
                    let r = req
                        .accept_receiver(LinkAnswer::default().credit(10))
                        .await
                        .unwrap();
                    let reply_tx = reply_tx.take().unwrap();
                    let seen_tx = seen_tx.clone();
                    tokio::spawn(async move {
                        let mut held: Vec<sb_amqp::AnyMessage> = Vec::new();
                        while let Ok(d) = r.recv().await {
                            r.accept(&d).await.unwrap();
                            let m = d.message().unwrap();
                            let props = m.properties.clone().unwrap();
                            seen_tx.send(props.message_id.clone().unwrap()).unwrap();
                            held.push(m);
                            // Reply to the first only once the second arrived: late reply.
                            if !matches!(props.message_id, Some(MessageId::Uuid(_))) {
                                for m in held.drain(..) {
                                    let p = m.properties.unwrap();
                                    let reply = Message::builder()
                                        .properties(sb_amqp::types::messaging::Properties {
                                            correlation_id: p.message_id.clone(),
                                            to: p.reply_to.clone(),
                                            ..Default::default()
                                        })
                                        .value(format!("reply to {:?}", p.message_id))
                                        .build();
                                    reply_tx
                                        .send(Sendable::message(&reply).unwrap().payload)
                                        .unwrap();
                                }
                            }
                        }
                    });
                } else {
                    assert_eq!(req.source_address(), Some("$cbs"));
                    assert!(req.target_address().unwrap().starts_with("$cbs-reply"));
                    let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                    let mut rx = std::mem::replace(&mut reply_rx, mpsc::unbounded_channel().1);
                    tokio::spawn(async move {
                        while let Some(b) = rx.recv().await {
                            // Pre-settled, as Service Bus sends CBS replies.
                            s.send_settled(Sendable::raw(b)).await.unwrap();
                        }
                    });
                }
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    let rr = RequestResponse::attach(&session, "$cbs").await.unwrap();

    let uuid_id = MessageId::Uuid(Uuid::from([1u8; 16]));
    let first = Message::builder()
        .properties(sb_amqp::types::messaging::Properties {
            message_id: Some(uuid_id.clone()),
            ..Default::default()
        })
        .value("put-token 1")
        .build();
    {
        let fut = rr.request(first);
        tokio::pin!(fut);
        tokio::select! {
            r = &mut fut => panic!("no reply expected yet: {r:?}"),
            id = seen_rx.recv() => assert_eq!(id.unwrap(), uuid_id),
        }
        // `fut` is dropped here: the request is cancelled.
    }
    for id in [
        MessageId::String("abc".into()),
        MessageId::Binary(Binary::from(vec![1, 2, 3])),
    ] {
        let m = Message::builder()
            .properties(sb_amqp::types::messaging::Properties {
                message_id: Some(id.clone()),
                ..Default::default()
            })
            .value("put-token")
            .build();
        let reply = rr.request(m).await.unwrap();
        let p = reply.properties.unwrap();
        assert_eq!(p.correlation_id, Some(id.clone()));
        assert_eq!(seen_rx.recv().await.unwrap(), id);
    }
    // ulong ids are assigned when missing
    let reply = rr
        .request(Message::builder().value("auto id").build())
        .await
        .unwrap();
    assert!(matches!(
        reply.properties.unwrap().correlation_id,
        Some(MessageId::Ulong(_))
    ));
}

#[tokio::test]
async fn dropping_handles_does_not_break_siblings() {
    let addr = spawn_broker().await;
    let conn = connect(addr).await;
    let s1 = conn.begin().await.unwrap();
    let s2 = conn.begin().await.unwrap();
    let a = s1
        .attach_sender(SenderOptions::new("a", "q"))
        .await
        .unwrap();
    let b = s1
        .attach_sender(SenderOptions::new("b", "q"))
        .await
        .unwrap();
    let c = s2
        .attach_sender(SenderOptions::new("c", "q"))
        .await
        .unwrap();
    // Cancel a send mid-flight and drop its link.
    {
        let fut = a.send(data_message(b"cancelled"));
        tokio::pin!(fut);
        let _ = futures_poll_once(fut.as_mut()).await;
    }
    drop(a);
    assert!(b.send(data_message(b"1")).await.unwrap().is_accepted());
    // Drop a whole session handle: its links keep it alive, the other session is untouched.
    drop(s1);
    assert!(b.send(data_message(b"2")).await.unwrap().is_accepted());
    drop(b);
    assert!(c.send(data_message(b"3")).await.unwrap().is_accepted());
    // A second connection's drop does not affect the first.
    let other = connect(addr).await;
    let os = other.begin().await.unwrap();
    drop(other);
    drop(os);
    let r = s2
        .attach_receiver(ReceiverOptions::new("r", "q").credit(10))
        .await
        .unwrap();
    let mut got = Vec::new();
    // "cancelled" may or may not have been written before its future was dropped.
    while !got.contains(&b"3".to_vec()) {
        let d = r.recv().await.unwrap();
        got.push(body_bytes(&d));
        r.accept(&d).await.unwrap();
    }
    assert!(got.contains(&b"1".to_vec()) && got.contains(&b"2".to_vec()));
    conn.close().await.unwrap();
    assert!(matches!(c.send(data_message(b"late")).await, Err(e) if e.is_connection_error()));
}

async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    use std::task::Poll;
    std::future::poll_fn(|cx| match std::pin::Pin::new(&mut f).poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => Poll::Ready(None),
    })
    .await
}

#[tokio::test]
async fn sasl_plain_credentials_checked_by_server() {
    use std::sync::Arc;
    let opts = ServerOptions {
        sasl: sb_amqp::SaslServer {
            mechanisms: vec!["MSSBCBS".into(), "PLAIN".into(), "ANONYMOUS".into()],
            allow_no_sasl: false,
            authenticator: Some(Arc::new(|id: &sb_amqp::SaslIdentity| {
                id.mechanism.as_deref() != Some("PLAIN") || id.password.as_deref() == Some("pw")
            })),
        },
        ..Default::default()
    };
    let addr = spawn_server(opts, |conn| async move {
        assert!(conn.sasl_identity().mechanism.is_some());
        std::future::pending::<()>().await
    })
    .await;
    let ok = Connection::open(&format!("amqp://user:pw@{addr}"))
        .await
        .unwrap();
    ok.begin().await.unwrap();
    let anon = Connection::open(&format!("amqp://{addr}")).await.unwrap();
    anon.begin().await.unwrap();
    let bad = Connection::open(&format!("amqp://user:wrong@{addr}"))
        .await
        .unwrap_err();
    assert!(matches!(bad, Error::Sasl(1)), "{bad:?}");
}

#[tokio::test]
async fn tls_round_trip() {
    tls_round_trip_over(false).await;
}

/// `wss://`: TLS, then the WebSocket upgrade (subprotocol `AMQPWSB10`), then AMQP: what the
/// client speaks to Service Bus on port 443.
#[tokio::test]
async fn wss_round_trip() {
    tls_round_trip_over(true).await;
}

async fn tls_round_trip_over(websocket: bool) {
    let Some((cert, key)) = self_signed() else {
        sb_testkit::missing(sb_testkit::OPENSSL);
        return;
    };
    use sb_amqp::rustls;
    use sb_amqp::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
    use std::sync::Arc;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = vec![CertificateDer::from_pem_slice(&cert).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(&key).unwrap();
    let server_cfg = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs.clone(), key)
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certs[0].clone()).unwrap();
    let client_cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let opts = ServerOptions {
        tls: Some(Arc::new(server_cfg)),
        ..Default::default()
    };
    let handler = move |mut conn: sb_amqp::ServerConnection| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(1))
                    .await
                    .unwrap();
                let d = r.recv().await.unwrap();
                r.accept(&d).await.unwrap();
                tx.send(body_bytes(&d)).unwrap();
            }
        }
    };
    let url = if websocket {
        let port = spawn_websocket_server(opts, handler).await.port();
        format!("wss://localhost:{port}/$servicebus/websocket")
    } else {
        let port = spawn_server(opts, handler).await.port();
        format!("amqps://localhost:{port}")
    };
    let conn = Connection::open_with(
        &url,
        ConnectionOptions {
            tls_config: Some(Arc::new(client_cfg)),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    assert!(
        sender
            .send(data_message(b"over tls"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(rx.recv().await.unwrap(), b"over tls");
}

fn self_signed() -> Option<(Vec<u8>, Vec<u8>)> {
    let dir = std::env::temp_dir().join(sb_amqp::unique_name("sb-amqp-tls"));
    std::fs::create_dir_all(&dir).ok()?;
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    let st = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "basicConstraints=critical,CA:FALSE",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&k)
        .arg("-out")
        .arg(&c)
        .stderr(std::process::Stdio::null())
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    Some((std::fs::read(c).ok()?, std::fs::read(k).ok()?))
}

#[tokio::test]
async fn sender_refuses_above_peer_max_message_size_locally() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            let r = req
                .accept_receiver(LinkAnswer::default().credit(10).max_message_size(64))
                .await
                .unwrap();
            tokio::spawn(async move {
                let _r = r;
                std::future::pending::<()>().await
            });
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    let e = sender.send(data_message(&[0u8; 100])).await.unwrap_err();
    assert_eq!(e.condition(), Some(condition::MESSAGE_SIZE_EXCEEDED));
}

/// Handles and their futures can move across tasks.
#[allow(dead_code)]
fn handles_and_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Connection>();
    is_send_sync::<sb_amqp::Session>();
    is_send_sync::<sb_amqp::Sender>();
    is_send_sync::<sb_amqp::Receiver>();
    is_send_sync::<sb_amqp::LinkRequest>();
    is_send_sync::<sb_amqp::ServerConnection>();
    is_send_sync::<RequestResponse>();
    is_send_sync::<Error>();
    async fn futs(c: Connection, s: sb_amqp::Sender, r: sb_amqp::Receiver, rr: RequestResponse) {
        let f1 = c.begin();
        is_send(&f1);
        let f2 = s.send(Sendable::raw(Bytes::new()));
        is_send(&f2);
        let f3 = r.recv();
        is_send(&f3);
        drop(f3);
        let f4 = rr.request(Message::builder().value(1).build());
        is_send(&f4);
    }
    let _ = futs;
}

/// A tiny session window (4 frames) with 50 deliveries of 3 frames each: the receiving
/// session re-opens its window and the sender waits for it.
#[tokio::test]
async fn small_session_window_flow_controls_transfers() {
    let opts = ServerOptions {
        max_frame_size: 1024,
        ..Default::default()
    };
    let addr = spawn_server(opts, |mut conn| async move {
        while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
            let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
            tokio::spawn(async move {
                for i in 0..50u32 {
                    let body = vec![(i % 256) as u8; 2500];
                    s.send_settled(data_message(&body)).await.unwrap();
                }
                std::future::pending::<()>().await
            });
        }
    })
    .await;
    let conn = Connection::open_with(
        &url(addr),
        ConnectionOptions {
            max_frame_size: 1024,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let session = conn
        .begin_with(sb_amqp::SessionOptions {
            incoming_window: 4,
            outgoing_window: 4,
        })
        .await
        .unwrap();
    let r = session
        .attach_receiver(ReceiverOptions::new("r", "q").auto_credit(10))
        .await
        .unwrap();
    for i in 0..50u32 {
        let d = r.recv().await.unwrap();
        assert_eq!(body_bytes(&d), vec![(i % 256) as u8; 2500]);
    }
}

/// Server side: dropping the `ServerConnection` handle does not break links it accepted.
#[tokio::test]
async fn server_links_outlive_server_connection_handle() {
    let addr = spawn_server(ServerOptions::default(), |mut conn| async move {
        let Some(ConnectionEvent::Link(req)) = conn.next_event().await else {
            return;
        };
        let r = req
            .accept_receiver(LinkAnswer::default().credit(5))
            .await
            .unwrap();
        drop(conn);
        while let Ok(d) = r.recv().await {
            r.accept(&d).await.unwrap();
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    for _ in 0..3 {
        assert!(sender.send(data_message(b"x")).await.unwrap().is_accepted());
    }
}

/// The server learns that a client detached: waits on credit or dispositions end with
/// `LinkDetached` carrying the client's error.
#[tokio::test]
async fn server_sees_client_detach() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    tx.send(s.wait_credit().await.unwrap_err()).unwrap();
                });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let r = s
        .attach_receiver(ReceiverOptions::new("r", "q"))
        .await
        .unwrap();
    r.detach_with_error(AmqpError::new(condition::DETACH_FORCED, None))
        .await
        .unwrap();
    let e = rx.recv().await.unwrap();
    assert!(matches!(e, Error::LinkDetached(_)), "{e:?}");
    assert_eq!(e.condition(), Some(condition::DETACH_FORCED));
    // The session and connection are still usable.
    let r2 = s
        .attach_receiver(ReceiverOptions::new("r2", "q"))
        .await
        .unwrap();
    r2.detach().await.unwrap();
    assert!(matches!(
        rx.recv().await.unwrap(),
        Error::LinkDetached(None)
    ));
}

/// `LinkStatus` turns false on both sides before the detaching side's `detach()` returns: a
/// server listing its links never shows one the client already saw detached.
#[tokio::test]
async fn link_status_ends_with_the_detach_handshake_on_both_sides() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                tx.send(s.status()).unwrap();
                // Kept alive until the connection ends: only the client detaches.
                tokio::spawn(async move { s.wait_credit().await });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let r = s
        .attach_receiver(ReceiverOptions::new("r", "q"))
        .await
        .unwrap();
    let server_side = rx.recv().await.unwrap();
    let client_side = r.status();
    assert!(server_side.is_attached() && client_side.is_attached() && r.is_attached());
    r.detach().await.unwrap();
    assert!(!client_side.is_attached());
    assert!(!server_side.is_attached());
}

/// A send cancelled while it waits for credit is never transmitted.
#[tokio::test]
async fn cancelled_send_waiting_for_credit_is_not_sent() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (go_tx, go_rx) = tokio::sync::oneshot::channel::<()>();
    let go_rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(go_rx)));
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let (tx, go_rx) = (tx.clone(), go_rx.clone());
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let r = req.accept_receiver(LinkAnswer::default()).await.unwrap();
                let (tx, go_rx) = (tx.clone(), go_rx.clone());
                tokio::spawn(async move {
                    // No credit until the test says so.
                    let go = go_rx.lock().await.take().unwrap();
                    go.await.unwrap();
                    r.set_credit(10).await.unwrap();
                    while let Ok(d) = r.recv().await {
                        r.accept(&d).await.unwrap();
                        tx.send(body_bytes(&d)).unwrap();
                    }
                });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let sender = s.attach_sender(SenderOptions::new("s", "q")).await.unwrap();
    {
        let fut = sender.send(data_message(b"cancelled"));
        tokio::pin!(fut);
        assert!(futures_poll_once(fut.as_mut()).await.is_none());
    }
    go_tx.send(()).unwrap();
    assert!(
        sender
            .send(data_message(b"kept"))
            .await
            .unwrap()
            .is_accepted()
    );
    assert_eq!(rx.recv().await.unwrap(), b"kept");
    assert!(rx.try_recv().is_err());
}

/// Ending a session with links attached: the peer's links end with `SessionEnded`, ours too,
/// and other sessions on the connection keep working.
#[tokio::test]
async fn session_end_ends_its_links_on_both_sides() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10))
                    .await
                    .unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        match r.recv().await {
                            Ok(d) => {
                                r.accept(&d).await.unwrap();
                            }
                            Err(e) => {
                                tx.send(e).unwrap();
                                break;
                            }
                        }
                    }
                });
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let s1 = conn.begin().await.unwrap();
    let s2 = conn.begin().await.unwrap();
    let a = s1
        .attach_sender(SenderOptions::new("a", "q"))
        .await
        .unwrap();
    let b = s2
        .attach_sender(SenderOptions::new("b", "q"))
        .await
        .unwrap();
    assert!(a.send(data_message(b"1")).await.unwrap().is_accepted());
    s1.end().await.unwrap();
    let e = rx.recv().await.unwrap();
    assert!(matches!(e, Error::SessionEnded(None)), "{e:?}");
    let e = a.send(data_message(b"2")).await.unwrap_err();
    assert!(
        matches!(e, Error::SessionEnded(_) | Error::LinkDetached(_)),
        "{e:?}"
    );
    assert!(b.send(data_message(b"3")).await.unwrap().is_accepted());
}

/// Handles are shareable: one task receives while others settle, through an `Arc`.
#[tokio::test]
async fn receiver_shared_between_tasks() {
    use std::sync::Arc;
    let addr = spawn_broker().await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let sender = Arc::new(
        s.attach_sender(SenderOptions::new("s", "shared"))
            .await
            .unwrap(),
    );
    let r = Arc::new(
        s.attach_receiver(ReceiverOptions::new("r", "shared").auto_credit(20))
            .await
            .unwrap(),
    );
    let sends: Vec<_> = (0..10u8)
        .map(|i| {
            let sender = sender.clone();
            tokio::spawn(async move { sender.send(data_message(&[i])).await.unwrap() })
        })
        .collect();
    let mut settles = Vec::new();
    for _ in 0..10 {
        let d = r.recv().await.unwrap();
        let r = r.clone();
        settles.push(tokio::spawn(async move { r.accept(&d).await.unwrap() }));
    }
    for t in sends {
        assert!(t.await.unwrap().is_accepted());
    }
    for t in settles {
        t.await.unwrap();
    }
    assert!(r.try_recv().unwrap().is_none());
}
