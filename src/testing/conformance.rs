//! The store conformance suite: what every [`Store`] must do for the runtime's promise to hold,
//! checked through the port alone, so a third-party store is checked by the same code as ours.
//!
//! ```no_run
//! # #![allow(dead_code)]
//! # async fn example(store: sb_inbox::SqliteStore) {
//! // In the store's own test, on a migrated, empty store:
//! sb_inbox::testing::conformance::run(store).await.expect("store conforms");
//! # }
//! ```
//!
//! Each check writes under its own consumer name with a fresh per-run prefix, so one store
//! serves the whole suite and a rerun on a database that keeps its rows passes too. What it
//! observes is what the runtime observes: duplicates, stale versions, refusals after the first
//! error, and whether a later transaction sees a row (inserting it again is a duplicate or
//! not); row counts in the tables are the store's own tests' business.
//!
//! The checks: inbox duplicates after commit, rollback and drop undo, consumers apart, business
//! keys, aggregate versions, a concurrent insert of one key, exact key comparison (case, width,
//! trailing spaces), the first-error rule and savepoints (issue 14), dead-letter verdicts
//! (issue 41).

use std::sync::Arc;

use crate::ports::{
    DuplicateScope, ErrorKind, InboxEntry, OutboxMessage, Savepoint, Store, StoreError, StoreTx,
    Tx, Verdict, VersionCheck,
};

/// A check the store failed: which one, and what it saw.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("conformance check {check} failed: {detail}")]
#[non_exhaustive]
pub struct Failure {
    /// The check's name (its function in this module).
    pub check: &'static str,
    /// What was expected and what the store did.
    pub detail: String,
}

/// The names of the checks [`run`] runs, in order.
pub const CHECKS: &[&str] = &[
    "inbox_insert_then_duplicate",
    "rollback_leaves_no_row",
    "dropped_tx_rolls_back",
    "consumers_are_independent",
    "business_key_duplicate",
    "versions_advance_and_detect_stale",
    "concurrent_insert_of_same_key_duplicates",
    "keys_compare_exactly",
    "a_failed_statement_refuses_the_rest_and_the_commit",
    "a_savepoint_tolerates_an_expected_error",
    "savepoints_nest_and_release",
    "a_released_savepoint_covers_nothing_after_it",
    "verdicts_conflict_read_and_are_taken_over",
];

