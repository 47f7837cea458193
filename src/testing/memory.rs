//! The in-memory peek-lock broker: its queue state on an injected clock, its receiver and
//! deliveries, its [`Sender`] side, and the faults a test can inject into each.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use uuid::Uuid;

use crate::ports::{
    Delivery, Message, PropertyValue, ReceiveError, Receiver, SendFailure, Sender, SettleError,
};
use crate::runtime::Clock;

/// How renewals fail, when told to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RenewFault {
    /// Renewals succeed.
    #[default]
    None,
    /// Renewals fail with a transient error (the broker is unreachable).
    Transient,
    /// Renewals fail with `LockLost`.
    LockLost,
}

/// A message in the dead-letter subqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLettered {
    /// The message.
    pub message: Message,
    /// `DeadLetterReason`.
    pub reason: String,
    /// `DeadLetterErrorDescription`.
    pub description: String,
    /// Deliveries before it was dead-lettered.
    pub delivery_count: u32,
}

/// A message sent through the broker's [`Sender`] port (delayed-retry copies, relayed outbox
/// messages).
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    /// The destination the sender named.
    pub destination: String,
    /// The message.
    pub message: Message,
    /// When it was to become available (`None`: at once).
    pub scheduled_enqueue_time: Option<SystemTime>,
    /// When it was sent, on the broker's clock.
    pub sent_at: SystemTime,
}

/// What the broker has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct BrokerCounts {
    /// Messages sent.
    pub sent: u64,
    /// Deliveries handed out (first deliveries and redeliveries).
    pub delivered: u64,
    /// Completions accepted.
    pub completed: u64,
    /// Abandons accepted.
    pub abandoned: u64,
    /// Releases accepted (given back without counting a delivery).
    pub released: u64,
    /// Messages dead-lettered (by a consumer or by max delivery count).
    pub dead_lettered: u64,
    /// Renewals accepted.
    pub renewed: u64,
    /// Locks that ran out before settlement.
    pub expired: u64,
    /// Settlements or renewals refused because the lock was lost.
    pub lock_lost: u64,
    /// Messages available now.
    pub ready: u64,
    /// Messages locked now.
    pub locked: u64,
    /// Messages waiting for their scheduled enqueue time now.
    pub scheduled: u64,
}

#[derive(Debug, Clone)]
struct Stored {
    message: Message,
    delivery_count: u32,
    /// When the broker accepted it, on the broker's clock.
    enqueued: SystemTime,
}

#[derive(Debug)]
struct Locked {
    stored: Stored,
    until: SystemTime,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<Stored>,
    locked: HashMap<Uuid, Locked>,
    /// In the order they were sent; released to `ready` once due.
    scheduled: Vec<(SystemTime, Stored)>,
    dead: Vec<DeadLettered>,
    sent: Vec<SentMessage>,
    counts: BrokerCounts,
    fail_settlements: u32,
    fail_sends: u32,
    renew_fault: RenewFault,
    closed: bool,
}

impl State {
    /// When something next changes by itself: a lock runs out or a scheduled message is due.
    fn next_wake(&self) -> Option<SystemTime> {
        let expiry = self.locked.values().map(|l| l.until);
        let due = self.scheduled.iter().map(|(at, _)| *at);
        expiry.chain(due).min()
    }
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Notify,
    clock: Clock,
    lock_duration: Duration,
    max_delivery_count: u32,
}

/// An in-memory peek-lock queue with fault injection.
///
/// It is also a [`Sender`]: whatever the destination, a sent message lands in this queue, at
/// once or at its scheduled enqueue time on the broker's clock, and is recorded for
/// [`MemoryBroker::sent`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use sb_inbox::testing::MemoryBroker;
/// use sb_inbox::{Clock, Delivery, Message};
/// let broker = MemoryBroker::new(Clock::new());
/// broker.send(Message::new("m-1", "orders.order-placed.v1", "{}"));
/// let delivery = broker.try_receive().expect("one message");
/// delivery.complete().await.expect("lock held");
/// assert_eq!(broker.counts().completed, 1);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryBroker {
    shared: Arc<Shared>,
}

