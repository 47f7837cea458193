//! The reference consumer's router (`sb_inbox_cli::inventory::router`) run by two real
//! `sb-inbox run` processes against the emulator and PostgreSQL (issue 34): three contracts
//! (`orders.order-placed.v1` upcast to `.v2`, `orders.order-placed.v2`,
//! `orders.order-cancelled.v1`), each message sent twice under one id, republished under a new
//! id, and one redelivered after a refused completion; every effect once. Unknown contracts:
//! dead-lettered `UnsupportedContract` on `orders` (the default) and completed on `shared`
//! (`unknown_contracts = "complete"` on that consumer); a version no route accepts is
//! dead-lettered `UnsupportedContractVersion` on both.

use std::collections::BTreeMap;
use std::time::Duration;

use sb_inbox::Message;
use sb_inbox_cli::inventory::{
    CANCELLED_CONTRACT, CONSUMER, CONTRACT, CONTRACT_V2, InventoryStore,
};

use crate::support::cli;
use crate::support::emulator::{client, properties, queue, start};
use crate::support::{pg_store, pg_url, schema_for, with_search_path};
use crate::worker::{health_address, queue_drained, ready, sigterm_exits_0};

const SCHEMA: &str = "sb_router_processes";

/// `orders.order-placed.v1`: `units` of SKU A.
fn placed(id: &str, order: &str, units: i32) -> Message {
    let body = format!(r#"{{"orderId":"{order}","lines":[{{"sku":"A","quantity":{units}}}]}}"#);
    Message::new(id, CONTRACT, body)
}

/// `orders.order-placed.v2`: `units` of SKU B, channel `app`.
fn placed_v2(id: &str, order: &str, units: i32) -> Message {
    let body = format!(
        r#"{{"orderId":"{order}","lines":[{{"sku":"B","quantity":{units}}}],"channel":"app"}}"#
    );
    Message::new(id, CONTRACT_V2, body)
}

fn cancelled(id: &str, order: &str) -> Message {
    Message::new(
        id,
        CANCELLED_CONTRACT,
        format!(r#"{{"orderId":"{order}"}}"#),
    )
}

/// The worker.toml of both processes: the reference consumer on `orders` (unknown contracts
/// dead-lettered) and on `shared` (completed), in one PostgreSQL schema.
fn worker_toml(dir: &std::path::Path) -> std::path::PathBuf {
    let store = with_search_path(&pg_url(), &schema_for(SCHEMA));
    let toml = format!(
        r#"store = "{store}"
[runtime]
concurrency = 4
lock_margin_secs = 1
shutdown_grace_secs = 5
[[consumers]]
name = "{CONSUMER}"
entity = "orders"
[[consumers]]
name = "inventory.shared"
entity = "shared"
unknown_contracts = "complete"
"#
    );
    let path = dir.join("worker.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

async fn spawn(connection: &str, config: &std::path::Path) -> std::process::Child {
    let mut child = cli::command(Some(connection), &["run", "--config"])
        .arg(config)
        .env("SB_INBOX_HEALTH_PORT", "0")
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let addr = tokio::task::spawn_blocking(move || health_address(stderr))
        .await
        .unwrap();
    ready(addr).await;
    child
}

/// Waits (bounded) until `done` holds for the peeked messages of `entity`.
async fn until_peeked(
    sb: &sb_inbox::servicebus::ServiceBusClient,
    entity: &str,
    what: &str,
    done: impl Fn(&[sb_inbox::servicebus::PeekedMessage]) -> bool,
) {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            if done(&sb.peek(entity, 0, 100).await.unwrap()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("never saw {what}"));
}

/// Dead letters of `entity` by message id: `(reason, description)`.
async fn dead_letters(
    sb: &sb_inbox::servicebus::ServiceBusClient,
    entity: &str,
) -> BTreeMap<String, String> {
    sb.peek(&format!("{entity}/$DeadLetterQueue"), 0, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|p| {
            let id = p.message.message_id.clone().unwrap_or_default();
            (id, p.dead_letter_reason().unwrap_or_default().to_owned())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn router_processes_apply_each_contract_once_and_treat_unknown_contracts_as_configured() {
    crate::support::init_tracing();
    let store = pg_store(SCHEMA, 2).await;
    let emulator = start(
        vec![
            // A short lock: the refused completion below turns into a redelivery in seconds.
            queue("orders", properties("PT3S", 5)),
            queue("shared", properties("PT30S", 5)),
        ],
        Default::default(),
    )
    .await;
    let sb = client(&emulator);
    let dir = std::env::temp_dir().join(format!("sb-inbox-router-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = worker_toml(&dir);
    let connection = emulator.connection_string();
    let workers = [
        spawn(&connection, &config).await,
        spawn(&connection, &config).await,
    ];
    let orders = sb.sender("orders");
    let entity = emulator.broker().entity("orders").unwrap();

    // A redelivery: the order commits, its completion is refused until its lock runs out, and
    // it comes back (delivery count 2) to meet its inbox row. "When the lock expires, the
    // DeliveryCount is incremented and the message is again available for retrieval"
    // (`ServiceBusReceivedMessage.LockedUntil`, https://learn.microsoft.com/dotnet/api/
    // azure.messaging.servicebus.servicebusreceivedmessage.lockeduntil); the emulator does the
    // same.
    entity.refuse_dispositions(u32::MAX).unwrap();
    orders.send(placed("m-r", "o-r", 1)).await.unwrap();
    until_peeked(&sb, "orders", "m-r redelivered", |peeked| {
        peeked.iter().any(|p| p.delivery_count >= 2)
    })
    .await;
    entity.refuse_dispositions(0).unwrap();
    queue_drained(&emulator, "orders", 1).await;

    // Orders: v1 (upcast) and v2, two of each sent twice under one id, one republished under a
    // new id as the other version; a contract nobody here handles, a version no route accepts
    // and a v1 body the upcaster cannot decode.
    let mut units: BTreeMap<&str, i32> = BTreeMap::from([("o-r", 1)]);
    let mut sent = 1;
    for (i, order) in ["o-1", "o-2", "o-3", "o-4"].into_iter().enumerate() {
        let n = i32::try_from(i).unwrap() + 1;
        let message = placed(&format!("m-{order}"), order, n);
        if i < 2 {
            orders.send(message.clone()).await.unwrap();
            sent += 1;
        }
        orders.send(message).await.unwrap();
        sent += 1;
        units.insert(order, n);
    }
    for (i, order) in ["o-5", "o-6", "o-7"].into_iter().enumerate() {
        let n = 10 * (i32::try_from(i).unwrap() + 1);
        let message = placed_v2(&format!("m-{order}"), order, n);
        if i == 0 {
            orders.send(message.clone()).await.unwrap();
            sent += 1;
        }
        orders.send(message).await.unwrap();
        sent += 1;
        units.insert(order, n);
    }
    // The originals commit before their republished copies are sent: with two workers the
    // first to commit a business key wins, so sending both at once would leave the winner to
    // chance.
    queue_drained(&emulator, "orders", sent).await;
    orders
        .send(placed_v2("m-o-3-again", "o-3", 99))
        .await
        .unwrap();
    orders.send(placed("m-o-6-again", "o-6", 99)).await.unwrap();
    orders
        .send(Message::new(
            "x-unknown",
            "billing.invoice-sent.v1",
            r#"{"invoiceId":"i-1"}"#,
        ))
        .await
        .unwrap();
    let v3 = r#"{"orderId":"o-x","lines":[{"sku":"A","quantity":1}],"channel":"app"}"#;
    orders
        .send(Message::new("x-v3", "orders.order-placed.v3", v3))
        .await
        .unwrap();
    orders
        .send(Message::new(
            "x-bad-v1",
            CONTRACT,
            r#"{"orderId":"o-y","lines":[]}"#,
        ))
        .await
        .unwrap();
    sent += 5;
    queue_drained(&emulator, "orders", sent).await;

    // Cancellations after their orders: one sent twice, one republished under a new id.
    for message in [
        cancelled("c-o-1", "o-1"),
        cancelled("c-o-1", "o-1"),
        cancelled("c-o-6", "o-6"),
        cancelled("c-o-6-again", "o-6"),
    ] {
        orders.send(message).await.unwrap();
        sent += 1;
    }
    units.remove("o-1");
    units.remove("o-6");
    queue_drained(&emulator, "orders", sent).await;

    // The shared entity completes what it does not know, still dead-letters a version of a
    // contract it does know, and processes its own orders.
    let shared = sb.sender("shared");
    shared
        .send(Message::new("s-unknown", "billing.invoice-sent.v1", "{}"))
        .await
        .unwrap();
    shared.send(placed_v2("s-order", "o-s", 7)).await.unwrap();
    shared
        .send(Message::new("s-v9", "orders.order-placed.v9", v3))
        .await
        .unwrap();
    units.insert("o-s", 7);
    queue_drained(&emulator, "shared", 3).await;

    for worker in workers {
        sigterm_exits_0(worker).await;
    }

    let expected_dead = BTreeMap::from([
        ("x-bad-v1".to_owned(), "InvalidPayload".to_owned()),
        ("x-unknown".to_owned(), "UnsupportedContract".to_owned()),
        ("x-v3".to_owned(), "UnsupportedContractVersion".to_owned()),
    ]);
    assert_eq!(dead_letters(&sb, "orders").await, expected_dead);
    let shared_dead = dead_letters(&sb, "shared").await;
    assert_eq!(
        shared_dead,
        BTreeMap::from([("s-v9".to_owned(), "UnsupportedContractVersion".to_owned())])
    );
    let orders_counts = entity.counts();
    assert_eq!(orders_counts.completed, sent - 3, "{orders_counts:?}");
    let shared_counts = emulator.broker().entity("shared").unwrap().counts();
    assert_eq!(
        (shared_counts.completed, shared_counts.dead_lettered),
        (2, 1),
        "{shared_counts:?}"
    );

    // Each order once, each cancellation once: the reserved units are exactly those of the
    // orders not cancelled, and match their lines.
    let counts = store.inventory_counts().await.unwrap();
    let reserved: i64 = units.values().map(|&n| i64::from(n)).sum();
    assert_eq!(counts.reservations, i64::try_from(units.len()).unwrap());
    assert_eq!(
        (counts.reserved_units, counts.line_units),
        (reserved, reserved)
    );
    // Inbox rows of the orders consumer: m-r, seven orders, two cancellations (duplicates,
    // republished copies and dead letters leave none).
    assert_eq!(counts.inbox_rows, 10);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Session mode takes the router unchanged: one session's v1 order (upcast), another team's
/// event (completed under `UnknownContracts::Complete`) and a v2 order on the emulator's
/// session queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_consumer_routes_and_completes_unknown_contracts() {
    use sb_inbox::servicebus::ServiceBusSessionSource;
    use sb_inbox::{ConsumerName, Runtime, RuntimeConfig, SessionConfig, UnknownContracts};

    let store = crate::support::sqlite_store("router_sessions", 2).await;
    let emulator = crate::sessions::session_emulator("PT5S", Default::default()).await;
    let sb = client(&emulator);
    let sender = sb.sender("sq");
    let in_session = |mut message: Message| {
        message.session_id = Some("A".to_owned());
        message
    };
    for message in [
        placed("a1", "o-a1", 1),
        Message::new("a2", "billing.invoice-sent.v1", "{}"),
        placed_v2("a3", "o-a3", 2),
    ] {
        sender.send(in_session(message)).await.unwrap();
    }
    let config = RuntimeConfig::new(ConsumerName::new(CONSUMER).unwrap())
        .with_unknown_contracts(UnknownContracts::Complete);
    let router = sb_inbox_cli::inventory::router(None).unwrap();
    let runtime = std::sync::Arc::new(Runtime::for_sessions(
        ServiceBusSessionSource::new(sb.clone(), "sq").with_accept_wait(Duration::from_secs(1)),
        store.clone(),
        router,
        config,
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (runtime, stop) = (runtime.clone(), stop.clone());
        async move {
            let sessions = SessionConfig::default()
                .with_max_sessions(1)
                .with_idle(Duration::from_secs(1));
            runtime.run_sessions(sessions, stop).await
        }
    });
    let stats = runtime.stats();
    crate::survival::until("the session is handled", Duration::from_secs(30), || {
        let done = stats.snapshot();
        async move { done.processed + done.ignored == 3 }
    })
    .await;
    stop.cancel();
    running.await.unwrap().unwrap();
    let done = stats.snapshot();
    assert_eq!(
        (done.processed, done.ignored, done.permanent),
        (2, 1, 0),
        "{done:?}"
    );
    let counts = emulator.broker().entity("sq").unwrap().counts();
    assert_eq!(
        (counts.completed, counts.dead_lettered),
        (3, 0),
        "{counts:?}"
    );
    let reserved = store
        .with_connection(|conn| {
            let mut statement =
                conn.prepare("SELECT order_id FROM inventory_reservation ORDER BY order_id")?;
            let rows = statement.query_map([], |row| row.get::<_, String>(0))?;
            rows.collect::<Result<Vec<_>, _>>()
        })
        .await
        .unwrap();
    assert_eq!(reserved, ["o-a1", "o-a3"]);
    assert_eq!(store.inventory_counts().await.unwrap().inbox_rows, 2);
}
