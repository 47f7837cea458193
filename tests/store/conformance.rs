//! The store conformance suite. Every case is a generic function over the [`Store`] port;
//! the macro at the bottom instantiates all of them for each store.

use std::sync::Arc;

use sb_inbox::{DuplicateScope, ErrorKind, OutboxMessage, Store, Tx, VersionCheck};

use crate::support::Count;

// The first-error rule and savepoints (issue 14, finding 3), in their own file.
pub(crate) use crate::first_error::{
    a_failed_statement_refuses_the_rest_and_the_commit,
    a_released_savepoint_covers_nothing_after_it, a_savepoint_tolerates_an_expected_error,
    savepoints_nest_and_release,
};
// The outbox relay's and retention's cases, written in their own file.
pub(crate) use crate::outbox::{
    backlog_counts_pending_rows, concurrent_claims_are_disjoint, outbox_claim_lease_and_mark,
    outbox_release_with_and_without_failure, retention_ages_inbox_rows_on_the_database_clock,
    retention_deletes_old_rows_in_batches, retention_runs_beside_a_consumer,
};

fn assert_duplicate(result: Result<(), sb_inbox::StoreError>, scope: DuplicateScope) {
    let error = result.expect_err("expected a duplicate");
    assert_eq!(error.kind(), ErrorKind::Duplicate(scope), "{error}");
}

pub(crate) async fn inbox_insert_then_duplicate<S: Store + Count>(store: S) {
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_duplicate(tx.insert_inbox("c", "m-1").await, DuplicateScope::Inbox);
    tx.rollback().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

pub(crate) async fn rollback_leaves_no_row<S: Store + Count>(store: S) {
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 0);
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

pub(crate) async fn dropped_tx_rolls_back<S: Store + Count>(store: S) {
    {
        let mut tx = store.begin().await.unwrap();
        tx.insert_inbox("c", "m-1").await.unwrap();
    }
    assert_eq!(store.count("sb_inbox").await.unwrap(), 0);
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

pub(crate) async fn consumers_are_independent<S: Store + Count>(store: S) {
    for consumer in ["billing", "inventory"] {
        let mut tx = store.begin().await.unwrap();
        tx.insert_inbox(consumer, "m-1").await.unwrap();
        tx.commit().await.unwrap();
    }
    assert_eq!(store.count("sb_inbox").await.unwrap(), 2);
}

pub(crate) async fn business_key_duplicate<S: Store + Count>(store: S) {
    let mut tx = store.begin().await.unwrap();
    tx.claim_business_key("c", "payment:7", "m-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    assert_duplicate(
        tx.claim_business_key("c", "payment:7", "m-2").await,
        DuplicateScope::BusinessKey,
    );
    tx.rollback().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.claim_business_key("other", "payment:7", "m-2")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 2);
}

pub(crate) async fn versions_advance_and_detect_stale<S: Store>(store: S) {
    let steps = [
        (1, VersionCheck::Advanced),
        (3, VersionCheck::Advanced),
        (2, VersionCheck::Stale { current: 3 }),
        (3, VersionCheck::Stale { current: 3 }),
        (4, VersionCheck::Advanced),
    ];
    for (version, expected) in steps {
        let mut tx = store.begin().await.unwrap();
        assert_eq!(
            tx.advance_version("c", "order:1", version).await.unwrap(),
            expected,
            "v{version}"
        );
        tx.commit().await.unwrap();
    }
    let mut tx = store.begin().await.unwrap();
    assert_eq!(
        tx.advance_version("other", "order:1", 1).await.unwrap(),
        VersionCheck::Advanced
    );
    tx.commit().await.unwrap();
}

pub(crate) async fn outbox_commits_with_the_transaction<S: Store + Count>(store: S) {
    let mut tx = store.begin().await.unwrap();
    let mut message = OutboxMessage::new(
        "stock-reserved",
        "inventory.stock-reserved.v1",
        b"{}".to_vec(),
    );
    message
        .application_properties
        .insert("tenant".into(), "t1".into());
    tx.append_outbox(&message).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(store.count("sb_outbox").await.unwrap(), 0);
    let mut tx = store.begin().await.unwrap();
    tx.append_outbox(&message).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        store
            .count("sb_outbox WHERE dispatched_at IS NULL")
            .await
            .unwrap(),
        1
    );
}

