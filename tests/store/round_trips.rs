//! Issue 15, item 1: what a transaction costs in round trips, counted on the wire by a TCP
//! proxy between the store and its database, and what the savings must not break (the
//! first-error rule with pipelined statements, statements cached per connection going stale).
//!
//! A round trip is a turn of the conversation: the client speaks after the server last did.
//! Several requests written together (pipelined) are one turn however the server answers
//! them. The tests run on the current-thread runtime, where the driver's connection task
//! writes only when the test's task waits, so pipelined requests always leave in one write.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, ConsumerName, ErrorKind, Message, PgStore, Runtime, RuntimeConfig, Store, StoreTx, Tx,
};
use sb_inbox_cli::inventory::{CONSUMER, InventoryStore, OrderPlacedConsumer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::support::{Count, fresh_pg_schema};

/// Counts the turns of every conversation it relays to `target`.
pub(crate) struct TurnProxy {
    pub(crate) port: u16,
    turns: Arc<AtomicUsize>,
    acceptor: JoinHandle<()>,
}

impl Drop for TurnProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl TurnProxy {
    pub(crate) async fn start(target: String) -> TurnProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let turns = Arc::new(AtomicUsize::new(0));
        let counted = turns.clone();
        let acceptor = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue;
                };
                relay(client, server, counted.clone());
            }
        });
        TurnProxy {
            port,
            turns,
            acceptor,
        }
    }

    /// Turns since the last call.
    pub(crate) fn take(&self) -> usize {
        self.turns.swap(0, Ordering::SeqCst)
    }
}

/// Copies both ways; a client write after the server spoke (or the first one) is a new turn.
fn relay(client: TcpStream, server: TcpStream, turns: Arc<AtomicUsize>) {
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    // True while the client holds the floor.
    let client_speaking = Arc::new(AtomicBool::new(false));
    let speaking = client_speaking.clone();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = client_read.read(&mut buf).await {
            if !speaking.swap(true, Ordering::SeqCst) {
                turns.fetch_add(1, Ordering::SeqCst);
            }
            if server_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = server_read.read(&mut buf).await {
            // Before the client can read it, so its next request is a new turn.
            client_speaking.store(false, Ordering::SeqCst);
            if client_write.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
}

/// `url` with its `host:port` replaced by the proxy's.
fn through(url: &str, port: u16) -> String {
    let authority = url.find("://").map_or(0, |i| i + 3);
    let host = url[authority..]
        .find('@')
        .map_or(authority, |i| authority + i + 1);
    let end = url[host..].find(['/', '?']).map_or(url.len(), |i| host + i);
    format!("{}127.0.0.1:{port}{}", &url[..host], &url[end..])
}

/// The `host:port` of `url`.
fn target(url: &str) -> String {
    let proxied = through(url, 1);
    let prefix = proxied.find("127.0.0.1:1").unwrap_or(0);
    let rest = &url[prefix..];
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let address = &rest[..end];
    if address.contains(':') {
        address.to_owned()
    } else {
        format!("{address}:5432")
    }
}

/// A migrated schema of `test`'s own, and a one-connection store that reaches it through a
/// counting proxy.
async fn counted_pg_store(test: &str) -> (PgStore, TurnProxy) {
    let url = fresh_pg_schema(test).await;
    let direct = PgStore::connect(&url, 1).await.unwrap();
    direct.migrate().await.unwrap();
    direct.migrate_inventory().await.unwrap();
    let proxy = TurnProxy::start(target(&url)).await;
    let store = PgStore::connect(&through(&url, proxy.port), 1)
        .await
        .unwrap();
    (store, proxy)
}

/// Order `id` under message id `m-{id}`: two units of each of `skus`.
fn order(id: &str, skus: &[&str]) -> Message {
    let lines: Vec<(&str, i32)> = skus.iter().map(|&sku| (sku, 2)).collect();
    crate::support::orders::order_with_lines(&format!("m-{id}"), id, &lines)
}

#[test]
fn urls_are_rewritten_to_the_proxy() {
    let url = "postgres://postgres@127.0.0.1:5432/test?options=-csearch_path%3Dx";
    assert_eq!(
        through(url, 7),
        "postgres://postgres@127.0.0.1:7/test?options=-csearch_path%3Dx"
    );
    assert_eq!(target(url), "127.0.0.1:5432");
    assert_eq!(target("postgres://u:p@db.example/test"), "db.example:5432");
}

/// The reference consumer's transaction for a 2-line order, run by the runtime: `pgbench -M
/// prepared` needs 9 round trips for these statements (begin; inbox; business key;
/// reservation; 2 × (line + upsert); commit), and the store needed 15 before issue 15 (a health
/// query at checkout, `BEGIN` alone, a prepare before each business statement), 4 before
/// issue 42 (the business key alone). Now: `BEGIN` with the inbox insert, the business key
/// with the reservation, its lines and upserts, and the commit.
#[tokio::test]
async fn a_two_line_order_takes_three_round_trips_on_postgres() {
    let (store, proxy) = counted_pg_store("round_trips_pg_order").await;
    let broker = MemoryBroker::new(Clock::new());
    let config = RuntimeConfig::new(ConsumerName::new(CONSUMER).unwrap());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        config,
    );
    // The first order on the connection prepares its statements (once per connection).
    broker.send(order("o-1", &["A", "B"]));
    runtime.process(broker.try_receive().unwrap()).await;
    let first = proxy.take();

    broker.send(order("o-2", &["C", "A"]));
    runtime.process(broker.try_receive().unwrap()).await;
    let turns = proxy.take();
    assert_eq!(
        turns, 3,
        "round trips of a 2-line order (the first took {first})"
    );
    assert!(turns <= 9, "at or below pgbench's 9");

    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (2, 2));
    assert_eq!(counts.reserved_units, 8);
    proxy.take();

    // A redelivered copy is a duplicate, recognised on the inbox insert: 2 round trips
    // (BEGIN with the insert, then the rollback), and 1 more to read whether the row is a
    // twin's dead-letter verdict (issue 41), which PostgreSQL cannot answer inside the
    // transaction the violation aborted (the read runs alone, outside a block). The first
    // duplicate on a connection prepares that read (one round trip more).
    broker.send(order("o-2", &["C", "A"]));
    runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(proxy.take(), 4);
    broker.send(order("o-2", &["C", "A"]));
    runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(proxy.take(), 3);
    assert_eq!(store.inventory_counts().await.unwrap().reservations, 2);
}

