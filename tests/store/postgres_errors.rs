//! Real PostgreSQL errors, provoked on the server, and their classification.

use sb_inbox::{DuplicateScope, ErrorKind, PgStore, PgTx, Store, StoreError, StoreTx};

use crate::support::pg_store;

async fn begin(store: &PgStore) -> PgTx {
    store.begin().await.unwrap()
}

async fn fails(tx: &mut PgTx, sql: &str) -> StoreError {
    tx.execute(sql, &[]).await.expect_err(sql)
}

#[tokio::test]
async fn constraint_violations() {
    let store = pg_store("pg_constraint_violations", 2).await;
    let mut tx = begin(&store).await;
    tx.execute(
        "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-1')",
        &[],
    )
    .await
    .unwrap();
    tx.execute(
        "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
        &[],
    )
    .await
    .unwrap();
    tx.execute("INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-1')", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let cases: &[(&str, ErrorKind, Option<&str>, &str)] = &[
        (
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'm-1')",
            ErrorKind::Duplicate(DuplicateScope::Inbox),
            Some("pk_sb_inbox"),
            "23505",
        ),
        (
            "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('c', 'k', 'm-2')",
            ErrorKind::Duplicate(DuplicateScope::BusinessKey),
            Some("pk_sb_inbox_business_key"),
            "23505",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-1', 'm-2')",
            ErrorKind::UniqueViolation,
            Some("pk_inventory_reservation"),
            "23505",
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('nope', 1, 'A', 1)",
            ErrorKind::ForeignKeyViolation,
            Some("fk_inventory_reservation_line_reservation"),
            "23503",
        ),
        (
            "INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-1', 1, 'A', 0)",
            ErrorKind::CheckViolation,
            Some("ck_inventory_reservation_line_quantity"),
            "23514",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-2', NULL)",
            ErrorKind::NotNullViolation,
            None,
            "23502",
        ),
        (
            "INSERT INTO inventory_reservation (order_id, message_id) VALUES (repeat('x', 65), 'm')",
            ErrorKind::Truncation,
            None,
            "22001",
        ),
        (
            "SELECT 'abc'::text::int",
            ErrorKind::Conversion,
            None,
            "22P02",
        ),
        (
            "SELECT 2147483647::int + 1",
            ErrorKind::Conversion,
            None,
            "22003",
        ),
        (
            "SELECT * FROM no_such_table",
            ErrorKind::Deployment,
            None,
            "42P01",
        ),
    ];
    for (sql, kind, constraint, code) in cases {
        let mut tx = begin(&store).await;
        let error = fails(&mut tx, sql).await;
        assert_eq!(error.kind(), *kind, "{sql}: {error}");
        assert_eq!(error.code(), Some(*code), "{sql}");
        if constraint.is_some() {
            assert_eq!(error.constraint(), *constraint, "{sql}");
        }
        assert!(
            !error.kind().is_transient()
                || matches!(kind, ErrorKind::Unknown | ErrorKind::Deployment)
        );
        tx.rollback().await.unwrap();
    }
}

#[tokio::test]
async fn serialization_failure_is_transient() {
    let store = pg_store("pg_serialization_failure", 2).await;
    let mut a = begin(&store).await;
    let mut b = begin(&store).await;
    for tx in [&mut a, &mut b] {
        tx.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", &[])
            .await
            .unwrap();
        tx.query("SELECT count(*) FROM sb_inbox", &[])
            .await
            .unwrap();
    }
    a.execute(
        "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'a')",
        &[],
    )
    .await
    .unwrap();
    b.execute(
        "INSERT INTO sb_inbox (consumer, message_id) VALUES ('c', 'b')",
        &[],
    )
    .await
    .unwrap();
    a.commit().await.unwrap();
    let error = b.commit().await.expect_err("write skew must fail");
    assert_eq!(error.code(), Some("40001"));
    assert_eq!(error.kind(), ErrorKind::Contention);
    assert!(error.kind().is_transient());
}

