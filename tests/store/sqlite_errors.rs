//! Real SQLite errors and their classification.

use std::time::Duration;

use sb_inbox::{DuplicateScope, ErrorKind, SqliteStore, Store, StoreError, StoreTx};

use crate::support::sqlite_store;

async fn fails(store: &SqliteStore, sql: &str) -> StoreError {
    let mut tx = store.begin().await.unwrap();
    let error = tx.execute(sql, []).expect_err(sql);
    tx.rollback().await.unwrap();
    error
}

#[tokio::test]
async fn constraint_violations() {
    let store = sqlite_store("sqlite_constraints", 1).await;
    let mut tx = store.begin().await.unwrap();
    tx.execute(
        "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-1')",
        [],
    )
    .unwrap();
    tx.execute(
        "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
        [],
    )
    .unwrap();
    tx.execute("INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-1')", [])
        .unwrap();
    tx.commit().await.unwrap();

    let cases: &[(&str, ErrorKind, Option<&str>)] = &[
        (
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
            ErrorKind::Duplicate(DuplicateScope::Inbox),
            Some("pk_sb_inbox"),
        ),
        (
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-2')",
            ErrorKind::Duplicate(DuplicateScope::BusinessKey),
            Some("pk_sb_inbox_business_key"),
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-2')",
            ErrorKind::UniqueViolation,
            Some("inventory_reservation.order_id"),
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('nope', 1, 'A', 1)",
            ErrorKind::ForeignKeyViolation,
            None,
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-1', 1, 'A', 0)",
            ErrorKind::CheckViolation,
            Some("ck_inventory_reservation_line_quantity"),
        ),
        (
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', hex(randomblob(65)))",
            ErrorKind::CheckViolation,
            Some("ck_sb_inbox_message_id_length"),
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-2', NULL)",
            ErrorKind::NotNullViolation,
            None,
        ),
        ("SELECT * FROM no_such_table", ErrorKind::Deployment, None),
    ];
    for (sql, kind, constraint) in cases {
        let error = fails(&store, sql).await;
        assert_eq!(error.kind(), *kind, "{sql}: {error}");
        assert!(error.code().is_some(), "{sql}");
        if constraint.is_some() {
            assert_eq!(error.constraint(), *constraint, "{sql}");
        }
    }
}

#[tokio::test]
async fn busy_database_is_transient() {
    let dir = std::env::temp_dir().join(format!("sb-inbox-busy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("busy.db");
    let _ = std::fs::remove_file(&path);
    let store = SqliteStore::open(&path).unwrap();
    store.migrate().await.unwrap();
    store.set_busy_timeout(Duration::ZERO).await.unwrap();
    // Another process's writer: a plain connection that holds the file's write lock.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let error = store.begin().await.expect_err("the file is write-locked");
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
    assert_eq!(error.code(), Some("5"));
    other.execute_batch("ROLLBACK").unwrap();
    let second = store;
    let mut tx = second.begin().await.unwrap();
    tx.insert_inbox("c", "m").await.unwrap();
    tx.commit().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two stores on one file in one process take turns without blocking a runtime thread in
/// SQLite's busy wait: the second transaction waits for the first asynchronously.
#[tokio::test(flavor = "current_thread")]
async fn stores_on_one_file_take_turns() {
    let dir = std::env::temp_dir().join(format!("sb-inbox-turns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("turns.db");
    let _ = std::fs::remove_file(&path);
    let first = SqliteStore::open(&path).unwrap();
    first.migrate().await.unwrap();
    let second = SqliteStore::open(&path).unwrap();
    let mut held = first.begin().await.unwrap();
    held.insert_inbox("c", "m-1").await.unwrap();
    // On a current-thread runtime a blocking busy wait would stall this very task; the
    // waiting transaction must instead yield until the first commits.
    let waiting = tokio::spawn(async move {
        let mut tx = second.begin().await.unwrap();
        let duplicate = tx.insert_inbox("c", "m-1").await;
        tx.rollback().await.unwrap();
        duplicate
    });
    tokio::task::yield_now().await;
    held.commit().await.unwrap();
    let error = waiting.await.unwrap().unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(sb_inbox::DuplicateScope::Inbox)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 14, finding 4: a COMMIT that fails (here a deferred foreign key) used to leave the
/// transaction open on the store's only connection, and every later BEGIN failed with "cannot
/// start a transaction within a transaction".
#[tokio::test]
async fn a_failed_commit_is_rolled_back() {
    let store = sqlite_store("sqlite_failed_commit", 1).await;
    store
        .with_connection(|conn| {
            conn.execute_batch(
                "CREATE TABLE parent (id INTEGER PRIMARY KEY);
                 CREATE TABLE child (id INTEGER PRIMARY KEY,
                     parent INTEGER REFERENCES parent (id) DEFERRABLE INITIALLY DEFERRED);",
            )
        })
        .await
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.execute("INSERT INTO child (id, parent) VALUES (1, 42)", [])
        .unwrap();
    let error = tx
        .commit()
        .await
        .expect_err("the deferred key fails at commit");
    assert_eq!(error.kind(), ErrorKind::ForeignKeyViolation, "{error}");
    assert!(
        store
            .with_connection(|conn| Ok(conn.is_autocommit()))
            .await
            .unwrap(),
        "no transaction left open"
    );
    // Nothing of it committed, and the next transaction begins.
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    let children: i64 = store
        .with_connection(|conn| conn.query_row("SELECT count(*) FROM child", [], |row| row.get(0)))
        .await
        .unwrap();
    assert_eq!(children, 0);
}
