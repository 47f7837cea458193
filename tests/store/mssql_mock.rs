//! The SQL Server store against a mock TDS server (`mssql-mock-tds`): real tiberius clients,
//! real TDS ERROR tokens, classified by the store. Runs everywhere; the real SQL Server runs
//! in GitHub Actions (see `conformance.rs`).
//!
//! The mock answers a SQL batch registered under its exact text and an RPC request
//! (`sp_executesql`, which every parameterised statement uses) whose statement contains a
//! registered upper-case text; `INSERT INTO ` therefore catches every insert. Anything
//! unregistered gets an empty `DONE`. The mock reads one TDS packet per request, so it cannot
//! take the migration scripts (several packets each): `migrate` is verified on the real server
//! only.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mssql_mock_tds::{
    ColumnDefinition, ColumnValue, MockTdsServer, QueryRegistry, QueryResponse, Row, SqlDataType,
    TerminalError,
};
use sb_inbox::store::MssqlConfig;
use sb_inbox::store::mssql::StaticToken;
use sb_inbox::{DuplicateScope, ErrorKind, MssqlStore, Store, StoreError, StoreTx, Tx};
use tokio::net::TcpListener;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// Every insert the store sends.
const INSERT: &str = "INSERT INTO ";

/// A mock server on `127.0.0.1:0`, stopped when dropped.
struct Mock {
    port: u16,
    registry: Arc<Mutex<QueryRegistry>>,
    server: JoinHandle<()>,
    connections: Arc<Mutex<mssql_mock_tds::ConnectionStore>>,
}

impl Drop for Mock {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn spawn(server: MockTdsServer) -> Mock {
    let port = server.local_addr().port();
    let registry = server.query_registry();
    let connections = server.connection_store();
    let server = tokio::spawn(async move {
        // The accept loop ends only with an accept error; the test aborts it.
        let _ = server.run().await;
    });
    Mock {
        port,
        registry,
        server,
        connections,
    }
}

/// The commit batches (after a savepoint the commit also restores `XACT_ABORT`, and after a
/// batch bounded its lock waits the session's `LOCK_TIMEOUT`).
const COMMITS: [&str; 3] = [
    "COMMIT TRANSACTION; SELECT @@TRANCOUNT",
    "COMMIT TRANSACTION; SELECT @@TRANCOUNT; SET XACT_ABORT ON",
    "COMMIT TRANSACTION; SELECT @@TRANCOUNT; SET XACT_ABORT ON; SET LOCK_TIMEOUT 20000",
];

/// `@@TRANCOUNT` as the server reports it.
fn trancount(open: i32) -> QueryResponse {
    QueryResponse::new(
        vec![ColumnDefinition::new("", SqlDataType::Int)],
        vec![Row::new(vec![ColumnValue::Int(open)])],
    )
}

/// A mock whose commits leave no transaction open.
async fn mock() -> Mock {
    let mock = spawn(MockTdsServer::new("127.0.0.1:0").await.unwrap());
    let mut registry = mock.registry.lock().await;
    for commit in COMMITS {
        registry.register(commit, trancount(0));
    }
    drop(registry);
    mock
}

impl Mock {
    /// Every insert fails with this server error.
    async fn fail_inserts(&self, number: u32, severity: u8, message: &str) {
        self.registry.lock().await.register(
            INSERT,
            QueryResponse::error_only(TerminalError::new(number, severity, message)),
        );
    }
}

/// An ADO.NET connection string for `port`, without TLS (the mock runs plain TDS).
fn connection_string(port: u16) -> String {
    format!(
        "Server=tcp:127.0.0.1,{port};Database=test;User Id=sa;Password=not-a-secret;Encrypt=DANGER_PLAINTEXT"
    )
}

async fn store(port: u16) -> MssqlStore {
    MssqlStore::connect(&connection_string(port), 2)
        .await
        .expect("connect to the mock TDS server")
}

fn duplicate_message(constraint: &str) -> String {
    format!(
        "Violation of PRIMARY KEY constraint '{constraint}'. Cannot insert duplicate key in object \
         'dbo.sb_inbox'. The duplicate key value is (c, m-1)."
    )
}

async fn failed_insert(store: &MssqlStore) -> StoreError {
    let mut tx = store.begin().await.unwrap();
    let error = tx.insert_inbox("c", "m-1").await.expect_err("insert fails");
    tx.rollback().await.unwrap();
    error
}

#[tokio::test]
async fn mock_2627_on_inbox_constraint_is_duplicate() {
    crate::support::init_tracing();
    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox"))
        .await;
    let store = store(mock.port).await;
    let error = failed_insert(&store).await;
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(DuplicateScope::Inbox),
        "{error}"
    );
    assert_eq!(error.code(), Some("2627"));
    assert_eq!(error.constraint(), Some("pk_sb_inbox"));
    // A statement error leaves the connection usable: it went back to the pool, not away.
    assert_eq!(store.connections(), 1);
    assert_eq!(
        failed_insert(&store).await.kind(),
        ErrorKind::Duplicate(DuplicateScope::Inbox)
    );
    assert_eq!(mock.connections.lock().await.count(), 1, "one login only");
}

