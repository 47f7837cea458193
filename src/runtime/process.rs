use std::collections::BTreeMap;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::lock_keeper::KeptLock;
use super::observe::Observer;
use super::{
    Context, DeadLetterReason, Handled, Handler, HandlerError, LockKeeper, Outcome, Rejection,
    Settlement, envelope,
};
use crate::ports::{Delivery, ErrorKind, PropertyValue, SettleError, Store, StoreError, Tx};
use crate::runtime::ConsumerName;

/// The application property an abandon writes with the failure that caused it.
pub const LAST_ERROR_PROPERTY: &str = "sb-inbox-last-error";

/// What the runtime did with one delivery.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Report {
    /// The outcome.
    pub outcome: Outcome,
    /// The settlement's result: `None` when the outcome asks for none.
    pub settled: Option<Result<(), SettleError>>,
    /// Lock renewals while the delivery was handled.
    pub renewals: u32,
}

pub(crate) struct Step<'a, S, H> {
    pub(crate) store: &'a S,
    pub(crate) handler: &'a H,
    pub(crate) consumer: &'a ConsumerName,
    pub(crate) keeper: LockKeeper,
    pub(crate) observer: &'a Observer,
}

/// Why an outcome came about, for the abandon properties.
enum Note {
    None,
    Why(String),
}

/// Why a transaction ended without a commit.
enum Abort {
    Failed(Outcome, String),
    Rejected(Rejection),
}

impl From<StoreError> for Abort {
    fn from(error: StoreError) -> Self {
        match error.kind() {
            ErrorKind::Duplicate(scope) => {
                Abort::Failed(Outcome::Duplicate(scope), error.redacted())
            }
            kind if kind.is_transient() => {
                tracing::warn!(error = %error, "Transient store failure.");
                Abort::Failed(Outcome::Transient, error.redacted())
            }
            _ => {
                tracing::warn!(error = %error, "Permanent store failure.");
                Abort::Rejected(Rejection::new(
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
            HandlerError::Transient(text) => {
                Abort::Failed(Outcome::Transient, envelope::truncate(&text, 256))
            }
            HandlerError::Permanent(rejection) => Abort::Rejected(rejection),
        }
    }
}

impl<S, H> Step<'_, S, H>
where
    S: Store,
    H: Handler<S::Tx>,
{
    /// Runs the algorithm for one delivery under its process span (opened here, when handling
    /// starts, not at receipt): envelope check, inbox insert, handler, fenced commit, then
    /// settlement. `cancel` (shutdown past its grace) rolls back and abandons.
    pub(crate) async fn run<D: Delivery>(
        &self,
        delivery: Arc<D>,
        cancel: &CancellationToken,
    ) -> Report {
        let processing = self.observer.start(&*delivery);
        let report = self
            .handle(delivery.clone(), cancel)
            .instrument(processing.span.clone())
            .await;
        self.observer
            .finish(processing, &*delivery, &report, self.handler.contracts());
        report
    }

    async fn handle<D: Delivery>(&self, delivery: Arc<D>, cancel: &CancellationToken) -> Report {
        let message = delivery.message();
        let envelope = match envelope::check(message, self.handler.contracts()) {
            Ok(envelope) => envelope,
            Err(rejection) => return self.dead_letter(&*delivery, rejection, 0).await,
        };
        let payload = match self.handler.decode(&envelope.contract, &message.body) {
            Ok(payload) => payload,
            Err(error) => {
                let rejection = Rejection::new(DeadLetterReason::InvalidPayload, error.to_string());
                return self.dead_letter(&*delivery, rejection, 0).await;
            }
        };
        let lock = self.keeper.keep(delivery.clone());
        let ctx = Context {
            payload,
            message,
            message_id: &envelope.message_id,
            consumer: self.consumer,
            contract: &envelope.contract,
            delivery_count: delivery.delivery_count(),
        };
        let result = tokio::select! {
            // Biased: a lost lock or a shutdown must win over a handler that is ready to commit.
            biased;
            () = lock.lost().cancelled() => Err(Abort::Failed(Outcome::LockLost, "lock lost".to_owned())),
            () = cancel.cancelled() => Err(Abort::Failed(Outcome::Transient, "shutdown".to_owned())),
            result = self.observer.transaction(self.transact(&ctx, &lock)) => result,
        };
        let renewals = lock.renewals();
        let report = match result {
            Ok(outcome) => self.settle(&*delivery, outcome, Note::None, renewals).await,
            Err(Abort::Failed(outcome, why)) => {
                self.settle(&*delivery, outcome, Note::Why(why), renewals)
                    .await
            }
            Err(Abort::Rejected(rejection)) => {
                self.dead_letter(&*delivery, rejection, renewals).await
            }
        };
        // The lock is kept until the settlement is answered; then the renewals stop.
        lock.release().await;
        report
    }

    /// One transaction: inbox row first, then the handler, then the fenced commit. A failure
    /// rolls back explicitly so the connection stays reusable.
    async fn transact(
        &self,
        ctx: &Context<'_, H::Payload>,
        lock: &KeptLock,
    ) -> Result<Outcome, Abort> {
        let mut tx = self.store.begin().await?;
        let work = async {
            tx.insert_inbox(self.consumer.as_str(), ctx.message_id)
                .await?;
            let handled = self.handler.handle(ctx, &mut tx).await?;
            if !lock.is_held() {
                // Fencing: another instance may already hold the redelivery's lock.
                return Err(Abort::Failed(
                    Outcome::LockLost,
                    "lock lost before commit".to_owned(),
                ));
            }
            Ok(handled)
        };
        match work.await {
            Ok(handled) => {
                tx.commit().await?;
                Ok(match handled {
                    Handled::Processed => Outcome::Processed,
                    Handled::Stale => Outcome::Stale,
                })
            }
            Err(abort) => {
                if let Err(error) = tx.rollback().await {
                    tracing::warn!(%error, "Rollback failed; the connection is discarded.");
                }
                Err(abort)
            }
        }
    }

    async fn settle<D: Delivery>(
        &self,
        delivery: &D,
        outcome: Outcome,
        note: Note,
        renewals: u32,
    ) -> Report {
        let settled = match outcome.settlement() {
            Settlement::Complete => Some(delivery.complete().await),
            Settlement::Abandon => {
                let mut properties = BTreeMap::new();
                if let Note::Why(why) = note {
                    properties.insert(LAST_ERROR_PROPERTY.to_owned(), PropertyValue::String(why));
                }
                Some(delivery.abandon(properties).await)
            }
            Settlement::None => None,
            Settlement::DeadLetter => {
                let reason = match outcome {
                    Outcome::Permanent(reason) => reason,
                    _ => DeadLetterReason::HandlerRejected,
                };
                let description = match note {
                    Note::Why(why) => why,
                    Note::None => String::new(),
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
        }
    }

    async fn dead_letter<D: Delivery>(
        &self,
        delivery: &D,
        rejection: Rejection,
        renewals: u32,
    ) -> Report {
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
        }
    }
}
