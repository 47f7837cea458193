//! One delivery, start to settlement: the article's algorithm ([`Processor::run`]).
//!
//! # Algorithm
//! 1. **Check the envelope** before any database work ([`Processor::accept`]): a logical id
//!    present and well formed, a supported contract, a body that decodes. A failure is permanent:
//!    dead-letter with a bounded reason, no transaction, never recorded as processed.
//! 2. **Open one transaction** and **insert the inbox row** `(consumer, logical id)` first
//!    ([`StoreTx::insert_inbox`](crate::StoreTx::insert_inbox)). A unique violation of the inbox constraint is a duplicate: roll
//!    back, complete.
//! 3. **Run the handler** in the same transaction (business rows, business key, version check,
//!    outbox rows).
//! 4. **Fence, then commit**: no commit once the lock is lost (another instance may already hold
//!    the redelivery's lock). The lock keeper renews meanwhile; a lost lock, a shutdown past its
//!    grace or `max_processing` cancels the handler, and dropping the transaction rolls it back.
//! 5. **Settle after commit** as the [`Outcome`] says: processed, duplicate or stale → complete;
//!    transient → abandon, or with [`DelayedRetry`] a scheduled copy then complete (a systemic
//!    store failure is the store's, not the message's: given back as the kill switch says,
//!    never a delayed retry); permanent → dead-letter (one decided by the message's history,
//!    `RetriesExhausted` or `HandlerPanicked`, is first recorded as its inbox row, a
//!    [`Verdict`], which a twin delivery then meets: issue 41); lock lost → nothing (the
//!    redelivery decides). A commit whose answer was lost is settled after asking the store whether the
//!    inbox row is there. An unknown contract under [`UnknownContracts::Complete`] is completed
//!    without a transaction (ignored).
//!
//! A transaction that ends without a commit says why in an [`Abort`], which maps store and
//! handler errors to outcomes; `batch` reuses steps 1–3 and 5 with one savepoint per delivery.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::circuit::{Circuit, CircuitPhase};
use super::lock_keeper::KeptLock;
use super::observe::Observer;
use super::phases::{Phase, Phases};
use super::retry::{self, DelayedRetry, LAST_ERROR_PROPERTY, ScheduledRetry};
use super::store_health::StoreHealth;
use super::{
    Clock, Context, DeadLetterReason, Handled, Handler, HandlerError, LockKeeper, Outcome,
    Rejection, Report, Settlement, UnknownContracts, panic, transient_hold,
};
use crate::envelope;
use crate::ports::{
    Delivery, DuplicateScope, ErrorKind, InboxEntry, PropertyValue, SettleError, Store, StoreError,
    StoreTx, Verdict,
};
use crate::runtime::ConsumerName;

/// Everything one delivery's processing borrows from its runtime: the store, the handler, the
/// lock keeper, telemetry and the limits. Built per delivery; runs the algorithm above.
pub(crate) struct Processor<'a, S, H> {
    pub(crate) store: &'a S,
    pub(crate) handler: &'a H,
    pub(crate) consumer: &'a ConsumerName,
    pub(crate) keeper: LockKeeper,
    pub(crate) retry: Option<&'a DelayedRetry>,
    pub(crate) clock: Clock,
    pub(crate) observer: &'a Observer,
    pub(crate) health: &'a StoreHealth,
    pub(crate) circuit: &'a Circuit,
    /// A panic on a delivery numbered this or later dead-letters it.
    pub(crate) max_panics: u32,
    /// The longest hold of a transient failure before its abandon.
    pub(crate) transient_hold_max: Duration,
    /// The runtime's jitter ([`super::RuntimeConfig::jitter`]): transient holds draw from it.
    pub(crate) jitter: &'a super::JitterSource,
    /// What an `UnsupportedContract` rejection settles as.
    pub(crate) unknown_contracts: UnknownContracts,
    /// Past this the handler is cancelled, its transaction rolled back and the delivery
    /// abandoned.
    pub(crate) max_processing: Duration,
    /// Where the time goes: the transaction and the settlement are timed here.
    pub(crate) phases: &'a Phases,
    /// How deliveries are read (the consumer's envelope).
    pub(crate) envelope: &'a dyn envelope::EnvelopeReader,
}

/// How the delivery's transaction ended, for what the settlement says (the abandon's
/// last-error property, the dead letter's description).
enum Ending {
    /// It committed: nothing to explain.
    Committed,
    /// It rolled back, for this (bounded) reason: a duplicate, a transient failure, a lost lock.
    RolledBack(String),
    /// The store failed as it would for every message (a systemic kind, or a commit whose
    /// outcome the store could not confirm): not the message's failure, so given back per the
    /// kill switch and never a delayed retry spent on it.
    Systemic(String),
    /// Shutdown past its grace rolled it back: not the message's fault, so never a delayed
    /// retry.
    Shutdown,
}

