//! Batched transactions ([`super::RuntimeConfig::batch_size`] above 1): up to N deliveries in one
//! database transaction, each inside its own savepoint, then one commit and every settlement.
//!
//! # Algorithm
//! 1. A batch takes one of `concurrency` handling slots, then its first delivery and what is
//!    queued behind it, up to `batch_size`. While another slot is free it starts at once: the
//!    database has room, and a delivery arriving later starts in that slot. Only a batch holding
//!    the last free slot lingers for more, until it holds `batch_size`, `batch_linger` passed
//!    since its first delivery, or another slot frees (PostgreSQL's group commit has the rule:
//!    `commit_delay` waits only while `commit_siblings` transactions are active). Under a
//!    backlog a batch's worth is already queued, so every batch starts full at once. Every
//!    lock is kept from receipt until that delivery's settlement is answered.
//! 2. Envelope and decode failures are dead-lettered without touching the transaction.
//! 3. One transaction; for each delivery in turn: `SAVEPOINT`, inbox row, handler. On success
//!    the savepoint is released ([`Tx::release`]; PostgreSQL and SQLite fold the `RELEASE` into
//!    the next `SAVEPOINT`), so a batch holds one open savepoint at a time, not one per delivery;
//!    on a failure (a duplicate, a permanent or a transient error, also one the handler
//!    swallowed: the release is refused then) `ROLLBACK TO` its savepoint undoes that delivery
//!    alone and forgets the error (the transaction's first-error rule is scoped to the
//!    savepoint), and its verdict waits for the commit. So a failure has one rule wherever the
//!    delivery stands in the batch.
//! 4. Every delivery after the transaction's first waits at most [`LOCK_WAIT_BOUND`] for a row
//!    lock another transaction holds ([`StoreTx::bound_lock_waits`](crate::StoreTx::bound_lock_waits)); one that meets such a lock
//!    gives way: `ROLLBACK TO` its savepoint, and it runs again, first, in the batch's next
//!    transaction. So two batches that each hold what the other needs part at once instead of
//!    waiting for the database's deadlock detection, and a first delivery, which may wait,
//!    holds nothing else. On SQL Server the bound is a session `SET LOCK_TIMEOUT` sent as a
//!    plain batch (in `sp_executesql` it would end with its own statement), and a rollback to a
//!    savepoint keeps escalated and converted locks: giving way there releases the rows a
//!    delivery inserted or locked fresh, not a lock it escalated or converted, which the
//!    batch holds until its commit (the database's deadlock detection settles what remains).
//! 5. Fence, just before the commit: a delivery whose lock is lost is taken out by rolling the
//!    whole transaction back (its savepoint is released); the others run again in the batch's
//!    next transaction (a verdict can depend on an earlier delivery of the batch: the second
//!    copy of a message is a duplicate only while the first stays in). Rare, and the price of
//!    one open savepoint at a time.
//!
//! PostgreSQL keeps the ids of a transaction's subtransactions that took an XID in a
//! per-backend cache of 64 (`PGPROC_MAX_CACHED_SUBXIDS`); past it every snapshot of the
//! cluster has to consult `pg_subtrans`. A rolled-back subtransaction leaves the cache; a
//! released one only leaves it with its top-level transaction. Releasing bounds the nesting
//! (one `ROLLBACK TO` walks one level, and each level's resources are freed at once), not that
//! count: a batch whose committed deliveries (plus the savepoints handlers open themselves)
//! exceed 64 still overflows the cache, so keep `batch_size` at or below 64 on PostgreSQL.
//! 6. One commit; the deliveries it decided keep their verdicts whatever becomes of the batch's
//!    later transactions. Once none is left to run again, every settlement at once, each as the
//!    unbatched runtime settles it: processed, stale and duplicates complete; permanent
//!    failures are dead-lettered; transient failures are abandoned (or retried later); lost
//!    locks are left to redelivery.
//!    The batch's handling slot and its members' places in what the runtime holds are freed
//!    before the settlements, when its transactions ended: the next batch runs while these are
//!    answered. Settlements in flight are bounded apart (twice what the runtime holds), each
//!    member taking its place there before its batch starts.
//!
//! A statement that ends the whole transaction (a rollback to a savepoint that fails, as after a
//! deadlock on SQL Server, or a broken connection) takes only that delivery out: it gets its
//! own verdict and the rest of the batch runs again in a new transaction. A failed `BEGIN` or
//! `COMMIT` or a batch past `max_processing` runs the undecided deliveries again one per
//! transaction (`isolate`), so only the culprit fails; a systemic failure (the kill switch's
//! business) or a shutdown past its grace abandons what the batch has not committed yet, and
//! even a duplicate seen inside it is re-judged on redelivery.
//!
//! # What batching trades
//! One commit (and its log flush) serves the whole batch, which is where the throughput comes
//! from. In exchange a delivery waits for the batch's other handlers before it is committed and
//! settled, and, only while every other slot runs a batch, up to the linger before its batch
//! starts (with a slot free it never lingers, so at low rates a batch is what was queued, often
//! one delivery, and costs no latency); one commit failure re-runs every undecided delivery of
//! the batch one by one (a systemic one abandons them all, and each delivery attempt counts
//! against the entity's max delivery count); the locks a batch takes are held until its commit,
//! so hot rows serialise longer; and a lost lock of an early delivery re-runs the handlers after
//! it. A lost lock does not cancel a running handler (the shared transaction cannot be dropped
//! for one delivery): the fence removes it before commit.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

