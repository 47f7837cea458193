//! A handler whose own SQL is sqlx (`sqlx-postgres`), on the connection and in the transaction
//! that hold the inbox row: its row commits with the inbox row, and rolls back with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sb_inbox::testing::TestDb;
use sb_inbox::{Context, Handled, HandlerError, Json, JsonHandler, Message, SqlxPgTx, sqlx};
use sb_inbox_downstream::{MIGRATION, OrderPlaced};

/// The service's `Orders` with its insert written in sqlx; an order with a negative total is
/// refused after its row was inserted, so that row must roll back with the inbox row.
#[derive(Debug)]
struct SqlxOrders;

impl JsonHandler<SqlxPgTx> for SqlxOrders {
    type Message = OrderPlaced;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        order: &OrderPlaced,
        tx: &mut SqlxPgTx,
    ) -> Result<Handled, HandlerError> {
        ctx.claim(tx, &format!("order:{}", order.order_id)).await?;
        sqlx::query("INSERT INTO downstream_orders (order_id, total) VALUES ($1, $2)")
            .bind(&order.order_id)
            .bind(order.total_cents)
            .execute(tx.conn().await?)
            .await?;
        if order.total_cents < 0 {
            return Err(HandlerError::rejected("a negative total"));
        }
        Ok(Handled::Processed)
    }
}

fn order(id: &str, order: &str, total: i64) -> Message {
    Message::new(
        id,
        "orders.order-placed.v1",
        format!(r#"{{"orderId":"{order}","totalCents":{total}}}"#),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlx_handler_writes_in_the_inbox_transaction() {
    let db = TestDb::postgres("downstream_sqlx", &[MIGRATION])
        .await
        .expect("PostgreSQL reachable at DATABASE_URL (.ci/setup starts it)");
    let report = db
        .run_sqlx(
            "downstream.orders",
            Json::new(SqlxOrders),
            [
                order("m-1", "o-1", 1250),
                order("m-1", "o-1", 1250), // redelivered: the inbox
                order("m-2", "o-1", 1250), // republished: the business key
                order("m-3", "o-2", -5),   // inserted, then refused: rolled back
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        (
            report.stats.processed,
            report.stats.duplicate,
            report.stats.permanent
        ),
        (1, 2, 1),
        "{report:?}"
    );
    // o-2's row went with m-3's rolled-back transaction, inbox row included.
    assert_eq!(
        column(&db, "SELECT order_id FROM downstream_orders").await,
        ["o-1"]
    );
    let inbox = column(&db, "SELECT message_id FROM sb_inbox").await;
    // m-1 and m-2 run concurrently: either takes the order's key, the other is a duplicate.
    assert!(inbox == ["m-1"] || inbox == ["m-2"], "{inbox:?}");
}

/// The first column of `sql`'s rows.
async fn column(db: &TestDb, sql: &str) -> Vec<String> {
    let rows = db.store().query(sql, &[]).await.unwrap();
    rows.iter().map(|row| row.get(0)).collect()
}
