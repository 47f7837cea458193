//! Scripted raw-frame peers: a client that pipelines `open`, `begin` and `attach` before
//! reading anything (as Python's uamqp-style client does), against our server.

use bytes::Bytes;
use sb_amqp::performative::{Attach, Begin, Performative};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode, Role};
use sb_amqp::types::messaging::DeliveryState;
use sb_amqp::{ConnectionEvent, Frame, FramedIo, LinkAnswer, ServerOptions, condition, frame};
use tokio::sync::mpsc;

use crate::raw_peer::{next, open, sender_attach, transfer};
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
        rcv_settle_mode: ReceiverSettleMode::Second,
        initial_delivery_count: Some(5),
        ..sender_attach("raw-sender", "q1")
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

/// A sender link named `name` on `handle`, initial delivery count 5 (as the test above).
fn sender_on(name: &str, handle: u32) -> Attach {
    Attach {
        handle: Handle(handle),
        initial_delivery_count: Some(5),
        ..sender_attach(name, "q1")
    }
}

/// One frame of delivery `id` on `handle`; `more` says whether frames follow.
fn part(handle: u32, id: u32, more: bool, len: usize) -> Frame {
    let mut f = transfer(id, vec![id as u8], Bytes::from(vec![0x42; len]));
    if let sb_amqp::FrameBody::Amqp(p, _) = &mut f.body
        && let Performative::Transfer(t) = p.as_mut()
    {
        t.handle = Handle(handle);
        t.more = more;
    }
    f
}

/// The connection-wide bound on bytes held in unfinished deliveries: two links each under
/// their own 80 kB bound hold 60 kB each; the second one's frame passes the connection's
/// 100 kB, so that link alone is detached with resource-limit-exceeded and its bytes given
/// back: the first delivery still completes, and a new 90 kB one fits again.
#[tokio::test]
async fn unfinished_deliveries_are_bounded_across_links() {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let opts = ServerOptions {
        max_unfinished_bytes: 100_000,
        ..ServerOptions::default()
    };
    let addr = spawn_server(opts, move |mut conn| {
        let tx = tx.clone();
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10).max_message_size(80_000))
                    .await
                    .unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(d) = r.recv().await {
                        r.accept(&d).await.unwrap();
                        tx.send(d.payload.len()).unwrap();
                    }
                });
            }
        }
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut f = FramedIo::new(Box::new(tcp), 65536);
    f.write_header(frame::AMQP_HEADER).await.unwrap();
    f.write_frame(&Frame::amqp(0, open("raw"))).await.unwrap();
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
    assert_eq!(f.read_header().await.unwrap().unwrap(), frame::AMQP_HEADER);
    let mut theirs = Vec::new();
    for (name, handle) in [("a", 0), ("b", 1)] {
        f.write_frame(&Frame::amqp(0, sender_on(name, handle)))
            .await
            .unwrap();
        loop {
            if let Performative::Attach(a) = next(&mut f).await {
                theirs.push(a.handle.0);
                break;
            }
        }
    }
    f.write_frame(&part(0, 0, true, 60_000)).await.unwrap();
    f.write_frame(&part(1, 1, true, 60_000)).await.unwrap();
    let d = loop {
        if let Performative::Detach(d) = next(&mut f).await {
            break d;
        }
    };
    assert_eq!(
        d.handle.0, theirs[1],
        "the link whose frame passed the bound"
    );
    let e: sb_amqp::AmqpError = d.error.unwrap().into();
    assert_eq!(e.condition, condition::RESOURCE_LIMIT_EXCEEDED);
    // The first delivery was never touched: it completes and reaches the application.
    f.write_frame(&part(0, 0, false, 10_000)).await.unwrap();
    assert_eq!(rx.recv().await.unwrap(), 70_000);
    // Both deliveries' bytes are back: a 90 kB delivery fits the connection again.
    f.write_frame(&part(0, 2, true, 60_000)).await.unwrap();
    f.write_frame(&part(0, 2, false, 20_000)).await.unwrap();
    assert_eq!(rx.recv().await.unwrap(), 80_000);
}

/// Transfers that arrive before the application answered the attach (before the link's bound
/// is known) are not held: megabytes pipelined behind the attach are dropped, and the first
/// delivery the application sees is the one sent after our attach answer, alone.
#[tokio::test]
async fn transfers_before_the_attach_is_answered_are_not_held() {
    let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
    let answer_rx = std::sync::Arc::new(tokio::sync::Mutex::new(Some(answer_rx)));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let addr = spawn_server(ServerOptions::default(), move |mut conn| {
        let (tx, answer_rx) = (tx.clone(), answer_rx.clone());
        async move {
            while let Some(ConnectionEvent::Link(req)) = conn.next_event().await {
                // Answer only once the client has sent everything it pipelined.
                if let Some(wait) = answer_rx.lock().await.take() {
                    wait.await.unwrap();
                }
                let r = req
                    .accept_receiver(LinkAnswer::default().credit(10).max_message_size(100_000))
                    .await
                    .unwrap();
                let tx = tx.clone();
                tokio::spawn(async move {
                    while let Ok(d) = r.recv().await {
                        tx.send(d.payload.len()).unwrap();
                    }
                });
            }
        }
    })
    .await;
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut f = FramedIo::new(Box::new(tcp), 65536);
    f.write_header(frame::AMQP_HEADER).await.unwrap();
    f.write_frame(&Frame::amqp(0, open("raw"))).await.unwrap();
    let begin = Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 1000,
        outgoing_window: 1000,
        handle_max: Default::default(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    f.write_frame(&Frame::amqp(0, begin.clone())).await.unwrap();
    f.write_frame(&Frame::amqp(0, sender_on("early", 0)))
        .await
        .unwrap();
    // 8 MB of one unfinished delivery, far past the 100 kB bound the answer will carry.
    for _ in 0..128 {
        f.write_frame(&part(0, 0, true, 64_000)).await.unwrap();
    }
    // The driver handles frames in order: once it answers a second session's `begin`, it has
    // handled (and dropped) every transfer before it. Only then does the application answer.
    f.write_frame(&Frame::amqp(1, begin)).await.unwrap();
    assert_eq!(f.read_header().await.unwrap().unwrap(), frame::AMQP_HEADER);
    let mut begins = 0;
    while begins < 2 {
        begins += usize::from(matches!(next(&mut f).await, Performative::Begin(_)));
    }
    answer_tx.send(()).unwrap();
    loop {
        if let Performative::Attach(_) = next(&mut f).await {
            break;
        }
    }
    // A new delivery after the answer: only its own 1 000 bytes reach the application.
    f.write_frame(&part(0, 1, false, 1_000)).await.unwrap();
    assert_eq!(rx.recv().await.unwrap(), 1_000);
}
