//! The store: SQLite in memory (driven on the run's one thread, so deterministically), wrapped
//! to fail as the plan says: outages (every `begin` fails, unavailable), failed commits
//! (nothing committed) and ambiguous commits (committed, then the connection "broke").
//!
//! A commit fault is held until the next commit, whichever transaction that is; the messages
//! it is pinned on are the ones whose effects that transaction holds at its commit (the
//! handler says so with [`FaultyTx::holds`]; a batch member rolled back to its savepoint no
//! longer counts), and the trace names the transaction and those messages.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_inbox::{
    DelegateTx, ErrorKind, Savepoint, SqliteStore, SqliteTx, Store, StoreError, StoreTx, Tx,
};
use tokio::time::Instant;

use crate::Trace;

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
}

impl Store for FaultyStore {
    type Tx = FaultyTx;

    async fn begin(&self) -> Result<FaultyTx, StoreError> {
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
        Ok(FaultyTx {
            inner: self.inner.begin().await?,
            faults: self.faults.clone(),
            trace: self.trace.clone(),
            number,
            ids: Vec::new(),
            marks: Vec::new(),
        })
    }
}

/// A [`SqliteTx`] whose commit may fail as planned.
#[derive(Debug)]
pub struct FaultyTx {
    inner: SqliteTx,
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
    /// The SQLite transaction, for the handler's own statements.
    pub fn sqlite(&mut self) -> &mut SqliteTx {
        &mut self.inner
    }

    /// Notes that this transaction holds `id`'s effect.
    pub fn holds(&mut self, id: &str) {
        self.ids.push(id.to_owned());
    }
}

/// Only the savepoints (tracked with the ids they hold) and the commit (the planned faults)
/// differ from the SQLite transaction; the rest is passed on.
impl DelegateTx for FaultyTx {
    type Inner = SqliteTx;

    fn inner(&mut self) -> &mut SqliteTx {
        &mut self.inner
    }

    fn into_inner(self) -> SqliteTx {
        self.inner
    }

    async fn savepoint(&mut self) -> Result<Savepoint, StoreError> {
        let savepoint = self.inner.savepoint().await?;
        self.marks.push((savepoint.id(), self.ids.len()));
        Ok(savepoint)
    }

    async fn rollback_to(&mut self, savepoint: Savepoint) -> Result<(), StoreError> {
        let id = savepoint.id();
        self.inner.rollback_to(savepoint).await?;
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
        self.inner.release(savepoint).await?;
        // Released: its effects stay in the transaction; it and the savepoints after it end.
        if let Some(at) = self.marks.iter().position(|(mark, _)| *mark == id) {
            self.marks.truncate(at);
        }
        Ok(())
    }

    async fn commit(self) -> Result<(), StoreError> {
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
            None => self.inner.commit().await,
            Some(false) => {
                self.inner.rollback().await?;
                Err(StoreError::of_kind(
                    ErrorKind::Contention,
                    "simulated commit failure: deadlock victim",
                ))
            }
            Some(true) => {
                self.inner.commit().await?;
                Err(StoreError::of_kind(
                    ErrorKind::Connection,
                    "simulated ambiguous commit: the connection broke after COMMIT",
                ))
            }
        }
    }
}
