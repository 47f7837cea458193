//! Deliveries: incoming transfers assembled into [`Delivery`]s (multi-frame, aborted, above
//! our `max-message-size`), and the pump that writes queued sends as credit and the session
//! window allow.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{Fields, Handle, Role};
use serde_bytes::ByteBuf;

use super::Driver;
use super::link_state::{InUnsettled, Link, OutUnsettled, Partial, PendingSend};
use super::session_state::Session;
use crate::core::command::{LinkEvent, Reply, SendReport, Track};
use crate::delivery::{Delivery, Outcome, Sendable};
use crate::error::{AmqpError, Error, condition};
use crate::frame::{Frame, FrameBody};
use crate::performative::{Disposition, Flow, Performative, Transfer};

impl Driver {
    /// The peer's `transfer`: one frame of a delivery on one of our receiving links.
    pub(super) fn on_transfer(&mut self, local: u16, t: Transfer, payload: Bytes) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let mut flow_out = spend_incoming_window(s);
        let Some(&h) = s.by_remote.get(&t.handle.0) else {
            tracing::debug!(handle = t.handle.0, "Transfer on unknown handle dropped.");
            if let Some(f) = flow_out {
                self.write(local, f);
            }
            return;
        };
        let Some(l) = s.links.get_mut(&h) else {
            return;
        };
        let max_incoming = l.max_incoming;
        let mut oversize_reject = None;
        match assemble(l, &t, &payload) {
            Some(p) if p.oversize => {
                tracing::debug!(
                    delivery_id = p.delivery_id,
                    limit = max_incoming,
                    "Delivery above max-message-size rejected."
                );
                if !p.settled {
                    oversize_reject = Some(p.delivery_id);
                }
            }
            Some(p) => {
                if let Some(fr) = deliver(s, h, p) {
                    flow_out = None;
                    self.write(local, fr);
                }
            }
            None => {}
        }
        if let Some(l) = self
            .sessions
            .get_mut(&local)
            .and_then(|s| s.links.get_mut(&h))
        {
            if l.drain && l.credit == 0 {
                l.drain = false;
                if let Some(w) = l.drain_waiter.take() {
                    let _ = w.send(Ok(())); // the caller may have given up
                }
            }
            l.publish_flow();
        }
        if let Some(f) = flow_out {
            self.write(local, f);
        }
        if let Some(id) = oversize_reject {
            self.write(local, oversize_rejection(id, max_incoming));
        }
    }

    /// Queues a send on a sending link and pumps it.
    pub(super) fn send(
        &mut self,
        channel: u16,
        handle: u32,
        send: Sendable,
        track: Track,
        reply: Reply<SendReport>,
    ) {
        let Some(l) = self
            .sessions
            .get_mut(&channel)
            .and_then(|s| s.links.get_mut(&handle))
        else {
            let _ = reply.send(Err(Error::LinkDetached(None))); // caller may be gone
            return;
        };
        if l.role != Role::Sender || l.detach_sent {
            let _ = reply.send(Err(Error::IllegalState("link is not an attached sender"))); // same
            return;
        }
        if l.max_message_size > 0 && send.payload.len() as u64 > l.max_message_size {
            let _ = reply.send(Err(Error::Rejected(Some(AmqpError::new(
                condition::MESSAGE_SIZE_EXCEEDED,
                Some(format!("peer accepts at most {} bytes", l.max_message_size)),
            ))))); // same
            return;
        }
        l.pending.push_back(PendingSend {
            send,
            track,
            reply,
            started: None,
            offset: 0,
        });
        self.pump(channel, handle);
    }

    /// Writes as much of link `h`'s queued sends as its credit and the session window allow,
    /// splitting each at the peer's frame size.
    pub(super) fn pump(&mut self, local: u16, h: u32) {
        let max_frame = self.neg.peer_max_frame_size.min(1024 * 1024) as usize;
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let mut frames: Vec<(Transfer, Bytes)> = Vec::new();
        while let Some(l) = s.links.get_mut(&h) {
            let Some(front) = l.pending.front_mut() else {
                break;
            };
            // A send whose caller gave up before it started is dropped, not sent late.
            if front.started.is_none() && front.reply.is_closed() {
                l.pending.pop_front();
                continue;
            }
            if front.started.is_none() && l.credit == 0 {
                break;
            }
            if s.remote_incoming_window == 0 {
                break;
            }
            let first = front.started.is_none();
            if first {
                start_delivery(&mut s.next_delivery_id, l);
            }
            let Some(front) = l.pending.front_mut() else {
                break;
            };
            let Some((id, tag)) = front.started.clone() else {
                break;
            };
            let mut t = transfer_frame(h, id, &tag, front, first);
            let room = max_frame.saturating_sub(frame_overhead(&t, max_frame));
            let total = front.send.payload.len();
            if room == 0 && total > front.offset {
                if let Some(p) = l.pending.pop_front() {
                    let _ = p
                        .reply
                        .send(Err(Error::Encode("max-frame-size too small".into())));
                }
                continue;
            }
            let end = (front.offset + room).min(total);
            let chunk = front.send.payload.slice(front.offset..end);
            front.offset = end;
            t.more = end < total;
            let done = !t.more;
            frames.push((t, chunk));
            s.next_outgoing_id = s.next_outgoing_id.wrapping_add(1);
            s.remote_incoming_window -= 1;
            if done && let Some(p) = l.pending.pop_front() {
                finish_send(&mut s.unsettled_out, p, h, id, tag);
            }
        }
        if let Some(l) = s.links.get(&h) {
            l.publish_flow();
        }
        if !frames.is_empty() {
            self.flush_dispositions();
        }
        for (t, chunk) in frames {
            if let Err(e) = self.writer.buffer(&Frame {
                channel: local,
                body: FrameBody::Amqp(Box::new(Performative::Transfer(t)), chunk),
            }) {
                tracing::error!(error = %e, "Failed to encode a transfer.");
            }
        }
    }
}

