//! The request/response helper (`$cbs`, `$management`) against our server.

use bytes::Bytes;
use sb_amqp::types::messaging::{Message, MessageId};
use sb_amqp::types::primitives::{Binary, Uuid};
use sb_amqp::{ConnectionEvent, LinkAnswer, RequestResponse, Sendable, ServerOptions};
use tokio::sync::mpsc;

use crate::support::*;

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

/// Issue 39, F8: the service detaches only the request link of a pair (its reply link lives
/// on): the pair reports itself failed, so its owner attaches a new one instead of sending on
/// a link that is gone.
#[tokio::test]
async fn a_pair_whose_request_link_is_detached_reports_itself_failed() {
    use sb_amqp::{AmqpError, Error, condition};
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                if req.is_peer_sender() {
                    let r = req.accept_receiver(LinkAnswer::default()).await.unwrap();
                    tx.send(r).unwrap();
                } else {
                    let s = req.accept_sender(LinkAnswer::default()).await.unwrap();
                    // The reply link stays attached.
                    tokio::spawn(async move {
                        let _reply_link = s;
                        std::future::pending::<()>().await
                    });
                }
            }
        }
    })
    .await;
    let conn = connect(addr).await;
    let session = conn.begin().await.unwrap();
    let rr = RequestResponse::attach(&session, "$management")
        .await
        .unwrap();
    assert!(rr.error().is_none());
    let request_link = rx.recv().await.unwrap();
    request_link
        .detach_with_error(AmqpError::new(condition::DETACH_FORCED, None))
        .await
        .unwrap();
    assert!(matches!(rr.error(), Some(Error::LinkDetached(_))));
    let e = rr
        .request(Message::builder().value("ping").build())
        .await
        .unwrap_err();
    assert!(matches!(e, Error::LinkDetached(_)), "{e:?}");
}
