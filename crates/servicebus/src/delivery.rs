//! [`ServiceBusDelivery`]: one peek-locked message: its lock (renewed on `$management`, or the
//! session lock), its settlement, and its release on drop.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::SystemTime;

use sb_amqp::Outcome;
use sb_amqp::codec::Value;
use tracing::Instrument as _;

use super::amqp_message::{Received, dead_letter_outcome, fields};
use super::management::{self, Disposition, Request};
use super::receive_link::{LinkShared, ReceiverInner};
use super::session_lock::SessionLock;
use super::settlement_error::{Attempt, settle_error};
use super::telemetry::Kind;
use crate::names::span;
use crate::{PropertyValue, ServiceBusReceivedMessage, SettlementError};

/// A peek-locked Service Bus delivery (.NET `ServiceBusReceivedMessage` in peek-lock mode, with
/// the receiver's settlement methods on it).
///
/// Every settlement awaits the broker's answer: `Ok` means the broker applied it. Dropped
/// without a settlement, the delivery is released (no delivery counted) on a best-effort
/// basis.
#[derive(Debug)]
pub struct ServiceBusDelivery {
    /// Keeps the receive link attached while the delivery waits for its settlement, even if
    /// the caller dropped its receiver handle; its telemetry names the settlement spans.
    pub(super) receiver: Arc<ReceiverInner>,
    pub(super) link: Arc<LinkShared>,
    /// The session lock of a session receiver's delivery: it is the delivery's lock.
    pub(super) session: Option<Arc<SessionLock>>,
    pub(super) delivery_id: u32,
    pub(super) lock_token: uuid::Uuid,
    pub(super) locked_until: StdMutex<SystemTime>,
    /// The broker answered a settlement: nothing is left to clear on drop.
    pub(super) settled: AtomicBool,
    /// A settlement (or release) started: the delivery left the receiver's window and counts
    /// among its settlements in flight until dropped.
    pub(super) settling: AtomicBool,
    pub(super) received: Received,
}

impl ServiceBusDelivery {
    /// Moves the delivery from the receiver's window to its settlements in flight (once): its
    /// settlement waits only on the broker's answer, which needs no slot and no renewal, so
    /// its place in the window goes to the next delivery now rather than a round trip later.
    pub(super) fn begin_settling(&self) {
        if !self.settling.swap(true, Ordering::AcqRel) {
            self.receiver.settling.fetch_add(1, Ordering::AcqRel);
            self.receiver.in_hand.fetch_sub(1, Ordering::AcqRel);
            self.receiver.freed.notify_one();
        }
    }

    /// The broker's sequence number.
    pub fn sequence_number(&self) -> Option<i64> {
        self.received.message.sequence_number
    }

    async fn renew_now(&self) -> Result<SystemTime, SettlementError> {
        if let Some(session) = &self.session {
            // A session message has no lock of its own to renew (.NET refuses renew-lock on a
            // session receiver): renewing the session lock keeps it.
            return session.renew(&self.receiver).await;
        }
        let reply = self
            .receiver
            .client
            .management(
                &self.receiver.entity,
                Request::renew_lock(self.lock_token).for_link(self.receiver.current_link()),
            )
            .await
            .map_err(settle_error)?;
        let until = management::renew_reply(&reply)?;
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
        Ok(until)
    }
}

fn amqp_value(value: &PropertyValue) -> Value {
    match value {
        PropertyValue::String(s) => Value::String(s.clone()),
        PropertyValue::Long(n) => Value::Long(*n),
        PropertyValue::Double(f) => Value::Double((*f).into()),
        PropertyValue::Bool(b) => Value::Bool(*b),
    }
}

impl ServiceBusDelivery {
    /// The message, with the broker's state as it was delivered.
    pub fn message(&self) -> &ServiceBusReceivedMessage {
        &self.received.message
    }

    /// Why the message is unusable as it stands (it does not decode — then only its lock token
    /// is known — or its string id poses as another AMQP type's), `None` for a usable one.
    /// The client does not settle such a delivery itself (no SDK does; protocol3 F10): the
    /// caller decides, e.g. dead-letters it with the reason and description given here.
    pub fn unusable(&self) -> Option<&crate::UnusableMessage> {
        self.received.refusal.as_ref()
    }

    /// Deliveries of this message before this one (0 on the first).
    pub fn delivery_count(&self) -> u32 {
        self.received.message.delivery_count
    }

    /// The lock token: what settles the message by token once its link is gone.
    pub fn lock_token(&self) -> uuid::Uuid {
        self.lock_token
    }