#[tokio::test]
async fn deadlock_is_transient() {
    let store = pg_store("pg_deadlock", 3).await;
    store
        .query(
            "INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0), ('B', 0)",
            &[],
        )
        .await
        .unwrap();
    let mut a = begin(&store).await;
    let mut b = begin(&store).await;
    a.execute(
        "UPDATE inventory_stock SET reserved = 1 WHERE sku = 'A'",
        &[],
    )
    .await
    .unwrap();
    b.execute(
        "UPDATE inventory_stock SET reserved = 1 WHERE sku = 'B'",
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
    // Wait until `a` is really blocked on b's row before closing the cycle.
    loop {
        let rows = store
            .query("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND datname = current_database()", &[])
            .await
            .unwrap();
        if rows[0].get::<_, i64>(0) > 0 {
            break;
        }
        tokio::task::yield_now().await;
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
    assert_eq!(error.code(), Some("40P01"));
    assert_eq!(error.kind(), ErrorKind::Contention);
    let _ = a.rollback().await;
    let _ = b.rollback().await;
}

#[tokio::test]
async fn lock_and_statement_timeouts_are_transient() {
    let store = pg_store("pg_lock_timeout", 2).await;
    store
        .query(
            "INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0)",
            &[],
        )
        .await
        .unwrap();
    let mut holder = begin(&store).await;
    holder
        .execute(
            "UPDATE inventory_stock SET reserved = 1 WHERE sku = 'A'",
            &[],
        )
        .await
        .unwrap();
    let mut waiter = begin(&store).await;
    waiter
        .execute("SET LOCAL lock_timeout = '20ms'", &[])
        .await
        .unwrap();
    let error = fails(
        &mut waiter,
        "UPDATE inventory_stock SET reserved = 2 WHERE sku = 'A'",
    )
    .await;
    assert_eq!(
        (error.code(), error.kind()),
        (Some("55P03"), ErrorKind::TimedOut)
    );
    waiter.rollback().await.unwrap();
    holder.rollback().await.unwrap();

    let mut tx = begin(&store).await;
    tx.execute("SET LOCAL statement_timeout = '20ms'", &[])
        .await
        .unwrap();
    let error = fails(&mut tx, "SELECT pg_sleep(5)").await;
    assert_eq!(
        (error.code(), error.kind()),
        (Some("57014"), ErrorKind::TimedOut)
    );
}

#[tokio::test]
async fn admin_shutdown_then_connection_loss_are_transient_and_the_pool_recovers() {
    let store = pg_store("pg_admin_shutdown", 1).await;
    let mut tx = begin(&store).await;
    let error = fails(&mut tx, "SELECT pg_terminate_backend(pg_backend_pid())").await;
    assert_eq!(
        (error.code(), error.kind()),
        (Some("57P01"), ErrorKind::Unavailable)
    );
    // The transaction refuses anything after its first error.
    let refused = fails(&mut tx, "SELECT 1").await;
    assert!(refused.is_refused(), "{refused}");
    assert_eq!(refused.kind(), ErrorKind::Unavailable);
    // The statement itself, sent anyway, meets the closed connection.
    let error = sb_inbox::store::postgres::classify(
        tx.client()
            .await
            .unwrap()
            .execute("SELECT 1", &[])
            .await
            .unwrap_err(),
    );
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.kind().is_transient());
    drop(tx);
    // The broken connection was evicted: the single-connection pool serves a new one.
    let mut tx = begin(&store).await;
    tx.insert_inbox("c", "after-recovery").await.unwrap();
    tx.commit().await.unwrap();
}

/// Issue 14, finding 3: a statement the transaction does not see (sent through `client()`)
/// aborts it, and PostgreSQL answers a later `COMMIT` with `ROLLBACK` and no error. The commit
/// must fail, or the message would be completed with nothing committed.
#[tokio::test]
async fn a_commit_answered_with_rollback_is_an_error() {
    use crate::support::Count as _;
    let store = pg_store("pg_commit_answered_rollback", 1).await;
    let mut tx = begin(&store).await;
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.client()
        .await
        .unwrap()
        .execute("SELECT 1 / 0", &[])
        .await
        .unwrap_err();
    let error = tx.commit().await.expect_err("nothing was committed");
    assert_eq!(error.code(), Some("25P02"), "{error}");
    assert!(error.kind().is_transient(), "{error}");
    assert_eq!(store.count("sb_inbox").await.unwrap(), 0);
    // Rolled back, not discarded: the single connection serves the next transaction.
    let mut tx = begin(&store).await;
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

/// Issue 14, finding 6 (store part): every session has a statement and a lock timeout, so a lock
/// held elsewhere cannot hold a message (and its renewed lock) forever; the URL can set them,
/// and a wait that runs out is a transient error.
#[tokio::test]
async fn sessions_have_statement_and_lock_timeouts() {
    use crate::support::{pg_url, schema_for, with_search_path};
    let store = pg_store("pg_session_bounds", 2).await;
    let show = |setting: &'static str| {
        let store = store.clone();
        async move {
            let rows = store.query(&format!("SHOW {setting}"), &[]).await.unwrap();
            rows[0].get::<_, String>(0)
        }
    };
    assert_eq!(show("statement_timeout").await, "1min");
    assert_eq!(show("lock_timeout").await, "30s");

    let url = format!(
        "{}%20-clock_timeout%3D200ms",
        with_search_path(&pg_url(), &schema_for("pg_session_bounds"))
    );
    let bounded = PgStore::connect(&url, 1).await.unwrap();
    let mut holder = begin(&store).await;
    holder
        .execute("LOCK TABLE inventory_stock IN ACCESS EXCLUSIVE MODE", &[])
        .await
        .unwrap();
    let mut waiter = begin(&bounded).await;
    let error = fails(&mut waiter, "SELECT count(*) FROM inventory_stock").await;
    assert_eq!(
        (error.code(), error.kind()),
        (Some("55P03"), ErrorKind::TimedOut),
        "{error}"
    );
    assert!(error.kind().is_transient());
    waiter.rollback().await.unwrap();
    holder.rollback().await.unwrap();
}

/// Bounded lock waits last for their transaction only (`set_config(…, true)` is `SET LOCAL`):
/// a statement past the bound fails as a timeout (55P03), and the pooled connection's next
/// transaction waits as the session is configured (30 s).
#[tokio::test]
async fn bounded_lock_waits_fail_as_contention_and_end_with_the_transaction() {
    let store = pg_store("pg_bounded_lock_waits", 2).await;
    let setting = "SELECT current_setting('lock_timeout')";
    let mut holder = begin(&store).await;
    holder
        .execute(
            "INSERT INTO sb_inbox (consumer, message_id) VALUES ($1, $2)",
            &[&"c", &"held"],
        )
        .await
        .unwrap();
    let mut tx = begin(&store).await;
    tx.bound_lock_waits(std::time::Duration::from_millis(10))
        .await
        .unwrap();
    let bound: String = tx.query(setting, &[]).await.unwrap()[0].get(0);
    assert_eq!(bound, "10ms");
    let error = tx.insert_inbox("c", "held").await.unwrap_err();
    assert_eq!(
        (error.kind(), error.code()),
        (ErrorKind::TimedOut, Some("55P03")),
        "{error}"
    );
    tx.rollback().await.unwrap();
    holder.rollback().await.unwrap();
    // Both pooled connections at once: neither kept the bound.
    let mut both = [begin(&store).await, begin(&store).await];
    for tx in &mut both {
        let after: String = tx.query(setting, &[]).await.unwrap()[0].get(0);
        assert_eq!(after, "30s");
    }
}