/// Runs every check on `store` (migrated; the checks use fresh consumer names, so earlier rows
/// do not matter). Needs a multi-threaded tokio runtime: one check holds a transaction open
/// while another task's insert waits on it.
///
/// # Errors
/// The first [`Failure`].
pub async fn run<S: Store>(store: S) -> Result<(), Failure> {
    let store = Arc::new(store);
    let run = format!("conf-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let c = |check: &str| format!("{run}.{check}");
    inbox_insert_then_duplicate(&*store, &c("inbox")).await?;
    rollback_leaves_no_row(&*store, &c("rollback")).await?;
    dropped_tx_rolls_back(&*store, &c("dropped")).await?;
    consumers_are_independent(&*store, &c("apart")).await?;
    business_key_duplicate(&*store, &c("keys")).await?;
    versions_advance_and_detect_stale(&*store, &c("versions")).await?;
    concurrent_insert_of_same_key_duplicates(&store, &c("concurrent")).await?;
    keys_compare_exactly(&*store, &c("exact")).await?;
    a_failed_statement_refuses_the_rest_and_the_commit(&*store, &c("first-error")).await?;
    a_savepoint_tolerates_an_expected_error(&*store, &c("savepoint")).await?;
    savepoints_nest_and_release(&*store, &c("nest")).await?;
    a_released_savepoint_covers_nothing_after_it(&*store, &c("released")).await?;
    verdicts_conflict_read_and_are_taken_over(&*store, &c("verdicts")).await?;
    Ok(())
}

/// Fails `check` with `detail` unless `condition`.
fn ensure(
    check: &'static str,
    condition: bool,
    detail: impl FnOnce() -> String,
) -> Result<(), Failure> {
    if condition {
        Ok(())
    } else {
        Err(Failure {
            check,
            detail: detail(),
        })
    }
}

/// A store error where none was expected.
fn step<T>(check: &'static str, what: &str, result: Result<T, StoreError>) -> Result<T, Failure> {
    result.map_err(|error| Failure {
        check,
        detail: format!("{what}: {error}"),
    })
}

/// Expects a duplicate of `scope`, not refused.
fn duplicate<T: std::fmt::Debug>(
    check: &'static str,
    what: &str,
    result: Result<T, StoreError>,
    scope: DuplicateScope,
) -> Result<(), Failure> {
    match result {
        Err(error) if error.kind() == ErrorKind::Duplicate(scope) && !error.is_refused() => Ok(()),
        other => Err(Failure {
            check,
            detail: format!("{what}: expected a {scope:?} duplicate, got {other:?}"),
        }),
    }
}

/// Expects the refusal that follows a first error of kind `first`.
fn refused<T: std::fmt::Debug>(
    check: &'static str,
    what: &str,
    result: Result<T, StoreError>,
    first: ErrorKind,
) -> Result<(), Failure> {
    match result {
        Err(error) if error.is_refused() && error.kind() == first => Ok(()),
        other => Err(Failure {
            check,
            detail: format!("{what}: expected a refusal after a {first:?} error, got {other:?}"),
        }),
    }
}

/// Commits one inbox row in a transaction of its own.
async fn insert_committed<S: Store>(
    check: &'static str,
    store: &S,
    consumer: &str,
    id: &str,
) -> Result<(), Failure> {
    let mut tx = step(check, "begin", store.begin().await)?;
    step(
        check,
        &format!("insert {id}"),
        tx.insert_inbox(consumer, id).await,
    )?;
    step(check, "commit", tx.commit().await)
}

/// Whether the inbox row `(consumer, id)` is committed: inserting it again is a duplicate.
/// Leaves nothing behind (the probe rolls back).
async fn inbox_has<S: Store>(
    check: &'static str,
    store: &S,
    consumer: &str,
    id: &str,
) -> Result<bool, Failure> {
    let mut tx = step(check, "begin", store.begin().await)?;
    let result = tx.insert_inbox(consumer, id).await;
    step(check, "rollback", tx.rollback().await)?;
    match result {
        Ok(()) => Ok(false),
        Err(error) if error.kind() == ErrorKind::Duplicate(DuplicateScope::Inbox) => Ok(true),
        Err(error) => Err(Failure {
            check,
            detail: format!("probing inbox row {id}: {error}"),
        }),
    }
}

/// Whether the business key is claimed: claiming it again is a duplicate. Leaves nothing.
async fn key_claimed<S: Store>(
    check: &'static str,
    store: &S,
    consumer: &str,
    key: &str,
) -> Result<bool, Failure> {
    let mut tx = step(check, "begin", store.begin().await)?;
    let result = tx.claim_business_key(consumer, key, "probe").await;
    step(check, "rollback", tx.rollback().await)?;
    match result {
        Ok(()) => Ok(false),
        Err(error) if error.kind() == ErrorKind::Duplicate(DuplicateScope::BusinessKey) => Ok(true),
        Err(error) => Err(Failure {
            check,
            detail: format!("probing business key {key}: {error}"),
        }),
    }
}

/// The second insert of one key, after the first committed, is an inbox duplicate.
pub async fn inbox_insert_then_duplicate<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "inbox_insert_then_duplicate";
    insert_committed(CHECK, store, consumer, "m-1").await?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    duplicate(
        CHECK,
        "second insert",
        tx.insert_inbox(consumer, "m-1").await,
        DuplicateScope::Inbox,
    )?;
    step(CHECK, "rollback", tx.rollback().await)
}

/// A rolled-back insert leaves no row: the key inserts again and commits.
pub async fn rollback_leaves_no_row<S: Store>(store: &S, consumer: &str) -> Result<(), Failure> {
    const CHECK: &str = "rollback_leaves_no_row";
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    step(CHECK, "rollback", tx.rollback().await)?;
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, !present, || {
        "the rolled-back row is there".to_owned()
    })?;
    insert_committed(CHECK, store, consumer, "m-1").await?;
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, present, || "the committed row is missing".to_owned())
}

/// A transaction dropped without commit rolls back.
pub async fn dropped_tx_rolls_back<S: Store>(store: &S, consumer: &str) -> Result<(), Failure> {
    const CHECK: &str = "dropped_tx_rolls_back";
    {
        let mut tx = step(CHECK, "begin", store.begin().await)?;
        step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    }
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, !present, || {
        "the dropped transaction's row is there".to_owned()
    })
}

