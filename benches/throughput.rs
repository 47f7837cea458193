//! Throughput against the database's own ceiling, measured side by side in one run.
//!
//! ```sh
//! cargo bench --bench throughput                       # wide and hot, concurrency 1, 8, 32, batch 1, 16, 64
//! cargo bench --bench throughput -- --concurrency 8 --workload wide --batch 1,64 --secs 5
//! cargo bench --bench throughput -- --concurrency 16 --workload wide --batch 1 --rtt 0,2,10,40
//! ```
//!
//! For each workload and concurrency:
//! 1. **Ceiling**: `pgbench -M prepared` runs the reference consumer's transaction (begin;
//!    inbox row; business key; reservation; per line a reservation line; a stock upsert per SKU
//!    in SKU order; commit) with `-c` = the concurrency, on orders of 1 to 3 lines over the
//!    workload's SKUs, in a fresh schema.
//! 2. **sb-inbox**: the Service Bus emulator in a process of its own (this binary, re-executed)
//!    is preloaded with orders drawn the same way; then a real `sb-inbox run` process with
//!    concurrency = the concurrency consumes them into another fresh schema, unbatched and with
//!    batched transactions (`SB_INBOX_BATCH_SIZE`), with no prefetch set, as a user who sets
//!    only the concurrency runs it: the receive window sizes itself (issue 42).
//!    `--prefetch-factor F` sets `SB_INBOX_PREFETCH` = F × batch size × concurrency instead (a
//!    fixed window, for experiments). The
//!    rate is taken between 10 % and 90 % of the inbox rows (start-up and the tail left out),
//!    from the row count polled every 100 ms; the worker's CPU (user + system, `/proc/PID/stat`)
//!    over the same window gives CPU ms per message, and its peak RSS (`VmHWM` in
//!    `/proc/PID/status`) is read at the end.
//!
//! 3. **Distance** (`--rtt MS,…`, default 0): the emulator serves with `--latency` RTT ÷ 2
//!    each way, so the same run shows what a broker 2 ms (in-region), 10 ms or 40 ms
//!    (cross-region) away does to the rate. Each row gives the rate ÷ the local (RTT 0) rate of
//!    the same run and ÷ min(local rate, in-flight ÷ RTT), in-flight being the concurrency.
//!
//! `--baseline PATH` runs another `sb-inbox` binary (say, main's) through the same rows first
//! (at the RTTs of `--baseline-rtt`, default 0), so a change is compared within one run.
//!
//! Each row also gives the emulator's CPU per message (it shares the cores with the worker and
//! PostgreSQL). `--steady` adds, per row, p50/p99 enqueue → commit at half the rate just
//! measured: orders sent at a steady rate to an idle worker (no backlog), enqueue being the
//! bench's send and commit the inbox row's `processed_at`; beside them, the p99 of the bench's
//! own sends answered in the same phase (a round trip to the same emulator: the lab's floor, the
//! machine's stalls included, for the worker's tail to be read against). The worker first runs
//! 2 s at that rate (not measured) and idles 2 s, past the receive window's peak hold: the orders measured
//! find it as resumed traffic finds a running worker, not as a process just started. `--trace` has the worker log the
//! runtime's phase trace (`RUST_LOG=sb_inbox::pipeline=debug`: receive wait, slot wait, queued,
//! transaction, settlement, mean deliveries held and busy) to stderr every 2 s. The load
//! average is printed before and after.
//!
//! With an RTT beyond 0 in `--rtt` (the distance table), the defaults are that table's: the
//! wide workload only, `--steady` and `--relay` on (`--no-steady`, `--no-relay` leave them
//! out), so that `--concurrency 16,8 --batch 1,64 --rtt 0,2,10,40` alone gives every row.
//!
//! 4. **Relay** (`--relay`): for each RTT, [`RELAY_BACKLOG`] outbox rows written in one
//!    transaction are published by the outbox relay with `RelayConfig::default()` (batch 100,
//!    the claim sizing itself from the windows; `--relay-batch N` sets the batch, a tuned figure)
//!    running as the worker runs it (`Relay::run`) to an in-process emulator that far away,
//!    on a queue with duplicate detection: events/s between 10 % and 90 % of the rows marked
//!    (start-up and the tail left out, as in the worker's rows) and from the start to the
//!    last mark (with the connection's set-up and the window's slow start), and every row
//!    counted on the destination once (sent = the backlog, no duplicate dropped). `--relay-in-flight N` sets its
//!    `max_in_flight` (the ceiling of each destination's window), for experiments; with
//!    `--trace` each RTT gives its rows claimed (more than the backlog: claims handed back)
//!    and its time per 1000 rows.
//!
//! Workloads: `wide` (2000 SKUs: little contention) and `hot` (20 SKUs: every order shares
//! rows with the ones in flight beside it).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use sb_inbox::Message;
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient, ServiceBusSenderPort};
use sb_inbox_cli::inventory::{OrderLine, OrderPlaced};