mod isolate;

use super::circuit::Slot;
use super::lock_keeper::KeptLock;
use super::observe::Processing;
use super::process::{Abort, Processor, outcome_of};
use super::{Backoff, Handled, Handler, Inner, Outcome, Report, RuntimeError};
use crate::ports::{Delivery, Receiver, Savepoint, Store, StoreError, StoreTx, Tx};

/// A received delivery with its kept lock, its `held` slot and when it was received, waiting
/// for a batch.
type Queued<D> = (Arc<D>, KeptLock, Slot, Instant);

/// Receives into batches and runs them until `shutdown`, then drains, as
/// [`super::Runtime::run`] does one delivery at a time.
pub(super) async fn run<R, S, H>(
    inner: &Arc<Inner<R, S, H>>,
    shutdown: CancellationToken,
) -> Result<(), RuntimeError>
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
{
    let config = &inner.config;
    tracing::info!(
        batch_size = config.batch_size,
        batch_linger_ms = config.batch_linger.as_millis(),
        "Batched transactions: up to batch_size deliveries per transaction."
    );
    let held = Arc::new(Semaphore::new(config.held()));
    let _probing = inner.probing();
    let tracker = TaskTracker::new();
    let abort = CancellationToken::new();
    let (queue, incoming) = mpsc::unbounded_channel();
    tracker.spawn(batches(
        inner.clone(),
        incoming,
        tracker.clone(),
        shutdown.clone(),
        abort.clone(),
    ));
    let mut backoff = Backoff::from_jitter(
        Duration::from_millis(100),
        Duration::from_secs(30),
        &inner.config.jitter,
    );
    let result = loop {
        let (delivery, slot) = match inner.next_delivery(&held, &shutdown, &mut backoff).await {
            Ok(Some(next)) => next,
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        };
        let delivery = Arc::new(delivery);
        // Kept from receipt: a delivery waiting for its batch must not expire there.
        let lock = inner.processor().keeper.keep(delivery.clone());
        if queue.send((delivery, lock, slot, Instant::now())).is_err() {
            // The batcher ends only after shutdown.
            break Ok(());
        }
    };
    drop(queue);
    inner.drain(&tracker, &abort).await;
    result
}

