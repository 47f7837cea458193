//! The article's verification with real processes: `sb-inbox run` against the in-process
//! emulator and PostgreSQL, plus lock renewal, lost connections and the dead-letter queue read
//! back by the official Python SDK.
//!
//! Each test has its own emulator and schema. Windows (commit before settlement, a rolled-back
//! transaction, two transactions at once) are opened deterministically with the emulator's fault
//! hooks and row locks held by the test, and waited for with bounded loops on observable state.

use std::io::BufRead as _;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sb_inbox::{ConsumerName, Message, Outcome, PgStore, Receiver, Runtime, RuntimeConfig};
use sb_inbox_cli::inventory::{InventoryCounts, InventoryStore, OrderPlacedConsumer};

use crate::support::cli;
use crate::support::emulator::{client, emulator, queue, send, session_properties, start};
use crate::support::orders::order;
use crate::support::{inventory_totals, pg_store, pg_url, schema_for, with_search_path};
use crate::worker::{drained, strip_ansi};

/// The worker's batch size variable, and the size the batched variants run with.
const BATCH_SIZE: &str = "SB_INBOX_BATCH_SIZE";
const BATCH: &str = "16";

/// Waits (bounded) until `condition` holds, polling every 20 ms.
pub(crate) async fn until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    tokio::time::timeout(Duration::from_secs(60), async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

/// `sb-inbox run` as a child process, its stderr collected line by line. Killed on drop.
pub(crate) struct WorkerProcess {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl WorkerProcess {
    /// Starts the reference inventory consumer on `orders` with `concurrency`, lock margin 1 s,
    /// and the environment variables `env`.
    pub(crate) fn spawn_with(
        emulator: &sb_emulator::Emulator,
        store_url: &str,
        concurrency: usize,
        env: &[(&str, &str)],
    ) -> Self {
        Self::spawn_on(&emulator.connection_string(), store_url, concurrency, env)
    }

    /// As [`WorkerProcess::spawn_with`], on any namespace (e.g. an `sb-emulator` process).
    pub(crate) fn spawn_on(
        connection: &str,
        store_url: &str,
        concurrency: usize,
        env: &[(&str, &str)],
    ) -> Self {
        let mut child = cli::worker(store_url, connection)
            .env("SB_INBOX_CONCURRENCY", concurrency.to_string())
            .env("SB_INBOX_LOCK_MARGIN_SECS", "1")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        std::thread::spawn({
            let log = log.clone();
            move || {
                for line in std::io::BufReader::new(stderr).lines() {
                    let Ok(line) = line else { return };
                    log.lock().unwrap().push(strip_ansi(&line));
                }
            }
        });
        WorkerProcess { child, log }
    }

    /// True while the process has not exited.
    pub(crate) fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    /// The health endpoints' address, once the worker has logged it (`SB_INBOX_HEALTH_PORT=0`).
    pub(crate) async fn health_address(&self) -> std::net::SocketAddr {
        let found = || {
            self.log
                .lock()
                .unwrap()
                .iter()
                .find_map(|line| crate::worker::logged_health_address(line))
        };
        until("the worker logs its health address", || {
            let seen = found().is_some();
            async move { seen }
        })
        .await;
        found().unwrap()
    }

    /// SIGKILL: no drain, no settlement, no goodbye.
    pub(crate) async fn kill(mut self) {
        self.child.kill().unwrap();
        // Drop then finds the child reaped (its second kill fails and is ignored).
        tokio::task::spawn_blocking(move || {
            let mut this = self;
            this.child.wait()
        })
        .await
        .unwrap()
        .unwrap();
    }

    /// SIGTERM, then waits for a clean exit and returns the worker's final counters.
    pub(crate) async fn terminate(self) -> WorkerStats {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
        let log = self.log.clone();
        let mut this = self;
        let exit = tokio::task::spawn_blocking(move || {
            let exit = this.child.wait();
            (this, exit)
        })
        .await
        .unwrap();
        let (this, exit) = exit;
        let exit = exit.unwrap();
        assert!(exit.success(), "{exit:?}\n{}", this.log());
        // The reader thread sees end of file once the child is gone; wait for the last line.
        until("the worker's last log line is read", || {
            let log = log.clone();
            async move {
                log.lock()
                    .unwrap()
                    .iter()
                    .any(|l| l.contains("Worker stopped."))
            }
        })
        .await;
        WorkerStats::parse(&this.log())
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        // Best effort: the child may already have exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The counters a worker logs when it stops (`Worker stopped.` with `stats=StatsSnapshot {…}`).
#[derive(Debug)]
pub(crate) struct WorkerStats {
    line: String,
}

impl WorkerStats {
    fn parse(log: &str) -> Self {
        let line = log
            .lines()
            .find(|l| l.contains("Worker stopped."))
            .unwrap_or_else(|| panic!("no final stats in:\n{log}"))
            .to_owned();
        WorkerStats { line }
    }

    pub(crate) fn get(&self, name: &str) -> u64 {
        let key = format!(" {name}: ");
        let at = self
            .line
            .find(&key)
            .unwrap_or_else(|| panic!("{name} missing from {}", self.line));
        self.line[at + key.len()..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap()
    }
}

fn orders_counts(emulator: &sb_emulator::Emulator) -> sb_emulator::EntityCounts {
    emulator.broker().entity("orders").unwrap().counts()
}

async fn counts(store: &PgStore) -> InventoryCounts {
    store.inventory_counts().await.unwrap()
}

/// How the worker processes of a verification test consume: plain peek-lock, batched, or session mode
/// on a queue that requires sessions (issue 17: the article's scenarios hold there too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Plain,
    /// Plain, with batched transactions of [`BATCH`] deliveries.
    Batched,
    Sessions,
}

impl Mode {
    /// `orders` (lock `lock`, requiring sessions in session mode) and `outbox`.
    async fn emulator(self, lock: &str) -> sb_emulator::Emulator {
        if self != Mode::Sessions {
            return emulator(lock).await;
        }
        start(
            vec![
                queue("orders", session_properties(lock)),
                queue("outbox", sb_emulator::EntityProperties::default()),
            ],
            sb_emulator::EmulatorOptions::default(),
        )
        .await
    }

    /// Order `id` / `order_id`, in session `session` in session mode.
    fn order(self, id: &str, order_id: &str, session: &str) -> Message {
        let mut message = order(id, order_id);
        if self == Mode::Sessions {
            message.session_id = Some(session.to_owned());
        }
        message
    }

    /// `sb-inbox run` with one handler slot (one session at a time in session mode).
    fn worker(self, emulator: &sb_emulator::Emulator, url: &str) -> WorkerProcess {
        let env: &[(&str, &str)] = match self {
            Mode::Plain => &[],
            Mode::Batched => &[(BATCH_SIZE, BATCH)],
            Mode::Sessions => &[
                ("SB_INBOX_SESSIONS", "true"),
                ("SB_INBOX_MAX_SESSIONS", "1"),
            ],
        };
        WorkerProcess::spawn_with(emulator, url, 1, env)
    }

    fn test(self, name: &str) -> String {
        match self {
            Mode::Plain => name.to_owned(),
            Mode::Batched => format!("{name}_{BATCH}"),
            Mode::Sessions => format!("{name}_sessions"),
        }
    }
}

/// A raw session of the test's own, in the test's schema, to hold row locks.
pub(crate) async fn session(schema: &str) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(&with_search_path(&pg_url(), schema), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    client
}

/// Inserts the stock row of SKU `A` and locks it in an open transaction of `session`.
async fn lock_stock_row(session: &tokio_postgres::Client) {
    session
        .batch_execute("INSERT INTO inventory_stock (sku, reserved) VALUES ('A', 0)")
        .await
        .unwrap();
    session
        .batch_execute("BEGIN; SELECT 1 FROM inventory_stock WHERE sku = 'A' FOR UPDATE")
        .await
        .unwrap();
}

/// A test's store and emulator with order `m-1` on `orders`, the stock row held by the test's
/// own session (`COMMIT` on `holder` releases it), and a store URL whose sessions give up on a
/// lock after 300 ms (SQLSTATE 55P03: transient).
pub(crate) struct HeldRow {
    pub(crate) store: PgStore,
    pub(crate) emulator: sb_emulator::Emulator,
    pub(crate) holder: tokio_postgres::Client,
    pub(crate) url: String,
}

pub(crate) async fn one_order_behind_a_held_row(test: &str) -> HeldRow {
    one_order_behind_a_held_row_in(test, Mode::Plain).await
}

/// As [`one_order_behind_a_held_row`], in `mode`.
async fn one_order_behind_a_held_row_in(test: &str, mode: Mode) -> HeldRow {
    let store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let emulator = mode.emulator("PT30S").await;
    let holder = session(&schema).await;
    lock_stock_row(&holder).await;
    send(
        &client(&emulator),
        "orders",
        mode.order("m-1", "o-1", "s-1"),
    )
    .await;
    let url = format!(
        "{}%20-clock_timeout%3D300",
        with_search_path(&pg_url(), &schema)
    );
    HeldRow {
        store,
        emulator,
        holder,
        url,
    }
}

/// Verification 1a: one message id delivered to two worker processes at once, both
/// transactions open at the same time. The test holds the stock row, so the first worker waits
/// on it with its inbox row inserted and the second waits on that uncommitted inbox key; at that
/// point both deliveries are locked by different processes. Releasing the row lets the first
/// commit and the second fail on the unique key: one effect, one inbox row, both settled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_to_two_worker_processes_at_once_takes_effect_once() {
    same_message_to_two_workers_at_once(Mode::Plain).await;
}

/// Verification 1a in session mode: the copies are in two sessions (a copy in the same session
/// waits for the first behind the session lock), so two workers each hold one session and both
/// transactions are open at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_the_same_message_to_two_workers_at_once_takes_effect_once() {
    same_message_to_two_workers_at_once(Mode::Sessions).await;
}

async fn same_message_to_two_workers_at_once(mode: Mode) {
    let test = &mode.test("verify_concurrent");
    let store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let emulator = mode.emulator("PT30S").await;
    let holder = session(&schema).await;
    lock_stock_row(&holder).await;

    let app = format!("{schema}_w");
    let url = format!(
        "{}&application_name={app}",
        with_search_path(&pg_url(), &schema)
    );
    let workers = [mode.worker(&emulator, &url), mode.worker(&emulator, &url)];
    let sender = client(&emulator).sender("orders");
    sender.send(mode.order("m-1", "o-1", "s-1")).await.unwrap();
    sender.send(mode.order("m-1", "o-1", "s-2")).await.unwrap();

    // Unbatched, each worker handles one delivery at a time, so both copies are locked by
    // different processes once two of their sessions wait on a lock. Batched, one worker may
    // take both copies into one batch: the second is then a duplicate inside its transaction,
    // and one session waits.
    let batched = mode == Mode::Batched;
    let waiting = if batched { 1 } else { 2 };
    let (store_ref, app_ref) = (&store, &app);
    let emulator_ref = &emulator;
    until("the workers' transactions wait on a lock", move || async move {
        let store = store_ref;
        let rows = store
            .query(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'",
                &[app_ref],
            )
            .await
            .unwrap();
        rows[0].get::<_, i64>(0) >= waiting && orders_counts(emulator_ref).locked == 2
    })
    .await;
    let c = orders_counts(&emulator);
    assert_eq!((c.locked, c.completed), (2, 0));
    assert_eq!(counts(&store).await.inbox_rows, 0);

    holder.batch_execute("COMMIT").await.unwrap();
    drained(&emulator, 2).await;
    let mut per_worker = Vec::new();
    for worker in workers {
        let stats = worker.terminate().await;
        per_worker.push((stats.get("processed"), stats.get("duplicate")));
    }
    per_worker.sort();
    if batched {
        let total = per_worker
            .iter()
            .fold((0, 0), |(p, d), (wp, wd)| (p + wp, d + wd));
        assert_eq!(total, (1, 1), "{per_worker:?}");
    } else {
        assert_eq!(per_worker, [(0, 1), (1, 0)]);
    }
    let c = orders_counts(&emulator);
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered),
        (2, 0, 0, 0)
    );
    assert_eq!(inventory_totals(&store).await, (1, 1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_message_to_two_worker_processes_at_once_takes_effect_once_batched() {
    same_message_to_two_workers_at_once(Mode::Batched).await;
}

/// Verification 1b: a worker process killed with SIGKILL after its commit and before its
/// settlement. The emulator holds the disposition, the test waits for the committed inbox row,
/// kills the worker, and a second worker gets the redelivery once the 2 s lock runs out: a
/// duplicate, completed, with no second effect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_between_commit_and_settlement_redelivers_as_a_duplicate() {
    killed_between_commit_and_settlement(Mode::Plain).await;
}

/// Verification 1b in session mode: the killed worker's connection ends, and its session lock
/// with it; the second worker accepts the session and gets the message again as a duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_a_worker_killed_between_commit_and_settlement_redelivers_as_a_duplicate() {
    killed_between_commit_and_settlement(Mode::Sessions).await;
}

async fn killed_between_commit_and_settlement(mode: Mode) {
    let test = &mode.test("verify_sigkill");
    let store = pg_store(test, 1).await;
    let url = with_search_path(&pg_url(), &schema_for(test));
    let emulator = mode.emulator("PT2S").await;
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .delay_dispositions(1, Duration::from_secs(600))
        .unwrap();
    send(
        &client(&emulator),
        "orders",
        mode.order("m-1", "o-1", "s-1"),
    )
    .await;

    let first = mode.worker(&emulator, &url);
    let store_ref = &store;
    until("the first worker has committed", move || async move {
        counts(store_ref).await.inbox_rows == 1
    })
    .await;
    let c = orders_counts(&emulator);
    assert_eq!((c.locked, c.completed), (1, 0), "committed, not settled");
    first.kill().await;
    // The first worker may die before its disposition reached the emulator (a loaded machine
    // can deschedule it between commit and send): the held-disposition fault must not fall on
    // the second worker's settlement instead.
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .delay_dispositions(0, Duration::ZERO)
        .unwrap();

    let second = mode.worker(&emulator, &url);
    drained(&emulator, 1).await;
    let stats = second.terminate().await;
    assert_eq!((stats.get("processed"), stats.get("duplicate")), (0, 1));
    let c = orders_counts(&emulator);
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered),
        (1, 0, 0, 0)
    );
    assert_eq!(inventory_totals(&store).await, (1, 1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_between_commit_and_settlement_redelivers_as_a_duplicate_batched() {
    killed_between_commit_and_settlement(Mode::Batched).await;
}

/// Verification 1c: the transaction rolls back. The test holds the stock row and the worker's
/// sessions run with `lock_timeout = 300ms`, so each attempt inserts its inbox row, times out on
/// the row (SQLSTATE 55P03, transient), rolls back and abandons. Once the message is back with
/// a delivery count, no inbox row exists; after the row is released the redelivery is processed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_inbox_row_and_the_redelivery_is_processed() {
    rolled_back(Mode::Plain).await;
}

/// Verification 1c in session mode: the abandoned message comes back first in its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_a_rolled_back_transaction_leaves_no_inbox_row_and_is_processed_later() {
    rolled_back(Mode::Sessions).await;
}

