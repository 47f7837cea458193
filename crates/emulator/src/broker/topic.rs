//! A topic: its sequence numbers and duplicate detection, its subscriptions and their rules.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::SystemTime;

use crate::config::TopicProperties;
use crate::filter::Rule;
use crate::message::BrokerMessage;
use crate::queue::DupWindow;

use super::MessageQueue;

#[derive(Debug)]
pub(super) struct TopicState {
    pub(super) next_seq: i64,
    pub(super) dup: DupWindow,
    pub(super) sent: u64,
    pub(super) duplicates: u64,
}

#[derive(Debug)]
pub(super) struct Subscription {
    /// Rules with their creation times; changed at run time by the `$management` rule
    /// operations, so fan-out reads them under this lock (never together with a queue lock).
    pub(super) rules: Mutex<Vec<(Rule, SystemTime)>>,
    pub(super) queue: Arc<MessageQueue>,
}

impl Subscription {
    pub(super) fn rules(&self) -> MutexGuard<'_, Vec<(Rule, SystemTime)>> {
        self.rules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The copies of `msg` this subscription receives: one for all matching rules without an
    /// action together, and one per matching rule with an action, that action applied to it
    /// (Microsoft, "Topic filters and actions":
    /// <https://learn.microsoft.com/azure/service-bus-messaging/topic-filters>: "All rules
    /// without actions are combined using an OR condition and result in a single message on
    /// the subscription"; "Each rule with an action produces a copy of the message").
    pub(super) fn copies(&self, msg: &BrokerMessage) -> Vec<BrokerMessage> {
        let rules = self.rules();
        let mut plain = false;
        let mut annotated = Vec::new();
        for (rule, _) in rules.iter().filter(|(r, _)| r.filter.matches(msg)) {
            match &rule.action {
                None => plain = true,
                Some(action) => {
                    let mut copy = msg.clone();
                    action.apply(&mut copy);
                    annotated.push(copy);
                }
            }
        }
        drop(rules);
        let mut copies = Vec::with_capacity(annotated.len() + 1);
        if plain {
            copies.push(msg.clone());
        }
        copies.extend(annotated);
        copies
    }
}

#[derive(Debug)]
pub(super) struct Topic {
    pub(super) name: String,
    pub(super) times: RwLock<super::message_queue::Times>,
    /// Replaced by the HTTP management API's updates.
    pub(super) props: RwLock<TopicProperties>,
    pub(super) state: Mutex<TopicState>,
    /// Added and removed at run time by the HTTP management API; fan-out takes a snapshot.
    pub(super) subscriptions: RwLock<Vec<(String, Arc<Subscription>)>>,
}

impl Topic {
    pub(super) fn lock(&self) -> MutexGuard<'_, TopicState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn props(&self) -> TopicProperties {
        self.props
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// A snapshot of the subscriptions, in creation order.
    pub(super) fn subscriptions(&self) -> Vec<(String, Arc<Subscription>)> {
        self.subscriptions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn subscription(&self, name: &str) -> Option<Arc<Subscription>> {
        self.subscriptions
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, s)| s.clone())
    }
}
