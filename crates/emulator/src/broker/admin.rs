//! Entity management at run time: create, update, delete, describe and list queues, topics and
//! subscriptions, as the service's HTTP management API does (Microsoft Learn, "Service Bus
//! management REST API": Create Queue, Update Queue, Delete Queue, Get Entity, List Queues).
//!
//! A change takes effect at once: a created queue can be attached over AMQP by the next link,
//! an updated lock duration applies to the next lock, a deleted entity is not found any more.
//! Links already attached to a deleted entity keep their handle until they detach.

use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::SystemTime;

use crate::address::EntityPath;
use crate::config::{
    EntityProperties, QueueConfig, SubscriptionConfig, TopicConfig, TopicProperties,
};
use crate::error::{Error, Result};
use crate::filter::Rule;
use crate::queue::{DupWindow, EntityCounts};

use super::Broker;
use super::message_queue::{MessageQueue, Times};
use super::namespace::Node;
use super::topic::{Subscription, Topic, TopicState};

/// A queue, topic or subscription as the management API describes it.
#[derive(Debug, Clone)]
pub struct EntityDescription {
    /// The queue's or topic's name, or the subscription's name (without its topic).
    pub name: String,
    /// Its kind and properties.
    pub properties: DescribedProperties,
    /// Message counts (for a topic: its totals).
    pub counts: EntityCounts,
    /// When it was created.
    pub created: SystemTime,
    /// When its properties last changed.
    pub updated: SystemTime,
    /// A topic's number of subscriptions (0 otherwise).
    pub subscription_count: usize,
}

/// The properties of a described entity, by kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DescribedProperties {
    /// A queue.
    Queue(EntityProperties),
    /// A topic.
    Topic(TopicProperties),
    /// A subscription.
    Subscription(EntityProperties),
}

impl Broker {
    /// Creates a queue.
    ///
    /// # Errors
    /// [`Error::AlreadyExists`] when a queue or topic of that name (case-insensitive) exists;
    /// [`Error::InvalidAddress`] for an empty name.
    pub fn create_queue(&self, config: QueueConfig) -> Result<()> {
        check_name(&config.name)?;
        let queue = Arc::new(MessageQueue::new(
            config.name.clone(),
            config.properties,
            false,
            self.ns.clock.now(),
        ));
        self.insert_node(&config.name, Node::Queue(queue.clone()))?;
        self.ns.track_forwarder(&queue);
        tracing::info!(entity = %config.name, "Queue created.");
        Ok(())
    }

    /// Creates a topic (with the subscriptions the config names).
    ///
    /// # Errors
    /// As [`Broker::create_queue`].
    pub fn create_topic(&self, config: TopicConfig) -> Result<()> {
        check_name(&config.name)?;
        let topic = Arc::new(Topic {
            name: config.name.clone(),
            times: RwLock::new(Times::new(self.ns.clock.now())),
            props: RwLock::new(config.properties),
            state: Mutex::new(TopicState {
                next_seq: 1,
                dup: DupWindow::default(),
                sent: 0,
                duplicates: 0,
            }),
            subscriptions: RwLock::new(Vec::new()),
        });
        self.insert_node(&config.name, Node::Topic(topic))?;
        for subscription in config.subscriptions {
            self.create_subscription(&config.name, subscription)?;
        }
        tracing::info!(entity = %config.name, "Topic created.");
        Ok(())
    }

    /// Creates a subscription of `topic` (with the `$Default` rule unless the config names
    /// rules). Duplicate detection and the message size limit come from the topic.
    ///
    /// # Errors
    /// [`Error::NotFound`] when the topic does not exist; [`Error::AlreadyExists`] when the
    /// subscription does.
    pub fn create_subscription(&self, topic: &str, config: SubscriptionConfig) -> Result<()> {
        check_name(&config.name)?;
        let t = self.topic(topic)?;
        let mut props = config.properties;
        props.requires_duplicate_detection = false;
        props.max_message_size = t.props().max_message_size;
        let now = self.ns.clock.now();
        let rules = if config.rules.is_empty() {
            vec![Rule::default_rule()]
        } else {
            config.rules
        };
        let path = EntityPath::subscription(&t.name, &config.name).to_string();
        let sub = Arc::new(Subscription {
            rules: Mutex::new(rules.into_iter().map(|r| (r, now)).collect()),
            queue: Arc::new(MessageQueue::new(path.clone(), props, true, now)),
        });
        {
            let mut subs = t
                .subscriptions
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if subs
                .iter()
                .any(|(n, _)| n.eq_ignore_ascii_case(&config.name))
            {
                return Err(Error::AlreadyExists { entity: path });
            }
            subs.push((config.name, sub.clone()));
        }
        self.ns.track_forwarder(&sub.queue);
        tracing::info!(entity = %path, "Subscription created.");
        Ok(())
    }

