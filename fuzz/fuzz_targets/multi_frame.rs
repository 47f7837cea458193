//! (7) Multi-frame deliveries across links: after a valid handshake (SASL ANONYMOUS, `open`,
//! `begin`, a namespace token put on `$cbs` and answered), four sending links are attached to
//! `$cbs`, `q/$management`, the queue `q` and the topic `t`; the input is then read as a
//! sequence of transfer frames, each spread over those links with its own `more`, `aborted` and
//! `settled` flags and payload (see [`Op`]), so deliveries interleave, grow past their link's
//! bound (64 KiB on `$cbs`, 1 MiB on `$management`, the entity's size plus a batch envelope),
//! are aborted midway, restart without finishing, or complete as requests and messages.
//!
//! Each input gets a fresh emulator, shut down before the input returns (leak checks stay on),
//! and a connection the emulator neither closes nor finishes answering within [`HANG_AFTER`]
//! after our half-close is a finding (below libFuzzer's `-timeout=10`).
#![no_main]

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use sb_amqp::performative::{Attach, Begin, Open, Performative, Transfer};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use sb_amqp::types::messaging::{
    ApplicationProperties, Message, Properties, Source, Target, TargetArchetype,
};
use sb_amqp::types::performatives::{ChannelMax, MaxFrameSize};
use sb_amqp::types::primitives::SimpleValue;
use sb_amqp::{Frame, FrameBody, Sendable};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;

const CONFIG: &str = r#"{"UserConfig":{"Namespaces":[{"Name":"ns","Queues":[{"Name":"q"}],"Topics":[{"Name":"t","Subscriptions":[{"Name":"sub"}]}]}],"Logging":{"Type":"File"}}}"#;

/// See the module docs.
const HANG_AFTER: Duration = Duration::from_secs(8);
/// The links the fuzzed transfers go to, by handle.
const LINKS: [&str; 4] = ["$cbs", "q/$management", "q", "t"];
/// Largest payload of one frame: under the emulator's 64 KiB frames with the header.
const MAX_CHUNK: usize = 60 * 1024;

/// One fuzzed transfer, read from 4 bytes and a payload:
/// - byte 0: bits 0-1 the link; bit 2 `more`; bit 3 `aborted`; bit 4 `settled`; bit 5 writes the
///   first-frame fields (id, tag, format) even on a continuation; bit 6 takes the payload from
///   the input, else the next bytes of a valid request message (from its start on each new
///   delivery of the link), so split deliveries can complete as requests and messages.
/// - bytes 1-2: payload length (big-endian).
/// - byte 3 (input payloads): how many more times the payload repeats, to reach the links'
///   bounds with short inputs; a frame's payload stays under [`MAX_CHUNK`].
struct Op {
    link: u32,
    more: bool,
    aborted: bool,
    settled: bool,
    force_first: bool,
    payload: Payload,
}

enum Payload {
    Input(Bytes),
    Request(usize),
}

fn ops(mut data: &[u8]) -> Vec<Op> {
    let mut out = Vec::new();
    while data.len() >= 4 && out.len() < 4096 {
        let (flags, len, repeat) = (data[0], u16::from_be_bytes([data[1], data[2]]), data[3]);
        data = &data[4..];
        let payload = if flags & 0x40 != 0 {
            let n = usize::from(len).min(data.len());
            let (piece, rest) = data.split_at(n);
            data = rest;
            let mut payload = BytesMut::new();
            for _ in 0..=repeat {
                if payload.len() + piece.len() > MAX_CHUNK {
                    break;
                }
                payload.extend_from_slice(piece);
            }
            Payload::Input(payload.freeze())
        } else {
            Payload::Request(usize::from(len))
        };
        out.push(Op {
            link: u32::from(flags & 0x03),
            more: flags & 0x04 != 0,
            aborted: flags & 0x08 != 0,
            settled: flags & 0x10 != 0,
            force_first: flags & 0x20 != 0,
            payload,
        });
    }
    out
}

fn frame(p: impl Into<Performative>, payload: Bytes) -> BytesMut {
    let mut out = BytesMut::new();
    Frame {
        channel: 0,
        body: FrameBody::Amqp(Box::new(p.into()), payload),
    }
    .encode(&mut out)
    .expect("our own frames encode");
    out
}

