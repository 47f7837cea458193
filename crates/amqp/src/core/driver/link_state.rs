//! What the driver keeps per link: credit, queued sends, the delivery being received,
//! waiters; and the unsettled deliveries a session tracks per link.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;

use super::budget::Reservation;
use crate::core::command::{LinkEvent, LinkSetup, Reply, SendReport, Track};
use crate::delivery::{LinkFlow, Sendable};
use crate::error::Error;
use crate::performative::{Attach, Flow};

/// A send waiting for credit, or partly written (multi-frame).
pub(super) struct PendingSend {
    pub(super) send: Sendable,
    pub(super) track: Track,
    pub(super) reply: Reply<SendReport>,
    pub(super) started: Option<(u32, Bytes)>,
    pub(super) offset: usize,
}

/// An incoming delivery whose transfer frames are still arriving.
pub(super) struct Partial {
    pub(super) delivery_id: u32,
    pub(super) tag: Bytes,
    pub(super) format: u32,
    pub(super) settled: bool,
    pub(super) state: Option<DeliveryState>,
    pub(super) buf: BytesMut,
    /// What `buf` holds of the connection's budget; given back when the delivery is dropped.
    pub(super) held: Reservation,
}

/// One link's state machine.
pub(super) struct Link {
    /// Tells this link from an earlier one with the same handle (see `next_key`).
    pub(super) key: u64,
    pub(super) name: String,
    pub(super) role: Role,
    pub(super) remote_handle: Option<u32>,
    pub(super) max_message_size: u64,
    /// Our own `max-message-size`: larger incoming deliveries are rejected, not buffered.
    pub(super) max_incoming: u64,
    pub(super) delivery_count: u32,
    pub(super) credit: u32,
    pub(super) drain: bool,
    pub(super) available: u32,
    pub(super) next_tag: u64,
    pub(super) pending: VecDeque<PendingSend>,
    pub(super) partial: Option<Partial>,
    pub(super) setup: LinkSetup,
    pub(super) attach_waiter: Option<Reply<(u32, Box<Attach>)>>,
    pub(super) refused: Option<Box<Attach>>,
    pub(super) detach_sent: bool,
    pub(super) detach_waiters: Vec<Reply<()>>,
    pub(super) drain_waiter: Option<Reply<()>>,
}

impl Link {
    pub(super) fn publish_flow(&self) {
        self.setup.flow.send_replace(LinkFlow {
            credit: self.credit,
            delivery_count: self.delivery_count,
            drain: self.drain,
            available: self.available,
        });
    }

    pub(super) fn fail(&mut self, err: &Error) {
        if let Some(w) = self.attach_waiter.take() {
            let _ = w.send(Err(err.clone())); // the handle may be gone; nothing to tell then
        }
        for p in self.pending.drain(..) {
            let _ = p.reply.send(Err(err.clone())); // same: the caller may have given up
        }
        if let Some(w) = self.drain_waiter.take() {
            let _ = w.send(Err(err.clone())); // same
        }
        for w in self.detach_waiters.drain(..) {
            let _ = w.send(Ok(())); // the link is gone either way
        }
        let _ = self.setup.events.send(LinkEvent::Gone(err.clone())); // handle may be dropped
    }
}

/// A delivery we sent that the peer has not settled.
pub(super) struct OutUnsettled {
    pub(super) handle: u32,
    /// The key of the link it went out on.
    pub(super) key: u64,
    pub(super) tag: Bytes,
    pub(super) waiter: Option<Reply<SendReport>>,
}

/// A delivery we received and have not settled; `waiter` waits for the peer's settlement.
pub(super) struct InUnsettled {
    /// The key of the link it came on.
    pub(super) key: u64,
    pub(super) waiter: Option<Reply<Option<DeliveryState>>>,
}

/// A peer's attach the application has not answered yet, with what arrived meanwhile.
pub(super) struct PendingRemote {
    pub(super) flow: Option<Flow>,
    pub(super) initial_delivery_count: Option<u32>,
    pub(super) max_message_size: Option<u64>,
}

pub(super) fn new_link(
    a: &Attach,
    key: u64,
    setup: LinkSetup,
    waiter: Option<Reply<(u32, Box<Attach>)>>,
) -> Link {
    Link {
        key,
        name: a.name.clone(),
        role: a.role.clone(),
        remote_handle: None,
        max_message_size: 0,
        max_incoming: setup.max_incoming.or(a.max_message_size).unwrap_or(0),
        delivery_count: a.initial_delivery_count.unwrap_or(0),
        credit: 0,
        drain: false,
        available: 0,
        next_tag: 0,
        pending: VecDeque::new(),
        partial: None,
        setup,
        attach_waiter: waiter,
        refused: None,
        detach_sent: false,
        detach_waiters: Vec::new(),
        drain_waiter: None,
    }
}
