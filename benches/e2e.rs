//! End-to-end throughput: the emulator in-process → our AMQP client → the runtime → PostgreSQL
//! commit → complete, at concurrency 1, 8 and 32, beside
//! - the raw PostgreSQL rate of the same transaction with no broker (begin, inbox row, business
//!   key, reservation, commit), run by as many tasks as the concurrency, and
//! - the same worker with the inbox insert turned off (a store wrapper whose `insert_inbox` is a
//!   no-op; the bench only).
//!
//! `cargo bench --bench e2e` (PostgreSQL at `DATABASE_URL`, default
//! `postgres://postgres@127.0.0.1:5432/test`). Each configuration is sized to run about
//! `SECONDS` seconds from a short calibration run. Messages are preloaded through our sender
//! (not timed); the clock runs from the runtime's start until the last message is completed.
//!
//! `cargo bench --bench e2e -- telemetry`: the same end-to-end run at concurrency 8 with
//! OpenTelemetry export off and on (spans and metrics over OTLP/gRPC, metrics every second, to
//! a receiver in this parent process), each run in a child process of its own (the exporter and
//! the tracing subscriber are process-global), alternating off/on `ROUNDS` times; throughput and
//! the child's CPU time per message.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
// Built alone (`-p sb-inbox`), the inbox-off run's future nests deeper than the default 128.
#![recursion_limit = "256"]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sb_emulator::Emulator;
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient};
use sb_inbox::{
    ConsumerName, DelegateTx, Message, PgStore, PgTx, Runtime, RuntimeConfig, Store, StoreError,
};
use sb_inbox_cli::inventory::{InventoryTx, OrderPlaced, OrderPlacedConsumer};
use tokio_util::sync::CancellationToken;

const SECONDS: f64 = 3.0;
/// Off/on pairs of the telemetry comparison.
const ROUNDS: usize = 5;
/// Messages per telemetry run (about 4 s at concurrency 8).
const TELEMETRY_MESSAGES: usize = 3000;

#[path = "common/inventory_tx.rs"]
mod inventory_tx;
#[path = "common/pg_schema.rs"]
mod pg_schema;
#[path = "../tests/telemetry/sink.rs"]
mod sink;
use inventory_tx::CONSUMER;

fn body(i: usize) -> String {
    format!(
        r#"{{"orderId":"o-{i}","lines":[{{"sku":"SKU-{}","quantity":2}}]}}"#,
        i % 64
    )
}

fn schema(tag: &str) -> String {
    format!("bench_e2e_{}_{tag}", std::process::id())
}

/// A migrated store in a fresh schema `bench_e2e_<pid>_<tag>`.
async fn store(tag: &str, pool: u32) -> PgStore {
    pg_schema::fresh_schema(&schema(tag), pool).await
}

async fn drop_schema(tag: &str) {
    pg_schema::drop_schema(&schema(tag)).await;
}

/// The same transaction as the runtime's, straight on PostgreSQL: `concurrency` tasks take
/// message numbers until `messages` are committed.
async fn raw_pg(tag: &str, concurrency: usize, messages: usize) -> f64 {
    let store = store(tag, concurrency as u32 + 2).await;
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (store, next) = (store.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= messages {
                        return;
                    }
                    let id = format!("m-{i}");
                    let order: OrderPlaced = serde_json::from_str(&body(i)).unwrap();
                    inventory_tx::apply(&store, &id, &order).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let rate = messages as f64 / start.elapsed().as_secs_f64();
    drop_schema(tag).await;
    rate
}

/// A [`PgStore`] whose transactions skip the inbox row: the cost of everything else.
#[derive(Debug, Clone)]
struct NoInbox(PgStore);

#[derive(Debug)]
struct NoInboxTx(PgTx);

impl Store for NoInbox {
    type Tx = NoInboxTx;

    async fn begin(&self) -> Result<NoInboxTx, StoreError> {
        Ok(NoInboxTx(self.0.begin().await?))
    }
}

impl DelegateTx for NoInboxTx {
    type Inner = PgTx;

    fn inner(&mut self) -> &mut PgTx {
        &mut self.0
    }

    fn into_inner(self) -> PgTx {
        self.0
    }

    async fn insert_inbox(&mut self, _consumer: &str, _message_id: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

impl InventoryTx for NoInboxTx {
    async fn reserve(&mut self, message_id: &str, order: &OrderPlaced) -> Result<(), StoreError> {
        self.0.reserve(message_id, order).await
    }

    async fn release_reservation(&mut self, order_id: &str) -> Result<bool, StoreError> {
        self.0.release_reservation(order_id).await
    }
}

async fn emulator() -> Emulator {
    let json = r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[
        {"Name":"orders","Properties":{"LockDuration":"PT60S","MaxDeliveryCount":10}}],
        "Topics":[]}],"Logging":{"Type":"File"}}}"#;
    let broker = sb_emulator::Broker::new(sb_emulator::Config::from_json(json).unwrap()).unwrap();
    Emulator::start(broker, Default::default()).await.unwrap()
}

