//! Credit and windows: the peer's `flow`, our credit changes, and drain on both sides.

use fe2o3_amqp_types::definitions::Role;

use super::link_state::Link;
use super::{Driver, wrapping_diff};
use crate::core::command::{CreditOp, LinkRef, Reply};
use crate::error::Error;
use crate::performative::Flow;

impl Driver {
    /// The peer's `flow`: session window, link credit or drain; may let senders go on.
    pub(super) fn on_flow(&mut self, local: u16, f: Flow) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let base = f.next_incoming_id.unwrap_or(s.initial_outgoing_id);
        s.remote_incoming_window =
            wrapping_diff(base.wrapping_add(f.incoming_window), s.next_outgoing_id);
        let mut echo_handle = None;
        if let Some(rh) = f.handle.as_ref().map(|h| h.0) {
            if let Some(p) = s.pending_remote.get_mut(&rh) {
                p.flow = Some(f);
                return;
            }
            let Some(&h) = s.by_remote.get(&rh) else {
                return;
            };
            let Some(l) = s.links.get_mut(&h) else {
                return;
            };
            apply_link_flow(l, &f);
            if f.echo {
                echo_handle = Some(h);
            }
            self.pump(local, h);
            self.maybe_answer_drain(local, h);
        } else if f.echo {
            let fr = s.flow_frame();
            self.write(local, fr);
        }
        if let Some(h) = echo_handle
            && let Some(s) = self.sessions.get(&local)
        {
            let fr = s.link_flow_frame(h);
            self.write(local, fr);
        }
        // The session window may have opened: pump every sender.
        let handles: Vec<u32> = self
            .sessions
            .get(&local)
            .map(|s| {
                s.links
                    .iter()
                    .filter(|(_, l)| l.role == Role::Sender && !l.pending.is_empty())
                    .map(|(h, _)| *h)
                    .collect()
            })
            .unwrap_or_default();
        for h in handles {
            self.pump(local, h);
        }
    }

    /// Answers a drain on a sending link with nothing queued: spends the remaining credit.
    pub(super) fn maybe_answer_drain(&mut self, local: u16, h: u32) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let Some(l) = s.links.get_mut(&h) else {
            return;
        };
        if l.role == Role::Sender && l.drain && l.setup.auto_drain && l.pending.is_empty() {
            l.delivery_count = l.delivery_count.wrapping_add(l.credit);
            l.credit = 0;
            l.publish_flow();
            let fr = s.link_flow_frame(h);
            self.write(local, fr);
        }
    }

    /// Sets or adds credit on a receiving link, optionally asking for a drain.
    /// A link that is gone refuses it, whatever link took its handle since.
    pub(super) fn set_credit(
        &mut self,
        link: LinkRef,
        op: CreditOp,
        drain: bool,
        reply: Reply<()>,
    ) {
        if let Some(gone) = self.link_gone(link) {
            let _ = reply.send(Err(gone)); // caller may be gone
            return;
        }
        let (channel, handle) = (link.channel, link.handle);
        let Some(s) = self.sessions.get_mut(&channel) else {
            return;
        };
        let Some(l) = s.links.get_mut(&handle) else {
            return;
        };
        if l.role != Role::Receiver {
            let _ = reply.send(Err(Error::IllegalState("link is not a receiver"))); // same
            return;
        }
        match op {
            CreditOp::Set(n) => l.credit = n,
            CreditOp::Add(n) => l.credit = l.credit.saturating_add(n),
        }
        l.drain = drain;
        if drain && l.credit > 0 {
            l.drain_waiter = Some(reply);
        } else {
            l.drain = false;
            let _ = reply.send(Ok(())); // same
        }
        l.publish_flow();
        let fr = s.link_flow_frame(handle);
        self.write(channel, fr);
    }

    /// Answers a drain now, even on a link that leaves drains to the application.
    pub(super) fn answer_drain(&mut self, link: LinkRef) {
        if self.link_gone(link).is_some() {
            return;
        }
        let (channel, handle) = (link.channel, link.handle);
        if let Some(l) = self
            .sessions
            .get_mut(&channel)
            .and_then(|s| s.links.get_mut(&handle))
        {
            l.drain = true;
            let auto = l.setup.auto_drain;
            l.setup.auto_drain = true;
            self.maybe_answer_drain(channel, handle);
            if let Some(l) = self
                .sessions
                .get_mut(&channel)
                .and_then(|s| s.links.get_mut(&handle))
            {
                l.setup.auto_drain = auto;
            }
        }
    }
}

/// Applies a link `flow` to the link's credit and drain state and publishes it.
pub(super) fn apply_link_flow(l: &mut Link, f: &Flow) {
    match l.role {
        Role::Sender => {
            let rdc = f.delivery_count.unwrap_or(l.delivery_count);
            let credit = f.link_credit.unwrap_or(0);
            l.credit = wrapping_diff(rdc.wrapping_add(credit), l.delivery_count);
            l.drain = f.drain;
        }
        Role::Receiver => {
            if let Some(dc) = f.delivery_count {
                let limit = l.delivery_count.wrapping_add(l.credit);
                l.credit = wrapping_diff(limit, dc);
                l.delivery_count = dc;
            }
            // Lenient: RabbitMQ 3.10 answers a drain with `link-credit = 0` without advancing
            // `delivery-count`; the sender's word on its remaining credit wins.
            if f.drain && f.link_credit == Some(0) {
                l.credit = 0;
            }
            l.available = f.available.unwrap_or(0);
            if l.drain && l.credit == 0 {
                l.drain = false;
                if let Some(w) = l.drain_waiter.take() {
                    let _ = w.send(Ok(())); // the caller may have given up
                }
            }
        }
    }
    l.publish_flow();
}
