//! `sb-inbox demo`: the article's scenario on the embedded default (the emulator in-process and
//! SQLite), with two worker instances.
//!
//! The stream holds distinct orders, exact redeliveries (the same message id published again),
//! concurrent copies, a republished order under a new message id (a business-key duplicate),
//! settlements answered `server-busy` after commit (retried by lock token, as the service's
//! busy answers must be), poison messages and an unsupported contract version. The workers host
//! the same router as `sb-inbox run` (`inventory::router`: order-placed v1 upcast to v2, v2,
//! order-cancelled v1), so v1 orders go through the upcaster and v3 is dead-lettered.
//! The demo succeeds only if the database holds exactly one reservation per distinct order.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::inventory::{InventoryCounts, InventoryStore, OrderLine, OrderPlaced};
use crate::ops::send::OrderMessage;
use sb_inbox::servicebus::{ConnectionString, ServiceBusClient, ServiceBusReceiver};
use sb_inbox::{
    ConsumerName, Message, Router, Runtime, RuntimeConfig, SqliteStore, SqliteTx, StatsSnapshot,
};

const QUEUE: &str = "orders";
const CONFIG: &str = r#"{"UserConfig":{"Namespaces":[{"Name":"sbemulatorns","Queues":[
    {"Name":"orders","Properties":{"LockDuration":"PT2S","MaxDeliveryCount":5,"DefaultMessageTimeToLive":"PT1H"}}],
    "Topics":[]}],"Logging":{"Type":"File"}}}"#;

/// How many of each kind the demo publishes.
#[derive(Debug, Clone, Copy)]
pub struct DemoPlan {
    /// Distinct orders published once.
    pub orders: usize,
    /// Of those, how many are published again with the same message id.
    pub redeliveries: usize,
    /// Distinct orders published as two copies back to back.
    pub concurrent_copies: usize,
    /// Orders republished under a new message id.
    pub republished: usize,
    /// Settlements the emulator refuses after the commit.
    pub refused_settlements: u32,
    /// Messages whose body is not JSON.
    pub poison: usize,
    /// Messages of `orders.order-placed.v3`, a version no route accepts.
    pub unsupported: usize,
}

impl Default for DemoPlan {
    fn default() -> Self {
        DemoPlan {
            orders: 100,
            redeliveries: 20,
            concurrent_copies: 10,
            republished: 5,
            refused_settlements: 5,
            poison: 3,
            unsupported: 2,
        }
    }
}

/// What the demo saw.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    /// Messages published.
    pub sent: u64,
    /// Runtime counters of both workers together.
    pub stats: StatsSnapshot,
    /// Dead-letter reasons and counts.
    pub dead_letter_reasons: BTreeMap<String, u64>,
    /// Distinct valid orders published.
    pub distinct_orders: i64,
    /// Units ordered over the distinct orders.
    pub ordered_units: i64,
    /// What the database holds.
    pub counts: InventoryCounts,
    /// Where the SQLite database is.
    pub database: PathBuf,
}

