//! Telemetry end to end: the runtime over our Service Bus client against the in-process
//! emulator, SQLite, and the OTLP/gRPC exporter sending to an in-process receiver. One test
//! binary of its own because the exporter and the tracing subscriber are process-global.
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

#[path = "../support/mod.rs"]
mod support;

mod metrics_off;
mod sink;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::metrics::v1::{Metric, metric::Data};
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use sb_emulator::Emulator;
use sb_inbox::BacklogSample;
use sb_inbox::telemetry::hooks::{observe_outbox, observe_retention};
use sb_inbox::telemetry::names::{attr, metric, value};
use sb_inbox::telemetry::{Telemetry, TelemetryConfig};
use sb_inbox::{
    ConsumerName, Context, Contract, DeadLetterReason, DecodeError, Handled, Handler, HandlerError,
    Message, Outcome, Receiver, Runtime, RuntimeConfig, UnknownContracts,
};
use sb_inbox_cli::inventory::{CONSUMER, OrderPlacedConsumer};

use sink::{Sink, attribute, pairs};
use support::emulator::{client, properties, queue, start};

/// A second consumer hosted beside [`CONSUMER`] (its series of the shared outbox and retention).
const OTHER_CONSUMER: &str = "shop.payments";

/// The fake upstream producer's context in `traceparent`.
const PRODUCER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PRODUCER_SPAN: &str = "00f067aa0ba902b7";

/// `orders` (30 s lock) for processed, duplicate and dead-lettered messages; `locky` (1 s lock)
/// for a lost lock; `shared` for an unknown contract completed (`UnknownContracts::Complete`).
async fn emulator() -> Emulator {
    start(
        vec![
            queue("orders", properties("PT30S", 5)),
            queue("locky", properties("PT1S", 5)),
            queue("shared", properties("PT30S", 5)),
            queue("windowed", properties("PT30S", 5)),
        ],
        Default::default(),
    )
    .await
}

/// Never finishes handling: only a lost lock (or shutdown) ends it.
#[derive(Debug)]
struct Hang(OrderPlacedConsumer);

impl<T: sb_inbox_cli::inventory::InventoryTx> Handler<T> for Hang {
    type Payload = <OrderPlacedConsumer as Handler<T>>::Payload;

    fn contracts(&self) -> &[Contract] {
        Handler::<T>::contracts(&self.0)
    }

    fn decode(&self, contract: &Contract, body: &[u8]) -> Result<Self::Payload, DecodeError> {
        Handler::<T>::decode(&self.0, contract, body)
    }

    async fn handle(
        &self,
        _ctx: &Context<'_, Self::Payload>,
        _tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        std::future::pending().await
    }
}

/// Order `o-{id}` under message id `id`: one unit of `A`.
fn order(id: &str) -> Message {
    support::orders::order_with_lines(id, &format!("o-{id}"), &[("A", 1)])
}

/// Exports everything recorded so far and waits for the receiver's answers.
async fn flush(telemetry: &Arc<Telemetry>) {
    let telemetry = telemetry.clone();
    tokio::task::spawn_blocking(move || telemetry.flush())
        .await
        .unwrap()
        .unwrap();
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn attr_of(span: &Span, key: &str) -> Option<String> {
    attribute(&span.attributes, key)
}

/// The one span named `name` with all the `expected` attributes.
fn span_with<'a>(spans: &'a [Span], name: &str, expected: &[(&str, &str)]) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .filter(|s| {
            s.name == name
                && expected
                    .iter()
                    .all(|(k, v)| attr_of(s, k).as_deref() == Some(*v))
        })
        .collect();
    assert_eq!(
        found.len(),
        1,
        "one {name} span with {expected:?}: {found:#?}"
    );
    found[0]
}

fn children<'a>(spans: &'a [Span], parent: &Span) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id && s.trace_id == parent.trace_id)
        .collect()
}

