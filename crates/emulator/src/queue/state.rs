//! The state of one queue or subscription ([`QueueState`]): both subqueues, enqueueing, the
//! timer pass (lock expiry, scheduled messages, TTL) and dead-lettering.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use super::session::Session;
use super::store::{Store, Stored};
use super::{DupWindow, EntityCounts, Faults};
use crate::config::EntityProperties;
use crate::message::{
    BrokerMessage, DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, MAX_DELIVERY_COUNT_EXCEEDED,
    Properties, PropertyValue, TTL_EXPIRED,
};

/// The mutable state of a queue or subscription.
#[derive(Debug)]
pub(crate) struct QueueState {
    pub(super) path: String,
    pub(crate) props: EntityProperties,
    /// Subscriptions get sequence numbers from their topic; queues use this counter.
    pub(crate) next_seq: i64,
    pub(super) main: Store,
    pub(super) dlq: Store,
    pub(crate) dup: DupWindow,
    pub(crate) faults: Faults,
    pub(crate) counts: EntityCounts,
    /// Dead-lettered messages to pass to `ForwardDeadLetteredMessagesTo` once unlocked.
    pub(crate) forwards: Vec<BrokerMessage>,
    /// Set when a message may have become receivable: waiting receivers must look again.
    pub(crate) dirty: bool,
    pub(super) sessions: HashMap<String, Session>,
}

impl QueueState {
    pub(crate) fn new(path: String, props: EntityProperties) -> Self {
        QueueState {
            path,
            props,
            next_seq: 1,
            main: Store::default(),
            dlq: Store::default(),
            dup: DupWindow::default(),
            faults: Faults::default(),
            counts: EntityCounts::default(),
            forwards: Vec::new(),
            dirty: false,
            sessions: HashMap::new(),
        }
    }

    /// Current counts.
    pub(crate) fn counts(&self) -> EntityCounts {
        EntityCounts::of(self.counts, &self.main, &self.dlq)
    }

    /// Counts of the dead-letter subqueue alone (as if it were an entity).
    pub(crate) fn dlq_counts(&self) -> EntityCounts {
        EntityCounts::of_dlq(self.counts.dead_lettered_total, &self.dlq)
    }

    pub(super) fn store(&mut self, dlq: bool) -> &mut Store {
        if dlq { &mut self.dlq } else { &mut self.main }
    }

    /// Stores a message sent (or forwarded, or fanned out) to this entity.
    ///
    /// `ttl_cap` is the topic's `DefaultMessageTimeToLive` for subscriptions.
    pub(crate) fn enqueue(
        &mut self,
        mut msg: BrokerMessage,
        seq: i64,
        now: SystemTime,
        ttl_cap: Option<Duration>,
    ) {
        let mut ttl = self.props.default_message_time_to_live;
        for cap in [msg.time_to_live, ttl_cap].into_iter().flatten() {
            ttl = ttl.min(cap);
        }
        let scheduled_at = msg.scheduled_enqueue_time.filter(|t| *t > now);
        let enqueued_time = scheduled_at.unwrap_or(now);
        msg.scheduled_enqueue_time = scheduled_at;
        let stored = Stored {
            msg,
            seq,
            enqueued_time,
            delivery_count: 0,
            expires_at: enqueued_time.checked_add(ttl),
            deferred: false,
            scheduled_at,
            lock: None,
            dead_letter_source: None,
        };
        self.counts.sent += 1;
        self.dirty |= stored.available();
        self.main.insert(stored, now);
    }

    /// Processes every timer due at `now`: lock expiry (redelivery with delivery count + 1, or
    /// dead-lettering at `MaxDeliveryCount`), scheduled messages becoming active, and TTL.
    pub(crate) fn tick(&mut self, now: SystemTime) {
        while let Some(&(t, seq)) = self.main.due.first() {
            if t > now {
                break;
            }
            self.main.due.pop_first();
            let Some(s) = self.main.messages.get_mut(&seq) else {
                continue;
            };
            if let Some(at) = s.scheduled_at.filter(|at| *at <= now) {
                s.scheduled_at = None;
                s.msg.scheduled_enqueue_time = None;
                s.enqueued_time = at;
            }
            if s.lock.is_some_and(|l| l.until <= now) {
                self.fail_delivery(seq, now);
            } else {
                self.check_expiry(seq, now);
            }
        }
        while let Some(&(t, seq)) = self.dlq.due.first() {
            if t > now {
                break;
            }
            self.dlq.due.pop_first();
            // Dead-lettered messages never expire and are never dead-lettered again.
            let expired = self
                .dlq
                .messages
                .get(&seq)
                .and_then(|s| s.lock)
                .is_some_and(|l| l.until <= now);
            if expired && let Some(s) = self.dlq.unlock(seq) {
                s.delivery_count += 1;
                self.dlq.reindex(seq);
                self.dirty = true;
            }
        }
    }

