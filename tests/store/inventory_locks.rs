//! The reference consumer locks stock rows in SKU order, whatever the order of the lines, so two
//! orders sharing SKUs wait for each other instead of deadlocking.

use std::time::Duration;

use sb_inbox::{PgStore, Store, StoreTx};
use sb_inbox_cli::inventory::{InventoryTx, OrderLine, OrderPlaced};

use crate::support::pg_store;

async fn stock_row_is_locked(store: &PgStore, sku: &str) -> bool {
    let mut tx = store.begin().await.unwrap();
    let result = tx
        .query(
            "SELECT sku FROM inventory_stock WHERE sku = $1 FOR UPDATE NOWAIT",
            &[&sku],
        )
        .await;
    tx.rollback().await.unwrap();
    // 55P03 lock_not_available: another transaction holds the row.
    result.is_err_and(|e| e.code() == Some("55P03"))
}

/// A session holds SKU `A`; an order whose lines say `B` then `A` must wait for `A` before it
/// touches `B` (locking in arrival order would hold `B` while waiting: half of a deadlock).
#[tokio::test]
async fn stock_rows_are_locked_in_sku_order_not_line_order() {
    let store = pg_store("inventory_lock_order", 3).await;
    store
        .query(
            "INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0), ('B', 0)",
            &[],
        )
        .await
        .unwrap();
    let mut holder = store.begin().await.unwrap();
    let holder_pid: i32 = holder
        .query(
            "SELECT pg_backend_pid() FROM inventory_stock WHERE sku = 'A' FOR UPDATE",
            &[],
        )
        .await
        .unwrap()[0]
        .get(0);

    let order = OrderPlaced {
        order_id: "o-1".into(),
        lines: vec![
            OrderLine {
                sku: "B".into(),
                quantity: 1,
            },
            OrderLine {
                sku: "A".into(),
                quantity: 2,
            },
            OrderLine {
                sku: "B".into(),
                quantity: 3,
            },
        ],
    };
    let waiting = tokio::spawn({
        let store = store.clone();
        async move {
            let mut tx = store.begin().await.unwrap();
            tx.insert_inbox("c", "m-1").await.unwrap();
            tx.reserve("m-1", &order).await.unwrap();
            tx.commit().await.unwrap();
        }
    });
    // Wait (bounded) until the order's transaction is blocked on A.
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let rows = store
                .query(
                    "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
                    &[&holder_pid],
                )
                .await
                .unwrap();
            if rows[0].get::<_, i64>(0) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the order's transaction waits on the held stock row");
    assert!(
        !stock_row_is_locked(&store, "B").await,
        "B was locked before A: stock rows are locked in line order"
    );
    holder.rollback().await.unwrap();
    waiting.await.unwrap();
    let rows = store
        .query(
            "SELECT sku, reserved FROM inventory_stock ORDER BY sku",
            &[],
        )
        .await
        .unwrap();
    let stock: Vec<(String, i64)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(stock, [("A".to_owned(), 2), ("B".to_owned(), 4)]);
}
