//! The store as the outbox relay and retention see it: leased claims, marks, the backlog,
//! batched deletes.

use std::future::Future;
use std::time::{Duration, SystemTime};

use super::{INBOX_PROPERTY_PREFIX, Message, OutboxMessage, StoreError};

/// A relay's hold on the outbox rows it claimed: a token no other claim shares and the time the
/// hold runs out.
///
/// Rows stay leased after a relay dies; once `until` has passed, any relay may claim them
/// again and publish them again under the same message id (at most a duplicate, never a loss).
///
/// # Examples
/// ```
/// use std::time::{Duration, SystemTime};
/// use sb_inbox::ports::OutboxLease;
/// let now = SystemTime::now();
/// let lease = OutboxLease::new(now + Duration::from_secs(60));
/// assert_ne!(lease.token(), OutboxLease::new(now).token());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxLease {
    token: String,
    until: SystemTime,
}

impl OutboxLease {
    /// A lease with a fresh token, held until `until`.
    pub fn new(until: SystemTime) -> Self {
        OutboxLease {
            token: uuid::Uuid::new_v4().to_string(),
            until,
        }
    }

    /// The claim token (36 characters) written on every row of the claim.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// When the rows become claimable again.
    pub fn until(&self) -> SystemTime {
        self.until
    }
}

/// One outbox row a relay claimed.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    /// The row's identity (the order of writing).
    pub id: i64,
    /// The message, with the id fixed when the row was written.
    pub message: OutboxMessage,
    /// Claims of this row so far, this one included. Above 1, an earlier claim ended without
    /// the row being marked dispatched (a relay stopped, a lease ran out, a send failed): the
    /// message may have reached the broker already.
    pub attempts: u32,
    /// When the row was written (the database's clock).
    pub created_at: SystemTime,
}

impl OutboxRow {
    /// True when an earlier claim may have published this row already.
    pub fn is_retry(&self) -> bool {
        self.attempts > 1
    }

    /// The message to publish: the row's fields under its stable message id, without the
    /// inbox's own properties ([`INBOX_PROPERTY_PREFIX`]): they belong to the hop that wrote
    /// the row, and the next consumer would key its inbox on a copied logical id. The
    /// scheduled enqueue time is not part of it: the relay hands it to the sender beside it.
    pub fn to_message(&self) -> Message {
        let message = &self.message;
        Message {
            message_id: Some(message.message_id.clone()),
            correlation_id: message.correlation_id.clone(),
            subject: message.subject.clone(),
            content_type: message.content_type.clone(),
            session_id: message.session_id.clone(),
            application_properties: without_inbox_properties(&message.application_properties),
            body: message.body.clone().into(),
            partition_key: message.partition_key.clone(),
            time_to_live: message.time_to_live,
            to: message.to.clone(),
            reply_to: message.reply_to.clone(),
        }
    }
}

/// `properties` without the inbox's own ([`INBOX_PROPERTY_PREFIX`]).
pub(crate) fn without_inbox_properties(
    properties: &std::collections::BTreeMap<String, super::PropertyValue>,
) -> std::collections::BTreeMap<String, super::PropertyValue> {
    properties
        .iter()
        .filter(|(name, _)| !name.starts_with(INBOX_PROPERTY_PREFIX))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect()
}

/// A claimed row whose columns do not read back as a message: a row edited by hand, or one an
/// older version wrote (a NaN property was stored as `null` before `append_outbox` refused
/// it). The relay quarantines it (releases it with `reason` as its `last_error` and a growing
/// backoff) and publishes the rest of the claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnreadableRow {
    /// The row's identity.
    pub id: i64,
    /// Its destination and session id, when those columns read: the row holds back the later
    /// rows of its ordering key as a failed send does.
    pub key: Option<(String, Option<String>)>,
    /// Claims of this row so far, this one included.
    pub attempts: u32,
    /// Why it does not read, for `last_error` (no row values).
    pub reason: String,
}

/// What one claim leased: the rows that read as messages, in write order, and those that did
/// not.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutboxClaim {
    /// Rows to publish, in id (write) order.
    pub rows: Vec<OutboxRow>,
    /// Rows leased that do not read as messages, in id order.
    pub unreadable: Vec<UnreadableRow>,
}

impl OutboxClaim {
    /// Rows leased in all.
    pub fn len(&self) -> usize {
        self.rows.len() + self.unreadable.len()
    }

    /// True when the claim leased nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Rows waiting to be published.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxBacklog {
    /// Rows not marked dispatched (leased or not).
    pub pending: u64,
    /// When the oldest of them was written (the database's clock); `None` when there are none.
    pub oldest: Option<SystemTime>,
}

