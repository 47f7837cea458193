//! The in-memory namespace and the per-link entity handle.
//!
//! # Concurrency
//! Each queue and subscription has one `std::sync::Mutex` around all of its state (both
//! subqueues) and one [`tokio::sync::Notify`] for waiting receivers; a topic has a mutex for its
//! sequence numbers and duplicate detection. No operation holds two of these locks at once:
//! fan-out and forwarding lock one entity after another, and nothing awaits under a lock.
//!
//! # Timers
//! Lock expiry, TTL and scheduled times are evaluated lazily on the injected [`Clock`]: every
//! operation first processes the timers due at `now`, and a waiting receiver sleeps until the
//! entity's next due time (or a notification), so paused-time tests drive them with
//! `tokio::time::advance`.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::address::{Address, EntityPath};
use crate::clock::Clock;
use crate::config::{Config, EntityProperties, TopicProperties};
use crate::error::{Error, Result};
use crate::filter::Rule;
use crate::message::{BrokerMessage, Properties, ReceiveMode, ReceivedMessage};
use crate::queue::{DupWindow, EntityCounts, QueueState, SessionLock, Settlement};

/// How many `ForwardTo` hops a message may take (Service Bus allows four).
const MAX_FORWARD_HOPS: u8 = 4;

/// The longest rule name Service Bus accepts (`Constants.ruleNameMaximumLength` in
/// `@azure/core-amqp`).
const MAX_RULE_NAME_LENGTH: usize = 50;

/// What happened to a sent message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOutcome {
    /// Stored (or fanned out, or forwarded) under this sequence number of the addressed entity
    /// (for a forwarded message: of the entity that finally stored it).
    Accepted {
        /// The sequence number.
        sequence_number: i64,
    },
    /// Dropped by duplicate detection; the sender still sees success, as with Service Bus.
    Duplicate,
}

impl SendOutcome {
    /// The sequence number, unless the message was a dropped duplicate.
    pub fn sequence_number(self) -> Option<i64> {
        match self {
            SendOutcome::Accepted { sequence_number } => Some(sequence_number),
            SendOutcome::Duplicate => None,
        }
    }
}

/// The `disposition-status` of a `com.microsoft:update-disposition` management request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispositionStatus {
    /// `completed`.
    Completed,
    /// `abandoned`.
    Abandoned,
    /// `defered` (sic, as on the wire).
    Defered,
    /// `suspended`: dead-letter.
    Suspended,
}

impl DispositionStatus {
    /// Parses the wire value (case-insensitive).
    pub fn parse(value: &str) -> Option<Self> {
        match value.to_ascii_lowercase().as_str() {
            "completed" => Some(DispositionStatus::Completed),
            "abandoned" => Some(DispositionStatus::Abandoned),
            "defered" | "deferred" => Some(DispositionStatus::Defered),
            "suspended" => Some(DispositionStatus::Suspended),
            _ => None,
        }
    }
}

/// A queue or subscription: its state and its waiting receivers.
#[derive(Debug)]
struct MessageQueue {
    path: String,
    props: EntityProperties,
    /// Subscriptions do not show scheduled messages in peek (they stay with the topic).
    is_subscription: bool,
    state: Mutex<QueueState>,
    notify: Notify,
}

impl MessageQueue {
    fn new(path: String, props: EntityProperties, is_subscription: bool) -> Self {
        MessageQueue {
            state: Mutex::new(QueueState::new(path.clone(), props.clone())),
            path,
            props,
            is_subscription,
            notify: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic under the lock cannot leave the state half-updated in a way that matters for
        // a test emulator; keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Debug)]
struct TopicState {
    next_seq: i64,
    dup: DupWindow,
    sent: u64,
    duplicates: u64,
}

#[derive(Debug)]
struct Subscription {
    /// Rules with their creation times; changed at run time by the `$management` rule
    /// operations, so fan-out reads them under this lock (never together with a queue lock).
    rules: Mutex<Vec<(Rule, SystemTime)>>,
    queue: Arc<MessageQueue>,
}

impl Subscription {
    fn rules(&self) -> MutexGuard<'_, Vec<(Rule, SystemTime)>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn matches(&self, msg: &BrokerMessage) -> bool {
        self.rules().iter().any(|(r, _)| r.filter.matches(msg))
    }
}

#[derive(Debug)]
struct Topic {
    name: String,
    props: TopicProperties,
    state: Mutex<TopicState>,
    subscriptions: Vec<(String, Arc<Subscription>)>,
}

impl Topic {
    fn lock(&self) -> MutexGuard<'_, TopicState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn subscription(&self, name: &str) -> Option<&Arc<Subscription>> {
        self.subscriptions
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, s)| s)
    }
}

#[derive(Debug, Clone)]
enum Node {
    Queue(Arc<MessageQueue>),
    Topic(Arc<Topic>),
}

