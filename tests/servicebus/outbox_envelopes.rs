//! Issue 34: a handler writes MassTransit and CloudEvents envelopes to the outbox, the relay
//! publishes them through the emulator (twice: the broker's first answer is lost), and
//! independent implementations read what arrived: the official Python Service Bus SDK receives
//! it, the official CloudEvents Python SDK (`cloudevents` 2.x, its AMQP binding) parses the
//! structured and the binary event.
//!
//! What is checked and why: MassTransit's JSON envelope and its AMQP message as MassTransit's
//! documentation ("Message Serialization", <https://masstransit.io/documentation/configuration/serialization>)
//! and its Azure Service Bus transport (`ServiceBusSendTransport.CreateMessage`: content type,
//! `MessageId` as `Guid.ToString("N")`) define them; CloudEvents per the AMQP protocol binding
//! (<https://github.com/cloudevents/spec/blob/v1.0.2/cloudevents/bindings/amqp-protocol-binding.md>);
//! the id stable across a relay retry, so that the .NET consumer's deduplication and ours both
//! recognise the copy.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sb_inbox::envelope::{
    CLOUDEVENTS_JSON, CloudEvent, MASSTRANSIT_CONTENT_TYPE, MassTransitEnvelope, PublishError,
};
use sb_inbox::ports::Cause;
use sb_inbox::relay::{MAX_BACKOFF, Relay, RelayConfig};
use sb_inbox::servicebus::ServiceBusSenderPort;
use sb_inbox::{
    Clock, ConsumerName, Context, Handled, HandlerError, Json, JsonContract, JsonHandler, Message,
    OutboxStore, PgStore, Runtime, RuntimeConfig, SendFailure, Sender, Store, StoreTx, Tx,
};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{NAMESPACE, client, emulator, send};
use crate::support::pg_store;

const MT_TYPE: &str = "urn:message:Shop.Contracts:OrderConfirmed";
const CE_SOURCE: &str = "/shop/orders";
const CE_TYPE: &str = "shop.order.confirmed.v1";
/// The consumed order's message id: a UUID, so the MassTransit envelope's conversation starts
/// with it.
const ORDER_MESSAGE_ID: &str = "3b241101-e2bb-4255-8caf-4136c566a962";

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderPlaced {
    order_id: String,
}

impl JsonContract for OrderPlaced {
    const NAME: &'static str = "shop.order-placed";
    const VERSION: u32 = 1;
}

/// Confirms each order three ways, for three kinds of .NET consumer: a MassTransit envelope,
/// a structured and a binary CloudEvent, all to `outbox`.
struct ConfirmsInEnvelopes;

impl<T: Tx> JsonHandler<T> for ConfirmsInEnvelopes {
    type Message = OrderPlaced;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        order: &OrderPlaced,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let permanent = |e: PublishError| HandlerError::permanent("the event has no envelope", e);
        let confirmed = serde_json::json!({ "orderId": order.order_id });
        let masstransit = MassTransitEnvelope::new("outbox", MT_TYPE)
            .and_then(|e| e.with_addresses(NAMESPACE, Some("orders")))
            .and_then(|e| e.with_header("tenant", "t-1"))
            .map_err(permanent)?
            .caused_by(ctx)
            .message(&confirmed)
            .map_err(permanent)?;
        let event = CloudEvent::new("outbox", CE_SOURCE, CE_TYPE)
            .and_then(|e| e.with_subject(&order.order_id))
            .and_then(|e| e.with_extension("tenant", "t-1"))
            .map_err(permanent)?;
        let structured = event.message(&confirmed).map_err(permanent)?;
        let binary = CloudEvent::new("outbox", CE_SOURCE, CE_TYPE)
            .and_then(|e| e.with_subject(&order.order_id))
            .and_then(|e| e.with_extension("tenant", "t-1"))
            .map_err(permanent)?
            .binary()
            .message(&confirmed)
            .map_err(permanent)?;
        for message in [masstransit, structured, binary] {
            tx.append_outbox(&message).await?;
        }
        Ok(Handled::Processed)
    }
}

/// Publishes through the real publisher, then reports the send as failed: the broker took the
/// message and its answer was lost (a timeout), so the relay must send it again.
struct AnswerLost(ServiceBusSenderPort);

