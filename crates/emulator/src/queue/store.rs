//! One subqueue's storage: messages by sequence number with their locks and timers, and the
//! indexes the operations need (receivable messages, locks by token, due times).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::message::{BrokerMessage, MessageState, ReceivedMessage};

#[derive(Debug, Clone, Copy)]
pub(super) struct Lock {
    pub(super) token: Uuid,
    pub(super) until: SystemTime,
}

#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) msg: BrokerMessage,
    pub(super) seq: i64,
    pub(super) enqueued_time: SystemTime,
    /// Failed delivery attempts (abandons and lock expiries).
    pub(super) delivery_count: u32,
    pub(super) expires_at: Option<SystemTime>,
    pub(super) deferred: bool,
    pub(super) scheduled_at: Option<SystemTime>,
    pub(super) lock: Option<Lock>,
    pub(super) dead_letter_source: Option<String>,
}

impl Stored {
    pub(super) fn available(&self) -> bool {
        !self.deferred && self.scheduled_at.is_none() && self.lock.is_none()
    }

    fn state(&self) -> MessageState {
        if self.scheduled_at.is_some() {
            MessageState::Scheduled
        } else if self.deferred {
            MessageState::Deferred
        } else {
            MessageState::Active
        }
    }

    pub(super) fn view(&self, with_lock: bool) -> ReceivedMessage {
        let lock = self.lock.filter(|_| with_lock);
        ReceivedMessage {
            message: self.msg.clone(),
            sequence_number: self.seq,
            enqueued_time: self.enqueued_time,
            delivery_count: self.delivery_count,
            lock_token: lock.map(|l| l.token),
            locked_until: lock.map(|l| l.until),
            state: self.state(),
            expires_at: self.expires_at,
            dead_letter_source: self.dead_letter_source.clone(),
        }
    }
}

/// One subqueue: messages by sequence number plus the indexes operations need.
#[derive(Debug, Default)]
pub(super) struct Store {
    pub(super) messages: BTreeMap<i64, Stored>,
    pub(super) locks: HashMap<Uuid, i64>,
    /// Times at which a message may change state (lock expiry, schedule, TTL). Entries go
    /// stale when the message changes; processing re-checks the message.
    pub(super) due: BTreeSet<(SystemTime, i64)>,
    /// Sequence numbers of receivable messages, in order.
    pub(super) ready: BTreeSet<i64>,
}

impl Store {
    pub(super) fn insert(&mut self, s: Stored, now: SystemTime) {
        let seq = s.seq;
        self.messages.insert(seq, s);
        self.push_due(seq, now);
        self.reindex(seq);
    }

    /// Registers the message's future timers. Past ones are not re-registered: the timer pass
    /// that popped them already handled them, and re-adding them would loop.
    pub(super) fn push_due(&mut self, seq: i64, now: SystemTime) {
        let Some(s) = self.messages.get(&seq) else {
            return;
        };
        let times = [s.lock.map(|l| l.until), s.scheduled_at, s.expires_at];
        for t in times.into_iter().flatten().filter(|t| *t > now) {
            self.due.insert((t, seq));
        }
    }

    pub(super) fn reindex(&mut self, seq: i64) {
        match self.messages.get(&seq) {
            Some(s) if s.available() => {
                self.ready.insert(seq);
            }
            _ => {
                self.ready.remove(&seq);
            }
        }
    }

    pub(super) fn remove(&mut self, seq: i64) -> Option<Stored> {
        self.ready.remove(&seq);
        let s = self.messages.remove(&seq)?;
        if let Some(lock) = s.lock {
            self.locks.remove(&lock.token);
        }
        Some(s)
    }

    pub(super) fn unlock(&mut self, seq: i64) -> Option<&mut Stored> {
        let s = self.messages.get_mut(&seq)?;
        if let Some(lock) = s.lock.take() {
            self.locks.remove(&lock.token);
        }
        Some(s)
    }

    pub(super) fn locked_seq(&self, token: Uuid, now: SystemTime) -> Result<i64> {
        let lost = Error::LockLost { lock_token: token };
        let seq = *self.locks.get(&token).ok_or(lost)?;
        match self.messages.get(&seq).and_then(|s| s.lock) {
            Some(lock) if lock.until > now => Ok(seq),
            _ => Err(Error::LockLost { lock_token: token }),
        }
    }

    pub(super) fn lock(
        &mut self,
        seq: i64,
        now: SystemTime,
        duration: Duration,
    ) -> Option<ReceivedMessage> {
        let s = self.messages.get_mut(&seq)?;
        let lock = Lock {
            token: Uuid::new_v4(),
            until: now + duration,
        };
        s.lock = Some(lock);
        let view = s.view(true);
        self.locks.insert(lock.token, seq);
        self.due.insert((lock.until, seq));
        self.ready.remove(&seq);
        Some(view)
    }
}
