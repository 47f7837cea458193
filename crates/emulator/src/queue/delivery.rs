//! What receivers do with a queue's messages: take (peek-lock or receive-and-delete), settle,
//! renew and expire locks, peek, and receive deferred messages.

use std::time::SystemTime;

use uuid::Uuid;

use super::{QueueState, Settlement};
use crate::error::{Error, Result};
use crate::message::{ReceiveMode, ReceivedMessage};

impl QueueState {
    /// Takes the next receivable message.
    pub(crate) fn take(
        &mut self,
        dlq: bool,
        mode: ReceiveMode,
        now: SystemTime,
    ) -> Option<ReceivedMessage> {
        if self.faults.paused {
            return None;
        }
        let lock_duration = self.props.lock_duration;
        let store = self.store(dlq);
        let seq = *store.ready.first()?;
        match mode {
            ReceiveMode::PeekLock => store.lock(seq, now, lock_duration),
            ReceiveMode::ReceiveAndDelete => {
                let view = store.remove(seq)?.view(false);
                self.counts.completed += 1;
                Some(view)
            }
        }
    }

    /// Settles a locked message by lock token.
    pub(crate) fn settle(
        &mut self,
        dlq: bool,
        token: Uuid,
        settlement: Settlement,
        now: SystemTime,
    ) -> Result<()> {
        let seq = self.store(dlq).locked_seq(token, now)?;
        match settlement {
            Settlement::Complete => {
                self.store(dlq).remove(seq);
                self.counts.completed += 1;
            }
            Settlement::Release => {
                let store = self.store(dlq);
                store.unlock(seq);
                store.reindex(seq);
                self.dirty = true;
                if !dlq {
                    self.check_expiry(seq, now);
                }
            }
            Settlement::Abandon {
                properties_to_modify,
            } => {
                let store = self.store(dlq);
                if let Some(s) = store.messages.get_mut(&seq) {
                    s.msg.modify(properties_to_modify);
                }
                if dlq {
                    if let Some(s) = store.unlock(seq) {
                        s.delivery_count += 1;
                    }
                    store.reindex(seq);
                    self.dirty = true;
                } else {
                    self.fail_delivery(seq, now);
                }
            }
            Settlement::Defer {
                properties_to_modify,
            } => {
                let store = self.store(dlq);
                if let Some(s) = store.unlock(seq) {
                    s.msg.modify(properties_to_modify);
                    s.deferred = true;
                }
                store.reindex(seq);
                store.push_due(seq, now);
            }
            Settlement::DeadLetter {
                reason,
                description,
                properties_to_modify,
            } => {
                if dlq {
                    return Err(Error::NotAllowed {
                        operation: "dead-letter",
                        entity: format!("{}/$DeadLetterQueue", self.path),
                        reason: "the message is already dead-lettered",
                    });
                }
                if let Some(mut s) = self.main.remove(seq) {
                    s.msg.modify(properties_to_modify);
                    self.dead_letter(s, reason, description, now);
                }
            }
        }
        Ok(())
    }

    /// Extends locks by the entity's lock duration.
    pub(crate) fn renew(
        &mut self,
        dlq: bool,
        tokens: &[Uuid],
        now: SystemTime,
    ) -> Result<Vec<SystemTime>> {
        if self.faults.refuse_renewals > 0 {
            self.faults.refuse_renewals -= 1;
            return Err(Error::LockLost {
                lock_token: tokens.first().copied().unwrap_or_default(),
            });
        }
        let until = now + self.props.lock_duration;
        let store = self.store(dlq);
        let seqs = tokens
            .iter()
            .map(|t| store.locked_seq(*t, now))
            .collect::<Result<Vec<_>>>()?;
        for seq in seqs {
            if let Some(s) = store.messages.get_mut(&seq)
                && let Some(lock) = &mut s.lock
            {
                lock.until = until;
                store.due.insert((until, seq));
            }
        }
        Ok(vec![until; tokens.len()])
    }

    /// Whether `token` still locks a message.
    pub(crate) fn is_locked(&self, dlq: bool, token: Uuid, now: SystemTime) -> bool {
        let store = if dlq { &self.dlq } else { &self.main };
        store.locked_seq(token, now).is_ok()
    }

    /// Fault hook: lets a lock expire now (the message is redelivered with delivery count + 1).
    pub(crate) fn expire_lock(&mut self, dlq: bool, token: Uuid, now: SystemTime) -> Result<()> {
        let store = self.store(dlq);
        let seq = store.locked_seq(token, now)?;
        if let Some(s) = store.messages.get_mut(&seq)
            && let Some(lock) = &mut s.lock
        {
            lock.until = now;
            store.due.insert((now, seq));
        }
        self.tick(now);
        Ok(())
    }

    /// Peeks messages from `from` on, in sequence order, without locking them.
    pub(crate) fn peek(
        &self,
        dlq: bool,
        from: i64,
        count: usize,
        include_scheduled: bool,
    ) -> Vec<ReceivedMessage> {
        let store = if dlq { &self.dlq } else { &self.main };
        store
            .messages
            .range(from..)
            .map(|(_, s)| s)
            .filter(|s| include_scheduled || s.scheduled_at.is_none())
            .take(count)
            .map(|s| s.view(false))
            .collect()
    }

    /// Receives deferred messages by sequence number.
    pub(crate) fn receive_deferred(
        &mut self,
        dlq: bool,
        seqs: &[i64],
        mode: ReceiveMode,
        now: SystemTime,
    ) -> Result<Vec<ReceivedMessage>> {
        let lock_duration = self.props.lock_duration;
        let store = self.store(dlq);
        for &seq in seqs {
            match store.messages.get(&seq) {
                Some(s) if s.deferred && s.lock.is_none() => {}
                _ => {
                    return Err(Error::MessageNotFound {
                        sequence_number: seq,
                    });
                }
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        for &seq in seqs {
            match mode {
                ReceiveMode::PeekLock => out.extend(self.store(dlq).lock(seq, now, lock_duration)),
                ReceiveMode::ReceiveAndDelete => {
                    out.extend(self.store(dlq).remove(seq).map(|s| s.view(false)));
                    self.counts.completed += 1;
                }
            }
        }
        Ok(out)
    }
}
