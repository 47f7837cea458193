//! Settling a [`ServiceBusDelivery`]: on its own link while it lives, else by lock token on
//! `$management`, with backoff while the service is busy and the lock lasts; a session
//! message on its link only.

use std::sync::atomic::Ordering;
use std::time::SystemTime;

use sb_amqp::Outcome;
use sb_amqp::codec::Value;
use sb_amqp::servicebus::condition;
use sb_amqp::servicebus::management::key;
use tracing::Instrument as _;

use super::ServiceBusError;
use super::delivery::ServiceBusDelivery;
use super::error::{is_busy_condition, is_server_busy};
use super::management::{self, Disposition, Request};
use super::settlement_error::{Attempt, settle_error};
use super::telemetry::Kind;
use crate::SettlementError;
use crate::retry::Backoff;

impl ServiceBusDelivery {
    /// Settles under a `{disposition} {entity}` client span.
    pub(super) async fn settle(
        &self,
        name: &'static str,
        outcome: Outcome,
        disposition: Disposition,
    ) -> Result<(), SettlementError> {
        let operation = self.receiver.telemetry.start(name, Kind::Settle);
        self.begin_settling();
        let settled = self
            .settle_now(outcome, disposition)
            .instrument(operation.span.clone())
            .await;
        operation.end(settled.as_ref().err().map(SettlementError::error_type));
        settled
    }

    /// Settles over the delivery's own link while it lives, else (and for every retry after
    /// a busy or timed-out answer, whose delivery the link may have settled already) by lock
    /// token on `$management`, with backoff until the lock expires (Go
    /// `azservicebus/messageSettler.settleWithRetries`).
    async fn settle_now(
        &self,
        outcome: Outcome,
        disposition: Disposition,
    ) -> Result<(), SettlementError> {
        // The service answered busy lately: the first try waits too (.NET checks the
        // client-wide busy state before every operation, and fails at once as busy when the
        // pause outlasts the operation's time, as here the lock's).
        let busy = self.receiver.client.busy().remaining();
        if !busy.is_zero() {
            if self.receiver.lock_clock.broker_now(
                tokio::time::Instant::now().into_std(),
                self.receiver.client.now(),
            ) + busy
                >= self.locked_until()
            {
                return Err(SettlementError::Transient(ServiceBusError::Broker {
                    condition: condition::SERVER_BUSY.to_owned(),
                    description: "the service is busy for longer than the lock lasts".into(),
                }));
            }
            tokio::time::sleep(busy).await;
        }
        if self.session.is_some() {
            return self.settle_in_session(outcome, &disposition).await;
        }
        let mut on_link = !self.link.gone.load(Ordering::Acquire);
        let mut backoff = self.receiver.client.retry().backoff();
        // The lock as it stands now: renewals meanwhile must not keep a busy service retried.
        let deadline = self.locked_until();
        loop {
            let attempt = if on_link {
                on_link = false;
                self.settle_on_link(outcome.clone()).await
            } else {
                self.settle_by_token(&disposition).await
            };
            match attempt {
                Attempt::Done => return Ok(()),
                Attempt::Failed(error) => return Err(error),
                Attempt::LinkGone => {}
                Attempt::Retry(why) => {
                    self.pause_before_retry(false, why, &mut backoff, deadline)
                        .await?;
                }
                Attempt::Busy(why) => {
                    self.pause_before_retry(true, why, &mut backoff, deadline)
                        .await?;
                }
            }
        }
    }

    /// Waits before the next settlement attempt: the client-wide busy pause after a busy
    /// answer (.NET `ServiceBusRetryPolicy`: 10 s; Java: 4 s), else the backoff; gives up
    /// (transient) when the lock would run out first.
    async fn pause_before_retry(
        &self,
        busy: bool,
        why: ServiceBusError,
        backoff: &mut Backoff,
        deadline: SystemTime,
    ) -> Result<(), SettlementError> {
        let busy_state = self.receiver.client.busy();
        if busy {
            busy_state.set();
        }
        let delay = backoff.next_delay().max(busy_state.remaining());
        if self.receiver.lock_clock.broker_now(
            tokio::time::Instant::now().into_std(),
            self.receiver.client.now(),
        ) + delay
            >= deadline
        {
            return Err(SettlementError::Transient(why));
        }
        tracing::debug!(lock_token = %self.lock_token, %why, ?delay, busy, "Settlement not done; retrying.");
        tokio::time::sleep(delay).await;
        Ok(())
    }

