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
//!
//! # Layout
//! - [`Broker`] (this file): the namespace built from a [`Config`]; resolves addresses to
//!   [`Entity`] handles.
//! - `namespace`: the queues and topics by name, and dead-letter forwarding.
//! - `route`: sending into the namespace: duplicate detection, fan-out to subscriptions,
//!   `ForwardTo` hops ([`SendOutcome`]).
//! - `message_queue`: a queue or subscription with its waiting receivers.
//! - `topic`: a topic, its subscriptions and their rules.
//! - `entity`: the [`Entity`] handle, one file per group of operations.
//! - `admin`: creating, updating, deleting, describing and listing entities at run time
//!   ([`EntityDescription`]), for the HTTP management API.

mod admin;
mod entity;
mod message_queue;
mod namespace;
mod route;
mod topic;

pub use admin::{DescribedProperties, EntityDescription};
pub use entity::{DispositionStatus, Entity};
pub use route::SendOutcome;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::address::{Address, EntityPath};
use crate::clock::Clock;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::filter::Rule;
use crate::queue::DupWindow;

use entity::Target;
use message_queue::MessageQueue;
use namespace::{Namespace, Node};
use topic::{Subscription, Topic, TopicState};

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
            let queue = Arc::new(MessageQueue::new(
                q.name.clone(),
                q.properties,
                false,
                clock.now(),
            ));
            if queue.props().forward_dead_lettered_messages_to.is_some() {
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
                    queue: Arc::new(MessageQueue::new(path, props, true, created)),
                };
                if sub
                    .queue
                    .props()
                    .forward_dead_lettered_messages_to
                    .is_some()
                {
                    dlq_forwarders.push(sub.queue.clone());
                }
                subscriptions.push((s.name, Arc::new(sub)));
            }
            let topic = Topic {
                name: t.name.clone(),
                times: std::sync::RwLock::new(message_queue::Times::new(clock.now())),
                props: std::sync::RwLock::new(t.properties),
                state: Mutex::new(TopicState {
                    next_seq: 1,
                    dup: DupWindow::default(),
                    sent: 0,
                    duplicates: 0,
                }),
                subscriptions: std::sync::RwLock::new(subscriptions),
            };
            nodes.insert(t.name.to_ascii_lowercase(), Node::Topic(Arc::new(topic)));
        }
        Ok(Broker {
            ns: Arc::new(Namespace {
                name: config.namespace.name,
                clock,
                nodes: std::sync::RwLock::new(nodes),
                dlq_forwarders: std::sync::RwLock::new(dlq_forwarders),
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
            .nodes()
            .get(&path.entity.to_ascii_lowercase())
            .cloned()
            .ok_or_else(not_found)?;
        let target = match (&node, &path.subscription) {
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
        for node in self.ns.nodes().values() {
            match node {
                Node::Queue(q) => out.push(EntityPath::entity(&q.path)),
                Node::Topic(t) => {
                    out.push(EntityPath::entity(&t.name));
                    for (name, _) in &t.subscriptions() {
                        out.push(EntityPath::subscription(&t.name, name));
                    }
                }
            }
        }
        out.sort_by_key(|p| p.to_string().to_ascii_lowercase());
        out
    }
}
