//! Issue 28 with real processes: `sb-inbox run` (concurrency 8) on PostgreSQL as a non-owner
//! role, 3000 orders queued on an emulator whose `orders` has the service's default max delivery
//! count (10). Mid-backlog the business table's INSERT grant is revoked (a migration gone wrong,
//! a failover to a replica missing a grant), or the PostgreSQL server of the test's own cluster
//! is stopped; then the grant (or the server) comes back. The kill switch pauses the worker
//! instead of spending every queued message's delivery count, so nothing is dead-lettered and
//! every order is reserved once; the log and `/readyz` show the pause and the resume.

use std::time::{Duration, Instant};

use sb_inbox::PgStore;
use sb_inbox_cli::inventory::InventoryStore;

use crate::support::emulator::{client, properties, queue, start};
use crate::support::orders::order_with_lines;
use crate::support::pg_cluster::PgCluster;
use crate::support::{pg_store, pg_url, schema_for, with_search_path};
use crate::verification::WorkerProcess;
use crate::worker::http_get;

const ORDERS: usize = 3000;
/// Reserved before the outage starts (the run had ~1700 of 3000).
const BEFORE_OUTAGE: i64 = 1000;
/// The service's default `MaxDeliveryCount`.
const MAX_DELIVERY_COUNT: u32 = 10;

/// How the worker consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Plain,
    Batched,
    Sessions,
}

/// The emulator with `orders` (lock 30 s, max delivery count 10; requiring sessions in session
/// mode) holding 3000 orders over 50 SKUs (60 sessions in session mode), and `outbox`.
async fn emulator_with_orders(mode: Mode) -> sb_emulator::Emulator {
    let mut orders = properties("PT30S", MAX_DELIVERY_COUNT);
    orders.requires_session = mode == Mode::Sessions;
    let emulator = start(
        vec![
            queue("orders", orders),
            queue("outbox", sb_emulator::EntityProperties::default()),
        ],
        sb_emulator::EmulatorOptions::default(),
    )
    .await;
    let sender = client(&emulator).sender("orders");
    for i in 0..ORDERS {
        let sku = format!("S{}", i % 50);
        let mut message = order_with_lines(&format!("m-{i}"), &format!("o-{i}"), &[(&sku, 1)]);
        if mode == Mode::Sessions {
            message.session_id = Some(format!("s-{}", i % 60));
        }
        sender
            .send(message)
            .await
            .expect("the emulator takes the order");
    }
    emulator
}

/// The worker's settings for `mode`, with health on an ephemeral port.
fn worker_env(mode: Mode) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![("SB_INBOX_HEALTH_PORT", "0")];
    match mode {
        Mode::Plain => {}
        Mode::Batched => env.push(("SB_INBOX_BATCH_SIZE", "16")),
        Mode::Sessions => env.push(("SB_INBOX_SESSIONS", "true")),
    }
    env
}

