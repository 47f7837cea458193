//! The emulator's server role on the wire: settlements arriving as AMQP ranges (issue 15,
//! item 4), a disposition racing a forced detach, and the live link listing once links are
//! detached (issue 13). Raw sb-amqp clients; a tap between client and emulator keeps the
//! `disposition` frames passing each way.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::BytesMut;
use sb_amqp::performative::{Disposition, Performative};
use sb_amqp::types::definitions::{ReceiverSettleMode, Role};
use sb_amqp::types::messaging::Message;
use sb_amqp::{
    AmqpError, Connection, Frame, FrameBody, Outcome, Receiver, ReceiverOptions, RequestResponse,
    Sendable, SenderOptions, Session, condition, unique_name,
};
use sb_emulator::{Emulator, EmulatorOptions, LinkRole};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};

use crate::strict::{put_token, strict_emulator};

type Seen = Arc<Mutex<Vec<Disposition>>>;

/// A TCP proxy in front of the emulator for one connection, keeping the dispositions the
/// client sends (`to_server`) and the emulator sends (`to_client`).
struct Tap {
    addr: SocketAddr,
    to_server: Seen,
    to_client: Seen,
}

async fn tap(target: SocketAddr) -> Tap {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (to_server, to_client) = (Seen::default(), Seen::default());
    let (up, down) = (to_server.clone(), to_client.clone());
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let server = TcpStream::connect(target).await.unwrap();
        let (client_read, client_write) = client.into_split();
        let (server_read, server_write) = server.into_split();
        tokio::spawn(relay(client_read, server_write, up));
        relay(server_read, client_write, down).await;
    });
    Tap {
        addr,
        to_server,
        to_client,
    }
}

/// Copies bytes one way and parses them as they pass: protocol headers, SASL and AMQP frames.
async fn relay(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, seen: Seen) {
    let mut parsed = BytesMut::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        parsed.extend_from_slice(&chunk[..n]);
        // Parsed before it is passed on: whoever reacts to a frame finds it already kept.
        loop {
            if parsed.starts_with(b"AMQP") {
                if parsed.len() < 8 {
                    break;
                }
                let _header = parsed.split_to(8);
                continue;
            }
            match Frame::parse(&mut parsed, 1 << 20) {
                Ok(Some(frame)) => {
                    if let FrameBody::Amqp(p, _) = frame.body
                        && let Performative::Disposition(d) = *p
                    {
                        seen.lock().unwrap().push(d);
                    }
                }
                Ok(None) => break,
                Err(error) => panic!("tap cannot parse the stream: {error}"),
            }
        }
        if to.write_all(&chunk[..n]).await.is_err() {
            return;
        }
    }
}

/// A connection to `addr` (the emulator or a tap in front of it) authorised for `orders`.
async fn connect(emulator: &Emulator, addr: SocketAddr) -> (Connection, Session, RequestResponse) {
    let conn = Connection::open(&format!("amqp://{addr}")).await.unwrap();
    let session = conn.begin().await.unwrap();
    let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
    // The audience names the emulator, whatever address the connection goes through.
    put_token(emulator, &cbs, "orders").await;
    (conn, session, cbs)
}

async fn send_orders(session: &Session, n: usize) {
    let sender = session
        .attach_sender(SenderOptions::new(unique_name("publisher"), "orders"))
        .await
        .unwrap();
    for i in 0..n {
        let message = Message::builder().value(format!("order-{i}")).build();
        let outcome = sender.send(Sendable::message(&message).unwrap()).await;
        assert!(outcome.unwrap().is_accepted());
    }
}

/// A peek-lock receiver as the Service Bus SDKs attach it: settlements wait for the answer.
async fn consumer(session: &Session, name: &str, credit: u32) -> Receiver {
    session
        .attach_receiver(
            ReceiverOptions::new(name, "orders")
                .credit(credit)
                .rcv_settle_mode(ReceiverSettleMode::Second),
        )
        .await
        .unwrap()
}

/// Every delivery id the dispositions of `role` cover.
fn ids(seen: &Seen, role: Role) -> Vec<u32> {
    let mut ids: Vec<u32> = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|d| d.role == role)
        .flat_map(|d| d.first..=d.last.unwrap_or(d.first))
        .collect();
    ids.sort_unstable();
    ids
}

fn frames(seen: &Seen, role: Role) -> usize {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|d| d.role == role)
        .count()
}

