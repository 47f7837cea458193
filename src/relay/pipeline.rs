//! [`Relay::run`]: passes one after another, overlapped where the store and the broker can
//! work at once (issue 42).
//!
//! A pass is claim, publish, mark. Claiming and marking are statements on the store, publishing
//! waits on the broker, so with a broker a round trip away a pass that did them in turn spent
//! half its time with no send in flight. While a full batch publishes, the running relay
//! therefore claims the next batch and marks the previous one: each turn publishes one claim,
//! marks the claim published in the turn before and claims the one for the next turn, side by
//! side. The rules hold as in [`Relay::relay_once`]:
//! - at least once: a row is marked only after the broker accepted it (its pass's answers are
//!   all in before the next turn marks it);
//! - order: publishing stays one claim after another, and the next claim's plan is made after
//!   this one's answers (its held keys and windows); a claim skips a session's rows while an
//!   earlier row of the session is leased, so rows claimed ahead never include a later row of a
//!   session this turn is publishing;
//! - a claim taken ahead that is not published is handed back untried at once, its attempt not
//!   counted: at shutdown, after a store error, after a turn that published nothing (its
//!   destination down: the relay waits its poll interval, as before) or handed rows back untried
//!   (those are claimed again later, and rows claimed ahead of them would overtake them).
//!
//! Each turn asks for [`CLAIM_WINDOWS`](super::lanes::CLAIM_WINDOWS) times the rows the
//! destinations' windows carried from the last pass keep in flight, between the batch size and
//! four times `max_in_flight`: a turn ends with a round trip in which no send of the next claim
//! starts, so claims of a fixed 100 rows to a broker 10 ms away would make at most 100 rows per
//! round trip (issue 42). The rules above do not depend on the claim's size.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::lanes::claim_size;
use super::{BACKLOG_SAMPLE_INTERVAL, Claimed, Outcome, Relay};
use crate::ports::{OutboxLease, OutboxStore, Sender, StoreError};

/// A claim whose answers are all in, to be marked.
#[derive(Debug)]
struct Published {
    lease: OutboxLease,
    claimed: usize,
    outcome: Outcome,
}

/// What one turn of [`Relay::run`] leaves for the next.
#[derive(Debug)]
struct Turn {
    /// The claim to publish next, taken while this turn's claim was published.
    ahead: Option<Claimed>,
    /// This turn's claim, published, to be marked while the next one is.
    marking: Option<Published>,
    /// `Ok(true)`: more is due at once (the next turn follows without a wait); a store error:
    /// back off.
    busy: Result<bool, StoreError>,
}

impl<S: OutboxStore, P: Sender> Relay<S, P> {
    /// Relays until `shutdown`: a pass right after a full batch, otherwise every poll
    /// interval; samples the backlog every [`BACKLOG_SAMPLE_INTERVAL`]. Store errors are logged
    /// and retried with backoff. While a full batch is published, the previous one is marked
    /// and the next one claimed (the module's doc).
    pub async fn run(&self, shutdown: CancellationToken) {
        tracing::info!(
            batch = self.config.batch_size,
            poll = ?self.config.poll_interval,
            lease = ?self.config.lease,
            "Outbox relay started."
        );
        let mut failures = 0u32;
        let mut sampled: Option<tokio::time::Instant> = None;
        let (mut ahead, mut marking) = (None, None);
        while !shutdown.is_cancelled() {
            let turn = self.turn(ahead.take(), marking.take(), &shutdown).await;
            (ahead, marking) = (turn.ahead, turn.marking);
            let wait = match turn.busy {
                Ok(busy) => {
                    failures = 0;
                    if busy {
                        Duration::ZERO
                    } else {
                        self.config.poll_interval
                    }
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let wait = self.backoff(failures);
                    tracing::warn!(%error, ?wait, "Outbox relay pass failed; retrying.");
                    wait
                }
            };
            if sampled.is_none_or(|at| at.elapsed() >= BACKLOG_SAMPLE_INTERVAL) {
                sampled = Some(tokio::time::Instant::now());
                if let Err(error) = self.backlog().await {
                    tracing::debug!(%error, "Outbox backlog not sampled.");
                }
            }
            if wait.is_zero() {
                tokio::task::yield_now().await;
            } else if shutdown
                .run_until_cancelled(tokio::time::sleep(wait))
                .await
                .is_none()
            {
                break;
            }
        }
        // What the last turn published is marked, what it claimed ahead handed back.
        if let Err(error) = self.mark(marking).await {
            tracing::warn!(%error, "Published outbox rows not marked; they are published again after their lease.");
        }
        self.hand_back(ahead).await;
        tracing::info!(stats = ?self.stats.snapshot(), "Outbox relay stopped.");
    }

