//! Links and sessions between our client and our server: attach refusals, settlement modes,
//! drain, detach and end on both sides, handles shared or dropped.

use bytes::Bytes;
use sb_amqp::types::definitions::ReceiverSettleMode;
use sb_amqp::types::messaging::Message;
use sb_amqp::{
    AmqpError, Connection, ConnectionEvent, Error, LinkAnswer, Outcome, ReceiverOptions,
    RequestResponse, Sendable, SenderOptions, ServerOptions, condition,
};
use tokio::sync::mpsc;

use crate::support::*;

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
    let r = open_receiver(&session, "auto", "q").await;
    r.set_credit(5).await.unwrap();
    assert_eq!(r.flow().credit, 5);
    r.drain().await.unwrap();
    assert_eq!(r.flow().credit, 0);
    assert_eq!(r.flow().delivery_count, 5);

    // Manual: the server reads credit and drain, sends two, then answers.
    let r = open_receiver(&session, "manual", "q").await;
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
async fn dropping_handles_does_not_break_siblings() {
    let addr = spawn_broker().await;
    let conn = connect(addr).await;
    let s1 = conn.begin().await.unwrap();
    let s2 = conn.begin().await.unwrap();
    let a = open_sender(&s1, "a", "q").await;
    let b = open_sender(&s1, "b", "q").await;
    let c = open_sender(&s2, "c", "q").await;
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
    let r = open_receiver(&s, "r", "q").await;
    r.detach_with_error(AmqpError::new(condition::DETACH_FORCED, None))
        .await
        .unwrap();
    let e = rx.recv().await.unwrap();
    assert!(matches!(e, Error::LinkDetached(_)), "{e:?}");
    assert_eq!(e.condition(), Some(condition::DETACH_FORCED));
    // The session and connection are still usable.
    let r2 = open_receiver(&s, "r2", "q").await;
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
    let r = open_receiver(&s, "r", "q").await;
    let server_side = rx.recv().await.unwrap();
    let client_side = r.status();
    assert!(server_side.is_attached() && client_side.is_attached() && r.is_attached());
    r.detach().await.unwrap();
    assert!(!client_side.is_attached());
    assert!(!server_side.is_attached());
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
    let a = open_sender(&s1, "a", "q").await;
    let b = open_sender(&s2, "b", "q").await;
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

/// Issue 39, F1: the server detaches `s1` (`detach-forced`, as Service Bus does to a link idle
/// for 10 minutes); `s2` then takes its handle number. A send through the stale `s1` handle is
/// refused with `LinkDetached` and `s2`'s peer receives nothing.
#[tokio::test]
async fn a_stale_sender_never_sends_on_the_link_that_took_its_handle() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let name = req.name().to_string();
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10))
                    .await
                    .unwrap();
                tx.send((name, r)).unwrap();
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let s = conn.begin().await.unwrap();
    let s1 = open_sender(&s, "s1", "q1").await;
    let (_, server_s1) = rx.recv().await.unwrap();
    server_s1
        .detach_with_error(AmqpError::new(condition::DETACH_FORCED, None))
        .await
        .unwrap();
    assert!(!s1.is_attached());
    let s2 = open_sender(&s, "s2", "q2").await;
    let (name, server_s2) = rx.recv().await.unwrap();
    assert_eq!(name, "s2");
    assert_eq!(
        s2.local_attach().handle,
        s1.local_attach().handle,
        "s2 took s1's handle number"
    );
    let e = s1.send_settled(data_message(b"for q1")).await.unwrap_err();
    assert!(matches!(e, Error::LinkDetached(_)), "{e:?}");
    // A send on s2 arrives, and it is the first thing s2's peer receives.
    s2.send_settled(data_message(b"for q2")).await.unwrap();
    let d = server_s2.recv().await.unwrap();
    assert_eq!(body_bytes(&d), b"for q2");
    assert!(server_s2.try_recv().unwrap().is_none());
}