impl MemoryBroker {
    /// A broker with a 30 s lock and max delivery count 10.
    pub fn new(clock: Clock) -> Self {
        MemoryBroker::with_options(clock, Duration::from_secs(30), 10)
    }

    /// A broker with the given lock duration and max delivery count.
    pub fn with_options(clock: Clock, lock_duration: Duration, max_delivery_count: u32) -> Self {
        MemoryBroker {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                clock,
                lock_duration,
                max_delivery_count,
            }),
        }
    }

    /// The broker's clock: a runtime in the same test should run on it, since two clocks made
    /// at different moments differ by the real time between them while tokio's clock is
    /// paused (locks would then look shorter or longer than they are).
    pub fn clock(&self) -> Clock {
        self.shared.clock
    }

    /// The lock duration.
    pub fn lock_duration(&self) -> Duration {
        self.shared.lock_duration
    }

    /// Enqueues a message.
    pub fn send(&self, message: Message) {
        self.shared.update(|state| {
            state.counts.sent += 1;
            state.ready.push_back(Stored {
                message,
                delivery_count: 0,
                enqueued: self.shared.clock.now(),
            });
        });
    }

    /// Enqueues `copies` separate broker messages with the same message id, as a relay that
    /// published twice would: each is delivered and settled on its own.
    pub fn send_copies(&self, message: Message, copies: usize) {
        for _ in 0..copies {
            self.send(message.clone());
        }
    }

    /// A receiver on this broker.
    pub fn receiver(&self) -> MemoryReceiver {
        MemoryReceiver {
            broker: self.clone(),
        }
    }

    /// Takes the next available message under a new lock, without waiting.
    pub fn try_receive(&self) -> Option<MemoryDelivery> {
        self.shared.update(|state| self.shared.take(state))
    }

    /// Makes the next `count` sends through the [`Sender`] port fail transiently (nothing is
    /// enqueued).
    pub fn fail_next_sends(&self, count: u32) {
        self.shared.update(|state| state.fail_sends = count);
    }

    /// Messages sent through the [`Sender`] port, in order.
    pub fn sent(&self) -> Vec<SentMessage> {
        self.shared.lock().sent.clone()
    }

    /// Makes the next `count` settlements fail transiently without reaching the queue: the
    /// message stays locked until its lock runs out, as when a process dies after its commit.
    pub fn fail_next_settlements(&self, count: u32) {
        self.shared.update(|state| state.fail_settlements = count);
    }

    /// Sets how renewals behave from now on.
    pub fn set_renew_fault(&self, fault: RenewFault) {
        self.shared.update(|state| state.renew_fault = fault);
    }

    /// Ends every lock now: their messages become available again.
    pub fn expire_all_locks(&self) {
        let now = self.shared.clock.now();
        self.shared.update(|state| {
            for locked in state.locked.values_mut() {
                locked.until = now;
            }
            self.shared.expire(state);
        });
    }

    /// Closes the broker: receivers return `None` once no message is available.
    pub fn close(&self) {
        self.shared.update(|state| state.closed = true);
    }

    /// The counters now.
    pub fn counts(&self) -> BrokerCounts {
        let mut state = self.shared.lock();
        self.shared.expire(&mut state);
        let mut counts = state.counts;
        counts.ready = state.ready.len() as u64;
        counts.locked = state.locked.len() as u64;
        counts.scheduled = state.scheduled.len() as u64;
        counts
    }

    /// The dead-letter subqueue.
    pub fn dead_letters(&self) -> Vec<DeadLettered> {
        self.shared.lock().dead.clone()
    }

    /// Waits until every message is settled or dead-lettered (none ready, locked or scheduled).
    pub async fn wait_idle(&self) {
        loop {
            let changed = self.shared.changed.notified();
            let next_expiry = {
                let mut state = self.shared.lock();
                self.shared.expire(&mut state);
                if state.ready.is_empty() && state.locked.is_empty() && state.scheduled.is_empty() {
                    return;
                }
                state.next_wake()
            };
            match next_expiry {
                Some(until) => {
                    tokio::select! {
                        () = changed => {}
                        () = self.shared.clock.sleep_until(until) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock is a test bug; keep serving the other tasks.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn update<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let result = {
            let mut state = self.lock();
            self.expire(&mut state);
            f(&mut state)
        };
        self.changed.notify_waiters();
        result
    }

    /// Returns locks that ran out to the queue, counting the delivery, and releases scheduled
    /// messages that are due.
    fn expire(&self, state: &mut State) {
        let now = self.clock.now();
        let (due, waiting) = std::mem::take(&mut state.scheduled)
            .into_iter()
            .partition::<Vec<_>, _>(|(at, _)| *at <= now);
        state.scheduled = waiting;
        state
            .ready
            .extend(due.into_iter().map(|(_, stored)| stored));
        let expired: Vec<Uuid> = state
            .locked
            .iter()
            .filter(|(_, l)| l.until <= now)
            .map(|(t, _)| *t)
            .collect();
        for token in expired {
            if let Some(locked) = state.locked.remove(&token) {
                state.counts.expired += 1;
                self.requeue(state, locked.stored);
            }
        }
    }

    fn requeue(&self, state: &mut State, mut stored: Stored) {
        stored.delivery_count += 1;
        if stored.delivery_count >= self.max_delivery_count {
            state.counts.dead_lettered += 1;
            state.dead.push(DeadLettered {
                message: stored.message,
                reason: "MaxDeliveryCountExceeded".to_owned(),
                description: format!(
                    "Message could not be consumed after {} delivery attempts.",
                    stored.delivery_count
                ),
                delivery_count: stored.delivery_count,
            });
        } else {
            state.ready.push_back(stored);
        }
    }

    fn take(self: &Arc<Self>, state: &mut State) -> Option<MemoryDelivery> {
        let stored = state.ready.pop_front()?;
        let token = Uuid::new_v4();
        let until = self.clock.now() + self.lock_duration;
        state.counts.delivered += 1;
        state.locked.insert(
            token,
            Locked {
                stored: stored.clone(),
                until,
            },
        );
        Some(MemoryDelivery {
            shared: self.clone(),
            token,
            message: stored.message,
            delivery_count: stored.delivery_count,
            enqueued: stored.enqueued,
            locked_until: Mutex::new(until),
        })
    }

    /// Takes the lock of `token` for a settlement, or says why it cannot.
    fn settle(&self, token: Uuid, f: impl FnOnce(&mut State, Stored)) -> Result<(), SettleError> {
        let result = {
            let mut state = self.lock();
            self.expire(&mut state);
            if state.fail_settlements > 0 {
                state.fail_settlements -= 1;
                return Err(SettleError::transient("injected settlement failure"));
            }
            match state.locked.remove(&token) {
                Some(locked) => {
                    f(&mut state, locked.stored);
                    Ok(())
                }
                None => {
                    state.counts.lock_lost += 1;
                    Err(SettleError::LockLost)
                }
            }
        };
        self.changed.notify_waiters();
        result
    }
}

impl MemoryBroker {
    fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }
}

/// A receiver on a [`MemoryBroker`].
#[derive(Debug, Clone)]
pub struct MemoryReceiver {
    broker: MemoryBroker,
}

impl Receiver for MemoryReceiver {
    type Delivery = MemoryDelivery;

    fn source(&self) -> crate::ports::Source {
        crate::ports::Source::new("memory", "memory")
    }

    async fn receive(&self) -> Result<Option<MemoryDelivery>, ReceiveError> {
        let shared = self.broker.shared();
        loop {
            let changed = shared.changed.notified();
            let next_expiry = {
                let mut state = shared.lock();
                shared.expire(&mut state);
                if let Some(delivery) = shared.take(&mut state) {
                    return Ok(Some(delivery));
                }
                if state.closed {
                    return Ok(None);
                }
                state.next_wake()
            };
            match next_expiry {
                Some(until) => {
                    tokio::select! {
                        () = changed => {}
                        () = shared.clock.sleep_until(until) => {}
                    }
                }
                None => changed.await,
            }
        }
    }
}

impl Sender for MemoryBroker {
    async fn send(
        &self,
        destination: &str,
        message: Message,
        scheduled_enqueue_time: Option<SystemTime>,
    ) -> Result<(), SendFailure> {
        let sent_at = self.shared.clock.now();
        self.shared.update(|state| {
            if state.fail_sends > 0 {
                state.fail_sends -= 1;
                return Err(SendFailure::transient("injected send failure"));
            }
            state.counts.sent += 1;
            state.sent.push(SentMessage {
                destination: destination.to_owned(),
                message: message.clone(),
                scheduled_enqueue_time,
                sent_at,
            });
            // A scheduled message counts as enqueued when it becomes available.
            let stored = Stored {
                message,
                delivery_count: 0,
                enqueued: scheduled_enqueue_time.map_or(sent_at, |at| at.max(sent_at)),
            };
            match scheduled_enqueue_time {
                Some(at) if at > sent_at => state.scheduled.push((at, stored)),
                _ => state.ready.push_back(stored),
            }
            Ok(())
        })
    }
}

/// A delivery from a [`MemoryBroker`].
#[derive(Debug)]
pub struct MemoryDelivery {
    shared: Arc<Shared>,
    token: Uuid,
    message: Message,
    delivery_count: u32,
    enqueued: SystemTime,
    locked_until: Mutex<SystemTime>,
}

impl Delivery for MemoryDelivery {
    fn message(&self) -> &Message {
        &self.message
    }

    fn delivery_count(&self) -> u32 {
        self.delivery_count
    }

    fn lock_token(&self) -> Uuid {
        self.token
    }

    fn enqueued_time(&self) -> Option<SystemTime> {
        Some(self.enqueued)
    }

    fn locked_until(&self) -> SystemTime {
        *self
            .locked_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn renew_lock(&self) -> Result<SystemTime, SettleError> {
        let mut state = self.shared.lock();
        self.shared.expire(&mut state);
        match state.renew_fault {
            RenewFault::Transient => {
                return Err(SettleError::transient("injected renewal failure"));
            }
            RenewFault::LockLost => {
                state.counts.lock_lost += 1;
                return Err(SettleError::LockLost);
            }
            RenewFault::None => {}
        }
        let until = self.shared.clock.now() + self.shared.lock_duration;
        match state.locked.get_mut(&self.token) {
            Some(locked) => {
                locked.until = until;
                state.counts.renewed += 1;
                *self
                    .locked_until
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = until;
                Ok(until)
            }
            None => {
                state.counts.lock_lost += 1;
                Err(SettleError::LockLost)
            }
        }
    }

    async fn complete(&self) -> Result<(), SettleError> {
        self.shared
            .settle(self.token, |state, _| state.counts.completed += 1)
    }

    async fn abandon(
        &self,
        properties: BTreeMap<String, PropertyValue>,
    ) -> Result<(), SettleError> {
        let shared = self.shared.clone();
        self.shared.settle(self.token, move |state, mut stored| {
            state.counts.abandoned += 1;
            stored.message.application_properties.extend(properties);
            shared.requeue(state, stored);
        })
    }

    async fn release(&self) -> Result<(), SettleError> {
        self.shared.settle(self.token, |state, stored| {
            state.counts.released += 1;
            state.ready.push_front(stored);
        })
    }

    async fn dead_letter(&self, reason: &str, description: &str) -> Result<(), SettleError> {
        self.shared.settle(self.token, |state, stored| {
            state.counts.dead_lettered += 1;
            state.dead.push(DeadLettered {
                message: stored.message,
                reason: reason.to_owned(),
                description: description.to_owned(),
                delivery_count: stored.delivery_count,
            });
        })
    }
}