/// Two transactions insert the same key at once: the second fails as a duplicate once the
/// first commits (PostgreSQL and SQL Server make it wait on the key; SQLite queues the writer).
pub(crate) async fn concurrent_insert_of_same_key_duplicates<S: Store + Count + Clone>(store: S) {
    let mut first = store.begin().await.unwrap();
    first.insert_inbox("c", "m-1").await.unwrap();
    let second_store = store.clone();
    let started = Arc::new(tokio::sync::Notify::new());
    let started_2 = started.clone();
    let second = tokio::spawn(async move {
        started_2.notify_one();
        let mut tx = second_store.begin().await.unwrap();
        let result = tx.insert_inbox("c", "m-1").await;
        let _ = tx.rollback().await;
        result
    });
    started.notified().await;
    tokio::task::yield_now().await;
    first.commit().await.unwrap();
    assert_duplicate(second.await.unwrap(), DuplicateScope::Inbox);
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

/// Keys that differ only in case, width or trailing spaces are different keys (issue 14,
/// finding 1: SQL Server's default collation made them duplicates, and the second message was
/// completed without its effect). PostgreSQL and SQLite compare exactly already; SQL Server
/// needs `sql/mssql/0004_exact_keys.sql` and runs this in GitHub Actions.
pub(crate) async fn keys_compare_exactly<S: Store + Count>(store: S) {
    // Latin capital A, lower-case, full-width A (U+FF21), trailing space, accented.
    let variants = [
        "Order-A",
        "order-a",
        "\u{ff21}rder-A",
        "Order-A ",
        "Ordér-A",
    ];
    for id in variants {
        let mut tx = store.begin().await.unwrap();
        tx.insert_inbox("c", id)
            .await
            .unwrap_or_else(|e| panic!("{id:?}: {e}"));
        tx.claim_business_key("c", id, id)
            .await
            .unwrap_or_else(|e| panic!("{id:?}: {e}"));
        assert_eq!(
            tx.advance_version("c", id, 5).await.unwrap(),
            VersionCheck::Advanced,
            "{id:?}"
        );
        let mut message = OutboxMessage::new("d", "s.v1", Vec::new());
        message.message_id = id.to_owned();
        tx.append_outbox(&message).await.unwrap();
        tx.commit().await.unwrap();
    }
    let n = i64::try_from(variants.len()).unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), n);
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), n);
    assert_eq!(store.count("sb_inbox_aggregate_version").await.unwrap(), n);
    // Each stored key still recognises its own exact repeat, and versions stay apart.
    for id in variants {
        let mut tx = store.begin().await.unwrap();
        assert_duplicate(tx.insert_inbox("c", id).await, DuplicateScope::Inbox);
        tx.rollback().await.unwrap();
        let mut tx = store.begin().await.unwrap();
        assert_eq!(
            tx.advance_version("c", id, 5).await.unwrap(),
            VersionCheck::Stale { current: 5 },
            "{id:?}"
        );
        tx.commit().await.unwrap();
    }
}

macro_rules! conformance {
    ($store:ident, $make:path, [$($case:ident),* $(,)?]) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::support::init_tracing();
                    let store = $make(concat!(stringify!($store), "_", stringify!($case)), 4).await;
                    super::$case(store).await;
                }
            )*
        }
    };
    // A store that may be absent here: `$make` returns `None` (and says so) to skip.
    ($store:ident, optional $make:path, [$($case:ident),* $(,)?]) => {
        mod $store {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::support::init_tracing();
                    let Some(store) =
                        $make(concat!(stringify!($store), "_", stringify!($case)), 4).await
                    else {
                        return;
                    };
                    super::$case(store).await;
                }
            )*
        }
    };
}

macro_rules! all_stores {
    ($($case:ident),* $(,)?) => {
        conformance!(postgres, crate::support::pg_store, [$($case),*]);
        conformance!(sqlite, crate::support::sqlite_store, [$($case),*]);
        // SQL Server when SB_INBOX_MSSQL is set (GitHub Actions); skipped otherwise.
        conformance!(mssql, optional crate::support::mssql_store, [$($case),*]);
    };
}

all_stores!(
    inbox_insert_then_duplicate,
    rollback_leaves_no_row,
    dropped_tx_rolls_back,
    consumers_are_independent,
    business_key_duplicate,
    versions_advance_and_detect_stale,
    outbox_commits_with_the_transaction,
    concurrent_insert_of_same_key_duplicates,
    outbox_claim_lease_and_mark,
    outbox_release_with_and_without_failure,
    concurrent_claims_are_disjoint,
    backlog_counts_pending_rows,
    retention_deletes_old_rows_in_batches,
    retention_ages_inbox_rows_on_the_database_clock,
    retention_runs_beside_a_consumer,
    a_failed_statement_refuses_the_rest_and_the_commit,
    a_savepoint_tolerates_an_expected_error,
    savepoints_nest_and_release,
    a_released_savepoint_covers_nothing_after_it,
    keys_compare_exactly,
);