/// Forms batches from `incoming` (the first delivery and what is queued behind it, lingering
/// for more only in the last free handling slot: [`next_batch`]), each once a handling slot is
/// free, and runs each in its own task. On shutdown, deliveries not started are given back.
async fn batches<R, S, H>(
    inner: Arc<Inner<R, S, H>>,
    mut incoming: mpsc::UnboundedReceiver<Queued<R::Delivery>>,
    tracker: TaskTracker,
    stopping: CancellationToken,
    abort: CancellationToken,
) where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
{
    let handling = Arc::new(Semaphore::new(inner.config.concurrency));
    // A batch frees its handling slot and its members' places in what the runtime holds once
    // its transactions ended; from then until its settlement is answered each member counts
    // here instead, so that a slow broker cannot pile up settlements (issue 42), as unbatched.
    let settling = Arc::new(Semaphore::new(
        inner.config.held().saturating_mul(super::SETTLING_FACTOR),
    ));
    let (size, linger) = (inner.config.batch_size, inner.config.batch_linger);
    while let Some((permit, batch)) =
        next_batch(&handling, &mut incoming, &stopping, size, linger).await
    {
        let batch = hold_back(&inner, batch).await;
        if batch.is_empty() {
            continue;
        }
        let (inner, abort, settling) = (inner.clone(), abort.clone(), settling.clone());
        let stopping = stopping.clone();
        tracker.spawn(start(inner, batch, permit, settling, stopping, abort));
    }
    incoming.close();
    while let Some(queued) = incoming.recv().await {
        give_back(&inner, queued).await;
    }
}

/// Takes a handling slot, then the batch's first delivery and whatever is queued behind it (up
/// to `size`). Only when that slot was the last free one does the batch linger for more: until
/// it holds `size`, `linger` passed since the first, or another slot frees. `None` once
/// stopping, or when the queue closed.
async fn next_batch<D>(
    handling: &Arc<Semaphore>,
    incoming: &mut mpsc::UnboundedReceiver<Queued<D>>,
    stopping: &CancellationToken,
    size: usize,
    linger: Duration,
) -> Option<(OwnedSemaphorePermit, Vec<Queued<D>>)> {
    let permit = tokio::select! {
        // Biased: once shutting down, nothing new starts.
        biased;
        () = stopping.cancelled() => None,
        permit = handling.clone().acquire_owned() => permit.ok(),
    }?;
    let first = tokio::select! {
        biased;
        () = stopping.cancelled() => None,
        first = incoming.recv() => first,
    }?;
    let mut batch = vec![first];
    while batch.len() < size {
        match incoming.try_recv() {
            Ok(next) => batch.push(next),
            Err(_) => break,
        }
    }
    // Group commit's rule (PostgreSQL's `commit_delay` waits only with `commit_siblings`
    // transactions active): while another slot is free the database has room, and a delivery
    // arriving later starts there at once, so waiting here would only delay this batch. With
    // every other slot busy, what arrives would wait for a slot anyway: better in this commit.
    if batch.len() < size && handling.available_permits() == 0 {
        linger_for_more(handling, incoming, &mut batch, size, linger).await;
    }
    Some((permit, batch))
}

/// Adds to `batch` what arrives until it holds `size`, `linger` passed, or another handling
/// slot frees. The last is checked all along, not only when the linger began: the rule holds
/// for the whole wait, and once a slot frees the next delivery can start there at once, so
/// lingering further would delay this batch for nothing (one more `select!` arm, no state).
async fn linger_for_more<D>(
    handling: &Semaphore,
    incoming: &mut mpsc::UnboundedReceiver<Queued<D>>,
    batch: &mut Vec<Queued<D>>,
    size: usize,
    linger: Duration,
) {
    let closes = Instant::now() + linger;
    while batch.len() < size {
        tokio::select! {
            next = incoming.recv() => match next {
                Some(next) => batch.push(next),
                None => break,
            },
            // Only the batcher takes handling slots, one batch at a time, so nothing else waits
            // for the one that freed: it is given straight back (dropped) for the next batch.
            _freed = handling.acquire() => break,
            () = tokio::time::sleep_until(closes) => break,
        }
    }
}

/// Gives back the members the kill switch paused while the batch formed (what has not started
/// is released); the rest go on.
async fn hold_back<R, S, H, D: Delivery>(
    inner: &Inner<R, S, H>,
    batch: Vec<Queued<D>>,
) -> Vec<Queued<D>> {
    let (held_back, batch): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .partition(|(_, _, slot, _)| inner.circuit.holds_back(&slot.ticket));
    for queued in held_back {
        give_back(inner, queued).await;
    }
    batch
}