#[path = "common/pg_schema.rs"]
mod pg_schema;
use pg_schema::{drop_schema, fresh_schema, pg_url, schema_url};

/// Set in the re-executed child that serves the emulator.
const EMULATOR_CHILD: &str = "SB_INBOX_BENCH_EMULATOR_CHILD";
/// The child emulator's one-way latency in ms.
const EMULATOR_LATENCY: &str = "SB_INBOX_BENCH_EMULATOR_LATENCY_MS";
const QUEUE: &str = "orders";

#[derive(Debug, Clone, Copy)]
struct Workload {
    name: &'static str,
    skus: u32,
}

const WIDE: Workload = Workload {
    name: "wide",
    skus: 2000,
};
const HOT: Workload = Workload {
    name: "hot",
    skus: 20,
};

#[derive(Debug)]
struct Options {
    workloads: Vec<Workload>,
    concurrency: Vec<usize>,
    batches: Vec<usize>,
    /// Round trips to the broker, in ms.
    rtts: Vec<u64>,
    /// Another `sb-inbox` binary (e.g. main's) measured the same way first, for a same-run
    /// comparison (`--baseline PATH`).
    baseline: Option<String>,
    /// `SB_INBOX_PREFETCH` as a multiple of concurrency × batch (`--prefetch-factor`); unset
    /// by default: the receive window sizes itself.
    prefetch_factor: Option<usize>,
    /// RTTs at which the baseline runs (`--baseline-rtt`, default 0).
    baseline_rtts: Vec<u64>,
    /// Also measure the relay at each RTT (`--relay`).
    relay: bool,
    /// Also measure enqueue → commit latency at half the measured rate (`--steady`).
    steady: bool,
    /// The worker logs the `sb_inbox::pipeline` phase trace to stderr (`--trace`).
    trace: bool,
    /// The relay's `max_in_flight` (`--relay-in-flight N`); unset: the default, as a user
    /// gets it.
    relay_in_flight: Option<usize>,
    /// The relay's `batch_size` (`--relay-batch N`, for experiments); unset: the default, as a
    /// user gets it.
    relay_batch: Option<usize>,
    secs: u64,
}

impl Options {
    fn parse() -> Options {
        let mut options = Options {
            workloads: vec![WIDE, HOT],
            concurrency: vec![1, 8, 32],
            batches: vec![1, 16, 64],
            rtts: vec![0],
            baseline: None,
            prefetch_factor: None,
            baseline_rtts: vec![0],
            relay: false,
            steady: false,
            trace: false,
            relay_in_flight: None,
            relay_batch: None,
            secs: 8,
        };
        let (mut workload_given, mut no_steady, mut no_relay) = (false, false, false);
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            match arg.as_str() {
                "--concurrency" => {
                    options.concurrency = list(args.next())
                        .map(|c| c.parse().expect("--concurrency takes numbers"))
                        .collect();
                }
                "--batch" => {
                    options.batches = list(args.next())
                        .map(|b| b.parse().expect("--batch takes numbers"))
                        .collect();
                }
                "--prefetch-factor" => {
                    options.prefetch_factor = Some(
                        args.next()
                            .and_then(|s| s.parse().ok())
                            .expect("--prefetch-factor takes a number"),
                    );
                }
                "--baseline-rtt" => {
                    options.baseline_rtts = list(args.next())
                        .map(|r| r.parse().expect("--baseline-rtt takes milliseconds"))
                        .collect();
                }
                "--relay" => options.relay = true,
                "--steady" => options.steady = true,
                "--no-relay" => no_relay = true,
                "--no-steady" => no_steady = true,
                "--trace" => options.trace = true,
                "--relay-batch" => {
                    options.relay_batch = Some(
                        args.next()
                            .and_then(|n| n.parse().ok())
                            .expect("--relay-batch takes a number"),
                    );
                }
                "--relay-in-flight" => {
                    options.relay_in_flight = Some(
                        args.next()
                            .and_then(|s| s.parse().ok())
                            .expect("--relay-in-flight takes a number"),
                    );
                }
                "--baseline" => {
                    options.baseline = Some(args.next().expect("--baseline takes a path"));
                }
                "--rtt" => {
                    options.rtts = list(args.next())
                        .map(|r| r.parse().expect("--rtt takes milliseconds"))
                        .collect();
                }
                "--workload" => {
                    workload_given = true;
                    options.workloads = list(args.next())
                        .map(|w| match w {
                            "wide" => WIDE,
                            "hot" => HOT,
                            other => panic!("--workload wide|hot, not {other}"),
                        })
                        .collect();
                }
                "--secs" => {
                    options.secs = args
                        .next()
                        .and_then(|s| s.parse().ok())
                        .expect("--secs takes a number");
                }
                // `cargo bench` passes `--bench`; filters are not used.
                _ => {}
            }
        }
        // The distance table's defaults (issue 42): one invocation with only the
        // concurrency, batch and RTTs given has every row the issue asks for.
        if options.rtts.iter().any(|&rtt| rtt > 0) {
            if !workload_given {
                options.workloads = vec![WIDE];
            }
            options.steady = !no_steady;
            options.relay = !no_relay;
        }
        options
    }
}

