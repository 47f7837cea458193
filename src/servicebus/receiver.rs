use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, SystemTime};

use sb_amqp::codec::Value;
use sb_amqp::codec::primitives::OrderedMap;
use sb_amqp::types::definitions::{Fields, ReceiverSettleMode, SenderSettleMode};
use sb_amqp::types::primitives::Symbol;
use sb_amqp::{AmqpError, Outcome, ReceiverOptions, RequestResponse, Settler, unique_name};
use tokio::sync::Mutex;

use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::amqp_message::{Received, Refusal, from_amqp};
use super::client::Link;
use super::telemetry::{EntityTelemetry, Kind};
use super::{ServiceBusClient, management};
use crate::runtime::DeadLetterReason;
use crate::telemetry::names::{error, span};
use crate::telemetry::propagation::producer_context;
use crate::{Delivery, Message, PropertyValue, ReceiveError, Receiver, SettleError, Source};

/// How long [`ServiceBusReceiver::close`] waits for the broker.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a settlement or a renewal waits for the broker's answer (Service Bus's own server
/// timeout is 30 s); past it the outcome is unknown: a transient error.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);

/// A peek-lock receiver implementing the runtime's [`Receiver`] port.
///
/// Credit follows demand: each [`Receiver::receive`] call grants one message, plus up to
/// `prefetch` more (not renewed while they wait on the link: under a [`crate::Runtime`], use
/// its prefetch instead). A delivery it cannot hand to the runtime (undecodable, an unusable
/// message id) it dead-letters itself and skips. After a connection failure the next receive reconnects; deliveries of the
/// lost link can no longer be settled or renewed: their renewals report `LockLost`, which fences
/// their commit.
#[derive(Debug, Clone)]
pub struct ServiceBusReceiver {
    inner: Arc<ReceiverInner>,
}

#[derive(Debug)]
struct ReceiverInner {
    client: ServiceBusClient,
    entity: String,
    prefetch: u32,
    link: Mutex<Option<ReceiveLink>>,
    telemetry: EntityTelemetry,
}

#[derive(Debug)]
struct ReceiveLink {
    receiver: sb_amqp::Receiver,
    shared: Arc<LinkShared>,
    granted: bool,
}

/// What deliveries of one link share.
#[derive(Debug)]
struct LinkShared {
    settler: Settler,
    management: RequestResponse,
    name: String,
    generation: u64,
    client: ServiceBusClient,
}

impl ServiceBusReceiver {
    pub(crate) fn new(client: ServiceBusClient, entity: &str, prefetch: u32) -> Self {
        ServiceBusReceiver {
            inner: Arc::new(ReceiverInner {
                telemetry: EntityTelemetry::new(entity, client.host()),
                client,
                entity: entity.to_owned(),
                prefetch,
                link: Mutex::new(None),
            }),
        }
    }

    /// The entity this receiver reads.
    pub fn entity(&self) -> &str {
        &self.inner.entity
    }

    async fn attach(&self) -> Result<ReceiveLink, ReceiveError> {
        let inner = &self.inner;
        let link: Arc<Link> = inner.client.link().await.map_err(transient)?;
        inner
            .client
            .authorize(&link, &inner.entity)
            .await
            .map_err(classify)?;
        let management_node = format!("{}/$management", inner.entity);
        inner
            .client
            .authorize(&link, &management_node)
            .await
            .map_err(classify)?;
        let name = unique_name("sb-inbox-receiver");
        let options = ReceiverOptions::new(name.clone(), inner.entity.clone())
            .rcv_settle_mode(ReceiverSettleMode::Second)
            .snd_settle_mode(SenderSettleMode::Unsettled);
        let receiver = link
            .session
            .attach_receiver(options)
            .await
            .map_err(|e| classify_amqp(&e))?;
        let management = RequestResponse::attach(&link.session, &management_node)
            .await
            .map_err(|e| classify_amqp(&e))?;
        if inner.prefetch > 0 {
            receiver
                .add_credit(inner.prefetch)
                .await
                .map_err(|e| classify_amqp(&e))?;
        }
        Ok(ReceiveLink {
            shared: Arc::new(LinkShared {
                settler: receiver.settler(),
                management,
                name,
                generation: link.generation,
                client: inner.client.clone(),
            }),
            receiver,
            granted: false,
        })
    }