fn attach(name: &str, handle: u32, role: Role, address: &str) -> Attach {
    let (source, target) = match role {
        Role::Sender => (None, Some(address.to_owned())),
        Role::Receiver => (Some(address.to_owned()), Some(name.to_owned())),
    };
    Attach {
        name: name.into(),
        handle: Handle(handle),
        role: role.clone(),
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source {
            address: source,
            ..Default::default()
        })),
        target: Some(Box::new(TargetArchetype::Target(Target {
            address: target,
            ..Default::default()
        }))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: (role == Role::Sender).then_some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

fn transfer(handle: u32, id: Option<u32>, more: bool, aborted: bool, settled: bool) -> Transfer {
    Transfer {
        handle: Handle(handle),
        delivery_id: id,
        delivery_tag: id.map(|i| i.to_be_bytes().to_vec().into()),
        message_format: id.map(|_| 0),
        settled: id.map(|_| settled),
        more,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted,
        batchable: false,
    }
}

/// A put-token request for the whole namespace (so every link is authorized), replying to
/// the link named `cbs-reply`.
fn put_token(addr: std::net::SocketAddr) -> Bytes {
    let audience = format!("sb://{addr}/");
    let token = sb_inbox::servicebus::sign_sas(
        &audience,
        sb_emulator::KEY_NAME,
        sb_emulator::KEY,
        SystemTime::now(),
        Duration::from_secs(3600),
    )
    .token;
    let message = Message::builder()
        .properties(Properties {
            message_id: Some(sb_amqp::types::messaging::MessageId::String("t".into())),
            reply_to: Some("cbs-reply".into()),
            ..Default::default()
        })
        .application_properties(
            ApplicationProperties::builder()
                .insert("operation", SimpleValue::String("put-token".into()))
                .insert(
                    "type",
                    SimpleValue::String("servicebus.windows.net:sastoken".into()),
                )
                .insert("name", SimpleValue::String(audience))
                .build(),
        )
        .value(token)
        .build();
    Sendable::message(&message)
        .expect("a put-token request encodes")
        .payload
}

/// Reads frames until `done` says one is what we wait for; false if the connection closed.
async fn wait_for(
    rd: &mut OwnedReadHalf,
    buf: &mut BytesMut,
    mut done: impl FnMut(&Performative) -> bool,
) -> bool {
    loop {
        while buf.starts_with(b"AMQP") && buf.len() >= 8 {
            let _ = buf.split_to(8);
        }
        match Frame::parse(buf, 1 << 20) {
            Ok(Some(Frame {
                body: FrameBody::Amqp(p, _),
                ..
            })) => {
                if done(&p) {
                    return true;
                }
                continue;
            }
            Ok(Some(_)) => continue,
            Ok(None) => {}
            Err(_) => return false,
        }
        if !matches!(rd.read_buf(buf).await, Ok(n) if n > 0) {
            return false;
        }
    }
}

/// The handshake, then the fuzzed transfers; `false` on a hang.
async fn exchange(addr: std::net::SocketAddr, data: &[u8]) -> bool {
    let Ok(stream) = TcpStream::connect(addr).await else {
        return true;
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = BytesMut::new();
    let mut head = BytesMut::new();
    head.extend_from_slice(b"AMQP\x03\x01\x00\x00");
    let mut sasl = vec![0x00, 0x53, 0x41, 0xc0, 0x0c, 0x01, 0xa3, 0x09];
    sasl.extend_from_slice(b"ANONYMOUS");
    head.extend_from_slice(&u32::try_from(8 + sasl.len()).unwrap_or(0).to_be_bytes());
    head.extend_from_slice(&[2, 1, 0, 0]);
    head.extend_from_slice(&sasl);
    head.extend_from_slice(b"AMQP\x00\x01\x00\x00");
    let open = Open {
        container_id: "fuzz".into(),
        hostname: None,
        max_frame_size: MaxFrameSize(65536),
        channel_max: ChannelMax(0),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    head.extend_from_slice(&frame(open, Bytes::new()));
    let begin = Begin {
        remote_channel: None,
        next_outgoing_id: 0,
        incoming_window: 65_536,
        outgoing_window: u32::MAX,
        handle_max: Default::default(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    };
    head.extend_from_slice(&frame(begin, Bytes::new()));
    head.extend_from_slice(&frame(
        attach("cbs-reply", 9, Role::Receiver, "$cbs"),
        Bytes::new(),
    ));
    head.extend_from_slice(&frame(
        attach("cbs-token", 8, Role::Sender, "$cbs"),
        Bytes::new(),
    ));
    if wr.write_all(&head).await.is_err() {
        return true;
    }
    // Transfers sent before the emulator answers their link's attach are dropped (no bound is
    // known for them yet): wait for both `$cbs` attaches, as a client waits for credit.
    let mut cbs_attached = 0;
    let answered = tokio::time::timeout(
        HANG_AFTER,
        wait_for(&mut rd, &mut buf, |p| {
            cbs_attached += usize::from(matches!(p, Performative::Attach(_)));
            cbs_attached == 2
        }),
    )
    .await;
    match answered {
        Err(_) => return false,
        Ok(false) => return true,
        Ok(true) => {}
    }
    let mut head = BytesMut::new();
    head.extend_from_slice(&frame(
        sb_amqp::performative::Flow {
            next_incoming_id: Some(0),
            incoming_window: 65_536,
            next_outgoing_id: 0,
            outgoing_window: u32::MAX,
            handle: Some(Handle(9)),
            delivery_count: Some(0),
            link_credit: Some(10),
            available: None,
            drain: false,
            echo: false,
            properties: None,
        },
        Bytes::new(),
    ));
    head.extend_from_slice(&frame(transfer(8, Some(0), false, false, false), put_token(addr)));
    if wr.write_all(&head).await.is_err() {
        return true;
    }
    // The token's reply (a transfer to `cbs-reply`) says every link will be authorized.
    let replied = tokio::time::timeout(
        HANG_AFTER,
        wait_for(&mut rd, &mut buf, |p| matches!(p, Performative::Transfer(_))),
    )
    .await;
    match replied {
        Err(_) => return false,
        Ok(false) => return true,
        Ok(true) => {}
    }
    let mut links = BytesMut::new();
    for (handle, address) in (0u32..).zip(LINKS) {
        links.extend_from_slice(&frame(
            attach(&format!("l{handle}"), handle, Role::Sender, address),
            Bytes::new(),
        ));
    }
    if wr.write_all(&links).await.is_err() {
        return true;
    }
    let mut attached = 0;
    let answered = tokio::time::timeout(
        HANG_AFTER,
        wait_for(&mut rd, &mut buf, |p| {
            attached += usize::from(matches!(p, Performative::Attach(_)));
            attached == LINKS.len()
        }),
    )
    .await;
    match answered {
        Err(_) => return false,
        Ok(false) => return true,
        Ok(true) => {}
    }
    let request = put_token(addr);
    let mut in_delivery = [false; LINKS.len()];
    let mut cursor = [0usize; LINKS.len()];
    let mut next_id = 1u32;
    let reading = async move {
        let mut sink = vec![0u8; 16 * 1024];
        while let Ok(n) = rd.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let writing = async move {
        for op in ops(data) {
            let slot = usize::try_from(op.link).unwrap_or(0);
            if !in_delivery[slot] {
                cursor[slot] = 0;
            }
            let id = (op.force_first || !in_delivery[slot]).then(|| {
                next_id = next_id.wrapping_add(1);
                next_id
            });
            in_delivery[slot] = op.more && !op.aborted;
            let payload = match op.payload {
                Payload::Input(bytes) => bytes,
                Payload::Request(len) => {
                    let from = cursor[slot].min(request.len());
                    let to = from.saturating_add(len).min(request.len());
                    cursor[slot] = to;
                    request.slice(from..to)
                }
            };
            let t = transfer(op.link, id, op.more, op.aborted, op.settled);
            if wr.write_all(&frame(t, payload)).await.is_err() {
                return; // the emulator closed first: an answer, not a hang
            }
        }
        let _ = wr.shutdown().await; // same
    };
    tokio::time::timeout(HANG_AFTER, async { tokio::join!(reading, writing) })
        .await
        .is_ok()
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let finished = rt.block_on(async {
        let emulator = sb_emulator::start_from_json(CONFIG, "127.0.0.1:0")
            .await
            .expect("emulator");
        let finished = exchange(emulator.local_addr(), data).await;
        emulator.shutdown().await;
        finished
    });
    drop(rt);
    assert!(
        finished,
        "hang: the emulator neither finished answering nor closed the connection within {HANG_AFTER:?}"
    );
});