/// One message id under two consumer names is two rows.
pub async fn consumers_are_independent<S: Store>(store: &S, consumer: &str) -> Result<(), Failure> {
    const CHECK: &str = "consumers_are_independent";
    for name in [
        format!("{consumer}.billing"),
        format!("{consumer}.inventory"),
    ] {
        insert_committed(CHECK, store, &name, "m-1").await?;
    }
    Ok(())
}

/// A business key claimed once is a duplicate for the same consumer, free for another.
pub async fn business_key_duplicate<S: Store>(store: &S, consumer: &str) -> Result<(), Failure> {
    const CHECK: &str = "business_key_duplicate";
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(
        CHECK,
        "claim",
        tx.claim_business_key(consumer, "payment:7", "m-1").await,
    )?;
    step(CHECK, "commit", tx.commit().await)?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    duplicate(
        CHECK,
        "second claim",
        tx.claim_business_key(consumer, "payment:7", "m-2").await,
        DuplicateScope::BusinessKey,
    )?;
    step(CHECK, "rollback", tx.rollback().await)?;
    let other = format!("{consumer}.other");
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(
        CHECK,
        "claim by another consumer",
        tx.claim_business_key(&other, "payment:7", "m-2").await,
    )?;
    step(CHECK, "commit", tx.commit().await)
}

/// Versions advance when newer; the same or older is stale with the stored one; consumers
/// keep their own versions.
pub async fn versions_advance_and_detect_stale<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "versions_advance_and_detect_stale";
    let steps = [
        (1, VersionCheck::Advanced),
        (3, VersionCheck::Advanced),
        (2, VersionCheck::Stale { current: 3 }),
        (3, VersionCheck::Stale { current: 3 }),
        (4, VersionCheck::Advanced),
    ];
    for (version, expected) in steps {
        let mut tx = step(CHECK, "begin", store.begin().await)?;
        let got = step(
            CHECK,
            "advance",
            tx.advance_version(consumer, "order:1", version).await,
        )?;
        ensure(CHECK, got == expected, || {
            format!("v{version}: expected {expected:?}, got {got:?}")
        })?;
        step(CHECK, "commit", tx.commit().await)?;
    }
    let other = format!("{consumer}.other");
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    let got = step(
        CHECK,
        "advance",
        tx.advance_version(&other, "order:1", 1).await,
    )?;
    ensure(CHECK, got == VersionCheck::Advanced, || {
        format!("another consumer's v1: expected Advanced, got {got:?}")
    })?;
    step(CHECK, "commit", tx.commit().await)
}

/// Two transactions insert one key at once: the second fails as a duplicate once the first
/// commits (PostgreSQL and SQL Server make it wait on the key; SQLite queues the writer).
pub async fn concurrent_insert_of_same_key_duplicates<S: Store>(
    store: &Arc<S>,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "concurrent_insert_of_same_key_duplicates";
    let mut first = step(CHECK, "begin", store.begin().await)?;
    step(
        CHECK,
        "first insert",
        first.insert_inbox(consumer, "m-1").await,
    )?;
    let second_store = Arc::clone(store);
    let second_consumer = consumer.to_owned();
    let started = Arc::new(tokio::sync::Notify::new());
    let started_2 = Arc::clone(&started);
    let second = tokio::spawn(async move {
        started_2.notify_one();
        let mut tx = second_store.begin().await?;
        let result = tx.insert_inbox(&second_consumer, "m-1").await;
        // The outcome is `result`; a failed rollback of a failed insert changes nothing.
        let _ = tx.rollback().await;
        Ok::<_, StoreError>(result)
    });
    started.notified().await;
    tokio::task::yield_now().await;
    step(CHECK, "first commit", first.commit().await)?;
    let joined = second.await.map_err(|error| Failure {
        check: CHECK,
        detail: format!("the second transaction's task: {error}"),
    })?;
    let result = step(CHECK, "second begin", joined)?;
    duplicate(CHECK, "second insert", result, DuplicateScope::Inbox)
}