/// Counts one incoming transfer against the session window; widens the window again (a
/// session `flow` to send) once half of it is used.
fn spend_incoming_window(s: &mut Session) -> Option<Flow> {
    s.next_incoming_id = s.next_incoming_id.wrapping_add(1);
    s.incoming_window = s.incoming_window.saturating_sub(1);
    if s.incoming_window < s.max_incoming_window / 2 {
        s.incoming_window = s.max_incoming_window;
        return Some(s.flow_frame());
    }
    None
}

/// Adds one transfer frame to the link's delivery in progress; returns the delivery once its
/// last frame arrived (`None` while more follow, or when it was aborted).
fn assemble(l: &mut Link, t: &Transfer, payload: &Bytes) -> Option<Partial> {
    if l.partial.is_none() {
        l.delivery_count = l.delivery_count.wrapping_add(1);
        l.credit = l.credit.saturating_sub(1);
        l.partial = Some(Partial {
            delivery_id: t.delivery_id.unwrap_or(0),
            tag: t
                .delivery_tag
                .as_ref()
                .map(|b| Bytes::copy_from_slice(b))
                .unwrap_or_default(),
            format: t.message_format.unwrap_or(0),
            settled: false,
            state: None,
            buf: BytesMut::new(),
            oversize: false,
        });
    }
    let p = l.partial.as_mut()?;
    if l.max_incoming > 0 && (p.buf.len() + payload.len()) as u64 > l.max_incoming {
        p.oversize = true;
        p.buf = BytesMut::new();
    }
    if !p.oversize {
        p.buf.extend_from_slice(payload);
    }
    if t.settled == Some(true) {
        p.settled = true;
    }
    if t.state.is_some() {
        p.state = t.state.clone();
    }
    if t.aborted {
        l.partial = None;
        None
    } else if !t.more {
        l.partial.take()
    } else {
        None
    }
}