    /// One turn: publishes `ahead` (or a claim taken now) while `marking` is marked and, when
    /// this claim is a full batch, the next one is claimed. The claim ahead is kept only when
    /// all three went well and this turn published something and handed nothing back;
    /// otherwise this turn's claim is marked now and the claim ahead handed back.
    async fn turn(
        &self,
        ahead: Option<Claimed>,
        marking: Option<Published>,
        stop: &CancellationToken,
    ) -> Turn {
        let current = match ahead {
            Some(current) => current,
            None => match self.claim(self.claim_size()).await {
                Ok(current) => current,
                Err(error) => {
                    let marked = self.mark(marking).await;
                    return Turn {
                        ahead: None,
                        marking: None,
                        busy: marked.and(Err(error)),
                    };
                }
            },
        };
        let full = current.claim.len() >= current.asked.max(1);
        let next = async {
            if full && !stop.is_cancelled() {
                Some(self.claim(self.claim_size()).await)
            } else {
                None
            }
        };
        let publish = self.publish(&current.claim, stop, current.send_until);
        let (marked, outcome, next) = tokio::join!(self.mark(marking), publish, next);
        let published = Published {
            lease: current.lease,
            claimed: current.claim.len(),
            outcome,
        };
        let sent = !published.outcome.sent.is_empty();
        // Rows of this claim handed back untried (its lease half gone, a destination down) are
        // claimed again later: rows claimed ahead of them would overtake them.
        let whole = published.outcome.untried.is_empty();
        match (marked, next) {
            (Ok(()), Some(Ok(ahead))) if sent && whole => Turn {
                ahead: Some(ahead),
                marking: Some(published),
                busy: Ok(true),
            },
            (marked, next) => {
                let (next, claimed) = match next {
                    Some(Ok(ahead)) => (Some(ahead), Ok(())),
                    Some(Err(error)) => (None, Err(error)),
                    None => (None, Ok(())),
                };
                self.hand_back(next).await;
                let this = self.mark(Some(published)).await;
                Turn {
                    ahead: None,
                    marking: None,
                    busy: marked.and(claimed).and(this).map(|()| full && sent),
                }
            }
        }
    }

    /// Rows the next claim asks for: [`CLAIM_WINDOWS`](super::lanes::CLAIM_WINDOWS) × the
    /// windows carried from the last pass, at least [`super::RelayConfig::batch_size`], at most
    /// four times `max_in_flight` (or the batch size, if larger), never more than
    /// [`crate::ports::MAX_ROWS_PER_STATEMENT`]. The module's doc says why.
    fn claim_size(&self) -> usize {
        let windows = self
            .windows
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        claim_size(&windows, self.config.batch_size, self.config.max_in_flight)
    }

    /// Step 5 for a published claim, if any.
    async fn mark(&self, published: Option<Published>) -> Result<(), StoreError> {
        let Some(published) = published else {
            return Ok(());
        };
        self.settle(&published.lease, published.claimed, published.outcome)
            .await
            .map(drop)
    }

    /// Releases a claim that was not published, untried and due now (its attempt not
    /// counted). A failed release leaves the rows leased: claimed again after the lease.
    async fn hand_back(&self, claimed: Option<Claimed>) {
        let Some(claimed) = claimed else {
            return;
        };
        let ids: Vec<i64> = claimed
            .claim
            .rows
            .iter()
            .map(|row| row.id)
            .chain(claimed.claim.unreadable.iter().map(|row| row.id))
            .collect();
        if ids.is_empty() {
            return;
        }
        let now = self.clock.now();
        if let Err(error) = self
            .store
            .release_outbox(&claimed.lease, &ids, now, None)
            .await
        {
            tracing::warn!(%error, rows = ids.len(), "Outbox rows claimed ahead not handed back; they are claimed again after their lease.");
        }
    }
}
