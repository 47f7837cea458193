//! Frames by channel: dispatch to the session of a remote channel, and the session lifecycle
//! (`begin`, `end`) from either side.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::Driver;
use super::session_state::Session;
use crate::core::command::{Reply, next_key};
use crate::error::{AmqpError, Error, Result, condition};
use crate::frame::{Frame, FrameBody};
use crate::performative::{Begin, End, Performative};

impl Driver {
    /// Dispatches one frame from the peer; an error closes the connection.
    pub(super) fn on_frame(&mut self, frame: Frame) -> Result<()> {
        let (p, payload) = match frame.body {
            FrameBody::Empty => {
                self.stats
                    .heartbeats_received
                    .fetch_add(1, Ordering::Relaxed);
                self.stats.heartbeat_notify.notify_waiters();
                return Ok(());
            }
            FrameBody::Sasl(_) => return Err(Error::Protocol("SASL frame after open".into())),
            FrameBody::Amqp(p, payload) => (*p, payload),
        };
        tracing::trace!(
            channel = frame.channel,
            performative = p.name(),
            "Received."
        );
        let ch = frame.channel;
        match p {
            Performative::Open(_) => Err(Error::Protocol("second open".into())),
            Performative::Close(c) => {
                let remote = c.error.map(AmqpError::from);
                if !self.close_sent {
                    self.send_close(None);
                    self.finished = Some(Error::ConnectionClosed(remote));
                } else {
                    self.finished = Some(match remote {
                        Some(e) => Error::ConnectionClosed(Some(e)),
                        None => Error::ConnectionClosed(None),
                    });
                }
                Ok(())
            }
            Performative::Begin(b) => {
                self.on_begin(ch, b);
                Ok(())
            }
            Performative::End(e) => {
                self.on_end(ch, e);
                Ok(())
            }
            other => self.on_session_frame(ch, other, payload),
        }
    }

    /// A link or session frame on remote channel `ch`.
    fn on_session_frame(&mut self, ch: u16, p: Performative, payload: Bytes) -> Result<()> {
        let Some(&local) = self.remote_channels.get(&ch) else {
            if self.ended_channels.contains(&ch) {
                tracing::debug!(
                    channel = ch,
                    performative = p.name(),
                    "Frame on an ended channel dropped."
                );
                return Ok(());
            }
            return Err(Error::Protocol(format!("frame on unknown channel {ch}")));
        };
        match p {
            Performative::Attach(a) => self.on_attach(local, a),
            Performative::Flow(f) => self.on_flow(local, f),
            Performative::Transfer(t) => self.on_transfer(local, t, payload),
            Performative::Disposition(d) => self.on_disposition(local, d),
            Performative::Detach(d) => self.on_detach(local, d),
            _ => {}
        }
        Ok(())
    }

    /// The peer's `begin`: the answer to ours, or a session it starts (accepted with default
    /// windows).
    fn on_begin(&mut self, ch: u16, b: Begin) {
        let local = match b.remote_channel {
            Some(local) if self.sessions.contains_key(&local) => local,
            _ => {
                // Peer-initiated session: accept it with default windows.
                let Some(local) =
                    (0..=self.neg.channel_max).find(|c| !self.sessions.contains_key(c))
                else {
                    self.send_close(Some(AmqpError::new(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        Some("no free channel".to_string()),
                    )));
                    return;
                };
                let s = Session::new(next_key(), 2048, 2048);
                self.write(
                    local,
                    Begin {
                        remote_channel: Some(ch),
                        next_outgoing_id: s.next_outgoing_id,
                        incoming_window: s.incoming_window,
                        outgoing_window: s.outgoing_window,
                        handle_max: Default::default(),
                        offered_capabilities: None,
                        desired_capabilities: None,
                        properties: None,
                    },
                );
                self.sessions.insert(local, s);
                local
            }
        };
        self.remote_channels.insert(ch, local);
        self.ended_channels.remove(&ch);
        if let Some(s) = self.sessions.get_mut(&local) {
            s.remote_channel = Some(ch);
            s.next_incoming_id = b.next_outgoing_id;
            s.remote_incoming_window = b.incoming_window;
            if let Some(w) = s.begin_waiter.take() {
                let _ = w.send(Ok(local)); // the caller may have given up; End follows on drop
            }
        }
    }

    /// The peer's `end`: answered, and everything of the session fails.
    fn on_end(&mut self, ch: u16, e: End) {
        let Some(local) = self.remote_channels.remove(&ch) else {
            return;
        };
        self.ended_channels.insert(ch);
        let Some(mut s) = self.sessions.remove(&local) else {
            return;
        };
        let remote = e.error.map(AmqpError::from);
        if !s.end_sent {
            self.write(local, End { error: None });
        }
        s.fail(&Error::SessionEnded(remote));
    }

    /// Begins a session on the lowest free channel.
    pub(super) fn begin_session(
        &mut self,
        key: u64,
        incoming_window: u32,
        outgoing_window: u32,
        ended: std::sync::Arc<std::sync::atomic::AtomicBool>,
        reply: Reply<u16>,
    ) {
        if self.close_sent {
            let _ = reply.send(Err(Error::ConnectionClosed(None))); // caller may be gone
            return;
        }
        let Some(local) = (0..=self.neg.channel_max).find(|c| !self.sessions.contains_key(c))
        else {
            let _ = reply.send(Err(Error::IllegalState("no free channel"))); // same
            return;
        };
        let mut s = Session::new(key, incoming_window, outgoing_window);
        s.begin_waiter = Some(reply);
        s.ended = Some(ended);
        self.write(
            local,
            Begin {
                remote_channel: None,
                next_outgoing_id: s.next_outgoing_id,
                incoming_window,
                outgoing_window,
                handle_max: Default::default(),
                offered_capabilities: None,
                desired_capabilities: None,
                properties: None,
            },
        );
        self.sessions.insert(local, s);
    }

    /// Ends a session (once); `reply` waits for the peer's `end`. With a `key`, only the
    /// session of that key: a later session on the channel is left alone.
    pub(super) fn end_session(
        &mut self,
        channel: u16,
        key: Option<u64>,
        error: Option<AmqpError>,
        reply: Option<Reply<()>>,
    ) {
        let Some(s) = self
            .sessions
            .get_mut(&channel)
            .filter(|s| key.is_none_or(|k| s.key == k))
        else {
            if let Some(r) = reply {
                let _ = r.send(Ok(())); // already ended
            }
            return;
        };
        if let Some(r) = reply {
            s.end_waiters.push(r);
        }
        if !s.end_sent {
            s.end_sent = true;
            self.write(
                channel,
                End {
                    error: error.map(Into::into),
                },
            );
        }
    }

    /// Closes the connection; `reply` waits for the peer's `close`.
    pub(super) fn close(&mut self, error: Option<AmqpError>, reply: Option<Reply<()>>) {
        if let Some(r) = reply {
            self.close_waiters.push(r);
        }
        self.send_close(error);
    }
}
