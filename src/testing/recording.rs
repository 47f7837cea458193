//! [`RecordingTx`]: a [`Tx`] double that records what a handler wrote, with no database.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use crate::ports::{
    DuplicateScope, ErrorKind, InboxEntry, OutboxMessage, Savepoint, StoreError, StoreTx, Tx,
    Verdict, VersionCheck,
};
use crate::store::tx_state::TxState;

/// One [`Tx`] operation, to choose which one a [`RecordingTx`] fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum TxOp {
    /// [`StoreTx::insert_inbox`].
    InsertInbox,
    /// [`StoreTx::insert_verdict`].
    InsertVerdict,
    /// [`StoreTx::inbox_entry`].
    InboxEntry,
    /// [`StoreTx::take_over_verdict`].
    TakeOverVerdict,
    /// [`Tx::claim_business_key`].
    ClaimBusinessKey,
    /// [`Tx::advance_version`].
    AdvanceVersion,
    /// [`Tx::append_outbox`].
    AppendOutbox,
    /// [`StoreTx::commit`].
    Commit,
    /// A custom operation recorded with [`RecordingTx::record`] under this name: a method of
    /// the service's own extension trait.
    Custom(&'static str),
}

/// What a [`RecordingTx`] holds: the rows a handler wrote, in order.
#[derive(Debug, Clone, Default, PartialEq)]
struct Rows {
    inbox: Vec<(String, String)>,
    /// The verdicts among `inbox`'s rows.
    verdicts: BTreeMap<(String, String), Verdict>,
    business_keys: Vec<(String, String, String)>,
    versions: BTreeMap<(String, String), i64>,
    outbox: Vec<OutboxMessage>,
    custom: Vec<(&'static str, String)>,
}

/// A [`Tx`] that records inbox claims, business keys, aggregate versions and outbox rows in
/// memory, behaves as the stores do (a key claimed twice is a duplicate, an older version is
/// stale, the first error ends the transaction, savepoints undo), and can be told to fail.
///
/// For handler unit tests with [`super::ContextBuilder`]: the test reads what the handler wrote
/// before (or instead of) committing. It checks the handler's logic, not its SQL: a handler's
/// own statements on a real store's transaction (`PgTx`, `SqliteTx`) need that store.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use sb_inbox::testing::{RecordingTx, TxOp};
/// use sb_inbox::{DuplicateScope, ErrorKind, StoreError, Tx, VersionCheck};
///
/// let mut tx = RecordingTx::new().with_claimed_key("billing", "invoice:7");
/// let again = tx.claim_business_key("billing", "invoice:7", "m-2").await.unwrap_err();
/// assert_eq!(again.kind(), ErrorKind::Duplicate(DuplicateScope::BusinessKey));
///
/// let mut tx = RecordingTx::new().with_version("billing", "order:1", 5);
/// let check = tx.advance_version("billing", "order:1", 4).await.unwrap();
/// assert_eq!(check, VersionCheck::Stale { current: 5 });
///
/// let mut tx = RecordingTx::new()
///     .fail_on(TxOp::AppendOutbox, StoreError::of_kind(ErrorKind::Contention, "deadlock"));
/// # let message = sb_inbox::OutboxMessage::new("events", "e.v1", Vec::new());
/// assert!(tx.append_outbox(&message).await.is_err());
/// assert!(tx.outbox().is_empty());
/// # }
/// ```
#[derive(Debug, Default)]
pub struct RecordingTx {
    rows: Rows,
    failures: BTreeMap<TxOp, VecDeque<StoreError>>,
    state: TxState,
    // The rows as they were at each live savepoint, by savepoint id.
    marks: Vec<(u32, Rows)>,
    lock_wait_bound: Option<Duration>,
}

impl RecordingTx {
    /// An empty transaction over empty tables.
    pub fn new() -> Self {
        RecordingTx::default()
    }

    /// A business key claimed before this transaction (by an earlier message): claiming it
    /// again is a [`DuplicateScope::BusinessKey`] duplicate.
    #[must_use]
    pub fn with_claimed_key(mut self, consumer: &str, key: &str) -> Self {
        self.rows
            .business_keys
            .push((consumer.to_owned(), key.to_owned(), String::new()));
        self
    }

    /// An aggregate version stored before this transaction.
    #[must_use]
    pub fn with_version(mut self, consumer: &str, aggregate: &str, version: i64) -> Self {
        self.rows
            .versions
            .insert((consumer.to_owned(), aggregate.to_owned()), version);
        self
    }