#[tokio::test]
async fn concurrent_completes_leave_as_ranges_and_each_is_completed_and_answered() {
    const N: u32 = 24;
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let tap = tap(emulator.local_addr()).await;
    let (_conn, session, _cbs) = connect(&emulator, tap.addr).await;
    send_orders(&session, N as usize).await;
    let receiver = consumer(&session, "consumer", N).await;
    let mut delivered = Vec::new();
    for _ in 0..N {
        delivered.push(receiver.recv().await.unwrap().delivery_id);
    }
    let settler = receiver.settler();
    // Only the completes from here on ($cbs and the sends disposed of theirs before).
    tap.to_server.lock().unwrap().clear();
    tap.to_client.lock().unwrap().clear();
    let completes: Vec<_> = delivered
        .iter()
        .map(|&id| {
            let settler = settler.clone();
            tokio::spawn(async move { settler.settle(id, Outcome::Accepted).await })
        })
        .collect();
    for complete in completes {
        // Every delivery answered on its own: the emulator took the range apart.
        assert_eq!(complete.await.unwrap().unwrap(), Some(Outcome::Accepted));
    }
    delivered.sort_unstable();
    assert_eq!(ids(&tap.to_server, Role::Receiver), delivered);
    let sent = frames(&tap.to_server, Role::Receiver);
    assert!(
        sent < N as usize,
        "{sent} disposition frames for {N} completes"
    );
    assert_eq!(ids(&tap.to_client, Role::Sender), delivered);
    let counts = emulator.broker().entity("orders").unwrap().counts();
    assert_eq!((counts.active, counts.locked), (0, 0), "{counts:?}");
    assert_eq!(settler.unsettled().await.unwrap(), 0);
}

#[tokio::test]
async fn a_complete_racing_a_forced_detach_is_never_applied_unanswered() {
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let (_conn, session, _cbs) = connect(&emulator, emulator.local_addr()).await;
    let orders = emulator.broker().entity("orders").unwrap();
    for round in 0..4 {
        send_orders(&session, 1).await;
        let receiver = consumer(&session, &format!("consumer-{round}"), 1).await;
        let delivery = receiver.recv().await.unwrap();
        // Messages left locked by earlier rounds stay so: count from here.
        let before = orders.counts();
        let link = emulator
            .links()
            .into_iter()
            .find(|l| l.role == LinkRole::Receiver)
            .unwrap();
        // The detach request and the complete leave together: the link task sees the detach
        // first and the disposition while it winds the link down.
        let busy = AmqpError::new(condition::SERVER_BUSY, None);
        assert!(emulator.force_detach_link(link.id, busy));
        let settler = receiver.settler();
        let settled = settler
            .settle(delivery.delivery_id, Outcome::Accepted)
            .await;
        let after = orders.counts();
        let (was, now) = (before.active + before.locked, after.active + after.locked);
        match settled {
            Ok(Some(Outcome::Accepted)) => assert_eq!(now, was - 1, "round {round}: {after:?}"),
            Ok(other) => panic!("round {round}: {other:?}"),
            // Not confirmed: the message must not have been completed.
            Err(error) => assert_eq!(
                now, was,
                "round {round}: {error} but the complete was applied: {after:?}"
            ),
        }
        let error = receiver.recv().await.unwrap_err();
        assert_eq!(error.condition(), Some(condition::SERVER_BUSY), "{error}");
    }
}

#[tokio::test]
async fn detached_links_are_no_longer_listed_or_detachable() {
    let emulator = strict_emulator(EmulatorOptions::default()).await;
    let (_conn, session, _cbs) = connect(&emulator, emulator.local_addr()).await;
    let sender = session
        .attach_sender(SenderOptions::new("publisher", "orders"))
        .await
        .unwrap();
    let receiver = consumer(&session, "consumer", 1).await;
    let links = emulator.links();
    assert_eq!(links.len(), 2, "{links:?}");
    let consumer_id = links
        .iter()
        .find(|l| l.role == LinkRole::Receiver)
        .unwrap()
        .id;
    // Detached by the client: gone from the listing as soon as the detach is answered.
    receiver.detach().await.unwrap();
    let links = emulator.links();
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(links[0].role, LinkRole::Sender);
    let busy = || AmqpError::new(condition::SERVER_BUSY, None);
    assert!(!emulator.force_detach_link(consumer_id, busy()));
    // Detached by the emulator: unlisted before the client sees the detach.
    assert!(emulator.force_detach_link(links[0].id, busy()));
    let error = sender.next_disposition().await.unwrap_err();
    assert_eq!(error.condition(), Some(condition::SERVER_BUSY), "{error}");
    assert!(!sender.is_attached());
    assert!(emulator.links().is_empty(), "{:?}", emulator.links());
    assert!(!emulator.force_detach_link(links[0].id, busy()));
    assert_eq!(emulator.force_detach_entity("orders", busy()), 0);
}