#[tokio::test]
async fn mock_2627_on_business_key_is_its_own_duplicate() {
    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox_business_key"))
        .await;
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let error = tx
        .claim_business_key("c", "order:1", "m-2")
        .await
        .unwrap_err();
    tx.rollback().await.unwrap();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(DuplicateScope::BusinessKey)
    );
    assert_eq!(error.constraint(), Some("pk_sb_inbox_business_key"));
}

#[tokio::test]
async fn mock_2627_on_another_constraint_is_permanent() {
    let mock = mock().await;
    for other in ["pk_inventory_reservation", "pk_sb_inbox_x", "pk_sb_inbo"] {
        mock.fail_inserts(2627, 14, &duplicate_message(other)).await;
        let store = store(mock.port).await;
        let error = failed_insert(&store).await;
        assert_eq!(error.kind(), ErrorKind::UniqueViolation, "{other}: {error}");
        assert!(error.kind().is_permanent());
        assert_eq!(error.constraint(), Some(other));
    }
    // 2601 names a unique index instead.
    mock.fail_inserts(
        2601,
        14,
        "Cannot insert duplicate key row in object 'dbo.t' with unique index 'ix_other'. \
         The duplicate key value is (1).",
    )
    .await;
    let error = failed_insert(&store(mock.port).await).await;
    assert_eq!(error.kind(), ErrorKind::UniqueViolation);
    assert_eq!(error.constraint(), Some("ix_other"));
}

#[tokio::test]
async fn mock_deadlock_1205_is_transient() {
    let mock = mock().await;
    mock.fail_inserts(
        1205,
        13,
        "Transaction (Process ID 52) was deadlocked on lock resources with another process and \
         has been chosen as the deadlock victim. Rerun the transaction.",
    )
    .await;
    let error = failed_insert(&store(mock.port).await).await;
    assert_eq!(error.kind(), ErrorKind::Contention, "{error}");
    assert!(error.kind().is_transient());
    assert_eq!(error.code(), Some("1205"));
}

#[tokio::test]
async fn mock_unavailable_40613_is_transient() {
    let mock = mock().await;
    mock.fail_inserts(
        40613,
        17,
        "Database 'test' on server 'mock' is not currently available. Please retry the \
         connection later.",
    )
    .await;
    let error = failed_insert(&store(mock.port).await).await;
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(error.kind().is_transient());
    assert_eq!(error.code(), Some("40613"));
}

#[tokio::test]
async fn mock_fatal_severity_evicts_the_connection() {
    let mock = mock().await;
    mock.fail_inserts(
        596,
        21,
        "Cannot continue the execution because the session is in the kill state.",
    )
    .await;
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let error = tx.insert_inbox("c", "m-1").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    drop(tx);
    assert_eq!(store.connections(), 0, "evicted");
}

/// A TCP proxy whose live connections a test can cut.
struct Proxy {
    port: u16,
    accepted: Arc<AtomicUsize>,
    links: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    acceptor: JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        self.cut();
    }
}

impl Proxy {
    async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let links: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (accepted_2, links_2) = (accepted.clone(), links.clone());
        let acceptor = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                accepted_2.fetch_add(1, Ordering::SeqCst);
                let link = tokio::spawn(async move {
                    let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    // Ends when either side closes or the test cuts the link.
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                });
                links_2.lock().unwrap().push(link);
            }
        });
        Proxy {
            port,
            accepted,
            links,
            acceptor,
        }
    }

    /// Drops every proxied connection (both sockets close).
    fn cut(&self) {
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }
}

#[tokio::test]
async fn mock_dropped_connection_is_evicted_and_pool_recovers() {
    crate::support::init_tracing();
    let mock = mock().await;
    let proxy = Proxy::start(mock.port).await;
    let store = store(proxy.port).await;
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 1);

    let mut tx = store.begin().await.unwrap();
    proxy.cut();
    // Let the aborted link close both sockets.
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let error = tx.insert_inbox("c", "m-1").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.kind().is_transient());
    assert!(tx.rollback().await.is_err(), "the connection is gone");
    assert_eq!(store.connections(), 0, "the broken connection was evicted");

    // The pool opens a fresh connection and the next message goes through.
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2);
    assert_eq!(store.connections(), 1);
}

/// With no health query at checkout, a connection that died idle in the pool is found out by
/// `BEGIN`, which has no effect: the store begins on a fresh connection instead, and the
/// transaction never sees the dead one.
#[tokio::test]
async fn mock_connection_dead_in_the_pool_is_replaced_at_begin() {
    let mock = mock().await;
    let proxy = Proxy::start(mock.port).await;
    let store = store(proxy.port).await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 1);

    // The idle pooled connection loses its socket.
    proxy.cut();
    let mut tx = store.begin().await.expect("begun on a fresh connection");
    tx.insert_inbox("c", "m-2").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(proxy.accepted.load(Ordering::SeqCst), 2, "one new login");
    assert_eq!(store.connections(), 1, "the dead one was dropped");
}