    /// Makes the next call of `op` fail with `error` (call again to fail later calls too, in
    /// order). The failure ends the transaction as a store's would.
    #[must_use]
    pub fn fail_on(mut self, op: TxOp, error: StoreError) -> Self {
        self.failures.entry(op).or_default().push_back(error);
        self
    }

    /// The inbox rows inserted, as `(consumer, logical id)`.
    pub fn inbox(&self) -> &[(String, String)] {
        &self.rows.inbox
    }

    /// The business keys claimed in this transaction (not those given by
    /// [`RecordingTx::with_claimed_key`]), in order.
    pub fn business_keys(&self) -> Vec<&str> {
        self.rows
            .business_keys
            .iter()
            .filter(|(_, _, id)| !id.is_empty())
            .map(|(_, key, _)| key.as_str())
            .collect()
    }

    /// The stored version of `aggregate` for `consumer`.
    pub fn version(&self, consumer: &str, aggregate: &str) -> Option<i64> {
        self.rows
            .versions
            .get(&(consumer.to_owned(), aggregate.to_owned()))
            .copied()
    }

    /// The outbox rows appended, in order.
    pub fn outbox(&self) -> &[OutboxMessage] {
        &self.rows.outbox
    }

    /// Records the custom operation `op` with `detail` (its arguments, as the test wants to
    /// read them), as a store would run a statement: refused after an earlier failure, failed
    /// when told to with [`RecordingTx::fail_on`]`(`[`TxOp::Custom`]`(op), …)` (ending the
    /// transaction), undone by [`Tx::rollback_to`] a savepoint marked before it.
    ///
    /// It is how a handler with SQL of its own is unit-tested without a database and without a
    /// wrapper: the service implements its own extension trait for `RecordingTx` (its trait,
    /// so the orphan rule allows it) with one `record` call per method.
    ///
    /// # Errors
    /// The failure given with [`RecordingTx::fail_on`], or the transaction's earlier failure.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use sb_inbox::testing::{RecordingTx, TxOp};
    /// use sb_inbox::{ErrorKind, StoreError, Tx};
    ///
    /// /// The service's own SQL, implemented for its store's transaction (`PgTx`) in the service.
    /// trait OrdersTx: Tx {
    ///     async fn insert_order(&mut self, id: &str, cents: i64) -> Result<(), StoreError>;
    /// }
    ///
    /// // In its tests: one line per method, no wrapper around the other `Tx` methods.
    /// impl OrdersTx for RecordingTx {
    ///     async fn insert_order(&mut self, id: &str, cents: i64) -> Result<(), StoreError> {
    ///         self.record("insert_order", format!("{id} {cents}"))
    ///     }
    /// }
    ///
    /// let mut tx = RecordingTx::new();
    /// tx.insert_order("o-1", 1250).await.unwrap();
    /// assert_eq!(tx.recorded("insert_order"), ["o-1 1250"]);
    ///
    /// let deadlock = StoreError::of_kind(ErrorKind::Contention, "deadlock");
    /// let mut tx = RecordingTx::new().fail_on(TxOp::Custom("insert_order"), deadlock);
    /// assert!(tx.insert_order("o-1", 1250).await.is_err());
    /// assert!(tx.recorded("insert_order").is_empty());
    /// # }
    /// ```
    pub fn record(
        &mut self,
        op: &'static str,
        detail: impl Into<String>,
    ) -> Result<(), StoreError> {
        self.begin_op(TxOp::Custom(op))?;
        self.rows.custom.push((op, detail.into()));
        Ok(())
    }

    /// The details of each [`RecordingTx::record`]ed `op`, in order.
    pub fn recorded(&self, op: &str) -> Vec<&str> {
        self.rows
            .custom
            .iter()
            .filter(|(name, _)| *name == op)
            .map(|(_, detail)| detail.as_str())
            .collect()
    }

