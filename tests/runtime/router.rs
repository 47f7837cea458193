//! The reference consumer's router (`sb_inbox_cli::inventory::router`, what `sb-inbox run`
//! hosts) on real stores: orders v1 (upcast) and v2, cancellations, duplicates of each, and a
//! cancellation that arrives before its order; every effect once.

use std::time::Duration;

use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, Delivery, DuplicateScope, Message, Outcome, Runtime, SqliteStore, StoreTx, Tx,
};
use sb_inbox_cli::inventory::{
    self, CANCELLED_CONTRACT, CONTRACT_V2, InventoryStore, InventoryTx, StockReserved,
};

use crate::support::orders::{order, two_line_order};
use crate::support::runtime::batched;
use crate::support::{inventory_totals, pg_store, sqlite_store};

const INVENTORY: &str = inventory::CONSUMER;

fn placed_v2(id: &str, order_id: &str, channel: &str) -> Message {
    let body = format!(
        r#"{{"orderId":"{order_id}","lines":[{{"sku":"A","quantity":2}},{{"sku":"C","quantity":4}}],"channel":"{channel}"}}"#
    );
    Message::new(id, CONTRACT_V2, body)
}

fn cancelled(id: &str, order_id: &str) -> Message {
    Message::new(
        id,
        CANCELLED_CONTRACT,
        format!(r#"{{"orderId":"{order_id}"}}"#),
    )
}

async fn routes_each_contract_once<S>(store: S)
where
    S: InventoryStore + Clone,
    S::Tx: InventoryTx + 'static,
{
    let broker = MemoryBroker::new(Clock::new());
    let mut config = batched(INVENTORY, 1);
    // A transient failure (the early cancellation) is abandoned at once: no hold to wait out.
    config.transient_hold_max = Duration::ZERO;
    let router = inventory::router::<S::Tx>(None).unwrap();
    let runtime = Runtime::new(broker.receiver(), store.clone(), router, config);
    let process = |message: Message| {
        broker.send(message);
        let delivery = broker.try_receive().unwrap();
        let runtime = &runtime;
        async move { runtime.process(delivery).await.outcome }
    };

    // v1, upcast to v2: 2 units of A.
    assert_eq!(process(order("m-1", "o-1")).await, Outcome::Processed);
    // v2: 2 of A, 4 of C.
    assert_eq!(
        process(placed_v2("m-2", "o-2", "app")).await,
        Outcome::Processed
    );
    // v1 with two lines: 2 of A, 1 of B.
    assert_eq!(
        process(two_line_order("m-3", "o-3")).await,
        Outcome::Processed
    );
    assert_eq!(inventory_totals(&store).await, (3, 3, 11));

    // The same message id again (a redelivery after a lost settlement), and the same order
    // republished under a new id, as v1 and as v2: duplicates, no new effect.
    let inbox = Outcome::Duplicate(DuplicateScope::Inbox);
    let key = Outcome::Duplicate(DuplicateScope::BusinessKey);
    assert_eq!(process(placed_v2("m-2", "o-2", "app")).await, inbox);
    assert_eq!(process(order("m-1b", "o-2")).await, key);
    assert_eq!(process(placed_v2("m-1c", "o-1", "web")).await, key);
    assert_eq!(inventory_totals(&store).await, (3, 3, 11));

    // Cancelling o-2 releases its 6 units; the same cancellation redelivered and republished
    // releases nothing more.
    assert_eq!(process(cancelled("c-2", "o-2")).await, Outcome::Processed);
    assert_eq!(inventory_totals(&store).await, (2, 4, 5));
    assert_eq!(process(cancelled("c-2", "o-2")).await, inbox);
    assert_eq!(process(cancelled("c-2b", "o-2")).await, key);
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reserved_units, counts.line_units), (5, 5));

    // A cancellation before its order: nothing to release, retried (abandoned, not recorded);
    // once the order is there the redelivery releases it.
    assert_eq!(process(cancelled("c-4", "o-4")).await, Outcome::Transient);
    assert_eq!(inventory_totals(&store).await, (2, 4, 5));
    let redelivered = broker.try_receive().unwrap();
    assert_eq!(redelivered.message().message_id.as_deref(), Some("c-4"));
    assert_eq!(process(order("m-4", "o-4")).await, Outcome::Processed);
    assert_eq!(inventory_totals(&store).await, (3, 5, 7));
    assert_eq!(
        runtime.process(redelivered).await.outcome,
        Outcome::Processed
    );
    assert_eq!(inventory_totals(&store).await, (2, 6, 5));

    assert!(
        broker.dead_letters().is_empty(),
        "{:?}",
        broker.dead_letters()
    );
    let mut tx = store.begin().await.unwrap();
    // The released order's key stays claimed: a late copy of it cannot reserve again.
    let claim = tx.claim_business_key(INVENTORY, "order:o-2", "late").await;
    assert!(claim.is_err());
    tx.rollback().await.unwrap();
}