    /// Returns every delivery received but not handed out to the broker (released: no delivery
    /// count), then detaches. Call on shutdown.
    pub async fn close(&self) {
        let Some(link) = self.inner.link.lock().await.take() else {
            return;
        };
        // Shutdown must not hang on a broker that does not answer: after the bound, the locks
        // of anything prefetched simply run out.
        let closing = async {
            if link.receiver.drain().await.is_ok() {
                while let Ok(Some(delivery)) = link.receiver.try_recv() {
                    // Best effort: the lock runs out anyway if the release is lost.
                    let _ = link.receiver.release(&delivery).await;
                }
            }
            let _ = link.receiver.detach().await;
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, closing).await.is_err() {
            tracing::warn!(entity = %self.inner.entity, "Receiver close timed out; dropping the link.");
        }
    }
}

fn transient(error: super::ServiceBusError) -> ReceiveError {
    ReceiveError::Transient(error.to_string())
}

fn classify(error: super::ServiceBusError) -> ReceiveError {
    if error.is_transient() {
        ReceiveError::Transient(error.to_string())
    } else {
        ReceiveError::Fatal(error.to_string())
    }
}

fn classify_amqp(error: &sb_amqp::Error) -> ReceiveError {
    classify(super::ServiceBusError::from_amqp(error))
}

impl Receiver for ServiceBusReceiver {
    type Delivery = ServiceBusDelivery;

    fn source(&self) -> Source {
        self.inner.telemetry.source()
    }

    /// Under a `receive {entity}` client span, linked to the message's producer.
    async fn receive(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        let operation = self.inner.telemetry.start(span::RECEIVE, Kind::Receive);
        let received = self.next().instrument(operation.span.clone()).await;
        match &received {
            Ok(Some(delivery)) => {
                if let Some(producer) = producer_context(delivery.message()) {
                    operation.span.add_link(producer);
                }
                operation.received();
            }
            Ok(None) => operation.end(None),
            Err(ReceiveError::Transient(_)) => operation.end(Some(error::TRANSIENT)),
            Err(_) => operation.end(Some(error::REFUSED)),
        }
        received
    }
}

impl ServiceBusReceiver {
    /// The next delivery the runtime can take; those it cannot (undecodable, an unusable
    /// message id) are dead-lettered here and skipped.
    async fn next(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        loop {
            if let Some(delivery) = self.next_or_refused().await? {
                return Ok(Some(delivery));
            }
        }
    }

