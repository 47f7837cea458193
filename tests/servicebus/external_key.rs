//! External effects with a stable idempotency key, end to end: the example shipping consumer
//! (`examples/shipping_label`) calls a stand-in API that deduplicates by `Idempotency-Key`, over
//! the emulator and PostgreSQL. Every way an attempt can end after its call and before its commit
//! (a rolled-back transaction, a lost lock, a killed process) makes the next attempt call again,
//! with the same key: several calls, one shipment.

use std::future::pending;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use sb_inbox::runtime::{DelayedRetry, JitterSource, RetryPolicy};
use sb_inbox::servicebus::ServiceBusClient;
use sb_inbox::{
    ConsumerName, Handler, IdempotencyKey, Outcome, PgStore, Receiver, Runtime, RuntimeConfig,
};
use sb_inbox_cli::ops::dlq::{ResubmitOptions, dead_letter_queue, resubmit};
use tokio_util::sync::CancellationToken;

use crate::support::emulator::{client, emulator, send};
use crate::support::handlers::{Flaky, wrapper_handler};
use crate::support::orders::order;
use crate::support::{pg_store, pg_url, schema_for, with_search_path};
use crate::verification::until;

#[path = "../../examples/shipping_label/consumer.rs"]
mod shipping;

#[path = "../../examples/shipping_label/fake_api.rs"]
mod fake_api;

use fake_api::FakeShippingApi;
use shipping::{CONSUMER, SCHEMA, SCOPE, ShippingApi, ShippingConsumer};

/// The variables that turn the ignored test [`shipping_worker_process`] into the worker process
/// of [`a_call_repeated_after_rollback_lost_lock_and_kill_takes_effect_once`].
const CHILD_CONNECTION: &str = "SB_INBOX_TEST_CHILD_CONNECTION";
const CHILD_DATABASE: &str = "SB_INBOX_TEST_CHILD_DATABASE";
const CHILD_API: &str = "SB_INBOX_TEST_CHILD_API";

const TEST: &str = "sb_external_key";

fn consumer() -> ConsumerName {
    ConsumerName::new(CONSUMER).unwrap()
}

/// The lock is 2 s; renew 1 s ahead, so a refused renewal comes within a second.
fn config() -> RuntimeConfig {
    let mut config = RuntimeConfig::new(consumer());
    config.lock_margin = Duration::from_secs(1);
    config
}

fn shipping_consumer(api: &str) -> ShippingConsumer {
    // reqwest's TLS needs a process-wide provider, even for plain http; Err = already there.
    let _ = rustls::crypto::ring::default_provider().install_default();
    ShippingConsumer::new(ShippingApi::new(api).unwrap())
}

async fn shipping_store(test: &str) -> PgStore {
    let store = pg_store(test, 2).await;
    store.query(SCHEMA, &[]).await.unwrap();
    store
}

/// Shipment rows (order id, shipment id) and inbox rows.
async fn rows(store: &PgStore) -> (Vec<(String, String)>, i64) {
    let shipments = store
        .query("SELECT order_id, shipment_id FROM shipping_shipment", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let inbox = store
        .query("SELECT count(*) FROM sb_inbox", &[])
        .await
        .unwrap()[0]
        .get(0);
    (shipments, inbox)
}

/// Runs the inner handler (its API call included), then never returns: the attempt can only
/// end by losing its lock.
struct HangAfterCall<H>(H);

wrapper_handler!(HangAfterCall, 0, |self, ctx, tx| {
    self.0.handle(ctx, tx).await?;
    pending().await
});

/// Records the broker message id and `ctx.idempotency_key(SCOPE)` of every attempt.
struct RecordKeys<H> {
    inner: H,
    seen: Mutex<Vec<(String, IdempotencyKey)>>,
}

wrapper_handler!(RecordKeys, inner, |self, ctx, tx| {
    let id = ctx.message.message_id.clone().unwrap_or_default();
    self.seen
        .lock()
        .unwrap()
        .push((id, ctx.idempotency_key(SCOPE)));
    self.inner.handle(ctx, tx).await
});

/// One attempt in this process on the next delivery of `orders`.
async fn attempt<H: Handler<sb_inbox::PgTx>>(
    client: &ServiceBusClient,
    store: &PgStore,
    handler: H,
) -> Outcome {
    let receiver = client.receiver("orders", 0);
    let delivery = receiver.receive().await.unwrap().expect("a delivery");
    let runtime = Runtime::new(receiver.clone(), store.clone(), handler, config());
    let outcome = runtime.process(delivery).await.outcome;
    receiver.close().await;
    outcome
}

/// Must show: the handler calls the API; the transaction is then rolled back; the next attempt
/// calls and loses its lock; the next calls and its process is killed with SIGKILL; the last
/// commits. The API saw four calls with one key and made one shipment; the database holds one
/// shipment row, with that shipment, and one inbox row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_repeated_after_rollback_lost_lock_and_kill_takes_effect_once() {
    let store = shipping_store(TEST).await;
    let emulator = emulator("PT2S").await;
    let client = client(&emulator);
    let api = FakeShippingApi::start().await.unwrap();
    send(&client, "orders", order("m-1", "o-1")).await;
    let entity = emulator.broker().entity("orders").unwrap();

    // 1. The call, then a failure that rolls the transaction back (the message is abandoned).
    let flaky = Flaky::new(shipping_consumer(&api.url()), 1);
    assert_eq!(attempt(&client, &store, flaky).await, Outcome::Transient);
    assert_eq!(api.calls().len(), 1);

    // 2. The call, then the broker refuses the renewal: the lock is lost before any commit.
    entity.refuse_renewals(1).unwrap();
    let hang = HangAfterCall(shipping_consumer(&api.url()));
    assert_eq!(attempt(&client, &store, hang).await, Outcome::LockLost);
    assert_eq!(api.calls().len(), 2);

    // 3. A worker process calls, the API takes effect and stalls, the process is killed.
    api.stall_next();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "external_key::shipping_worker_process",
            "--ignored",
            "--nocapture",
        ])
        .env(CHILD_CONNECTION, emulator.connection_string())
        .env(
            CHILD_DATABASE,
            with_search_path(&pg_url(), &schema_for(TEST)),
        )
        .env(CHILD_API, api.url())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), api.stalled())
        .await
        .expect("the worker process called the API");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(api.calls().len(), 3);

    // 4. The redelivery, once the dead process's lock ran out, commits.
    let consumer_attempt = attempt(&client, &store, shipping_consumer(&api.url()));
    assert_eq!(consumer_attempt.await, Outcome::Processed);

    let calls = api.calls();
    let key = IdempotencyKey::for_business_key(&consumer(), "order:o-1", SCOPE);
    assert_eq!(calls.len(), 4, "{calls:#?}");
    assert!(
        calls
            .iter()
            .all(|call| call.key.as_deref() == Some(key.as_str())),
        "{calls:#?}"
    );
    let replayed: Vec<bool> = calls.iter().map(|call| call.replayed).collect();
    assert_eq!(replayed, [false, true, true, true]);
    assert_eq!(api.shipments(), 1);
    let (shipments, inbox) = rows(&store).await;
    assert_eq!(shipments.len(), 1);
    assert_eq!(Some(&shipments[0].1), calls[0].shipment_id.as_ref());
    assert_eq!(inbox, 1);
    let c = entity.counts();
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered_total),
        (1, 0, 0, 0)
    );
}

