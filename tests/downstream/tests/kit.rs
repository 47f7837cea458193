//! The handler tested as a user of sb-inbox's test kit would: its own SQL without a database or
//! a hand-written `Tx` wrapper, a MassTransit fixture opened as the runtime opens it, and the
//! real thing on a fresh PostgreSQL schema in one line.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use sb_inbox::envelope::{MASSTRANSIT_CONTENT_TYPE, MassTransit, TypeMap};
use sb_inbox::testing::{ContextBuilder, TestDb, TxOp};
use sb_inbox::{DuplicateScope, ErrorKind, Handled, HandlerError, Json, Message, StoreError};
use sb_inbox_downstream::{MIGRATION, Orders, OrdersTx};

// The double: every `Tx` method recorded as `RecordingTx` does, plus the service's own.
sb_inbox::recording_tx!(TestTx);

impl OrdersTx for TestTx {
    async fn insert_order(&mut self, order_id: &str, total_cents: i64) -> Result<(), StoreError> {
        self.record("insert_order", format!("{order_id} {total_cents}"))
    }
}

fn order(id: &str, order: &str) -> Message {
    Message::new(
        id,
        "orders.order-placed.v1",
        format!(r#"{{"orderId":"{order}","totalCents":1250}}"#),
    )
}

/// The handler's own SQL is recorded beside the business key; a republished order stops at
/// the key before its insert; a deadlock on the insert is transient.
#[tokio::test]
async fn a_handler_with_its_own_sql_is_unit_tested_without_a_wrapper() {
    let ctx = ContextBuilder::new("downstream.orders", order("m-1", "o-1")).unwrap();
    let mut tx = TestTx::default();
    assert_eq!(
        ctx.handle(&Json::new(Orders), &mut tx).await.unwrap(),
        Handled::Processed
    );
    assert_eq!(tx.business_keys(), ["order:o-1"]);
    assert_eq!(tx.recorded("insert_order"), ["o-1 1250"]);

    let mut tx = TestTx::from(
        sb_inbox::testing::RecordingTx::new().with_claimed_key("downstream.orders", "order:o-1"),
    );
    let error = ctx.handle(&Json::new(Orders), &mut tx).await.unwrap_err();
    assert!(
        matches!(&error, HandlerError::Store(e) if e.kind() == ErrorKind::Duplicate(DuplicateScope::BusinessKey)),
        "{error:?}"
    );
    assert!(tx.recorded("insert_order").is_empty());

    let deadlock = StoreError::of_kind(ErrorKind::Contention, "deadlock");
    let mut tx = TestTx::from(
        sb_inbox::testing::RecordingTx::new().fail_on(TxOp::Custom("insert_order"), deadlock),
    );
    let error = ctx.handle(&Json::new(Orders), &mut tx).await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
}

/// A MassTransit fixture, opened through `ContextBuilder` as the runtime opens it: the
/// envelope's `messageId` is the logical id (the business key's owner), its `message` the body.
#[tokio::test]
async fn a_masstransit_fixture_is_opened_through_the_context_builder() {
    let reader = MassTransit::new(
        TypeMap::new()
            .with(
                "urn:message:Shop.Contracts:OrderPlaced",
                "orders.order-placed.v1",
            )
            .unwrap(),
    )
    .unwrap();
    let fixture = Message::new(
        "broker-7",
        "",
        r#"{"messageId":"mt-1","conversationId":"conv-1","messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{"orderId":"o-9","totalCents":700}}"#,
    )
    .with_content_type(MASSTRANSIT_CONTENT_TYPE);
    let ctx = ContextBuilder::with_envelope("downstream.orders", fixture, &reader).unwrap();
    assert_eq!(ctx.build(()).logical_id(), "mt-1");
    let mut tx = TestTx::default();
    assert_eq!(
        ctx.handle(&Json::new(Orders), &mut tx).await.unwrap(),
        Handled::Processed
    );
    assert_eq!(tx.recorded("insert_order"), ["o-9 700"]);

    let unmapped = Message::new(
        "broker-8",
        "",
        r#"{"messageId":"mt-2","messageType":["urn:message:Shop.Contracts:OrderShipped"],"message":{}}"#,
    )
    .with_content_type(MASSTRANSIT_CONTENT_TYPE);
    let refused =
        ContextBuilder::with_envelope("downstream.orders", unmapped, &reader).unwrap_err();
    assert!(refused.to_string().contains("OrderShipped"), "{refused}");
}

/// The real thing in one line: a fresh schema with the service's migration, the messages run
/// through the runtime and PostgreSQL; outcomes and rows come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_handler_runs_for_real_on_a_fresh_schema_in_one_line() {
    let db = TestDb::postgres("downstream_kit_real", &[MIGRATION])
        .await
        .expect("PostgreSQL reachable at DATABASE_URL (.ci/setup starts it)");
    let report = db
        .run(
            "downstream.orders",
            Json::new(Orders),
            [
                order("m-1", "o-1"),
                order("m-1", "o-1"), // redelivered: the inbox
                order("m-2", "o-1"), // republished: the business key
                order("m-3", "o-2"),
                Message::new("m-4", "orders.order-placed.v1", "not json"),
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
        (2, 2, 1),
        "{report:?}"
    );
    assert_eq!(report.dead_letters.len(), 1);
    assert_eq!(report.dead_letters[0].reason, "InvalidPayload");
    assert!(report.outbox.is_empty());
    let rows = db
        .store()
        .query(
            "SELECT order_id FROM downstream_orders ORDER BY order_id",
            &[],
        )
        .await
        .unwrap();
    let ids: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(ids, ["o-1", "o-2"]);

    // JSON parameters through the re-exported driver: no tokio-postgres dependency of ours.
    let document = serde_json::json!({ "orderId": "o-1" });
    let param: &(dyn sb_inbox::tokio_postgres::types::ToSql + Sync) = &document;
    let rows = db
        .store()
        .query("SELECT $1::jsonb -> 'orderId'", &[param])
        .await
        .unwrap();
    assert_eq!(rows[0].get::<_, serde_json::Value>(0), "o-1");
}
