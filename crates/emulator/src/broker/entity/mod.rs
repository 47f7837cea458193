//! [`Entity`]: a handle on one addressable entity, and what every operation on it shares
//! (processing due timers, waking receivers, waiting on the clock).
//!
//! # Layout
//! - this file: the handle, its properties, `with_queue` and `wait_for`, message counts.
//! - `send`: send, send a batch, schedule and cancel scheduled messages.
//! - `receive`: receive, peek and receive deferred messages.
//! - `settle`: settle, the update-disposition request ([`DispositionStatus`]), renew locks.
//! - `sessions`: accept, hold, renew and release sessions; session state.
//! - `rules`: a subscription's rules.
//! - `faults`: fault hooks.

mod faults;
mod receive;
mod rules;
mod send;
mod sessions;
mod settle;

pub use settle::DispositionStatus;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::error::{Error, Result};
use crate::queue::{EntityCounts, QueueState};

use crate::broker::message_queue::MessageQueue;
use crate::broker::namespace::{Namespace, Node};
use crate::broker::topic::Topic;

#[derive(Debug, Clone)]
pub(super) enum Target {
    /// A queue or subscription, or its dead-letter subqueue.
    Queue {
        queue: Arc<MessageQueue>,
        dlq: bool,
    },
    Topic(Arc<Topic>),
}

/// A handle on one addressable entity: a queue, topic, subscription or dead-letter subqueue.
///
/// The AMQP layer resolves one per link (and per `$management` request) and maps:
/// - transfers on a sender link → [`send`](Self::send) / [`send_batch`](Self::send_batch);
/// - credit on a receiver link → [`receive`](Self::receive) (waits; cancel-safe) or
///   [`try_receive`](Self::try_receive);
/// - dispositions → [`settle`](Self::settle) with a [`Settlement`](crate::Settlement);
/// - management operations → [`renew_lock`](Self::renew_lock), [`peek`](Self::peek),
///   [`update_disposition`](Self::update_disposition), [`schedule`](Self::schedule),
///   [`cancel_scheduled`](Self::cancel_scheduled),
///   [`receive_deferred`](Self::receive_deferred).
///
/// Receiving operations on a topic and sending to a subscription or dead-letter queue return
/// [`Error::NotAllowed`].
#[derive(Debug, Clone)]
pub struct Entity {
    pub(super) ns: Arc<Namespace>,
    pub(super) target: Target,
    pub(super) path: String,
}

impl Entity {
    /// The canonical path (`q1`, `t1/Subscriptions/s1/$DeadLetterQueue`).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Whether this is a topic (send-only).
    pub fn is_topic(&self) -> bool {
        matches!(self.target, Target::Topic(_))
    }

    /// Whether this is a dead-letter subqueue.
    pub fn is_dead_letter_queue(&self) -> bool {
        matches!(self.target, Target::Queue { dlq: true, .. })
    }

    /// The maximum message size in bytes (advertise it as `max-message-size` on attach).
    pub fn max_message_size(&self) -> usize {
        match &self.target {
            Target::Queue { queue, .. } => queue.props().max_message_size,
            Target::Topic(t) => t.props().max_message_size,
        }
    }

    /// The lock duration (topics: `None`).
    pub fn lock_duration(&self) -> Option<Duration> {
        match &self.target {
            Target::Queue { queue, .. } => Some(queue.props().lock_duration),
            Target::Topic(_) => None,
        }
    }

    /// Whether the entity requires sessions (receive through
    /// [`accept_session`](Self::accept_session) then). The dead-letter subqueue of a session
    /// entity does not: the service serves it to ordinary receivers (azure-sdk-for-net#21271;
    /// Java `ServiceBusReceiverAsyncClient` refuses a session receiver there with "Cannot
    /// create a MessageSession for a sub-queue").
    pub fn requires_session(&self) -> bool {
        match &self.target {
            Target::Queue { queue, dlq: false } => queue.props().requires_session,
            Target::Queue { dlq: true, .. } | Target::Topic(_) => false,
        }
    }

    fn not_allowed(&self, operation: &'static str, reason: &'static str) -> Error {
        Error::NotAllowed {
            operation,
            entity: self.path.clone(),
            reason,
        }
    }

