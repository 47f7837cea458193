//! Settlement both ways: the peer's dispositions (outcomes of our sends, settlement of ours)
//! and the dispositions handles ask for.

use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;

use super::{Driver, wrapping_diff};
use crate::core::command::{DeliveryDisposition, LinkEvent, Reply, SendReport, SessionRef};
use crate::delivery::IncomingDisposition;
use crate::error::Error;
use crate::performative::Disposition;

impl Driver {
    /// The peer's `disposition` for a range of deliveries: outcomes of our sends, or the
    /// peer's settlement of deliveries we disposed unsettled.
    pub(super) fn on_disposition(&mut self, local: u16, d: Disposition) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let first = d.first;
        let last = d.last.unwrap_or(first);
        let in_range = |id: u32| {
            wrapping_diff(id, first) <= wrapping_diff(last, first)
                && wrapping_diff(last, id) <= wrapping_diff(last, first)
        };
        let mut out_frames = Vec::new();
        match d.role {
            Role::Receiver => {
                let ids: Vec<u32> = s
                    .unsettled_out
                    .keys()
                    .copied()
                    .filter(|i| in_range(*i))
                    .collect();
                for id in ids {
                    let Some(u) = s.unsettled_out.get_mut(&id) else {
                        continue;
                    };
                    if let Some(w) = u.waiter.take() {
                        if !d.settled {
                            out_frames.push(Disposition {
                                role: Role::Sender,
                                first: id,
                                last: None,
                                settled: true,
                                state: d.state.clone(),
                                batchable: false,
                            });
                        }
                        s.unsettled_out.remove(&id);
                        let _ = w.send(Ok(SendReport {
                            delivery_id: id,
                            state: d.state.clone(),
                        })); // the caller may have given up
                    } else {
                        let ev = IncomingDisposition {
                            delivery_id: id,
                            delivery_tag: u.tag.clone(),
                            state: d.state.clone(),
                            settled: d.settled,
                        };
                        let handle = u.handle;
                        if d.settled {
                            s.unsettled_out.remove(&id);
                        }
                        if let Some(l) = s.links.get(&handle) {
                            let _ = l.setup.events.send(LinkEvent::Disposition(ev)); // handle gone
                        }
                    }
                }
            }
            Role::Sender => {
                if d.settled {
                    let ids: Vec<u32> = s
                        .unsettled_in
                        .keys()
                        .copied()
                        .filter(|i| in_range(*i))
                        .collect();
                    for id in ids {
                        if let Some(Some(w)) = s.unsettled_in.remove(&id).map(|u| u.waiter) {
                            let _ = w.send(Ok(d.state.clone())); // the caller may have given up
                        }
                    }
                }
            }
        }
        for f in out_frames {
            self.write(local, f);
        }
    }

    /// Settles (or disposes unsettled) one delivery; a receiver's unsettled disposition waits
    /// for the peer's settlement. Refused once the delivery's link is gone: delivery ids
    /// restart in a new session on the same channel, and another link's delivery with the same
    /// id must not take this outcome.
    pub(super) fn dispose(&mut self, d: DeliveryDisposition, reply: Reply<Option<DeliveryState>>) {
        let delivery_id = d.delivery_id;
        if let Some(gone) = self.link_gone(d.link) {
            let _ = reply.send(Err(gone)); // caller may be gone
            return;
        }
        let Some(s) = self.sessions.get_mut(&d.link.channel) else {
            return;
        };
        let key = d.link.key;
        match d.role {
            Role::Receiver => {
                let Some(u) = s
                    .unsettled_in
                    .get_mut(&delivery_id)
                    .filter(|u| u.key == key)
                else {
                    let _ = reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                    return;
                };
                if d.settled {
                    s.unsettled_in.remove(&delivery_id);
                    let _ = reply.send(Ok(None)); // same
                } else {
                    u.waiter = Some(reply);
                }
            }
            Role::Sender => {
                if s.unsettled_out
                    .get(&delivery_id)
                    .is_none_or(|u| u.key != key)
                {
                    let _ = reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                    return;
                }
                s.unsettled_out.remove(&delivery_id);
                let _ = reply.send(Ok(None)); // same
            }
        }
        // Written at the end of this turn, merged with its neighbours: see `flush_dispositions`.
        self.queued_dispositions.push(d);
    }

    /// Writes the dispositions handles asked for since the last flush, one frame per run of
    /// contiguous delivery ids with the same channel, role, settlement and state (AMQP's
    /// `first`..`last`). Called before any other frame is written and before every flush of
    /// the socket, so nothing waits longer and frame order is kept.
    pub(super) fn flush_dispositions(&mut self) {
        if self.queued_dispositions.is_empty() {
            return;
        }
        let queued = std::mem::take(&mut self.queued_dispositions);
        for (channel, d) in coalesce(queued) {
            self.write_now(channel, d);
        }
    }

    /// How many received deliveries of the session wait for their settlement.
    pub(super) fn unsettled(&mut self, session: SessionRef, reply: Reply<usize>) {
        let count = self.session_at(session).map_or(0, |s| s.unsettled_in.len());
        let _ = reply.send(Ok(count)); // the caller may have given up
    }
}

