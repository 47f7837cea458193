//! The sqlx PostgreSQL store (`sqlx-postgres`): the library's conformance suite, and a
//! handler's own sqlx queries on the connection and in the transaction that hold the inbox row.

use sb_inbox::sqlx;
use sb_inbox::{DuplicateScope, ErrorKind, HandlerError, SqlxPgStore, Store, StoreTx, Tx};

use crate::support::fresh_pg_schema;

/// A migrated sqlx store in a fresh schema of `test`'s own, with the handler's table `stock`.
async fn sqlx_store(test: &str, pool: u32) -> SqlxPgStore {
    let url = fresh_pg_schema(test).await;
    let store = SqlxPgStore::connect(&url, pool).await.expect("connect");
    store.migrate().await.expect("migrate");
    sqlx::query("CREATE TABLE stock (sku text PRIMARY KEY, n int NOT NULL CHECK (n >= 0))")
        .execute(store.pool())
        .await
        .expect("create stock");
    store
}

async fn count(store: &SqlxPgStore, sql: &'static str) -> i64 {
    sqlx::query_scalar(sql)
        .fetch_one(store.pool())
        .await
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlx_store_passes_the_library_conformance_suite() {
    let store = sqlx_store("sqlx_conformance", 4).await;
    if let Err(failure) = sb_inbox::testing::conformance::run(store).await {
        panic!("{failure}");
    }
}

#[tokio::test]
async fn a_handler_sqlx_insert_commits_and_rolls_back_with_the_inbox_row() {
    let store = sqlx_store("sqlx_shares_tx", 2).await;
    for (message, commit) in [("m-1", false), ("m-2", true)] {
        let mut tx = store.begin().await.unwrap();
        tx.insert_inbox("shop", message).await.unwrap();
        sqlx::query("INSERT INTO stock (sku, n) VALUES ($1, 5)")
            .bind(message)
            .execute(tx.conn().await.unwrap())
            .await
            .unwrap();
        if commit {
            tx.commit().await.unwrap();
        } else {
            tx.rollback().await.unwrap();
        }
    }
    assert_eq!(count(&store, "SELECT count(*) FROM stock").await, 1);
    assert_eq!(count(&store, "SELECT count(*) FROM sb_inbox").await, 1);
    assert_eq!(
        count(&store, "SELECT count(*) FROM stock WHERE sku = 'm-2'").await,
        1
    );
}

/// A handler that swallows its own query's error cannot commit the rest: PostgreSQL aborted
/// the transaction, and the commit says so instead of answering `ROLLBACK` as a success.
#[tokio::test]
async fn a_swallowed_sqlx_error_fails_the_commit() {
    let store = sqlx_store("sqlx_swallowed", 2).await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("shop", "m-1").await.unwrap();
    let failed = sqlx::query("INSERT INTO stock (sku, n) VALUES ('A', -1)")
        .execute(tx.conn().await.unwrap())
        .await;
    let error = HandlerError::from(failed.unwrap_err());
    assert!(matches!(&error, HandlerError::Store(e) if e.kind() == ErrorKind::CheckViolation));
    assert!(
        tx.commit().await.is_err(),
        "commit after an aborted statement"
    );
    assert_eq!(count(&store, "SELECT count(*) FROM sb_inbox").await, 0);
}

/// A handler's unique violation on the business-key table is a duplicate, through `?`.
#[tokio::test]
async fn a_sqlx_unique_violation_on_a_business_key_is_a_duplicate() {
    let store = sqlx_store("sqlx_duplicate_key", 2).await;
    let mut tx = store.begin().await.unwrap();
    tx.claim_business_key("shop", "order:7", "m-1")
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let mut tx = store.begin().await.unwrap();
    let again = sqlx::query(
        "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('shop', 'order:7', 'm-2')",
    )
    .execute(tx.conn().await.unwrap())
    .await;
    let error = HandlerError::from(again.unwrap_err());
    assert!(
        matches!(&error, HandlerError::Store(e) if e.kind() == ErrorKind::Duplicate(DuplicateScope::BusinessKey)),
        "{error:?}"
    );
}

/// A transaction dropped half-way (a handler cancelled) closes its connection: with a pool of
/// one, the next transaction starts clean and the dropped inbox row is not there.
#[tokio::test]
async fn a_dropped_sqlx_transaction_leaves_a_clean_connection() {
    let store = sqlx_store("sqlx_dropped", 1).await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("shop", "m-1").await.unwrap();
    drop(tx);
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("shop", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(count(&store, "SELECT count(*) FROM sb_inbox").await, 1);
}