fn list(arg: Option<String>) -> impl Iterator<Item = &'static str> {
    let text: &'static str = Box::leak(arg.unwrap_or_default().into_boxed_str());
    text.split(',').filter(|s| !s.is_empty())
}

/// The pgbench script: the consumer's transaction, stock rows upserted in SKU order. (pgbench
/// substitutes `:name` even inside string literals, hence `\x3a` for the colon of `order:`.)
const PGBENCH_SCRIPT: &str = r"\set n random(1, 3)
\set a random(1, :skus)
\set b random(1, :skus)
\set c random(1, :skus)
\set q random(1, 5)
\set oid random(1, 9000000000000000000)
\set lo2 least(:a, :b)
\set hi2 greatest(:a, :b)
\set lo3 least(:a, :b, :c)
\set hi3 greatest(:a, :b, :c)
\set mid3 :a + :b + :c - :lo3 - :hi3
BEGIN;
INSERT INTO sb_inbox (consumer, message_id) VALUES ('inventory.order-placed.v1', 'm-' || CAST(:oid AS text));
INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ('inventory.order-placed.v1', E'order\\x3ao-' || CAST(:oid AS text), 'm-' || CAST(:oid AS text));
INSERT INTO inventory_reservation (order_id, message_id) VALUES ('o-' || CAST(:oid AS text), 'm-' || CAST(:oid AS text));
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-' || CAST(:oid AS text), 1, 'sku-' || CAST(:a AS text), :q);
\if :n = 1
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:a AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
\elif :n = 2
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-' || CAST(:oid AS text), 2, 'sku-' || CAST(:b AS text), :q);
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:lo2 AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:hi2 AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
\else
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-' || CAST(:oid AS text), 2, 'sku-' || CAST(:b AS text), :q);
INSERT INTO inventory_reservation_line (order_id, line_no, sku, quantity) VALUES ('o-' || CAST(:oid AS text), 3, 'sku-' || CAST(:c AS text), :q);
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:lo3 AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:mid3 AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
INSERT INTO inventory_stock (sku, reserved) VALUES ('sku-' || CAST(:hi3 AS text), :q) ON CONFLICT (sku) DO UPDATE SET reserved = inventory_stock.reserved + excluded.reserved;
\endif
COMMIT;
";

