//! Message storage of one queue or subscription: its active messages, its `$DeadLetterQueue`,
//! locks, timers, duplicate detection, fault hooks and counters. All of it sits behind one
//! mutex per entity (see [`crate::broker`]); nothing here awaits.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use uuid::Uuid;

use crate::config::EntityProperties;
use crate::error::{Error, Result};
use crate::message::{
    BrokerMessage, DEAD_LETTER_ERROR_DESCRIPTION, DEAD_LETTER_REASON, MAX_DELIVERY_COUNT_EXCEEDED,
    MessageState, Properties, PropertyValue, ReceiveMode, ReceivedMessage, TTL_EXPIRED,
};

/// How a locked message is settled.
#[derive(Debug, Clone)]
pub enum Settlement {
    /// Remove the message (AMQP `accepted`).
    Complete,
    /// Unlock for redelivery with delivery count + 1 (AMQP `modified{delivery-failed}`); the
    /// properties are merged into the message's application properties.
    Abandon {
        /// Properties to modify.
        properties_to_modify: Properties,
    },
    /// Set the message aside; only `receive_deferred` gets it (AMQP
    /// `modified{undeliverable-here}`).
    Defer {
        /// Properties to modify.
        properties_to_modify: Properties,
    },
    /// Move the message to the dead-letter subqueue (AMQP `rejected`).
    DeadLetter {
        /// `DeadLetterReason`.
        reason: Option<String>,
        /// `DeadLetterErrorDescription`.
        description: Option<String>,
        /// Further properties to modify.
        properties_to_modify: Properties,
    },
    /// Unlock without counting a delivery attempt (AMQP `released`), as Service Bus does: "Service
    /// Bus processes Release outcome and it doesn't increment delivery count"
    /// (<https://github.com/Azure/amqpnetlite/issues/342>).
    Release,
}

impl Settlement {
    /// Abandon without modifying properties.
    pub fn abandon() -> Self {
        Settlement::Abandon {
            properties_to_modify: Properties::new(),
        }
    }

    /// Defer without modifying properties.
    pub fn defer() -> Self {
        Settlement::Defer {
            properties_to_modify: Properties::new(),
        }
    }

    /// Dead-letter with a reason and description.
    pub fn dead_letter(reason: impl Into<String>, description: impl Into<String>) -> Self {
        Settlement::DeadLetter {
            reason: Some(reason.into()),
            description: Some(description.into()),
            properties_to_modify: Properties::new(),
        }
    }
}

/// Message counts and totals of a queue or subscription (or a topic's totals).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntityCounts {
    /// Receivable now: not locked, deferred or scheduled.
    pub active: usize,
    /// Locked by a peek-lock receiver (including locked deferred messages).
    pub locked: usize,
    /// Deferred and not locked.
    pub deferred: usize,
    /// Scheduled for later.
    pub scheduled: usize,
    /// In the `$DeadLetterQueue` subqueue (any state).
    pub dead_lettered: usize,
    /// Messages accepted into this entity (after duplicate detection and filtering).
    pub sent: u64,
    /// Sends dropped by duplicate detection.
    pub duplicates: u64,
    /// Messages completed or received in receive-and-delete mode (both subqueues).
    pub completed: u64,
    /// Messages that expired (dropped or dead-lettered).
    pub expired: u64,
    /// Messages moved to the dead-letter subqueue or forwarded from it, ever.
    pub dead_lettered_total: u64,
    /// Messages passed on by `ForwardTo` or `ForwardDeadLetteredMessagesTo`.
    pub forwarded: u64,
}

#[derive(Debug, Clone, Copy)]
struct Lock {
    token: Uuid,
    until: SystemTime,
}

#[derive(Debug, Clone)]
struct Stored {
    msg: BrokerMessage,
    seq: i64,
    enqueued_time: SystemTime,
    /// Failed delivery attempts (abandons and lock expiries).
    delivery_count: u32,
    expires_at: Option<SystemTime>,
    deferred: bool,
    scheduled_at: Option<SystemTime>,
    lock: Option<Lock>,
    dead_letter_source: Option<String>,
}

