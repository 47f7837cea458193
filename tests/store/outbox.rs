//! Outbox relay and retention cases of the conformance suite (instantiated per store in
//! `conformance.rs`), and the non-blocking claims of the stores that lock rows (PostgreSQL
//! `SKIP LOCKED`, SQL Server `READPAST`).

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sb_inbox::{
    MssqlTx, OutboxLease, OutboxMessage, OutboxStore, PgTx, RetentionStore, Store, StoreError,
    StoreTx, Tx,
};

use crate::support::{Backdate, Count};

const MINUTE: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(86_400);

fn message(i: usize) -> OutboxMessage {
    let mut message = OutboxMessage::new(
        "stock-reserved",
        "inventory.stock-reserved.v1",
        format!(r#"{{"n":{i}}}"#).into_bytes(),
    );
    message.correlation_id = Some(format!("c-{i}"));
    message
        .application_properties
        .insert("n".into(), i64::try_from(i).unwrap().into());
    message
        .application_properties
        .insert("tenant".into(), "t1".into());
    // The publishing columns (issue 40), on every other row; the rest keep them NULL.
    if i % 2 == 1 {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_800_000_000_123 + i as u64);
        message = message
            .with_session_id(format!("s-{i}"))
            .with_partition_key(format!("s-{i}"))
            .with_scheduled_enqueue_time(at)
            .with_time_to_live(Duration::from_millis(90_001))
            .with_to("audit")
            .with_reply_to("replies");
    }
    message
}

/// Appends `n` messages, one transaction each (as consumers do); returns them in order.
async fn append<S: Store>(store: &S, n: usize) -> Vec<OutboxMessage> {
    let mut written = Vec::new();
    for i in 0..n {
        let message = message(i);
        let mut tx = store.begin().await.unwrap();
        tx.append_outbox(&message).await.unwrap();
        tx.commit().await.unwrap();
        written.push(message);
    }
    written
}

fn lease(now: SystemTime) -> OutboxLease {
    OutboxLease::new(now + MINUTE)
}

async fn claim<S: OutboxStore>(
    store: &S,
    now: SystemTime,
    limit: usize,
) -> (OutboxLease, Vec<i64>) {
    let lease = lease(now);
    let rows = store.claim_outbox(now, &lease, limit).await.unwrap().rows;
    (lease, rows.iter().map(|row| row.id).collect())
}

pub(crate) async fn outbox_claim_lease_and_mark<S: Store + OutboxStore + Count>(store: S) {
    let written = append(&store, 5).await;
    let now = SystemTime::now();

    let first = lease(now);
    let rows = store.claim_outbox(now, &first, 3).await.unwrap().rows;
    assert_eq!(rows.len(), 3);
    assert!(
        rows.windows(2).all(|w| w[0].id < w[1].id),
        "in written order"
    );
    for (row, message) in rows.iter().zip(&written) {
        assert_eq!(&row.message, message, "the row comes back as written");
        assert_eq!(row.attempts, 1);
        assert!(!row.is_retry());
        let sent = row.to_message();
        assert_eq!(
            sent.message_id.as_deref(),
            Some(message.message_id.as_str())
        );
        assert_eq!(sent.body.as_ref(), message.body.as_slice());
    }
    let (second, second_ids) = claim(&store, now, 10).await;
    assert_eq!(second_ids.len(), 2, "the rest");
    assert!(claim(&store, now, 10).await.1.is_empty(), "all leased");

    let first_ids: Vec<i64> = rows.iter().map(|row| row.id).collect();
    assert_eq!(
        store
            .mark_dispatched(&second, &first_ids, now)
            .await
            .unwrap(),
        0,
        "another lease's token marks nothing"
    );
    assert_eq!(
        store
            .mark_dispatched(&first, &first_ids, now)
            .await
            .unwrap(),
        3
    );
    assert_eq!(
        store
            .mark_dispatched(&first, &first_ids, now)
            .await
            .unwrap(),
        0,
        "marked once"
    );
    let backlog = store.outbox_backlog().await.unwrap();
    assert_eq!(backlog.pending, 2);
    assert!(backlog.oldest.is_some());

    // The second relay "died": once its lease ends the rows come back, as retries.
    assert!(
        claim(&store, now + MINUTE - Duration::from_secs(1), 10)
            .await
            .1
            .is_empty()
    );
    let later = now + MINUTE;
    let third = lease(later);
    let again = store.claim_outbox(later, &third, 10).await.unwrap().rows;
    assert_eq!(again.iter().map(|r| r.id).collect::<Vec<_>>(), second_ids);
    assert!(again.iter().all(|row| row.attempts == 2 && row.is_retry()));
    assert_eq!(
        store
            .mark_dispatched(&second, &second_ids, later)
            .await
            .unwrap(),
        0,
        "the lease was taken over: the old holder marks nothing"
    );
    assert_eq!(
        store
            .mark_dispatched(&third, &second_ids, later)
            .await
            .unwrap(),
        2
    );
    assert_eq!(
        store.outbox_backlog().await.unwrap(),
        sb_inbox::OutboxBacklog::default()
    );
    assert_eq!(
        store
            .count("sb_outbox WHERE dispatched_at IS NOT NULL")
            .await
            .unwrap(),
        5
    );
}

