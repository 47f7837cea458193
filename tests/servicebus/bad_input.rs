//! Bad input against the emulator: malformed frames, unknown performatives, oversized frames and
//! invalid SAS tokens close the connection or refuse the link with the right AMQP error, and the
//! emulator keeps serving other clients (a good round trip follows each case).

use std::time::{Duration, SystemTime};

use sb_amqp::types::messaging::ApplicationProperties;
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{Connection, ReceiverOptions, RequestResponse, condition};
use sb_emulator::Emulator;
use sb_emulator::{KEY, KEY_NAME};
use sb_inbox::servicebus::sign_sas;
use sb_inbox::{Delivery, Message as InboxMessage, Receiver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::emulator::{client, emulator, send};

/// One frame: size, data offset 2, `frame_type`, channel 0, then `body`.
fn frame(frame_type: u8, body: &[u8]) -> Vec<u8> {
    let size = u32::try_from(8 + body.len()).unwrap();
    let mut out = size.to_be_bytes().to_vec();
    out.extend_from_slice(&[2, frame_type, 0, 0]);
    out.extend_from_slice(body);
    out
}

/// Reads until `needle` shows up in what the server sent, or the server closes the socket.
async fn read_until(socket: &mut TcpStream, seen: &mut Vec<u8>, needle: &[u8]) -> bool {
    let contains = |seen: &[u8]| seen.windows(needle.len()).any(|w| w == needle);
    let mut buf = [0u8; 4096];
    while !contains(seen) {
        match tokio::time::timeout(Duration::from_secs(10), socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return contains(seen),
            Ok(Ok(n)) => seen.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "no {:?} within 10 s; got {seen:02x?}",
                String::from_utf8_lossy(needle)
            ),
        }
    }
    true
}

/// A raw socket through SASL ANONYMOUS and `open`, ready for hand-written frames.
async fn opened(emulator: &Emulator) -> TcpStream {
    let mut socket = TcpStream::connect(emulator.local_addr()).await.unwrap();
    let mut seen = Vec::new();
    socket.write_all(b"AMQP\x03\x01\x00\x00").await.unwrap();
    assert!(read_until(&mut socket, &mut seen, b"ANONYMOUS").await);
    // sasl-init{mechanism: :ANONYMOUS}
    let mut init = vec![0x00, 0x53, 0x41, 0xc0, 12, 1, 0xa3, 9];
    init.extend_from_slice(b"ANONYMOUS");
    socket.write_all(&frame(1, &init)).await.unwrap();
    // sasl-outcome{code: ok}, then the AMQP header.
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x44]).await);
    socket.write_all(b"AMQP\x00\x01\x00\x00").await.unwrap();
    // open{container-id: "raw"}
    let open = [0x00, 0x53, 0x10, 0xc0, 6, 1, 0xa1, 3, b'r', b'a', b'w'];
    socket.write_all(&frame(0, &open)).await.unwrap();
    seen.clear();
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x10]).await);
    socket
}

/// Writes `bytes` after `open` and expects a `close` carrying `expected`, then the socket's end.
async fn expect_close(emulator: &Emulator, bytes: &[u8], expected: &str) {
    let mut socket = opened(emulator).await;
    socket.write_all(bytes).await.unwrap();
    let mut seen = Vec::new();
    assert!(
        read_until(&mut socket, &mut seen, expected.as_bytes()).await,
        "expected a close with {expected}; got {:?}",
        String::from_utf8_lossy(&seen)
    );
    // The close performative (descriptor 0x18) carried it.
    assert!(
        seen.windows(3).any(|w| w == [0x00, 0x53, 0x18]),
        "{seen:02x?}"
    );
    let mut rest = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match socket.read(&mut rest).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the emulator must close the socket");
}

/// The emulator still serves: send, receive and complete with our client.
async fn round_trip(emulator: &Emulator, id: &str) {
    let client = client(emulator);
    send(
        &client,
        "orders",
        InboxMessage::new(id, "orders.test.v1", "{}"),
    )
    .await;
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    assert_eq!(delivery.message().message_id.as_deref(), Some(id));
    delivery.complete().await.unwrap();
}

#[tokio::test]
async fn garbage_after_the_header_is_a_decode_error() {
    let emulator = emulator("PT30S").await;
    // A frame whose body is no AMQP value (0xff is not a format code).
    expect_close(
        &emulator,
        &frame(0, &[0xff, 0xff, 0xff, 0xff]),
        condition::DECODE_ERROR,
    )
    .await;
    round_trip(&emulator, "after-garbage").await;
}

#[tokio::test]
async fn an_unknown_performative_closes_the_connection() {
    let emulator = emulator("PT30S").await;
    // Descriptor 0x30 is no performative; the list is empty.
    expect_close(
        &emulator,
        &frame(0, &[0x00, 0x53, 0x30, 0x45]),
        condition::DECODE_ERROR,
    )
    .await;
    round_trip(&emulator, "after-unknown").await;
}