/// pgbench's transactions per second for `secs` seconds.
async fn pgbench(workload: Workload, concurrency: usize, secs: u64) -> f64 {
    let schema = format!("bench_tp_pgbench_{}", std::process::id());
    fresh_schema(&schema, 2).await;
    let script = std::env::temp_dir().join(format!("sb-inbox-bench-{}.sql", std::process::id()));
    std::fs::write(&script, PGBENCH_SCRIPT).unwrap();
    let output = Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-T", &secs.to_string()])
        .args(["-c", &concurrency.to_string()])
        .args(["-j", &concurrency.min(4).to_string()])
        .args(["-D", &format!("skus={}", workload.skus)])
        .arg("-f")
        .arg(&script)
        .env("PGOPTIONS", format!("-c search_path={schema}"))
        .arg(pg_url())
        .output()
        .expect("pgbench on PATH (Debian: postgresql-contrib / postgresql-client)");
    drop_schema(&schema).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .find_map(|line| {
            let rest = line.strip_prefix("tps = ")?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no tps in pgbench's output:\n{stdout}"))
}

/// The emulator in a process of its own; stdin closed (this process gone) stops it.
struct EmulatorProcess {
    child: Child,
    connection: String,
}

impl EmulatorProcess {
    fn start(rtt_ms: u64) -> EmulatorProcess {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(EMULATOR_CHILD, "1")
            .env(EMULATOR_LATENCY, (rtt_ms / 2).to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        EmulatorProcess {
            child,
            connection: line.trim().to_owned(),
        }
    }
}

impl Drop for EmulatorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The child: serves a queue `orders` (1 min lock, no duplicate detection) until stdin closes.
fn emulator_child() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let config = sb_emulator::Config::new("sbemulatorns").with_queue(
            sb_emulator::QueueConfig::new(QUEUE).with_properties(sb_emulator::EntityProperties {
                lock_duration: Duration::from_secs(60),
                max_delivery_count: 10,
                ..Default::default()
            }),
        );
        let broker = sb_emulator::Broker::new(config).unwrap();
        let one_way = std::env::var(EMULATOR_LATENCY)
            .ok()
            .and_then(|ms| ms.parse().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        let options = sb_emulator::EmulatorOptions::default().with_latency(one_way);
        let emulator = sb_emulator::Emulator::start(broker, options).await.unwrap();
        println!("{}", emulator.connection_string());
        tokio::task::spawn_blocking(|| {
            let mut sink = String::new();
            while std::io::stdin().read_line(&mut sink).is_ok_and(|n| n > 0) {}
        })
        .await
        .unwrap();
    });
}

fn order(rng: &mut StdRng, workload: Workload, i: usize) -> Message {
    let lines = (0..rng.random_range(1..=3))
        .map(|_| OrderLine {
            sku: format!("sku-{}", rng.random_range(1..=workload.skus)),
            quantity: rng.random_range(1..=5),
        })
        .collect();
    let order = OrderPlaced {
        order_id: format!("o-{i}"),
        lines,
    };
    Message::new(
        format!("m-{i}"),
        "orders.order-placed.v1",
        serde_json::to_vec(&order).unwrap(),
    )
}

/// Sends `count` orders, [`PRELOAD_LANES`] at a time; a send that fails transiently (a link the emulator
/// detached, a busy answer) is sent again, as any Service Bus producer must.
async fn preload(connection: &str, workload: Workload, count: usize) {
    let cs: ConnectionString = connection.parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let tasks: Vec<_> = (0..PRELOAD_LANES)
        .map(|lane| {
            let sender = client.sender(QUEUE);
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(lane as u64);
                for i in (lane..count).step_by(PRELOAD_LANES) {
                    let message = order(&mut rng, workload, i);
                    let mut attempts = 0;
                    while let Err(error) = sender.send(message.clone()).await {
                        attempts += 1;
                        assert!(attempts < 10, "sending order {i} failed: {error}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

/// Outbox rows the relay publishes per RTT.
const RELAY_BACKLOG: usize = 20_000;

/// The relay's events/s from a backlog of [`RELAY_BACKLOG`] rows to a broker `rtt_ms` away,
/// and the destination's (accepted, duplicates dropped) counts.
/// With `trace`, the rows claimed and the time per 1000 rows are printed.
async fn relay(rtt_ms: u64, options: &Options) -> (f64, f64, u64, u64) {
    let (trace, in_flight) = (options.trace, options.relay_in_flight);
    use sb_inbox::relay::{Relay, RelayConfig};
    use sb_inbox::{OutboxMessage, OutboxStore as _, Store as _, StoreTx, Tx as _};
    let config = sb_emulator::Config::new("sbemulatorns").with_queue(
        sb_emulator::QueueConfig::new("events").with_properties(sb_emulator::EntityProperties {
            requires_duplicate_detection: true,
            duplicate_detection_history_time_window: Duration::from_secs(600),
            ..Default::default()
        }),
    );
    let emulator = sb_emulator::Emulator::start(
        sb_emulator::Broker::new(config).unwrap(),
        sb_emulator::EmulatorOptions::default().with_latency(Duration::from_millis(rtt_ms / 2)),
    )
    .await
    .unwrap();
    let schema = format!("bench_tp_relay_{}", std::process::id());
    let store = fresh_schema(&schema, 2).await;
    let mut tx = store.begin().await.unwrap();
    for i in 0..RELAY_BACKLOG {
        let event = OutboxMessage::new(
            "events",
            "inventory.stock-reserved.v1",
            format!(r#"{{"n":{i}}}"#).into_bytes(),
        );
        tx.append_outbox(&event).await.unwrap();
    }
    tx.commit().await.unwrap();
    let cs: ConnectionString = emulator.connection_string().parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let mut config = RelayConfig::default();
    if let Some(batch) = options.relay_batch {
        config = config.with_batch_size(batch);
    }
    if let Some(in_flight) = in_flight {
        config = config.with_max_in_flight(in_flight);
    }
    let relay = std::sync::Arc::new(Relay::new(
        store.clone(),
        ServiceBusSenderPort::new(client.clone()),
        config,
    ));
    let stats = relay.stats();
    let stop = tokio_util::sync::CancellationToken::new();
    let start = Instant::now();
    // The relay as the worker runs it (`Relay::run`: passes overlapped), until every row is
    // marked; the mark count is read every millisecond.
    let running = tokio::spawn({
        let (relay, stop) = (relay.clone(), stop.clone());
        async move { relay.run(stop).await }
    });
    let (tenth, ninth) = (RELAY_BACKLOG as u64 / 10, RELAY_BACKLOG as u64 * 9 / 10);
    let (mut from, mut to) = (None, None);
    loop {
        let marked = stats.snapshot().marked;
        if marked >= tenth {
            from.get_or_insert_with(Instant::now);
        }
        if marked >= ninth {
            to.get_or_insert_with(Instant::now);
        }
        if marked >= RELAY_BACKLOG as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = start.elapsed();
    stop.cancel();
    running.await.unwrap();
    let rate = RELAY_BACKLOG as f64 / took.as_secs_f64();
    let (from, to) = (from.unwrap(), to.unwrap());
    let steady = (ninth - tenth) as f64 / to.duration_since(from).as_secs_f64();
    if trace {
        let claimed = stats.snapshot().claimed;
        eprintln!(
            "relay rtt {rtt_ms} ms: {claimed} rows claimed, {:.1} ms per 1000 rows",
            took.as_secs_f64() * 1000.0 * 1000.0 / RELAY_BACKLOG as f64,
        );
    }
    assert_eq!(store.outbox_backlog().await.unwrap().pending, 0);
    let counts = emulator.broker().entity("events").unwrap().counts();
    emulator.shutdown().await;
    drop_schema(&schema).await;
    (steady, rate, counts.sent, counts.duplicates)
}

/// Concurrent preloading senders: enough that a broker 40 ms away fills the queue in seconds.
const PRELOAD_LANES: usize = 64;

/// User + system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// How long a worker run may measure before its window is cut short: a configuration that
/// collapses (deadlocks) is reported over what it did, not waited for.
const MEASURE_LIMIT: Duration = Duration::from_secs(60);

/// A `sb-inbox run` process of `binary` consuming `QUEUE` of `emulator` into `schema`.
fn spawn_worker(binary: &str, emulator: &EmulatorProcess, schema: &str, run: &WorkerRun) -> Child {
    let log = if run.trace {
        "warn,sb_inbox::pipeline=debug,sb_servicebus::window=debug"
    } else {
        "warn"
    };
    let mut command = Command::new(binary);
    command
        .arg("run")
        .env("SB_INBOX_CONSUMER", sb_inbox_cli::inventory::CONSUMER)
        .env("SB_INBOX_STORE", schema_url(schema))
        .env("SB_INBOX_SERVICEBUS_CONNECTION", &emulator.connection)
        .env("SB_INBOX_ENTITY", QUEUE)
        .env("SB_INBOX_CONCURRENCY", run.concurrency.to_string())
        .env("SB_INBOX_BATCH_SIZE", run.batch.to_string())
        .env("SB_INBOX_LOCK_DURATION_SECS", "60")
        .env("RUST_LOG", log)
        .stdout(Stdio::null());
    match run.prefetch {
        Some(prefetch) => command.env("SB_INBOX_PREFETCH", prefetch.to_string()),
        // What a user who sets no prefetch gets, whatever the bench's environment says.
        None => command.env_remove("SB_INBOX_PREFETCH"),
    };
    command.spawn().unwrap()
}

/// One worker configuration at one distance.
#[derive(Debug, Clone, Copy)]
struct WorkerRun {
    workload: Workload,
    concurrency: usize,
    batch: usize,
    rtt_ms: u64,
    /// `SB_INBOX_PREFETCH`; `None`: unset (the window sizes itself).
    prefetch: Option<usize>,
    trace: bool,
}

/// What one worker run measured over 10 % → 90 % of its orders.
#[derive(Debug, Clone, Copy)]
struct Measured {
    rate: f64,
    worker_cpu_ms: f64,
    /// The emulator's CPU per message: it shares the machine's cores with the worker and
    /// PostgreSQL, and its delay line (`--latency`) costs CPU a real broker's distance does not.
    emulator_cpu_ms: f64,
    /// The worker's peak resident set, in MiB.
    peak_rss_mib: f64,
    cut: bool,
}

/// The worker's messages per second and CPU ms per message over 10 % → 90 % of `count`, and
/// whether the window was cut at [`MEASURE_LIMIT`] before 90 %.
async fn worker(binary: &str, run: WorkerRun, count: usize) -> Measured {
    let emulator = EmulatorProcess::start(run.rtt_ms);
    preload(&emulator.connection, run.workload, count).await;
    let schema = format!("bench_tp_worker_{}", std::process::id());
    let store = fresh_schema(&schema, 2).await;
    let mut child = spawn_worker(binary, &emulator, &schema, &run);
    let (pid, emulator_pid) = (child.id(), emulator.child.id());
    let (low, high) = (count / 10, count * 9 / 10);
    let mut start = None;
    let deadline = Instant::now() + Duration::from_secs(600);
    let result = loop {
        assert!(Instant::now() < deadline, "the worker did not start");
        let done: i64 = store
            .query("SELECT count(*) FROM sb_inbox", &[])
            .await
            .unwrap()[0]
            .get(0);
        let done = usize::try_from(done).unwrap();
        let now = (
            Instant::now(),
            cpu_seconds(pid),
            cpu_seconds(emulator_pid),
            done,
        );
        match start {
            None if done >= low => start = Some(now),
            Some((t0, cpu0, ecpu0, done0)) if done >= high || now.0 - t0 >= MEASURE_LIMIT => {
                let messages = (done - done0).max(1) as f64;
                break Measured {
                    rate: messages / (now.0 - t0).as_secs_f64(),
                    worker_cpu_ms: (now.1 - cpu0) * 1000.0 / messages,
                    emulator_cpu_ms: (now.2 - ecpu0) * 1000.0 / messages,
                    peak_rss_mib: peak_rss_mib(pid),
                    cut: done < high,
                };
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    drop_schema(&schema).await;
    result
}

/// Enqueue → commit latency (p50, p99 in ms) of orders arriving at a steady `rate` per second
/// for `secs`, to a worker that is idle when they start (no backlog): it ran at that rate for
/// [`STEADY_WARM_UP`] (not measured), then idled for [`STEADY_IDLE_GAP`]. "Commit" is the inbox
/// row's `processed_at` (PostgreSQL's `now()`: the transaction's start, so the commit's own
/// round trip is not in it); enqueue is the moment the bench hands the order to its sender.
/// The first 10 % are left out (warm-up).
async fn steady(binary: &str, run: WorkerRun, rate: f64, secs: u64) -> (f64, f64, f64) {
    use std::time::SystemTime;
    let emulator = EmulatorProcess::start(run.rtt_ms);
    let schema = format!("bench_tp_steady_{}", std::process::id());
    let store = fresh_schema(&schema, 2).await;
    let mut child = spawn_worker(binary, &emulator, &schema, &run);
    let cs: ConnectionString = emulator.connection.parse().unwrap();
    let client = ServiceBusClient::from_connection_string(&cs);
    let sender = client.sender(QUEUE);
    let count = ((rate * secs as f64) as usize).max(100);
    let mut rng = StdRng::seed_from_u64(7);
    // A first order, waited for: the worker is connected and attached before the clock runs.
    sender
        .send(order(&mut rng, run.workload, count))
        .await
        .unwrap();
    let committed = |n: i64| {
        let store = store.clone();
        async move {
            let wait = async {
                loop {
                    let done: i64 = store
                        .query("SELECT count(*) FROM sb_inbox", &[])
                        .await
                        .unwrap()[0]
                        .get(0);
                    if done >= n {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            };
            tokio::time::timeout(Duration::from_secs(120), wait)
                .await
                .expect("the steady orders were committed");
        }
    };
    committed(1).await;
    // A worker that has run at this rate, then idled past the window's peak hold: the
    // orders measured find it as traffic that resumes finds a running worker, not as a
    // process just started (whose window has measured nothing yet).
    let warm = ((rate * STEADY_WARM_UP.as_secs_f64()) as usize).max(1);
    send_paced(
        &sender,
        &mut rng,
        run.workload,
        rate,
        count + 1..count + 1 + warm,
    )
    .await;
    let warmed = i64::try_from(warm).unwrap() + 1;
    committed(warmed).await;
    tokio::time::sleep(STEADY_IDLE_GAP).await;
    let (sent, acks): (Vec<SystemTime>, Vec<f64>) =
        send_paced(&sender, &mut rng, run.workload, rate, 0..count)
            .await
            .into_iter()
            .map(|(at, ack)| (at, ack.as_secs_f64() * 1000.0))
            .unzip();
    committed(i64::try_from(count).unwrap() + warmed).await;
    let rows = store
        .query(
            "SELECT message_id, extract(epoch FROM processed_at)::float8 FROM sb_inbox",
            &[],
        )
        .await
        .unwrap();
    let mut in_order: Vec<(usize, f64)> = rows
        .iter()
        .filter_map(|row| {
            let id: String = row.get(0);
            let i: usize = id.strip_prefix("m-")?.parse().ok()?;
            let at = sent.get(i)?;
            (i >= count / 10).then(|| {
                let enqueued = at.duration_since(SystemTime::UNIX_EPOCH).unwrap();
                let processed: f64 = row.get(1);
                (i, (processed - enqueued.as_secs_f64()) * 1000.0)
            })
        })
        .collect();
    in_order.sort_by_key(|(i, _)| *i);
    let mut latencies: Vec<f64> = in_order.into_iter().map(|(_, ms)| ms).collect();
    // The lab's own floor beside the worker's tail: the bench's sends to the same emulator
    // (answered a round trip later when all is well) share the machine's stalls. The same
    // first tenth is left out.
    let mut acks = acks[(count / 10).min(acks.len())..].to_vec();
    acks.sort_by(f64::total_cmp);
    if run.trace {
        // Where the tail lies: the latencies of each tenth of the run in order.
        let tenths: Vec<String> = latencies
            .chunks(latencies.len().div_ceil(10).max(1))
            .map(|tenth| format!("{:.0}", tenth.iter().copied().fold(0.0, f64::max)))
            .collect();
        eprintln!(
            "steady rtt {} ms: send answered p50 {:.1} / p99 {:.1} ms; max per tenth (ms): {}",
            run.rtt_ms,
            quantile(&acks, 0.5),
            quantile(&acks, 0.99),
            tenths.join(" ")
        );
    }
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| quantile(&latencies, q);
    let _ = child.kill();
    let _ = child.wait();
    drop_schema(&schema).await;
    (at(0.5), at(0.99), quantile(&acks, 0.99))
}

/// How long the steady phase runs its worker at the steady rate before the orders measured.
const STEADY_WARM_UP: Duration = Duration::from_secs(2);
/// The idle gap between the warm-up and the orders measured: past the window's peak hold
/// (`sb_servicebus::window::PEAK_HOLD`, 1 s).
const STEADY_IDLE_GAP: Duration = Duration::from_secs(2);

/// Sends orders `ids` at `rate` per second, each by a task of its own (a slow answer does not
/// hold the next send back); returns when each was handed to the sender and how long its
/// answer took, in the order of `ids`.
async fn send_paced(
    sender: &sb_inbox::servicebus::ServiceBusSender,
    rng: &mut StdRng,
    workload: Workload,
    rate: f64,
    ids: std::ops::Range<usize>,
) -> Vec<(std::time::SystemTime, Duration)> {
    let every = Duration::from_secs_f64(1.0 / rate);
    let begin = tokio::time::Instant::now();
    let mut sends = Vec::with_capacity(ids.len());
    for (n, i) in ids.enumerate() {
        tokio::time::sleep_until(begin + every.mul_f64(n as f64)).await;
        let message = order(rng, workload, i);
        let sender = sender.clone();
        let at = std::time::SystemTime::now();
        sends.push(tokio::spawn(async move {
            sender.send(message).await.unwrap();
            (at, at.elapsed().unwrap_or_default())
        }));
    }
    let mut answered = Vec::with_capacity(sends.len());
    for send in sends {
        answered.push(send.await.unwrap());
    }
    answered
}

/// The `q` quantile of `sorted` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    if std::env::var_os(EMULATOR_CHILD).is_some() {
        emulator_child();
        return;
    }
    let options = Options::parse();
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!("load: {}", load_average());
    println!(
        "| workload | concurrency | pgbench tx/s | batch | RTT ms | sb-inbox msg/s | sb-inbox / ceiling | / local (RTT 0) | / min(local, concurrency ÷ RTT) | worker CPU ms/msg | emulator CPU ms/msg | worker peak RSS MiB | p50 / p99 ms at half rate | the bench's sends answered, p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for workload in &options.workloads {
        for &concurrency in &options.concurrency {
            let ceiling = rt.block_on(pgbench(*workload, concurrency, options.secs));
            for &batch in &options.batches {
                // About `secs` seconds of work at the ceiling's rate (batches may go faster),
                // within sane bounds.
                let scale = if batch > 1 { 3.0 } else { 1.0 };
                let count = ((ceiling * scale * options.secs as f64) as usize).clamp(500, 60_000);
                let prefetch = options
                    .prefetch_factor
                    .map(|factor| concurrency * batch * factor);
                let run = |rtt_ms| WorkerRun {
                    workload: *workload,
                    concurrency,
                    batch,
                    rtt_ms,
                    prefetch,
                    trace: options.trace,
                };
                let row = |label: &str, binary: &str, rtt: u64, local: Option<f64>| {
                    let measured = rt.block_on(worker(binary, run(rtt), count));
                    let (of_local, of_bound) = match local {
                        Some(local) => {
                            let bound = if rtt == 0 {
                                local
                            } else {
                                local.min(concurrency as f64 * 1000.0 / rtt as f64)
                            };
                            (
                                format!("{:.2}", measured.rate / local),
                                format!("{:.2}", measured.rate / bound),
                            )
                        }
                        None => ("—".to_owned(), "—".to_owned()),
                    };
                    let latency = if options.steady {
                        let (p50, p99, sends_p99) = rt.block_on(steady(
                            binary,
                            run(rtt),
                            measured.rate / 2.0,
                            options.secs,
                        ));
                        format!("{p50:.1} / {p99:.1} | {sends_p99:.1}")
                    } else {
                        "— | —".to_owned()
                    };
                    println!(
                        "| {} ({} SKUs){label} | {concurrency} | {ceiling:.0} | {batch} | {rtt} | {:.0}{} | {:.2} | {of_local} | {of_bound} | {:.2} | {:.2} | {:.0} | {latency} |",
                        workload.name,
                        workload.skus,
                        measured.rate,
                        if measured.cut { " (cut at 60 s)" } else { "" },
                        measured.rate / ceiling,
                        measured.worker_cpu_ms,
                        measured.emulator_cpu_ms,
                        measured.peak_rss_mib,
                    );
                    measured.rate
                };
                if let Some(baseline) = &options.baseline {
                    let mut local = None;
                    for &rtt in &options.baseline_rtts {
                        let rate = row(", **baseline**", baseline, rtt, local);
                        if rtt == 0 {
                            local = Some(rate);
                        }
                    }
                }
                let mut local = None;
                for &rtt in &options.rtts {
                    let rate = row("", env!("CARGO_BIN_EXE_sb-inbox"), rtt, local);
                    if rtt == 0 {
                        local = Some(rate);
                    }
                }
            }
        }
    }
    if options.relay {
        println!();
        println!("load: {}", load_average());
        println!(
            "| RTT ms | relay events/s | ÷ RTT 0 | start to end events/s | ÷ RTT 0 | rows on the destination | duplicates dropped |"
        );
        println!("|---:|---:|---:|---:|---:|---:|---:|");
        let mut local = None;
        for &rtt in &options.rtts {
            let (steady, whole, sent, duplicates) = rt.block_on(relay(rtt, &options));
            let (local_steady, local_whole) = *local.get_or_insert((steady, whole));
            println!(
                "| {rtt} | {steady:.0} | {:.2} | {whole:.0} | {:.2} | {sent} | {duplicates} |",
                steady / local_steady,
                whole / local_whole,
            );
        }
    }
    println!("load at the end: {}", load_average());
}

/// The peak resident set of process `pid` (`VmHWM` in `/proc/PID/status`), in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// `/proc/loadavg`'s three load averages, printed beside the figures (the machine is shared).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|all| all.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}