pub(crate) async fn outbox_release_with_and_without_failure<S: Store + OutboxStore + Count>(
    store: S,
) {
    append(&store, 2).await;
    let now = SystemTime::now();
    let (lease, ids) = claim(&store, now, 10).await;
    let due = now + Duration::from_secs(10);
    let failure = "send refused: entity not found ".repeat(100);
    assert_eq!(
        store
            .release_outbox(&lease, &ids[..1], due, Some(&failure))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .release_outbox(&lease, &ids[1..], now, None)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .count("sb_outbox WHERE last_error IS NOT NULL")
            .await
            .unwrap(),
        1,
        "the failure is kept (cut to the column) for operators"
    );

    // The untried row is due at once with its claim undone; the failed one after its backoff.
    let (untried, retried) = {
        let lease = OutboxLease::new(now + MINUTE);
        let rows = store.claim_outbox(now, &lease, 10).await.unwrap().rows;
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].id, rows[0].attempts), (ids[1], 1));
        let after = OutboxLease::new(due + MINUTE);
        assert!(
            store
                .claim_outbox(due - Duration::from_millis(1), &after, 10)
                .await
                .unwrap()
                .is_empty()
        );
        let rows = store.claim_outbox(due, &after, 10).await.unwrap().rows;
        assert_eq!(rows.len(), 1);
        assert_eq!((rows[0].id, rows[0].attempts), (ids[0], 2));
        (lease, after)
    };
    assert_eq!(
        store
            .mark_dispatched(&untried, &ids[1..], now)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .mark_dispatched(&retried, &ids[..1], due)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .count("sb_outbox WHERE last_error IS NOT NULL")
            .await
            .unwrap(),
        0,
        "a mark clears the failure"
    );
}