/// The reference consumer's 2-line order on SQL Server, run by the runtime: `BEGIN`, the inbox
/// insert, the business key, the reservation with its lines and stock upserts in one batch,
/// the commit (it was 10 with the health query and a request per business statement).
#[tokio::test]
async fn mock_two_line_order_takes_five_round_trips() {
    use sb_inbox::testing::MemoryBroker;
    use sb_inbox::{Clock, ConsumerName, Message, Outcome, Runtime, RuntimeConfig};
    use sb_inbox_cli::inventory::{CONSUMER, OrderPlacedConsumer};

    let mock = mock().await;
    let proxy = crate::round_trips::TurnProxy::start(format!("127.0.0.1:{}", mock.port)).await;
    let store = store(proxy.port).await;
    let broker = MemoryBroker::new(Clock::new());
    let config = RuntimeConfig::new(ConsumerName::new(CONSUMER).unwrap());
    let runtime = Runtime::new(broker.receiver(), store, OrderPlacedConsumer::new(), config);
    broker.send(Message::new(
        "m-1",
        "orders.order-placed.v1",
        r#"{"orderId":"o-1","lines":[{"sku":"B","quantity":1},{"sku":"A","quantity":2}]}"#,
    ));
    proxy.take();
    let report = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(report.outcome, Outcome::Processed, "{report:?}");
    assert_eq!(proxy.take(), 5);
}

#[tokio::test]
async fn mock_gateway_redirect_is_followed() {
    let node = mock().await;
    let gateway = spawn(
        MockTdsServer::new_with_redirection("127.0.0.1:0", "127.0.0.1", node.port)
            .await
            .unwrap(),
    );
    let store = store(gateway.port).await;
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert!(
        node.connections.lock().await.count() >= 1,
        "logged in on the node the gateway named"
    );
}

#[tokio::test]
async fn mock_entra_token_is_sent_per_new_connection() {
    let mock = mock().await;
    let mut config: MssqlConfig = format!(
        "Server=tcp:127.0.0.1,{};Database=test;Encrypt=DANGER_PLAINTEXT",
        mock.port
    )
    .parse()
    .unwrap();
    config.set_token_source(Arc::new(StaticToken("eyJ0eXAi.test-token".into())));
    let store = MssqlStore::connect_with(config, 1).await.unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    let connections = mock.connections.lock().await;
    let info = connections.all().values().last().expect("a connection");
    assert_eq!(
        info.received_token_as_string().as_deref(),
        Some("eyJ0eXAi.test-token")
    );
}

/// Issue 15: no health query per checkout. Checking a connection out sends nothing (a
/// connection counts as valid until a request on it fails), so a transaction of one insert is
/// 3 round trips (it was 4 with `SELECT @@TRANCOUNT` first), counted on the wire. The check
/// that no transaction stays open moved into the commit's batch: a commit that leaves one open
/// (a handler's nested `BEGIN TRANSACTION`) fails, and the pool drops the connection.
#[tokio::test]
async fn mock_checkout_sends_nothing_and_the_commit_checks_trancount() {
    use bb8::ManageConnection as _;
    use sb_inbox::store::mssql::MssqlManager;

    let mock = mock().await;
    let manager = MssqlManager::new(connection_string(mock.port).parse().unwrap());
    let mut conn = manager.connect().await.unwrap();
    manager.is_valid(&mut conn).await.unwrap();
    assert!(!manager.has_broken(&mut conn));

    let proxy = crate::round_trips::TurnProxy::start(format!("127.0.0.1:{}", mock.port)).await;
    let store = store(proxy.port).await;
    proxy.take();
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(proxy.take(), 3, "BEGIN, the insert, the commit");

    // The server now reports a transaction still open after the commit.
    let mut registry = mock.registry.lock().await;
    for commit in COMMITS {
        registry.register(commit, trancount(1));
    }
    drop(registry);
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-2").await.unwrap();
    let error = tx.commit().await.unwrap_err();
    assert!(error.message().contains("still open"), "{error}");
    assert!(error.kind().is_transient());
    assert_eq!(store.connections(), 0, "the pool dropped it");
}

#[test]
fn mssql_types_are_send() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<MssqlStore>();
    send_sync::<MssqlConfig>();
    send::<sb_inbox::MssqlTx>();
    let store = async { MssqlStore::connect("mssql://h", 1).await };
    fn send_future<F: std::future::Future + Send>(_: &F) {}
    send_future(&store);
}

