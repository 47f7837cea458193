//! Real SQL Server errors, provoked on the server, and their classification. Runs when
//! `SB_INBOX_MSSQL` is set (GitHub Actions, SQL Server 2022) and prints that it was skipped
//! otherwise.

use std::time::Duration;

use sb_inbox::{DuplicateScope, ErrorKind, MssqlStore, MssqlTx, Store, StoreError, StoreTx};

use crate::support::mssql_store;

async fn fails(store: &MssqlStore, sql: &str) -> StoreError {
    let mut tx = store.begin().await.unwrap();
    let error = tx.execute(sql, &[]).await.expect_err(sql);
    // XACT_ABORT rolled the transaction back on the server; rollback must still succeed.
    tx.rollback().await.unwrap();
    error
}

#[tokio::test]
async fn mssql_constraint_and_data_errors() {
    let Some(store) = mssql_store("mssql_constraint_violations", 2).await else {
        return;
    };
    let mut tx = store.begin().await.unwrap();
    for sql in [
        "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-1')",
        "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
        "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-1')",
        "INSERT INTO sb_outbox (message_id, destination, application_properties, body) VALUES ('out-1', 'q', '{}', 0x00)",
    ] {
        tx.execute(sql, &[]).await.unwrap();
    }
    tx.commit().await.unwrap();

    let cases: &[(&str, ErrorKind, Option<&str>, &str)] = &[
        (
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
            ErrorKind::Duplicate(DuplicateScope::Inbox),
            Some("pk_sb_inbox"),
            "2627",
        ),
        (
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-2')",
            ErrorKind::Duplicate(DuplicateScope::BusinessKey),
            Some("pk_sb_inbox_business_key"),
            "2627",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-2')",
            ErrorKind::UniqueViolation,
            Some("pk_inventory_reservation"),
            "2627",
        ),
        (
            "INSERT INTO sb_outbox (message_id, destination, application_properties, body) VALUES ('out-1', 'q', '{}', 0x00)",
            ErrorKind::UniqueViolation,
            Some("uq_sb_outbox_message_id"),
            "2627",
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('nope', 1, 'A', 1)",
            ErrorKind::ForeignKeyViolation,
            Some("fk_inventory_reservation_line_reservation"),
            "547",
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-1', 1, 'A', 0)",
            ErrorKind::CheckViolation,
            Some("ck_inventory_reservation_line_quantity"),
            "547",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-2', NULL)",
            ErrorKind::NotNullViolation,
            None,
            "515",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (REPLICATE('x', 65), 'm')",
            ErrorKind::Truncation,
            None,
            "2628",
        ),
        (
            "SELECT CAST('abc' AS int)",
            ErrorKind::Conversion,
            None,
            "245",
        ),
        (
            "SELECT CAST(2147483647 AS int) + 1",
            ErrorKind::Conversion,
            None,
            "8115",
        ),
        (
            "SELECT * FROM no_such_table",
            ErrorKind::Deployment,
            None,
            "208",
        ),
        (
            "SELECT no_such_column FROM sb_inbox",
            ErrorKind::Deployment,
            None,
            "207",
        ),
        (
            "THROW 50001, 'business rule', 1",
            ErrorKind::CheckViolation,
            None,
            "50001",
        ),
    ];
    for (sql, kind, constraint, code) in cases {
        let error = fails(&store, sql).await;
        assert_eq!(error.kind(), *kind, "{sql}: {error}");
        // SQL Server 2019+ reports truncation as 2628 (with the column), older ones as 8152.
        let same_code =
            error.code() == Some(*code) || (*code == "2628" && error.code() == Some("8152"));
        assert!(same_code, "{sql}: expected {code}, got {error}");
        if constraint.is_some() {
            assert_eq!(error.constraint(), *constraint, "{sql}");
        }
        assert_eq!(
            error.kind().is_transient(),
            *kind == ErrorKind::Deployment,
            "{sql}"
        );
    }
}

/// Stock row `A`, and a transaction that holds its row lock (updated, not committed).
async fn holding_stock_row_a(store: &MssqlStore) -> MssqlTx {
    store
        .execute(
            "INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0)",
            &[],
        )
        .await
        .unwrap();
    let mut holder = store.begin().await.unwrap();
    holder
        .execute(
            "UPDATE inventory_stock SET reserved = 1 WHERE sku = 'A'",
            &[],
        )
        .await
        .unwrap();
    holder
}