impl OutboxBacklog {
    /// How long the oldest pending row has waited at `now` (zero without a backlog, or when the
    /// database's clock is ahead of `now`).
    pub fn oldest_age(&self, now: SystemTime) -> Duration {
        self.oldest
            .and_then(|oldest| now.duration_since(oldest).ok())
            .unwrap_or(Duration::ZERO)
    }

    /// This reading as a [`BacklogSample`] taken at `now`.
    pub fn sample(&self, now: SystemTime) -> BacklogSample {
        BacklogSample {
            pending: self.pending,
            oldest_age: self.oldest_age(now),
        }
    }
}

/// The outbox backlog as sampled at one moment: what the relay keeps in its stats and the
/// outbox gauges report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct BacklogSample {
    /// Rows not dispatched yet.
    pub pending: u64,
    /// How long the oldest of them had waited when the sample was taken (zero when none).
    pub oldest_age: Duration,
}

/// The outbox as the relay sees it: short statements of their own, outside any consumer
/// transaction, that never wait for one.
///
/// Every time comes from the caller's clock: leases are written and compared in one clock, so
/// tests move lease expiry by passing a later `now`, and relays on several hosts only need
/// clocks that agree to within a small part of the lease.
pub trait OutboxStore: Send + Sync + 'static {
    /// Leases up to `limit` due rows, in the order they were written, and returns them. A row is
    /// due when it is not dispatched and not leased, or its lease ended at or before `now`. Rows
    /// another claim is leasing right now are skipped, not waited for (PostgreSQL
    /// `FOR UPDATE SKIP LOCKED`, SQL Server `UPDLOCK, ROWLOCK, READPAST`; SQLite has one
    /// writer, so claims take turns), so concurrent claims get disjoint rows.
    ///
    /// Each row is read on its own: one that does not read back as a message comes back in
    /// [`OutboxClaim::unreadable`], leased like the others, and never fails the claim.
    ///
    /// The relay asks for at most [`MAX_ROWS_PER_STATEMENT`] rows: a claim of more would lock
    /// enough rows for SQL Server to escalate to a table lock on the outbox, blocking every
    /// consumer transaction that writes to it. Other callers should keep to it too.
    fn claim_outbox(
        &self,
        now: SystemTime,
        lease: &OutboxLease,
        limit: usize,
    ) -> impl Future<Output = Result<OutboxClaim, StoreError>> + Send;

    /// Marks rows of `lease` dispatched at `at`; returns how many it marked. A row whose lease
    /// was taken over by another claim is left to that claim (and not counted).
    fn mark_dispatched(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        at: SystemTime,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Gives rows of `lease` back, claimable again from `due`. With a `failure` (kept on the row
    /// for operators) the attempt counts; without one the rows were not tried and the claim is
    /// undone. Returns how many rows it released.
    fn release_outbox(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        due: SystemTime,
        failure: Option<&str>,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Counts the rows not dispatched yet and finds the oldest.
    fn outbox_backlog(&self) -> impl Future<Output = Result<OutboxBacklog, StoreError>> + Send;
}

/// The most rows one outbox or inbox statement may touch: a retention batch's delete, a relay's
/// claim (and so the mark and release over its ids). Below the 5 000 locks on one object at
/// which SQL Server escalates a statement's row locks to a table lock, which would block every
/// consumer transaction that writes to the table.
pub const MAX_ROWS_PER_STATEMENT: usize = 4000;

/// Retention's deletes: one bounded batch per call, each its own short transaction, so locks
/// stay few (below SQL Server's lock escalation) and consumers keep running beside them.
///
/// Only proof that has outlived the replay horizon goes: inbox rows and dispatched outbox rows.
/// Aggregate versions stay (stale detection compares against them whatever their age) and so
/// do business keys (a producer may repeat a business request at any time, not only within the
/// broker's replay horizon).
pub trait RetentionStore: Send + Sync + 'static {
    /// Deletes up to `limit` (at most [`MAX_ROWS_PER_STATEMENT`]) inbox rows processed more than
    /// `older_than` ago on the database's clock (`processed_at` is the database's `now()` at
    /// insert, so the age is measured against the same clock: a worker whose clock is ahead
    /// would otherwise delete rows still inside the retention, and let a redelivery through);
    /// returns how many.
    fn delete_inbox_batch(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Deletes up to `limit` outbox rows dispatched before `before`; returns how many. Rows not
    /// dispatched are never deleted, however old.
    fn delete_dispatched_outbox_batch(
        &self,
        before: SystemTime,
        limit: usize,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}