/// Starts a formed batch in its own task: once each member has its place among settlements in
/// flight, admits the members whose lock is still held and handles them as one batch.
async fn start<R, S, H>(
    inner: Arc<Inner<R, S, H>>,
    batch: Vec<Queued<R::Delivery>>,
    permit: OwnedSemaphorePermit,
    settling: Arc<Semaphore>,
    stopping: CancellationToken,
    abort: CancellationToken,
) where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
{
    // A batch never holds more members than the runtime holds, half the bound: these
    // places always come once earlier settlements are answered.
    let places = tokio::select! {
        biased;
        () = stopping.cancelled() => None,
        places = settlement_places(&settling, batch.len()) => places,
    };
    let Some(places) = places else {
        for queued in batch {
            give_back(&inner, queued).await;
        }
        return;
    };
    let (slots, members) = admit(&inner, batch, places).await;
    if members.is_empty() {
        return;
    }
    // The slot watch covers the settlements too (one that never returns is stuck).
    let _busy = inner.slots.enter();
    // All three end with the batch's transactions: its handling slot, its places held
    // and its busy time in the phase trace.
    let freed = (permit, slots, inner.phases.busy());
    handle(&inner, members, &abort, freed).await;
}

/// A batch member as [`handle`] takes it: what it holds until its settlement is answered is its
/// `held` slot (its ticket, once the permit is taken) and its place among settlements.
type Admitted<D> = (Arc<D>, KeptLock, (Slot, OwnedSemaphorePermit));

/// Admits the members whose lock is still held, each with its place; returns their `held`
/// permits (freed once the batch's transactions ended) and the members.
async fn admit<R, S, H, D: Delivery>(
    inner: &Inner<R, S, H>,
    batch: Vec<Queued<D>>,
    places: Vec<OwnedSemaphorePermit>,
) -> (Vec<Option<OwnedSemaphorePermit>>, Vec<Admitted<D>>) {
    let mut slots = Vec::with_capacity(batch.len());
    let mut members = Vec::with_capacity(batch.len());
    for ((delivery, lock, mut slot, received_at), place) in batch.into_iter().zip(places) {
        // A lock that ran out while it waited for its batch is given back, never
        // handled late: its redelivery may already be in another instance's hands.
        if lock.is_held() {
            // Queued from receipt until its batch starts: the linger and the wait for a
            // handling slot, as the unbatched trace's queue.
            inner
                .phases
                .record(super::phases::Phase::Queued, received_at.elapsed());
            slots.push(slot.take_permit());
            members.push((delivery, lock, (slot, place)));
        } else {
            give_back(inner, (delivery, lock, slot, received_at)).await;
        }
    }
    (slots, members)
}

/// One place among settlements in flight for each of `n` members; `None` once the semaphore is
/// closed (only when the runtime is dropped mid-run).
async fn settlement_places(
    settling: &Arc<Semaphore>,
    n: usize,
) -> Option<Vec<OwnedSemaphorePermit>> {
    let mut places = Vec::with_capacity(n);
    for _ in 0..n {
        places.push(settling.clone().acquire_owned().await.ok()?);
    }
    Some(places)
}

/// Releases a queued delivery that never started, then stops keeping its lock.
async fn give_back<R, S, H, D: Delivery>(inner: &Inner<R, S, H>, queued: Queued<D>) {
    let (delivery, lock, slot, _) = queued;
    inner.give_back_queued(&*delivery, lock).await;
    drop(slot);
}

/// How long a delivery after the first of a batch transaction waits for a row lock another
/// transaction holds before it gives way. As short as the databases allow: the holder is
/// usually another batch that commits only after all its handlers ran, and waiting both ways
/// is a deadlock the database sees only after its own timeout (PostgreSQL's
/// `deadlock_timeout`, 1 s). Measured on the wide workload at concurrency 8 with batches of 64
/// (benches/throughput.rs): 10 ms gave 0.49 of the per-transaction ceiling, 1 ms 0.86.
const LOCK_WAIT_BOUND: Duration = Duration::from_millis(1);