/// Preloads `messages` orders (not timed), runs one runtime at `concurrency` (prefetch the same)
/// until all are completed, and returns messages/s.
async fn e2e<S>(store: S, concurrency: usize, messages: usize) -> f64
where
    S: Store,
    S::Tx: InventoryTx,
{
    let emulator = emulator().await;
    let entity = emulator.broker().entity("orders").unwrap();
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let senders: Vec<_> = (0..8)
        .map(|k| {
            let sender = client.sender("orders");
            tokio::spawn(async move {
                for i in (k..messages).step_by(8) {
                    let message = Message::new(format!("m-{i}"), "orders.order-placed.v1", body(i));
                    sender.send(message).await.unwrap();
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.unwrap();
    }
    let receiver =
        ServiceBusClient::from_connection_string(&cs).receiver("orders", concurrency as u32);
    let mut config = RuntimeConfig::new(ConsumerName::new(CONSUMER).unwrap());
    config.concurrency = concurrency;
    config.prefetch = concurrency;
    let runtime = Runtime::new(receiver.clone(), store, OrderPlacedConsumer::new(), config);
    let shutdown = CancellationToken::new();
    let start = Instant::now();
    let run = {
        let token = shutdown.clone();
        async move { runtime.run(token).await.map(|()| runtime) }
    };
    let watch = async {
        while entity.counts().completed < messages as u64 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let elapsed = start.elapsed();
        shutdown.cancel();
        elapsed
    };
    let (runtime, elapsed) = tokio::join!(run, watch);
    let runtime = runtime.unwrap();
    receiver.close().await;
    emulator.shutdown().await;
    let stats = runtime.stats().snapshot();
    assert_eq!(stats.processed, messages as u64, "{stats:?}");
    messages as f64 / elapsed.as_secs_f64()
}

async fn e2e_inbox(tag: &str, concurrency: usize, messages: usize) -> f64 {
    let rate = e2e(
        store(tag, concurrency as u32 + 2).await,
        concurrency,
        messages,
    )
    .await;
    drop_schema(tag).await;
    rate
}

async fn e2e_no_inbox(tag: &str, concurrency: usize, messages: usize) -> f64 {
    let rate = e2e(
        NoInbox(store(tag, concurrency as u32 + 2).await),
        concurrency,
        messages,
    )
    .await;
    drop_schema(tag).await;
    rate
}

/// Messages for about `SECONDS` at the rate a short calibration run showed.
fn sized(rate: f64) -> usize {
    ((rate * SECONDS) as usize).clamp(200, 50_000)
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat` (Linux; clock
/// ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// One run in this (child) process; with `endpoint` it exports there. Prints `rate <msg/s>`
/// and `cpu <ms per message>` (the whole run: preload sends, receive, process, export) on
/// stdout.
async fn telemetry_child(endpoint: Option<String>, concurrency: usize, messages: usize) {
    let tag = if endpoint.is_some() {
        "tel_on"
    } else {
        "tel_off"
    };
    let telemetry = endpoint.map(|endpoint| {
        let mut config = sb_inbox::telemetry::TelemetryConfig::new();
        config.endpoint = Some(endpoint);
        config.log_filter = "error".to_owned();
        config.metric_interval = Duration::from_secs(1);
        sb_inbox::telemetry::init(&config).unwrap()
    });
    let cpu = cpu_seconds();
    let rate = e2e_inbox(tag, concurrency, messages).await;
    if let Some(telemetry) = telemetry {
        // The last spans leave before the CPU is read.
        tokio::task::spawn_blocking(move || telemetry.shutdown())
            .await
            .unwrap();
    }
    let cpu_ms = (cpu_seconds() - cpu) * 1000.0 / messages as f64;
    println!("rate {rate}");
    println!("cpu {cpu_ms}");
}

/// Alternates off/on child processes and prints both rates and their ratio. The OTLP receiver
/// runs here, in the parent, so its decoding is not charged to the worker.
fn telemetry_compare(rt: &tokio::runtime::Runtime) {
    let exe = std::env::current_exe().unwrap();
    let (sink, addr) = rt.block_on(sink::Sink::start());
    let concurrency = 8;
    println!(
        "telemetry overhead: e2e at concurrency {concurrency}, {TELEMETRY_MESSAGES} messages per run, {ROUNDS} off/on pairs (PostgreSQL at {})",
        pg_schema::pg_url()
    );
    let mut rates = [Vec::new(), Vec::new()];
    let mut cpu = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        for (i, mode) in ["off", "on"].into_iter().enumerate() {
            let endpoint = if mode == "on" {
                format!("http://{addr}")
            } else {
                "-".to_owned()
            };
            let spans_before = sink.span_count();
            let output = std::process::Command::new(&exe)
                .args([
                    "telemetry-child",
                    &endpoint,
                    &concurrency.to_string(),
                    &TELEMETRY_MESSAGES.to_string(),
                ])
                .stderr(std::process::Stdio::inherit())
                .output()
                .unwrap();
            assert!(output.status.success(), "child {mode} failed");
            let stdout = String::from_utf8(output.stdout).unwrap();
            let value = |key: &str| -> f64 {
                stdout
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .unwrap()
                    .parse()
                    .unwrap()
            };
            let (rate, cpu_ms) = (value("rate "), value("cpu "));
            println!(
                "  round {round}: export {mode:>3}: {rate:>7.0} msg/s, {cpu_ms:.3} CPU ms/message, {} spans received",
                sink.span_count() - spans_before
            );
            rates[i].push(rate);
            cpu[i].push(cpu_ms);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (off, on) = (median(&mut rates[0]), median(&mut rates[1]));
    println!(
        "median: export off {off:.0} msg/s, export on {on:.0} msg/s: on/off {:.2}x",
        on / off
    );
    let (off, on) = (median(&mut cpu[0]), median(&mut cpu[1]));
    println!(
        "median CPU: export off {off:.3} ms/message, export on {on:.3} ms/message: on/off {:.2}x",
        on / off
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some(at) = args.iter().position(|a| a == "telemetry-child") {
        let endpoint = Some(args[at + 1].clone()).filter(|e| e != "-");
        let concurrency = args[at + 2].parse().unwrap();
        let messages = args[at + 3].parse().unwrap();
        rt.block_on(telemetry_child(endpoint, concurrency, messages));
        return;
    }
    if args.iter().any(|a| a == "telemetry") {
        telemetry_compare(&rt);
        return;
    }
    rt.block_on(async {
        println!("end-to-end throughput, about {SECONDS} s per configuration (PostgreSQL at {})", pg_schema::pg_url());
        println!(
            "{:>11} | {:>12} | {:>12} | {:>14} | {:>9} | {:>14}",
            "concurrency", "raw PG msg/s", "e2e msg/s", "e2e/raw PG", "no-inbox", "no-inbox/raw"
        );
        for concurrency in [1usize, 8, 32] {
            let raw = raw_pg("raw", concurrency, sized(raw_pg("raw", concurrency, 300).await)).await;
            let full = e2e_inbox("full", concurrency, sized(e2e_inbox("full", concurrency, 200).await)).await;
            let bare =
                e2e_no_inbox("bare", concurrency, sized(e2e_no_inbox("bare", concurrency, 200).await)).await;
            println!(
                "{concurrency:>11} | {raw:>12.0} | {full:>12.0} | {:>13.2}x | {bare:>9.0} | {:>13.2}x",
                full / raw,
                bare / raw
            );
        }
    });
}
