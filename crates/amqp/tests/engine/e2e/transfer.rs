//! Transfers between our client and our server: outcomes, tags and formats, multi-frame
//! messages, session windows, the peer's size limit, cancellation while waiting for credit.

use bytes::Bytes;
use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::{
    AmqpError, BATCH_MESSAGE_FORMAT, Connection, ConnectionEvent, ConnectionOptions, Error,
    LinkAnswer, Outcome, ReceiverOptions, SenderOptions, ServerOptions, condition,
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
    let sender = open_sender(&session, "s1", "q1").await;
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
    let sender = open_sender(&session, "s", "q").await;
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