impl DemoReport {
    /// True when every order took effect exactly once.
    pub fn is_correct(&self) -> bool {
        self.counts.reservations == self.distinct_orders
            && self.counts.reserved_units == self.ordered_units
            && self.counts.line_units == self.ordered_units
    }
}

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DemoError {
    /// The emulator failed to start.
    #[error("emulator: {0}")]
    Emulator(#[from] sb_emulator::Error),
    /// The store failed.
    #[error("store: {0}")]
    Store(#[from] sb_inbox::StoreError),
    /// Publishing failed.
    #[error("send: {0}")]
    Send(String),
    /// A worker failed.
    #[error("worker: {0}")]
    Runtime(#[from] sb_inbox::RuntimeError),
    /// The reference consumer's router did not build.
    #[error("router: {0}")]
    Router(#[from] sb_inbox::RouterError),
    /// The queue did not drain in time.
    #[error("the queue did not drain within {0:?}")]
    Timeout(Duration),
}

/// An order of `lines` lines (SKU-0 ×1, SKU-1 ×2, …) with its units in all.
fn order(message_id: &str, order_id: &str, lines: usize) -> Result<(Message, i64), DemoError> {
    let order = OrderPlaced {
        order_id: order_id.to_owned(),
        lines: (1..=lines)
            .map(|n| OrderLine {
                sku: format!("SKU-{}", n - 1),
                quantity: i32::try_from(n).unwrap_or(i32::MAX),
            })
            .collect(),
    };
    let units = order.lines.iter().map(|l| i64::from(l.quantity)).sum();
    let message = OrderMessage {
        message_id: message_id.to_owned(),
        order,
    }
    .to_message()
    .map_err(|e| DemoError::Send(e.to_string()))?;
    Ok((message, units))
}

/// The stream the plan asks for, in publishing order, counting the distinct orders and their
/// units into `report`.
fn stream(plan: &DemoPlan, report: &mut DemoReport) -> Result<Vec<Message>, DemoError> {
    let mut send = Vec::new();
    for i in 0..plan.orders {
        let (message, units) = order(&format!("m-{i}"), &format!("o-{i}"), 1 + i % 3)?;
        report.distinct_orders += 1;
        report.ordered_units += units;
        if i < plan.redeliveries {
            send.push(message.clone());
        }
        if i < plan.republished {
            let id = format!("m-{i}-republished");
            let (again, _) = order(&id, &format!("o-{i}"), 1 + i % 3)?;
            send.push(again);
        }
        send.push(message);
    }
    for i in 0..plan.concurrent_copies {
        let (message, units) = order(&format!("m-copy-{i}"), &format!("o-copy-{i}"), 2)?;
        report.distinct_orders += 1;
        report.ordered_units += units;
        send.push(message.clone());
        send.push(message);
    }
    for i in 0..plan.poison {
        let id = format!("m-poison-{i}");
        send.push(Message::new(id, crate::inventory::CONTRACT, "{not json"));
    }
    for i in 0..plan.unsupported {
        send.push(Message::new(
            format!("m-v3-{i}"),
            "orders.order-placed.v3",
            r#"{"orderId":"x","lines":[]}"#,
        ));
    }
    Ok(send)
}

/// The emulator in-process with the demo's queue, and its connection string.
async fn start_emulator() -> Result<(sb_emulator::Emulator, ConnectionString), DemoError> {
    let broker = sb_emulator::Broker::new(
        sb_emulator::Config::from_json(CONFIG).map_err(sb_emulator::Error::from)?,
    )?;
    let emulator =
        sb_emulator::Emulator::start(broker, sb_emulator::EmulatorOptions::default()).await?;
    let cs: ConnectionString = emulator
        .connection_string()
        .parse()
        .map_err(|e: sb_inbox::servicebus::ConnectionStringError| DemoError::Send(e.to_string()))?;
    Ok((emulator, cs))
}

type DemoRuntime = Runtime<ServiceBusReceiver, SqliteStore, Router<SqliteTx>>;
type DemoWorker = (
    Arc<DemoRuntime>,
    tokio::task::JoinHandle<Result<(), sb_inbox::RuntimeError>>,
);

/// One worker per store, each on its own connection, until `shutdown`.
fn start_workers(
    stores: [SqliteStore; 2],
    cs: &ConnectionString,
    shutdown: &CancellationToken,
) -> Result<Vec<DemoWorker>, DemoError> {
    let mut workers = Vec::new();
    let router = crate::inventory::router(None)?;
    for store in stores {
        // The demo's emulator answers some settlements busy on purpose: a short pause keeps
        // the demo quick (the service's throttling calls for the default's 10 s).
        let receiver: ServiceBusReceiver = ServiceBusClient::from_connection_string(cs)
            .with_server_busy_wait(std::time::Duration::from_secs(1))
            .receiver(QUEUE, 0);
        let mut config = RuntimeConfig::new(
            ConsumerName::new(crate::inventory::CONSUMER)
                .map_err(|e| DemoError::Send(e.to_string()))?,
        );
        config.concurrency = 4;
        config.lock_margin = Duration::from_millis(500);
        config.shutdown_grace = Duration::from_secs(5);
        let runtime = Arc::new(Runtime::new(
            receiver.clone(),
            store,
            router.clone(),
            config,
        ));
        let token = shutdown.child_token();
        let task = {
            let runtime = runtime.clone();
            tokio::spawn(async move {
                let result = runtime.run(token).await;
                receiver.close().await;
                result
            })
        };
        workers.push((runtime, task));
    }
    Ok(workers)
}

/// Waits until every message is settled (completed or dead-lettered), reporting progress.
async fn drain(entity: &sb_emulator::Entity, sent: u64, progress: &(dyn Fn(u64, u64) + Sync)) {
    loop {
        let counts = entity.counts();
        let settled = counts.completed + counts.dead_lettered_total;
        progress(settled.min(sent), sent);
        if counts.active == 0 && counts.locked == 0 && settled >= sent {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for each stopped worker, adding up their counters and reading what the database holds.
async fn stop_workers(workers: Vec<DemoWorker>, report: &mut DemoReport) -> Result<(), DemoError> {
    let mut stats = StatsSnapshot::default();
    for (runtime, task) in workers {
        // Grace (5 s) plus the receiver's bounded close: a worker that takes longer is stuck.
        match tokio::time::timeout(Duration::from_secs(30), task).await {
            Ok(Ok(result)) => result?,
            Ok(Err(error)) => return Err(DemoError::Send(format!("worker task failed: {error}"))),
            Err(_) => return Err(DemoError::Send("a worker did not stop within 30 s".into())),
        }
        stats += runtime.stats().snapshot();
        report.counts = runtime.store().inventory_counts().await?;
    }
    report.stats = stats;
    Ok(())
}

/// Runs the demo; `progress(done, total)` is called as messages settle.
///
/// # Errors
/// [`DemoError`] when the emulator, the store or a worker fails, or the queue does not drain.
pub async fn run(
    plan: DemoPlan,
    progress: &(dyn Fn(u64, u64) + Sync),
) -> Result<DemoReport, DemoError> {
    let dir = std::env::temp_dir().join(format!("sb-inbox-demo-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).map_err(|e| DemoError::Send(e.to_string()))?;
    let database = dir.join("inbox.db");
    let (emulator, cs) = start_emulator().await?;
    let first_store = SqliteStore::open(&database)?;
    first_store.migrate().await?;
    first_store.migrate_inventory().await?;

    let mut report = DemoReport {
        database: database.clone(),
        ..DemoReport::default()
    };
    let sender = ServiceBusClient::from_connection_string(&cs).sender(QUEUE);
    for message in stream(&plan, &mut report)? {
        sender
            .send(message)
            .await
            .map_err(|e| DemoError::Send(e.to_string()))?;
        report.sent += 1;
    }
    let entity = emulator.broker().entity(QUEUE)?;
    entity.refuse_dispositions(plan.refused_settlements)?;

    // Two workers: separate connections, separate SQLite connections on one file.
    let shutdown = CancellationToken::new();
    let stores = [first_store, SqliteStore::open(&database)?];
    let workers = start_workers(stores, &cs, &shutdown)?;
    let limit = Duration::from_secs(120);
    let drained = tokio::time::timeout(limit, drain(&entity, report.sent, progress)).await;
    shutdown.cancel();
    stop_workers(workers, &mut report).await?;
    let dead = emulator
        .broker()
        .entity(&format!("{QUEUE}/$DeadLetterQueue"))?;
    while let Some(message) = dead.try_receive(sb_emulator::ReceiveMode::ReceiveAndDelete)? {
        let reason = message.dead_letter_reason().unwrap_or("unknown").to_owned();
        *report.dead_letter_reasons.entry(reason).or_default() += 1;
    }
    emulator.shutdown().await;
    drained.map_err(|_| DemoError::Timeout(limit))?;
    Ok(report)
}

/// The report as the table the CLI prints.
pub fn table(report: &DemoReport) -> String {
    let s = &report.stats;
    let reasons: Vec<String> = report
        .dead_letter_reasons
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    // A row that says whether the database holds what was ordered.
    let checked = |name, got: i64, expected: &str, want: i64| {
        let verdict = if got == want { "OK" } else { "WRONG" };
        (
            name,
            got.to_string(),
            format!("{expected} {want}: {verdict}"),
        )
    };
    let rows = [
        ("messages sent", report.sent.to_string(), String::new()),
        (
            "deliveries",
            s.handled().to_string(),
            "received by the two workers, redeliveries included".into(),
        ),
        (
            "processed",
            s.processed.to_string(),
            "committed: one business effect each".into(),
        ),
        (
            "duplicates",
            s.duplicate.to_string(),
            "recognised by the inbox or business-key constraint".into(),
        ),
        ("stale", s.stale.to_string(), String::new()),
        ("dead-lettered", s.permanent.to_string(), reasons.join(", ")),
        (
            "transient (retried)",
            s.transient.to_string(),
            String::new(),
        ),
        (
            "settlements refused",
            s.settle_failed.to_string(),
            "after commit: redelivered, then duplicates".into(),
        ),
        checked(
            "reservations in db",
            report.counts.reservations,
            "distinct orders",
            report.distinct_orders,
        ),
        checked(
            "reserved units",
            report.counts.reserved_units,
            "ordered units",
            report.ordered_units,
        ),
    ];
    let mut out = String::new();
    for (name, value, note) in rows {
        out.push_str(&format!("  {name:<22} {value:>6}  {note}\n"));
    }
    out
}