/// Where one delivery of a batch stands in the current transaction.
enum State {
    /// Not handled in this transaction yet.
    Pending,
    /// Its work is in the transaction (its savepoint released).
    Kept(Handled),
    /// Rolled back to its savepoint; the verdict holds if the transaction commits.
    Undone(Result<Outcome, Abort>),
    /// Rolled back to its savepoint because it met a row lock held by another transaction
    /// (its wait was bounded): it runs again, first, in the batch's next transaction.
    GaveWay,
    /// The verdict holds whatever becomes of the rest of the batch: its transaction committed,
    /// or it is out of the batch (lock lost, or its statement ended a transaction).
    Decided(Result<Outcome, Abort>),
}

impl State {
    /// Back to pending when the work it stood on is undone.
    fn reset(&mut self) {
        if matches!(self, State::Kept(..) | State::Undone(_) | State::GaveWay) {
            *self = State::Pending;
        }
    }

    /// Final once its transaction committed.
    fn commit(&mut self) {
        match std::mem::replace(self, State::Pending) {
            State::Kept(handled) => *self = State::Decided(Ok(outcome_of(handled))),
            State::Undone(verdict) => *self = State::Decided(verdict),
            other => *self = other,
        }
    }

    /// Whether it has run in the current transaction.
    fn ran(&self) -> bool {
        matches!(self, State::Kept(..) | State::Undone(_) | State::GaveWay)
    }
}

/// One delivery of a batch.
struct Member<D> {
    delivery: Arc<D>,
    lock: KeptLock,
    processing: Processing,
    /// The logical message id; `None` when the envelope was refused.
    logical_id: Option<String>,
    state: State,
}

/// Why a whole batch is abandoned.
enum Whole {
    /// The transaction failed, not for one member's statement; `true` when the failure is
    /// systemic (every transaction would fail alike).
    Failed(String, bool),
    /// Past `max_processing`: the transient failure [`Processor::too_long`] describes.
    TooLong(Abort),
    Shutdown,
}

impl Whole {
    fn store(error: &StoreError) -> Self {
        tracing::warn!(%error, "Batch transaction failed.");
        Whole::Failed(
            format!("batch transaction failed: {}", error.redacted()),
            error.kind().is_systemic(),
        )
    }

    fn abort(&self) -> Abort {
        match self {
            // Not a member's failure: given back per the kill switch, never a delayed retry.
            Whole::Failed(why, true) => Abort::Systemic(why.clone()),
            Whole::Failed(why, false) => Abort::SettleAs(Outcome::Transient, why.clone()),
            Whole::TooLong(Abort::SettleAs(outcome, why)) => Abort::SettleAs(*outcome, why.clone()),
            Whole::TooLong(_) | Whole::Shutdown => Abort::Shutdown,
        }
    }
}

/// Handles `members` as one batch, settles each and records it in the stats; the reports are
/// in the order of `members`. `freed` is dropped as soon as the batch's transactions ended
/// (committed or rolled back), before the settlements, and each member's `P` once its
/// settlement is answered: the settlements' broker round trip then overlaps the next batch's
/// transaction instead of holding the batch's slots idle (issue 42).
pub(super) async fn handle<R, S, H, D, P, F>(
    inner: &Arc<Inner<R, S, H>>,
    members: Vec<(Arc<D>, KeptLock, P)>,
    cancel: &CancellationToken,
    freed: F,
) -> Vec<Report>
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
    P: Send + 'static,
{
    let step = inner.processor();
    step.observer.batch(members.len());
    let (mut members, held_until_settled) = take(&step, members);
    let started = Instant::now();
    let ended = decide(&step, &mut members, cancel).await;
    drop(freed);
    // The batch's transactions, once per batch; each member's settlement from here to its
    // answer (the phase trace of issue 42, as unbatched).
    let transactions_ended = Instant::now();
    inner.phases.record(
        super::phases::Phase::Transaction,
        transactions_ended - started,
    );
    settle_all(
        inner,
        members,
        held_until_settled,
        &ended,
        cancel,
        transactions_ended,
    )
    .await
}