/// The last export of metric `name` (cumulative, so it holds every series).
fn last_metric<'a>(metrics: &'a [Metric], name: &str) -> &'a Metric {
    metrics
        .iter()
        .rev()
        .find(|m| m.name == name)
        .unwrap_or_else(|| panic!("metric {name} was not exported"))
}

/// Each data point of a metric as (labels, value: sum or histogram count).
fn points(metric: &Metric) -> Vec<(BTreeMap<String, String>, f64)> {
    let labels = |kv: &[opentelemetry_proto::tonic::common::v1::KeyValue]| {
        pairs(kv).into_iter().collect::<BTreeMap<_, _>>()
    };
    let number = |v: &Option<opentelemetry_proto::tonic::metrics::v1::number_data_point::Value>| {
        use opentelemetry_proto::tonic::metrics::v1::number_data_point::Value;
        match v {
            Some(Value::AsInt(n)) => *n as f64,
            Some(Value::AsDouble(f)) => *f,
            None => f64::NAN,
        }
    };
    match metric.data.as_ref().unwrap() {
        Data::Sum(sum) => sum
            .data_points
            .iter()
            .map(|p| (labels(&p.attributes), number(&p.value)))
            .collect(),
        Data::Gauge(gauge) => gauge
            .data_points
            .iter()
            .map(|p| (labels(&p.attributes), number(&p.value)))
            .collect(),
        Data::Histogram(histogram) => histogram
            .data_points
            .iter()
            .map(|p| (labels(&p.attributes), p.count as f64))
            .collect(),
        other => panic!("unexpected data {other:?}"),
    }
}

fn has(labels: &BTreeMap<String, String>, expected: &[(&str, &str)]) -> bool {
    expected
        .iter()
        .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
}

