//! What the driver keeps per session: windows, delivery ids, links by local and remote
//! handle, unsettled deliveries both ways.
//!
//! Ordered maps, not hash maps: a session that fails, settles a range or pumps its senders
//! wakes its waiters in map order, and a hash map's order is drawn afresh per map, so a seeded
//! run (the simulator's `SIM_SEED`) would not replay bit for bit.

use std::collections::BTreeMap;

use fe2o3_amqp_types::definitions::{Handle, Role};

use super::link_state::{InUnsettled, Link, OutUnsettled, PendingRemote};
use crate::core::command::Reply;
use crate::error::Error;
use crate::performative::Flow;

/// One session's state machine.
pub(super) struct Session {
    /// Tells this session from an earlier one on the same channel (see `next_key`).
    pub(super) key: u64,
    pub(super) remote_channel: Option<u16>,
    pub(super) next_outgoing_id: u32,
    pub(super) initial_outgoing_id: u32,
    pub(super) incoming_window: u32,
    pub(super) max_incoming_window: u32,
    pub(super) outgoing_window: u32,
    pub(super) next_incoming_id: u32,
    pub(super) remote_incoming_window: u32,
    pub(super) next_delivery_id: u32,
    pub(super) links: BTreeMap<u32, Link>,
    pub(super) by_remote: BTreeMap<u32, u32>,
    pub(super) pending_remote: BTreeMap<u32, PendingRemote>,
    pub(super) unsettled_out: BTreeMap<u32, OutUnsettled>,
    pub(super) unsettled_in: BTreeMap<u32, InUnsettled>,
    pub(super) begin_waiter: Option<Reply<u16>>,
    pub(super) end_sent: bool,
    pub(super) end_waiters: Vec<Reply<()>>,
    /// Our handle's view of whether the session ended (sessions we began).
    pub(super) ended: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

impl Session {
    pub(super) fn new(key: u64, incoming_window: u32, outgoing_window: u32) -> Self {
        Self {
            key,
            remote_channel: None,
            next_outgoing_id: 0,
            initial_outgoing_id: 0,
            incoming_window,
            max_incoming_window: incoming_window,
            outgoing_window,
            next_incoming_id: 0,
            remote_incoming_window: 0,
            next_delivery_id: 0,
            links: BTreeMap::new(),
            by_remote: BTreeMap::new(),
            pending_remote: BTreeMap::new(),
            unsettled_out: BTreeMap::new(),
            unsettled_in: BTreeMap::new(),
            begin_waiter: None,
            end_sent: false,
            end_waiters: Vec::new(),
            ended: None,
        }
    }

    pub(super) fn free_handle(&self) -> u32 {
        (0..).find(|h| !self.links.contains_key(h)).unwrap_or(0)
    }

    pub(super) fn fail(&mut self, err: &Error) {
        if let Some(ended) = &self.ended {
            ended.store(true, std::sync::atomic::Ordering::Release);
        }
        if let Some(w) = self.begin_waiter.take() {
            let _ = w.send(Err(err.clone())); // the caller may have given up
        }
        for (_, mut l) in std::mem::take(&mut self.links) {
            l.fail(err);
        }
        for (_, u) in std::mem::take(&mut self.unsettled_out) {
            if let Some(w) = u.waiter {
                let _ = w.send(Err(err.clone())); // the caller may have given up
            }
        }
        for (_, u) in std::mem::take(&mut self.unsettled_in) {
            if let Some(w) = u.waiter {
                let _ = w.send(Err(err.clone())); // the caller may have given up
            }
        }
        for w in self.end_waiters.drain(..) {
            let _ = w.send(Ok(())); // ended either way
        }
    }

    pub(super) fn flow_frame(&self) -> Flow {
        Flow {
            next_incoming_id: self.remote_channel.map(|_| self.next_incoming_id),
            incoming_window: self.incoming_window,
            next_outgoing_id: self.next_outgoing_id,
            outgoing_window: self.outgoing_window,
            handle: None,
            delivery_count: None,
            link_credit: None,
            available: None,
            drain: false,
            echo: false,
            properties: None,
        }
    }

    pub(super) fn link_flow_frame(&self, handle: u32) -> Flow {
        let mut f = self.flow_frame();
        if let Some(l) = self.links.get(&handle) {
            f.handle = Some(Handle(handle));
            f.delivery_count = Some(l.delivery_count);
            f.link_credit = Some(l.credit);
            f.drain = l.drain;
            if l.role == Role::Sender {
                f.available = Some(l.pending.len() as u32);
            }
        }
        f
    }
}