    /// When the lock runs out, as the broker last said (a session message: the session lock).
    pub fn locked_until(&self) -> SystemTime {
        if let Some(session) = &self.session {
            return session.locked_until();
        }
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// When the broker accepted the message.
    pub fn enqueued_time(&self) -> Option<SystemTime> {
        self.received.message.enqueued_time
    }

    /// Renews the lock (`com.microsoft:renew-lock` on `$management`; a session message renews
    /// the session lock); returns the new expiry.
    ///
    /// # Errors
    /// [`SettlementError::LockLost`] once the lock is gone; transient failures.
    pub async fn renew_lock(&self) -> Result<SystemTime, SettlementError> {
        let operation = self.receiver.telemetry.start(span::RENEW_LOCK, Kind::Renew);
        let renewed = self.renew_now().instrument(operation.span.clone()).await;
        operation.end(renewed.as_ref().err().map(SettlementError::error_type));
        renewed
    }

    /// Completes (removes) the message.
    ///
    /// # Errors
    /// [`SettlementError`]: the lock lost, a refusal with the broker's condition, or a
    /// transient failure after the retries the lock left room for.
    pub async fn complete(&self) -> Result<(), SettlementError> {
        self.settle(span::COMPLETE, Outcome::Accepted, Disposition::Complete)
            .await
    }

    /// Abandons the message: it becomes available again with its delivery count raised, and
    /// `properties` are merged into its application properties.
    ///
    /// # Errors
    /// As [`ServiceBusDelivery::complete`].
    pub async fn abandon(
        &self,
        properties: BTreeMap<String, PropertyValue>,
    ) -> Result<(), SettlementError> {
        let annotations = fields(properties.iter().map(|(k, v)| (k.clone(), amqp_value(v))));
        self.settle(
            span::ABANDON,
            Outcome::Modified {
                delivery_failed: true,
                undeliverable_here: false,
                message_annotations: (!annotations.is_empty()).then(|| annotations.clone()),
            },
            Disposition::Abandon(annotations),
        )
        .await
    }

    /// Gives the message back without counting a delivery (AMQP `released`; Service Bus does
    /// not raise the delivery count on it, <https://github.com/Azure/amqpnetlite/issues/342>).
    /// Only on the delivery's own link: without it the lock simply runs out.
    ///
    /// # Errors
    /// As [`ServiceBusDelivery::complete`].
    pub async fn release(&self) -> Result<(), SettlementError> {
        let operation = self.receiver.telemetry.start(span::RELEASE, Kind::Settle);
        self.begin_settling();
        // `released` exists only on the link: no `$management` disposition gives a lock back
        // without counting a delivery, so without the link the lock simply runs out.
        let released = if self.link.gone.load(Ordering::Acquire) {
            Ok(())
        } else {
            match self
                .settle_on_link(Outcome::Released)
                .instrument(operation.span.clone())
                .await
            {
                Attempt::Done | Attempt::LinkGone => Ok(()),
                Attempt::Retry(why) | Attempt::Busy(why) => Err(SettlementError::Transient(why)),
                Attempt::Failed(error) => Err(error),
            }
        };
        operation.end(released.as_ref().err().map(SettlementError::error_type));
        released
    }

    /// Moves the message to the dead-letter sub-queue with `reason` and `description` (the
    /// `DeadLetterReason` and `DeadLetterErrorDescription` properties Service Bus writes).
    ///
    /// # Errors
    /// As [`ServiceBusDelivery::complete`].
    pub async fn dead_letter(
        &self,
        reason: &str,
        description: &str,
    ) -> Result<(), SettlementError> {
        self.settle(
            span::DEAD_LETTER,
            dead_letter_outcome(reason, description),
            Disposition::DeadLetter {
                reason: reason.to_owned(),
                description: description.to_owned(),
            },
        )
        .await
    }
}

impl Drop for ServiceBusDelivery {
    /// A delivery dropped without a settlement the broker answered (its lock was lost, or the
    /// holder gave up on it) is released, best effort: the broker's answer (`released`, or
    /// lock-lost once the lock is gone) clears it from the link's unsettled deliveries, which
    /// would otherwise grow for the life of the link. A lock still held is given back without
    /// counting a delivery.
    fn drop(&mut self) {
        // Its slot in a pipelined receiver's window is free again, or its settlement is no
        // longer in flight.
        if self.settling.load(Ordering::Acquire) {
            self.receiver.settling.fetch_sub(1, Ordering::AcqRel);
        } else {
            self.receiver.in_hand.fetch_sub(1, Ordering::AcqRel);
        }
        self.receiver.freed.notify_one();
        if self.settled.load(Ordering::Acquire) || self.link.gone.load(Ordering::Acquire) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (settler, delivery_id) = (self.link.settler.clone(), self.delivery_id);
        let timeout = self.receiver.client.timeout();
        runtime.spawn(async move {
            // Best effort: a lost answer only leaves the entry until the link ends.
            let _ =
                tokio::time::timeout(timeout, settler.settle(delivery_id, Outcome::Released)).await;
        });
    }
}