async fn rolled_back(mode: Mode) {
    let HeldRow {
        store,
        emulator,
        holder,
        url,
    } = one_order_behind_a_held_row_in(&mode.test("verify_rollback"), mode).await;
    let worker = mode.worker(&emulator, &url);
    let entity = emulator.broker().entity("orders").unwrap();
    let entity_ref = &entity;
    until("an attempt rolled back and abandoned", move || async move {
        entity_ref
            .peek(0, 1)
            .unwrap()
            .first()
            .is_some_and(|m| m.delivery_count >= 1)
    })
    .await;
    let peeked = entity.peek(0, 1).unwrap();
    let last_error = peeked[0]
        .message
        .application_properties
        .get(sb_inbox::runtime::LAST_ERROR_PROPERTY);
    assert!(last_error.is_some(), "{peeked:?}");
    let after_rollback = counts(&store).await;
    assert_eq!(
        (after_rollback.inbox_rows, after_rollback.reservations),
        (0, 0)
    );

    holder.batch_execute("COMMIT").await.unwrap();
    drained(&emulator, 1).await;
    let stats = worker.terminate().await;
    assert_eq!(stats.get("processed"), 1);
    assert!(stats.get("transient") >= 1, "{stats:?}");
    let c = orders_counts(&emulator);
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered),
        (1, 0, 0, 0)
    );
    assert_eq!(inventory_totals(&store).await, (1, 1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolled_back_transaction_leaves_no_inbox_row_and_the_redelivery_is_processed_batched() {
    rolled_back(Mode::Batched).await;
}

/// One order through a runtime whose handler takes 3 s under a 1 s lock (margin 300 ms).
async fn slow_order(test: &str, refuse_renewals: bool) -> (sb_inbox::Report, PgStore, u64) {
    let store = pg_store(test, 2).await;
    let emulator = emulator("PT1S").await;
    if refuse_renewals {
        emulator
            .broker()
            .entity("orders")
            .unwrap()
            .refuse_renewals(u32::MAX)
            .unwrap();
    }
    let client = client(&emulator);
    send(&client, "orders", order("m-1", "o-1")).await;
    let receiver = client.receiver("orders", 0);
    let mut config =
        RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap());
    config.lock_margin = Duration::from_millis(300);
    let runtime = Runtime::new(
        receiver.clone(),
        store.clone(),
        crate::support::handlers::Slow {
            inner: OrderPlacedConsumer::new(),
            duration: Duration::from_secs(3),
        },
        config,
    );
    let delivery = receiver.receive().await.unwrap().unwrap();
    let report = runtime.process(delivery).await;
    let completed = orders_counts(&emulator).completed;
    receiver.close().await;
    (report, store, completed)
}

/// Verification 2: a handler three times as long as the lock keeps it through `$management`
/// renew-lock and completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_three_times_the_lock_duration_keeps_its_lock_and_completes() {
    let (report, store, completed) = slow_order("verify_long_handler", false).await;
    assert_eq!(report.outcome, Outcome::Processed, "{report:?}");
    assert!(matches!(report.settled, Some(Ok(()))), "{report:?}");
    assert!(report.renewals >= 2, "{report:?}");
    assert_eq!(completed, 1);
    let counts = counts(&store).await;
    assert_eq!((counts.reservations, counts.inbox_rows), (1, 1));
}