/// Keys that differ only in case, width or trailing spaces are different keys (issue 14,
/// finding 1: SQL Server's default collation made them duplicates, and the second message was
/// completed without its effect).
pub async fn keys_compare_exactly<S: Store>(store: &S, consumer: &str) -> Result<(), Failure> {
    const CHECK: &str = "keys_compare_exactly";
    // Latin capital A, lower-case, full-width A (U+FF21), trailing space, accented.
    let variants = [
        "Order-A",
        "order-a",
        "\u{ff21}rder-A",
        "Order-A ",
        "Ordér-A",
    ];
    for id in variants {
        let mut tx = step(CHECK, "begin", store.begin().await)?;
        step(
            CHECK,
            &format!("insert {id:?}"),
            tx.insert_inbox(consumer, id).await,
        )?;
        step(
            CHECK,
            &format!("claim {id:?}"),
            tx.claim_business_key(consumer, id, id).await,
        )?;
        let got = step(
            CHECK,
            &format!("advance {id:?}"),
            tx.advance_version(consumer, id, 5).await,
        )?;
        ensure(CHECK, got == VersionCheck::Advanced, || {
            format!("{id:?}: got {got:?}")
        })?;
        let mut message = OutboxMessage::new("d", "s.v1", Vec::new());
        message.message_id = format!("{consumer}:{id}");
        step(
            CHECK,
            &format!("outbox {id:?}"),
            tx.append_outbox(&message).await,
        )?;
        step(CHECK, "commit", tx.commit().await)?;
    }
    // Each stored key still recognises its own exact repeat, and versions stay apart.
    for id in variants {
        let present = inbox_has(CHECK, store, consumer, id).await?;
        ensure(CHECK, present, || format!("{id:?}: no inbox row"))?;
        let mut tx = step(CHECK, "begin", store.begin().await)?;
        let got = step(CHECK, "advance", tx.advance_version(consumer, id, 5).await)?;
        ensure(CHECK, got == (VersionCheck::Stale { current: 5 }), || {
            format!("{id:?}: expected stale at 5, got {got:?}")
        })?;
        step(CHECK, "commit", tx.commit().await)?;
    }
    Ok(())
}

/// A business key claimed by an earlier, committed transaction.
async fn claimed<S: Store>(
    check: &'static str,
    store: &S,
    consumer: &str,
    key: &str,
) -> Result<(), Failure> {
    let mut tx = step(check, "begin", store.begin().await)?;
    step(
        check,
        "claim",
        tx.claim_business_key(consumer, key, "m-0").await,
    )?;
    step(check, "commit", tx.commit().await)
}

/// After a failed statement every later statement, savepoint and the commit are refused with
/// the first error's kind, and nothing commits; the store is usable afterwards.
pub async fn a_failed_statement_refuses_the_rest_and_the_commit<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "a_failed_statement_refuses_the_rest_and_the_commit";
    let dup = ErrorKind::Duplicate(DuplicateScope::BusinessKey);
    claimed(CHECK, store, consumer, "k").await?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    duplicate(
        CHECK,
        "claim of a claimed key",
        tx.claim_business_key(consumer, "k", "m-1").await,
        DuplicateScope::BusinessKey,
    )?;
    let message = OutboxMessage::new("d", "s.v1", b"{}".to_vec());
    refused(
        CHECK,
        "outbox after the failure",
        tx.append_outbox(&message).await,
        dup,
    )?;
    refused(
        CHECK,
        "insert after the failure",
        tx.insert_inbox(consumer, "m-2").await,
        dup,
    )?;
    match tx.savepoint().await {
        Err(error) if error.is_refused() => {}
        other => {
            return Err(Failure {
                check: CHECK,
                detail: format!("savepoint after the failure: expected a refusal, got {other:?}"),
            });
        }
    }
    refused(CHECK, "commit after the failure", tx.commit().await, dup)?;
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, !present, || {
        "the refused transaction committed its inbox row".to_owned()
    })?;
    insert_committed(CHECK, store, consumer, "m-1").await
}

