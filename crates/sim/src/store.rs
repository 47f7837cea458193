//! The store: SQLite in memory (driven on the run's one thread, so deterministically), wrapped
//! to fail as the plan says: outages (every `begin` fails, unavailable), failed commits
//! (nothing committed) and ambiguous commits (committed, then the connection "broke").
//!
//! A commit fault is held until the next commit, whichever transaction that is; the messages
//! it is pinned on are the ones whose effects that transaction holds at its commit (the
//! handler says so with [`FaultyTx::holds`]; a batch member rolled back to its savepoint no
//! longer counts), and the trace names the transaction and those messages.
//!
//! Each process (`crate::process`) has its own handle on the one database, which outlives it:
//! when the process dies its open transactions are rolled back and its handle stops answering.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use sb_inbox::worker::Ping;
use sb_inbox::{
    ErrorKind, InboxEntry, OutboxBacklog, OutboxClaim, OutboxLease, OutboxMessage, OutboxStore,
    RetentionStore, Savepoint, SqliteStore, SqliteTx, Store, StoreError, Tx, Verdict, VersionCheck,
};
use tokio::time::Instant;

use crate::Trace;
use crate::process::{Life, Slot};

/// The store faults in force.
#[derive(Debug, Default)]
pub struct StoreFaults {
    state: Mutex<FaultState>,
}

#[derive(Debug, Default)]
struct FaultState {
    outage_until: Option<Instant>,
    fail_commits: u32,
    ambiguous_commits: u32,
    /// Commits that failed or were ambiguous, for the trace.
    injected: u64,
    /// Transactions begun, for the trace's names of them.
    begun: u64,
    /// Per logical id: commits of a transaction holding its effect that were made to fail
    /// (or were ambiguous): a transient failure it may legitimately retry and exhaust.
    failed: std::collections::BTreeMap<String, u32>,
}

impl StoreFaults {
    fn state(&self) -> std::sync::MutexGuard<'_, FaultState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Every `begin` fails for `duration`.
    pub fn outage(&self, duration: Duration) {
        let until = Instant::now() + duration;
        let mut s = self.state();
        s.outage_until = Some(s.outage_until.map_or(until, |u| u.max(until)));
    }

    /// The next `n` commits fail.
    pub fn fail_commits(&self, n: u32) {
        self.state().fail_commits += n;
    }

    /// The next commit commits and then reports failure.
    pub fn ambiguous_commit(&self) {
        self.state().ambiguous_commits += 1;
    }

    /// True while an outage lasts.
    pub fn in_outage(&self) -> bool {
        self.state()
            .outage_until
            .is_some_and(|u| u > Instant::now())
    }

    /// Faults injected into commits so far.
    pub fn injected(&self) -> u64 {
        self.state().injected
    }

    /// Commits made to fail (or ambiguous) that held `id`'s effect.
    pub fn failed_commits(&self, id: &str) -> u32 {
        self.state().failed.get(id).copied().unwrap_or(0)
    }

    fn record_failed(&self, ids: &[String]) {
        let mut s = self.state();
        for id in ids {
            *s.failed.entry(id.clone()).or_default() += 1;
        }
    }

    fn commit_fault(&self) -> Option<bool> {
        let mut s = self.state();
        if s.fail_commits > 0 {
            s.fail_commits -= 1;
            s.injected += 1;
            return Some(false);
        }
        if s.ambiguous_commits > 0 {
            s.ambiguous_commits -= 1;
            s.injected += 1;
            return Some(true);
        }
        None
    }
}

/// [`SqliteStore`] with [`StoreFaults`].
#[derive(Debug, Clone)]
pub struct FaultyStore {
    /// The store underneath (the relay and the checks use it directly).
    pub inner: SqliteStore,
    /// Its faults.
    pub faults: Arc<StoreFaults>,
    /// Where an injected commit fault is recorded, with the transaction it hit.
    pub trace: Trace,
    /// The life of the process this handle belongs to.
    pub life: Life,
}

impl FaultyStore {
    /// The same database and faults, for the process living `life`.
    pub fn for_process(&self, life: Life) -> FaultyStore {
        FaultyStore {
            life,
            ..self.clone()
        }
    }

    /// Runs `op` for the process unless it died before or while it waits (for the connection,
    /// held by a transaction of another process); a dead process's requests never return.
    async fn fenced<T>(&self, op: impl Future<Output = T>) -> T {
        self.life.alive().await;
        tokio::select! {
            biased;
            () = self.life.died() => std::future::pending::<T>().await,
            result = op => result,
        }
    }
}