/// Takes each delivery into the batch: opens its process span and accepts its envelope (a
/// refused one is decided alone at once). Returns the members and, in the same order, what each
/// holds until its settlement is answered.
fn take<S, H, D, P>(
    step: &Processor<'_, S, H>,
    members: Vec<(Arc<D>, KeptLock, P)>,
) -> (Vec<Member<D>>, Vec<P>)
where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let mut held_until_settled = Vec::with_capacity(members.len());
    let members = members
        .into_iter()
        .map(|(delivery, lock, place)| {
            held_until_settled.push(place);
            let processing = step.observer.start(&*delivery);
            lock.follow(&processing.span);
            let (logical_id, state) = match step.accept(&*delivery) {
                Ok((envelope, _)) => (Some(envelope.logical_id), State::Pending),
                // Refused or panicked: decided alone, the others go on (under its logical id
                // when the envelope was read: a decoder's panic counted out is a verdict).
                Err(refused) => (
                    Some(refused.logical_id).filter(|id| !id.is_empty()),
                    State::Decided(Err(refused.abort)),
                ),
            };
            Member {
                delivery,
                lock,
                processing,
                logical_id,
                state,
            }
        })
        .collect();
    (members, held_until_settled)
}

/// Runs the batch's transactions within `max_processing` and until `cancel`. A failure the
/// batch cannot pin on one member runs each undecided member again alone
/// ([`isolate::one_by_one`]), so only the culprit fails.
async fn decide<S, H, D>(
    step: &Processor<'_, S, H>,
    members: &mut [Member<D>],
    cancel: &CancellationToken,
) -> Result<(), Whole>
where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let ended = tokio::select! {
        biased;
        () = cancel.cancelled() => Err(Whole::Shutdown),
        () = tokio::time::sleep(step.max_processing) => Err(Whole::TooLong(step.too_long())),
        ended = step.observer.transaction(transact(step, members)) => ended,
    };
    // One member's fault the batch could not pin on it: each runs again alone.
    match ended {
        Err(Whole::Failed(_, false)) if !cancel.is_cancelled() => {
            isolate::one_by_one(step, members, None, cancel).await;
            Ok(())
        }
        Err(Whole::TooLong(_)) if !cancel.is_cancelled() => {
            // The member that was running when the bound passed (the pending one the batch's
            // pass had reached: members run in order) is the likely culprit.
            let running = members
                .iter()
                .position(|m| matches!(m.state, State::Pending));
            isolate::one_by_one(step, members, running, cancel).await;
            Ok(())
        }
        ended => ended,
    }
}

/// Every settlement at once, each in its own process span; the reports in the order of
/// `members`. `ended` is how the batch's transactions ended (`Err` when it was abandoned as a
/// whole), at `transactions_ended`. Each member's `P` is dropped once its settlement is answered.
async fn settle_all<R, S, H, D, P>(
    inner: &Arc<Inner<R, S, H>>,
    members: Vec<Member<D>>,
    held_until_settled: Vec<P>,
    ended: &Result<(), Whole>,
    cancel: &CancellationToken,
    transactions_ended: Instant,
) -> Vec<Report>
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
    P: Send + 'static,
{
    let mut settling = tokio::task::JoinSet::new();
    for ((index, mut member), place) in members.into_iter().enumerate().zip(held_until_settled) {
        let state = std::mem::replace(&mut member.state, State::Pending);
        let verdict = verdict_of(state, ended);
        let (inner, cancel) = (inner.clone(), cancel.clone());
        settling.spawn(async move {
            let report = settle(&inner, member, verdict, &cancel, transactions_ended).await;
            drop(place);
            (index, report)
        });
    }
    let mut reports: Vec<(usize, Report)> = settling.join_all().await.into_iter().collect();
    reports.sort_by_key(|(index, _)| *index);
    reports.into_iter().map(|(_, report)| report).collect()
}