/// The relay's claim reads its `OUTPUT` rows (ids, texts, `nvarchar(max)` properties,
/// `varbinary(max)` body, Unix milliseconds, attempts, and the publishing columns of issue 40:
/// session id, partition key, scheduled time, time-to-live, to, reply-to) and the backlog its two numbers; a
/// deadlock on a retention delete is transient.
#[tokio::test]
async fn mock_outbox_claim_backlog_and_retention() {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use sb_inbox::{OutboxLease, OutboxStore, PropertyValue, RetentionStore};

    let utf16 = |text: &str| vec![text.encode_utf16().collect::<Vec<u16>>()];
    let mock = mock().await;
    // The mock matches statements by an upper-case part that appears verbatim.
    let columns = [
        ("id", SqlDataType::BigInt),
        ("message_id", SqlDataType::NVarChar),
        ("destination", SqlDataType::NVarChar),
        ("subject", SqlDataType::NVarChar),
        ("correlation_id", SqlDataType::NVarChar),
        ("content_type", SqlDataType::NVarChar),
        ("application_properties", SqlDataType::NVarCharMax),
        ("body", SqlDataType::VarBinaryMax),
        ("created", SqlDataType::BigInt),
        ("attempts", SqlDataType::Int),
        ("session_id", SqlDataType::NVarChar),
        ("partition_key", SqlDataType::NVarChar),
        ("scheduled", SqlDataType::BigInt),
        ("time_to_live_ms", SqlDataType::BigInt),
        ("to_address", SqlDataType::NVarChar),
        ("reply_to", SqlDataType::NVarChar),
    ]
    .map(|(name, kind)| ColumnDefinition::new(name, kind))
    .to_vec();
    let row = |id: i64, attempts: i32| {
        Row::new(vec![
            ColumnValue::BigInt(id),
            ColumnValue::NVarChar(format!("m-{id}")),
            ColumnValue::NVarChar("events".into()),
            ColumnValue::NVarChar("inventory.stock-reserved.v1".into()),
            // (The mock encodes a NULL as IntN's, so texts here are never NULL.)
            ColumnValue::NVarChar(format!("c-{id}")),
            ColumnValue::NVarChar("application/json".into()),
            ColumnValue::NVarCharMax(utf16(r#"{"tenant":"t1","n":7}"#)),
            ColumnValue::VarBinaryMax(vec![b"{}".to_vec()]),
            ColumnValue::BigInt(1_700_000_000_123),
            ColumnValue::Int(attempts),
            ColumnValue::NVarChar(format!("s-{id}")),
            ColumnValue::NVarChar(format!("s-{id}")),
            ColumnValue::BigInt(1_700_000_060_000),
            ColumnValue::BigInt(90_000),
            ColumnValue::NVarChar("audit".into()),
            ColumnValue::NVarChar("replies".into()),
        ])
    };
    {
        let mut registry = mock.registry.lock().await;
        // OUTPUT order is no order: the store sorts by id.
        registry.register(
            "UPDLOCK, ROWLOCK, READPAST",
            QueryResponse::new(columns, vec![row(9, 2), row(4, 1)]),
        );
        registry.register(
            "SELECT CAST(COUNT(*)",
            QueryResponse::new(
                vec![
                    ColumnDefinition::new("", SqlDataType::BigInt),
                    ColumnDefinition::new("", SqlDataType::BigInt),
                ],
                vec![Row::new(vec![
                    ColumnValue::BigInt(2),
                    ColumnValue::BigInt(1_700_000_000_123),
                ])],
            ),
        );
        registry.register(
            "DELETE TOP",
            QueryResponse::error_only(TerminalError::new(
                1205,
                13,
                "Transaction (Process ID 52) was deadlocked on lock resources with another \
                 process and has been chosen as the deadlock victim. Rerun the transaction.",
            )),
        );
    }
    let store = store(mock.port).await;
    let now = SystemTime::now();
    let rows = store
        .claim_outbox(now, &OutboxLease::new(now + Duration::from_secs(60)), 10)
        .await
        .unwrap();
    assert!(rows.unreadable.is_empty(), "{:?}", rows.unreadable);
    let rows = rows.rows;
    assert_eq!(
        rows.iter().map(|r| (r.id, r.attempts)).collect::<Vec<_>>(),
        [(4, 1), (9, 2)]
    );
    let created = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
    let first = &rows[0];
    assert_eq!(first.message.message_id, "m-4");
    assert_eq!(first.message.destination, "events");
    assert_eq!(first.message.correlation_id.as_deref(), Some("c-4"));
    assert_eq!(first.message.body, b"{}");
    assert_eq!(first.created_at, created);
    assert_eq!(
        first.message.application_properties.get("n"),
        Some(&PropertyValue::Long(7))
    );
    assert_eq!(first.message.session_id.as_deref(), Some("s-4"));
    assert_eq!(first.message.partition_key.as_deref(), Some("s-4"));
    assert_eq!(
        first.message.scheduled_enqueue_time,
        Some(UNIX_EPOCH + Duration::from_millis(1_700_000_060_000))
    );
    assert_eq!(first.message.time_to_live, Some(Duration::from_secs(90)));
    assert_eq!(first.message.to.as_deref(), Some("audit"));
    assert_eq!(first.message.reply_to.as_deref(), Some("replies"));
    assert!(rows[1].is_retry());

    let backlog = store.outbox_backlog().await.unwrap();
    assert_eq!((backlog.pending, backlog.oldest), (2, Some(created)));

    let error = store
        .delete_inbox_batch(std::time::Duration::ZERO, 10_000)
        .await
        .expect_err("deadlock victim");
    assert_eq!(error.kind(), ErrorKind::Contention);
    assert!(error.kind().is_transient());
}

/// Issue 14, finding 3 on SQL Server: with `XACT_ABORT ON` the failed insert rolled the
/// transaction back on the server, so a later statement would autocommit and the commit would
/// fail with 3902. The transaction refuses both without sending them: the mock answers a sent
/// `UPDATE` and `COMMIT TRANSACTION` with errors that the test would see.
#[tokio::test]
async fn mock_statements_after_a_failure_are_refused_unsent() {
    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox_business_key"))
        .await;
    {
        let mut registry = mock.registry.lock().await;
        registry.register(
            "UPDATE ",
            QueryResponse::error_only(TerminalError::new(50999, 16, "the UPDATE was sent")),
        );
        registry.register(
            "COMMIT TRANSACTION",
            QueryResponse::error_only(TerminalError::new(
                3902,
                16,
                "The COMMIT TRANSACTION request has no corresponding BEGIN TRANSACTION.",
            )),
        );
    }
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let first = tx
        .claim_business_key("c", "order:1", "m-1")
        .await
        .unwrap_err();
    let duplicate = ErrorKind::Duplicate(DuplicateScope::BusinessKey);
    assert_eq!(first.kind(), duplicate);
    let refused = tx
        .execute("UPDATE inventory_stock SET reserved = 0", &[])
        .await
        .unwrap_err();
    assert!(refused.is_refused(), "{refused}");
    assert_eq!((refused.kind(), refused.code()), (duplicate, Some("2627")));
    let refused = tx.commit().await.unwrap_err();
    assert!(refused.is_refused(), "{refused}");
    assert_eq!(refused.kind(), duplicate);
    // Rolled back on the way out: the connection went back to the pool.
    assert_eq!(store.connections(), 1);
}

/// Each statement of a transaction first checks `@@TRANCOUNT` on the server (a transaction the
/// server ended without this client seeing an error must not turn later statements into
/// autocommits). The mock answers the guard the way SQL Server does when the count is 0.
#[tokio::test]
async fn mock_statement_guard_refuses_after_the_transaction_ended() {
    let mock = mock().await;
    mock.registry.lock().await.register(
        "IF @@TRANCOUNT = 0 THROW 59317",
        QueryResponse::error_only(TerminalError::new(
            59317,
            16,
            "sb-inbox: the transaction has ended on the server; statement refused",
        )),
    );
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let error = tx.insert_inbox("c", "m-1").await.unwrap_err();
    assert_eq!(error.code(), Some("59317"), "{error}");
    assert_eq!(error.kind(), ErrorKind::Unknown);
    assert!(error.kind().is_transient());
    assert!(tx.commit().await.unwrap_err().is_refused());
}

/// A savepoint on SQL Server: the failed statement inside it is forgotten once rolled back to,
/// and the transaction commits.
#[tokio::test]
async fn mock_savepoint_tolerates_an_expected_error() {
    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox_business_key"))
        .await;
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let savepoint = tx.savepoint().await.unwrap();
    tx.claim_business_key("c", "order:1", "m-1")
        .await
        .unwrap_err();
    tx.rollback_to(savepoint).await.unwrap();
    tx.execute("UPDATE inventory_stock SET reserved = 0", &[])
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

/// Issue 14, finding 6 (store part): a statement that gets no answer (a half-open connection,
/// a server stuck) ends at the command timeout with a transient error, and the connection is
/// dropped. The mock answers inserts only after 60 s; `Command Timeout=1` ends the wait.
#[tokio::test]
async fn mock_statement_without_answer_times_out() {
    let mock = mock().await;
    mock.registry.lock().await.register(
        INSERT,
        QueryResponse::new(Vec::new(), Vec::new()).with_delay(std::time::Duration::from_secs(60)),
    );
    let store = MssqlStore::connect(
        &format!("{};Command Timeout=1", connection_string(mock.port)),
        2,
    )
    .await
    .unwrap();
    let mut tx = store.begin().await.unwrap();
    let started = std::time::Instant::now();
    let error = tx.insert_inbox("c", "m-1").await.unwrap_err();
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "bounded"
    );
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.kind().is_transient());
    drop(tx);
    assert_eq!(store.connections(), 0, "dropped");
}

/// Batched transactions on SQL Server: each delivery's savepoint is `SAVE TRANSACTION sb_sp_<n>`
/// (the first one after `SET XACT_ABORT OFF`) and is undone by `ROLLBACK TRANSACTION
/// sb_sp_<n>`. The mock fails exactly those texts, so the errors prove what was sent: a
/// rollback to the savepoint that the server refuses (6401, as after a deadlock ended the whole
/// transaction) leaves the transaction failed and its commit refused.
#[tokio::test]
async fn mock_savepoints_are_named_and_rolled_back_by_name() {
    let mock = mock().await;
    let store = store(mock.port).await;
    let mut tx = store.begin().await.unwrap();
    let first = tx.savepoint().await.unwrap();
    assert_eq!(first.name(), "sb_sp_1");
    tx.insert_inbox("c", "m-1").await.unwrap();
    mock.registry.lock().await.register(
        "SAVE TRANSACTION sb_sp_2",
        QueryResponse::error_only(TerminalError::new(50002, 16, "sb_sp_2 reached the server")),
    );
    let error = tx.savepoint().await.unwrap_err();
    assert_eq!(error.code(), Some("50002"), "{error}");
    // That failure ended the transaction for the client; a new one goes on.
    assert!(tx.commit().await.unwrap_err().is_refused());

    {
        let mut registry = mock.registry.lock().await;
        registry.register(
            "SAVE TRANSACTION sb_sp_2",
            QueryResponse::new(Vec::new(), Vec::new()),
        );
        registry.register(
            "ROLLBACK TRANSACTION sb_sp_2",
            QueryResponse::error_only(TerminalError::new(
                6401,
                16,
                "Cannot roll back sb_sp_2. No transaction or savepoint of that name was found.",
            )),
        );
    }
    let mut tx = store.begin().await.unwrap();
    let first = tx.savepoint().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    let second = tx.savepoint().await.unwrap();
    mock.fail_inserts(1205, 13, "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction.")
        .await;
    let deadlock = tx.insert_inbox("c", "m-2").await.unwrap_err();
    assert_eq!(deadlock.kind(), ErrorKind::Contention);
    let refused = tx.rollback_to(second).await.unwrap_err();
    assert!(refused.is_refused(), "{refused}");
    assert_eq!(refused.code(), Some("1205"), "the first error stands");
    assert!(tx.commit().await.unwrap_err().is_refused());
    drop(first);
}

/// Issue 28: the SQL Server numbers that fail every message alike (a revoked grant, a
/// read-only database after a failover, throttling, a database moving) trip the runtime's kill
/// switch after five deliveries in a row; a deadlock victim five times does not.
#[tokio::test]
async fn mock_systemic_numbers_trip_the_kill_switch() {
    use sb_inbox::testing::MemoryBroker;
    use sb_inbox::{CircuitPhase, Clock, Message, Runtime};

    use crate::support::handlers::Noop;
    use crate::support::runtime::{config, ready_deliveries};

    let cases = [
        (
            229,
            "The INSERT permission was denied on the object 'sb_inbox', database 'test', schema 'dbo'.",
            CircuitPhase::Open,
        ),
        (
            230,
            "The SELECT permission was denied on the column 'message_id' of the object 'sb_inbox'.",
            CircuitPhase::Open,
        ),
        (
            3906,
            "Failed to update database \"test\" because the database is read-only.",
            CircuitPhase::Open,
        ),
        (
            40501,
            "The service is currently busy. Retry the request after 10 seconds.",
            CircuitPhase::Open,
        ),
        (
            40613,
            "Database 'test' on server 'mock' is not currently available.",
            CircuitPhase::Open,
        ),
        (
            49918,
            "Cannot process request. Not enough resources to process request.",
            CircuitPhase::Open,
        ),
        (
            1205,
            "Transaction (Process ID 52) was deadlocked on lock resources with another process.",
            CircuitPhase::Closed,
        ),
    ];
    for (number, message, phase) in cases {
        let mock = mock().await;
        mock.fail_inserts(number, 16, message).await;
        let store = store(mock.port).await;
        let broker = MemoryBroker::new(Clock::new());
        let mut config = config("c");
        config.transient_hold_max = std::time::Duration::ZERO;
        let runtime = Runtime::new(broker.receiver(), store, Noop::new(), config);
        for n in 0..5 {
            broker.send(Message::new(
                format!("m-{n}"),
                "orders.order-placed.v1",
                "{}",
            ));
        }
        for delivery in ready_deliveries(&broker) {
            runtime.process(delivery).await;
        }
        assert_eq!(runtime.circuit().phase(), phase, "{number}");
        // The fifth failure trips the switch and is released, uncounted.
        let c = broker.counts();
        let given_back = if phase == CircuitPhase::Open {
            (4, 1)
        } else {
            (5, 0)
        };
        assert_eq!((c.abandoned, c.released), given_back, "{number}");
    }
}

/// A batch on SQL Server (the runtime over the mock): every inbox insert is a duplicate of
/// `pk_sb_inbox`, each rolled back to its own savepoint by name, and all three are completed
/// after the one commit. Then every insert is a deadlock victim whose savepoint the server no
/// longer has (6401): each delivery in turn is taken out of the batch and abandoned, and the
/// batch ends.
#[tokio::test]
async fn mock_batch_rolls_back_each_delivery_by_name() {
    use sb_inbox::testing::MemoryBroker;
    use sb_inbox::{Clock, Message, Outcome, Runtime};

    use crate::support::handlers::Noop;
    use crate::support::runtime::{batched, ready_deliveries};

    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox"))
        .await;
    let store = store(mock.port).await;
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(broker.receiver(), store, Noop::new(), batched("c", 16));
    let batch = |broker: &MemoryBroker| {
        for n in 1..=3 {
            broker.send(Message::new(
                format!("m-{n}"),
                "orders.order-placed.v1",
                "{}",
            ));
        }
        ready_deliveries(broker)
    };
    let reports = runtime.process_batch(batch(&broker)).await;
    let outcomes: Vec<Outcome> = reports.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Duplicate(DuplicateScope::Inbox); 3]);
    assert_eq!(broker.counts().completed, 3);

    {
        let mut registry = mock.registry.lock().await;
        registry.register(
            INSERT,
            QueryResponse::error_only(TerminalError::new(
                1205,
                13,
                "chosen as the deadlock victim",
            )),
        );
        registry.register(
            "ROLLBACK TRANSACTION sb_sp_1",
            QueryResponse::error_only(TerminalError::new(6401, 16, "Cannot roll back sb_sp_1.")),
        );
    }
    let reports = runtime.process_batch(batch(&broker)).await;
    let outcomes: Vec<Outcome> = reports.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Outcome::Transient; 3], "{reports:?}");
    assert!(reports.iter().all(|r| r.settled == Some(Ok(()))));
    assert_eq!(broker.counts().abandoned, 3);
    // The connections went back to the pool.
    assert!(runtime.store().connections() <= 2);
}