impl Store for FaultyStore {
    type Tx = FaultyTx;

    async fn begin(&self) -> Result<FaultyTx, StoreError> {
        self.life.alive().await;
        if self.faults.in_outage() {
            return Err(StoreError::of_kind(
                ErrorKind::Unavailable,
                "simulated outage: the database is unavailable",
            ));
        }
        let number = {
            let mut s = self.faults.state();
            s.begun += 1;
            s.begun
        };
        let inner = self.fenced(self.inner.begin()).await?;
        let slot: Slot = Arc::new(Mutex::new(Some(inner)));
        self.life.opened(&slot);
        Ok(FaultyTx {
            inner: slot,
            life: self.life.clone(),
            faults: self.faults.clone(),
            trace: self.trace.clone(),
            number,
            ids: Vec::new(),
            marks: Vec::new(),
        })
    }
}

// The relay's rows: fenced, but not subject to the planned store faults (which model the
// consumer's transactions).
impl OutboxStore for FaultyStore {
    async fn claim_outbox(
        &self,
        now: SystemTime,
        lease: &OutboxLease,
        limit: usize,
    ) -> Result<OutboxClaim, StoreError> {
        self.fenced(self.inner.claim_outbox(now, lease, limit))
            .await
    }

    async fn mark_dispatched(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        at: SystemTime,
    ) -> Result<u64, StoreError> {
        self.fenced(self.inner.mark_dispatched(lease, ids, at))
            .await
    }

    async fn release_outbox(
        &self,
        lease: &OutboxLease,
        ids: &[i64],
        due: SystemTime,
        failure: Option<&str>,
    ) -> Result<u64, StoreError> {
        self.fenced(self.inner.release_outbox(lease, ids, due, failure))
            .await
    }

    async fn outbox_backlog(&self) -> Result<OutboxBacklog, StoreError> {
        self.fenced(self.inner.outbox_backlog()).await
    }
}

// Retention's deletes and the worker's readiness probe: fenced as the relay's rows are.
impl RetentionStore for FaultyStore {
    async fn delete_inbox_batch(
        &self,
        older_than: Duration,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.fenced(self.inner.delete_inbox_batch(older_than, limit))
            .await
    }

    async fn delete_dispatched_outbox_batch(
        &self,
        before: SystemTime,
        limit: usize,
    ) -> Result<u64, StoreError> {
        self.fenced(self.inner.delete_dispatched_outbox_batch(before, limit))
            .await
    }
}

impl Ping for FaultyStore {
    fn ping(&self) -> std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + '_>> {
        Box::pin(self.fenced(self.inner.ping()))
    }
}

/// A [`SqliteTx`] whose commit may fail as planned, rolled back when its process dies.
#[derive(Debug)]
pub struct FaultyTx {
    /// Shared with the process's [`Life`], which takes it (rolling it back) at its death.
    inner: Slot,
    life: Life,
    faults: Arc<StoreFaults>,
    trace: Trace,
    /// The transaction's number in the run (the trace's `tx N`).
    number: u64,
    /// The logical ids whose effects this transaction holds.
    ids: Vec<String>,
    /// Per open savepoint: its number and how many of `ids` were held when it was taken, so
    /// that a rollback to it drops the ids held after it.
    marks: Vec<(u32, usize)>,
}

impl FaultyTx {
    /// The open transaction, while its process lives; never once it died (its death rolled
    /// the transaction back). Given back with [`FaultyTx::put`].
    async fn take(&self) -> SqliteTx {
        self.life.alive().await;
        let tx = self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match tx {
            Some(tx) => tx,
            None => std::future::pending().await,
        }
    }

    /// Gives the transaction back after a statement; rolls it back if the process died
    /// meanwhile.
    fn put(&self, tx: SqliteTx) {
        if self.life.is_dead() {
            drop(tx);
            return;
        }
        *self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tx);
    }

    /// Runs one of the handler's own statements ([`SqliteTx::execute`]).
    ///
    /// # Errors
    /// As [`SqliteTx::execute`].
    pub async fn execute(
        &mut self,
        sql: &str,
        params: impl rusqlite::Params,
    ) -> Result<usize, StoreError> {
        let mut tx = self.take().await;
        let result = tx.execute(sql, params);
        self.put(tx);
        result
    }

    /// Notes that this transaction holds `id`'s effect.
    pub fn holds(&mut self, id: &str) {
        self.ids.push(id.to_owned());
    }
}

