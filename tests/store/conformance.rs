//! The store conformance suite, run on each store: the port-level checks live in the library
//! (`sb_inbox::testing::conformance`, exported so a third-party store runs them too); the
//! outbox, relay and retention cases, which read the tables, are written here. The macro at
//! the bottom instantiates every case for each store.

use sb_inbox::{OutboxMessage, Store, StoreTx, Tx};

use crate::support::Count;

// The outbox relay's and retention's cases, written in their own file.
pub(crate) use crate::outbox::{
    an_unreadable_row_does_not_fail_the_claim, backlog_counts_pending_rows,
    concurrent_claims_are_disjoint, outbox_claim_lease_and_mark,
    outbox_refuses_what_it_cannot_publish, outbox_release_with_and_without_failure,
    retention_ages_inbox_rows_on_the_database_clock, retention_deletes_old_rows_in_batches,
    retention_runs_beside_a_consumer,
};

/// Every check of `sb_inbox::testing::conformance` (inbox and business-key duplicates,
/// rollback, versions, a concurrent insert, exact keys, the first-error rule, savepoints).
pub(crate) async fn library_suite<S: Store>(store: S) {
    if let Err(failure) = sb_inbox::testing::conformance::run(store).await {
        panic!("{failure}");
    }
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
    library_suite,
    outbox_commits_with_the_transaction,
    outbox_claim_lease_and_mark,
    outbox_release_with_and_without_failure,
    outbox_refuses_what_it_cannot_publish,
    an_unreadable_row_does_not_fail_the_claim,
    concurrent_claims_are_disjoint,
    backlog_counts_pending_rows,
    retention_deletes_old_rows_in_batches,
    retention_ages_inbox_rows_on_the_database_clock,
    retention_runs_beside_a_consumer,
);