    /// Runs `f` on the queue's state after processing due timers, then wakes receivers and
    /// forwards dead-lettered messages outside the lock.
    fn with_queue<T>(
        &self,
        operation: &'static str,
        f: impl FnOnce(&MessageQueue, &mut QueueState, bool, SystemTime) -> Result<T>,
    ) -> Result<T> {
        let Target::Queue { queue, dlq } = &self.target else {
            return Err(self.not_allowed(
                operation,
                "a topic has no messages of its own; use a subscription",
            ));
        };
        let now = self.ns.clock.now();
        self.ns.tick_forwarders(now);
        let (result, forwards, dirty) = {
            let mut st = queue.lock();
            st.tick(now);
            let result = f(queue, &mut st, *dlq, now);
            (
                result,
                std::mem::take(&mut st.forwards),
                std::mem::take(&mut st.dirty),
            )
        };
        if dirty {
            queue.notify.notify_waiters();
        }
        if !forwards.is_empty() {
            self.ns.forward_dead_letters(queue, forwards);
        }
        result
    }

    fn node(&self) -> Node {
        match &self.target {
            Target::Queue { queue, .. } => Node::Queue(queue.clone()),
            Target::Topic(t) => Node::Topic(t.clone()),
        }
    }

    fn check_sessionless(&self, operation: &'static str) -> Result<()> {
        match &self.target {
            Target::Queue { queue, dlq: false } if queue.props().requires_session => Err(self
                .not_allowed(
                    operation,
                    "the entity requires sessions; accept a session first",
                )),
            _ => Ok(()),
        }
    }

    fn check_sessionful(&self, operation: &'static str) -> Result<()> {
        match &self.target {
            Target::Queue { queue, dlq: false } if queue.props().requires_session => Ok(()),
            _ => Err(self.not_allowed(operation, "the entity does not require sessions")),
        }
    }

    /// Runs `attempt` until it yields a value, waking on notifications and on the entity's
    /// timers, for at most `max_wait`.
    async fn wait_for<T>(
        &self,
        operation: &'static str,
        max_wait: Option<Duration>,
        mut attempt: impl FnMut(&mut QueueState, bool, SystemTime) -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        let Target::Queue { queue, .. } = &self.target else {
            return Err(self.not_allowed(
                operation,
                "a topic has no messages of its own; use a subscription",
            ));
        };
        let clock = self.ns.clock;
        let deadline = max_wait.and_then(|w| clock.now().checked_add(w));
        loop {
            let notified = queue.notify.notified();
            tokio::pin!(notified);
            // Register before looking, so a message sent in between wakes us.
            notified.as_mut().enable();
            let (got, next_due) = self.with_queue(operation, |_, st, dlq, now| {
                let got = attempt(st, dlq, now)?;
                let next_due = [st.next_due(dlq), st.next_session_expiry(now)]
                    .into_iter()
                    .flatten()
                    .min();
                Ok((got, next_due))
            })?;
            if got.is_some() {
                return Ok(got);
            }
            let now = clock.now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let forwarders_due = self.ns.forwarders_next_due();
            match [next_due, deadline, forwarders_due]
                .into_iter()
                .flatten()
                .min()
            {
                Some(wake) => {
                    tokio::select! {
                        () = &mut notified => {}
                        () = clock.sleep_until(wake) => {}
                    }
                }
                None => notified.await,
            }
        }
    }

    /// Message counts (of the subqueue this handle addresses). For a topic: `sent` and
    /// `duplicates`.
    pub fn counts(&self) -> EntityCounts {
        match &self.target {
            Target::Topic(t) => {
                let st = t.lock();
                EntityCounts {
                    sent: st.sent,
                    duplicates: st.duplicates,
                    ..EntityCounts::default()
                }
            }
            Target::Queue { .. } => self
                .with_queue("counts", |_, st, dlq, _| {
                    Ok(if dlq { st.dlq_counts() } else { st.counts() })
                })
                .unwrap_or_default(),
        }
    }

    // Fault hooks. They act on the queue or subscription (both subqueues).
}