    /// Replaces a queue's properties.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such queue.
    pub fn update_queue(&self, name: &str, properties: EntityProperties) -> Result<()> {
        match self.ns.node(name)? {
            Node::Queue(queue) => {
                queue.set_props(properties, self.ns.clock.now());
                self.ns.track_forwarder(&queue);
                Ok(())
            }
            Node::Topic(_) => Err(not_found(name)),
        }
    }

    /// Replaces a topic's properties.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such topic.
    pub fn update_topic(&self, name: &str, properties: TopicProperties) -> Result<()> {
        let t = self.topic(name)?;
        *t.props.write().unwrap_or_else(PoisonError::into_inner) = properties;
        t.times
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .updated = self.ns.clock.now();
        Ok(())
    }

    /// Replaces a subscription's properties (duplicate detection and message size stay the
    /// topic's).
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such subscription.
    pub fn update_subscription(
        &self,
        topic: &str,
        name: &str,
        mut properties: EntityProperties,
    ) -> Result<()> {
        let t = self.topic(topic)?;
        let sub = t
            .subscription(name)
            .ok_or_else(|| not_found(&EntityPath::subscription(topic, name).to_string()))?;
        properties.requires_duplicate_detection = false;
        properties.max_message_size = t.props().max_message_size;
        sub.queue.set_props(properties, self.ns.clock.now());
        self.ns.track_forwarder(&sub.queue);
        Ok(())
    }

    /// Deletes a queue or topic (a topic with its subscriptions) and its messages.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such queue or topic.
    pub fn delete_entity(&self, name: &str) -> Result<()> {
        let node = self
            .ns
            .nodes_mut()
            .remove(&name.to_ascii_lowercase())
            .ok_or_else(|| not_found(name))?;
        match node {
            Node::Queue(queue) => self.ns.untrack_forwarder(&queue),
            Node::Topic(t) => {
                for (_, sub) in t.subscriptions() {
                    self.ns.untrack_forwarder(&sub.queue);
                }
            }
        }
        tracing::info!(entity = %name, "Entity deleted.");
        Ok(())
    }

    /// Deletes a subscription and its messages.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such subscription.
    pub fn delete_subscription(&self, topic: &str, name: &str) -> Result<()> {
        let t = self.topic(topic)?;
        let path = EntityPath::subscription(topic, name).to_string();
        let removed = {
            let mut subs = t
                .subscriptions
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            let index = subs
                .iter()
                .position(|(n, _)| n.eq_ignore_ascii_case(name))
                .ok_or_else(|| not_found(&path))?;
            subs.remove(index).1
        };
        self.ns.untrack_forwarder(&removed.queue);
        tracing::info!(entity = %path, "Subscription deleted.");
        Ok(())
    }

    /// Describes a queue.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such queue.
    pub fn describe_queue(&self, name: &str) -> Result<EntityDescription> {
        match self.ns.node(name)? {
            Node::Queue(queue) => Ok(self.describe_queue_node(&queue, &queue.path, false)),
            Node::Topic(_) => Err(not_found(name)),
        }
    }

    /// Describes a topic.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such topic.
    pub fn describe_topic(&self, name: &str) -> Result<EntityDescription> {
        let t = self.topic(name)?;
        Ok(describe_topic_node(&t))
    }

    /// Describes a subscription.
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such subscription.
    pub fn describe_subscription(&self, topic: &str, name: &str) -> Result<EntityDescription> {
        let t = self.topic(topic)?;
        let (sub_name, sub) = t
            .subscriptions()
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .ok_or_else(|| not_found(&EntityPath::subscription(topic, name).to_string()))?;
        Ok(self.describe_queue_node(&sub.queue, &sub_name, true))
    }

    /// Every queue, by name (case-insensitive order).
    pub fn queues(&self) -> Vec<EntityDescription> {
        let mut out: Vec<EntityDescription> = self
            .ns
            .nodes()
            .values()
            .cloned()
            .collect::<Vec<_>>()
            .into_iter()
            .filter_map(|node| match node {
                Node::Queue(q) => Some(self.describe_queue_node(&q, &q.path, false)),
                Node::Topic(_) => None,
            })
            .collect();
        out.sort_by_key(|d| d.name.to_ascii_lowercase());
        out
    }

    /// Every topic, by name (case-insensitive order).
    pub fn topics(&self) -> Vec<EntityDescription> {
        let mut out: Vec<EntityDescription> = self
            .ns
            .nodes()
            .values()
            .filter_map(|node| match node {
                Node::Topic(t) => Some(describe_topic_node(t)),
                Node::Queue(_) => None,
            })
            .collect();
        out.sort_by_key(|d| d.name.to_ascii_lowercase());
        out
    }