struct Namespace {
    name: String,
    clock: Clock,
    /// Queues and topics by lower-case name.
    nodes: HashMap<String, Node>,
    /// Queues and subscriptions with `ForwardDeadLetteredMessagesTo`: their timers are
    /// processed on every operation, so a message they dead-letter by lock expiry or TTL
    /// reaches its target without waiting for an operation on the source.
    dlq_forwarders: Vec<Arc<MessageQueue>>,
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Namespace")
            .field("name", &self.name)
            .field("entities", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

impl Namespace {
    fn node(&self, name: &str) -> Result<&Node> {
        self.nodes
            .get(&name.to_ascii_lowercase())
            .ok_or_else(|| Error::NotFound {
                entity: name.to_owned(),
            })
    }

    /// Sends to a queue or topic, following `ForwardTo` up to [`MAX_FORWARD_HOPS`].
    fn route(&self, node: &Node, msg: BrokerMessage, hops: u8) -> Result<SendOutcome> {
        let now = self.clock.now();
        match node {
            Node::Queue(q) => {
                let (target, msg) = {
                    let mut st = q.lock();
                    st.tick(now);
                    let dup = q.props.requires_duplicate_detection
                        && msg.message_id.as_deref().is_some_and(|id| {
                            st.dup.is_duplicate(
                                id,
                                now,
                                q.props.duplicate_detection_history_time_window,
                            )
                        });
                    if dup {
                        st.counts.duplicates += 1;
                        tracing::debug!(entity = %q.path, message_id = ?msg.message_id, "Duplicate message dropped.");
                        return Ok(SendOutcome::Duplicate);
                    }
                    match &q.props.forward_to {
                        // Beyond the hop limit the message stays where it is.
                        Some(target) if hops < MAX_FORWARD_HOPS => {
                            st.counts.forwarded += 1;
                            (target.clone(), msg)
                        }
                        _ => {
                            let seq = st.next_seq;
                            st.next_seq += 1;
                            st.enqueue(msg, seq, now, None);
                            // Woken right here, so the next operation need not wake them again.
                            st.dirty = false;
                            drop(st);
                            q.notify.notify_waiters();
                            return Ok(SendOutcome::Accepted {
                                sequence_number: seq,
                            });
                        }
                    }
                };
                let node = self.node(&target)?.clone();
                self.route(&node, msg, hops + 1)
            }
            Node::Topic(t) => {
                let seq = {
                    let mut st = t.lock();
                    let dup = t.props.requires_duplicate_detection
                        && msg.message_id.as_deref().is_some_and(|id| {
                            st.dup.is_duplicate(
                                id,
                                now,
                                t.props.duplicate_detection_history_time_window,
                            )
                        });
                    if dup {
                        st.duplicates += 1;
                        tracing::debug!(entity = %t.name, message_id = ?msg.message_id, "Duplicate message dropped.");
                        return Ok(SendOutcome::Duplicate);
                    }
                    let seq = st.next_seq;
                    st.next_seq += 1;
                    st.sent += 1;
                    seq
                };
                for (_, sub) in &t.subscriptions {
                    if !sub.matches(&msg) {
                        continue;
                    }
                    let forward = {
                        let mut st = sub.queue.lock();
                        st.tick(now);
                        match &sub.queue.props.forward_to {
                            Some(target) if hops < MAX_FORWARD_HOPS => {
                                st.counts.forwarded += 1;
                                Some(target.clone())
                            }
                            _ => {
                                st.enqueue(
                                    msg.clone(),
                                    seq,
                                    now,
                                    Some(t.props.default_message_time_to_live),
                                );
                                // Woken below.
                                st.dirty = false;
                                None
                            }
                        }
                    };
                    match forward {
                        Some(target) => {
                            let node = self.node(&target)?.clone();
                            self.route(&node, msg.clone(), hops + 1)?;
                        }
                        None => sub.queue.notify.notify_waiters(),
                    }
                }
                Ok(SendOutcome::Accepted {
                    sequence_number: seq,
                })
            }
        }
    }

    /// Processes the timers of every dead-letter forwarder and forwards what they dead-letter.
    fn tick_forwarders(&self, now: SystemTime) {
        for queue in &self.dlq_forwarders {
            let (forwards, dirty) = {
                let mut st = queue.lock();
                st.tick(now);
                (
                    std::mem::take(&mut st.forwards),
                    std::mem::take(&mut st.dirty),
                )
            };
            if dirty {
                queue.notify.notify_waiters();
            }
            if !forwards.is_empty() {
                self.forward_dead_letters(queue, forwards);
            }
        }
    }

    /// The earliest timer of any dead-letter forwarder.
    fn forwarders_next_due(&self) -> Option<SystemTime> {
        self.dlq_forwarders
            .iter()
            .filter_map(|q| q.lock().next_due(false))
            .min()
    }

    /// Passes dead-lettered messages on to `ForwardDeadLetteredMessagesTo`.
    fn forward_dead_letters(&self, queue: &MessageQueue, messages: Vec<BrokerMessage>) {
        let Some(target) = &queue.props.forward_dead_lettered_messages_to else {
            return;
        };
        for msg in messages {
            let result = self
                .node(target)
                .and_then(|node| self.route(&node.clone(), msg, 1));
            if let Err(error) = result {
                tracing::warn!(entity = %queue.path, target = %target, %error, "Dead-lettered message could not be forwarded.");
            }
        }
    }
}

/// The in-memory Service Bus namespace: queues, topics and subscriptions from a [`Config`].
///
/// Cheap to clone (an `Arc`); share one per emulator and resolve link addresses with
/// [`Broker::entity`].
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use sb_emulator::{Broker, BrokerMessage, Config, QueueConfig, ReceiveMode};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), sb_emulator::Error> {
/// let broker = Broker::new(Config::new("sbemulatorns").with_queue(QueueConfig::new("q1")))?;
/// let q1 = broker.entity("amqp://localhost:5672/q1")?;
/// q1.send(BrokerMessage::new("hello").with_message_id("m1"))?;
/// let msg = q1.receive(ReceiveMode::PeekLock, Some(Duration::from_secs(1))).await?.unwrap();
/// assert_eq!(msg.delivery_count, 0);
/// q1.complete(msg.lock_token.unwrap()).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Broker {
    ns: Arc<Namespace>,
}

impl Broker {
    /// A broker on the real wall clock.
    ///
    /// # Errors
    /// [`Error::Config`] when the configuration does not validate.
    pub fn new(config: Config) -> Result<Broker> {
        Broker::with_clock(config, Clock::new())
    }

