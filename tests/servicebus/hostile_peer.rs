//! Issue 35, client side: a man-in-the-middle between our client and the emulator lets the
//! handshake, the tokens and the attaches through, then, in place of the service, streams a
//! 1 GB delivery (transfer frames with `more = true`, generated on the fly) on the client's
//! receive link or on its `$management` reply link. The client must refuse it at that link's
//! bound: a `detach{amqp:link:message-size-exceeded}` on the wire before more than the bound
//! plus what the sockets buffer has been sent, and the call waiting on the link fails instead of
//! hanging.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use sb_amqp::performative::{Performative, Transfer};
use sb_amqp::types::definitions::{Handle, Role};
use sb_amqp::{Frame, FrameBody, condition};
use sb_inbox::Receiver;
use sb_inbox::servicebus::ServiceBusClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use crate::support::emulator::emulator;

const DELIVERY_BYTES: u64 = 1 << 30;
const CHUNK: usize = 60 * 1024;
/// The client's bound on a received message and on a `$management` reply: Service Bus
/// Premium's 100 MiB plus 64 KiB (`src/servicebus/limits.rs`).
const CLIENT_BOUND: u64 = 100 * 1024 * 1024 + 64 * 1024;
/// What the hostile peer may write past the bound before it reads the refusal: after refusing,
/// the client's engine reads on and drops the rest, so the writer is not held back until it has
/// read the detach (socket buffers plus its reaction time at localhost speed; 32 MiB proved too
/// tight for the emulator's twin of this test). Far below 1 GB: a refusal inside it is a refusal
/// mid-stream.
const IN_FLIGHT_SLACK: u64 = 256 << 20;

/// Splits whole frames (and the 8-byte protocol headers) off `buf`.
fn next_unit(buf: &mut BytesMut) -> Option<Bytes> {
    if buf.starts_with(b"AMQP") {
        return (buf.len() >= 8).then(|| buf.split_to(8).freeze());
    }
    if buf.len() < 4 {
        return None;
    }
    let size = usize::try_from(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])).ok()?;
    (size >= 8 && buf.len() >= size).then(|| buf.split_to(size).freeze())
}

fn performative(unit: &Bytes) -> Option<(u16, Performative)> {
    if unit.len() < 8 || unit[5] != 0 {
        return None; // a header or a SASL frame
    }
    let mut copy = BytesMut::from(&unit[..]);
    match Frame::parse(&mut copy, u32::MAX) {
        Ok(Some(Frame {
            channel,
            body: FrameBody::Amqp(p, _),
        })) => Some((channel, *p)),
        _ => None,
    }
}

fn source_address(p: &Performative) -> Option<&str> {
    match p {
        Performative::Attach(a) if a.role == Role::Sender => {
            a.source.as_ref().and_then(|s| s.address.as_deref())
        }
        _ => None,
    }
}

/// What the man-in-the-middle saw: the client's detach error and how many bytes of the
/// delivery had been written when it arrived.
struct Refusal {
    condition: String,
    description: String,
    sent_then: u64,
}