impl Sender for AnswerLost {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        at: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        self.0.send(destination, message, at).await?;
        Err(SendFailure::Transient(Cause::from(
            "the broker's answer was lost",
        )))
    }
}

/// Whether the Python Service Bus SDK and the CloudEvents SDK are there; when not, fails under
/// CI or says `skipped`.
fn sdks_installed() -> bool {
    crate::python::sdk_installed()
        && sb_testkit::require(
            sb_testkit::PYTHON_CLOUDEVENTS,
            sb_testkit::python_imports("cloudevents.core.bindings.amqp"),
        )
}

/// Runs `sdk/outbox_envelopes.py`: receives `expected` messages from `queue` and returns what
/// the SDKs read, per message.
async fn received_by_python(connection: &str, queue: &str, expected: usize) -> Vec<Value> {
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/servicebus/sdk/outbox_envelopes.py"
    );
    let output = tokio::process::Command::new(sb_testkit::python())
        .arg(script)
        .args([connection, queue, &expected.to_string()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    serde_json::from_str(&stdout).unwrap()
}

/// Waits (bounded) until the outbox holds `rows` rows not yet dispatched.
async fn outbox_holds<S: OutboxStore>(store: &S, rows: u64) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.outbox_backlog().await.unwrap().pending < rows {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the handler writes its envelopes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_envelopes_keep_their_ids_across_a_retry_and_read_in_the_official_sdks() {
    if !sdks_installed() {
        return;
    }
    crate::support::init_tracing();
    let store: PgStore = pg_store("outbox_envelopes", 4).await;
    let emulator = emulator("PT30S").await;
    let client = client(&emulator);

    // 1. The handler consumes one order and writes its three envelopes in its transaction.
    send(
        &client,
        "orders",
        Message::new(
            ORDER_MESSAGE_ID,
            "shop.order-placed.v1",
            r#"{"orderId":"o-1"}"#,
        ),
    )
    .await;
    let runtime = Arc::new(Runtime::new(
        client.receiver("orders", 1),
        store.clone(),
        Json::new(ConfirmsInEnvelopes),
        RuntimeConfig::new(ConsumerName::new("shop.confirmations").unwrap()),
    ));
    let stop = CancellationToken::new();
    let consuming = tokio::spawn({
        let (runtime, stop) = (runtime.clone(), stop.clone());
        async move { runtime.run(stop).await }
    });
    outbox_holds(&store, 3).await;
    stop.cancel();
    consuming.await.unwrap().unwrap();
    assert_eq!(runtime.stats().snapshot().processed, 1);

    // 2. The relay sends each row and loses the broker's answer (one row per pass: a
    //    destination that failed transiently waits for the next pass); then a relay whose
    //    clock is past every backoff sends them again.
    let losing = Relay::new(
        store.clone(),
        AnswerLost(ServiceBusSenderPort::new(client.clone())),
        RelayConfig::default().with_batch_size(1),
    );
    for _ in 0..3 {
        let pass = losing.relay_once(&CancellationToken::new()).await.unwrap();
        assert_eq!((pass.claimed, pass.failed), (1, 1));
    }
    let later = Clock::starting_at(SystemTime::now() + MAX_BACKOFF + Duration::from_secs(1));
    let relay = Relay::with_clock(
        store.clone(),
        ServiceBusSenderPort::new(client.clone()),
        RelayConfig::default(),
        later,
    );
    let pass = relay.relay_once(&CancellationToken::new()).await.unwrap();
    assert_eq!((pass.published, pass.marked), (3, 3));
    assert_eq!(relay.stats().snapshot().republished, 3);
    assert_eq!(emulator.broker().entity("outbox").unwrap().counts().sent, 6);

    // 3. Six messages arrived (`outbox` has no broker duplicate detection): each envelope
    //    twice, byte for byte, under one id.
    let received = received_by_python(&emulator.connection_string(), "outbox", 6).await;
    assert_eq!(received.len(), 6, "{received:#?}");
    let mut by_id: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
    for message in &received {
        let id = message["message_id"].as_str().unwrap().to_owned();
        by_id.entry(id).or_default().push(message);
    }
    assert_eq!(by_id.len(), 3, "{by_id:#?}");
    for copies in by_id.values() {
        assert_eq!(copies.len(), 2);
        assert_eq!(copies[0], copies[1], "a retry sends the same envelope");
    }
    let kind = |content_type: &str| {
        by_id
            .values()
            .map(|copies| copies[0])
            .find(|m| m["content_type"] == content_type)
            .unwrap_or_else(|| panic!("no {content_type} message in {by_id:#?}"))
    };

    // MassTransit: the transport's AMQP fields and the envelope.
    let masstransit = kind(MASSTRANSIT_CONTENT_TYPE);
    let broker_id = masstransit["message_id"].as_str().unwrap();
    assert!(
        broker_id.len() == 32 && broker_id.chars().all(|c| c.is_ascii_hexdigit()),
        "MassTransit's transport writes MessageId as Guid.ToString(\"N\"): {broker_id}"
    );
    assert_eq!(masstransit["subject"], Value::Null);
    assert_eq!(masstransit["properties"]["tenant"], "t-1");
    let envelope: Value = serde_json::from_str(masstransit["body"].as_str().unwrap()).unwrap();
    assert_eq!(
        envelope["messageId"].as_str().unwrap().replace('-', ""),
        broker_id
    );
    assert_eq!(envelope["messageType"], serde_json::json!([MT_TYPE]));
    assert_eq!(envelope["message"], serde_json::json!({ "orderId": "o-1" }));
    assert_eq!(envelope["conversationId"], ORDER_MESSAGE_ID);
    assert_eq!(envelope["initiatorId"], ORDER_MESSAGE_ID);
    assert_eq!(
        envelope["destinationAddress"],
        format!("sb://{NAMESPACE}/outbox")
    );
    assert_eq!(
        envelope["sourceAddress"],
        format!("sb://{NAMESPACE}/orders")
    );
    assert_eq!(envelope["headers"]["tenant"], "t-1");

    // CloudEvents, as the CloudEvents SDK read them: the same event in both modes.
    let structured = kind(CLOUDEVENTS_JSON);
    let binary = kind("application/json");
    for (message, mode) in [(structured, "structured"), (binary, "binary")] {
        let event = &message["cloudevent"];
        assert_eq!(event["specversion"], "1.0", "{mode}");
        assert_eq!(
            event["id"], message["message_id"],
            "{mode}: the broker id is the event id"
        );
        assert_eq!(event["source"], CE_SOURCE, "{mode}");
        assert_eq!(event["type"], CE_TYPE, "{mode}");
        assert_eq!(event["subject"], "o-1", "{mode}");
        assert_eq!(event["tenant"], "t-1", "{mode}");
        assert_eq!(event["datacontenttype"], "application/json", "{mode}");
        assert_eq!(
            event["data"],
            serde_json::json!({ "orderId": "o-1" }),
            "{mode}"
        );
        assert!(
            event["time"].as_str().unwrap().ends_with("+00:00"),
            "{mode}: time is UTC: {}",
            event["time"]
        );
    }
    assert_eq!(structured["properties"], serde_json::json!({}));
    assert_eq!(binary["properties"]["cloudEvents:type"], CE_TYPE);
    assert_eq!(
        binary["body"].as_str().unwrap(),
        r#"{"orderId":"o-1"}"#,
        "binary mode: the data is the body"
    );
    emulator.shutdown().await;
}

/// The contract the .NET side's event maps to in the consumers below.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderConfirmed {
    order_id: String,
}

impl JsonContract for OrderConfirmed {
    const NAME: &'static str = "shop.order-confirmed";
    const VERSION: u32 = 1;
}

/// What one processed delivery carried: logical id, order id, tenant header.
type Record = (String, String, Option<String>);

/// Records what each delivery it processes carried.
#[derive(Clone, Default)]
struct Records(Arc<std::sync::Mutex<Vec<Record>>>);

impl<T: Tx> JsonHandler<T> for Records {
    type Message = OrderConfirmed;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderConfirmed>,
        order: &OrderConfirmed,
        _tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let tenant = match ctx.headers().get("tenant") {
            Some(sb_inbox::PropertyValue::String(tenant)) => Some(tenant.clone()),
            _ => None,
        };
        self.0
            .lock()
            .unwrap()
            .push((ctx.logical_id().to_owned(), order.order_id.clone(), tenant));
        Ok(Handled::Processed)
    }
}