/// What the client asked the server, by TDS request type (MS-TDS 2.2.3.1.1 packet types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    /// A plain SQL batch (tiberius `simple_query`): its SET statements stay for the session.
    SqlBatch,
    /// An RPC request (tiberius `execute`/`query`: `sp_executesql`): dynamic SQL, whose SET
    /// statements the server restores when the call returns.
    Rpc,
    Other(u8),
}

/// A proxy in front of the mock that records each request the client sends: its TDS type and
/// its text (the UTF-16 the request carries, read at both byte alignments, since an RPC's
/// statement parameter need not start at an even offset).
struct RequestLog {
    port: u16,
    requests: Arc<std::sync::Mutex<Vec<(RequestKind, String)>>>,
    acceptor: JoinHandle<()>,
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl RequestLog {
    async fn start(target: u16) -> RequestLog {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let requests: Arc<std::sync::Mutex<Vec<(RequestKind, String)>>> = Arc::default();
        let log = requests.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else {
                    continue;
                };
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let log = log.clone();
                tokio::spawn(async move {
                    let (mut pending, mut message) = (Vec::new(), Vec::new());
                    let mut buf = vec![0u8; 64 * 1024];
                    while let Ok(n @ 1..) = client_read.read(&mut buf).await {
                        pending.extend_from_slice(&buf[..n]);
                        // Whole packets: an 8-byte header whose bytes 2..4 are the length.
                        while pending.len() >= 8 {
                            let length = usize::from(u16::from_be_bytes([pending[2], pending[3]]));
                            if length < 8 || pending.len() < length {
                                break;
                            }
                            let packet: Vec<u8> = pending.drain(..length).collect();
                            message.extend_from_slice(&packet[8..]);
                            // Status bit 0x01: the last packet of the request.
                            if packet[1] & 0x01 != 0 {
                                let kind = match packet[0] {
                                    0x01 => RequestKind::SqlBatch,
                                    0x03 => RequestKind::Rpc,
                                    other => RequestKind::Other(other),
                                };
                                let text = [&message[..], message.get(1..).unwrap_or_default()]
                                    .map(|bytes| {
                                        let units: Vec<u16> = bytes
                                            .chunks_exact(2)
                                            .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
                                            .collect();
                                        String::from_utf16_lossy(&units)
                                    })
                                    .join("\n");
                                log.lock().unwrap().push((kind, text));
                                message.clear();
                            }
                        }
                        if server_write.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                tokio::spawn(async move {
                    // Ends when either side closes.
                    let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
                });
            }
        });
        RequestLog {
            port,
            requests,
            acceptor,
        }
    }

    /// The kinds of the requests whose text contains `text`, in order.
    fn kinds_of(&self, text: &str) -> Vec<RequestKind> {
        self.requests
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, sent)| sent.contains(text))
            .map(|(kind, _)| *kind)
            .collect()
    }
}