/// A member's verdict once the batch's transactions ended: its own if it was decided, else the
/// whole batch's.
fn verdict_of(state: State, ended: &Result<(), Whole>) -> Result<Outcome, Abort> {
    match (state, ended) {
        (State::Decided(verdict), _) => verdict,
        (_, Err(whole)) => Err(whole.abort()),
        // A committed batch has decided every member.
        (_, Ok(())) => Err(Abort::SettleAs(
            Outcome::Transient,
            "not handled in its batch".to_owned(),
        )),
    }
}

/// Settles one member with `verdict` in its process span, then stops keeping its lock, closes
/// its span and records it in the stats.
async fn settle<R, S, H, D>(
    inner: &Arc<Inner<R, S, H>>,
    member: Member<D>,
    verdict: Result<Outcome, Abort>,
    cancel: &CancellationToken,
    transactions_ended: Instant,
) -> Report
where
    R: Receiver,
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let Member {
        delivery,
        lock,
        processing,
        logical_id,
        ..
    } = member;
    let step = inner.processor();
    let report = step
        .conclude(
            &*delivery,
            logical_id.as_deref().unwrap_or_default(),
            verdict,
            &lock,
            cancel,
        )
        .instrument(processing.span.clone())
        .await;
    inner.phases.record(
        super::phases::Phase::Settlement,
        transactions_ended.elapsed(),
    );
    // The renewals stop only now, after the settlement was answered.
    lock.release().await;
    step.observer
        .finish(processing, &*delivery, &report, step.handler.contracts());
    inner.stats.record(&report);
    report
}

/// The batch's transactions: repeated without a delivery whose statement ended one, and again
/// for the deliveries that gave way to another transaction's locks, until every member is
/// decided. `Ok` once every member is; the verdicts are in the members' states.
async fn transact<S, H, D>(
    step: &Processor<'_, S, H>,
    members: &mut [Member<D>],
) -> Result<(), Whole>
where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    loop {
        members.iter_mut().for_each(|m| m.state.reset());
        if !members.iter().any(|m| matches!(m.state, State::Pending)) {
            return Ok(());
        }
        let tx = step
            .seen(step.store.begin().await)
            .map_err(|e| Whole::store(&e))?;
        let Some(tx) = run_once(step, members, tx).await? else {
            continue;
        };
        match step.seen(tx.commit().await) {
            Ok(()) => {
                step.health.committed();
                step.circuit.answered();
                members.iter_mut().for_each(|m| m.state.commit());
            }
            Err(error) => return Err(Whole::store(&error)),
        }
    }
}

/// What a pass over the pending members left of the transaction.
enum Pass {
    /// Every pending member ran: the transaction can be fenced and committed.
    Ready,
    /// A statement ended the transaction (the member it belonged to is decided): run again.
    Ended,
}

/// Runs the pending members in `tx`, then the fence, just before the commit. `Some(tx)` to
/// commit; `None` when the transaction ended and was rolled back.
async fn run_once<S, H, D>(
    step: &Processor<'_, S, H>,
    members: &mut [Member<D>],
    mut tx: S::Tx,
) -> Result<Option<S::Tx>, Whole>
where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let mut bounded = false;
    match run_pending(step, members, &mut tx, &mut bounded).await {
        Ok(Pass::Ready) => {}
        Ok(Pass::Ended) => {
            rollback(tx).await;
            return Ok(None);
        }
        Err(whole) => {
            rollback(tx).await;
            return Err(whole);
        }
    }
    let mut any_lost = false;
    for member in members.iter_mut() {
        if matches!(member.state, State::Kept(_)) && !member.lock.is_held() {
            tracing::warn!(
                lock_token = %member.delivery.lock_token(),
                "Lock lost before the batch commit; taking the delivery out of the batch."
            );
            member.state = State::Decided(Err(Abort::lock_lost_before_commit()));
            any_lost = true;
        }
    }
    if !any_lost {
        return Ok(Some(tx));
    }
    // Its savepoint is released: the whole transaction goes, and the rest runs again.
    rollback(tx).await;
    Ok(None)
}