#[tokio::test]
async fn a_frame_above_max_frame_size_is_a_framing_error() {
    let emulator = emulator("PT30S").await;
    // The emulator advertises 64 KiB as the service does; announce 1 MiB (the body never needs to arrive).
    let mut header = (1024u32 * 1024).to_be_bytes().to_vec();
    header.extend_from_slice(&[2, 0, 0, 0]);
    expect_close(&emulator, &header, condition::FRAMING_ERROR).await;
    // A truncated frame: size below the 8-byte header.
    expect_close(
        &emulator,
        &[0, 0, 0, 4, 2, 0, 0, 0],
        condition::FRAMING_ERROR,
    )
    .await;
    round_trip(&emulator, "after-oversize").await;
}

#[tokio::test]
async fn a_bad_signature_is_refused_and_the_attach_unauthorized() {
    let emulator = emulator("PT30S").await;
    let addr = emulator.local_addr();
    let conn = Connection::open(&format!("amqp://{addr}")).await.unwrap();
    let session = conn.begin().await.unwrap();
    let cbs = RequestResponse::attach(&session, "$cbs").await.unwrap();
    let audience = format!("sb://{addr}/orders");
    // A token signed with the wrong key, and one with a signature that is no base64.
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    let wrong_key = sign_sas(&audience, KEY_NAME, "not-the-key", now, hour).token;
    let good = sign_sas(&audience, KEY_NAME, KEY, now, hour).token;
    let (head, tail) = good.split_once("&sig=").unwrap();
    let (_, rest) = tail.split_once('&').unwrap();
    let garbled = format!("{head}&sig=%%%not-base64&{rest}");
    for token in [wrong_key, garbled] {
        let request = crate::strict::put_token_request(audience.clone(), token);
        let reply = cbs.request(request).await.unwrap();
        let ApplicationProperties(props) = reply.application_properties.unwrap();
        assert_eq!(props.get("status-code"), Some(&SimpleValue::Int(401)));
    }
    let refused = session
        .attach_receiver(ReceiverOptions::new("r", "orders"))
        .await
        .unwrap_err();
    assert_eq!(
        refused.condition(),
        Some(condition::UNAUTHORIZED_ACCESS),
        "{refused}"
    );
    // The same connection can still use the $cbs node; other clients are served.
    round_trip(&emulator, "after-bad-sas").await;
}

/// One encoded AMQP frame.
fn encoded(channel: u16, performative: impl Into<sb_amqp::performative::Performative>) -> Vec<u8> {
    let mut buf = bytes::BytesMut::new();
    sb_amqp::Frame::amqp(channel, performative)
        .encode(&mut buf)
        .unwrap();
    buf.to_vec()
}

fn begin() -> sb_amqp::performative::Begin {
    sb_amqp::performative::Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 100,
        outgoing_window: 100,
        handle_max: Default::default(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// The end/begin race: a frame for a channel whose session has ended (it crossed the `end` on
/// the wire) is dropped; the connection lives on and the channel can be begun again.
#[tokio::test]
async fn a_frame_on_an_ended_channel_does_not_close_the_connection() {
    let emulator = emulator("PT30S").await;
    let mut socket = opened(&emulator).await;
    let mut seen = Vec::new();
    socket.write_all(&encoded(3, begin())).await.unwrap();
    // begin (0x11) answered
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x11]).await);
    socket
        .write_all(&encoded(3, sb_amqp::performative::End { error: None }))
        .await
        .unwrap();
    seen.clear();
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x17]).await);
    socket.write_all(&encoded(3, session_flow())).await.unwrap();
    // The channel is usable again, and no close came first.
    socket.write_all(&encoded(3, begin())).await.unwrap();
    seen.clear();
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x11]).await);
    assert!(
        !seen.windows(3).any(|w| w == [0x00, 0x53, 0x18]),
        "closed: {seen:02x?}"
    );
    // A frame on a channel that was never begun is still a protocol error.
    socket.write_all(&encoded(9, session_flow())).await.unwrap();
    seen.clear();
    assert!(read_until(&mut socket, &mut seen, &[0x00, 0x53, 0x18]).await);
}

/// A session-level `flow`.
fn session_flow() -> sb_amqp::performative::Flow {
    sb_amqp::performative::Flow {
        next_incoming_id: Some(0),
        incoming_window: 1,
        next_outgoing_id: 0,
        outgoing_window: 1,
        handle: None,
        delivery_count: None,
        link_credit: None,
        available: None,
        drain: false,
        echo: false,
        properties: None,
    }
}

/// The service's `open` says idle-time-out 120000 ms: a connection that sends nothing (no
/// heartbeats either) for 120 s is closed with `amqp:resource-limit-exceeded`. Paused time.
#[tokio::test(start_paused = true)]
async fn a_silent_connection_is_closed_after_the_idle_timeout() {
    let emulator = emulator("PT30S").await;
    let mut socket = opened(&emulator).await;
    let started = tokio::time::Instant::now();
    let mut seen = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        match socket.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
    let waited = started.elapsed();
    assert!(
        (Duration::from_secs(120)..Duration::from_secs(122)).contains(&waited),
        "{waited:?}"
    );
    assert!(
        seen.windows(3).any(|w| w == [0x00, 0x53, 0x18])
            && String::from_utf8_lossy(&seen).contains(condition::RESOURCE_LIMIT_EXCEEDED),
        "{seen:02x?}"
    );
}