/// `SET LOCK_TIMEOUT` bounds a batch's lock waits only when sent as a plain SQL batch: SQL
/// Server restores a SET option run in dynamic SQL (`sp_executesql`, the RPC every
/// parameterised tiberius call makes) when that call returns, so the bound would vanish with
/// its own statement. The recording proxy shows the bound and the restore at the commit both
/// go out as SQL batches, and the parameterised insert as an RPC (the proxy tells them apart).
/// The bound belongs to the session, not the transaction: the commit's batch restores the
/// session's own value (two thirds of the 30 s command timeout) so the pooled connection's next
/// transaction waits as configured; the mock answers only that commit batch with
/// `@@TRANCOUNT` 0, so a commit that forgot the restore gets no answer it accepts.
#[tokio::test]
async fn mock_lock_timeout_is_set_and_restored_in_plain_sql_batches() {
    let mock = spawn(MockTdsServer::new("127.0.0.1:0").await.unwrap());
    mock.registry.lock().await.register(
        "COMMIT TRANSACTION; SELECT @@TRANCOUNT; SET XACT_ABORT ON; SET LOCK_TIMEOUT 20000",
        trancount(0),
    );
    let log = RequestLog::start(mock.port).await;
    let store = store(log.port).await;
    let mut tx = store.begin().await.unwrap();
    let savepoint = tx.savepoint().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.release(savepoint).await.unwrap();
    tx.bound_lock_waits(std::time::Duration::from_millis(10))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        log.kinds_of("SET LOCK_TIMEOUT 10"),
        [RequestKind::SqlBatch],
        "the bound"
    );
    assert_eq!(
        log.kinds_of("SET LOCK_TIMEOUT 20000"),
        [RequestKind::SqlBatch, RequestKind::SqlBatch],
        "the session's value at connect, then restored by the commit"
    );
    assert_eq!(log.kinds_of("INSERT INTO sb_inbox"), [RequestKind::Rpc]);
}