impl Tx for FaultyTx {
    async fn insert_inbox(&mut self, consumer: &str, logical_id: &str) -> Result<(), StoreError> {
        let mut tx = self.take().await;
        let result = tx.insert_inbox(consumer, logical_id).await;
        self.put(tx);
        result
    }

    async fn insert_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        verdict: &Verdict,
    ) -> Result<(), StoreError> {
        let mut tx = self.take().await;
        let result = tx.insert_verdict(consumer, logical_id, verdict).await;
        self.put(tx);
        result
    }

    async fn inbox_entry(
        &mut self,
        consumer: &str,
        logical_id: &str,
    ) -> Result<Option<InboxEntry>, StoreError> {
        let mut tx = self.take().await;
        let result = tx.inbox_entry(consumer, logical_id).await;
        self.put(tx);
        result
    }

    async fn take_over_verdict(
        &mut self,
        consumer: &str,
        logical_id: &str,
        resubmission: i64,
    ) -> Result<bool, StoreError> {
        let mut tx = self.take().await;
        let result = tx
            .take_over_verdict(consumer, logical_id, resubmission)
            .await;
        self.put(tx);
        result
    }

    async fn claim_business_key(
        &mut self,
        consumer: &str,
        key: &str,
        logical_id: &str,
    ) -> Result<(), StoreError> {
        let mut tx = self.take().await;
        let result = tx.claim_business_key(consumer, key, logical_id).await;
        self.put(tx);
        result
    }

    async fn advance_version(
        &mut self,
        consumer: &str,
        aggregate: &str,
        version: i64,
    ) -> Result<VersionCheck, StoreError> {
        let mut tx = self.take().await;
        let result = tx.advance_version(consumer, aggregate, version).await;
        self.put(tx);
        result
    }

    async fn append_outbox(&mut self, message: &OutboxMessage) -> Result<(), StoreError> {
        let mut tx = self.take().await;
        let result = tx.append_outbox(message).await;
        self.put(tx);
        result
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let mut tx = self.take().await;
        let savepoint = tx.savepoint().await;
        self.put(tx);
        let savepoint = savepoint?;
        self.marks.push((savepoint.id(), self.ids.len()));
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        let id = savepoint.id();
        let mut tx = self.take().await;
        let result = tx.rollback_to(savepoint).await;
        self.put(tx);
        result?;
        // The effects written since the savepoint are undone: those messages' commits are no
        // longer this transaction's. The savepoint itself stays open (SQL), those after it end.
        if let Some(at) = self.marks.iter().position(|(mark, _)| *mark == id) {
            self.ids.truncate(self.marks[at].1);
            self.marks.truncate(at + 1);
        }
        Ok(())
    }

    async fn release(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        let id = savepoint.id();
        let mut tx = self.take().await;
        let result = tx.release(savepoint).await;
        self.put(tx);
        result?;
        // Released: its effects stay in the transaction; it and the savepoints after it end.
        if let Some(at) = self.marks.iter().position(|(mark, _)| *mark == id) {
            self.marks.truncate(at);
        }
        Ok(())
    }

    async fn bound_lock_waits(&mut self, limit: Duration) -> Result<(), StoreError> {
        let mut tx = self.take().await;
        let result = tx.bound_lock_waits(limit).await;
        self.put(tx);
        result
    }

    async fn commit(self) -> Result<(), StoreError> {
        let inner = self.take().await;
        let fault = self.faults.commit_fault();
        if let Some(ambiguous) = fault {
            self.faults.record_failed(&self.ids);
            self.trace.push(format!(
                "store: commit of tx {} {} (it held {:?})",
                self.number,
                if ambiguous {
                    "committed, answer lost"
                } else {
                    "failed"
                },
                self.ids
            ));
        }
        match fault {
            None => inner.commit().await,
            Some(false) => {
                inner.rollback().await?;
                Err(StoreError::of_kind(
                    ErrorKind::Contention,
                    "simulated commit failure: deadlock victim",
                ))
            }
            Some(true) => {
                inner.commit().await?;
                Err(StoreError::of_kind(
                    ErrorKind::Connection,
                    "simulated ambiguous commit: the connection broke after COMMIT",
                ))
            }
        }
    }

    async fn rollback(self) -> Result<(), StoreError> {
        self.take().await.rollback().await
    }
}