/// Verification 2, refused: the emulator refuses every renewal, so the lock is lost mid-handler,
/// the transaction never commits and the message is left for redelivery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_renewals_refused_a_long_handler_ends_lock_lost_and_commits_nothing() {
    let (report, store, completed) = slow_order("verify_renewals_refused", true).await;
    assert_eq!(report.outcome, Outcome::LockLost, "{report:?}");
    assert_eq!(completed, 0);
    let counts = counts(&store).await;
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 0));
}

/// Verification 3: every emulator connection dropped while a worker process is halfway through
/// 50 orders whose settlements the emulator slows down (so some are committed and unsettled at
/// the drop). The worker reconnects; every order is reserved exactly once.
async fn dropped_connections_mid_stream(batch: &str) {
    const ORDERS: u64 = 50;
    let test = &format!("{}_{batch}", "verify_dropped_connections");
    let store = pg_store(test, 1).await;
    let url = with_search_path(&pg_url(), &schema_for(test));
    let emulator = emulator("PT2S").await;
    let sender = client(&emulator).sender("orders");
    for i in 0..ORDERS {
        sender
            .send(order(&format!("m-{i}"), &format!("o-{i}")))
            .await
            .unwrap();
    }
    emulator
        .broker()
        .entity("orders")
        .unwrap()
        .delay_dispositions(u32::MAX, Duration::from_millis(150))
        .unwrap();

    let worker = WorkerProcess::spawn_with(&emulator, &url, 4, &[(BATCH_SIZE, batch)]);
    let emulator_ref = &emulator;
    until("a fifth of the orders are completed", move || async move {
        orders_counts(emulator_ref).completed >= ORDERS / 5
    })
    .await;
    emulator.drop_all_connections();
    let at_drop = orders_counts(&emulator);
    assert!(at_drop.completed < ORDERS, "{at_drop:?}");

    drained(&emulator, ORDERS).await;
    let stats = worker.terminate().await;
    assert_eq!(stats.get("processed"), ORDERS, "{stats:?}");
    let c = orders_counts(&emulator);
    assert_eq!(
        (c.completed, c.active, c.locked, c.dead_lettered),
        (ORDERS, 0, 0, 0)
    );
    let counts = counts(&store).await;
    let orders = i64::try_from(ORDERS).unwrap();
    assert_eq!(
        (
            counts.reservations,
            counts.inbox_rows,
            counts.reserved_units,
            counts.line_units
        ),
        (orders, orders, 2 * orders, 2 * orders)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_mid_stream_lose_nothing_and_repeat_nothing() {
    dropped_connections_mid_stream("1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_connections_mid_stream_lose_nothing_and_repeat_nothing_batched() {
    dropped_connections_mid_stream(BATCH).await;
}

/// Verification 4: a poison message is dead-lettered by the worker process with reason
/// `InvalidPayload`, and the official Python SDK reads it back from the DLQ.
async fn poison_message_to_the_dlq(batch: &str) {
    if !crate::python::sdk_installed() {
        return;
    }
    let test = &format!("{}_{batch}", "verify_poison");
    let store = pg_store(test, 1).await;
    let url = with_search_path(&pg_url(), &schema_for(test));
    let emulator = emulator("PT30S").await;
    client(&emulator)
        .sender("orders")
        .send(Message::new(
            "poison-1",
            sb_inbox_cli::inventory::CONTRACT,
            "{nope",
        ))
        .await
        .unwrap();
    let worker = WorkerProcess::spawn_with(&emulator, &url, 1, &[(BATCH_SIZE, batch)]);
    drained(&emulator, 1).await;
    let stats = worker.terminate().await;
    assert_eq!(stats.get("permanent"), 1);

    let script = r#"
import sys
from azure.servicebus import ServiceBusClient
with ServiceBusClient.from_connection_string(sys.argv[1], retry_total=0) as client:
    with client.get_queue_receiver("orders", sub_queue="deadletter", max_wait_time=5) as receiver:
        msgs = receiver.receive_messages(max_message_count=2, max_wait_time=5)
        for m in msgs:
            print(f"dlq message_id={m.message_id} reason={m.dead_letter_reason} description={m.dead_letter_error_description}")
            receiver.complete_message(m)
"#;
    let output = tokio::process::Command::new(sb_testkit::python())
        .args(["-c", script, &emulator.connection_string()])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert!(
        lines[0]
            .starts_with("dlq message_id=poison-1 reason=InvalidPayload description=invalid JSON"),
        "{stdout}"
    );
    let dlq = emulator
        .broker()
        .entity("orders/$DeadLetterQueue")
        .unwrap()
        .counts();
    assert_eq!(dlq.active, 0, "the SDK completed it");
    let counts = counts(&store).await;
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_invalid_payload_and_read_back_by_the_python_sdk() {
    poison_message_to_the_dlq("1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_message_is_dead_lettered_invalid_payload_and_read_back_by_the_python_sdk_batched()
{
    poison_message_to_the_dlq(BATCH).await;
}