    /// Every custom operation recorded, as `(op, detail)`, in order.
    pub fn operations(&self) -> &[(&'static str, String)] {
        &self.rows.custom
    }

    /// The bound given by [`StoreTx::bound_lock_waits`], if any.
    pub fn lock_wait_bound(&self) -> Option<Duration> {
        self.lock_wait_bound
    }

    /// Refuses after a failure, then fails if told to; the error ends the transaction.
    fn begin_op(&mut self, op: TxOp) -> Result<(), StoreError> {
        self.state.check()?;
        match self.failures.get_mut(&op).and_then(VecDeque::pop_front) {
            Some(error) => self.state.record(Err(error)),
            None => Ok(()),
        }
    }

    fn duplicate(scope: DuplicateScope, what: String) -> StoreError {
        StoreError::of_kind(ErrorKind::Duplicate(scope), what)
    }
}

impl Tx for RecordingTx {
    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        self.begin_op(TxOp::ClaimBusinessKey)?;
        if self
            .rows
            .business_keys
            .iter()
            .any(|(c, k, _)| c == consumer && k == key)
        {
            let error = Self::duplicate(
                DuplicateScope::BusinessKey,
                format!("business key {key} is claimed"),
            );
            return self.state.record(Err(error));
        }
        self.rows
            .business_keys
            .push((consumer.to_owned(), key.to_owned(), logical_id.to_owned()));
        Ok(())
    }

    async fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> Result<VersionCheck, StoreError> {
        self.begin_op(TxOp::AdvanceVersion)?;
        let stored = self
            .rows
            .versions
            .entry((consumer.to_owned(), aggregate.to_owned()))
            .or_insert(i64::MIN);
        if *stored >= version {
            return Ok(VersionCheck::Stale { current: *stored });
        }
        *stored = version;
        Ok(VersionCheck::Advanced)
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        self.begin_op(TxOp::AppendOutbox)?;
        self.rows.outbox.push(message.clone());
        Ok(())
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let savepoint = self.state.next_savepoint()?;
        self.state.marked(&savepoint);
        self.marks.push((savepoint.id(), self.rows.clone()));
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.rollback_target(&savepoint)?;
        if let Some(at) = self.marks.iter().position(|(id, _)| *id == savepoint.id()) {
            // Rows written after the mark are undone; later marks end with it.
            let mut ended = self.marks.split_off(at).into_iter();
            if let Some((_, rows)) = ended.next() {
                self.rows = rows;
            }
        }
        self.state.rolled_back(&savepoint, Ok(()))
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        self.state.release(&savepoint, false)?;
        if let Some(at) = self.marks.iter().position(|(id, _)| *id == savepoint.id()) {
            self.marks.truncate(at);
        }
        Ok(())
    }
}

impl StoreTx for RecordingTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        self.begin_op(TxOp::InsertInbox)?;
        let row = (consumer.to_owned(), logical_id.to_owned());
        if self.rows.inbox.contains(&row) {
            let error = Self::duplicate(
                DuplicateScope::Inbox,
                format!("inbox row ({consumer}, {logical_id}) exists"),
            );
            return self.state.record(Err(error));
        }
        self.rows.inbox.push(row);
        Ok(())
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        self.begin_op(TxOp::InsertVerdict)?;
        let row = (consumer.to_owned(), logical_id.to_owned());
        if self.rows.inbox.contains(&row) {
            let error = Self::duplicate(
                DuplicateScope::Inbox,
                format!("inbox row ({consumer}, {logical_id}) exists"),
            );
            return self.state.record(Err(error));
        }
        self.rows.inbox.push(row.clone());
        self.rows.verdicts.insert(row, verdict.clone());
        Ok(())
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        self.begin_op(TxOp::InboxEntry)?;
        let row = (consumer.to_owned(), logical_id.to_owned());
        if !self.rows.inbox.contains(&row) {
            return Ok(None);
        }
        Ok(Some(match self.rows.verdicts.get(&row) {
            Some(verdict) => InboxEntry::DeadLettered(verdict.clone()),
            None => InboxEntry::Processed,
        }))
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        self.begin_op(TxOp::TakeOverVerdict)?;
        let row = (consumer.to_owned(), logical_id.to_owned());
        let earlier = self
            .rows
            .verdicts
            .get(&row)
            .is_some_and(|verdict| verdict.resubmission < resubmission);
        if !earlier {
            return Ok(false);
        }
        self.rows.verdicts.remove(&row);
        self.rows.inbox.retain(|kept| *kept != row);
        Ok(true)
    }

    async fn bound_lock_waits(&mut self, limit: Duration) -> Result<(), StoreError> {
        self.state.check()?;
        self.lock_wait_bound = Some(limit);
        Ok(())
    }

    async fn commit(mut self) -> Result<(), StoreError> {
        self.begin_op(TxOp::Commit)
    }

    async fn rollback(self) -> Result<(), StoreError> {
        Ok(())
    }
}
