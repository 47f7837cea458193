//! `sb-inbox send` and `sb-inbox dlq peek|resubmit` as real processes of the built binary
//! against the in-process emulator: stable ids and duplicates, bad input, and a resubmitted
//! dead letter that had in fact been processed completing as a duplicate.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use sb_emulator::Emulator;
use sb_inbox::runtime::{DelayedRetry, JitterSource, RetryPolicy};
use sb_inbox::{
    ConsumerName, DuplicateScope, Outcome, Receiver, Runtime, RuntimeConfig, Sender as _,
};
use sb_inbox_cli::inventory::{OrderPlaced, OrderPlacedConsumer};

use crate::support::cli::{run_async, stderr, stdout};
use crate::support::emulator::{client, properties, queue, start};
use crate::support::handlers::Flaky;
use crate::support::orders::order;
use crate::support::{inventory_totals, pg_store};

/// A file of this test's own.
fn file(test: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("sb-inbox-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{test}.json"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The message ids on `orders` (read with our client's peek), with how often each was sent.
async fn ids_on_orders(emulator: &Emulator) -> BTreeMap<String, usize> {
    let mut ids = BTreeMap::new();
    for peeked in client(emulator).peek("orders", 0, 1000).await.unwrap() {
        let order: OrderPlaced = serde_json::from_slice(&peeked.message.body).unwrap();
        assert!(!order.lines.is_empty());
        assert_eq!(
            peeked.message.subject.as_deref(),
            Some("orders.order-placed.v1")
        );
        *ids.entry(peeked.message.message_id.unwrap()).or_default() += 1;
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_publishes_file_and_generated_orders_with_stable_ids_and_duplicates() {
    let emulator = crate::support::emulator::emulator("PT30S").await;
    let cs = emulator.connection_string();
    let path = file(
        "send_file",
        r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}], "messageId": "custom-1"},
            {"orderId": "o-2", "lines": [{"sku": "B", "quantity": 1}, {"sku": "C", "quantity": 3}]}]"#,
    );
    let output = run_async(
        Some(&cs),
        &[
            "send",
            "--entity",
            "orders",
            "--file",
            path.to_str().unwrap(),
            "--duplicates",
            "1",
            "--seed",
            "3",
        ],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).starts_with(
            "sent 3 message(s) to orders: 2 order(s), 1 duplicate(s) with the same message id, seed 3"
        ),
        "{}",
        stdout(&output)
    );
    let ids = ids_on_orders(&emulator).await;
    assert_eq!(
        ids.keys().collect::<Vec<_>>(),
        ["custom-1", "order-placed-o-2"]
    );
    assert_eq!(ids.values().sum::<usize>(), 3);

    // Generated: the same seed gives the same message ids, so a second run is all duplicates.
    let generate = [
        "send",
        "--entity",
        "orders",
        "--generate",
        "5",
        "--duplicates",
        "2",
        "--seed",
        "9",
    ];
    for _ in 0..2 {
        let output = run_async(Some(&cs), &generate).await;
        assert!(output.status.success(), "{}", stderr(&output));
        assert!(
            stdout(&output).starts_with("sent 7 message(s) to orders: 5 order(s), 2 duplicate(s)"),
            "{}",
            stdout(&output)
        );
    }
    let ids = ids_on_orders(&emulator).await;
    let generated: Vec<usize> = ids
        .iter()
        .filter(|(id, _)| id.starts_with("order-placed-gen-9-"))
        .map(|(_, n)| *n)
        .collect();
    assert_eq!(generated.len(), 5, "{ids:?}");
    assert_eq!(generated.iter().sum::<usize>(), 14);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_refuses_bad_input_with_a_clear_error_and_sends_nothing() {
    let emulator = crate::support::emulator::emulator("PT30S").await;
    let cs = emulator.connection_string();
    let good = r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 2}]}]"#;
    let good_path = file("bad_input_good", good);
    let good_path = good_path.to_str().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--file".into(), "/no/such/orders.json".into()],
            "cannot read /no/such/orders.json",
        ),
        (
            vec![
                "--file".into(),
                file("bad_json", "[{\"orderId\": \"o-1\",").display().to_string(),
            ],
            "is not a JSON array of orders",
        ),
        (
            vec![
                "--file".into(),
                file(
                    "bad_order",
                    r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 1}]}, {"orderId": "o-2", "lines": []}]"#,
                )
                .display()
                .to_string(),
            ],
            "order #2: an order needs at least one line",
        ),
        (
            vec![
                "--file".into(),
                file(
                    "zero_quantity",
                    r#"[{"orderId": "o-1", "lines": [{"sku": "A", "quantity": 0}]}]"#,
                )
                .display()
                .to_string(),
            ],
            "order #1: line #1: sku must not be empty and quantity must be at least 1",
        ),
        (
            vec!["--file".into(), file("empty", "[]").display().to_string()],
            "holds no orders",
        ),
        (
            vec![
                "--file".into(),
                good_path.into(),
                "--duplicates".into(),
                "2".into(),
            ],
            "--duplicates 2 is more than the 1 order(s)",
        ),
    ];
    for (args, expected) in cases {
        let mut all = vec!["send", "--entity", "orders"];
        all.extend(args.iter().map(String::as_str));
        let output = run_async(Some(&cs), &all).await;
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(
            stderr(&output).contains(expected),
            "{args:?}: expected {expected:?} in {}",
            stderr(&output)
        );
    }
    assert_eq!(emulator.broker().entity("orders").unwrap().counts().sent, 0);

    let output = run_async(
        Some(&cs),
        &["send", "--entity", "nope", "--file", good_path],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    let text = stderr(&output);
    assert!(
        text.contains("sending to nope failed after 0 of 1 message(s) were accepted")
            && text.contains("not found"),
        "{text}"
    );

    let output = run_async(None, &["send", "--entity", "orders", "--file", good_path]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output)
            .contains("give --connection (SB_INBOX_SERVICEBUS_CONNECTION) or --namespace"),
        "{}",
        stderr(&output)
    );
    let output = run_async(
        Some("Endpoint=sb://h;SharedAccessKeyName=k;SharedAccessKey=SECRET;Bogus=1"),
        &["send", "--entity", "orders", "--file", good_path],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("invalid --connection"),
        "{}",
        stderr(&output)
    );
    assert!(!stderr(&output).contains("SECRET"));
}