/// Merges dispositions that differ only by delivery id into ranges of contiguous ids. Groups
/// keep the order of their first member; ids are sorted within a group (they were queued in
/// the same turn, so their relative order carries no meaning).
fn coalesce(queued: Vec<DeliveryDisposition>) -> Vec<(u16, Disposition)> {
    let mut groups: Vec<(DeliveryDisposition, Vec<u32>)> = Vec::new();
    for q in queued {
        let same = groups.iter_mut().find(|(g, _)| {
            g.link.channel == q.link.channel
                && g.role == q.role
                && g.settled == q.settled
                && g.state == q.state
        });
        match same {
            Some((_, ids)) => ids.push(q.delivery_id),
            None => {
                let id = q.delivery_id;
                groups.push((q, vec![id]));
            }
        }
    }
    let mut out = Vec::new();
    for (g, mut ids) in groups {
        ids.sort_unstable();
        ids.dedup();
        let mut first = ids[0];
        let mut last = first;
        for &id in &ids[1..] {
            if id == last.wrapping_add(1) {
                last = id;
                continue;
            }
            out.push((g.link.channel, range(&g, first, last)));
            first = id;
            last = id;
        }
        out.push((g.link.channel, range(&g, first, last)));
    }
    out
}

fn range(g: &DeliveryDisposition, first: u32, last: u32) -> Disposition {
    Disposition {
        role: g.role.clone(),
        first,
        last: (last != first).then_some(last),
        settled: g.settled,
        state: g.state.clone(),
        batchable: false,
    }
}

#[cfg(test)]
mod tests {
    use fe2o3_amqp_types::messaging::{Accepted, Released};

    use super::*;

    fn q(channel: u16, id: u32, state: DeliveryState) -> DeliveryDisposition {
        DeliveryDisposition {
            link: crate::core::command::LinkRef {
                channel,
                session: 1,
                handle: 0,
                key: 1,
            },
            role: Role::Receiver,
            delivery_id: id,
            settled: true,
            state: Some(state),
        }
    }

    fn ranges(out: &[(u16, Disposition)]) -> Vec<(u16, u32, Option<u32>)> {
        out.iter().map(|(c, d)| (*c, d.first, d.last)).collect()
    }

    #[test]
    fn contiguous_ids_with_one_outcome_become_one_range() {
        let accepted = || DeliveryState::Accepted(Accepted {});
        let out = coalesce((0..5).rev().map(|id| q(0, id, accepted())).collect());
        assert_eq!(ranges(&out), [(0, 0, Some(4))]);
    }

    #[test]
    fn gaps_outcomes_and_channels_split_ranges() {
        let accepted = || DeliveryState::Accepted(Accepted {});
        let released = || DeliveryState::Released(Released {});
        let out = coalesce(vec![
            q(0, 1, accepted()),
            q(0, 2, released()),
            q(0, 3, accepted()),
            q(0, 5, accepted()),
            q(0, 6, accepted()),
            q(1, 4, accepted()),
        ]);
        assert_eq!(
            ranges(&out),
            [
                (0, 1, None),
                (0, 3, None),
                (0, 5, Some(6)),
                (0, 2, None),
                (1, 4, None)
            ]
        );
        assert_eq!(out[3].1.state, Some(released()));
    }
}