/// Waits up to `limit` until `condition` holds, polling every 100 ms.
async fn within<F, Fut>(limit: Duration, what: &str, worker: &WorkerProcess, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let waited = tokio::time::timeout(limit, async {
        while !condition().await {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "timed out waiting until {what}; log:\n{}",
        worker.log()
    );
}

async fn reserved(store: &PgStore) -> i64 {
    store.inventory_counts().await.map_or(0, |c| c.reservations)
}

/// `/readyz`'s answer, bounded.
async fn readyz(health: std::net::SocketAddr) -> String {
    tokio::time::timeout(Duration::from_secs(10), http_get(health, "/readyz"))
        .await
        .unwrap_or_default()
}

/// Waits (up to 60 s) for the worker to report itself paused on `/readyz`; returns the answer.
async fn paused_readyz(worker: &WorkerProcess, health: std::net::SocketAddr) -> String {
    let started = Instant::now();
    loop {
        let answer = readyz(health).await;
        if answer.contains("\"circuit:") && answer.contains("paused for") {
            return answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "/readyz never said paused (last: {answer}); log:\n{}",
            worker.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the test checks once the backlog is drained (`store_url`: a fresh connection, since a
/// stopped server broke the pooled ones).
async fn drained_without_dead_letters(
    emulator: &sb_emulator::Emulator,
    store_url: &str,
    worker: WorkerProcess,
) -> Figures {
    let figures = drained(emulator, store_url, &worker).await;
    let orders = emulator.broker().entity("orders").unwrap();
    let log = worker.log();
    let stats = worker.terminate().await;
    let counts = orders.counts();
    assert_eq!(counts.dead_lettered_total, 0, "{counts:?}\n{log}");
    let store = PgStore::connect(store_url, 1).await.unwrap();
    let stock = store.inventory_counts().await.unwrap();
    assert_eq!(
        (stock.reservations, stock.inbox_rows),
        (ORDERS as i64, ORDERS as i64),
        "every order reserved once"
    );
    assert_eq!(stock.reserved_units, stock.line_units, "no effect repeated");
    assert!(
        log.contains("pausing deliveries (kill switch tripped)."),
        "the trip is logged:\n{log}"
    );
    assert!(
        log.contains("Store answers again: resuming deliveries."),
        "the resume is logged:\n{log}"
    );
    assert_eq!(stats.get("permanent"), 0);
    figures
}

/// A role of the test's own with the privileges a worker needs on `schema`, and its URL.
async fn worker_role(admin: &tokio_postgres::Client, schema: &str) -> (String, String) {
    let role = format!("r_{schema}");
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{role}') THEN \
               EXECUTE 'DROP OWNED BY {role}'; EXECUTE 'DROP ROLE {role}'; END IF; END $$;
             CREATE ROLE {role} LOGIN;
             GRANT USAGE ON SCHEMA {schema} TO {role};
             GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
             GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};"
        ))
        .await
        .expect("create the worker's role");
    let admin_url = pg_url();
    let url = admin_url.replacen("postgres://postgres@", &format!("postgres://{role}@"), 1);
    assert_ne!(url, admin_url, "DATABASE_URL names the postgres user");
    (role, with_search_path(&url, schema))
}

async fn admin_session(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("PostgreSQL reachable");
    tokio::spawn(connection);
    client
}

/// The figures of a revoked-grant run, for the before/after in docs/evidence.md.
#[derive(Debug)]
struct Figures {
    dead_lettered: u64,
    reserved: i64,
}

/// Must show 1: the INSERT grant on `inventory_reservation` revoked for `outage` mid-backlog.
async fn revoked_grant(test: &str, mode: Mode, outage: Duration) {
    let figures = revoked_grant_with(test, mode, outage, &[]).await;
    assert_eq!(figures.dead_lettered, 0, "{figures:?}");
}

/// As [`revoked_grant`] with extra worker settings `env` (the switch off when given); after
/// the outage, waits for the backlog to drain and returns what became of it.
async fn revoked_grant_with(
    test: &str,
    mode: Mode,
    outage: Duration,
    env: &[(&'static str, &'static str)],
) -> Figures {
    let store = pg_store(test, 2).await;
    let schema = schema_for(test);
    let admin_url = with_search_path(&pg_url(), &schema);
    let admin = admin_session(&admin_url).await;
    let (role, url) = worker_role(&admin, &schema).await;
    let emulator = emulator_with_orders(mode).await;
    let mut settings = worker_env(mode);
    settings.extend_from_slice(env);
    let switch_off = !env.is_empty();
    let worker = WorkerProcess::spawn_with(&emulator, &url, 8, &settings);
    let health = worker.health_address().await;
    within(
        Duration::from_secs(300),
        "1000 orders are reserved",
        &worker,
        || async { reserved(&store).await >= BEFORE_OUTAGE },
    )
    .await;
    admin
        .batch_execute(&format!(
            "REVOKE INSERT ON inventory_reservation FROM {role}"
        ))
        .await
        .unwrap();
    let revoked = Instant::now();
    if !switch_off {
        let during = paused_readyz(&worker, health).await;
        assert!(during.starts_with("HTTP/1.1 503"), "{during}");
    }
    tokio::time::sleep(outage.saturating_sub(revoked.elapsed())).await;
    admin
        .batch_execute(&format!("GRANT INSERT ON inventory_reservation TO {role}"))
        .await
        .unwrap();
    let figures = if switch_off {
        drained(&emulator, &admin_url, &worker).await
    } else {
        drained_without_dead_letters(&emulator, &admin_url, worker).await
    };
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .unwrap();
    figures
}

/// Waits for the backlog to drain and returns the figures.
async fn drained(
    emulator: &sb_emulator::Emulator,
    store_url: &str,
    worker: &WorkerProcess,
) -> Figures {
    let orders = emulator.broker().entity("orders").unwrap();
    within(
        Duration::from_secs(600),
        "the backlog drains",
        worker,
        || async {
            let c = orders.counts();
            c.active == 0 && c.locked == 0 && c.completed + c.dead_lettered_total >= ORDERS as u64
        },
    )
    .await;
    let store = PgStore::connect(store_url, 1).await.unwrap();
    Figures {
        dead_lettered: orders.counts().dead_lettered_total,
        reserved: reserved(&store).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_for_20_s_dead_letters_nothing() {
    revoked_grant("bad_day_revoke_20", Mode::Plain, Duration::from_secs(20)).await;
}

/// The before, as main's code behaved: with the kill switch off and no hold before an abandon,
/// the same 20 s dead-letters the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_switch_off_a_grant_revoked_for_20_s_dead_letters_the_backlog() {
    let off = [
        ("SB_INBOX_CIRCUIT_ENABLED", "false"),
        ("SB_INBOX_TRANSIENT_HOLD_MAX_MS", "0"),
    ];
    let test = "bad_day_revoke_20_off";
    let figures = revoked_grant_with(test, Mode::Plain, Duration::from_secs(20), &off).await;
    eprintln!("switch off, grant revoked 20 s: {figures:?} of {ORDERS}");
    assert!(figures.dead_lettered > 100, "{figures:?}");
    assert_eq!(
        figures.reserved + i64::try_from(figures.dead_lettered).unwrap(),
        ORDERS as i64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_for_120_s_dead_letters_nothing() {
    revoked_grant("bad_day_revoke_120", Mode::Plain, Duration::from_secs(120)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_for_20_s_dead_letters_nothing_batched() {
    revoked_grant(
        "bad_day_revoke_20_batched",
        Mode::Batched,
        Duration::from_secs(20),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_revoked_for_20_s_dead_letters_nothing_in_session_mode() {
    revoked_grant(
        "bad_day_revoke_20_sessions",
        Mode::Sessions,
        Duration::from_secs(20),
    )
    .await;
}

/// Must show 1: the PostgreSQL server (the test's own cluster) stopped for 120 s mid-backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_stopped_for_120_s_dead_letters_nothing() {
    let Some(cluster) = PgCluster::start("bad_day_stopped") else {
        return;
    };
    let url = cluster.url();
    let store = PgStore::connect(&url, 2)
        .await
        .expect("the private cluster");
    store.migrate().await.unwrap();
    store.migrate_inventory().await.unwrap();
    let emulator = emulator_with_orders(Mode::Plain).await;
    let worker = WorkerProcess::spawn_with(&emulator, &url, 8, &worker_env(Mode::Plain));
    let health = worker.health_address().await;
    within(
        Duration::from_secs(300),
        "1000 orders are reserved",
        &worker,
        || async { reserved(&store).await >= BEFORE_OUTAGE },
    )
    .await;
    cluster.stop_server();
    let stopped = Instant::now();
    let during = paused_readyz(&worker, health).await;
    assert!(during.starts_with("HTTP/1.1 503"), "{during}");
    tokio::time::sleep(Duration::from_secs(120).saturating_sub(stopped.elapsed())).await;
    cluster.start_server();
    let figures = drained_without_dead_letters(&emulator, &url, worker).await;
    assert_eq!(figures.dead_lettered, 0);
}

/// Panics on the message with id `poison`.
#[derive(Debug)]
struct PanicsOn<H> {
    inner: H,
    poison: &'static str,
}

crate::support::handlers::wrapper_handler!(PanicsOn, inner, |self, ctx, tx| {
    if ctx.message.message_id.as_deref() == Some(self.poison) {
        panic!("stock for {} went negative", self.poison);
    }
    self.inner.handle(ctx, tx).await
});

/// Must show 2 in session mode, over the emulator: one session slot, a handler that panics on
/// one message of session A. The slot survives each panic; the message is dead-lettered
/// `HandlerPanicked` on its third delivery (`max_panics` 3), and A's next message and session
/// B's are processed by the same slot. Before, the first panic ended the only slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_a_panicking_message_is_dead_lettered_and_the_slot_survives() {
    use sb_inbox::servicebus::ServiceBusSessionSource;
    use sb_inbox::{ConsumerName, Runtime, RuntimeConfig, SessionConfig};
    use sb_inbox_cli::inventory::OrderPlacedConsumer;

    let mut sessions = properties("PT30S", MAX_DELIVERY_COUNT);
    sessions.requires_session = true;
    let emulator = start(
        vec![queue("sq", sessions)],
        sb_emulator::EmulatorOptions::default(),
    )
    .await;
    let client = client(&emulator);
    let sender = client.sender("sq");
    for (id, session) in [("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")] {
        let mut message = order_with_lines(id, &format!("o-{id}"), &[("A", 1)]);
        message.session_id = Some(session.to_owned());
        sender.send(message).await.unwrap();
    }
    let store = crate::support::sqlite_store("bad_day_session_panic", 1).await;
    let config = RuntimeConfig::new(ConsumerName::new(sb_inbox_cli::inventory::CONSUMER).unwrap());
    let runtime = std::sync::Arc::new(Runtime::for_sessions(
        ServiceBusSessionSource::new(client.clone(), "sq").with_accept_wait(Duration::from_secs(1)),
        store.clone(),
        PanicsOn {
            inner: OrderPlacedConsumer::new(),
            poison: "a1",
        },
        config,
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (runtime, stop) = (runtime.clone(), stop.clone());
        async move {
            let one_slot = SessionConfig::default()
                .with_max_sessions(1)
                .with_idle(Duration::from_secs(1));
            runtime.run_sessions(one_slot, stop).await
        }
    });
    let sq = emulator.broker().entity("sq").unwrap();
    let drained = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let c = sq.counts();
            if c.completed == 3 && c.dead_lettered_total == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    stop.cancel();
    let result = running.await;
    assert!(drained.is_ok(), "the slot survived: {:?}", sq.counts());
    result.unwrap().unwrap();
    let stats = runtime.stats().snapshot();
    assert_eq!(
        (stats.processed, stats.panicked, stats.permanent),
        (3, 2, 1),
        "{stats:?}"
    );
    let dead = client.peek("sq/$DeadLetterQueue", 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("a1"));
    assert_eq!(dead[0].dead_letter_reason(), Some("HandlerPanicked"));
    // Three processed rows and `a1`'s dead-letter verdict (issue 41: the decision is the
    // message's inbox row, so a twin delivery cannot also take effect).
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (3, 4));
}

/// The emulator with `orders` (lock 30 s, max delivery count 10) holding `count` orders on
/// `count` SKUs, and `outbox`.
async fn emulator_with_few_orders(count: usize) -> sb_emulator::Emulator {
    let emulator = start(
        vec![
            queue("orders", properties("PT30S", MAX_DELIVERY_COUNT)),
            queue("outbox", sb_emulator::EntityProperties::default()),
        ],
        sb_emulator::EmulatorOptions::default(),
    )
    .await;
    let sender = client(&emulator).sender("orders");
    for i in 0..count {
        let sku = format!("S{i}");
        let message = order_with_lines(&format!("m-{i}"), &format!("o-{i}"), &[(&sku, 1)]);
        sender
            .send(message)
            .await
            .expect("the emulator takes the order");
    }
    emulator
}

/// Waits (up to 300 s) until `count` orders are reserved, or one is dead-lettered; then checks
/// that none was and that each order was reserved once.
async fn all_reserved_once(
    emulator: &sb_emulator::Emulator,
    store_url: &str,
    worker: WorkerProcess,
    count: usize,
) {
    let store = PgStore::connect(store_url, 1).await.unwrap();
    let orders = emulator.broker().entity("orders").unwrap();
    let count = i64::try_from(count).unwrap();
    within(
        Duration::from_secs(300),
        "every order is reserved (or one is dead-lettered)",
        &worker,
        || async { orders.counts().dead_lettered_total > 0 || reserved(&store).await >= count },
    )
    .await;
    let log = worker.log();
    let stats = worker.terminate().await;
    let counts = orders.counts();
    let dead = client(emulator)
        .peek("orders/$DeadLetterQueue", 0, 10)
        .await
        .unwrap();
    let reasons: Vec<_> = dead.iter().map(|d| d.dead_letter_reason()).collect();
    assert_eq!(
        counts.dead_lettered_total, 0,
        "{counts:?} {reasons:?}\n{log}"
    );
    let stock = store.inventory_counts().await.unwrap();
    assert_eq!((stock.reservations, stock.inbox_rows), (count, count));
    assert_eq!(stock.reserved_units, stock.line_units, "no effect repeated");
    assert!(
        log.contains("pausing deliveries (kill switch tripped)."),
        "the trip is logged:\n{log}"
    );
    assert_eq!(stats.get("permanent"), 0);
}

/// Issue 40, M1, with a real process: `sb-inbox run` with delayed retries on
/// (`SB_INBOX_RETRY_MAX_RETRIES=3`) on a quiet queue (5 orders) whose INSERT grant is revoked
/// for 30 s. The run used 120 s with the default probe backoff (1 s doubling to 30 s);
/// here probes come every 100 ms to 1 s and retries after 1 s, so the same number of trials
/// (each a delivery of one of the five, ten times and more over the outage) fits in 30 s. Each
/// trial fails while the switch is open and is released, its retry not spent: 0 dead-lettered,
/// each order reserved once. Before, every trial scheduled a copy (`attempt + 1`) and the
/// orders were dead-lettered `RetriesExhausted` within the outage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_retries_under_a_revoked_grant_dead_letter_nothing() {
    const COUNT: usize = 5;
    let test = "bad_day_retry_revoked";
    let _store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let admin_url = with_search_path(&pg_url(), &schema);
    let admin = admin_session(&admin_url).await;
    let (role, url) = worker_role(&admin, &schema).await;
    admin
        .batch_execute(&format!(
            "REVOKE INSERT ON inventory_reservation FROM {role}"
        ))
        .await
        .unwrap();
    let emulator = emulator_with_few_orders(COUNT).await;
    let settings = [
        ("SB_INBOX_HEALTH_PORT", "0"),
        ("SB_INBOX_RETRY_MAX_RETRIES", "3"),
        ("SB_INBOX_RETRY_BASE_DELAY_SECS", "1"),
        ("SB_INBOX_RETRY_MAX_DELAY_SECS", "2"),
        ("SB_INBOX_CIRCUIT_PROBE_MIN_MS", "100"),
        ("SB_INBOX_CIRCUIT_PROBE_MAX_SECS", "1"),
    ];
    let worker = WorkerProcess::spawn_with(&emulator, &url, 2, &settings);
    let health = worker.health_address().await;
    let revoked = Instant::now();
    let during = paused_readyz(&worker, health).await;
    assert!(during.starts_with("HTTP/1.1 503"), "{during}");
    tokio::time::sleep(Duration::from_secs(30).saturating_sub(revoked.elapsed())).await;
    admin
        .batch_execute(&format!("GRANT INSERT ON inventory_reservation TO {role}"))
        .await
        .unwrap();
    all_reserved_once(&emulator, &admin_url, worker, COUNT).await;
    admin
        .batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await
        .unwrap();
}

/// Issue 40, M2, the migration reproduction with a real process: a transaction holds
/// `ACCESS EXCLUSIVE` on `inventory_reservation` (a migration) for 40 s while the worker's URL
/// sets `lock_timeout` to 1 s, with 100 orders queued at max delivery count 10. The issue's
/// run used 150 s, a 5 s `lock_timeout` and 300 orders; with 1 s and a 500 ms transient hold
/// an attempt takes about 1.5 s instead of about 8 s, so ten attempts, which dead-lettered
/// messages then, fit in this outage the same way. A run of lock timeouts trips the switch:
/// 0 dead-lettered, every order reserved once. Before, each timeout counted as a working store
/// (contention), the switch never tripped and the in-flight orders were dead-lettered
/// `MaxDeliveryCountExceeded`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migrations_table_lock_dead_letters_nothing() {
    const COUNT: usize = 100;
    let test = "bad_day_table_lock";
    let store = pg_store(test, 1).await;
    let schema = schema_for(test);
    let admin_url = with_search_path(&pg_url(), &schema);
    let admin = admin_session(&admin_url).await;
    // The URL's own lock_timeout wins over the worker's default (30 s).
    let url = format!("{admin_url}%20-clock_timeout%3D1s");
    admin
        .batch_execute("BEGIN; LOCK TABLE inventory_reservation IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let locked = Instant::now();
    let emulator = emulator_with_few_orders(COUNT).await;
    let settings = [
        ("SB_INBOX_HEALTH_PORT", "0"),
        ("SB_INBOX_TRANSIENT_HOLD_MAX_MS", "500"),
    ];
    let worker = WorkerProcess::spawn_with(&emulator, &url, 8, &settings);
    let health = worker.health_address().await;
    let during = paused_readyz(&worker, health).await;
    assert!(during.contains("code 55P03"), "{during}");
    tokio::time::sleep(Duration::from_secs(40).saturating_sub(locked.elapsed())).await;
    admin.batch_execute("COMMIT").await.unwrap();
    drop(store);
    all_reserved_once(&emulator, &admin_url, worker, COUNT).await;
}

/// Takes v2 orders; the inbox row the runtime inserts is all it leaves.
#[derive(Debug)]
struct PlaceV2;

impl sb_inbox::JsonHandler<sb_inbox::SqliteTx> for PlaceV2 {
    type Message = sb_inbox_cli::inventory::OrderPlacedV2;

    async fn handle(
        &self,
        _: &sb_inbox::Context<'_, sb_inbox_cli::inventory::OrderPlacedV2>,
        _: &sb_inbox_cli::inventory::OrderPlacedV2,
        _: &mut sb_inbox::SqliteTx,
    ) -> Result<sb_inbox::Handled, sb_inbox::HandlerError> {
        Ok(sb_inbox::Handled::Processed)
    }
}

/// v2 orders behind a v1→v2 upcaster that panics on `o-5` (an index out of bounds, as an
/// `unwrap` in an upcaster would).
fn panicking_upcaster_router() -> sb_inbox::Router<sb_inbox::SqliteTx> {
    use sb_inbox_cli::inventory::{OrderPlaced, OrderPlacedV2};
    sb_inbox::Router::builder()
        .json(PlaceV2)
        .upcast(|v1: OrderPlaced| {
            if v1.order_id == "o-5" {
                let channels: Vec<String> = Vec::new();
                let channel = channels[std::hint::black_box(0)].clone();
                return Ok(OrderPlacedV2 { order: v1, channel });
            }
            Ok(OrderPlacedV2::from(v1))
        })
        .build()
        .unwrap()
}

/// Issue 40, C1, in session mode over the emulator: 200 v1 orders in 4 sessions, one session
/// slot, and a router whose v1→v2 upcaster panics on one order (an index out of bounds, as an
/// `unwrap` in an upcaster would). The panic is caught and counted: the order is abandoned
/// twice and dead-lettered `HandlerPanicked` on its third delivery (`max_panics` 3); the 199
/// others are processed by the same slot, which is alive at the end (it takes one more
/// session). Before, the panic unwound out of the slot's task: the only slot was gone and
/// nothing else was processed. (In-process rather than `sb-inbox run`: the reference upcaster
/// has no input it would panic on, and no production switch should add one.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_session_mode_a_panicking_upcaster_is_dead_lettered_and_the_slot_survives() {
    use sb_inbox::servicebus::ServiceBusSessionSource;
    use sb_inbox::{ConsumerName, Runtime, RuntimeConfig, SessionConfig};

    let mut sessions = properties("PT30S", MAX_DELIVERY_COUNT);
    sessions.requires_session = true;
    let emulator = start(
        vec![queue("sq", sessions)],
        sb_emulator::EmulatorOptions::default(),
    )
    .await;
    let client = client(&emulator);
    let sender = client.sender("sq");
    let send = async |i: usize, session: &str| {
        let mut message = order_with_lines(&format!("m-{i}"), &format!("o-{i}"), &[("A", 1)]);
        message.session_id = Some(session.to_owned());
        sender.send(message).await.unwrap();
    };
    for i in 0..200 {
        send(i, &format!("s-{}", i % 4)).await;
    }
    let router = panicking_upcaster_router();
    let store = crate::support::sqlite_store("bad_day_session_upcast_panic", 1).await;
    let config = RuntimeConfig::new(ConsumerName::new("sessions.upcast").unwrap());
    let runtime = std::sync::Arc::new(Runtime::for_sessions(
        ServiceBusSessionSource::new(client.clone(), "sq").with_accept_wait(Duration::from_secs(1)),
        store.clone(),
        router,
        config,
    ));
    let stop = tokio_util::sync::CancellationToken::new();
    let running = tokio::spawn({
        let (runtime, stop) = (runtime.clone(), stop.clone());
        async move {
            let one_slot = SessionConfig::default()
                .with_max_sessions(1)
                .with_idle(Duration::from_millis(300));
            runtime.run_sessions(one_slot, stop).await
        }
    });
    let sq = emulator.broker().entity("sq").unwrap();
    let until = async |completed: u64| {
        tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                let c = sq.counts();
                if c.completed == completed && c.dead_lettered_total == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .is_ok()
    };
    let drained = until(199).await;
    // The slot is alive: it takes a session that appears only now.
    send(200, "s-late").await;
    let alive = until(200).await;
    stop.cancel();
    let result = running.await;
    assert!(drained && alive, "the slot survived: {:?}", sq.counts());
    result.unwrap().unwrap();
    let stats = runtime.stats().snapshot();
    assert_eq!(
        (stats.processed, stats.panicked, stats.permanent),
        (200, 2, 1),
        "{stats:?}"
    );
    let dead = client.peek("sq/$DeadLetterQueue", 0, 10).await.unwrap();
    assert_eq!(dead.len(), 1, "{dead:#?}");
    assert_eq!(dead[0].message.message_id.as_deref(), Some("m-5"));
    assert_eq!(dead[0].dead_letter_reason(), Some("HandlerPanicked"));
}

/// Issue 40, C1, plain and batched over the emulator with the real client (the session-mode
/// case is above; `tests/runtime/panics.rs` has the in-process ones): 200 v1 orders, a router
/// whose v1→v2 upcaster panics on one. The panic is caught and counted: the order is abandoned
/// twice and dead-lettered `HandlerPanicked` on its third delivery (`max_panics` 3), the 199
/// others are processed, no delivery is released uncounted and no slot is stuck. Before, the
/// delivery was released uncounted and came straight back for ever (a batch went down whole).
/// (In-process rather than `sb-inbox run`, for the reason given above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_upcaster_is_dead_lettered_after_max_panics_plain_and_batched() {
    use sb_inbox::{ConsumerName, Runtime, RuntimeConfig};

    for batch in [1, 16] {
        let entity_name = format!("q{batch}");
        let emulator = start(
            vec![queue(&entity_name, properties("PT30S", MAX_DELIVERY_COUNT))],
            sb_emulator::EmulatorOptions::default(),
        )
        .await;
        let client = client(&emulator);
        let sender = client.sender(&entity_name);
        for i in 0..200 {
            let message = order_with_lines(&format!("m-{i}"), &format!("o-{i}"), &[("A", 1)]);
            sender.send(message).await.unwrap();
        }
        let router = panicking_upcaster_router();
        let store = crate::support::sqlite_store(&format!("bad_day_upcast_panic_{batch}"), 4).await;
        let mut config = RuntimeConfig::new(ConsumerName::new("upcast.panics").unwrap());
        config.concurrency = 4;
        config.prefetch = 4;
        config.batch_size = batch;
        config.transient_hold_max = Duration::ZERO;
        let runtime = std::sync::Arc::new(Runtime::new(
            client.receiver(&entity_name, 4),
            store,
            router,
            config,
        ));
        let stop = tokio_util::sync::CancellationToken::new();
        let running = tokio::spawn({
            let (runtime, stop) = (runtime.clone(), stop.clone());
            async move { runtime.run(stop).await }
        });
        let entity = emulator.broker().entity(&entity_name).unwrap();
        let drained = tokio::time::timeout(Duration::from_secs(120), async {
            loop {
                let c = entity.counts();
                if c.completed == 199 && c.dead_lettered_total == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .is_ok();
        stop.cancel();
        let result = running.await;
        assert!(drained, "batch {batch}: drained: {:?}", entity.counts());
        result.unwrap().unwrap();
        let stats = runtime.stats().snapshot();
        assert_eq!(
            (stats.processed, stats.panicked),
            (199, 2),
            "batch {batch}: {stats:?}"
        );
        assert_eq!(runtime.slots().stuck(), 0, "batch {batch}");
        let dead = client
            .peek(&format!("{entity_name}/$DeadLetterQueue"), 0, 10)
            .await
            .unwrap();
        assert_eq!(dead.len(), 1, "batch {batch}: {dead:#?}");
        assert_eq!(dead[0].message.message_id.as_deref(), Some("m-5"));
        assert_eq!(
            dead[0].dead_letter_reason(),
            Some("HandlerPanicked"),
            "batch {batch}"
        );
        // The AMQP header's delivery-count is the number of unsuccessful earlier deliveries
        // (AMQP 1.0 §3.2.1): the two counted abandons. A release is not counted, so a looping
        // delivery would have left it at 0.
        assert_eq!(dead[0].delivery_count, 2, "batch {batch}");
    }
}