/// Relays claiming at the same time get disjoint rows and, together, all of them.
pub(crate) async fn concurrent_claims_are_disjoint<S: Store + OutboxStore + Clone>(store: S) {
    append(&store, 40).await;
    let now = SystemTime::now();
    let start = Arc::new(tokio::sync::Barrier::new(3));
    let claimers: Vec<_> = (0..3)
        .map(|_| {
            let (store, start) = (store.clone(), start.clone());
            tokio::spawn(async move {
                start.wait().await;
                let mut mine = Vec::new();
                loop {
                    let (_, ids) = claim(&store, now, 4).await;
                    if ids.is_empty() {
                        return mine;
                    }
                    mine.extend(ids);
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    let mut all = BTreeSet::new();
    let mut total = 0;
    for claimer in claimers {
        let mine = claimer.await.unwrap();
        total += mine.len();
        all.extend(mine);
    }
    assert_eq!(
        (total, all.len()),
        (40, 40),
        "no row claimed twice, none missed"
    );
}

pub(crate) async fn backlog_counts_pending_rows<S: Store + OutboxStore>(store: S) {
    assert_eq!(
        store.outbox_backlog().await.unwrap(),
        sb_inbox::OutboxBacklog::default()
    );
    append(&store, 3).await;
    let backlog = store.outbox_backlog().await.unwrap();
    assert_eq!(backlog.pending, 3);
    // Written by the database's clock: close to ours.
    let oldest = backlog.oldest.unwrap();
    let skew = SystemTime::now()
        .duration_since(oldest)
        .unwrap_or_else(|e| e.duration());
    assert!(skew < MINUTE, "oldest {oldest:?}");
    assert!(backlog.oldest_age(oldest + MINUTE) == MINUTE);
    assert_eq!(backlog.oldest_age(oldest - MINUTE), Duration::ZERO);
}

/// Inbox rows age on the database's clock (`processed_at` is its `now()`): a worker whose clock
/// is 31 days ahead deletes none of today's rows under a 30-day retention (comparing its own
/// clock with `processed_at`, it deleted them all and let their redeliveries through), and
/// deletes the rows the database says are 40 days old.
pub(crate) async fn retention_ages_inbox_rows_on_the_database_clock<
    S: Store + OutboxStore + RetentionStore + Count + Backdate,
>(
    store: S,
) {
    use sb_inbox::Clock;
    use sb_inbox::retention::{RetentionConfig, RetentionTask};

    let mut tx = store.begin().await.unwrap();
    for consumer in ["today", "old"] {
        tx.insert_inbox(consumer, "m-1").await.unwrap();
    }
    tx.commit().await.unwrap();
    store
        .backdate("sb_inbox", "processed_at", 40, "consumer = 'old'")
        .await
        .unwrap();
    let ahead = Clock::starting_at(SystemTime::now() + 31 * DAY);
    let task = RetentionTask::with_clock(store, RetentionConfig::new(30 * DAY), ahead);
    let sweep = task.sweep(&Default::default()).await.unwrap();
    assert_eq!(sweep.inbox_deleted, 1, "only the row 40 days old");
}

/// Old inbox rows go in batches of at most the limit; recent ones, business keys, aggregate
/// versions and undispatched outbox rows stay.
pub(crate) async fn retention_deletes_old_rows_in_batches<
    S: Store + OutboxStore + RetentionStore + Count + Backdate,
>(
    store: S,
) {
    let mut tx = store.begin().await.unwrap();
    for i in 0..20 {
        tx.insert_inbox("old", &format!("m-{i}")).await.unwrap();
    }
    for i in 0..5 {
        tx.insert_inbox("new", &format!("m-{i}")).await.unwrap();
    }
    tx.claim_business_key("old", "order:1", "m-0")
        .await
        .unwrap();
    tx.advance_version("old", "order:1", 1).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        store
            .backdate("sb_inbox", "processed_at", 40, "consumer = 'old'")
            .await
            .unwrap(),
        20
    );
    store
        .backdate("sb_inbox_business_key", "claimed_at", 40, "1 = 1")
        .await
        .unwrap();
    store
        .backdate("sb_inbox_aggregate_version", "updated_at", 40, "1 = 1")
        .await
        .unwrap();
    // Outbox: one dispatched 40 days ago, one just now, one never (and written 40 days ago).
    append(&store, 3).await;
    store
        .backdate("sb_outbox", "created_at", 40, "1 = 1")
        .await
        .unwrap();
    let now = SystemTime::now();
    let (lease, ids) = claim(&store, now, 2).await;
    store
        .mark_dispatched(&lease, &ids[..1], now - 40 * DAY)
        .await
        .unwrap();
    store.mark_dispatched(&lease, &ids[1..], now).await.unwrap();

    let cutoff = now - 30 * DAY;
    let mut batches = Vec::new();
    loop {
        let deleted = store.delete_inbox_batch(30 * DAY, 6).await.unwrap();
        batches.push(deleted);
        if deleted < 6 {
            break;
        }
    }
    assert_eq!(batches, [6, 6, 6, 2]);
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'old'")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'new'")
            .await
            .unwrap(),
        5
    );
    assert_eq!(store.count("sb_inbox_business_key").await.unwrap(), 1);
    assert_eq!(store.count("sb_inbox_aggregate_version").await.unwrap(), 1);

    assert_eq!(
        store
            .delete_dispatched_outbox_batch(cutoff, 6)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store
            .delete_dispatched_outbox_batch(cutoff, 6)
            .await
            .unwrap(),
        0
    );
    assert_eq!(store.count("sb_outbox").await.unwrap(), 2);
    assert_eq!(
        store.outbox_backlog().await.unwrap().pending,
        1,
        "never dispatched: kept"
    );
}

/// A transaction that holds row locks on the outbox, as a relay mid-claim or an operator's
/// statement would.
pub(crate) trait LockOutbox: Tx {
    /// Locks the outbox rows with `id <= max_id` for update.
    fn lock_outbox(&mut self, max_id: i64) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Locks the inbox rows of `consumer` for update.
    fn lock_inbox(&mut self, consumer: &str)
    -> impl Future<Output = Result<(), StoreError>> + Send;
}

impl LockOutbox for PgTx {
    async fn lock_outbox(&mut self, max_id: i64) -> Result<(), StoreError> {
        self.query(
            "SELECT id FROM sb_outbox WHERE id <= $1 FOR UPDATE",
            &[&max_id],
        )
        .await
        .map(drop)
    }

    async fn lock_inbox(&mut self, consumer: &str) -> Result<(), StoreError> {
        self.query(
            "SELECT 1 FROM sb_inbox WHERE consumer = $1 FOR UPDATE",
            &[&consumer],
        )
        .await
        .map(drop)
    }
}

impl LockOutbox for MssqlTx {
    async fn lock_outbox(&mut self, max_id: i64) -> Result<(), StoreError> {
        self.query(
            "SELECT id FROM sb_outbox WITH (UPDLOCK, ROWLOCK) WHERE id <= @P1",
            &[&max_id],
        )
        .await
        .map(drop)
    }

    async fn lock_inbox(&mut self, consumer: &str) -> Result<(), StoreError> {
        self.query(
            "SELECT id FROM sb_inbox WITH (UPDLOCK, ROWLOCK) WHERE consumer = @P1",
            &[&consumer],
        )
        .await
        .map(drop)
    }
}

/// Bounds a call that must not wait for another transaction's locks.
async fn promptly<T>(what: &str, call: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .unwrap_or_else(|_| panic!("{what} waited for another transaction's locks"))
}

/// With a consumer transaction open (an uncommitted outbox row) and another transaction
/// holding the first rows' locks, two relays claiming at once get disjoint rows, none of the
/// locked or uncommitted ones, and never wait.
pub(crate) async fn claims_skip_locked_rows<S>(store: S)
where
    S: Store<Tx: LockOutbox> + OutboxStore + RetentionStore + Backdate + Count + Clone,
{
    append(&store, 12).await;
    let mut consumer = store.begin().await.unwrap();
    consumer.insert_inbox("c", "in-flight").await.unwrap();
    consumer.append_outbox(&message(99)).await.unwrap();

    let (_, all) = {
        let now = SystemTime::now();
        // Ids of the committed rows, without claiming them (a lease that ended already).
        let probe = OutboxLease::new(now - MINUTE);
        let rows = store.claim_outbox(now, &probe, 100).await.unwrap().rows;
        store
            .release_outbox(
                &probe,
                &rows.iter().map(|r| r.id).collect::<Vec<_>>(),
                now,
                None,
            )
            .await
            .unwrap();
        (probe, rows.iter().map(|r| r.id).collect::<Vec<_>>())
    };
    assert_eq!(all.len(), 12);
    let mut locker = store.begin().await.unwrap();
    locker.lock_outbox(all[2]).await.unwrap();

    let now = SystemTime::now();
    let claims = [store.clone(), store.clone()]
        .map(|store| tokio::spawn(async move { promptly("claim", claim(&store, now, 5)).await.1 }));
    let mut claimed = Vec::new();
    for task in claims {
        claimed.push(task.await.unwrap());
    }
    let (a, b) = (&claimed[0], &claimed[1]);
    assert!(a.iter().all(|id| !b.contains(id)), "disjoint: {a:?} {b:?}");
    let mut got: Vec<i64> = a.iter().chain(b).copied().collect();
    got.sort_unstable();
    assert_eq!(
        got,
        all[3..],
        "everything but the locked rows (and no uncommitted row)"
    );

    locker.commit().await.unwrap();
    let (_, rest) = promptly("claim", claim(&store, now, 10)).await;
    assert_eq!(
        rest,
        all[..3],
        "the rows are claimable once their locks are gone"
    );
    consumer.commit().await.unwrap();
    assert_eq!(promptly("claim", claim(&store, now, 10)).await.1.len(), 1);

    // Retention skips locked inbox rows the same way and takes them on a later sweep.
    let mut tx = store.begin().await.unwrap();
    for i in 0..3 {
        tx.insert_inbox("locked", &format!("m-{i}")).await.unwrap();
        tx.insert_inbox("free", &format!("m-{i}")).await.unwrap();
    }
    tx.commit().await.unwrap();
    store
        .backdate(
            "sb_inbox",
            "processed_at",
            40,
            "consumer IN ('locked', 'free')",
        )
        .await
        .unwrap();
    let mut locker = store.begin().await.unwrap();
    locker.lock_inbox("locked").await.unwrap();
    assert_eq!(
        promptly("delete", store.delete_inbox_batch(30 * DAY, 100))
            .await
            .unwrap(),
        3
    );
    locker.rollback().await.unwrap();
    assert_eq!(store.delete_inbox_batch(30 * DAY, 100).await.unwrap(), 3);
    assert_eq!(
        store.count("sb_inbox").await.unwrap(),
        1,
        "the in-flight row"
    );
}

macro_rules! locking_stores {
    ($($case:ident),* $(,)?) => {
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::support::init_tracing();
                    let store = crate::support::pg_store(concat!("pg_", stringify!($case)), 6).await;
                    super::$case(store).await;
                }
            )*
        }
        mod mssql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    crate::support::init_tracing();
                    let Some(store) =
                        crate::support::mssql_store(concat!("mssql_", stringify!($case)), 6).await
                    else {
                        return;
                    };
                    super::$case(store).await;
                }
            )*
        }
    };
}

