//! Scripted raw-frame peers: a client that pipelines `open`, `begin` and `attach` before
//! reading anything (as Python's uamqp-style client does), against our server.

use bytes::Bytes;
use sb_amqp::performative::{Attach, Begin, Performative};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use sb_amqp::types::messaging::{DeliveryState, Source, Target, TargetArchetype};
use sb_amqp::{ConnectionEvent, Frame, FramedIo, LinkAnswer, ServerOptions, condition, frame};
use tokio::sync::mpsc;

use crate::raw_peer::{next, open, transfer};
use crate::support::{body_bytes, data_message, spawn_server};

#[tokio::test]
async fn pipelined_client_and_oversize_refusal() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                assert_eq!(req.remote_attach().initial_delivery_count, Some(5));
                let r = req
                    .accept_receiver(
                        LinkAnswer::default()
                            .credit(10)
                            .max_message_size(100)
                            .rcv_settle_mode(ReceiverSettleMode::First),
                    )
                    .await
                    .unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(d) = r.recv().await {
                        r.accept(&d).await.unwrap();
                        tx.send(d).unwrap();
                    }
                });
            }
        }
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut f = FramedIo::new(Box::new(tcp), 65536);
    // Everything up front, nothing read yet.
    f.write_header(frame::AMQP_HEADER).await.unwrap();
    let open = open("raw");
    f.write_frame(&Frame::amqp(0, open)).await.unwrap();
    let begin = Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 100,
        outgoing_window: 100,
        handle_max: Default::default(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    f.write_frame(&Frame::amqp(0, begin)).await.unwrap();
    let attach = Attach {
        name: "raw-sender".into(),
        handle: Handle(0),
        role: Role::Sender,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::Second,
        source: Some(Box::new(Source::default())),
        target: Some(Box::new(TargetArchetype::Target(Target {
            address: Some("q1".into()),
            ..Default::default()
        }))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(5),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    f.write_frame(&Frame::amqp(0, attach.clone()))
        .await
        .unwrap();

    assert_eq!(f.read_header().await.unwrap().unwrap(), frame::AMQP_HEADER);
    assert!(matches!(next(&mut f).await, Performative::Open(_)));
    assert!(matches!(next(&mut f).await, Performative::Begin(b) if b.remote_channel == Some(0)));
    let Performative::Attach(a) = next(&mut f).await else {
        panic!()
    };
    assert_eq!(a.role, Role::Receiver);
    assert_eq!(a.max_message_size, Some(100));
    assert_eq!(a.rcv_settle_mode, ReceiverSettleMode::First);
    let Performative::Flow(fl) = next(&mut f).await else {
        panic!()
    };
    // Credit is granted relative to our initial delivery count.
    assert_eq!((fl.delivery_count, fl.link_credit), (Some(5), Some(10)));

    // Too big: the engine refuses it on the frame that passes the bound and detaches the link
    // with message-size-exceeded (never shown to the app), as azure-amqp's receiving link does.
    f.write_frame(&transfer(0, vec![0], Bytes::from(vec![0u8; 200])))
        .await
        .unwrap();
    let Performative::Detach(d) = next(&mut f).await else {
        panic!()
    };
    assert!(d.closed);
    let e: sb_amqp::AmqpError = d.error.unwrap().into();
    assert_eq!(e.condition, condition::MESSAGE_SIZE_EXCEEDED);
    // Written as an empty map, not dropped: Python's pyamqp indexes the third field.
    assert_eq!(e.info.map(|i| i.len()), Some(0));
    // What crossed our detach on the wire is dropped, not assembled.
    f.write_frame(&transfer(1, vec![1], Bytes::from(vec![0u8; 200])))
        .await
        .unwrap();
    f.write_frame(&Frame::amqp(
        0,
        sb_amqp::performative::Detach {
            handle: Handle(0),
            closed: true,
            error: None,
        },
    ))
    .await
    .unwrap();
    // Small, on a new link: reaches the app, accepted.
    let mut again = attach.clone();
    again.name = "raw-sender-2".into();
    again.handle = Handle(1);
    f.write_frame(&Frame::amqp(0, again)).await.unwrap();
    assert!(matches!(next(&mut f).await, Performative::Attach(_)));
    assert!(matches!(next(&mut f).await, Performative::Flow(_)));
    let mut small = transfer(2, vec![2], data_message(b"ok").payload);
    if let sb_amqp::FrameBody::Amqp(p, _) = &mut small.body
        && let Performative::Transfer(t) = p.as_mut()
    {
        t.handle = Handle(1);
    }
    f.write_frame(&small).await.unwrap();
    let Performative::Disposition(d) = next(&mut f).await else {
        panic!()
    };
    assert_eq!(d.first, 2);
    assert!(matches!(d.state, Some(DeliveryState::Accepted(_))));
    let got = rx.recv().await.unwrap();
    assert_eq!(body_bytes(&got), b"ok");
}
