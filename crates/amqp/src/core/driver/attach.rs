//! Link lifecycle from either side: `attach` (ours, the peer's answer, or a link the peer
//! opens) and `detach`.

use fe2o3_amqp_types::definitions::{Handle, Role};

use super::Driver;
use super::flow::apply_link_flow;
use super::link_state::{PendingRemote, new_link};
use crate::core::command::{ConnCtx, LinkRef, LinkSetup, Reply, SessionRef};
use crate::core::link::PeerAttach;
use crate::error::{AmqpError, Error, condition};
use crate::performative::{Attach, Detach};

impl Driver {
    /// The peer's `attach`: the answer to ours (matched by name), or a link it opens.
    pub(super) fn on_attach(&mut self, local: u16, a: Attach) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let remote_handle = a.handle.0;
        let ours = s
            .links
            .iter()
            .find(|(_, l)| l.name == a.name && l.remote_handle.is_none() && l.role != a.role)
            .map(|(h, _)| *h);
        if let Some(h) = ours {
            s.by_remote.insert(remote_handle, h);
            let Some(l) = s.links.get_mut(&h) else {
                return;
            };
            l.remote_handle = Some(remote_handle);
            l.max_message_size = a.max_message_size.unwrap_or(0);
            let refused = match l.role {
                Role::Sender => a.target.is_none(),
                Role::Receiver => {
                    l.delivery_count = a.initial_delivery_count.unwrap_or(0);
                    a.source.is_none()
                }
            };
            let mut abandoned = None;
            if refused {
                // A detach with the reason follows; answer the attach then.
                l.refused = Some(Box::new(a));
            } else if let Some(w) = l.attach_waiter.take()
                && w.send(Ok((h, Box::new(a)))).is_err()
            {
                abandoned = Some(LinkRef {
                    channel: local,
                    session: s.key,
                    handle: h,
                    key: l.key,
                });
            }
            if let Some(link) = abandoned {
                // The caller stopped waiting (its attach timed out) before the answer came:
                // nobody holds this link, so detach it now rather than leave what the peer
                // holds for it (a session lock, credit, prefetched locks) to no one.
                tracing::debug!(
                    handle = h,
                    "Late attach answer; detaching the abandoned link."
                );
                self.detach(link, None, None);
            }
            return;
        }
        self.on_peer_attach(local, a);
    }

    /// A link the peer opens: handed to the application (server role) or refused.
    fn on_peer_attach(&mut self, local: u16, a: Attach) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let remote_handle = a.handle.0;
        match self.peer_links.as_ref().zip(self.cmd_weak.upgrade()) {
            Some((events, cmd)) => {
                s.pending_remote.insert(
                    remote_handle,
                    PendingRemote {
                        flow: None,
                        initial_delivery_count: a.initial_delivery_count,
                        max_message_size: a.max_message_size,
                    },
                );
                let ctx = ConnCtx {
                    cmd,
                    terminal: self.terminal.subscribe(),
                };
                let conn = self.self_ref.get().and_then(std::sync::Weak::upgrade);
                let session = SessionRef {
                    channel: local,
                    key: s.key,
                };
                // Unsent, the request is dropped, which refuses the link.
                if events.send(PeerAttach::new(ctx, conn, session, a)).is_err() {
                    tracing::debug!("Link request dropped: nobody listens for events.");
                }
            }
            None => {
                // Client role: refuse links the peer opens.
                let h = s.free_handle();
                let mut reply = a.clone();
                reply.handle = Handle(h);
                reply.role = match a.role {
                    Role::Sender => Role::Receiver,
                    Role::Receiver => Role::Sender,
                };
                reply.source = None;
                reply.target = None;
                reply.initial_delivery_count = Some(0);
                self.write(local, reply);
                self.write(
                    local,
                    Detach {
                        handle: Handle(h),
                        closed: true,
                        error: Some(
                            AmqpError::new(
                                condition::NOT_IMPLEMENTED,
                                Some("this endpoint accepts no links".to_string()),
                            )
                            .into(),
                        ),
                    },
                );
            }
        }
    }

    /// The peer's `detach`: answered if we did not detach first; its deliveries and waiters
    /// fail.
    pub(super) fn on_detach(&mut self, local: u16, d: Detach) {
        let Some(s) = self.sessions.get_mut(&local) else {
            return;
        };
        let rh = d.handle.0;
        let remote = d.error.map(AmqpError::from);
        if s.pending_remote.remove(&rh).is_some() {
            // Peer gave up before the application answered; the answer will fail.
            return;
        }
        let Some(h) = s.by_remote.remove(&rh) else {
            return;
        };
        let Some(mut l) = s.links.remove(&h) else {
            return;
        };
        if !l.detach_sent {
            self.write(
                local,
                Detach {
                    handle: Handle(h),
                    closed: d.closed,
                    error: None,
                },
            );
        }
        let err = if l.refused.is_some() || l.attach_waiter.is_some() {
            Error::AttachRefused(remote.clone())
        } else {
            Error::LinkDetached(remote.clone())
        };
        if let Some(s) = self.sessions.get_mut(&local) {
            let ids: Vec<u32> = s
                .unsettled_out
                .iter()
                .filter(|(_, u)| u.key == l.key)
                .map(|(i, _)| *i)
                .collect();
            for id in ids {
                if let Some(Some(w)) = s.unsettled_out.remove(&id).map(|u| u.waiter) {
                    let _ = w.send(Err(err.clone())); // the caller may have given up
                }
            }
            let ids: Vec<u32> = s
                .unsettled_in
                .iter()
                .filter(|(_, u)| u.key == l.key)
                .map(|(i, _)| *i)
                .collect();
            for id in ids {
                if let Some(Some(w)) = s.unsettled_in.remove(&id).map(|u| u.waiter) {
                    let _ = w.send(Err(err.clone())); // the caller may have given up
                }
            }
        }
        l.fail(&err);
    }

    /// Attaches a link we open, keyed `key`, on `session`; `reply` gets the peer's attach.
    pub(super) fn attach(
        &mut self,
        session: SessionRef,
        key: u64,
        mut attach: Box<Attach>,
        setup: LinkSetup,
        reply: Reply<(u32, Box<Attach>)>,
    ) {
        let channel = session.channel;
        let Some(s) = self.session_at(session) else {
            let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
            return;
        };
        if s.end_sent {
            let _ = reply.send(Err(Error::SessionEnded(None))); // same
            return;
        }
        let h = s.free_handle();
        attach.handle = Handle(h);
        let link = new_link(&attach, key, setup, Some(reply));
        s.links.insert(h, link);
        self.write(channel, *attach);
    }

    /// Answers a peer's attach on `session`: accepts it with the link's setup (the link keyed
    /// `key`), or refuses it with the error.
    pub(super) fn answer_attach(
        &mut self,
        session: SessionRef,
        key: u64,
        remote_handle: u32,
        mut attach: Box<Attach>,
        answer: Result<LinkSetup, Option<AmqpError>>,
        reply: Reply<u32>,
    ) {
        let channel = session.channel;
        let Some(s) = self.session_at(session) else {
            let _ = reply.send(Err(Error::SessionEnded(None))); // caller may be gone
            return;
        };
        let Some(pending) = s.pending_remote.remove(&remote_handle) else {
            let _ = reply.send(Err(Error::LinkDetached(None))); // same
            return;
        };
        let h = s.free_handle();
        attach.handle = Handle(h);
        match answer {
            Ok(setup) => {
                let mut link = new_link(&attach, key, setup, None);
                link.remote_handle = Some(remote_handle);
                link.max_message_size = pending.max_message_size.unwrap_or(0);
                if link.role == Role::Receiver {
                    link.delivery_count = pending.initial_delivery_count.unwrap_or(0);
                }
                s.by_remote.insert(remote_handle, h);
                s.links.insert(h, link);
                self.write(channel, *attach);
                if let Some(s) = self.sessions.get_mut(&channel)
                    && let Some(l) = s.links.get_mut(&h)
                {
                    if let Some(f) = pending.flow {
                        apply_link_flow(l, &f);
                    }
                    if l.role == Role::Receiver
                        && let Some(n) = l.setup.auto_credit
                    {
                        l.credit = n;
                        l.publish_flow();
                        let fr = s.link_flow_frame(h);
                        self.write(channel, fr);
                    }
                }
                self.pump(channel, h);
                self.maybe_answer_drain(channel, h);
                let _ = reply.send(Ok(h)); // caller gone: its handle drop detaches
            }
            Err(err) => {
                if attach.role == Role::Sender {
                    attach.source = None;
                } else {
                    attach.target = None;
                }
                self.write(channel, *attach);
                self.write(
                    channel,
                    Detach {
                        handle: Handle(h),
                        closed: true,
                        error: err.map(Into::into),
                    },
                );
                // The handle number stays in use until the peer's detach arrives; we
                // do not track it, so a peer that never answers only leaks a number.
                let _ = reply.send(Ok(h)); // caller may be gone
            }
        }
    }

    /// Detaches a link (once); `reply` waits for the peer's `detach`. A link already gone is
    /// left so: its handle number may belong to another link by now.
    pub(super) fn detach(
        &mut self,
        link: LinkRef,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    ) {
        let (channel, handle) = (link.channel, link.handle);
        let Some(l) = self.link_at(link) else {
            if let Some(r) = reply {
                let _ = r.send(Ok(())); // already gone
            }
            return;
        };
        if let Some(r) = reply {
            l.detach_waiters.push(r);
        }
        if !l.detach_sent {
            l.detach_sent = true;
            self.write(
                channel,
                Detach {
                    handle: Handle(handle),
                    closed: true,
                    error: error.map(Into::into),
                },
            );
        }
    }
}
