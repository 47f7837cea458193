//! Building blocks of the scripted raw-frame peers (`raw`, `settlement`, `coalesce`): the next
//! performative read, a plain `open` and `begin`, single-frame transfers, a sending link's
//! `attach`.

use bytes::Bytes;
use sb_amqp::performative::{Attach, Begin, Open, Performative, Transfer};
use sb_amqp::types::definitions::{Handle, ReceiverSettleMode, Role, SenderSettleMode};
use sb_amqp::types::messaging::{Source, Target, TargetArchetype};
use sb_amqp::types::performatives::{ChannelMax, MaxFrameSize};
use sb_amqp::{Frame, FrameBody, FramedIo};

/// The next AMQP performative, skipping empty (heartbeat) frames.
pub(crate) async fn next(f: &mut FramedIo) -> Performative {
    loop {
        match f.read_frame().await.unwrap().unwrap().body {
            FrameBody::Amqp(p, _) => return *p,
            FrameBody::Empty => continue,
            FrameBody::Sasl(s) => panic!("unexpected {s:?}"),
        }
    }
}

/// An `open` from `container_id` with 64 KiB frames and 8 channels, nothing else set.
pub(crate) fn open(container_id: &str) -> Open {
    Open {
        container_id: container_id.into(),
        hostname: None,
        max_frame_size: MaxFrameSize(65536),
        channel_max: ChannelMax(8),
        idle_time_out: None,
        outgoing_locales: None,
        incoming_locales: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// A `begin` answering `remote_channel` (or starting a session, `None`) with both windows at
/// `window`, nothing else set.
pub(crate) fn begin(remote_channel: Option<u16>, window: u32) -> Begin {
    Begin {
        remote_channel,
        next_outgoing_id: 0,
        incoming_window: window,
        outgoing_window: window,
        handle_max: Default::default(),
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}

/// Delivery `id` on channel 0, handle 0, tagged `tag`: unsettled, in one frame.
pub(crate) fn transfer(id: u32, tag: Vec<u8>, payload: Bytes) -> Frame {
    transfer_on(Handle(0), id, tag, false, payload)
}

/// Delivery `id` on channel 0 and `handle`, tagged `tag`, in one frame.
pub(crate) fn transfer_on(
    handle: Handle,
    id: u32,
    tag: Vec<u8>,
    settled: bool,
    payload: Bytes,
) -> Frame {
    Frame {
        channel: 0,
        body: FrameBody::Amqp(
            Box::new(Performative::Transfer(Transfer {
                handle,
                delivery_id: Some(id),
                delivery_tag: Some(tag.into()),
                message_format: Some(0),
                settled: Some(settled),
                more: false,
                rcv_settle_mode: None,
                state: None,
                resume: false,
                aborted: false,
                batchable: false,
            })),
            payload,
        ),
    }
}

/// An unsettled sending link `name` on handle 0 to `address`, the receiver settling first,
/// its delivery count from 0 (callers change what their test needs).
pub(crate) fn sender_attach(name: &str, address: &str) -> Attach {
    Attach {
        name: name.into(),
        handle: Handle(0),
        role: Role::Sender,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Box::new(Source::default())),
        target: Some(Box::new(TargetArchetype::Target(Target {
            address: Some(address.into()),
            ..Default::default()
        }))),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: Some(0),
        max_message_size: None,
        offered_capabilities: None,
        desired_capabilities: None,
        properties: None,
    }
}