/// Serves one client connection: relays it to `upstream`, and once the service answers the
/// client's attach of a receiving link from `source`, stops relaying the service and streams
/// the 1 GB delivery on that link instead.
async fn man_in_the_middle(
    listener: TcpListener,
    upstream: std::net::SocketAddr,
    source: &'static str,
) -> oneshot::Receiver<Refusal> {
    let (refused_tx, refused_rx) = oneshot::channel();
    tokio::spawn(async move {
        let (client, _) = listener.accept().await.unwrap();
        let service = TcpStream::connect(upstream).await.unwrap();
        let (mut client_rd, mut client_wr) = client.into_split();
        let (mut service_rd, mut service_wr) = service.into_split();
        let sent = Arc::new(AtomicU64::new(0));
        // Client → service: relayed, watching for the client's detach with an error.
        let watched = sent.clone();
        tokio::spawn(async move {
            let mut refused_tx = Some(refused_tx);
            let mut buf = BytesMut::new();
            while client_rd.read_buf(&mut buf).await.unwrap_or(0) > 0 {
                while let Some(unit) = next_unit(&mut buf) {
                    if let Some((_, Performative::Detach(d))) = performative(&unit)
                        && let Some(error) = d.error
                        && let Some(tx) = refused_tx.take()
                    {
                        let error = sb_amqp::AmqpError::from(error);
                        let _ = tx.send(Refusal {
                            condition: error.condition,
                            description: error.description.unwrap_or_default(),
                            sent_then: watched.load(Ordering::SeqCst),
                        }); // the test may have failed already
                    }
                    if service_wr.write_all(&unit).await.is_err() {
                        return;
                    }
                }
            }
        });
        // Service → client: relayed until the attach we wait for, then the hostile delivery.
        let mut buf = BytesMut::new();
        let (channel, handle) = 'relay: loop {
            if service_rd.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                return;
            }
            while let Some(unit) = next_unit(&mut buf) {
                client_wr.write_all(&unit).await.unwrap();
                if let Some((channel, p)) = performative(&unit)
                    && source_address(&p).is_some_and(|a| a.eq_ignore_ascii_case(source))
                    && let Performative::Attach(a) = p
                {
                    break 'relay (channel, a.handle.0);
                }
            }
        };
        // Keep draining the service so it never blocks on us; its frames are dropped.
        tokio::spawn(async move {
            let mut sink = BytesMut::new();
            while service_rd.read_buf(&mut sink).await.unwrap_or(0) > 0 {
                sink.advance(sink.len());
            }
        });
        let chunk = Bytes::from(vec![0x5a; CHUNK]);
        let mut written = 0u64;
        let mut first = true;
        while written < DELIVERY_BYTES {
            let t = Transfer {
                handle: Handle(handle),
                delivery_id: first.then_some(1_000),
                delivery_tag: first.then(|| vec![7u8; 16].into()),
                message_format: first.then_some(0),
                settled: first.then_some(false),
                more: written + (CHUNK as u64) < DELIVERY_BYTES,
                rcv_settle_mode: None,
                state: None,
                resume: false,
                aborted: false,
                batchable: false,
            };
            first = false;
            let mut frame = BytesMut::new();
            Frame {
                channel,
                body: FrameBody::Amqp(Box::new(Performative::Transfer(t)), chunk.clone()),
            }
            .encode(&mut frame)
            .unwrap();
            if client_wr.write_all(&frame).await.is_err() {
                return; // the client dropped the connection: what it held went with it
            }
            written += CHUNK as u64;
            sent.store(written, Ordering::SeqCst);
        }
    });
    refused_rx
}

/// The emulator behind a man-in-the-middle waiting for an attach answer from `source`; the
/// client connects to the man-in-the-middle with the emulator's key.
async fn client_behind_mitm(
    source: &'static str,
) -> (
    sb_emulator::Emulator,
    ServiceBusClient,
    oneshot::Receiver<Refusal>,
) {
    let emulator = emulator("PT30S").await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = man_in_the_middle(listener, emulator.local_addr(), source).await;
    let cs = format!(
        "Endpoint=sb://{addr};SharedAccessKeyName={};SharedAccessKey={};UseDevelopmentEmulator=true",
        sb_emulator::KEY_NAME,
        sb_emulator::KEY
    );
    let client = ServiceBusClient::from_connection_string(&cs.parse().unwrap());
    (emulator, client, refused)
}

async fn assert_refused_at_bound(refused: oneshot::Receiver<Refusal>, link: &str) {
    let refusal = tokio::time::timeout(Duration::from_secs(300), refused)
        .await
        .unwrap_or_else(|_| panic!("{link}: the client never refused the delivery"))
        .unwrap();
    println!(
        "{link}: refused after {} bytes sent: {}",
        refusal.sent_then, refusal.description
    );
    assert_eq!(
        refusal.condition,
        condition::MESSAGE_SIZE_EXCEEDED,
        "{link}: {}",
        refusal.description
    );
    assert!(
        refusal
            .description
            .contains(&format!("more than the {CLIENT_BOUND} ")),
        "{link}: {}",
        refusal.description
    );
    assert!(
        refusal.sent_then < CLIENT_BOUND + IN_FLIGHT_SLACK,
        "{link}: refused only after {} bytes",
        refusal.sent_then
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gb_delivery_on_the_receive_link_is_refused_at_its_bound() {
    let (_emulator, client, refused) = client_behind_mitm("orders").await;
    let receiver = client.receiver("orders", 10);
    let received = tokio::spawn(async move { receiver.receive().await });
    assert_refused_at_bound(refused, "receive link").await;
    let received = tokio::time::timeout(Duration::from_secs(120), received)
        .await
        .expect("the receive call ends once its link is refused")
        .unwrap();
    assert!(received.is_err(), "{:?}", received.map(|d| d.is_some()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_gb_reply_on_the_management_link_is_refused_at_its_bound() {
    let (_emulator, client, refused) = client_behind_mitm("orders/$management").await;
    let peeking = {
        let client = client.clone();
        tokio::spawn(async move { client.peek("orders", 0, 10).await })
    };
    assert_refused_at_bound(refused, "management reply link").await;
    let peeked = tokio::time::timeout(Duration::from_secs(120), peeking)
        .await
        .expect("the peek ends once its reply link is refused")
        .unwrap();
    assert!(peeked.is_err(), "{:?}", peeked.map(|m| m.len()));
}