/// Insert, and on a unique violation go another way: the documented savepoint pattern.
pub async fn a_savepoint_tolerates_an_expected_error<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "a_savepoint_tolerates_an_expected_error";
    claimed(CHECK, store, consumer, "k").await?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    let savepoint = step(CHECK, "savepoint", tx.savepoint().await)?;
    duplicate(
        CHECK,
        "claim of a claimed key",
        tx.claim_business_key(consumer, "k", "m-1").await,
        DuplicateScope::BusinessKey,
    )?;
    step(
        CHECK,
        "rollback to the savepoint",
        tx.rollback_to(savepoint).await,
    )?;
    step(
        CHECK,
        "claim after the savepoint",
        tx.claim_business_key(consumer, "k-2", "m-1").await,
    )?;
    step(
        CHECK,
        "outbox",
        tx.append_outbox(&OutboxMessage::new("d", "s.v1", b"{}".to_vec()))
            .await,
    )?;
    step(CHECK, "commit", tx.commit().await)?;
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, present, || "the inbox row did not commit".to_owned())?;
    let claimed = key_claimed(CHECK, store, consumer, "k-2").await?;
    ensure(CHECK, claimed, || "k-2 did not commit".to_owned())
}

/// Savepoints nest, get fresh names, and a released one keeps its work (the per-message
/// savepoints of a batched transaction).
pub async fn savepoints_nest_and_release<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "savepoints_nest_and_release";
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    for key in ["k-1", "k-2"] {
        let savepoint = step(CHECK, "savepoint", tx.savepoint().await)?;
        step(
            CHECK,
            "claim",
            tx.claim_business_key(consumer, key, "m-1").await,
        )?;
        step(CHECK, "release", tx.release(savepoint).await)?;
    }
    let outer = step(CHECK, "outer savepoint", tx.savepoint().await)?;
    step(
        CHECK,
        "claim k-3",
        tx.claim_business_key(consumer, "k-3", "m-1").await,
    )?;
    let inner = step(CHECK, "inner savepoint", tx.savepoint().await)?;
    let inner_id = inner.id();
    step(
        CHECK,
        "claim k-4",
        tx.claim_business_key(consumer, "k-4", "m-1").await,
    )?;
    duplicate(
        CHECK,
        "claim k-1 again",
        tx.claim_business_key(consumer, "k-1", "m-1").await,
        DuplicateScope::BusinessKey,
    )?;
    // Rolling back to the outer savepoint undoes k-3 and k-4 and ends the inner one.
    step(
        CHECK,
        "rollback to the outer savepoint",
        tx.rollback_to(outer).await,
    )?;
    match tx.rollback_to(Savepoint::new(inner_id)).await {
        Err(error) if error.kind() == ErrorKind::Schema => {}
        other => {
            return Err(Failure {
                check: CHECK,
                detail: format!(
                    "rollback to an ended savepoint: expected a Schema error, got {other:?}"
                ),
            });
        }
    }
    let last = step(CHECK, "last savepoint", tx.savepoint().await)?;
    ensure(CHECK, last.id() > inner_id, || {
        "a savepoint number was reused".to_owned()
    })?;
    step(
        CHECK,
        "claim k-5",
        tx.claim_business_key(consumer, "k-5", "m-1").await,
    )?;
    step(CHECK, "release", tx.release(last).await)?;
    step(CHECK, "commit", tx.commit().await)?;
    for (key, kept) in [
        ("k-1", true),
        ("k-2", true),
        ("k-3", false),
        ("k-4", false),
        ("k-5", true),
    ] {
        let claimed = key_claimed(CHECK, store, consumer, key).await?;
        ensure(CHECK, claimed == kept, || {
            format!("{key}: committed {claimed}, expected {kept}")
        })?;
    }
    Ok(())
}

/// A failure after a released savepoint is not covered by it: refused as any other.
pub async fn a_released_savepoint_covers_nothing_after_it<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "a_released_savepoint_covers_nothing_after_it";
    claimed(CHECK, store, consumer, "k").await?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    let savepoint = step(CHECK, "savepoint", tx.savepoint().await)?;
    step(
        CHECK,
        "claim k-1",
        tx.claim_business_key(consumer, "k-1", "m-1").await,
    )?;
    step(CHECK, "release", tx.release(savepoint).await)?;
    duplicate(
        CHECK,
        "claim of a claimed key",
        tx.claim_business_key(consumer, "k", "m-1").await,
        DuplicateScope::BusinessKey,
    )?;
    refused(
        CHECK,
        "commit",
        tx.commit().await,
        ErrorKind::Duplicate(DuplicateScope::BusinessKey),
    )?;
    let present = inbox_has(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, !present, || {
        "the refused transaction committed".to_owned()
    })
}