/// Why a transaction ended without a commit, and so how its delivery settles.
pub(super) enum Abort {
    /// Rolled back; the delivery settles as `Outcome` (a duplicate, a transient failure, a lost
    /// lock), the text saying why.
    SettleAs(Outcome, String),
    /// Rolled back because another transaction held what this one needed (a lock wait past its
    /// bound, a deadlock, a serialization failure): settles as a transient failure; a batch
    /// runs the delivery again in its next transaction instead. `true` when a statement or lock
    /// wait ran past the database's bound ([`ErrorKind::TimedOut`]): the kill switch counts it
    /// when the delivery settles with it.
    Contended(String, bool),
    /// Rolled back because the store failed the way it fails for every message alike
    /// ([`ErrorKind::is_systemic`]: unavailable, connection, deployment; the kill switch's
    /// business): given back as the switch says (released while it is open, else held and
    /// abandoned), never a delayed retry, whose copies an outage would spend until the
    /// message is dead-lettered `RetriesExhausted` for a failure that was never its own.
    Systemic(String),
    /// The commit's answer was lost ([`ErrorKind::Connection`] or [`ErrorKind::Unknown`] from
    /// `COMMIT`): the transaction may have committed. Settled only after asking the store
    /// whether the inbox row is there; `true` when the error was systemic.
    CommitUnknown(String, bool),
    /// Rolled back; the delivery is dead-lettered with this rejection.
    DeadLetter(Rejection),
    /// Rolled back by a shutdown past its grace; the delivery is abandoned.
    Shutdown,
}

/// A delivery refused before its transaction ([`Processor::accept`]): how it settles, and its
/// logical id when the envelope was read (empty when not).
pub(super) struct Refused {
    /// How it settles.
    pub(super) abort: Abort,
    /// The logical id, or empty when the envelope itself was refused.
    pub(super) logical_id: String,
}

impl Refused {
    /// Refused before its logical id was known.
    fn unread(abort: Abort) -> Self {
        Refused {
            abort,
            logical_id: String::new(),
        }
    }
}

/// Whether a message's inbox row is there, as the store answers a probe.
enum InboxRow {
    /// It is: some delivery of the message committed.
    There,
    /// It is not: nothing of the message committed.
    Absent,
    /// The store did not answer.
    Unknown,
}

impl Abort {
    /// The fence: the lock was lost before the commit, so the work must not commit (another
    /// instance may already hold the redelivery's lock).
    pub(super) fn lock_lost_before_commit() -> Self {
        Abort::SettleAs(Outcome::LockLost, "lock lost before commit".to_owned())
    }
}

/// The outcome of a committed delivery.
pub(super) fn outcome_of(handled: Handled) -> Outcome {
    match handled {
        Handled::Processed => Outcome::Processed,
        Handled::Stale => Outcome::Stale,
    }
}

impl From<StoreError> for Abort {
    fn from(error: StoreError) -> Self {
        match error.kind() {
            ErrorKind::Duplicate(scope) => {
                Abort::SettleAs(Outcome::Duplicate(scope), error.redacted())
            }
            // Logged when settled: a batch that gives way and runs it again expects it.
            ErrorKind::Contention => Abort::Contended(error.redacted(), false),
            ErrorKind::TimedOut => Abort::Contended(error.redacted(), true),
            // Logged by `StoreHealth`, once per window.
            ErrorKind::Deployment => Abort::Systemic(error.redacted()),
            kind if kind.is_systemic() => {
                tracing::warn!(error = %error, "Systemic store failure.");
                Abort::Systemic(error.redacted())
            }
            kind if kind.is_transient() => {
                tracing::warn!(error = %error, "Transient store failure.");
                Abort::SettleAs(Outcome::Transient, error.redacted())
            }
            _ => {
                tracing::warn!(error = %error, "Permanent store failure.");
                Abort::DeadLetter(Rejection::new(
                    DeadLetterReason::PermanentStoreError,
                    error.redacted(),
                ))
            }
        }
    }
}

impl From<HandlerError> for Abort {
    fn from(error: HandlerError) -> Self {
        match error {
            HandlerError::Store(error) => error.into(),
            HandlerError::Transient(error) => {
                // The chain is logged where the handler failed (`Processor::apply`); the
                // settlement carries the text, bounded.
                Abort::SettleAs(
                    Outcome::Transient,
                    envelope::truncate(&error.to_string(), 256),
                )
            }
            HandlerError::Permanent { rejection, .. } => Abort::DeadLetter(rejection),
        }
    }
}