/// Checking a connection out of the pool sends nothing, and neither does a transaction that
/// ran no statement.
#[tokio::test]
async fn checkout_and_an_empty_transaction_send_nothing() {
    let (store, proxy) = counted_pg_store("round_trips_pg_checkout").await;
    // The pool's connection exists (its login is not what is counted here).
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();
    proxy.take();
    store.begin().await.unwrap().commit().await.unwrap();
    store.begin().await.unwrap().rollback().await.unwrap();
    drop(store.begin().await.unwrap());
    assert_eq!(proxy.take(), 0);
}

/// A pipelined statement that fails is the transaction's first error, classified by code and
/// constraint; the statements after it are not run (the sequence they would advance, which no
/// rollback resets, has not moved), and the commit is refused.
#[tokio::test]
async fn a_failure_inside_a_pipeline_is_the_first_error_and_ends_it() {
    let (store, _proxy) = counted_pg_store("round_trips_pg_pipeline_error").await;
    store
        .query("CREATE SEQUENCE after_failure", &[])
        .await
        .unwrap();
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.commit().await.unwrap();

    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-2").await.unwrap();
    let error = tx
        .pipeline(&[
            (
                "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ($1, $2, $3)",
                &[&"c", &"k", &"m-2"],
            ),
            (
                "INSERT INTO sb_inbox (consumer, message_id) VALUES ($1, $2)",
                &[&"c", &"m-1"],
            ),
            ("SELECT nextval('after_failure')", &[]),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(sb_inbox::DuplicateScope::Inbox),
        "{error}"
    );
    assert_eq!(
        (error.code(), error.constraint()),
        (Some("23505"), Some("pk_sb_inbox"))
    );
    assert!(!error.is_refused());
    let refused = tx.execute("SELECT 1", &[]).await.unwrap_err();
    assert!(refused.is_refused());
    assert_eq!(refused.code(), Some("23505"));
    assert!(tx.commit().await.unwrap_err().is_refused());
    let called: bool = store
        .query("SELECT is_called FROM after_failure", &[])
        .await
        .unwrap()[0]
        .get(0);
    assert!(!called, "the statement after the failure ran");
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 0);
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}