#[tokio::test]
async fn mssql_lock_timeout_is_transient() {
    let Some(store) = mssql_store("mssql_lock_timeout", 2).await else {
        return;
    };
    let holder = holding_stock_row_a(&store).await;
    let error = fails(
        &store,
        "SET LOCK_TIMEOUT 50; UPDATE inventory_stock SET reserved = 2 WHERE sku = 'A'",
    )
    .await;
    assert_eq!(
        (error.code(), error.kind()),
        (Some("1222"), ErrorKind::TimedOut),
        "{error}"
    );
    holder.rollback().await.unwrap();
}

/// The lock-wait bound a batch sets (`StoreTx::bound_lock_waits`) holds for the statements after
/// it: sent as a plain batch, not as `sp_executesql` dynamic SQL, whose SET options SQL Server
/// restores when the call returns (then `@@LOCK_TIMEOUT` read the session's 20000 here and the
/// update waited 20 s). The transaction's end restores the session's value.
#[tokio::test]
async fn mssql_bounded_lock_waits_last_for_the_transaction() {
    let Some(store) = mssql_store("mssql_bounded_lock_waits", 2).await else {
        return;
    };
    let lock_timeout = async |tx: &mut MssqlTx| -> i32 {
        let rows = tx.query("SELECT @@LOCK_TIMEOUT", &[]).await.unwrap();
        rows[0].try_get::<i32, _>(0).unwrap().unwrap()
    };
    let holder = holding_stock_row_a(&store).await;
    let mut tx = store.begin().await.unwrap();
    tx.bound_lock_waits(Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(lock_timeout(&mut tx).await, 50);
    let error = tx
        .execute(
            "UPDATE inventory_stock SET reserved = 2 WHERE sku = 'A'",
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(
        (error.code(), error.kind()),
        (Some("1222"), ErrorKind::TimedOut),
        "{error}"
    );
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
    let mut next = store.begin().await.unwrap();
    assert_eq!(lock_timeout(&mut next).await, 20_000, "restored");
    next.rollback().await.unwrap();
}

#[tokio::test]
async fn mssql_deadlock_is_transient() {
    let Some(store) = mssql_store("mssql_deadlock", 3).await else {
        return;
    };
    store
        .execute(
            "INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0), ('B', 0)",
            &[],
        )
        .await
        .unwrap();
    let mut a = store.begin().await.unwrap();
    let mut b = store.begin().await.unwrap();
    a.execute(
        "UPDATE inventory_stock SET reserved = 1 WHERE sku = 'A'",
        &[],
    )
    .await
    .unwrap();
    b.execute(
        "SET DEADLOCK_PRIORITY LOW; UPDATE inventory_stock SET reserved = 1 WHERE sku = 'B'",
        &[],
    )
    .await
    .unwrap();
    let a_waits = tokio::spawn(async move {
        let result = a
            .execute(
                "UPDATE inventory_stock SET reserved = 2 WHERE sku = 'B'",
                &[],
            )
            .await;
        (a, result)
    });
    // Wait until `a` really waits on b's row before closing the cycle.
    for _ in 0..200 {
        let rows = store
            .query(
                "SELECT CAST(count(*) AS int) FROM sys.dm_exec_requests WHERE blocking_session_id <> 0",
                &[],
            )
            .await
            .unwrap();
        if rows[0].get::<i32, _>(0).unwrap_or_default() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let b_result = b
        .execute(
            "UPDATE inventory_stock SET reserved = 2 WHERE sku = 'A'",
            &[],
        )
        .await;
    let (a, a_result) = a_waits.await.unwrap();
    let error = match (a_result, b_result) {
        (Err(error), Ok(_)) | (Ok(_), Err(error)) => error,
        other => panic!("exactly one side must be the deadlock victim: {other:?}"),
    };
    assert_eq!(error.code(), Some("1205"), "{error}");
    assert_eq!(error.kind(), ErrorKind::Contention);
    let _ = MssqlTx::rollback(a).await;
    let _ = b.rollback().await;
}

#[tokio::test]
async fn mssql_killed_session_is_evicted_and_the_pool_recovers() {
    let Some(store) = mssql_store("mssql_killed_session", 2).await else {
        return;
    };
    let mut tx = store.begin().await.unwrap();
    let rows = tx.query("SELECT CAST(@@SPID AS int)", &[]).await.unwrap();
    let spid = rows[0].get::<i32, _>(0).unwrap();
    store.batch(&format!("KILL {spid}")).await.unwrap();
    let error = tx.execute("SELECT 1", &[]).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.kind().is_transient());
    drop(tx);
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "after-recovery").await.unwrap();
    tx.commit().await.unwrap();
}