    /// The next delivery, or `None` after dead-lettering one the runtime cannot take.
    async fn next_or_refused(&self) -> Result<Option<ServiceBusDelivery>, ReceiveError> {
        let mut guard = self.inner.link.lock().await;
        if guard.is_none() {
            *guard = Some(self.attach().await?);
        }
        let Some(link) = guard.as_mut() else {
            return Err(ReceiveError::Transient("no link".into()));
        };
        let result = async {
            // One credit per outstanding receive; a receive cancelled after granting leaves its
            // credit for the next call instead of granting again.
            if !link.granted {
                link.receiver.add_credit(1).await?;
                link.granted = true;
            }
            let delivery = link.receiver.recv().await?;
            link.granted = false;
            Ok::<_, sb_amqp::Error>(delivery)
        }
        .await;
        let delivery = match result {
            Ok(delivery) => delivery,
            Err(error) => {
                // The link or the connection is gone: the next receive attaches anew.
                let generation = link.shared.generation;
                *guard = None;
                self.inner.client.reset(generation).await;
                return Err(classify_amqp(&error));
            }
        };
        let refusal = match delivery.message() {
            Ok(message) => {
                let received = from_amqp(&message, &delivery.delivery_tag);
                match received.refusal.clone() {
                    None => return Ok(Some(self.delivery(link, delivery.delivery_id, received))),
                    Some(refusal) => refusal,
                }
            }
            // Redelivering it cannot help: every delivery of it would fail the same way.
            Err(error) => Refusal {
                reason: DeadLetterReason::UndecodableMessage,
                description: crate::runtime::truncate(
                    &format!("the AMQP message does not decode: {error}"),
                    crate::runtime::MAX_DESCRIPTION_LEN,
                ),
            },
        };
        tracing::warn!(entity = %self.inner.entity, reason = %refusal.reason, description = %refusal.description, "Dead-lettering a delivery the client cannot take.");
        let outcome = dead_letter_outcome(refusal.reason.as_str(), &refusal.description);
        match tokio::time::timeout(
            OPERATION_TIMEOUT,
            link.shared.settler.settle(delivery.delivery_id, outcome),
        )
        .await
        {
            Ok(Ok(Some(Outcome::Rejected(Some(error))))) => {
                tracing::warn!(condition = %error.condition, "The broker refused the dead-lettering.");
            }
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%error, "Dead-lettering failed."),
            Err(_) => tracing::warn!("The broker did not answer the dead-lettering in time."),
        }
        Ok(None)
    }

    fn delivery(
        &self,
        link: &ReceiveLink,
        delivery_id: u32,
        received: Received,
    ) -> ServiceBusDelivery {
        let lock_token = received.lock_token.unwrap_or_else(uuid::Uuid::nil);
        let locked_until = received
            .locked_until
            .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(30));
        ServiceBusDelivery {
            receiver: self.inner.clone(),
            link: link.shared.clone(),
            delivery_id,
            lock_token,
            locked_until: StdMutex::new(locked_until),
            settled: AtomicBool::new(false),
            received,
        }
    }

    /// Received deliveries of the current link not settled yet (0 without a link): what a
    /// settlement or a drop has not cleared yet.
    pub async fn unsettled(&self) -> usize {
        let guard = self.inner.link.lock().await;
        match guard.as_ref() {
            Some(link) => link.shared.settler.unsettled().await.unwrap_or(0),
            None => 0,
        }
    }
}

/// The disposition that dead-letters with a reason and a description.
fn dead_letter_outcome(reason: &str, description: &str) -> Outcome {
    let info = fields([
        (
            "DeadLetterReason".to_owned(),
            Value::String(reason.to_owned()),
        ),
        (
            "DeadLetterErrorDescription".to_owned(),
            Value::String(description.to_owned()),
        ),
    ]);
    Outcome::Rejected(Some(
        AmqpError::new(sb_amqp::condition::DEAD_LETTER, None).with_info(info),
    ))
}

/// A peek-locked Service Bus delivery.
#[derive(Debug)]
pub struct ServiceBusDelivery {
    /// Keeps the receive link attached while the delivery waits for its settlement, even if
    /// the caller dropped its receiver handle; its telemetry names the settlement spans.
    receiver: Arc<ReceiverInner>,
    link: Arc<LinkShared>,
    delivery_id: u32,
    lock_token: uuid::Uuid,
    locked_until: StdMutex<SystemTime>,
    /// The broker answered a settlement: nothing is left to clear on drop.
    settled: AtomicBool,
    received: Received,
}

impl ServiceBusDelivery {
    /// The broker's sequence number.
    pub fn sequence_number(&self) -> Option<i64> {
        self.received.sequence_number
    }

    fn link_lost(&self) -> bool {
        self.link.client.generation() != self.link.generation
    }

    /// Settles under a `{disposition} {entity}` client span.
    async fn settle(&self, name: &'static str, outcome: Outcome) -> Result<(), SettleError> {
        let operation = self.receiver.telemetry.start(name, Kind::Settle);
        let settled = self
            .settle_now(outcome)
            .instrument(operation.span.clone())
            .await;
        operation.end(settled.as_ref().err().map(SettleError::error_type));
        settled
    }

    async fn renew_now(&self) -> Result<SystemTime, SettleError> {
        if self.link_lost() {
            return Err(SettleError::LockLost);
        }
        let until = tokio::time::timeout(
            OPERATION_TIMEOUT,
            management::renew_lock(&self.link.management, &self.link.name, self.lock_token),
        )
        .await
        .map_err(|_| {
            SettleError::Transient("the broker did not answer the renewal in time".into())
        })??;
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
        Ok(until)
    }

