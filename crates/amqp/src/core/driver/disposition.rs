//! Settlement both ways: the peer's dispositions (outcomes of our sends, settlement of ours)
//! and the dispositions handles ask for.

use fe2o3_amqp_types::definitions::Role;
use fe2o3_amqp_types::messaging::DeliveryState;

use super::{Driver, wrapping_diff};
use crate::core::command::{LinkEvent, Reply, SendReport};
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
    /// for the peer's settlement.
    pub(super) fn dispose(
        &mut self,
        channel: u16,
        role: Role,
        delivery_id: u32,
        settled: bool,
        state: Option<DeliveryState>,
        reply: Reply<Option<DeliveryState>>,
    ) {
        let Some(s) = self.sessions.get_mut(&channel) else {
            let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
            return;
        };
        match role {
            Role::Receiver => {
                let Some(u) = s.unsettled_in.get_mut(&delivery_id) else {
                    let _ = reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                    return;
                };
                if settled {
                    s.unsettled_in.remove(&delivery_id);
                    let _ = reply.send(Ok(None)); // same
                } else {
                    u.waiter = Some(reply);
                }
            }
            Role::Sender => {
                if s.unsettled_out.remove(&delivery_id).is_none() {
                    let _ = reply.send(Err(Error::IllegalState("unknown or settled delivery"))); // same
                    return;
                }
                let _ = reply.send(Ok(None)); // same
            }
        }
        self.write(
            channel,
            Disposition {
                role,
                first: delivery_id,
                last: None,
                settled,
                state,
                batchable: false,
            },
        );
    }

    /// How many received deliveries of the session wait for their settlement.
    pub(super) fn unsettled(&mut self, channel: u16, reply: Reply<usize>) {
        let count = self
            .sessions
            .get(&channel)
            .map_or(0, |s| s.unsettled_in.len());
        let _ = reply.send(Ok(count)); // the caller may have given up
    }
}