locking_stores!(claims_skip_locked_rows);

/// A sweep in batches of 50 runs while a consumer commits the inventory transaction over and
/// over: every consumer transaction commits, every expired row goes, every recent row stays.
pub(crate) async fn retention_runs_beside_a_consumer<S>(store: S)
where
    S: Store<Tx: sb_inbox_cli::inventory::InventoryTx> + RetentionStore + Backdate + Count + Clone,
{
    use sb_inbox::retention::{RetentionConfig, RetentionTask};
    use sb_inbox_cli::inventory::{InventoryTx, OrderLine, OrderPlaced};

    const EXPIRED: i64 = 2000;
    let mut tx = store.begin().await.unwrap();
    for i in 0..EXPIRED {
        tx.insert_inbox("expired", &format!("m-{i}")).await.unwrap();
    }
    tx.commit().await.unwrap();
    store
        .backdate("sb_inbox", "processed_at", 40, "consumer = 'expired'")
        .await
        .unwrap();

    let mut config = RetentionConfig::new(30 * DAY);
    config.batch_size = 50;
    let task = RetentionTask::new(store.clone(), config);
    let consumer = tokio::spawn({
        let store = store.clone();
        async move {
            for i in 0..200 {
                let id = format!("m-{i}");
                let order = OrderPlaced {
                    order_id: format!("o-{i}"),
                    lines: vec![OrderLine {
                        sku: "A".into(),
                        quantity: 1,
                    }],
                };
                let mut tx = store.begin().await.unwrap();
                tx.insert_inbox("inventory", &id).await.unwrap();
                tx.reserve(&id, &order).await.unwrap();
                tx.commit().await.unwrap();
                tokio::task::yield_now().await;
            }
        }
    });
    let sweep = task
        .sweep(&tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    consumer.await.unwrap();
    assert_eq!(sweep.inbox_deleted, EXPIRED as u64);
    assert!(sweep.batches > (EXPIRED / 50) as u64, "{sweep:?}");
    assert_eq!(task.stats().snapshot().inbox_deleted, EXPIRED as u64);
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'expired'")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .count("sb_inbox WHERE consumer = 'inventory'")
            .await
            .unwrap(),
        200
    );
    assert_eq!(store.count("inventory_reservation").await.unwrap(), 200);
}