/// The round trip through the broker: envelopes the outbox wrote, sent twice each by the relay
/// (the broker's first answer lost), consumed by the runtime with the matching envelope reader:
/// the handler sees the contract's payload under the envelope's own id once, and the inbox
/// completes the second copy as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_envelopes_are_consumed_once_through_the_envelope_readers() {
    use sb_inbox::envelope::{CloudEvents, EnvelopeReader, MassTransit, TypeMap, cloudevent_id};

    use crate::support::emulator::{queue, start};

    crate::support::init_tracing();
    let store: PgStore = pg_store("outbox_envelopes_round_trip", 4).await;
    let queues = ["mt-events", "ce-structured", "ce-binary"];
    let emulator = start(
        queues
            .iter()
            .map(|name| queue(name, Default::default()))
            .collect(),
        Default::default(),
    )
    .await;
    let client = client(&emulator);

    let order = serde_json::json!({ "orderId": "o-7", "note": "added by a later producer" });
    let masstransit = MassTransitEnvelope::new("mt-events", MT_TYPE)
        .and_then(|e| e.with_header("tenant", "t-1"))
        .unwrap();
    let event = CloudEvent::new(
        "ce-structured",
        CE_SOURCE,
        "com.example.shop.order.confirmed",
    )
    .and_then(|e| e.with_extension("tenant", "t-1"))
    .unwrap();
    let binary = CloudEvent::new("ce-binary", CE_SOURCE, "com.example.shop.order.confirmed")
        .and_then(|e| e.with_extension("tenant", "t-1"))
        .unwrap()
        .binary();
    let mut tx = store.begin().await.unwrap();
    for message in [
        masstransit.message(&order).unwrap(),
        event.message(&order).unwrap(),
        binary.message(&order).unwrap(),
    ] {
        tx.append_outbox(&message).await.unwrap();
    }
    tx.commit().await.unwrap();

    let losing = Relay::new(
        store.clone(),
        AnswerLost(ServiceBusSenderPort::new(client.clone())),
        RelayConfig::default().with_batch_size(1),
    );
    for _ in 0..3 {
        losing.relay_once(&CancellationToken::new()).await.unwrap();
    }
    let later = Clock::starting_at(SystemTime::now() + MAX_BACKOFF + Duration::from_secs(1));
    let relay = Relay::with_clock(
        store.clone(),
        ServiceBusSenderPort::new(client.clone()),
        RelayConfig::default(),
        later,
    );
    assert_eq!(
        relay
            .relay_once(&CancellationToken::new())
            .await
            .unwrap()
            .published,
        3
    );

    let mt_types = TypeMap::new()
        .with(MT_TYPE, "shop.order-confirmed.v1")
        .unwrap();
    let ce_types = TypeMap::new()
        .with(
            "com.example.shop.order.confirmed",
            "shop.order-confirmed.v1",
        )
        .unwrap();
    let readers: [(&str, Arc<dyn EnvelopeReader>, String); 3] = [
        (
            "mt-events",
            Arc::new(MassTransit::new(mt_types).unwrap()),
            masstransit.message_id().hyphenated().to_string(),
        ),
        (
            "ce-structured",
            Arc::new(CloudEvents::new(ce_types.clone()).unwrap()),
            cloudevent_id(CE_SOURCE, event.id()),
        ),
        (
            "ce-binary",
            Arc::new(CloudEvents::new(ce_types).unwrap()),
            cloudevent_id(CE_SOURCE, binary.id()),
        ),
    ];
    for (entity, reader, logical_id) in readers {
        let records = Records::default();
        let mut config = RuntimeConfig::new(ConsumerName::new(format!("shop.{entity}")).unwrap());
        config.envelope = reader;
        let runtime = Arc::new(Runtime::new(
            client.receiver(entity, 2),
            store.clone(),
            Json::new(records.clone()),
            config,
        ));
        let stop = CancellationToken::new();
        let consuming = tokio::spawn({
            let (runtime, stop) = (runtime.clone(), stop.clone());
            async move { runtime.run(stop).await }
        });
        crate::worker::queue_drained(&emulator, entity, 2).await;
        stop.cancel();
        consuming.await.unwrap().unwrap();
        let stats = runtime.stats().snapshot();
        assert_eq!(
            (stats.processed, stats.duplicate, stats.permanent),
            (1, 1, 0),
            "{entity}: {stats:?}"
        );
        assert_eq!(
            *records.0.lock().unwrap(),
            [(logical_id, "o-7".to_owned(), Some("t-1".to_owned()))],
            "{entity}"
        );
    }
    emulator.shutdown().await;
}