/// Issue 41: a dead-letter verdict is an inbox insert (2627 on `pk_sb_inbox` is an inbox
/// duplicate, as for a processing insert) and reads back from its two columns.
#[tokio::test]
async fn mock_verdict_insert_conflicts_and_reads_back() {
    use sb_inbox::{InboxEntry, Verdict};

    let mock = mock().await;
    mock.fail_inserts(2627, 14, &duplicate_message("pk_sb_inbox"))
        .await;
    let store = store(mock.port).await;
    let verdict = Verdict {
        reason: "HandlerPanicked".to_owned(),
        resubmission: 2,
    };
    let mut tx = store.begin().await.unwrap();
    let error = tx.insert_verdict("c", "m-1", &verdict).await.unwrap_err();
    tx.rollback().await.unwrap();
    assert_eq!(error.kind(), ErrorKind::Duplicate(DuplicateScope::Inbox));

    // The mock matches an upper-case part verbatim: of this test's statements only the read
    // compares the key's bytes. (It encodes a NULL as IntN's, so the processed row's NULL
    // verdict is the conformance suite's, on a real server.)
    let columns = vec![
        ColumnDefinition::new("verdict", SqlDataType::NVarChar),
        ColumnDefinition::new("verdict_resubmission", SqlDataType::BigInt),
    ];
    let row = Row::new(vec![
        ColumnValue::NVarChar("HandlerPanicked".into()),
        ColumnValue::BigInt(2),
    ]);
    mock.registry
        .lock()
        .await
        .register("= DATALENGTH(@P2)", QueryResponse::new(columns, vec![row]));
    let mut tx = store.begin().await.unwrap();
    let entry = tx.inbox_entry("c", "m-1").await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(entry, Some(InboxEntry::DeadLettered(verdict)));
}