/// Issue 40, M3: a non-finite double is refused when the row is written, permanently, and the
/// transaction refuses its commit after it (JSON has no spelling for NaN: it was stored as
/// `null`, and every claim that took the row failed). A partition key other than the session
/// id and a zero time-to-live are refused the same way. Nothing is written.
pub(crate) async fn outbox_refuses_what_it_cannot_publish<S: Store + Count>(store: S) {
    use sb_inbox::{ErrorKind, PropertyValue};
    let non_finite = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY]
        .map(|value| message(0).with_property("ratio", PropertyValue::Double(value)));
    let mismatched = message(0).with_session_id("a").with_partition_key("b");
    let zero_ttl = message(0).with_time_to_live(Duration::ZERO);
    for refused in non_finite.iter().chain([&mismatched, &zero_ttl]) {
        let mut tx = store.begin().await.unwrap();
        let error = tx.append_outbox(refused).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Conversion, "{error}");
        assert!(!error.kind().is_transient());
        assert!(tx.commit().await.is_err(), "the commit is refused after it");
    }
    assert_eq!(store.count("sb_outbox").await.unwrap(), 0);
    let mut tx = store.begin().await.unwrap();
    let finite = message(0).with_property("ratio", PropertyValue::Double(0.5));
    tx.append_outbox(&finite).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(store.count("sb_outbox").await.unwrap(), 1);
}