    /// Unlocks after a failed attempt (abandon or lock expiry): delivery count + 1, then
    /// dead-letter at `MaxDeliveryCount`, else make it receivable again.
    pub(super) fn fail_delivery(&mut self, seq: i64, now: SystemTime) {
        let max = self.props.max_delivery_count;
        let Some(s) = self.main.unlock(seq) else {
            return;
        };
        s.delivery_count += 1;
        if s.delivery_count >= max {
            let count = s.delivery_count;
            if let Some(s) = self.main.remove(seq) {
                self.dead_letter(
                    s,
                    Some(MAX_DELIVERY_COUNT_EXCEEDED.to_owned()),
                    Some(format!(
                        "Message could not be consumed after {count} delivery attempts."
                    )),
                    now,
                );
            }
            return;
        }
        self.check_expiry(seq, now);
    }

    /// Expires an unlocked, active or deferred message whose TTL has passed; else reindexes it.
    pub(super) fn check_expiry(&mut self, seq: i64, now: SystemTime) {
        let Some(s) = self.main.messages.get(&seq) else {
            return;
        };
        let expired =
            s.lock.is_none() && s.scheduled_at.is_none() && s.expires_at.is_some_and(|e| e <= now);
        if !expired {
            self.dirty |= s.available();
            self.main.reindex(seq);
            self.main.push_due(seq, now);
            return;
        }
        let Some(s) = self.main.remove(seq) else {
            return;
        };
        self.counts.expired += 1;
        if self.props.dead_lettering_on_message_expiration {
            self.dead_letter(
                s,
                Some(TTL_EXPIRED.to_owned()),
                Some("The message expired and was dead lettered.".to_owned()),
                now,
            );
        } else {
            tracing::debug!(entity = %self.path, sequence_number = seq, "Expired message dropped.");
        }
    }

    pub(super) fn dead_letter(
        &mut self,
        mut s: Stored,
        reason: Option<String>,
        description: Option<String>,
        now: SystemTime,
    ) {
        let mut props = Properties::new();
        if let Some(r) = reason {
            props.insert(DEAD_LETTER_REASON.to_owned(), PropertyValue::String(r));
        }
        if let Some(d) = description {
            props.insert(
                DEAD_LETTER_ERROR_DESCRIPTION.to_owned(),
                PropertyValue::String(d),
            );
        }
        s.msg.modify(props);
        s.lock = None;
        s.deferred = false;
        s.scheduled_at = None;
        s.expires_at = None;
        s.dead_letter_source = Some(self.path.clone());
        self.counts.dead_lettered_total += 1;
        tracing::debug!(entity = %self.path, sequence_number = s.seq, reason = ?s.msg.application_properties.get(DEAD_LETTER_REASON), "Message dead-lettered.");
        if self.props.forward_dead_lettered_messages_to.is_some() {
            self.counts.forwarded += 1;
            self.forwards.push(s.msg);
        } else {
            self.dirty = true;
            self.dlq.insert(s, now);
        }
    }

    /// The earliest pending timer of a subqueue (for waiting receivers).
    pub(crate) fn next_due(&self, dlq: bool) -> Option<SystemTime> {
        let store = if dlq { &self.dlq } else { &self.main };
        store.due.first().map(|(t, _)| *t)
    }

    /// Cancels scheduled messages; sequence numbers that are not scheduled here are ignored.
    pub(crate) fn cancel_scheduled(&mut self, seqs: &[i64]) -> usize {
        let mut removed = 0;
        for &seq in seqs {
            if self
                .main
                .messages
                .get(&seq)
                .is_some_and(|s| s.scheduled_at.is_some())
            {
                self.main.remove(seq);
                removed += 1;
            }
        }
        removed
    }
}