    /// A broker on the given clock (use a clock created inside a paused-time test).
    ///
    /// # Errors
    /// [`Error::Config`] when the configuration does not validate.
    pub fn with_clock(config: Config, clock: Clock) -> Result<Broker> {
        config.validate()?;
        let mut nodes = HashMap::new();
        let mut dlq_forwarders = Vec::new();
        for q in config.namespace.queues {
            let queue = Arc::new(MessageQueue::new(q.name.clone(), q.properties, false));
            if queue.props.forward_dead_lettered_messages_to.is_some() {
                dlq_forwarders.push(queue.clone());
            }
            nodes.insert(q.name.to_ascii_lowercase(), Node::Queue(queue));
        }
        for t in config.namespace.topics {
            let mut subscriptions = Vec::new();
            for s in t.subscriptions {
                let mut props = s.properties;
                props.requires_duplicate_detection = false;
                props.max_message_size = t.properties.max_message_size;
                let path = EntityPath::subscription(&t.name, &s.name).to_string();
                let rules = if s.rules.is_empty() {
                    vec![Rule::default_rule()]
                } else {
                    s.rules
                };
                let created = clock.now();
                let sub = Subscription {
                    rules: Mutex::new(rules.into_iter().map(|r| (r, created)).collect()),
                    queue: Arc::new(MessageQueue::new(path, props, true)),
                };
                if sub.queue.props.forward_dead_lettered_messages_to.is_some() {
                    dlq_forwarders.push(sub.queue.clone());
                }
                subscriptions.push((s.name, Arc::new(sub)));
            }
            let topic = Topic {
                name: t.name.clone(),
                props: t.properties,
                state: Mutex::new(TopicState {
                    next_seq: 1,
                    dup: DupWindow::default(),
                    sent: 0,
                    duplicates: 0,
                }),
                subscriptions,
            };
            nodes.insert(t.name.to_ascii_lowercase(), Node::Topic(Arc::new(topic)));
        }
        Ok(Broker {
            ns: Arc::new(Namespace {
                name: config.namespace.name,
                clock,
                nodes,
                dlq_forwarders,
            }),
        })
    }

    /// The namespace name.
    pub fn namespace(&self) -> &str {
        &self.ns.name
    }

    /// The broker's clock.
    pub fn clock(&self) -> Clock {
        self.ns.clock
    }

    /// Resolves a link address (any form [`Address::parse`] accepts). A `$management` address
    /// resolves to the entity it manages.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for unparsable addresses and `$cbs`; [`Error::NotFound`] for
    /// unknown entities.
    pub fn entity(&self, address: &str) -> Result<Entity> {
        match Address::parse(address)? {
            Address::Entity(path) | Address::Management(path) => self.resolve(&path),
            Address::Cbs => Err(Error::InvalidAddress {
                address: address.to_owned(),
                reason: "$cbs is not an entity",
            }),
        }
    }