    /// A topic's subscriptions, by name (case-insensitive order).
    ///
    /// # Errors
    /// [`Error::NotFound`] when there is no such topic.
    pub fn subscriptions(&self, topic: &str) -> Result<Vec<EntityDescription>> {
        let t = self.topic(topic)?;
        let mut out: Vec<EntityDescription> = t
            .subscriptions()
            .iter()
            .map(|(name, sub)| self.describe_queue_node(&sub.queue, name, true))
            .collect();
        out.sort_by_key(|d| d.name.to_ascii_lowercase());
        Ok(out)
    }

    fn topic(&self, name: &str) -> Result<Arc<Topic>> {
        match self.ns.node(name)? {
            Node::Topic(t) => Ok(t),
            Node::Queue(_) => Err(not_found(name)),
        }
    }

    fn insert_node(&self, name: &str, node: Node) -> Result<()> {
        let mut nodes = self.ns.nodes_mut();
        let key = name.to_ascii_lowercase();
        if nodes.contains_key(&key) {
            return Err(Error::AlreadyExists {
                entity: name.to_owned(),
            });
        }
        nodes.insert(key, node);
        Ok(())
    }

    fn describe_queue_node(
        &self,
        queue: &MessageQueue,
        name: &str,
        subscription: bool,
    ) -> EntityDescription {
        let counts = {
            let mut st = queue.lock();
            st.tick(self.ns.clock.now());
            st.counts()
        };
        let times = *queue.times.read().unwrap_or_else(PoisonError::into_inner);
        let props = queue.props();
        EntityDescription {
            name: name.to_owned(),
            properties: if subscription {
                DescribedProperties::Subscription(props)
            } else {
                DescribedProperties::Queue(props)
            },
            counts,
            created: times.created,
            updated: times.updated,
            subscription_count: 0,
        }
    }
}

fn describe_topic_node(t: &Topic) -> EntityDescription {
    let times = *t.times.read().unwrap_or_else(PoisonError::into_inner);
    let counts = {
        let st = t.lock();
        EntityCounts {
            sent: st.sent,
            duplicates: st.duplicates,
            ..EntityCounts::default()
        }
    };
    EntityDescription {
        name: t.name.clone(),
        properties: DescribedProperties::Topic(t.props()),
        counts,
        created: times.created,
        updated: times.updated,
        subscription_count: t.subscriptions().len(),
    }
}

fn not_found(entity: &str) -> Error {
    Error::NotFound {
        entity: entity.to_owned(),
    }
}

/// Names the service refuses outright: empty, or with characters that would make another
/// path (`?`, `#`, `\`), or a leading or trailing `/`.
fn check_name(name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name.starts_with('/')
        || name.ends_with('/')
        || name.contains(['?', '#', '\\', '$']);
    if bad {
        return Err(Error::InvalidAddress {
            address: name.to_owned(),
            reason: "not a valid entity name",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn broker() -> Broker {
        Broker::new(Config::new("ns").with_queue(QueueConfig::new("q"))).unwrap()
    }

    #[test]
    fn created_entities_are_usable_at_once_and_deleted_ones_are_gone() {
        let b = broker();
        b.create_queue(QueueConfig::new("made")).unwrap();
        b.entity("made")
            .unwrap()
            .send(crate::BrokerMessage::new("x"))
            .unwrap();
        assert_eq!(b.describe_queue("made").unwrap().counts.active, 1);
        assert!(matches!(
            b.create_queue(QueueConfig::new("MADE")),
            Err(Error::AlreadyExists { .. })
        ));
        b.create_topic(TopicConfig::new("t")).unwrap();
        b.create_subscription("t", SubscriptionConfig::new("s"))
            .unwrap();
        b.entity("t")
            .unwrap()
            .send(crate::BrokerMessage::new("y"))
            .unwrap();
        assert_eq!(b.describe_subscription("t", "s").unwrap().counts.active, 1);
        assert_eq!(b.describe_topic("t").unwrap().subscription_count, 1);
        b.delete_subscription("t", "s").unwrap();
        assert!(b.entity("t/Subscriptions/s").is_err());
        b.delete_entity("made").unwrap();
        assert!(matches!(b.entity("made"), Err(Error::NotFound { .. })));
        assert!(matches!(
            b.delete_entity("made"),
            Err(Error::NotFound { .. })
        ));
    }

    #[test]
    fn updates_change_what_the_entity_does() {
        let b = broker();
        let props = EntityProperties {
            lock_duration: std::time::Duration::from_secs(7),
            max_delivery_count: 9,
            ..EntityProperties::default()
        };
        b.update_queue("q", props.clone()).unwrap();
        assert_eq!(
            b.entity("q").unwrap().lock_duration(),
            Some(std::time::Duration::from_secs(7))
        );
        assert_eq!(
            b.describe_queue("q").unwrap().properties,
            DescribedProperties::Queue(props)
        );
        assert!(b.update_queue("nope", EntityProperties::default()).is_err());
    }
}