impl<S, H> Processor<'_, S, H>
where
    S: Store,
    H: Handler<S::Tx>,
{
    /// Runs the algorithm for one delivery under its process span (opened here, when handling
    /// starts, not at receipt): envelope check, inbox insert, handler, fenced commit, then
    /// settlement. `lock` has kept the delivery's lock since receipt; it is kept until the
    /// settlement is answered. `cancel` (shutdown past its grace) rolls back and abandons.
    pub(crate) async fn run<D: Delivery>(
        &self,
        delivery: Arc<D>,
        lock: KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        self.run_freeing(delivery, lock, cancel, None::<()>).await
    }

    /// As [`Processor::run`], dropping `slot` (the handler slot and the delivery's place in
    /// what the runtime holds) as soon as the transaction has ended (committed or rolled
    /// back), before the settlement: the settlement's broker round trip then overlaps the next
    /// delivery's transaction instead of holding a slot idle, which at a broker 10 ms away
    /// would halve what the slots can do.
    pub(crate) async fn run_freeing<D: Delivery, F: Send>(
        &self,
        delivery: Arc<D>,
        lock: KeptLock,
        cancel: &CancellationToken,
        slot: Option<F>,
    ) -> Report {
        let processing = self.observer.start(&*delivery);
        lock.follow(&processing.span);
        let report = self
            .handle(delivery.clone(), &lock, cancel, slot)
            .instrument(processing.span.clone())
            .await;
        // The renewals stop only now, after the settlement was answered.
        lock.release().await;
        self.observer
            .finish(processing, &*delivery, &report, self.handler.contracts());
        report
    }

    async fn handle<D: Delivery, F: Send>(
        &self,
        delivery: Arc<D>,
        lock: &KeptLock,
        cancel: &CancellationToken,
        slot: Option<F>,
    ) -> Report {
        let (envelope, payload) = match self.accept(&*delivery) {
            Ok(accepted) => accepted,
            Err(refused) => {
                drop(slot);
                return self
                    .conclude(
                        &*delivery,
                        &refused.logical_id,
                        Err(refused.abort),
                        lock,
                        cancel,
                    )
                    .await;
            }
        };
        let ctx = self.context(&*delivery, &envelope, payload);
        let started = tokio::time::Instant::now();
        let result = tokio::select! {
            // Biased: a lost lock or a shutdown must win over a handler that is ready to commit.
            biased;
            () = lock.lost().cancelled() => Err(Abort::SettleAs(Outcome::LockLost, "lock lost".to_owned())),
            () = cancel.cancelled() => Err(Abort::Shutdown),
            // Dropping the transaction rolls it back (or discards its connection): nothing of it
            // can commit, so the abandon need not wait for a store that does not answer.
            () = tokio::time::sleep(self.max_processing) => Err(self.too_long()),
            result = self.observer.transaction(self.transact(&ctx, lock)) => result,
        };
        drop(slot);
        let ended = tokio::time::Instant::now();
        self.phases.record(Phase::Transaction, ended - started);
        let report = self
            .conclude(&*delivery, &envelope.logical_id, result, lock, cancel)
            .await;
        self.phases.record(Phase::Settlement, ended.elapsed());
        report
    }

    /// The envelope check and the body's decoding, before any database work: a failure is
    /// permanent, dead-lettered without a transaction. Both run user code (an envelope reader,
    /// upcasters, validation), so a panic in them is caught here and counted like a handler's
    /// ([`Processor::panicked`]). A refusal after the envelope was read carries its logical id:
    /// a decoder's panic counted out is decided by the message's history, like a handler's, so
    /// it is dead-lettered through the message's verdict (a twin whose decoding passes must
    /// meet it, issue 41).
    pub(super) fn accept<'d, D: Delivery>(
        &self,
        delivery: &'d D,
    ) -> Result<(envelope::Envelope<'d>, H::Payload), Refused> {
        let message = delivery.message();
        let checked = panic::catch_decoding(|| {
            envelope::check(message, self.envelope, self.handler.contracts())
        });
        let envelope = match checked {
            Ok(Ok(envelope)) => envelope,
            Ok(Err(rejection)) => return Err(Refused::unread(Abort::DeadLetter(rejection))),
            Err(panicked) => {
                return Err(Refused::unread(
                    self.panicked(delivery.delivery_count(), panicked),
                ));
            }
        };
        let decoded =
            panic::catch_decoding(|| self.handler.decode(&envelope.contract, &envelope.body));
        let abort = match decoded {
            Ok(Ok(payload)) => return Ok((envelope, payload)),
            Ok(Err(error)) => Abort::DeadLetter(Rejection::new(
                DeadLetterReason::InvalidPayload,
                error.to_string(),
            )),
            Err(panicked) => self.panicked(delivery.delivery_count(), panicked),
        };
        Err(Refused {
            abort,
            logical_id: envelope.logical_id,
        })
    }

    /// What the handler sees of an accepted delivery.
    pub(super) fn context<'c, D: Delivery>(
        &'c self,
        delivery: &'c D,
        envelope: &'c envelope::Envelope<'c>,
        payload: H::Payload,
    ) -> Context<'c, H::Payload> {
        Context {
            payload,
            message: delivery.message(),
            logical_id: &envelope.logical_id,
            consumer: self.consumer,
            contract: &envelope.contract,
            headers: &envelope.headers,
            delivery_count: delivery.delivery_count(),
        }
    }

    /// The transient failure of a delivery (or batch) past [`Processor::max_processing`].
    pub(super) fn too_long(&self) -> Abort {
        tracing::warn!(max_processing = ?self.max_processing, "Processing took too long; cancelled.");
        Abort::SettleAs(
            Outcome::Transient,
            format!(
                "processing exceeded the maximum of {} s (runtime.max_processing_secs); rolled back",
                self.max_processing.as_secs()
            ),
        )
    }

    /// Settles a delivery as the result of its transaction says. `cancel` (shutdown past its
    /// grace) cuts a transient hold and a delayed retry's send short.
    pub(super) async fn conclude<D: Delivery>(
        &self,
        delivery: &D,
        logical_id: &str,
        result: Result<Outcome, Abort>,
        lock: &KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        let renewals = lock.renewals();
        let (outcome, ending) = match result {
            Ok(outcome) => (outcome, Ending::Committed),
            Err(Abort::SettleAs(Outcome::Duplicate(DuplicateScope::Inbox), why))
                if !logical_id.is_empty() =>
            {
                return self
                    .duplicate(delivery, logical_id, why, lock, cancel)
                    .await;
            }
            Err(Abort::SettleAs(outcome, why)) => (outcome, Ending::RolledBack(why)),
            Err(Abort::Systemic(why)) => (Outcome::Transient, Ending::Systemic(why)),
            Err(Abort::CommitUnknown(why, systemic)) => match self.inbox_row(logical_id).await {
                // The commit went through and only its answer was lost: settling it as a
                // failure would abandon an applied message until the broker dead-letters it
                // (`MaxDeliveryCountExceeded`), or dead-letter it `RetriesExhausted`.
                InboxRow::There => {
                    tracing::warn!(
                        logical_id,
                        "The commit's answer was lost but its inbox row is there; completing."
                    );
                    return self.committed_after_all(delivery, renewals).await;
                }
                InboxRow::Absent if !systemic => (Outcome::Transient, Ending::RolledBack(why)),
                // Nothing committed, or the store cannot say: either way the store's failure,
                // not the message's.
                InboxRow::Absent | InboxRow::Unknown => (Outcome::Transient, Ending::Systemic(why)),
            },
            Err(Abort::Contended(why, timed_out)) => {
                tracing::warn!(error = %why, "Transient store failure: contention.");
                if timed_out {
                    // Counted before the settlement, which releases it if this trips the switch.
                    self.circuit.timed_out(&why);
                }
                (Outcome::Transient, Ending::RolledBack(why))
            }
            Err(Abort::Shutdown) => (Outcome::Transient, Ending::Shutdown),
            Err(Abort::DeadLetter(rejection))
                if decided_by_history(rejection.reason) && !logical_id.is_empty() =>
            {
                return self
                    .dead_letter_decided(delivery, logical_id, rejection, lock, cancel)
                    .await;
            }
            Err(Abort::DeadLetter(rejection)) => {
                return self.dead_letter(delivery, rejection, renewals).await;
            }
        };
        self.settle(delivery, logical_id, outcome, ending, lock, cancel)
            .await
    }

    /// One transaction: inbox row first, then the handler, then the fenced commit. A failure
    /// rolls back explicitly so the connection stays reusable.
    pub(super) async fn transact(
        &self,
        ctx: &Context<'_, H::Payload>,
        lock: &KeptLock,
    ) -> Result<Outcome, Abort> {
        let mut tx = self.seen(self.store.begin().await)?;
        let work = async {
            let handled = self.apply(ctx, &mut tx).await?;
            if !lock.is_held() {
                // Fencing: another instance may already hold the redelivery's lock.
                return Err(Abort::lock_lost_before_commit());
            }
            Ok(handled)
        };
        match work.await {
            Ok(handled) => {
                self.seen(tx.commit().await).map_err(commit_failed)?;
                self.health.committed();
                self.circuit.answered();
                Ok(outcome_of(handled))
            }
            Err(abort) => {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "Rollback failed; the connection is discarded.");
                }
                Err(abort)
            }
        }
    }

    /// One delivery's work inside an open transaction: the inbox row, then the handler.
    pub(super) async fn apply(
        &self,
        ctx: &Context<'_, H::Payload>,
        tx: &mut S::Tx,
    ) -> Result<Handled, Abort> {
        let resubmission = retry::resubmissions(ctx.message);
        if resubmission > 0 {
            // A resubmitted dead letter takes its verdict over in this transaction: it takes
            // effect once, or is decided again, while the verdict's twins stay dead-lettered.
            self.seen(
                tx.take_over_verdict(self.consumer.as_str(), ctx.logical_id(), resubmission)
                    .await,
            )?;
        }
        self.seen(
            tx.insert_inbox(self.consumer.as_str(), ctx.logical_id())
                .await,
        )?;
        let handled = panic::catch(self.handler.handle(ctx, tx))
            .await
            .map_err(|panicked| self.panicked(ctx.delivery_count, panicked))?
            .inspect_err(|error| match error {
                HandlerError::Store(error) => self.note(error),
                // Recorded as an error value so a subscriber can print the source chain, which
                // the settlement's bounded description drops.
                error => tracing::debug!(
                    error = error as &(dyn std::error::Error + 'static),
                    "Handler failed."
                ),
            })?;
        Ok(handled)
    }

    /// A caught panic of user code (the handler, or decoding before it) on a delivery numbered
    /// `delivery_count` (zero-based): abandoned (counted, never released or retried later), or
    /// dead-lettered from [`Processor::max_panics`] on.
    fn panicked(&self, delivery_count: u32, panicked: panic::Panicked) -> Abort {
        let panic::Panicked(why) = panicked;
        tracing::error!(delivery_count, max_panics = self.max_panics, error = %why, "User code panicked; rolled back.");
        // Zero-based: the count of deliveries before this one.
        if delivery_count.saturating_add(1) >= self.max_panics {
            Abort::DeadLetter(Rejection::new(DeadLetterReason::HandlerPanicked, why))
        } else {
            Abort::SettleAs(Outcome::HandlerPanicked, why)
        }
    }

    /// Tells the store's health and the kill switch about a store error.
    pub(super) fn note(&self, error: &StoreError) {
        self.circuit.store_error(error);
        if error.kind() == ErrorKind::Deployment {
            self.health.deployment_error(error);
        }
    }

    pub(super) fn seen<T>(&self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        result.inspect_err(|error| self.note(error))
    }

    async fn settle<D: Delivery>(
        &self,
        delivery: &D,
        logical_id: &str,
        outcome: Outcome,
        ending: Ending,
        lock: &KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        let renewals = lock.renewals();
        let settled = match outcome.settlement() {
            Settlement::Complete => Some(delivery.complete().await),
            Settlement::Abandon => match ending {
                // A panic is the message's, never the store's: counted by an abandon on the
                // same message (a retry copy would start its delivery count again, and a
                // release not count it), so `max_panics` always ends it.
                Ending::RolledBack(why) if outcome == Outcome::HandlerPanicked => {
                    transient_hold::hold(
                        delivery,
                        lock.left(),
                        self.transient_hold_max,
                        self.jitter,
                        cancel,
                    )
                    .await;
                    Some(delivery.abandon(last_error(why)).await)
                }
                // While the kill switch is open the failure is the store's, not the message's:
                // released (uncounted) below, never a delayed retry spent on it.
                Ending::RolledBack(why) if self.circuit.phase() != CircuitPhase::Open => {
                    if let Some(retry) = self.retry {
                        return self
                            .retry_later(delivery, retry, logical_id, why, lock, cancel)
                            .await;
                    }
                    Some(self.give_back(delivery, why, lock.left(), cancel).await)
                }
                // A systemic failure before the switch trips (or while it is open) is given
                // back the same way, never a delayed retry: during a flapping outage each copy
                // would spend a retry on the store's failure (issue 41's seed 340).
                Ending::RolledBack(why) | Ending::Systemic(why) => {
                    Some(self.give_back(delivery, why, lock.left(), cancel).await)
                }
                Ending::Shutdown => Some(self.give_back_now(delivery, "shutdown".into()).await),
                Ending::Committed => Some(delivery.abandon(BTreeMap::new()).await),
            },
            Settlement::None => None,
            Settlement::DeadLetter => {
                let reason = match outcome {
                    Outcome::Permanent(reason) => reason,
                    _ => DeadLetterReason::HandlerRejected,
                };
                let description = match ending {
                    Ending::RolledBack(why) | Ending::Systemic(why) => why,
                    Ending::Committed | Ending::Shutdown => String::new(),
                };
                Some(delivery.dead_letter(reason.as_str(), &description).await)
            }
        };
        if let Some(Err(error)) = &settled {
            tracing::warn!(%outcome, %error, "Settlement failed; the broker will redeliver.");
        }
        Report {
            outcome,
            settled,
            renewals,
            retry: None,
        }
    }

    /// Gives a transiently failed delivery back: released while the kill switch is open, else
    /// abandoned after its hold (`transient_hold::give_back`), at most half of `lock_left`.
    async fn give_back<D: Delivery>(
        &self,
        delivery: &D,
        why: String,
        lock_left: Duration,
        cancel: &CancellationToken,
    ) -> Result<(), SettleError> {
        transient_hold::give_back(
            delivery,
            self.circuit,
            lock_left,
            self.transient_hold_max,
            self.jitter,
            last_error(why),
            cancel,
        )
        .await
    }

    /// Gives a delivery back without a hold: released while the kill switch is open (the
    /// attempt was not the message's), else abandoned.
    async fn give_back_now<D: Delivery>(
        &self,
        delivery: &D,
        why: String,
    ) -> Result<(), SettleError> {
        if self.circuit.phase() == CircuitPhase::Open {
            return delivery.release().await;
        }
        delivery.abandon(last_error(why)).await
    }

    /// A transient failure under delayed retries: dead-letter once the retries are spent
    /// (through the message's verdict, [`Processor::dead_letter_decided`]: not when a delivery
    /// of the message committed); else send the next copy,
    /// scheduled, and only once the broker accepted it complete the original. A failed send
    /// abandons instead, so nothing is lost; a failed completion leaves both, and the inbox
    /// (keyed on the logical id) lets only one of them take effect. `cancel` (shutdown past its
    /// grace) cuts the send short: the original is given back at once.
    async fn retry_later<D: Delivery>(
        &self,
        delivery: &D,
        retry: &DelayedRetry,
        logical_id: &str,
        why: String,
        lock: &KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        let renewals = lock.renewals();
        let message = delivery.message();
        let done = retry::attempts_so_far(message);
        let policy = retry.policy();
        if done >= policy.max_retries() {
            let rejection = retries_exhausted(done, policy.max_retries(), &why);
            return self
                .dead_letter_decided(delivery, logical_id, rejection, lock, cancel)
                .await;
        }
        let attempt = done + 1;
        let delay = policy.delay(attempt);
        let at = self.clock.now() + delay;
        let copy = retry::copy(message, logical_id, attempt, &why, delivery.enqueued_time());
        // A send retried inside the sender can take a minute and more: a shutdown past its
        // grace must not wait for it. A copy the broker took all the same is a second delivery
        // of the message, which the inbox lets take effect once.
        let Some(sent) = cancel.run_until_cancelled(retry.send(copy, at)).await else {
            tracing::info!(
                logical_id,
                "Shutdown: the delayed retry's send was cut short; giving the original back."
            );
            let settled = self.give_back_now(delivery, why).await;
            return transient_report(settled, renewals, None);
        };
        match sent {
            Ok(()) => {
                tracing::info!(
                    logical_id,
                    attempt,
                    ?delay,
                    destination = retry.destination(),
                    "Delayed retry scheduled."
                );
                let settled = delivery.complete().await;
                if let Err(error) = &settled {
                    tracing::warn!(logical_id, %error, "Completing the original after scheduling its retry failed; the inbox lets only one of them take effect.");
                }
                let scheduled = ScheduledRetry { attempt, delay, at };
                transient_report(settled, renewals, Some(scheduled))
            }
            Err(error) => {
                tracing::warn!(logical_id, %error, "Scheduling a delayed retry failed; abandoning instead.");
                let settled = self.give_back_now(delivery, why).await;
                if let Err(error) = &settled {
                    tracing::warn!(%error, "Abandon failed; the broker will redeliver.");
                }
                transient_report(settled, renewals, None)
            }
        }
    }

    /// Whether the inbox row of `logical_id` is there, asked the one way every store answers
    /// without a read: inserting it again in a transaction rolled back at once.
    async fn inbox_row(&self, logical_id: &str) -> InboxRow {
        let mut tx = match self.store.begin().await {
            Ok(tx) => tx,
            Err(error) => {
                self.note(&error);
                return InboxRow::Unknown;
            }
        };
        let probe = tx.insert_inbox(self.consumer.as_str(), logical_id).await;
        if let Err(error) = tx.rollback().await {
            tracing::warn!(%error, "Rollback failed; the connection is discarded.");
        }
        match probe {
            Ok(()) => InboxRow::Absent,
            Err(error) if error.kind() == ErrorKind::Duplicate(DuplicateScope::Inbox) => {
                InboxRow::There
            }
            Err(error) => {
                self.note(&error);
                InboxRow::Unknown
            }
        }
    }

    /// Completes a delivery whose message's inbox row turned out to be there: a duplicate of
    /// the delivery that committed (possibly this one, whose commit answer was lost).
    async fn committed_after_all<D: Delivery>(&self, delivery: &D, renewals: u32) -> Report {
        let settled = delivery.complete().await;
        if let Err(error) = &settled {
            tracing::warn!(%error, "Completion failed; the broker will redeliver.");
        }
        Report {
            outcome: Outcome::Duplicate(DuplicateScope::Inbox),
            settled: Some(settled),
            renewals,
            retry: None,
        }
    }

    /// Dead-letters a delivery for what its message's delivery history decided
    /// ([`decided_by_history`]), through the inbox constraint: the verdict is inserted as the
    /// message's inbox row first. A delayed retry schedules its copy and then completes the
    /// original; when that completion fails both live on (issue 41's seeds 3582, 3838, 9350),
    /// and the key lets only one of the twins decide. The row says what a refused or
    /// unanswered insert means: another twin's verdict (dead-lettered too: one outcome), a
    /// processed twin (completed as its duplicate), or nothing known (given back, judged
    /// again).
    async fn dead_letter_decided<D: Delivery>(
        &self,
        delivery: &D,
        logical_id: &str,
        rejection: Rejection,
        lock: &KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        let renewals = lock.renewals();
        let verdict = Verdict {
            reason: rejection.reason.as_str().to_owned(),
            resubmission: retry::resubmissions(delivery.message()),
        };
        let Err(error) = self.record_verdict(logical_id, &verdict).await else {
            return self.dead_letter(delivery, rejection, renewals).await;
        };
        // A duplicate, or a commit whose answer was lost: the row decides.
        match self.inbox_entry(logical_id).await {
            Ok(Some(InboxEntry::DeadLettered(_))) => {
                self.dead_letter(delivery, rejection, renewals).await
            }
            Ok(Some(InboxEntry::Processed)) => {
                tracing::warn!(
                    logical_id,
                    reason = %rejection.reason,
                    "A delivery of this message committed (its inbox row is there); completing instead of dead-lettering."
                );
                self.committed_after_all(delivery, renewals).await
            }
            Ok(None) | Err(_) => {
                tracing::warn!(logical_id, %error, "The dead-letter verdict could not be recorded; giving the delivery back.");
                let settled = self
                    .give_back(delivery, rejection.description, lock.left(), cancel)
                    .await;
                Report {
                    outcome: Outcome::Transient,
                    settled: Some(settled),
                    renewals,
                    retry: None,
                }
            }
        }
    }

    /// A delivery whose inbox insert met the message's row: completed as a duplicate of the
    /// delivery that committed, or dead-lettered when the row is a twin's dead-letter
    /// [`Verdict`] (one outcome per message). When the store cannot say which, given back
    /// (released uncounted while the kill switch is open): completing could drop the only
    /// delivery left of a message whose verdict was recorded but whose dead letter was refused.
    async fn duplicate<D: Delivery>(
        &self,
        delivery: &D,
        logical_id: &str,
        why: String,
        lock: &KeptLock,
        cancel: &CancellationToken,
    ) -> Report {
        let entry = match self.inbox_entry(logical_id).await {
            Ok(entry) => entry,
            Err(error) => {
                tracing::warn!(logical_id, %error, "The inbox row met cannot be read (a verdict or a processed message); giving the delivery back.");
                let settled = self.give_back(delivery, why, lock.left(), cancel).await;
                return Report {
                    outcome: Outcome::Transient,
                    settled: Some(settled),
                    renewals: lock.renewals(),
                    retry: None,
                };
            }
        };
        if let Some(InboxEntry::DeadLettered(verdict)) = entry {
            tracing::warn!(logical_id, reason = %verdict.reason, "A twin delivery of this message was dead-lettered (its inbox row is a verdict); dead-lettering this one too.");
            let rejection = Rejection::new(
                reason_of(&verdict.reason),
                format!(
                    "a twin delivery of this message was dead-lettered {} (the inbox row records the verdict)",
                    verdict.reason
                ),
            );
            return self.dead_letter(delivery, rejection, lock.renewals()).await;
        }
        let outcome = Outcome::Duplicate(DuplicateScope::Inbox);
        self.settle(
            delivery,
            logical_id,
            outcome,
            Ending::RolledBack(why),
            lock,
            cancel,
        )
        .await
    }

    /// Inserts the message's inbox row as `verdict` and commits, taking over an earlier
    /// resubmission's verdict first.
    async fn record_verdict(&self, logical_id: &str, verdict: &Verdict) -> Result<(), StoreError> {
        let consumer = self.consumer.as_str();
        let mut tx = self.seen(self.store.begin().await)?;
        let written = async {
            if verdict.resubmission > 0 {
                tx.take_over_verdict(consumer, logical_id, verdict.resubmission)
                    .await?;
            }
            tx.insert_verdict(consumer, logical_id, verdict).await
        }
        .await;
        match self.seen(written) {
            Ok(()) => self.seen(tx.commit().await),
            Err(error) => {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "Rollback failed; the connection is discarded.");
                }
                Err(error)
            }
        }
    }

    /// The message's inbox row, read in a transaction rolled back at once.
    async fn inbox_entry(&self, logical_id: &str) -> Result<Option<InboxEntry>, StoreError> {
        let mut tx = self.seen(self.store.begin().await)?;
        let entry = tx.inbox_entry(self.consumer.as_str(), logical_id).await;
        if let Err(error) = tx.rollback().await {
            tracing::warn!(%error, "Rollback failed; the connection is discarded.");
        }
        self.seen(entry)
    }

    pub(super) async fn dead_letter<D: Delivery>(
        &self,
        delivery: &D,
        rejection: Rejection,
        renewals: u32,
    ) -> Report {
        if rejection.reason == DeadLetterReason::UnsupportedContract
            && self.unknown_contracts == UnknownContracts::Complete
        {
            // Another team's event on a shared topic: not ours to keep, nothing to record.
            tracing::debug!(description = %rejection.description, "Unknown contract; completing.");
            let settled = delivery.complete().await;
            if let Err(error) = &settled {
                tracing::warn!(%error, "Completing an unknown contract failed; the broker will redeliver.");
            }
            return Report {
                outcome: Outcome::Ignored,
                settled: Some(settled),
                renewals,
                retry: None,
            };
        }
        tracing::warn!(reason = %rejection.reason, description = %rejection.description, "Dead-lettering.");
        let settled = delivery
            .dead_letter(rejection.reason.as_str(), &rejection.description)
            .await;
        if let Err(error) = &settled {
            tracing::warn!(%error, "Dead-letter failed; the broker will redeliver.");
        }
        Report {
            outcome: Outcome::Permanent(rejection.reason),
            settled: Some(settled),
            renewals,
            retry: None,
        }
    }
}