    /// Resolves a parsed entity path (case-insensitively).
    ///
    /// # Errors
    /// [`Error::NotFound`] for unknown entities; [`Error::NotAllowed`] for a topic's
    /// dead-letter queue (topics have none).
    pub fn resolve(&self, path: &EntityPath) -> Result<Entity> {
        let not_found = || Error::NotFound {
            entity: path.to_string(),
        };
        let node = self
            .ns
            .nodes
            .get(&path.entity.to_ascii_lowercase())
            .ok_or_else(not_found)?;
        let target = match (node, &path.subscription) {
            (Node::Queue(q), None) => Target::Queue {
                queue: q.clone(),
                dlq: path.dead_letter,
            },
            (Node::Topic(t), Some(sub)) => Target::Queue {
                queue: t.subscription(sub).ok_or_else(not_found)?.queue.clone(),
                dlq: path.dead_letter,
            },
            (Node::Topic(t), None) if !path.dead_letter => Target::Topic(t.clone()),
            (Node::Topic(_), None) => {
                return Err(Error::NotAllowed {
                    operation: "resolve",
                    entity: path.to_string(),
                    reason: "topics have no dead-letter queue; use a subscription's",
                });
            }
            (Node::Queue(_), Some(_)) => return Err(not_found()),
        };
        let path = match &target {
            Target::Queue { queue, dlq } if *dlq => format!("{}/$DeadLetterQueue", queue.path),
            Target::Queue { queue, .. } => queue.path.clone(),
            Target::Topic(t) => t.name.clone(),
        };
        Ok(Entity {
            ns: self.ns.clone(),
            target,
            path,
        })
    }

    /// Paths of every queue, topic and subscription (without dead-letter queues).
    pub fn entity_paths(&self) -> Vec<EntityPath> {
        let mut out = Vec::new();
        for node in self.ns.nodes.values() {
            match node {
                Node::Queue(q) => out.push(EntityPath::entity(&q.path)),
                Node::Topic(t) => {
                    out.push(EntityPath::entity(&t.name));
                    for (name, _) in &t.subscriptions {
                        out.push(EntityPath::subscription(&t.name, name));
                    }
                }
            }
        }
        out.sort_by_key(|p| p.to_string().to_ascii_lowercase());
        out
    }
}

#[derive(Debug, Clone)]
enum Target {
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
/// - dispositions → [`settle`](Self::settle) with a [`Settlement`];
/// - management operations → [`renew_lock`](Self::renew_lock), [`peek`](Self::peek),
///   [`update_disposition`](Self::update_disposition), [`schedule`](Self::schedule),
///   [`cancel_scheduled`](Self::cancel_scheduled),
///   [`receive_deferred`](Self::receive_deferred).
///
/// Receiving operations on a topic and sending to a subscription or dead-letter queue return
/// [`Error::NotAllowed`].
#[derive(Debug, Clone)]
pub struct Entity {
    ns: Arc<Namespace>,
    target: Target,
    path: String,
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
            Target::Queue { queue, .. } => queue.props.max_message_size,
            Target::Topic(t) => t.props.max_message_size,
        }
    }

    /// The lock duration (topics: `None`).
    pub fn lock_duration(&self) -> Option<Duration> {
        match &self.target {
            Target::Queue { queue, .. } => Some(queue.props.lock_duration),
            Target::Topic(_) => None,
        }
    }