impl Stored {
    fn available(&self) -> bool {
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

    fn view(&self, with_lock: bool) -> ReceivedMessage {
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
struct Store {
    messages: BTreeMap<i64, Stored>,
    locks: HashMap<Uuid, i64>,
    /// Times at which a message may change state (lock expiry, schedule, TTL). Entries go
    /// stale when the message changes; processing re-checks the message.
    due: BTreeSet<(SystemTime, i64)>,
    /// Sequence numbers of receivable messages, in order.
    ready: BTreeSet<i64>,
}

impl Store {
    fn insert(&mut self, s: Stored, now: SystemTime) {
        let seq = s.seq;
        self.messages.insert(seq, s);
        self.push_due(seq, now);
        self.reindex(seq);
    }

    /// Registers the message's future timers. Past ones are not re-registered: the timer pass
    /// that popped them already handled them, and re-adding them would loop.
    fn push_due(&mut self, seq: i64, now: SystemTime) {
        let Some(s) = self.messages.get(&seq) else {
            return;
        };
        let times = [s.lock.map(|l| l.until), s.scheduled_at, s.expires_at];
        for t in times.into_iter().flatten().filter(|t| *t > now) {
            self.due.insert((t, seq));
        }
    }

    fn reindex(&mut self, seq: i64) {
        match self.messages.get(&seq) {
            Some(s) if s.available() => {
                self.ready.insert(seq);
            }
            _ => {
                self.ready.remove(&seq);
            }
        }
    }

    fn remove(&mut self, seq: i64) -> Option<Stored> {
        self.ready.remove(&seq);
        let s = self.messages.remove(&seq)?;
        if let Some(lock) = s.lock {
            self.locks.remove(&lock.token);
        }
        Some(s)
    }

    fn unlock(&mut self, seq: i64) -> Option<&mut Stored> {
        let s = self.messages.get_mut(&seq)?;
        if let Some(lock) = s.lock.take() {
            self.locks.remove(&lock.token);
        }
        Some(s)
    }

    fn locked_seq(&self, token: Uuid, now: SystemTime) -> Result<i64> {
        let lost = Error::LockLost { lock_token: token };
        let seq = *self.locks.get(&token).ok_or(lost)?;
        match self.messages.get(&seq).and_then(|s| s.lock) {
            Some(lock) if lock.until > now => Ok(seq),
            _ => Err(Error::LockLost { lock_token: token }),
        }
    }

    fn lock(&mut self, seq: i64, now: SystemTime, duration: Duration) -> Option<ReceivedMessage> {
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

/// Duplicate detection history: message ids seen within the window.
#[derive(Debug, Default)]
pub(crate) struct DupWindow {
    seen: HashMap<String, SystemTime>,
    order: VecDeque<(SystemTime, String)>,
}

impl DupWindow {
    /// Records `id`; returns true when it was already seen within `window`.
    pub(crate) fn is_duplicate(&mut self, id: &str, now: SystemTime, window: Duration) -> bool {
        while let Some((t, old)) = self.order.front() {
            let age = now.duration_since(*t).unwrap_or(Duration::ZERO);
            if age < window {
                break;
            }
            if self.seen.get(old) == Some(t) {
                self.seen.remove(old);
            }
            self.order.pop_front();
        }
        if self.seen.contains_key(id) {
            return true;
        }
        self.seen.insert(id.to_owned(), now);
        self.order.push_back((now, id.to_owned()));
        false
    }
}

/// Injected faults of one queue or subscription (both subqueues).
#[derive(Debug, Default)]
pub(crate) struct Faults {
    pub(crate) paused: bool,
    pub(crate) refuse_renewals: u32,
    pub(crate) refuse_dispositions: u32,
    pub(crate) delay_dispositions: u32,
    pub(crate) disposition_delay: Duration,
    pub(crate) undecodable_deliveries: u32,
}

impl Faults {
    /// Consumes one disposition fault: a refusal, or a delay to wait before settling.
    pub(crate) fn before_disposition(&mut self) -> Result<Option<Duration>> {
        if self.refuse_dispositions > 0 {
            self.refuse_dispositions -= 1;
            return Err(Error::Refused {
                operation: "disposition",
            });
        }
        if self.delay_dispositions > 0 {
            self.delay_dispositions -= 1;
            return Ok(Some(self.disposition_delay));
        }
        Ok(None)
    }
}

/// The mutable state of a queue or subscription.
#[derive(Debug)]
pub(crate) struct QueueState {
    path: String,
    props: EntityProperties,
    /// Subscriptions get sequence numbers from their topic; queues use this counter.
    pub(crate) next_seq: i64,
    main: Store,
    dlq: Store,
    pub(crate) dup: DupWindow,
    pub(crate) faults: Faults,
    pub(crate) counts: EntityCounts,
    /// Dead-lettered messages to pass to `ForwardDeadLetteredMessagesTo` once unlocked.
    pub(crate) forwards: Vec<BrokerMessage>,
    /// Set when a message may have become receivable: waiting receivers must look again.
    pub(crate) dirty: bool,
    sessions: HashMap<String, Session>,
}

/// A message session of a session-enabled queue or subscription.
#[derive(Debug, Default)]
struct Session {
    locked_until: Option<SystemTime>,
    /// Which acceptance holds the lock: raised by every accept, so a link that lost the
    /// session (its lock expired and another receiver took it) can neither take messages nor
    /// release the newer holder's lock.
    holder: u64,
    state: Option<Bytes>,
    /// When the state was last set (`get-message-sessions` with `last-updated-time`).
    state_updated: Option<SystemTime>,
}

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

    fn store(&mut self, dlq: bool) -> &mut Store {
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
    fn fail_delivery(&mut self, seq: i64, now: SystemTime) {
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
    fn check_expiry(&mut self, seq: i64, now: SystemTime) {
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

    fn dead_letter(
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

    /// Current counts.
    pub(crate) fn counts(&self) -> EntityCounts {
        let mut c = self.counts;
        for s in self.main.messages.values() {
            if s.lock.is_some() {
                c.locked += 1;
            } else if s.scheduled_at.is_some() {
                c.scheduled += 1;
            } else if s.deferred {
                c.deferred += 1;
            } else {
                c.active += 1;
            }
        }
        c.dead_lettered = self.dlq.messages.len();
        c
    }

    /// Counts of the dead-letter subqueue alone (as if it were an entity).
    pub(crate) fn dlq_counts(&self) -> EntityCounts {
        let mut c = EntityCounts {
            sent: self.counts.dead_lettered_total,
            ..EntityCounts::default()
        };
        for s in self.dlq.messages.values() {
            if s.lock.is_some() {
                c.locked += 1;
            } else if s.deferred {
                c.deferred += 1;
            } else {
                c.active += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_window_slides() {
        let t0 = SystemTime::UNIX_EPOCH;
        let w = Duration::from_secs(10);
        let mut d = DupWindow::default();
        assert!(!d.is_duplicate("a", t0, w));
        assert!(d.is_duplicate("a", t0 + Duration::from_secs(9), w));
        assert!(!d.is_duplicate("b", t0 + Duration::from_secs(9), w));
        assert!(!d.is_duplicate("a", t0 + Duration::from_secs(10), w));
        assert!(d.is_duplicate("b", t0 + Duration::from_secs(10), w));
    }

    #[test]
    fn faults_refuse_before_delaying() {
        let mut f = Faults {
            refuse_dispositions: 1,
            delay_dispositions: 1,
            disposition_delay: Duration::from_secs(1),
            ..Faults::default()
        };
        assert!(matches!(f.before_disposition(), Err(Error::Refused { .. })));
        assert_eq!(
            f.before_disposition().unwrap(),
            Some(Duration::from_secs(1))
        );
        assert_eq!(f.before_disposition().unwrap(), None);
    }
}