/// The message's inbox row as [`StoreTx::inbox_entry`] reads it, in a transaction rolled back.
async fn entry<S: Store>(
    check: &'static str,
    store: &S,
    consumer: &str,
    id: &str,
) -> Result<Option<InboxEntry>, Failure> {
    let mut tx = step(check, "begin", store.begin().await)?;
    let entry = tx.inbox_entry(consumer, id).await;
    step(check, "rollback", tx.rollback().await)?;
    step(check, &format!("read inbox row {id}"), entry)
}

/// Dead-letter verdicts (issue 41): a verdict is the message's inbox row, so it conflicts
/// with a processing insert and with another verdict; it reads back as written, a processed
/// row reads as processed and a missing one as none; a later resubmission takes a verdict over
/// (only in a transaction that commits), an equal one does not, and a processed row is never
/// taken.
pub async fn verdicts_conflict_read_and_are_taken_over<S: Store>(
    store: &S,
    consumer: &str,
) -> Result<(), Failure> {
    const CHECK: &str = "verdicts_conflict_read_and_are_taken_over";
    let verdict = Verdict {
        reason: "RetriesExhausted".to_owned(),
        resubmission: 1,
    };
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(
        CHECK,
        "insert verdict",
        tx.insert_verdict(consumer, "m-1", &verdict).await,
    )?;
    step(CHECK, "commit", tx.commit().await)?;
    ensure(
        CHECK,
        inbox_has(CHECK, store, consumer, "m-1").await?,
        || "a processing insert did not meet the verdict".to_owned(),
    )?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    let again = tx.insert_verdict(consumer, "m-1", &verdict).await;
    duplicate(CHECK, "second verdict", again, DuplicateScope::Inbox)?;
    step(CHECK, "rollback", tx.rollback().await)?;
    let read = entry(CHECK, store, consumer, "m-1").await?;
    ensure(
        CHECK,
        read == Some(InboxEntry::DeadLettered(verdict.clone())),
        || format!("verdict read back as {read:?}"),
    )?;
    insert_committed(CHECK, store, consumer, "m-2").await?;
    let read = entry(CHECK, store, consumer, "m-2").await?;
    ensure(CHECK, read == Some(InboxEntry::Processed), || {
        format!("processed row read as {read:?}")
    })?;
    let read = entry(CHECK, store, consumer, "m-3").await?;
    ensure(CHECK, read.is_none(), || {
        format!("missing row read as {read:?}")
    })?;
    // Taking over: not by the resubmission that decided, not a processed row, not when
    // rolled back; then by a later resubmission, whose processing insert goes through.
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    let same = step(
        CHECK,
        "take over",
        tx.take_over_verdict(consumer, "m-1", 1).await,
    )?;
    let processed = step(
        CHECK,
        "take over",
        tx.take_over_verdict(consumer, "m-2", 9).await,
    )?;
    let later = step(
        CHECK,
        "take over",
        tx.take_over_verdict(consumer, "m-1", 2).await,
    )?;
    step(CHECK, "rollback", tx.rollback().await)?;
    ensure(CHECK, !same && !processed && later, || {
        format!("take-overs: same resubmission {same}, processed row {processed}, later {later}")
    })?;
    ensure(
        CHECK,
        inbox_has(CHECK, store, consumer, "m-2").await?,
        || "a take-over deleted a processed row".to_owned(),
    )?;
    let mut tx = step(CHECK, "begin", store.begin().await)?;
    step(
        CHECK,
        "take over",
        tx.take_over_verdict(consumer, "m-1", 2).await,
    )?;
    step(CHECK, "insert", tx.insert_inbox(consumer, "m-1").await)?;
    step(CHECK, "commit", tx.commit().await)?;
    let read = entry(CHECK, store, consumer, "m-1").await?;
    ensure(CHECK, read == Some(InboxEntry::Processed), || {
        format!("after the take-over the row reads {read:?}")
    })
}

#[cfg(test)]
mod tests {
    /// The suite on SQLite in process (the integration tests run it on every store).
    #[cfg(feature = "sqlite")]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_conforms() {
        let store = match crate::store::SqliteStore::open_in_memory() {
            Ok(store) => store,
            Err(error) => panic!("open: {error}"),
        };
        if let Err(error) = store.migrate().await {
            panic!("migrate: {error}");
        }
        if let Err(failure) = super::run(store).await {
            panic!("{failure}");
        }
    }
}