/// Dead letters decided by the message's delivery history, not its content (its delayed
/// retries spent, its panics counted out): a twin delivery of the same message can decide
/// otherwise, so these are decided through the inbox row ([`Verdict`]). A content verdict
/// (an invalid payload, a rejection) is the same on every twin.
fn decided_by_history(reason: DeadLetterReason) -> bool {
    matches!(
        reason,
        DeadLetterReason::RetriesExhausted | DeadLetterReason::HandlerPanicked
    )
}

/// The reason a verdict row names, as the runtime writes them ([`decided_by_history`]).
fn reason_of(verdict: &str) -> DeadLetterReason {
    if verdict == DeadLetterReason::HandlerPanicked.as_str() {
        DeadLetterReason::HandlerPanicked
    } else {
        DeadLetterReason::RetriesExhausted
    }
}

/// A failed `COMMIT`: an error that may have come after the commit went through (the
/// connection broke, or an error nobody classified) leaves the outcome unknown; any other is
/// what it says.
fn commit_failed(error: StoreError) -> Abort {
    match error.kind() {
        kind @ (ErrorKind::Connection | ErrorKind::Unknown) => {
            tracing::warn!(%error, "The commit's answer was lost; asking the store whether it committed.");
            Abort::CommitUnknown(error.redacted(), kind.is_systemic())
        }
        _ => error.into(),
    }
}

fn last_error(why: String) -> BTreeMap<String, PropertyValue> {
    BTreeMap::from([(LAST_ERROR_PROPERTY.to_owned(), PropertyValue::String(why))])
}

/// A transient failure's report: its settlement, the lock's renewals, the delayed retry the
/// broker accepted (`None` when the original was given back instead).
fn transient_report(
    settled: Result<(), SettleError>,
    renewals: u32,
    retry: Option<ScheduledRetry>,
) -> Report {
    Report {
        outcome: Outcome::Transient,
        settled: Some(settled),
        renewals,
        retry,
    }
}

/// The dead-letter reason and description once `done` of `max` delayed retries were spent.
fn retries_exhausted(done: u32, max: u32, why: &str) -> Rejection {
    Rejection::new(
        DeadLetterReason::RetriesExhausted,
        format!(
            "delayed retries exhausted ({done} of {max}, {} attempts in all); last error: {why}",
            done + 1
        ),
    )
}