#[tokio::test]
async fn the_inventory_router_applies_each_contract_once_on_sqlite() {
    routes_each_contract_once(sqlite_store("router", 1).await).await;
}

#[tokio::test]
async fn the_inventory_router_applies_each_contract_once_on_postgres() {
    routes_each_contract_once(pg_store("rt_inventory_router", 2).await).await;
}

#[tokio::test]
async fn a_v2_order_needs_its_channel_and_the_reservation_event_carries_it() {
    let store: SqliteStore = sqlite_store("router_events", 1).await;
    let broker = MemoryBroker::new(Clock::new());
    let router = inventory::router(Some("reservations")).unwrap();
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        router,
        batched(INVENTORY, 1),
    );
    let tolerant = r#"{"orderId":"o-3","lines":[{"sku":"A","quantity":1,"note":"gift"}],"channel":"app","coupon":"X"}"#;
    let cases = [
        (placed_v2("m-1", "o-1", "app"), Outcome::Processed),
        // Upcast from v1: the channel v1 did not carry.
        (order("m-2", "o-2"), Outcome::Processed),
        // Tolerant: fields neither version knows are ignored.
        (
            Message::new("m-3", CONTRACT_V2, tolerant),
            Outcome::Processed,
        ),
        (
            Message::new(
                "m-4",
                CONTRACT_V2,
                r#"{"orderId":"o-4","lines":[{"sku":"A","quantity":2}]}"#,
            ),
            Outcome::Permanent(sb_inbox::DeadLetterReason::InvalidPayload),
        ),
        (
            placed_v2("m-5", "o-5", ""),
            Outcome::Permanent(sb_inbox::DeadLetterReason::InvalidPayload),
        ),
    ];
    for (message, expected) in cases {
        broker.send(message);
        let delivery = broker.try_receive().unwrap();
        assert_eq!(runtime.process(delivery).await.outcome, expected);
    }
    let bodies: Vec<Vec<u8>> = store
        .with_connection(|conn| {
            let mut statement = conn.prepare("SELECT body FROM sb_outbox ORDER BY id")?;
            let rows = statement.query_map([], |row| row.get(0))?;
            rows.collect()
        })
        .await
        .unwrap();
    let channels: Vec<Option<String>> = bodies
        .iter()
        .map(|body| {
            serde_json::from_slice::<StockReserved>(body)
                .unwrap()
                .channel
        })
        .collect();
    assert_eq!(
        channels,
        [
            Some("app".to_owned()),
            Some(inventory::UNKNOWN_CHANNEL.to_owned()),
            Some("app".to_owned())
        ]
    );
    let reasons: Vec<String> = broker
        .dead_letters()
        .into_iter()
        .map(|d| d.description)
        .collect();
    assert!(
        reasons[0].starts_with("invalid JSON: data does not match"),
        "{reasons:?}"
    );
    assert!(
        reasons[1].contains("channel must be 1 to 32 characters"),
        "{reasons:?}"
    );
}