    /// Whether the entity requires sessions (receive through
    /// [`accept_session`](Self::accept_session) then).
    pub fn requires_session(&self) -> bool {
        match &self.target {
            Target::Queue { queue, .. } => queue.props.requires_session,
            Target::Topic(_) => false,
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

    fn check_sendable(&self, msg: &BrokerMessage) -> Result<()> {
        if self.is_dead_letter_queue() {
            return Err(self.not_allowed("send", "dead-letter queues cannot be sent to"));
        }
        if let Target::Queue { queue, .. } = &self.target
            && queue.is_subscription
        {
            return Err(self.not_allowed("send", "send to the topic, not to a subscription"));
        }
        if let Target::Queue { queue, .. } = &self.target
            && queue.props.requires_session
            && msg.session_id.is_none()
        {
            return Err(self.not_allowed("send", "the queue requires sessions: set a session id"));
        }
        let max = self.max_message_size();
        if msg.size() > max {
            return Err(Error::MessageSizeExceeded {
                size: msg.size(),
                max,
            });
        }
        Ok(())
    }

    fn node(&self) -> Node {
        match &self.target {
            Target::Queue { queue, .. } => Node::Queue(queue.clone()),
            Target::Topic(t) => Node::Topic(t.clone()),
        }
    }

    /// Sends a message. A message without a message id gets one (32 hex digits). A message
    /// with a future `scheduled_enqueue_time` is scheduled.
    ///
    /// # Errors
    /// [`Error::MessageSizeExceeded`]; [`Error::NotAllowed`] for subscriptions and dead-letter
    /// queues; [`Error::NotFound`] when a `ForwardTo` target vanished.
    pub fn send(&self, mut msg: BrokerMessage) -> Result<SendOutcome> {
        self.check_sendable(&msg)?;
        if msg.message_id.is_none() {
            msg.message_id = Some(Uuid::new_v4().simple().to_string());
        }
        self.ns.tick_forwarders(self.ns.clock.now());
        self.ns.route(&self.node(), msg, 0)
    }

    /// Sends several messages (an AMQP batch). Sizes are checked before any is stored.
    ///
    /// # Errors
    /// As [`send`](Self::send); on a size error nothing is stored.
    pub fn send_batch(&self, messages: Vec<BrokerMessage>) -> Result<Vec<SendOutcome>> {
        for m in &messages {
            self.check_sendable(m)?;
        }
        messages.into_iter().map(|m| self.send(m)).collect()
    }

    /// Schedules messages for `scheduled_enqueue_time` (`com.microsoft:schedule-message`).
    /// Messages without a time (or with a past one) are enqueued at once.
    ///
    /// # Errors
    /// As [`send_batch`](Self::send_batch).
    pub fn schedule(&self, messages: Vec<BrokerMessage>) -> Result<Vec<i64>> {
        Ok(self
            .send_batch(messages)?
            .into_iter()
            .map(|o| o.sequence_number().unwrap_or(-1))
            .collect())
    }

    /// Cancels scheduled messages (`com.microsoft:cancel-scheduled-message`). On a topic, the
    /// scheduled copies in every subscription are removed. Unknown or no longer scheduled
    /// sequence numbers are ignored.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on subscriptions and dead-letter queues.
    pub fn cancel_scheduled(&self, sequence_numbers: &[i64]) -> Result<()> {
        match &self.target {
            Target::Topic(t) => {
                for (_, sub) in &t.subscriptions {
                    let mut st = sub.queue.lock();
                    st.tick(self.ns.clock.now());
                    st.cancel_scheduled(sequence_numbers);
                }
                Ok(())
            }
            Target::Queue { queue, dlq } => {
                if *dlq || queue.is_subscription {
                    return Err(self.not_allowed(
                        "cancel-scheduled-message",
                        "schedule and cancel on the queue or topic",
                    ));
                }
                self.with_queue("cancel-scheduled-message", |_, st, _, _| {
                    st.cancel_scheduled(sequence_numbers);
                    Ok(())
                })
            }
        }
    }

    /// Takes the next receivable message without waiting (`Ok(None)` when there is none or
    /// delivery is paused).
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics and session-enabled entities.
    pub fn try_receive(&self, mode: ReceiveMode) -> Result<Option<ReceivedMessage>> {
        self.check_sessionless("receive")?;
        self.with_queue("receive", |_, st, dlq, now| Ok(st.take(dlq, mode, now)))
    }

    /// Waits for the next receivable message, at most `max_wait` (`None`: until one arrives).
    ///
    /// Competing receivers never get the same locked message. The future is cancel-safe: a
    /// message is taken only inside a single synchronous step, so dropping the future (in a
    /// `tokio::select!` with the link's cancellation, say) loses nothing.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics and on session-enabled entities (use
    /// [`accept_session`](Self::accept_session)).
    pub async fn receive(
        &self,
        mode: ReceiveMode,
        max_wait: Option<Duration>,
    ) -> Result<Option<ReceivedMessage>> {
        self.check_sessionless("receive")?;
        self.wait_for("receive", max_wait, |st, dlq, now| {
            Ok(st.take(dlq, mode, now))
        })
        .await
    }

    fn check_sessionless(&self, operation: &'static str) -> Result<()> {
        match &self.target {
            Target::Queue { queue, dlq: false } if queue.props.requires_session => Err(self
                .not_allowed(
                    operation,
                    "the entity requires sessions; accept a session first",
                )),
            _ => Ok(()),
        }
    }

    fn check_sessionful(&self, operation: &'static str) -> Result<()> {
        match &self.target {
            Target::Queue { queue, dlq: false } if queue.props.requires_session => Ok(()),
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

    /// Accepts a session of a session-enabled queue or subscription: `session_id`, or (with
    /// `None`) the session of the oldest receivable message whose session is free, waiting at
    /// most `max_wait` for one (`Ok(None)` on timeout). The session lock lasts `LockDuration`.
    ///
    /// # Errors
    /// [`Error::SessionCannotBeLocked`] when another receiver holds `session_id`;
    /// [`Error::NotAllowed`] when the entity does not require sessions.
    pub async fn accept_session(
        &self,
        session_id: Option<&str>,
        max_wait: Option<Duration>,
    ) -> Result<Option<SessionLock>> {
        self.check_sessionful("accept-session")?;
        match session_id {
            Some(id) => self.with_queue("accept-session", |_, st, _, now| {
                st.accept_session(Some(id), now)
            }),
            None => {
                self.wait_for("accept-session", max_wait, |st, _, now| {
                    st.accept_session(None, now)
                })
                .await
            }
        }
    }

    /// Waits for the next message of a session this receiver has accepted. Message locks end
    /// with the session lock.
    ///
    /// # Errors
    /// [`Error::SessionLockLost`] once the session lock expired or was released.
    pub async fn receive_from_session(
        &self,
        session_id: &str,
        mode: ReceiveMode,
        max_wait: Option<Duration>,
    ) -> Result<Option<ReceivedMessage>> {
        self.check_sessionful("receive")?;
        self.wait_for("receive", max_wait, |st, _, now| {
            st.take_from_session(session_id, None, mode, now)
        })
        .await
    }

    /// [`receive_from_session`](Self::receive_from_session) for the acceptance `lock` only:
    /// once another receiver accepted the session after `lock` expired, this fails.
    ///
    /// # Errors
    /// [`Error::SessionLockLost`] once `lock` expired, was released or was superseded.
    pub async fn receive_from_held_session(
        &self,
        lock: &SessionLock,
        mode: ReceiveMode,
        max_wait: Option<Duration>,
    ) -> Result<Option<ReceivedMessage>> {
        self.check_sessionful("receive")?;
        self.wait_for("receive", max_wait, |st, _, now| {
            st.take_from_session(&lock.session_id, Some(lock.holder), mode, now)
        })
        .await
    }

    /// Releases the session lock `lock` if it is still the session's current acceptance: a
    /// stale link closing must not free a session another receiver holds now.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] when the entity does not require sessions.
    pub fn release_held_session(&self, lock: &SessionLock) -> Result<()> {
        self.check_sessionful("release-session")?;
        self.with_queue("release-session", |_, st, _, now| {
            st.release_session(&lock.session_id, Some(lock.holder), now);
            Ok(())
        })
    }

    /// `com.microsoft:renew-session-lock`: extends the session lock and its messages' locks.
    ///
    /// # Errors
    /// [`Error::SessionLockLost`] when the session lock already expired.
    pub fn renew_session_lock(&self, session_id: &str) -> Result<SystemTime> {
        self.check_sessionful("renew-session-lock")?;
        self.with_queue("renew-session-lock", |_, st, _, now| {
            st.renew_session(session_id, now)
        })
    }

    /// Releases a session lock (call when the session receiver's link closes).
    ///
    /// # Errors
    /// [`Error::NotAllowed`] when the entity does not require sessions.
    pub fn release_session(&self, session_id: &str) -> Result<()> {
        self.check_sessionful("release-session")?;
        self.with_queue("release-session", |_, st, _, now| {
            st.release_session(session_id, None, now);
            Ok(())
        })
    }

    /// `com.microsoft:get-session-state`.
    ///
    /// # Errors
    /// [`Error::SessionLockLost`] without a valid session lock.
    pub fn session_state(&self, session_id: &str) -> Result<Option<Bytes>> {
        self.check_sessionful("get-session-state")?;
        self.with_queue("get-session-state", |_, st, _, now| {
            st.session_state(session_id, now)
        })
    }

    /// `com.microsoft:set-session-state` (`None` clears it).
    ///
    /// # Errors
    /// [`Error::SessionLockLost`] without a valid session lock.
    pub fn set_session_state(&self, session_id: &str, state: Option<Bytes>) -> Result<()> {
        self.check_sessionful("set-session-state")?;
        self.with_queue("set-session-state", |_, st, _, now| {
            st.set_session_state(session_id, state, now)
        })
    }

    /// `com.microsoft:get-message-sessions`: with `updated_after`, the sessions whose state was
    /// set after it; without, the sessions holding messages (oldest message first) or a state.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] when the entity does not require sessions.
    pub fn message_sessions(&self, updated_after: Option<SystemTime>) -> Result<Vec<String>> {
        self.check_sessionful("get-message-sessions")?;
        self.with_queue("get-message-sessions", |_, st, _, _| {
            Ok(st.session_ids(updated_after))
        })
    }

    /// Settles a locked message by lock token (link dispositions).
    ///
    /// # Errors
    /// [`Error::LockLost`] for an unknown, settled or expired token (also after an injected
    /// delay outlasted the lock); [`Error::Refused`] when a fault hook refuses it;
    /// [`Error::NotAllowed`] for dead-lettering in a dead-letter queue.
    pub async fn settle(&self, lock_token: Uuid, settlement: Settlement) -> Result<()> {
        self.disposition_fault().await?;
        self.with_queue("settle", |_, st, dlq, now| {
            st.settle(dlq, lock_token, settlement, now)
        })
    }

    async fn disposition_fault(&self) -> Result<()> {
        let delay = self.with_queue("settle", |_, st, _, _| st.faults.before_disposition())?;
        if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    /// Completes a locked message.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn complete(&self, lock_token: Uuid) -> Result<()> {
        self.settle(lock_token, Settlement::Complete).await
    }

    /// Abandons a locked message, merging `properties_to_modify` into its application
    /// properties; it is redelivered with delivery count + 1 or dead-lettered at
    /// `MaxDeliveryCount`.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn abandon(&self, lock_token: Uuid, properties_to_modify: Properties) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::Abandon {
                properties_to_modify,
            },
        )
        .await
    }

    /// Defers a locked message.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn defer(&self, lock_token: Uuid, properties_to_modify: Properties) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::Defer {
                properties_to_modify,
            },
        )
        .await
    }

    /// Dead-letters a locked message with `DeadLetterReason` and `DeadLetterErrorDescription`.
    ///
    /// # Errors
    /// As [`settle`](Self::settle).
    pub async fn dead_letter(
        &self,
        lock_token: Uuid,
        reason: Option<String>,
        description: Option<String>,
        properties_to_modify: Properties,
    ) -> Result<()> {
        self.settle(
            lock_token,
            Settlement::DeadLetter {
                reason,
                description,
                properties_to_modify,
            },
        )
        .await
    }

    /// `com.microsoft:update-disposition`: settles each token in order; `suspended`
    /// dead-letters with the given reason and description.
    ///
    /// # Errors
    /// As [`settle`](Self::settle): the first failing token stops the request (earlier tokens
    /// stay settled).
    pub async fn update_disposition(
        &self,
        status: DispositionStatus,
        lock_tokens: &[Uuid],
        dead_letter_reason: Option<String>,
        dead_letter_description: Option<String>,
        properties_to_modify: Properties,
    ) -> Result<()> {
        self.disposition_fault().await?;
        for token in lock_tokens {
            let settlement = match status {
                DispositionStatus::Completed => Settlement::Complete,
                DispositionStatus::Abandoned => Settlement::Abandon {
                    properties_to_modify: properties_to_modify.clone(),
                },
                DispositionStatus::Defered => Settlement::Defer {
                    properties_to_modify: properties_to_modify.clone(),
                },
                DispositionStatus::Suspended => Settlement::DeadLetter {
                    reason: dead_letter_reason.clone(),
                    description: dead_letter_description.clone(),
                    properties_to_modify: properties_to_modify.clone(),
                },
            };
            self.with_queue("update-disposition", |_, st, dlq, now| {
                st.settle(dlq, *token, settlement, now)
            })?;
        }
        Ok(())
    }

    /// `com.microsoft:renew-lock`: extends each lock by the lock duration and returns the new
    /// expirations, in order.
    ///
    /// # Errors
    /// [`Error::LockLost`] if any token is unknown or expired (no lock is renewed then), or a
    /// fault hook refuses the renewal.
    pub fn renew_lock(&self, lock_tokens: &[Uuid]) -> Result<Vec<SystemTime>> {
        self.with_queue("renew-lock", |_, st, dlq, now| {
            st.renew(dlq, lock_tokens, now)
        })
    }

    /// `com.microsoft:peek-message`: up to `count` messages with sequence number ≥ `from`, in
    /// sequence order, without locking. Like Service Bus, includes locked and deferred
    /// messages, and scheduled ones on queues (not on subscriptions); the dead-letter queue is
    /// peeked through its own address.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn peek(&self, from_sequence_number: i64, count: usize) -> Result<Vec<ReceivedMessage>> {
        self.with_queue("peek-message", |q, st, dlq, _| {
            Ok(st.peek(dlq, from_sequence_number, count, !q.is_subscription))
        })
    }

    /// `com.microsoft:receive-by-sequence-number`: receives deferred messages (locked in
    /// peek-lock mode).
    ///
    /// # Errors
    /// [`Error::MessageNotFound`] if any sequence number is not a deferred, unlocked message
    /// (nothing is received then).
    pub fn receive_deferred(
        &self,
        sequence_numbers: &[i64],
        mode: ReceiveMode,
    ) -> Result<Vec<ReceivedMessage>> {
        self.with_queue("receive-by-sequence-number", |_, st, dlq, now| {
            st.receive_deferred(dlq, sequence_numbers, mode, now)
        })
    }

    /// The subscription this handle addresses (not its dead-letter queue).
    fn subscription(&self, operation: &'static str) -> Result<Arc<Subscription>> {
        let not_a_subscription = || self.not_allowed(operation, "rules belong to subscriptions");
        let Target::Queue { queue, dlq: false } = &self.target else {
            return Err(not_a_subscription());
        };
        let Ok(Address::Entity(EntityPath {
            entity,
            subscription: Some(name),
            ..
        })) = Address::parse(&queue.path)
        else {
            return Err(not_a_subscription());
        };
        match self.ns.node(&entity)? {
            Node::Topic(topic) => topic
                .subscription(&name)
                .cloned()
                .ok_or_else(not_a_subscription),
            Node::Queue(_) => Err(not_a_subscription()),
        }
    }

    /// `com.microsoft:enumerate-rules`: the subscription's rules in creation order, each with
    /// its creation time.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] unless this is a subscription.
    pub fn rules(&self) -> Result<Vec<(Rule, SystemTime)>> {
        Ok(self.subscription("enumerate-rules")?.rules().clone())
    }

    /// `com.microsoft:add-rule`: adds a rule to the subscription; messages sent from now on
    /// are matched against it.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when a rule of that name (case-insensitive) exists;
    /// [`Error::InvalidRule`] for an empty name or one longer than 50 characters (the
    /// service's limit); [`Error::NotAllowed`] unless this is a subscription.
    pub fn add_rule(&self, rule: Rule) -> Result<()> {
        let subscription = self.subscription("add-rule")?;
        let length = rule.name.chars().count();
        if length == 0 || length > MAX_RULE_NAME_LENGTH {
            return Err(Error::InvalidRule {
                reason: format!("a rule name has 1 to {MAX_RULE_NAME_LENGTH} characters"),
                rule: rule.name,
            });
        }
        let mut rules = subscription.rules();
        if rules
            .iter()
            .any(|(r, _)| r.name.eq_ignore_ascii_case(&rule.name))
        {
            return Err(Error::AlreadyExists {
                entity: format!("{}/Rules/{}", self.path, rule.name),
            });
        }
        rules.push((rule, self.ns.clock.now()));
        Ok(())
    }

    /// `com.microsoft:remove-rule`: removes the named rule (case-insensitive). A subscription
    /// left without rules receives nothing, as on Service Bus.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such rule; [`Error::NotAllowed`] unless this is a
    /// subscription.
    pub fn remove_rule(&self, name: &str) -> Result<()> {
        let subscription = self.subscription("remove-rule")?;
        let mut rules = subscription.rules();
        let before = rules.len();
        rules.retain(|(r, _)| !r.name.eq_ignore_ascii_case(name));
        if rules.len() == before {
            return Err(Error::NotFound {
                entity: format!("{}/Rules/{name}", self.path),
            });
        }
        Ok(())
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

    /// Fault hook: the lock expires now; the message is redelivered with delivery count + 1
    /// (or dead-lettered at `MaxDeliveryCount`) and the token is lost.
    ///
    /// # Errors
    /// [`Error::LockLost`] for an unknown token; [`Error::NotAllowed`] on topics.
    pub fn expire_lock(&self, lock_token: Uuid) -> Result<()> {
        self.with_queue("expire-lock", |_, st, dlq, now| {
            st.expire_lock(dlq, lock_token, now)
        })
    }

    /// Fault hook: the next `count` renew-lock requests fail with [`Error::LockLost`] (the
    /// locks themselves stay until they expire).
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn refuse_renewals(&self, count: u32) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.refuse_renewals = count;
            Ok(())
        })
    }

    /// Fault hook: the next `count` dispositions (settle or update-disposition) fail with
    /// [`Error::Refused`] and leave the message locked.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn refuse_dispositions(&self, count: u32) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.refuse_dispositions = count;
            Ok(())
        })
    }

    /// Fault hook: the next `count` dispositions wait `delay` (on tokio's clock) before they
    /// apply; a lock that expires meanwhile makes them fail with [`Error::LockLost`].
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn delay_dispositions(&self, count: u32, delay: Duration) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.delay_dispositions = count;
            st.faults.disposition_delay = delay;
            Ok(())
        })
    }

    /// Fault hook: the next `count` deliveries go out with a payload no AMQP decoder reads (a
    /// data section cut short), as a client meets a message carrying a section or a type it
    /// does not know. The stored message is unchanged, so a dead-lettered one reads back whole.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn undecodable_deliveries(&self, count: u32) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.undecodable_deliveries = count;
            Ok(())
        })
    }

    /// Consumes one [`undecodable_deliveries`](Self::undecodable_deliveries) fault.
    pub(crate) fn take_undecodable_delivery(&self) -> bool {
        self.with_queue("fault", |_, st, _, _| {
            let take = st.faults.undecodable_deliveries > 0;
            st.faults.undecodable_deliveries = st.faults.undecodable_deliveries.saturating_sub(1);
            Ok(take)
        })
        .unwrap_or(false)
    }

    /// Fault hook: stops handing out messages (receivers wait) until
    /// [`resume_delivery`](Self::resume_delivery).
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn pause_delivery(&self) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.paused = true;
            Ok(())
        })
    }

    /// Fault hook: resumes delivery and wakes waiting receivers.
    ///
    /// # Errors
    /// [`Error::NotAllowed`] on topics.
    pub fn resume_delivery(&self) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.paused = false;
            st.dirty = true;
            Ok(())
        })
    }
}