/// Hands a complete delivery to link `h`'s handle; returns the link `flow` to send when the
/// automatic credit was topped up.
fn deliver(s: &mut Session, h: u32, p: Partial) -> Option<Flow> {
    let d = Delivery {
        delivery_id: p.delivery_id,
        delivery_tag: p.tag,
        message_format: p.format,
        settled: p.settled,
        state: p.state,
        payload: p.buf.freeze(),
    };
    if !d.settled {
        s.unsettled_in.insert(
            d.delivery_id,
            InUnsettled {
                handle: h,
                waiter: None,
            },
        );
    }
    let l = s.links.get_mut(&h)?;
    let _ = l.setup.events.send(LinkEvent::Delivery(d)); // handle dropped: detach pending
    let n = l.setup.auto_credit?;
    if l.credit > n / 2 {
        return None;
    }
    l.credit = n;
    l.publish_flow();
    Some(s.link_flow_frame(h))
}

/// The settled `rejected{amqp:link:message-size-exceeded}` for a delivery above our limit.
fn oversize_rejection(id: u32, max_incoming: u64) -> Disposition {
    Disposition {
        role: Role::Receiver,
        first: id,
        last: None,
        settled: true,
        state: Some(
            // `info` written (empty): Python's pyamqp reads the error's third field
            // unconditionally and fails on a two-field error.
            Outcome::Rejected(Some(
                AmqpError::new(
                    condition::MESSAGE_SIZE_EXCEEDED,
                    Some(format!("message larger than {max_incoming} bytes")),
                )
                .with_info(Fields::default()),
            ))
            .into(),
        ),
        batchable: false,
    }
}

/// Gives the link's front send a delivery id and tag and spends one credit on it.
fn start_delivery(next_delivery_id: &mut u32, l: &mut Link) {
    let Some(front) = l.pending.front_mut() else {
        return;
    };
    let id = *next_delivery_id;
    *next_delivery_id = id.wrapping_add(1);
    let tag = match &front.send.delivery_tag {
        Some(t) => t.clone(),
        None => {
            l.next_tag += 1;
            Bytes::copy_from_slice(&l.next_tag.to_be_bytes())
        }
    };
    front.started = Some((id, tag));
    l.credit -= 1;
    l.delivery_count = l.delivery_count.wrapping_add(1);
}

/// The next transfer frame of `front` (without payload); only the first carries the tag,
/// format and settlement.
fn transfer_frame(h: u32, id: u32, tag: &Bytes, front: &PendingSend, first: bool) -> Transfer {
    Transfer {
        handle: Handle(h),
        delivery_id: Some(id),
        delivery_tag: first.then(|| ByteBuf::from(tag.to_vec())),
        message_format: first.then_some(front.send.message_format),
        settled: first.then_some(front.track == Track::Settled),
        more: true,
        rcv_settle_mode: None,
        state: None,
        resume: false,
        aborted: false,
        batchable: false,
    }
}

/// Bytes of a frame spent on the header and the transfer performative.
fn frame_overhead(t: &Transfer, max_frame: usize) -> usize {
    let mut probe = BytesMut::new();
    match crate::performative::encode_into(t, &mut probe) {
        Ok(()) => probe.len() + 8,
        Err(_) => max_frame,
    }
}

/// The last frame of a send is written: reply now (pre-settled, or events), or wait for the
/// peer's outcome.
fn finish_send(
    unsettled_out: &mut HashMap<u32, OutUnsettled>,
    p: PendingSend,
    h: u32,
    id: u32,
    tag: Bytes,
) {
    let waiter = match p.track {
        Track::Settled => {
            let _ = p.reply.send(Ok(SendReport {
                delivery_id: id,
                state: None,
            })); // the caller may have given up
            return;
        }
        Track::Await => Some(p.reply),
        Track::Events => {
            let _ = p.reply.send(Ok(SendReport {
                delivery_id: id,
                state: None,
            })); // the caller may have given up
            None
        }
    };
    unsettled_out.insert(
        id,
        OutUnsettled {
            handle: h,
            tag,
            waiter,
        },
    );
}
