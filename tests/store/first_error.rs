//! Conformance cases for the transaction's first-error rule and its savepoints (issue 14,
//! finding 3): after a failed statement nothing else runs and nothing commits, whatever the
//! database did with the transaction; a savepoint is the way to go on after an expected error.

use sb_inbox::{DuplicateScope, ErrorKind, OutboxMessage, Store, StoreError, Tx};

use crate::support::Count;

fn outbox_message() -> OutboxMessage {
    OutboxMessage::new("d", "s.v1", b"{}".to_vec())
}

fn assert_refused(result: Result<(), StoreError>, first: ErrorKind) {
    let error = result.expect_err("refused after the first error");
    assert!(error.is_refused(), "{error}");
    assert_eq!(error.kind(), first, "{error}");
}

/// A business key claimed by an earlier, committed transaction.
async fn claimed<S: Store>(store: &S, key: &str) {
    let mut tx = store.begin().await.unwrap();
    tx.claim_business_key("c", key, "m-0").await.unwrap();
    tx.commit().await.unwrap();
}

/// The "catch the unique violation and carry on" handler: on PostgreSQL its later statements
/// and commit met an aborted transaction (and `COMMIT` answered `ROLLBACK` with success); on
/// SQL Server they ran outside the rolled-back transaction and autocommitted; on SQLite they
/// committed beside a failed statement. Now all are refused and nothing commits.
pub(crate) async fn a_failed_statement_refuses_the_rest_and_the_commit<S: Store + Count>(store: S) {
    claimed(&store, "k").await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    let first = tx.claim_business_key("c", "k", "m-1").await.unwrap_err();
    assert_eq!(
        first.kind(),
        ErrorKind::Duplicate(DuplicateScope::BusinessKey)
    );
    assert!(!first.is_refused());
    let duplicate = ErrorKind::Duplicate(DuplicateScope::BusinessKey);
    assert_refused(tx.append_outbox(&outbox_message()).await, duplicate);
    assert_refused(tx.insert_inbox("c", "m-2").await, duplicate);
    assert!(tx.savepoint().await.unwrap_err().is_refused());
    assert_refused(tx.commit().await, duplicate);
    assert_eq!(store.count("sb_inbox").await.unwrap(), 0);
    assert_eq!(store.count("sb_outbox").await.unwrap(), 0);
    // The refused transaction was rolled back and its connection is fine.
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

/// Insert, and on a unique violation go another way: the documented savepoint pattern.
pub(crate) async fn a_savepoint_tolerates_an_expected_error<S: Store + Count>(store: S) {
    claimed(&store, "k").await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    let savepoint = tx.savepoint().await.unwrap();
    let error = tx.claim_business_key("c", "k", "m-1").await.unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(DuplicateScope::BusinessKey)
    );
    tx.rollback_to(savepoint).await.unwrap();
    tx.claim_business_key("c", "k-2", "m-1").await.unwrap();
    tx.append_outbox(&outbox_message()).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 2);
    assert_eq!(store.count("sb_outbox").await.unwrap(), 1);
}

/// Savepoints nest, get fresh names, and a released one keeps its work (the per-message
/// savepoints of a batched transaction: mark, handle, release or roll back, next).
pub(crate) async fn savepoints_nest_and_release<S: Store + Count>(store: S) {
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    // Released work stays, also once a later savepoint is rolled back to.
    for key in ["k-1", "k-2"] {
        let savepoint = tx.savepoint().await.unwrap();
        tx.claim_business_key("c", key, "m-1").await.unwrap();
        tx.release(savepoint).await.unwrap();
    }
    let outer = tx.savepoint().await.unwrap();
    tx.claim_business_key("c", "k-3", "m-1").await.unwrap();
    let inner = tx.savepoint().await.unwrap();
    let inner_id = inner.id();
    tx.claim_business_key("c", "k-4", "m-1").await.unwrap();
    let error = tx.claim_business_key("c", "k-1", "m-1").await.unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(DuplicateScope::BusinessKey)
    );
    // Rolling back to the outer savepoint undoes k-3 and k-4 and ends the inner one.
    tx.rollback_to(outer).await.unwrap();
    let ended = tx
        .rollback_to(sb_inbox::Savepoint::new(inner_id))
        .await
        .unwrap_err();
    assert_eq!(ended.kind(), ErrorKind::Schema, "{ended}");
    let last = tx.savepoint().await.unwrap();
    assert!(last.id() > inner_id, "names are never reused");
    tx.claim_business_key("c", "k-5", "m-1").await.unwrap();
    tx.release(last).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
    // k-1, k-2 and k-5.
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 3);
}

/// A failure after a released savepoint is not covered by it: refused as any other.
pub(crate) async fn a_released_savepoint_covers_nothing_after_it<S: Store + Count>(store: S) {
    claimed(&store, "k").await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    let savepoint = tx.savepoint().await.unwrap();
    tx.claim_business_key("c", "k-1", "m-1").await.unwrap();
    tx.release(savepoint).await.unwrap();
    tx.claim_business_key("c", "k", "m-1").await.unwrap_err();
    assert_refused(
        tx.commit().await,
        ErrorKind::Duplicate(DuplicateScope::BusinessKey),
    );
    assert_eq!(store.count("sb_inbox").await.unwrap(), 0);
}