/// A business key claimed with statements behind it in one round trip: claimed before, it
/// fails as a business-key duplicate, the statements behind it do not run and the commit is
/// refused; a fresh key runs them all and returns their counts alone.
#[tokio::test]
async fn a_claim_with_statements_behind_it_is_one_round_trip_and_its_duplicate_runs_none() {
    let (store, proxy) = counted_pg_store("round_trips_pg_claim_then").await;
    store
        .query("CREATE SEQUENCE after_claim", &[])
        .await
        .unwrap();
    let next = "SELECT nextval('after_claim')";
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    // Prepares its statements (once per connection).
    let counts = tx
        .claim_business_key_then("c", "order:1", "m-1", &[(next, &[]), (next, &[])])
        .await
        .unwrap();
    assert_eq!(counts, [1, 1]);
    tx.commit().await.unwrap();

    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-2").await.unwrap();
    proxy.take();
    let error = tx
        .claim_business_key_then("c", "order:1", "m-2", &[(next, &[])])
        .await
        .unwrap_err();
    assert_eq!(proxy.take(), 1, "the claim and the statement behind it");
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(sb_inbox::DuplicateScope::BusinessKey),
        "{error}"
    );
    assert!(tx.commit().await.unwrap_err().is_refused());
    let last: i64 = store
        .query("SELECT last_value FROM after_claim", &[])
        .await
        .unwrap()[0]
        .get(0);
    assert_eq!(last, 2, "a statement behind the refused claim ran");
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 1);
}

/// Savepoints around pipelined statements: a duplicate inside a savepoint is rolled back to
/// and the rest commits.
#[tokio::test]
async fn a_pipeline_inside_a_savepoint_rolls_back_alone() {
    let (store, _proxy) = counted_pg_store("round_trips_pg_pipeline_savepoint").await;
    let claim = "INSERT INTO sb_inbox_business_key (consumer, business_key, message_id) VALUES ($1, $2, $3)";
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-1").await.unwrap();
    tx.pipeline(&[(claim, &[&"c", &"k-1", &"m-1"])])
        .await
        .unwrap();
    let savepoint = tx.savepoint().await.unwrap();
    let error = tx
        .pipeline(&[
            (claim, &[&"c", &"k-2", &"m-1"]),
            (claim, &[&"c", &"k-1", &"m-1"]),
        ])
        .await
        .unwrap_err();
    assert_eq!(
        error.kind(),
        ErrorKind::Duplicate(sb_inbox::DuplicateScope::BusinessKey)
    );
    tx.rollback_to(savepoint).await.unwrap();
    assert_eq!(
        tx.pipeline(&[(claim, &[&"c", &"k-3", &"m-1"])])
            .await
            .unwrap(),
        [1]
    );
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 2);
}

/// The statement cache: a statement whose result columns changed under it fails once with
/// "cached plan must not change result type" (0A000, transient), is forgotten, and is prepared
/// again by the retry.
#[tokio::test]
async fn a_stale_cached_statement_fails_once_then_is_prepared_again() {
    let (store, _proxy) = counted_pg_store("round_trips_pg_stale_statement").await;
    store
        .query("CREATE TABLE widening (id int PRIMARY KEY)", &[])
        .await
        .unwrap();
    store
        .query("INSERT INTO widening VALUES (1)", &[])
        .await
        .unwrap();
    let select = "SELECT * FROM widening WHERE id = $1";
    let columns = |store: PgStore| async move {
        let mut tx = store.begin().await?;
        let rows = tx.query(select, &[&1i32]).await;
        tx.rollback().await?;
        rows.map(|rows| rows[0].len())
    };
    assert_eq!(columns(store.clone()).await.unwrap(), 1);
    store
        .query("ALTER TABLE widening ADD COLUMN note text", &[])
        .await
        .unwrap();
    let error = columns(store.clone()).await.unwrap_err();
    assert_eq!(error.code(), Some("0A000"), "{error}");
    assert!(error.kind().is_transient());
    assert_eq!(columns(store.clone()).await.unwrap(), 2, "prepared again");
}

/// If the `BEGIN` pipelined with the inbox insert failed on a connection that stayed open, the
/// insert would run on its own and commit; guarded by the mark that `BEGIN` sets, it writes
/// nothing there.
#[tokio::test]
async fn the_inbox_insert_writes_nothing_outside_its_transaction_block() {
    let (store, _proxy) = counted_pg_store("round_trips_pg_begin_guard").await;
    assert_eq!(
        store.inbox_insert_without_begin("c", "m-1").await.unwrap(),
        0
    );
    // The session's own transactions end the mark with them.
    let mut tx = store.begin().await.unwrap();
    tx.insert_inbox("c", "m-2").await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        store.inbox_insert_without_begin("c", "m-3").await.unwrap(),
        0
    );
    assert_eq!(store.count("sb_inbox").await.unwrap(), 1);
}