    async fn settle_now(&self, outcome: Outcome) -> Result<(), SettleError> {
        if self.link_lost() {
            return Err(SettleError::LockLost);
        }
        let settled = tokio::time::timeout(
            OPERATION_TIMEOUT,
            self.link.settler.settle(self.delivery_id, outcome),
        )
        .await;
        let Ok(settled) = settled else {
            return Err(SettleError::Transient(
                "the broker did not answer the settlement in time".into(),
            ));
        };
        if settled.is_ok() || settled.as_ref().is_err_and(sb_amqp::Error::is_lock_lost) {
            self.settled.store(true, Ordering::Release);
        }
        match settled {
            Ok(Some(Outcome::Rejected(Some(error)))) if error.is_lock_lost() => {
                Err(SettleError::LockLost)
            }
            Ok(Some(Outcome::Rejected(Some(error)))) => Err(SettleError::Refused {
                condition: error.condition,
                description: error.description.unwrap_or_default(),
            }),
            Ok(_) => Ok(()),
            Err(error) if error.is_lock_lost() => Err(SettleError::LockLost),
            Err(error) => Err(SettleError::Transient(error.to_string())),
        }
    }
}

fn fields(entries: impl IntoIterator<Item = (String, Value)>) -> Fields {
    let mut map = OrderedMap::new();
    for (key, value) in entries {
        map.insert(Symbol::from(key), value);
    }
    map
}

fn amqp_value(value: &PropertyValue) -> Value {
    match value {
        PropertyValue::String(s) => Value::String(s.clone()),
        PropertyValue::Long(n) => Value::Long(*n),
        PropertyValue::Double(f) => Value::Double((*f).into()),
        PropertyValue::Bool(b) => Value::Bool(*b),
    }
}

impl Delivery for ServiceBusDelivery {
    fn message(&self) -> &Message {
        &self.received.message
    }

    fn delivery_count(&self) -> u32 {
        self.received.delivery_count
    }

    fn lock_token(&self) -> uuid::Uuid {
        self.lock_token
    }

    fn locked_until(&self) -> SystemTime {
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn enqueued_time(&self) -> Option<SystemTime> {
        self.received.enqueued_time
    }

    async fn renew_lock(&self) -> Result<SystemTime, SettleError> {
        let operation = self.receiver.telemetry.start(span::RENEW_LOCK, Kind::Renew);
        let renewed = self.renew_now().instrument(operation.span.clone()).await;
        operation.end(renewed.as_ref().err().map(SettleError::error_type));
        renewed
    }

    async fn complete(&self) -> Result<(), SettleError> {
        self.settle(span::COMPLETE, Outcome::Accepted).await
    }

    async fn abandon(
        &self,
        properties: BTreeMap<String, PropertyValue>,
    ) -> Result<(), SettleError> {
        let annotations = (!properties.is_empty())
            .then(|| fields(properties.iter().map(|(k, v)| (k.clone(), amqp_value(v)))));
        self.settle(
            span::ABANDON,
            Outcome::Modified {
                delivery_failed: true,
                undeliverable_here: false,
                message_annotations: annotations,
            },
        )
        .await
    }

    async fn release(&self) -> Result<(), SettleError> {
        self.settle(span::RELEASE, Outcome::Released).await
    }

    async fn dead_letter(&self, reason: &str, description: &str) -> Result<(), SettleError> {
        self.settle(span::DEAD_LETTER, dead_letter_outcome(reason, description))
            .await
    }
}

impl Drop for ServiceBusDelivery {
    /// A delivery dropped without a settlement the broker answered (its lock was lost, or the
    /// runtime gave up on it) is released, best effort: the broker's answer (`released`, or
    /// lock-lost once the lock is gone) clears it from the link's unsettled deliveries, which
    /// would otherwise grow for the life of the link. A lock still held is given back without
    /// counting a delivery.
    fn drop(&mut self) {
        if self.settled.load(Ordering::Acquire) || self.link_lost() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (settler, delivery_id) = (self.link.settler.clone(), self.delivery_id);
        runtime.spawn(async move {
            // Best effort: a lost answer only leaves the entry until the link ends.
            let _ = tokio::time::timeout(
                OPERATION_TIMEOUT,
                settler.settle(delivery_id, Outcome::Released),
            )
            .await;
        });
    }
}
