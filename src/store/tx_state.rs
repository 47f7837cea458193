//! What a store's transaction remembers between statements: its first error, which ends it
//! (every later statement and the commit are refused), and its live savepoints, the one way to
//! go on after an expected error.

use std::future::Future;

use crate::ports::{ErrorKind, Savepoint, StoreError, VersionCheck};

/// The bookkeeping every store's transaction shares; the SQL stays with each store.
#[derive(Debug, Default)]
pub(crate) struct TxState {
    /// The first error since the transaction began, or since the savepoint last rolled back
    /// to. Statements are refused while it is set, so it was raised after every live savepoint.
    failed: Option<StoreError>,
    /// Live savepoints, outermost first.
    live: Vec<u32>,
    /// Savepoints released but not yet released on the server (PostgreSQL and SQLite fold the
    /// `RELEASE` into the next `SAVEPOINT`, which keeps a per-message savepoint at one round
    /// trip; an unreleased savepoint changes nothing for the statements after it).
    pending_release: Vec<u32>,
    /// The last savepoint number given out: names are never reused within the transaction.
    last: u32,
}

impl TxState {
    /// Refuses a statement or the commit after a failure.
    pub(crate) fn check(&self) -> Result<(), StoreError> {
        match &self.failed {
            Some(first) => Err(StoreError::refused(first)),
            None => Ok(()),
        }
    }

    /// Runs one statement unless the transaction failed already, remembering its error (the
    /// asynchronous stores; SQLite's statements are synchronous).
    #[cfg(any(feature = "postgres", feature = "mssql"))]
    pub(crate) async fn run<T>(
        &mut self,
        statement: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.check()?;
        self.record(statement.await)
    }

    /// Remembers the first error of `result` and passes it on.
    pub(crate) fn record<T>(&mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(error) = &result
            && self.failed.is_none()
        {
            self.failed = Some(error.clone());
        }
        result
    }

    /// The next savepoint, refused after a failure.
    pub(crate) fn next_savepoint(&mut self) -> Result<Savepoint, StoreError> {
        self.check()?;
        self.last += 1;
        Ok(Savepoint::new(self.last))
    }

    /// The database marked `savepoint`.
    pub(crate) fn marked(&mut self, savepoint: &Savepoint) {
        self.live.push(savepoint.id());
    }

    /// Where `savepoint` is in the live stack.
    fn position(&self, savepoint: &Savepoint) -> Result<usize, StoreError> {
        self.live
            .iter()
            .position(|id| *id == savepoint.id())
            .ok_or_else(|| {
                StoreError::of_kind(ErrorKind::Schema, format!(
                        "savepoint {} is not live in this transaction (already ended, or from another transaction)",
                        savepoint.name()
                    ),
                )
            })
    }

    /// Checks that `savepoint` can be rolled back to.
    pub(crate) fn rollback_target(&self, savepoint: &Savepoint) -> Result<(), StoreError> {
        self.position(savepoint).map(drop)
    }

