//! Deliveries: incoming transfers assembled into [`Delivery`]s (multi-frame, aborted, refused
//! above our `max-message-size` or the connection's bound on unfinished deliveries), and the
//! pump that writes queued sends as credit and the session window allow.

use std::collections::BTreeMap;

use bytes::{Bytes, BytesMut};
use fe2o3_amqp_types::definitions::{Fields, Handle, Role};
use serde_bytes::ByteBuf;

use super::Driver;
use super::budget::Budget;
use super::link_state::{InUnsettled, Link, OutUnsettled, Partial, PendingSend};
use super::session_state::Session;
use crate::core::command::{LinkEvent, LinkRef, Reply, SendReport, Track};
use crate::delivery::{Delivery, Sendable};
use crate::error::{AmqpError, Error, condition};
use crate::frame::{Frame, FrameBody};
use crate::performative::{Flow, Performative, Transfer};

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
        if l.detach_sent {
            // A link we are detaching (say, after refusing an oversized delivery) takes
            // nothing more: what the peer sent before it saw our detach is dropped, as azure-amqp
            // does (`ReceivingAmqpLink.OnProcessTransfer`: "any transfer is meaningless").
            if let Some(f) = flow_out {
                self.write(local, f);
            }
            return;
        }
        let mut refusal = None;
        match assemble(l, &t, &payload, &self.budget) {
            Assembled::Complete(p) => {
                if let Some(fr) = deliver(s, h, p) {
                    flow_out = None;
                    self.write(local, fr);
                }
            }
            Assembled::Refused(error) => {
                tracing::debug!(
                    link = %l.name,
                    condition = %error.condition,
                    "Delivery refused above its bound; detaching the link."
                );
                // The handle learns why now, not from the peer's bare detach answer.
                let _ = l
                    .setup
                    .events
                    .send(LinkEvent::Gone(Error::LinkDetached(Some(error.clone())))); // the handle may be dropped
                refusal = Some((
                    LinkRef {
                        channel: local,
                        session: s.key,
                        handle: h,
                        key: l.key,
                    },
                    error,
                ));
            }
            Assembled::More | Assembled::Aborted => {}
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
        if let Some((link, error)) = refusal {
            self.detach(link, Some(error), None);
        }
    }

    /// Queues a send on a sending link and pumps it. A link that is gone refuses it with
    /// `LinkDetached`, whatever link took its handle since: the transfer must never go out on
    /// another link (azure-amqp `SendingAmqpLink.BeginSendMessage` checks its own link object,
    /// `ThrowIfClosed`).
    pub(super) fn send(
        &mut self,
        link: LinkRef,
        send: Sendable,
        track: Track,
        reply: Reply<SendReport>,
    ) {
        let (channel, handle) = (link.channel, link.handle);
        let Some(l) = self.link_at(link) else {
            // Not `SessionEnded`: the client would take it for its current session's end.
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
                let key = l.key;
                finish_send(&mut s.unsettled_out, p, (h, key), id, tag);
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

/// What one transfer frame made of the link's delivery in progress.
enum Assembled {
    /// More frames follow.
    More,
    /// The last frame arrived.
    Complete(Partial),
    /// The peer aborted the delivery; what it sent is dropped.
    Aborted,
    /// The delivery passed its link's `max-message-size` or the connection's bound on
    /// unfinished deliveries: it is dropped (its bytes freed) and the link must be detached with
    /// this error.
    Refused(AmqpError),
}

/// Adds one transfer frame to the link's delivery in progress, refusing it as soon as its size
/// passes a bound (not when its last frame arrives: a peer could stream without end).
///
/// The link error follows the AMQP 1.0 spec (part 2.7.3, `max-message-size`: "any attempt to
/// deliver a message larger than this results in a message-size-exceeded link-error") and
/// azure-amqp, which detaches a receiving link with `amqp:link:message-size-exceeded` on the
/// frame that passes the bound (`src/ReceivingAmqpLink.cs`, `OnProcessTransfer`).
fn assemble(l: &mut Link, t: &Transfer, payload: &Bytes, budget: &Budget) -> Assembled {
    if t.aborted {
        // An aborted delivery's payload means nothing (spec 2.7.5); no bound applies to it.
        if l.partial.take().is_none() {
            l.delivery_count = l.delivery_count.wrapping_add(1);
            l.credit = l.credit.saturating_sub(1);
        }
        return Assembled::Aborted;
    }
    let p = match l.partial.as_mut() {
        Some(p) => p,
        None => {
            l.delivery_count = l.delivery_count.wrapping_add(1);
            l.credit = l.credit.saturating_sub(1);
            l.partial.insert(Partial {
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
                held: budget.reserve(),
            })
        }
    };
    let size = (p.buf.len() as u64).saturating_add(payload.len() as u64);
    if l.max_incoming > 0 && size > l.max_incoming {
        let id = p.delivery_id;
        l.partial = None;
        return Assembled::Refused(
            AmqpError::new(
                condition::MESSAGE_SIZE_EXCEEDED,
                Some(format!(
                    "delivery {id} reached {size} bytes, more than the {} this link takes",
                    l.max_incoming
                )),
            )
            // `info` written (empty): Python's pyamqp reads the error's third field
            // unconditionally and fails on a two-field error.
            .with_info(Fields::default()),
        );
    }
    if !p.held.try_grow(payload.len() as u64) {
        l.partial = None;
        return Assembled::Refused(
            AmqpError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                Some(format!(
                    "unfinished deliveries on this connection would hold more than {} bytes",
                    budget.limit()
                )),
            )
            .with_info(Fields::default()),
        );
    }
    p.buf.extend_from_slice(payload);
    if t.settled == Some(true) {
        p.settled = true;
    }
    if t.state.is_some() {
        p.state = t.state.clone();
    }
    if t.more {
        return Assembled::More;
    }
    l.partial
        .take()
        .map_or(Assembled::More, Assembled::Complete)
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
    let l = s.links.get_mut(&h)?;
    if !d.settled {
        s.unsettled_in.insert(
            d.delivery_id,
            InUnsettled {
                key: l.key,
                waiter: None,
            },
        );
    }
    let _ = l.setup.events.send(LinkEvent::Delivery(d)); // handle dropped: detach pending
    let n = l.setup.auto_credit?;
    if l.credit > n / 2 {
        return None;
    }
    l.credit = n;
    l.publish_flow();
    Some(s.link_flow_frame(h))
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
    unsettled_out: &mut BTreeMap<u32, OutUnsettled>,
    p: PendingSend,
    (h, key): (u32, u64),
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
            key,
            tag,
            waiter,
        },
    );
}
