//! Real SQLite errors and their classification.

use std::time::Duration;

use sb_inbox::{DuplicateScope, ErrorKind, SqliteStore, Store, StoreError, Tx};

use crate::support::sqlite_store;

async fn fails(store: &SqliteStore, sql: &str) -> StoreError {
    let tx = store.begin().await.unwrap();
    let error = tx.execute(sql, []).expect_err(sql);
    tx.rollback().await.unwrap();
    error
}

#[tokio::test]
async fn constraint_violations() {
    let store = sqlite_store("sqlite_constraints", 1).await;
    let tx = store.begin().await.unwrap();
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
        ("SELECT * FROM no_such_table", ErrorKind::Schema, None),
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
    let first = SqliteStore::open(&path).unwrap();
    first.migrate().await.unwrap();
    let second = SqliteStore::open(&path).unwrap();
    second.set_busy_timeout(Duration::ZERO).await.unwrap();
    let held = first.begin().await.unwrap();
    let error = second.begin().await.expect_err("the file is write-locked");
    assert_eq!(error.kind(), ErrorKind::Contention, "{error}");
    assert_eq!(error.code(), Some("5"));
    held.rollback().await.unwrap();
    let mut tx = second.begin().await.unwrap();
    tx.insert_inbox("c", "m").await.unwrap();
    tx.commit().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