/// The worker process of the test above: the shipping consumer over the emulator and the
/// test's PostgreSQL schema until it is killed. Ignored: it only runs when that test starts it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the worker process of a_call_repeated_after_rollback_lost_lock_and_kill_takes_effect_once, started by it"]
async fn shipping_worker_process() {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: this test is the worker process of another test, which sets it"
            )
        })
    };
    let cs = var(CHILD_CONNECTION).parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let store = PgStore::connect(&var(CHILD_DATABASE), 2).await.unwrap();
    let handler = shipping_consumer(&var(CHILD_API));
    let runtime = Runtime::new(client.receiver("orders", 0), store, handler, config());
    runtime.run(CancellationToken::new()).await.unwrap();
}

/// Must show: `ctx.idempotency_key` is the same on the original delivery, on its delayed-retry
/// copy and on the resubmitted dead letter, and so is the key the API receives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_the_same_on_a_retry_copy_and_a_resubmitted_dead_letter() {
    let test = "sb_external_key_copies";
    let store = shipping_store(test).await;
    let emulator = emulator("PT5S").await;
    let client = client(&emulator);
    let api = FakeShippingApi::start().await.unwrap();
    send(&client, "orders", order("m-1", "o-1")).await;
    let entity = emulator.broker().entity("orders").unwrap();

    // The original and its one retry copy fail after the call: the copy is dead-lettered.
    let policy = RetryPolicy::new(1, Duration::from_millis(200), Duration::from_secs(1))
        .unwrap()
        .with_jitter(0.0, JitterSource::fixed(0.0))
        .unwrap();
    let mut config = config();
    config.delayed_retry = Some(DelayedRetry::new(
        policy,
        sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
        "orders",
    ));
    let handler = RecordKeys {
        inner: Flaky::new(shipping_consumer(&api.url()), 2),
        seen: Mutex::default(),
    };
    let receiver = client.receiver("orders", 0);
    let runtime = Runtime::new(receiver.clone(), store.clone(), handler, config);
    let shutdown = CancellationToken::new();
    let (result, ()) = tokio::join!(runtime.run(shutdown.clone()), async {
        until("the retry copy is dead-lettered", || async {
            let c = entity.counts();
            c.dead_lettered_total == 1 && c.scheduled == 0 && c.active == 0 && c.locked == 0
        })
        .await;
        let dlq = client.receiver(&dead_letter_queue("orders"), 0);
        let report = resubmit(
            &dlq,
            &sb_inbox::servicebus::ServiceBusSenderPort::new(client.clone()),
            "orders",
            &ResubmitOptions::new(1),
        )
        .await
        .unwrap();
        dlq.close().await;
        assert_eq!(report.resubmitted.len(), 1);
        until("the resubmitted copy is processed", || async {
            runtime.stats().snapshot().processed == 1
        })
        .await;
        shutdown.cancel();
    });
    result.unwrap();
    receiver.close().await;

    let seen = runtime.handler().seen.lock().unwrap().clone();
    let expected = IdempotencyKey::for_message(&consumer(), "m-1", SCOPE);
    assert_eq!(seen.len(), 3, "{seen:#?}");
    assert!(seen.iter().all(|(_, key)| *key == expected), "{seen:#?}");
    let ids: std::collections::BTreeSet<&str> = seen.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        ids.len(),
        3,
        "three broker messages: original, copy, resubmission: {seen:#?}"
    );
    let calls = api.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.windows(2).all(|w| w[0].key == w[1].key), "{calls:#?}");
    assert_eq!(api.shipments(), 1);
    assert_eq!(rows(&store).await.0.len(), 1);
}