/// Issue 40, M3: a row that does not read back as a message (a NaN property an older version
/// stored as `null`) comes back apart from the claim, leased like the others, with its key and
/// the reason; its neighbours come back as messages. Released with the reason, it keeps it as
/// its `last_error` and is due again when the relay says.
pub(crate) async fn an_unreadable_row_does_not_fail_the_claim<
    S: Store + OutboxStore + Count + crate::support::RawSql,
>(
    store: S,
) {
    let written = append(&store, 5).await;
    let bad = &written[2];
    let changed = store
        .run_sql(&format!(
            "UPDATE sb_outbox SET application_properties = '{{\"ratio\":null}}' \
             WHERE message_id = '{}'",
            bad.message_id
        ))
        .await
        .unwrap();
    assert_eq!(changed, 1);
    let now = SystemTime::now();
    let lease = lease(now);
    let claimed = store.claim_outbox(now, &lease, 10).await.unwrap();
    assert_eq!(
        claimed.rows.iter().map(|r| &r.message).collect::<Vec<_>>(),
        [&written[0], &written[1], &written[3], &written[4]]
    );
    let [unreadable] = claimed.unreadable.as_slice() else {
        panic!("{:?}", claimed.unreadable);
    };
    assert_eq!(unreadable.key, Some(("stock-reserved".to_owned(), None)));
    assert_eq!(unreadable.attempts, 1);
    assert!(
        unreadable.reason.contains("application_properties"),
        "{}",
        unreadable.reason
    );
    assert!(claim(&store, now, 10).await.1.is_empty(), "all leased");
    let released = store
        .release_outbox(
            &lease,
            &[unreadable.id],
            now + MINUTE,
            Some(&unreadable.reason),
        )
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert!(claim(&store, now, 10).await.1.is_empty(), "backing off");
    let again = store
        .claim_outbox(now + MINUTE, &self::lease(now + MINUTE), 10)
        .await
        .unwrap();
    assert_eq!(again.unreadable.len(), 1, "still quarantined, not lost");
    assert_eq!(again.unreadable[0].attempts, 2);
}