    /// A session message is settled on its own link, as .NET's `AmqpReceiver` does for
    /// session receivers: once that link is gone, so is the session lock and the settlement
    /// fails as lock lost. A busy or timed-out answer settled the delivery on the link
    /// without applying it, so it is retried by lock token with the session's id on
    /// `$management` (.NET `AmqpReceiver.DisposeMessageRequestResponseAsync` adds
    /// `session-id` for a session receiver), while the session lock lasts; the link stays.
    async fn settle_in_session(
        &self,
        outcome: Outcome,
        disposition: &Disposition,
    ) -> Result<(), SettlementError> {
        let mut backoff = self.receiver.client.retry().backoff();
        let deadline = self.locked_until();
        let mut on_link = true;
        loop {
            let attempt = if on_link {
                on_link = false;
                self.settle_on_link(outcome.clone()).await
            } else {
                self.settle_by_token(disposition).await
            };
            match attempt {
                Attempt::Done => return Ok(()),
                Attempt::Failed(error) => return Err(error),
                Attempt::LinkGone => return Err(SettlementError::LockLost),
                Attempt::Retry(why) => {
                    self.pause_before_retry(false, why, &mut backoff, deadline)
                        .await?;
                }
                Attempt::Busy(why) => {
                    self.pause_before_retry(true, why, &mut backoff, deadline)
                        .await?;
                }
            }
        }
    }

    pub(super) async fn settle_on_link(&self, outcome: Outcome) -> Attempt {
        let timeout = self.receiver.client.timeout();
        let sent = tokio::time::Instant::now();
        let Ok(settled) =
            tokio::time::timeout(timeout, self.link.settler.settle(self.delivery_id, outcome))
                .await
        else {
            return Attempt::Retry(ServiceBusError::Timeout(
                "the broker did not answer the settlement in time".into(),
            ));
        };
        if settled.is_ok() {
            // Disposition → answer: the broker's round trip, what the receive window is
            // sized over (crate::window).
            self.receiver.round_trip(sent.elapsed());
        }
        if settled.is_ok() || settled.as_ref().is_err_and(sb_amqp::Error::is_lock_lost) {
            self.settled.store(true, Ordering::Release);
        }
        match settled {
            Ok(Some(Outcome::Rejected(Some(error))))
                if error.is_lock_lost() || error.condition == condition::SESSION_LOCK_LOST =>
            {
                Attempt::Failed(SettlementError::LockLost)
            }
            Ok(Some(Outcome::Rejected(Some(error)))) if is_busy_condition(&error.condition) => {
                let server_busy = is_server_busy(&error.condition);
                let why = ServiceBusError::Broker {
                    condition: error.condition,
                    description: error.description.unwrap_or_default(),
                };
                // Only server-busy holds the whole client; a timeout is retried (F5).
                if server_busy {
                    Attempt::Busy(why)
                } else {
                    Attempt::Retry(why)
                }
            }
            Ok(Some(Outcome::Rejected(Some(error)))) => {
                Attempt::Failed(SettlementError::Permanent {
                    condition: error.condition,
                    description: error.description.unwrap_or_default(),
                })
            }
            Ok(_) => Attempt::Done,
            Err(error) if error.is_lock_lost() => Attempt::Failed(SettlementError::LockLost),
            // Detached, or the delivery was dropped with its link: its lock may live on.
            Err(_) => {
                self.link.gone.store(true, Ordering::Release);
                Attempt::LinkGone
            }
        }
    }

    async fn settle_by_token(&self, disposition: &Disposition) -> Attempt {
        let mut request = Request::disposition(disposition, self.lock_token);
        if let Some(session) = &self.session {
            request = request.entry(key::SESSION_ID, Value::String(session.id().to_owned()));
        }
        let replied = self
            .receiver
            .client
            .management(
                &self.receiver.entity,
                request.for_link(self.receiver.current_link()),
            )
            .await;
        if let Ok(reply) = &replied
            && management::is_busy(reply)
        {
            return Attempt::Busy(ServiceBusError::Broker {
                condition: condition::SERVER_BUSY.to_owned(),
                description: "$management answered update-disposition busy".into(),
            });
        }
        match replied
            .map_err(settle_error)
            .and_then(|r| management::disposition_reply(&r))
        {
            Ok(()) => Attempt::Done,
            Err(SettlementError::Transient(why)) => Attempt::Retry(why),
            Err(error) => Attempt::Failed(error),
        }
    }
}