/// A queue whose first failed delivery dead-letters (max delivery count 1) and 1 s locks.
async fn strict_emulator() -> Emulator {
    start(
        vec![queue("orders", properties("PT1S", 1))],
        Default::default(),
    )
    .await
}

fn dead_letters(emulator: &Emulator) -> usize {
    emulator
        .broker()
        .entity("orders/$DeadLetterQueue")
        .unwrap()
        .counts()
        .active
}

/// Two dead letters: `m-1` was processed but its completion was refused, so its lock ran out
/// into the DLQ (`MaxDeliveryCountExceeded`); `m-2` failed transiently until its one delayed
/// retry was spent (`RetriesExhausted`). `dlq peek` shows both without bodies; `dlq resubmit`
/// puts `m-2` back (selected by its logical id), then `m-1`; a healthy consumer then processes
/// `m-2` and recognises `m-1` as a duplicate: no second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_peek_and_resubmit_recognise_a_processed_message_as_a_duplicate() {
    let store = pg_store("cli_dlq_resubmit", 2).await;
    let emulator = strict_emulator().await;
    let cs = emulator.connection_string();
    let client = client(&emulator);
    let publisher = sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone());
    for (id, order_id) in [("m-1", "o-1"), ("m-2", "o-2")] {
        publisher
            .send("orders", order(id, order_id), None)
            .await
            .unwrap();
    }
    let consumer = || ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap();
    let receiver = client.receiver("orders", 0);
    let healthy = Runtime::new(
        receiver.clone(),
        store.clone(),
        OrderPlacedConsumer::new(),
        RuntimeConfig::new(consumer()),
    );
    let mut config = RuntimeConfig::new(consumer());
    let policy = RetryPolicy::new(1, Duration::from_millis(200), Duration::from_secs(1))
        .unwrap()
        .with_jitter(0.0, JitterSource::fixed(0.0))
        .unwrap();
    config.delayed_retry = Some(DelayedRetry::new(policy, publisher.clone(), "orders"));
    let failing = Runtime::new(
        receiver.clone(),
        store.clone(),
        Flaky::new(OrderPlacedConsumer::new(), u32::MAX),
        config,
    );

    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .refuse_dispositions(u32::MAX)
        .unwrap();
    // Busy answers are retried until the lock (1 s) runs out; then the settlement has failed.
    let report = healthy
        .process(receiver.receive().await.unwrap().unwrap())
        .await;
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .refuse_dispositions(0)
        .unwrap();
    assert_eq!(report.outcome, Outcome::Processed);
    assert!(matches!(report.settled, Some(Err(_))), "{report:?}");
    let report = failing
        .process(receiver.receive().await.unwrap().unwrap())
        .await;
    assert_eq!(report.retry.map(|r| r.attempt), Some(1));
    let report = failing
        .process(receiver.receive().await.unwrap().unwrap())
        .await;
    assert_eq!(
        report.outcome,
        Outcome::Permanent(sb_inbox::DeadLetterReason::RetriesExhausted)
    );
    let emulator_ref = &emulator;
    crate::verification::until("both are dead letters", move || async move {
        dead_letters(emulator_ref) == 2
    })
    .await;

    let output = run_async(Some(&cs), &["dlq", "peek", "--entity", "orders"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    let has = |fields: &str| {
        lines[..2]
            .iter()
            .any(|l| l.starts_with("seq=") && l.contains(fields))
    };
    assert!(
        has(
            r#"message_id="m-1" logical_id="m-1" subject="orders.order-placed.v1" delivery_count=1 reason="MaxDeliveryCountExceeded""#
        ),
        "{text}"
    );
    assert!(
        has(
            r#"message_id="m-2/retry-1" logical_id="m-2" subject="orders.order-placed.v1" delivery_count=0 reason="RetriesExhausted" description="delayed retries exhausted (1 of 1, 2 attempts in all); last error: injected failure"#
        ),
        "{text}"
    );
    assert_eq!(lines[2], "2 dead letter(s) in orders/$DeadLetterQueue");
    assert!(!text.contains("orderId"), "the body is never printed");

    let resubmit = |extra: &'static [&'static str]| {
        let cs = cs.clone();
        async move {
            let mut args = vec!["dlq", "resubmit", "--entity", "orders", "--wait-secs", "1"];
            args.extend(extra);
            run_async(Some(&cs), &args).await
        }
    };
    let output = resubmit(&["--message-id", "m-2"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains(
            r#"resubmitted message_id="m-2/retry-1" as "m-2/resubmit-1" logical_id="m-2""#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"left message_id="m-1": does not match --message-id"#),
        "{text}"
    );
    assert!(
        text.ends_with(
            "1 dead letter(s) resubmitted from orders/$DeadLetterQueue to orders, 1 left\n"
        ),
        "{text}"
    );
    assert_eq!(dead_letters(&emulator), 1, "m-1 is back in the DLQ");

    let output = resubmit(&[]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output)
            .contains(r#"resubmitted message_id="m-1" as "m-1/resubmit-1" logical_id="m-1""#),
        "{}",
        stdout(&output)
    );
    assert_eq!(dead_letters(&emulator), 0);

    let mut outcomes = BTreeMap::new();
    for _ in 0..2 {
        let delivery = receiver.receive().await.unwrap().unwrap();
        let id = sb_inbox::Delivery::message(&delivery)
            .message_id
            .clone()
            .unwrap();
        let report = healthy.process(delivery).await;
        assert_eq!(report.settled, Some(Ok(())), "{report:?}");
        outcomes.insert(id, report.outcome);
    }
    receiver.close().await;
    assert_eq!(
        outcomes,
        BTreeMap::from([
            (
                "m-1/resubmit-1".to_owned(),
                Outcome::Duplicate(DuplicateScope::Inbox)
            ),
            ("m-2/resubmit-1".to_owned(), Outcome::Processed),
        ])
    );
    assert_eq!(
        inventory_totals(&store).await,
        (2, 2, 4),
        "m-1 took effect once, m-2 once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_commands_refuse_unknown_entities_and_subscriptions_without_a_destination() {
    let emulator = crate::support::emulator::emulator("PT30S").await;
    let cs = emulator.connection_string();
    for args in [
        ["dlq", "peek", "--entity", "nope"].as_slice(),
        ["dlq", "resubmit", "--entity", "nope", "--wait-secs", "1"].as_slice(),
    ] {
        let output = run_async(Some(&cs), args).await;
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        assert!(
            stderr(&output).contains("not found"),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let output = run_async(
        Some(&cs),
        &[
            "dlq",
            "resubmit",
            "--entity",
            "orders/Subscriptions/inventory",
        ],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("pass --to"), "{}", stderr(&output));
    let output = run_async(Some(&cs), &["dlq", "peek", "--entity", "orders"]).await;
    assert!(output.status.success());
    assert_eq!(
        stdout(&output),
        "0 dead letter(s) in orders/$DeadLetterQueue\n"
    );
}

/// Issue 29: `dlq peek` and `dlq resubmit` on a session queue. Its dead-letter queue is read
/// with a plain receiver, as on the service (refused as "non-sessionful" before); the copy
/// keeps its session id, so it comes back in its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_peek_and_resubmit_work_on_a_session_queue() {
    let sessions = sb_emulator::EntityProperties {
        requires_session: true,
        ..properties("PT30S", 5)
    };
    let emulator = start(vec![queue("orders", sessions)], Default::default()).await;
    let cs = emulator.connection_string();
    let client = client(&emulator);
    let mut message = order("s-1", "o-1");
    message.session_id = Some("customer-7".into());
    sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone())
        .send("orders", message, None)
        .await
        .unwrap();
    let session = client.accept_session("orders", "customer-7").await.unwrap();
    let delivery = session
        .receive(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    delivery
        .dead_letter("Poison", "cannot handle it")
        .await
        .unwrap();
    session.close().await;
    assert_eq!(dead_letters(&emulator), 1);

    let output = run_async(Some(&cs), &["dlq", "peek", "--entity", "orders"]).await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(r#"message_id="s-1" logical_id="s-1""#),
        "{}",
        stdout(&output)
    );
    resubmit_the_one_dead_letter(&emulator).await;
    let session = client.accept_session("orders", "customer-7").await.unwrap();
    let copy = session
        .receive(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let message = copy.message();
    assert_eq!(message.message_id.as_deref(), Some("s-1/resubmit-1"));
    assert_eq!(message.session_id.as_deref(), Some("customer-7"));
    copy.complete().await.unwrap();
    session.close().await;
}

/// Issue 29 item 13: `dlq resubmit --wait-secs 1` against a namespace whose attach takes 1.5 s
/// (`--attach-delay`) resubmits the dead letter: the idle window starts once the link is
/// attached (before: connecting used the window up and it reported 0 resubmitted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_resubmit_counts_its_idle_window_from_the_attached_link() {
    // Locks outlast the slow attach of the copy's sender.
    let emulator = crate::support::emulator::emulator("PT30S").await;
    let client = client(&emulator);
    sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone())
        .send("orders", order("d-1", "o-1"), None)
        .await
        .unwrap();
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().unwrap();
    sb_inbox::Delivery::dead_letter(&delivery, "Poison", "cannot handle it")
        .await
        .unwrap();
    receiver.close().await;
    assert_eq!(dead_letters(&emulator), 1);
    emulator.set_attach_delay(Duration::from_millis(1500));
    resubmit_the_one_dead_letter(&emulator).await;
}

/// `sb-inbox dlq resubmit --entity orders --wait-secs 1` resubmits the one dead letter of
/// `orders` and leaves none.
async fn resubmit_the_one_dead_letter(emulator: &Emulator) {
    let cs = emulator.connection_string();
    let output = run_async(
        Some(&cs),
        &["dlq", "resubmit", "--entity", "orders", "--wait-secs", "1"],
    )
    .await;
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).ends_with(
            "1 dead letter(s) resubmitted from orders/$DeadLetterQueue to orders, 0 left\n"
        ),
        "{}",
        stdout(&output)
    );
    assert_eq!(dead_letters(emulator), 0);
}