/// The sum of the points of `metric` whose labels include `expected`.
fn total(metric: &Metric, expected: &[(&str, &str)]) -> f64 {
    points(metric)
        .iter()
        .filter(|(labels, _)| has(labels, expected))
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spans_and_metrics_of_processed_duplicate_dead_lettered_and_lock_lost_messages() {
    let (sink, addr) = Sink::start().await;
    let mut config = TelemetryConfig::new();
    config.endpoint = Some(format!("http://{addr}"));
    config.service_name = "sb-inbox-test".to_owned();
    config.resource_attributes = vec![("deployment.environment.name".into(), "test".into())];
    config.log_filter = "warn".to_owned();
    let telemetry = Arc::new(sb_inbox::telemetry::init(&config).unwrap());
    assert!(telemetry.exporting());
    // A worker hosting two consumers: its one relay and retention report under both names.
    let _outbox = observe_outbox(&[CONSUMER, OTHER_CONSUMER], || BacklogSample {
        pending: 3,
        oldest_age: Duration::from_secs(7),
    });
    let _retention = observe_retention(&[CONSUMER, OTHER_CONSUMER], || 11);

    let emulator = emulator().await;
    let client = client(&emulator);
    let sender = client.sender("orders");
    let mut first = order("m-1");
    first.correlation_id = Some("c-1".into());
    for (key, value) in [
        (
            "traceparent",
            format!("00-{PRODUCER_TRACE}-{PRODUCER_SPAN}-01"),
        ),
        ("producer", "checkout".to_owned()),
        ("causation-id", "cause-1".to_owned()),
    ] {
        first
            .application_properties
            .insert(key.into(), value.into());
    }
    sender.send(first.clone()).await.unwrap();
    sender.send(first).await.unwrap();
    sender.send(order("m-2")).await.unwrap();
    // No trace context: the sender stamps its own send span's.
    sender
        .send(Message::new("m-poison", "orders.order-placed.v1", "{nope"))
        .await
        .unwrap();
    client.sender("locky").send(order("m-lock")).await.unwrap();

    let store = support::sqlite_store("telemetry", 1).await;
    let consumer = ConsumerName::new(CONSUMER).unwrap();
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(
        receiver.clone(),
        store.clone(),
        OrderPlacedConsumer::new(),
        RuntimeConfig::new(consumer.clone()),
    );
    let mut outcomes = Vec::new();
    for i in 0..4 {
        if i == 2 {
            // m-2 commits, then every completion is refused until its lock runs out (the crash
            // window: a busy answer alone is retried).
            emulator
                .broker()
                .entity("orders")
                .unwrap()
                .refuse_dispositions(u32::MAX)
                .unwrap();
        }
        let delivery = receiver.receive().await.unwrap().unwrap();
        let report = runtime.process(delivery).await;
        outcomes.push((report.outcome, report.settled.unwrap().is_ok()));
        if i == 2 {
            emulator
                .broker()
                .entity("orders")
                .unwrap()
                .refuse_dispositions(0)
                .unwrap();
        }
    }
    assert_eq!(
        outcomes,
        [
            (Outcome::Processed, true),
            (Outcome::Duplicate(sb_inbox::DuplicateScope::Inbox), true),
            (Outcome::Processed, false),
            (Outcome::Permanent(DeadLetterReason::InvalidPayload), true),
        ]
    );

    // Renewals refused: the first renewal (at 1 s − 300 ms) loses the lock of a handler that
    // never finishes.
    emulator
        .broker()
        .entity("locky")
        .unwrap()
        .refuse_renewals(u32::MAX)
        .unwrap();
    let locky = client.receiver("locky", 0);
    let mut lock_config = RuntimeConfig::new(consumer);
    lock_config.lock_margin = Duration::from_millis(300);
    let lock_runtime = Runtime::new(
        locky.clone(),
        store,
        Hang(OrderPlacedConsumer::new()),
        lock_config,
    );
    let delivery = locky.receive().await.unwrap().unwrap();
    assert_eq!(
        lock_runtime.process(delivery).await.outcome,
        Outcome::LockLost
    );
    // Another team's event on a shared entity, completed and counted.
    client
        .sender("shared")
        .send(Message::new("m-other", "billing.invoice-sent.v1", "{}"))
        .await
        .unwrap();
    let shared = client.receiver("shared", 0);
    let shared_runtime = Runtime::new(
        shared.clone(),
        support::sqlite_store("telemetry-shared", 1).await,
        OrderPlacedConsumer::new(),
        RuntimeConfig::new(ConsumerName::new(CONSUMER).unwrap())
            .with_unknown_contracts(UnknownContracts::Complete),
    );
    let delivery = shared.receive().await.unwrap().unwrap();
    assert_eq!(
        shared_runtime.process(delivery).await.outcome,
        Outcome::Ignored
    );
    let windowed = windowed_receiver(&client).await;
    receiver.close().await;
    locky.close().await;
    shared.close().await;
    windowed.close().await;

    flush(&telemetry).await;
    check_spans(&sink);
    check_metrics(&sink);
    emulator.shutdown().await;
}

fn check_spans(sink: &Sink) {
    let exported = sink.spans();
    let (resource, _) = exported.first().expect("spans were exported");
    assert_eq!(
        attribute(resource, "service.name").as_deref(),
        Some("sb-inbox-test")
    );
    assert_eq!(
        attribute(resource, "deployment.environment.name").as_deref(),
        Some("test")
    );
    let spans: Vec<Span> = exported.into_iter().map(|(_, s)| s).collect();

    // Sends: producer spans, one per message id.
    let poison_send = span_with(&spans, "send orders", &[(attr::MESSAGE_ID, "m-poison")]);
    assert_eq!(poison_send.kind, SpanKind::Producer as i32);
    assert_eq!(
        attr_of(poison_send, attr::OPERATION_TYPE).as_deref(),
        Some("send")
    );

    // Receives: client spans, each linked to its message's producer.
    let receives: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "receive orders")
        .collect();
    assert!(receives.len() >= 4, "{receives:#?}");
    for receive in &receives {
        assert_eq!(receive.kind, SpanKind::Client as i32);
        assert_eq!(
            attr_of(receive, attr::MESSAGING_SYSTEM).as_deref(),
            Some("servicebus")
        );
        assert_eq!(
            attr_of(receive, attr::OPERATION_TYPE).as_deref(),
            Some("receive")
        );
    }

    // Processed: a consumer span, linked (not parented) to the upstream producer.
    let processed = span_with(
        &spans,
        "process orders",
        &[(attr::MESSAGE_ID, "m-1"), (attr::OUTCOME, "processed")],
    );
    assert_eq!(processed.kind, SpanKind::Consumer as i32);
    assert!(
        processed.parent_span_id.is_empty(),
        "a root span, linked instead"
    );
    assert_eq!(processed.links.len(), 1);
    assert_eq!(hex(&processed.links[0].trace_id), PRODUCER_TRACE);
    assert_eq!(hex(&processed.links[0].span_id), PRODUCER_SPAN);
    for (key, expected) in [
        (attr::MESSAGING_SYSTEM, "servicebus"),
        (attr::OPERATION_TYPE, "process"),
        (attr::OPERATION_NAME, "process"),
        (attr::DESTINATION, "orders"),
        (attr::SERVER_ADDRESS, "127.0.0.1"),
        (attr::MESSAGE_ID, "m-1"),
        (attr::CONVERSATION_ID, "c-1"),
        (attr::CAUSATION_ID, "cause-1"),
        (attr::DELIVERY_COUNT, "1"),
        (attr::CONSUMER, CONSUMER),
        (attr::CONTRACT, "orders.order-placed.v1"),
        (attr::SETTLEMENT, "complete"),
    ] {
        assert_eq!(attr_of(processed, key).as_deref(), Some(expected), "{key}");
    }
    assert!(attr_of(processed, attr::ENQUEUED_TIME).is_some());
    assert_eq!(attr_of(processed, attr::ERROR_TYPE), None);
    let kids = children(&spans, processed);
    let names: BTreeSet<&str> = kids.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["complete orders", "sb_inbox.transaction"]),
        "{kids:#?}"
    );
    let complete = kids.iter().find(|s| s.name == "complete orders").unwrap();
    assert_eq!(complete.kind, SpanKind::Client as i32);
    assert_eq!(
        attr_of(complete, attr::DISPOSITION_STATUS).as_deref(),
        Some("complete")
    );
    assert_eq!(
        attr_of(complete, attr::OPERATION_TYPE).as_deref(),
        Some("settle")
    );
    let transaction = kids
        .iter()
        .find(|s| s.name == "sb_inbox.transaction")
        .unwrap();
    assert_eq!(transaction.kind, SpanKind::Internal as i32);
    assert_eq!(
        attr_of(transaction, attr::TRANSACTION_RESULT).as_deref(),
        Some("commit")
    );
    // The receive of this message links to the same producer.
    assert!(
        receives
            .iter()
            .any(|r| r.links.iter().any(|l| hex(&l.span_id) == PRODUCER_SPAN))
    );

    // Duplicate: completed, the transaction rolled back.
    let duplicate = span_with(&spans, "process orders", &[(attr::OUTCOME, "duplicate")]);
    assert_eq!(attr_of(duplicate, attr::MESSAGE_ID).as_deref(), Some("m-1"));
    assert_eq!(
        attr_of(duplicate, attr::SETTLEMENT).as_deref(),
        Some("complete")
    );
    let kids = children(&spans, duplicate);
    let transaction = kids
        .iter()
        .find(|s| s.name == "sb_inbox.transaction")
        .unwrap();
    assert_eq!(
        attr_of(transaction, attr::TRANSACTION_RESULT).as_deref(),
        Some("rollback")
    );
    assert!(kids.iter().any(|s| s.name == "complete orders"));

    // Committed, completion refused until the lock ran out (busy answers retried): the process
    // span says so, and so does its complete span.
    let refused = span_with(&spans, "process orders", &[(attr::MESSAGE_ID, "m-2")]);
    assert_eq!(
        attr_of(refused, attr::OUTCOME).as_deref(),
        Some("processed")
    );
    assert_eq!(
        attr_of(refused, attr::ERROR_TYPE).as_deref(),
        Some("ServiceCommunicationProblem")
    );
    let complete = children(&spans, refused)
        .into_iter()
        .find(|s| s.name == "complete orders")
        .unwrap();
    assert_eq!(
        attr_of(complete, attr::ERROR_TYPE).as_deref(),
        Some("ServiceCommunicationProblem")
    );

    // Dead-lettered: linked to our own send span through the stamped traceparent.
    let poison = span_with(&spans, "process orders", &[(attr::OUTCOME, "permanent")]);
    assert_eq!(
        attr_of(poison, attr::MESSAGE_ID).as_deref(),
        Some("m-poison")
    );
    assert_eq!(
        attr_of(poison, attr::DEAD_LETTER_REASON).as_deref(),
        Some("InvalidPayload")
    );
    assert_eq!(
        attr_of(poison, attr::ERROR_TYPE).as_deref(),
        Some("InvalidPayload")
    );
    assert_eq!(poison.links.len(), 1);
    assert_eq!(poison.links[0].trace_id, poison_send.trace_id);
    assert_eq!(poison.links[0].span_id, poison_send.span_id);
    let dead_letter = children(&spans, poison)
        .into_iter()
        .find(|s| s.name == "dead_letter orders")
        .expect("a dead_letter child span");
    assert_eq!(
        attr_of(dead_letter, attr::DISPOSITION_STATUS).as_deref(),
        Some("dead_letter")
    );

    // Lock lost: no settlement, the refused renewal a child of the process span.
    let lost = span_with(&spans, "process locky", &[(attr::OUTCOME, "lock_lost")]);
    assert_eq!(
        attr_of(lost, attr::ERROR_TYPE).as_deref(),
        Some("MessageLockLost")
    );
    assert_eq!(attr_of(lost, attr::SETTLEMENT).as_deref(), Some("none"));
    let kids = children(&spans, lost);
    let renewal = kids
        .iter()
        .find(|s| s.name == "renew_lock locky")
        .expect("a renew_lock child span");
    assert_eq!(renewal.kind, SpanKind::Client as i32);
    assert_eq!(
        attr_of(renewal, attr::ERROR_TYPE).as_deref(),
        Some("MessageLockLost")
    );
    assert!(!kids.iter().any(|s| s.name.starts_with("complete")));
}

