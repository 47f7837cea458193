//! Finding the culprit when a batch's transaction fails as a whole.
//!
//! A failure the batch cannot pin on one member (a deferred constraint or a serialization
//! failure at `COMMIT`, a SQL Server transaction doomed by a member's error, the whole batch
//! past `max_processing` because one member never ends) would otherwise abandon every undecided
//! member. At concurrency 1 the same batch then re-forms after each abandon, so all of them
//! reach the max delivery count together and are dead-lettered `MaxDeliveryCountExceeded`,
//! where unbatched only the culprit would be. Instead each undecided member runs again alone,
//! one transaction each, as the unbatched runtime runs it: the culprit gets its own outcome
//! and error kind (a deferred foreign key is permanent, a member past `max_processing` is
//! transient) and the others commit, all within the same delivery attempt.
//!
//! Not for failures that are not the batch's: a systemic store failure (the kill switch's
//! business; every member would fail alike), a shutdown past its grace.
//!
//! The members share one more `max_processing` between them, not one each: a batch of N whose
//! members each take almost the bound would otherwise hold its slot (and its members' locks)
//! for (1 + N) × `max_processing`, and the slot watch would call it stuck. A member the
//! deadline reaches before it ran is abandoned as too long, as it would be in its batch; so a
//! batch takes at most twice its bound. The member that was running when the batch ran past
//! its bound runs last, so that a member that never ends costs only itself the deadline.

use tokio_util::sync::CancellationToken;

use super::super::process::{Abort, Processor};
use super::super::{Handler, Outcome};
use super::{Member, State};
use crate::ports::{Delivery, Store};

/// Runs each undecided member of `members` in a transaction of its own, `last` (an index)
/// after the others, and records each verdict.
pub(super) async fn one_by_one<S, H, D>(
    step: &Processor<'_, S, H>,
    members: &mut [Member<D>],
    last: Option<usize>,
    cancel: &CancellationToken,
) where
    S: Store,
    H: Handler<S::Tx>,
    D: Delivery,
{
    let deadline = tokio::time::Instant::now() + step.max_processing;
    let undecided = members
        .iter()
        .filter(|m| !matches!(m.state, State::Decided(_)))
        .count();
    tracing::warn!(
        undecided,
        "Batch transaction failed as a whole; running its deliveries one per transaction to find the culprit."
    );
    let order = (0..members.len())
        .filter(|i| Some(*i) != last)
        .chain(last.filter(|i| *i < members.len()));
    for index in order {
        let member = &mut members[index];
        if matches!(member.state, State::Decided(_)) {
            continue;
        }
        // Accepted when the batch formed (a refused one is decided already).
        let (envelope, payload) = match step.accept(&*member.delivery) {
            Ok(accepted) => accepted,
            Err(refused) => {
                member.state = State::Decided(Err(refused.abort));
                continue;
            }
        };
        let ctx = step.context(&*member.delivery, &envelope, payload);
        let verdict = tokio::select! {
            // Biased as the unbatched runtime: a lost lock or a shutdown wins over a commit.
            biased;
            () = member.lock.lost().cancelled() => {
                Err(Abort::SettleAs(Outcome::LockLost, "lock lost".to_owned()))
            }
            () = cancel.cancelled() => Err(Abort::Shutdown),
            () = tokio::time::sleep_until(deadline) => Err(step.too_long()),
            verdict = step.transact(&ctx, &member.lock) => verdict,
        };
        member.state = State::Decided(verdict);
    }
}
