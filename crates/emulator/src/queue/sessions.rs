//! Message sessions of a session-enabled queue or subscription: accepting and holding a
//! session lock ([`SessionLock`]), its messages in order, its state.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::QueueState;
use crate::error::{Error, Result};
use crate::message::{ReceiveMode, ReceivedMessage};

/// A session accepted by a receiver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLock {
    /// The session id (AMQP `group-id` of its messages).
    pub session_id: String,
    /// When the session lock expires unless renewed (`com.microsoft:locked-until-utc`).
    pub locked_until: SystemTime,
    /// This acceptance among the session's acceptances (each accept raises it).
    pub holder: u64,
}

impl QueueState {
    fn session_locked(&self, id: &str, now: SystemTime) -> bool {
        self.sessions
            .get(id)
            .and_then(|s| s.locked_until)
            .is_some_and(|until| until > now)
    }

    fn check_session(&self, id: &str, now: SystemTime) -> Result<()> {
        self.check_holder(id, None, now)
    }

    /// The session is locked, and by `holder` when given.
    fn check_holder(&self, id: &str, holder: Option<u64>, now: SystemTime) -> Result<()> {
        let held = holder.is_none_or(|h| self.sessions.get(id).is_some_and(|s| s.holder == h));
        if held && self.session_locked(id, now) {
            Ok(())
        } else {
            Err(Error::SessionLockLost {
                session_id: id.to_owned(),
            })
        }
    }

    /// Locks a session: the given one (even if it has no messages yet), or the session of the
    /// oldest receivable message whose session is not locked (`Ok(None)` when there is none).
    pub(crate) fn accept_session(
        &mut self,
        id: Option<&str>,
        now: SystemTime,
    ) -> Result<Option<SessionLock>> {
        let id = match id {
            Some(id) if self.session_locked(id, now) => {
                return Err(Error::SessionCannotBeLocked {
                    session_id: id.to_owned(),
                });
            }
            Some(id) => id.to_owned(),
            None => {
                if self.faults.paused {
                    return Ok(None);
                }
                let next = self.main.ready.iter().find_map(|seq| {
                    let sid = self.main.messages.get(seq)?.msg.session_id.as_deref()?;
                    (!self.session_locked(sid, now)).then(|| sid.to_owned())
                });
                match next {
                    Some(id) => id,
                    None => return Ok(None),
                }
            }
        };
        let locked_until = now + self.props.lock_duration;
        let session = self.sessions.entry(id.clone()).or_default();
        session.locked_until = Some(locked_until);
        session.holder += 1;
        Ok(Some(SessionLock {
            session_id: id,
            locked_until,
            holder: session.holder,
        }))
    }

    /// Takes the next receivable message of a locked session (held by `holder` when given);
    /// its message lock ends with the session lock.
    pub(crate) fn take_from_session(
        &mut self,
        id: &str,
        holder: Option<u64>,
        mode: ReceiveMode,
        now: SystemTime,
    ) -> Result<Option<ReceivedMessage>> {
        self.check_holder(id, holder, now)?;
        if self.faults.paused {
            return Ok(None);
        }
        let until = self
            .sessions
            .get(id)
            .and_then(|s| s.locked_until)
            .unwrap_or(now);
        let Some(seq) = self.main.ready.iter().copied().find(|seq| {
            self.main
                .messages
                .get(seq)
                .is_some_and(|s| s.msg.session_id.as_deref() == Some(id))
        }) else {
            return Ok(None);
        };
        Ok(match mode {
            ReceiveMode::PeekLock => self.main.lock(
                seq,
                now,
                until.duration_since(now).unwrap_or(Duration::ZERO),
            ),
            ReceiveMode::ReceiveAndDelete => {
                let view = self.main.remove(seq).map(|s| s.view(false));
                self.counts.completed += 1;
                view
            }
        })
    }

    /// Renews a session lock and the locks of its locked messages.
    pub(crate) fn renew_session(&mut self, id: &str, now: SystemTime) -> Result<SystemTime> {
        self.check_session(id, now)?;
        let until = now + self.props.lock_duration;
        if let Some(s) = self.sessions.get_mut(id) {
            s.locked_until = Some(until);
        }
        self.set_session_message_locks(id, until);
        Ok(until)
    }

    /// Moves the lock expiry of every locked message of session `id` to `until`.
    fn set_session_message_locks(&mut self, id: &str, until: SystemTime) {
        let seqs: Vec<i64> = self
            .main
            .messages
            .values()
            .filter(|s| s.lock.is_some() && s.msg.session_id.as_deref() == Some(id))
            .map(|s| s.seq)
            .collect();
        for seq in seqs {
            if let Some(s) = self.main.messages.get_mut(&seq)
                && let Some(lock) = &mut s.lock
            {
                lock.until = until;
                self.main.due.insert((until, seq));
            }
        }
    }

    /// Releases a session lock (the receiver closed its link): any holder's, or only
    /// `holder`'s when given.
    ///
    /// The session's locked messages lose their locks with it (redelivered first, delivery
    /// count + 1), so the next holder gets them in order rather than after their locks run out.
    pub(crate) fn release_session(&mut self, id: &str, holder: Option<u64>, now: SystemTime) {
        let Some(s) = self.sessions.get_mut(id) else {
            return;
        };
        if holder.is_some_and(|h| s.holder != h) {
            return;
        }
        s.locked_until = None;
        self.dirty = true;
        self.set_session_message_locks(id, now);
        self.tick(now);
    }

    /// The session state (requires the session lock).
    pub(crate) fn session_state(&self, id: &str, now: SystemTime) -> Result<Option<Bytes>> {
        self.check_session(id, now)?;
        Ok(self.sessions.get(id).and_then(|s| s.state.clone()))
    }

    /// Sets the session state (requires the session lock).
    pub(crate) fn set_session_state(
        &mut self,
        id: &str,
        state: Option<Bytes>,
        now: SystemTime,
    ) -> Result<()> {
        self.check_session(id, now)?;
        if let Some(s) = self.sessions.get_mut(id) {
            s.state = state;
            s.state_updated = Some(now);
        }
        Ok(())
    }

    /// `get-message-sessions`: with `updated_after`, the sessions whose state was set after it;
    /// without, the sessions holding messages (not scheduled; oldest message first) or a state.
    pub(crate) fn session_ids(&self, updated_after: Option<SystemTime>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut push = |id: &String| {
            if !out.contains(id) {
                out.push(id.clone());
            }
        };
        if let Some(after) = updated_after {
            for (id, s) in &self.sessions {
                if s.state_updated.is_some_and(|t| t > after) {
                    push(id);
                }
            }
            out.sort();
            return out;
        }
        for s in self.main.messages.values() {
            if s.scheduled_at.is_none()
                && let Some(id) = &s.msg.session_id
            {
                push(id);
            }
        }
        let mut with_state: Vec<&String> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.state.is_some())
            .map(|(id, _)| id)
            .collect();
        with_state.sort();
        for id in with_state {
            push(id);
        }
        out
    }

    /// The earliest session lock expiry after `now` (a waiting acceptor may get that session).
    pub(crate) fn next_session_expiry(&self, now: SystemTime) -> Option<SystemTime> {
        self.sessions
            .values()
            .filter_map(|s| s.locked_until)
            .filter(|t| *t > now)
            .min()
    }
}