/// Runs each pending member in its own savepoint, released once it succeeded. Every member
/// after the transaction's first runs with bounded lock waits (`bounded` says whether the bound
/// is set).
async fn run_pending<S, H, D>(
    step: &Processor<'_, S, H>,
    members: &mut [Member<D>],
    tx: &mut S::Tx,
    bounded: &mut bool,
) -> Result<Pass, Whole>
where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let mut index = 0;
    while index < members.len() {
        let member = &mut members[index];
        if !matches!(member.state, State::Pending) {
            index += 1;
            continue;
        }
        if !member.lock.is_held() {
            member.state = State::Decided(Err(Abort::lock_lost_before_commit()));
            index += 1;
            continue;
        }
        let bound = !*bounded && members.iter().any(|m| m.state.ran());
        let savepoint = match open(tx, bound).await {
            Ok(savepoint) => savepoint,
            Err(error) => {
                step.note(&error);
                return Err(Whole::store(&error));
            }
        };
        *bounded |= bound;
        let member = &mut members[index];
        let result = match step.accept(&*member.delivery) {
            Ok((envelope, payload)) => {
                let ctx = step.context(&*member.delivery, &envelope, payload);
                step.apply(&ctx, tx)
                    .instrument(member.processing.span.clone())
                    .await
            }
            Err(refused) => Err(refused.abort),
        };
        let undone = match result {
            Ok(handled) => {
                let id = savepoint.id();
                match tx.release(savepoint).await {
                    Ok(()) => {
                        member.state = State::Kept(handled);
                        Ok(())
                    }
                    // The handler went on past a failed statement (it swallowed the error): the
                    // delivery failed with it, wherever it stands in the batch. The refused
                    // release left the savepoint live.
                    Err(refused) => {
                        let savepoint = Savepoint::new(id);
                        undo(tx, member, savepoint, Abort::from(refused), false).await
                    }
                }
            }
            Err(abort) => undo(tx, member, savepoint, abort, *bounded).await,
        };
        if undone.is_err() {
            return Ok(Pass::Ended);
        }
        index += 1;
    }
    Ok(Pass::Ready)
}

/// Opens a delivery's savepoint, bounding the transaction's lock waits first when `bound`.
async fn open<T: StoreTx>(tx: &mut T, bound: bool) -> Result<Savepoint, StoreError> {
    if bound {
        tx.bound_lock_waits(LOCK_WAIT_BOUND).await?;
    }
    tx.savepoint().await
}

/// Rolls `member`'s savepoint back for `abort`. A delivery that met another transaction's lock
/// while its waits were `bounded` gives way: it runs again in the batch's next transaction.
/// Any other waits for the commit as undone. When the database cannot return to the savepoint
/// (its statement ended the whole transaction), the member is taken out with its verdict and
/// `Err` asks for a new transaction.
async fn undo<T: Tx, D: Delivery>(
    tx: &mut T,
    member: &mut Member<D>,
    savepoint: Savepoint,
    abort: Abort,
    bounded: bool,
) -> Result<(), ()> {
    match tx.rollback_to(savepoint).await {
        Ok(()) => {
            member.state = match abort {
                Abort::Contended(..) if bounded => {
                    tracing::debug!(lock_token = %member.delivery.lock_token(), "A batched delivery gave way to another transaction's lock; it runs again in the next transaction.");
                    State::GaveWay
                }
                abort => State::Undone(Err(abort)),
            };
            Ok(())
        }
        Err(error) => {
            tracing::warn!(%error, "A delivery's failure ended the batch transaction; the rest of the batch runs again without it.");
            member.state = State::Decided(Err(out_verdict(abort)));
            Err(())
        }
    }
}

/// The verdict of a delivery taken out of the batch with its own error. A duplicate is not
/// final there: the row it ran into may be another delivery's of this very batch, which has
/// not committed; it is abandoned and judged again on redelivery.
fn out_verdict(abort: Abort) -> Abort {
    match abort {
        Abort::SettleAs(Outcome::Duplicate(_), why) => Abort::SettleAs(Outcome::Transient, why),
        other => other,
    }
}

/// Ends a transaction that cannot go on; the connection is discarded if the rollback fails.
async fn rollback<T: StoreTx>(tx: T) {
    if let Err(error) = tx.rollback().await {
        tracing::warn!(%error, "Rollback failed; the connection is discarded.");
    }
}