// `sb-inbox verify` on SQL Server (issue 43): its scratch schema's DDL and the sessions that
// run as the schema's user, as the mock receives them. The real server runs them in the
// `mssql` job of GitHub Actions (`sb-inbox verify` with the mssql store).

/// The session set-up the store sends on every new connection (conn.rs), `SET LOCK_TIMEOUT`
/// at two thirds of the default 30 s command timeout.
const SESSION_SETUP: &str = "SET XACT_ABORT ON; SET LANGUAGE us_english; SET ANSI_NULLS ON; \
     SET ANSI_PADDING ON; SET ANSI_WARNINGS ON; SET ARITHABORT ON; SET CONCAT_NULL_YIELDS_NULL ON; \
     SET QUOTED_IDENTIFIER ON; SET NUMERIC_ROUNDABORT OFF; SET LOCK_TIMEOUT 20000;";

fn config(port: u16) -> MssqlConfig {
    connection_string(port).parse().unwrap()
}

#[tokio::test]
async fn a_store_executing_as_a_user_switches_each_session_to_it_in_its_first_batch() {
    let mock = mock().await;
    // The exact batch, the user's name a Unicode literal with its quote doubled.
    mock.registry.lock().await.register(
        format!("{SESSION_SETUP} EXECUTE AS USER = N'sbv_o''brien';"),
        QueryResponse::error_only(TerminalError::new(
            15517,
            16,
            "Cannot execute as the database principal because the principal \"sbv_o'brien\" does not exist, this type of principal cannot be impersonated, or you do not have permission.",
        )),
    );
    let mut scoped = config(mock.port);
    scoped.set_execute_as("sbv_o'brien");
    assert!(
        scoped.to_string().contains("[as user sbv_o'brien]"),
        "{scoped}"
    );
    let error = MssqlStore::connect_with(scoped, 1)
        .await
        .expect_err("the server refuses the impersonation");
    assert_eq!(error.code(), Some("15517"), "{error}");
    // Without it the session set-up is the plain one, which the mock answers.
    MssqlStore::connect_with(config(mock.port), 1)
        .await
        .expect("the plain session set-up");
}

#[tokio::test]
async fn verify_creates_and_drops_its_scratch_schema_with_the_name_bound() {
    use sb_inbox_cli::verify::scratch::{MSSQL_CREATE, MSSQL_DROP, mssql_create, mssql_drop};
    // Each DDL is built on the server from the bound name (QUOTENAME), never from the text.
    for ddl in [
        "N'CREATE USER '",
        "WITHOUT LOGIN WITH DEFAULT_SCHEMA",
        "N'CREATE SCHEMA '",
        "AUTHORIZATION",
        "GRANT CREATE TABLE TO",
    ] {
        assert!(MSSQL_CREATE.contains(ddl), "{ddl}");
    }
    for ddl in [
        "DROP CONSTRAINT",
        "N'DROP '",
        "N'DROP SCHEMA '",
        "N'DROP USER '",
    ] {
        assert!(MSSQL_DROP.contains(ddl), "{ddl}");
    }
    assert!(!MSSQL_CREATE.contains("sbv_") && !MSSQL_DROP.contains("sbv_"));
    let mock = mock().await;
    let admin = store(mock.port).await;
    mssql_create(&admin, "sbv_0123abcd").await.unwrap();
    mssql_drop(&admin, "sbv_0123abcd").await.unwrap();
}

#[tokio::test]
async fn verify_reports_a_refused_scratch_schema_and_a_schema_it_could_not_drop() {
    use sb_inbox_cli::verify::scratch::{mssql_create, mssql_drop};
    let mock = mock().await;
    let mut registry = mock.registry.lock().await;
    // No rights to create users: the create fails with the server's error.
    registry.register(
        "WITHOUT LOGIN WITH DEFAULT_SCHEMA",
        QueryResponse::error_only(TerminalError::new(
            15247,
            16,
            "User does not have permission to perform this action.",
        )),
    );
    // An object left in the schema: DROP SCHEMA fails (Microsoft Learn, DROP SCHEMA: the
    // schema must not contain any objects).
    registry.register(
        "N'DROP SCHEMA '",
        QueryResponse::error_only(TerminalError::new(
            3729,
            16,
            "Cannot drop schema 'sbv_0123abcd' because it is being referenced by object 'sb_inbox'.",
        )),
    );
    drop(registry);
    let admin = store(mock.port).await;
    let error = mssql_create(&admin, "sbv_0123abcd").await.unwrap_err();
    assert_eq!(error.code(), Some("15247"), "{error}");
    let error = mssql_drop(&admin, "sbv_0123abcd").await.unwrap_err();
    assert_eq!(error.code(), Some("3729"), "{error}");
    assert!(error.to_string().contains("sbv_0123abcd"), "{error}");
}