/// A self-sizing receive window (issue 42) on `windowed`: a completion answered gives it the
/// broker's round trip, and a delivery taken a sample period after the first has it size
/// itself and record its window and round trip.
async fn windowed_receiver(
    client: &sb_inbox::servicebus::ServiceBusClient,
) -> sb_inbox::servicebus::ServiceBusReceiver {
    let sender = client.sender("windowed");
    for n in 0..2 {
        sender.send(order(&format!("m-w{n}"))).await.unwrap();
    }
    let windowed = client
        .receiver("windowed", 0)
        .with_capacity(8)
        .with_auto_window(2);
    let first = windowed.receive_message().await.unwrap().unwrap();
    first.complete().await.unwrap();
    // The rate is sampled once a sample period has passed since the first delivery taken.
    tokio::time::sleep(sb_servicebus::window::SAMPLE_PERIOD * 2).await;
    let second = windowed.receive_message().await.unwrap().unwrap();
    second.complete().await.unwrap();
    windowed
}

fn check_metrics(sink: &Sink) {
    let metrics = sink.metrics();
    for (name, unit) in metric::ALL {
        if name == metric::RETENTION_DELETED
            || name == metric::STORE_DEPLOYMENT_ERRORS
            || name == metric::BATCH_SIZE
            || name == metric::SESSION_LOCK_LOST
            || name == metric::CIRCUIT_TRIPS
            || name == metric::CIRCUIT_PAUSED
        {
            continue; // Not registered, or never incremented, in this test (no batches, no sessions, no trips).
        }
        assert_eq!(last_metric(&metrics, name).unit, unit, "{name}");
    }
    let windowed = [(attr::DESTINATION, "windowed")];
    let window = total(last_metric(&metrics, metric::RECEIVE_WINDOW), &windowed);
    assert!(
        (2.0..=8.0).contains(&window),
        "the window within its base and capacity: {window}"
    );
    let round_trip = total(last_metric(&metrics, metric::RECEIVE_ROUND_TRIP), &windowed);
    assert!(
        round_trip > 0.0 && round_trip < 5.0,
        "a measured round trip in seconds: {round_trip}"
    );
    for name in [metric::PROCESS_DURATION, metric::OPERATION_DURATION] {
        let Some(Data::Histogram(histogram)) = &last_metric(&metrics, name).data else {
            panic!("{name} is not a histogram");
        };
        assert_eq!(
            histogram.data_points[0].explicit_bounds,
            metric::DURATION_BUCKETS,
            "{name}"
        );
    }

    let outcomes = last_metric(&metrics, metric::OUTCOMES);
    let base = [
        (attr::CONSUMER, CONSUMER),
        (attr::MESSAGING_SYSTEM, "servicebus"),
    ];
    for (destination, outcome, contract) in [
        ("orders", "processed", "orders.order-placed.v1"),
        ("orders", "processed", "orders.order-placed.v1"),
        ("orders", "duplicate", "orders.order-placed.v1"),
        ("orders", "permanent", "orders.order-placed.v1"),
        ("locky", "lock_lost", "orders.order-placed.v1"),
    ] {
        let mut labels = base.to_vec();
        labels.extend([
            (attr::DESTINATION, destination),
            (attr::OUTCOME, outcome),
            (attr::CONTRACT, contract),
        ]);
        let expected = if outcome == "processed" { 2.0 } else { 1.0 };
        assert_eq!(
            total(outcomes, &labels),
            expected,
            "{outcome}: {outcomes:#?}"
        );
    }
    let failures = last_metric(&metrics, metric::SETTLEMENT_FAILURES);
    assert_eq!(
        total(
            failures,
            &[
                (attr::DISPOSITION_STATUS, "complete"),
                (attr::ERROR_TYPE, "ServiceCommunicationProblem"),
                (attr::CONTRACT, "orders.order-placed.v1"),
            ]
        ),
        1.0
    );
    assert_eq!(
        total(
            outcomes,
            &[
                (attr::OUTCOME, "processed"),
                (attr::SETTLEMENT_RESULT, "ServiceCommunicationProblem")
            ]
        ),
        1.0
    );
    assert_eq!(
        total(
            outcomes,
            &[
                (attr::OUTCOME, "permanent"),
                (attr::DEAD_LETTER_REASON, "InvalidPayload"),
                (attr::SETTLEMENT, "dead_letter"),
                (attr::SETTLEMENT_RESULT, value::OK),
            ]
        ),
        1.0
    );
    let duplicates = last_metric(&metrics, metric::DUPLICATES);
    assert_eq!(
        total(
            duplicates,
            &[
                (attr::CONTRACT, "orders.order-placed.v1"),
                (attr::PRODUCER, "checkout"),
                (attr::DUPLICATE_SCOPE, "inbox"),
            ]
        ),
        1.0
    );
    let lost = last_metric(&metrics, metric::LOCK_LOST);
    assert_eq!(total(lost, &[(attr::DESTINATION, "locky")]), 1.0);
    // The unknown contract: its own counter, and outcome `ignored` with the contract bounded to
    // `_other` (the name is another team's).
    let unknown = last_metric(&metrics, metric::UNKNOWN_CONTRACTS);
    assert_eq!(total(unknown, &[(attr::DESTINATION, "shared")]), 1.0);
    assert_eq!(total(unknown, &[(attr::DESTINATION, "orders")]), 0.0);
    let ignored = [
        (attr::DESTINATION, "shared"),
        (attr::OUTCOME, "ignored"),
        (attr::CONTRACT, value::OTHER),
        (attr::SETTLEMENT, "complete"),
    ];
    assert_eq!(total(outcomes, &ignored), 1.0);
    let consumed = last_metric(&metrics, metric::CONSUMED_MESSAGES);
    assert_eq!(total(consumed, &[(attr::DESTINATION, "orders")]), 4.0);
    assert_eq!(total(consumed, &[(attr::DESTINATION, "locky")]), 1.0);
    let process = last_metric(&metrics, metric::PROCESS_DURATION);
    assert_eq!(total(process, &[(attr::DESTINATION, "orders")]), 4.0);
    let operations = last_metric(&metrics, metric::OPERATION_DURATION);
    // Two on `orders` (the refused one never succeeded), one on `shared`, two on `windowed`.
    assert_eq!(
        total(operations, &[(attr::OPERATION_NAME, "complete")]),
        6.0
    );
    assert_eq!(
        total(
            operations,
            &[
                (attr::OPERATION_NAME, "complete"),
                (attr::DESTINATION, "shared")
            ]
        ),
        1.0
    );
    assert_eq!(
        total(operations, &[(attr::OPERATION_NAME, "dead_letter")]),
        1.0
    );
    assert!(
        total(
            operations,
            &[
                (attr::OPERATION_NAME, "renew_lock"),
                (attr::ERROR_TYPE, "MessageLockLost")
            ]
        ) >= 1.0
    );
    // Five to `orders` and `locky`, one to `shared`, two to `windowed`.
    assert_eq!(total(operations, &[(attr::OPERATION_NAME, "send")]), 8.0);
    let transactions = last_metric(&metrics, metric::TRANSACTION_DURATION);
    // The unknown contract was completed without a transaction.
    assert_eq!(total(transactions, &[(attr::DESTINATION, "shared")]), 0.0);
    assert_eq!(
        total(transactions, &[(attr::TRANSACTION_RESULT, "commit")]),
        2.0
    );
    let backlog = last_metric(&metrics, metric::OUTBOX_BACKLOG);
    assert_eq!(total(backlog, &[(attr::CONSUMER, CONSUMER)]), 3.0);
    // Each hosted consumer's own series, not the first consumer's name on a shared one.
    assert_eq!(total(backlog, &[(attr::CONSUMER, OTHER_CONSUMER)]), 3.0);
    assert_eq!(points(backlog).len(), 2, "one series per consumer");
    let outbox_age = last_metric(&metrics, metric::OUTBOX_AGE);
    assert_eq!(total(outbox_age, &[(attr::CONSUMER, OTHER_CONSUMER)]), 7.0);
    let deleted = last_metric(&metrics, metric::RETENTION_DELETED);
    for consumer in [CONSUMER, OTHER_CONSUMER] {
        assert_eq!(total(deleted, &[(attr::CONSUMER, consumer)]), 11.0);
    }
    let age = last_metric(&metrics, metric::MESSAGE_AGE);
    assert_eq!(total(age, &[(attr::DESTINATION, "orders")]), 4.0);

    // No per-message value is ever a label: not as a key, not as a value.
    let per_message_values = ["m-1", "m-2", "m-poison", "m-lock", "c-1", "cause-1"];
    let mut series = 0;
    for metric in &metrics {
        for (labels, _) in points(metric) {
            series += 1;
            for (key, value) in &labels {
                assert!(
                    !attr::PER_MESSAGE.contains(&key.as_str()),
                    "{}: per-message label {key}",
                    metric.name
                );
                assert!(
                    !per_message_values.iter().any(|id| value.contains(id)),
                    "{}: label {key}={value} carries a message value",
                    metric.name
                );
            }
        }
    }
    assert!(series > 20, "too few series to prove anything: {series}");
}