    /// Records how rolling back to `savepoint` went. Done: the error raised after it is
    /// forgotten, and the savepoints marked after it are gone with it. Failed: the database
    /// ended more than the savepoint (a deadlock or `XACT_ABORT` rolls back the whole
    /// transaction), so the transaction stays failed and the caller sees the first error, to
    /// settle as that error says.
    pub(crate) fn rolled_back(
        &mut self,
        savepoint: &Savepoint,
        result: Result<(), StoreError>,
    ) -> Result<(), StoreError> {
        let Err(error) = result else {
            if let Ok(position) = self.position(savepoint) {
                self.live.truncate(position);
            }
            // Every pending release was marked after `savepoint` (releasing an earlier one
            // would have ended it): the rollback removed them on the server.
            self.pending_release.clear();
            self.failed = None;
            return Ok(());
        };
        tracing::warn!(%error, "Rolling back to a savepoint failed; the transaction stays failed.");
        match &self.failed {
            Some(first) => Err(StoreError::refused(first)),
            None => {
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    /// Ends `savepoint` keeping its work; `defer` queues the `RELEASE` for
    /// [`TxState::take_releases`].
    pub(crate) fn release(&mut self, savepoint: &Savepoint, defer: bool) -> Result<(), StoreError> {
        self.check()?;
        let position = self.position(savepoint)?;
        self.live.truncate(position);
        if defer {
            self.pending_release.push(savepoint.id());
        }
        Ok(())
    }

    /// The deferred releases, oldest first, as SQL names.
    #[cfg(any(feature = "postgres", feature = "sqlx-postgres", feature = "sqlite"))]
    pub(crate) fn take_releases(&mut self) -> impl Iterator<Item = String> + use<> {
        std::mem::take(&mut self.pending_release)
            .into_iter()
            .map(|id| Savepoint::new(id).name())
    }

    /// The standard SQL (PostgreSQL, SQLite) that marks `savepoint`, after the deferred
    /// releases.
    #[cfg(any(feature = "postgres", feature = "sqlx-postgres", feature = "sqlite"))]
    pub(crate) fn savepoint_sql(&mut self, savepoint: &Savepoint) -> String {
        let mut sql = String::new();
        for name in self.take_releases() {
            sql.push_str("RELEASE SAVEPOINT ");
            sql.push_str(&name);
            sql.push_str("; ");
        }
        sql.push_str("SAVEPOINT ");
        sql.push_str(&savepoint.name());
        sql
    }
}

/// The standard SQL (PostgreSQL, SQLite) that rolls back to `savepoint` and ends it: `ROLLBACK
/// TO` keeps the savepoint, and a batch of per-message savepoints must not pile up.
#[cfg(any(feature = "postgres", feature = "sqlx-postgres", feature = "sqlite"))]
pub(crate) fn rollback_to_sql(savepoint: &Savepoint) -> String {
    let name = savepoint.name();
    format!("ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
}

/// The verdict of an aggregate-version upsert that writes only a newer version: it wrote, so
/// the version advanced; it did not, so the row holds a version as new or newer, `current`
/// (read only then). No row after the upsert is the database's contradiction, not a stale
/// message.
pub(crate) async fn version_verdict(
    written: bool,
    current: impl Future<Output = Result<Option<i64>, StoreError>>,
) -> Result<VersionCheck, StoreError> {
    if written {
        return Ok(VersionCheck::Advanced);
    }
    let current = current.await?.ok_or_else(|| {
        StoreError::of_kind(
            ErrorKind::Unknown,
            "aggregate version row missing after upsert",
        )
    })?;
    Ok(VersionCheck::Stale { current })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(kind: ErrorKind) -> StoreError {
        StoreError::new(kind, Some("1".into()), None, "boom")
    }

    #[test]
    fn first_error_refuses_until_rolled_back_to_a_savepoint() {
        let mut state = TxState::default();
        let outer = state.next_savepoint().unwrap();
        state.marked(&outer);
        assert!(
            state
                .record::<()>(Err(error(ErrorKind::UniqueViolation)))
                .is_err()
        );
        state.record::<()>(Err(error(ErrorKind::Contention))).ok();
        let refused = state.check().unwrap_err();
        assert!(refused.is_refused());
        assert_eq!(
            refused.kind(),
            ErrorKind::UniqueViolation,
            "the first error"
        );
        assert!(state.next_savepoint().unwrap_err().is_refused());
        assert!(state.release(&outer, true).unwrap_err().is_refused());
        state.rollback_target(&outer).unwrap();
        state.rolled_back(&outer, Ok(())).unwrap();
        state.check().unwrap();
        assert!(state.live.is_empty());
        assert_eq!(
            state.rollback_target(&outer).unwrap_err().kind(),
            ErrorKind::Schema,
            "an ended savepoint is not live"
        );
    }

    #[test]
    fn nested_savepoints_get_fresh_names_and_end_together() {
        let mut state = TxState::default();
        let a = state.next_savepoint().unwrap();
        state.marked(&a);
        let b = state.next_savepoint().unwrap();
        state.marked(&b);
        assert_eq!(
            (a.name().as_str(), b.name().as_str()),
            ("sb_sp_1", "sb_sp_2")
        );
        state.release(&b, true).unwrap();
        let c = state.next_savepoint().unwrap();
        assert_eq!(state.take_releases().collect::<Vec<_>>(), ["sb_sp_2"]);
        state.marked(&c);
        assert_eq!(c.name(), "sb_sp_3", "never reused");
        // Releasing the outer savepoint ends the inner one too.
        state.release(&a, true).unwrap();
        assert!(state.live.is_empty());
        assert!(state.release(&c, true).is_err());
        assert_eq!(state.take_releases().collect::<Vec<_>>(), ["sb_sp_1"]);
    }

    #[test]
    fn a_failed_rollback_to_keeps_the_first_error() {
        let mut state = TxState::default();
        let a = state.next_savepoint().unwrap();
        state.marked(&a);
        state.record::<()>(Err(error(ErrorKind::Contention))).ok();
        let seen = state
            .rolled_back(&a, Err(error(ErrorKind::Unknown)))
            .unwrap_err();
        assert_eq!(seen.kind(), ErrorKind::Contention);
        assert!(state.check().is_err());
        // Without an earlier error the failed rollback itself is the first error.
        let mut state = TxState::default();
        let seen = state
            .rolled_back(&a, Err(error(ErrorKind::Unknown)))
            .unwrap_err();
        assert!(!seen.is_refused());
        assert_eq!(state.check().unwrap_err().kind(), ErrorKind::Unknown);
    }
}
