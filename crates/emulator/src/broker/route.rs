//! Sending into the namespace: duplicate detection, fan-out to matching subscriptions and
//! `ForwardTo` hops.

use std::time::SystemTime;

use crate::error::Result;
use crate::message::BrokerMessage;

use super::{MessageQueue, Namespace, Node, Subscription, Topic};

/// How many `ForwardTo` hops a message may take (Service Bus allows four).
const MAX_FORWARD_HOPS: u8 = 4;

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

impl Namespace {
    /// Sends to a queue or topic, following `ForwardTo` up to [`MAX_FORWARD_HOPS`].
    pub(super) fn route(&self, node: &Node, msg: BrokerMessage, hops: u8) -> Result<SendOutcome> {
        match node {
            Node::Queue(queue) => self.route_to_queue(queue, msg, hops),
            Node::Topic(topic) => self.route_to_topic(topic, msg, hops),
        }
    }

    /// Stores `msg` in the queue, or passes it on to the queue's `ForwardTo`.
    fn route_to_queue(
        &self,
        q: &MessageQueue,
        msg: BrokerMessage,
        hops: u8,
    ) -> Result<SendOutcome> {
        let now = self.clock.now();
        let props = q.props();
        let target = {
            let mut st = q.lock();
            st.tick(now);
            let dup = props.requires_duplicate_detection
                && msg.message_id.as_deref().is_some_and(|id| {
                    st.dup
                        .is_duplicate(id, now, props.duplicate_detection_history_time_window)
                });
            if dup {
                st.counts.duplicates += 1;
                tracing::debug!(entity = %q.path, message_id = ?msg.message_id, "Duplicate message dropped.");
                return Ok(SendOutcome::Duplicate);
            }
            match &props.forward_to {
                // Beyond the hop limit the message stays where it is.
                Some(target) if hops < MAX_FORWARD_HOPS => {
                    st.counts.forwarded += 1;
                    target.clone()
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
        let node = self.node(&target)?;
        self.route(&node, msg, hops + 1)
    }

    /// Numbers `msg` in the topic and fans it out to every subscription whose rules match.
    ///
    /// A subscription may take several copies (one per matching rule with an action); the
    /// extra copies take the sequence numbers after the message's, so every copy in a
    /// subscription has its own.
    fn route_to_topic(&self, t: &Topic, msg: BrokerMessage, hops: u8) -> Result<SendOutcome> {
        let now = self.clock.now();
        let props = t.props();
        // Rules are read before the topic lock is taken (never both at once).
        let fan_out: Vec<_> = t
            .subscriptions()
            .into_iter()
            .map(|(_, sub)| {
                let copies = sub.copies(&msg);
                (sub, copies)
            })
            .collect();
        let numbers = fan_out
            .iter()
            .map(|(_, copies)| copies.len())
            .max()
            .unwrap_or(0)
            .max(1);
        let seq = {
            let mut st = t.lock();
            let dup = props.requires_duplicate_detection
                && msg.message_id.as_deref().is_some_and(|id| {
                    st.dup
                        .is_duplicate(id, now, props.duplicate_detection_history_time_window)
                });
            if dup {
                st.duplicates += 1;
                tracing::debug!(entity = %t.name, message_id = ?msg.message_id, "Duplicate message dropped.");
                return Ok(SendOutcome::Duplicate);
            }
            let seq = st.next_seq;
            st.next_seq += i64::try_from(numbers).unwrap_or(i64::MAX);
            st.sent += 1;
            seq
        };
        for (sub, copies) in &fan_out {
            for (k, copy) in (0_i64..).zip(copies) {
                self.deliver_to_subscription(t, sub, copy, seq + k, now, hops)?;
            }
        }
        Ok(SendOutcome::Accepted {
            sequence_number: seq,
        })
    }

    /// Stores a topic's message `seq` in one subscription, or passes it on to the
    /// subscription's `ForwardTo`.
    fn deliver_to_subscription(
        &self,
        t: &Topic,
        sub: &Subscription,
        msg: &BrokerMessage,
        seq: i64,
        now: SystemTime,
        hops: u8,
    ) -> Result<()> {
        let forward = {
            let mut st = sub.queue.lock();
            st.tick(now);
            match &sub.queue.props().forward_to {
                Some(target) if hops < MAX_FORWARD_HOPS => {
                    st.counts.forwarded += 1;
                    Some(target.clone())
                }
                _ => {
                    st.enqueue(
                        msg.clone(),
                        seq,
                        now,
                        Some(t.props().default_message_time_to_live),
                    );
                    // Woken below.
                    st.dirty = false;
                    None
                }
            }
        };
        match forward {
            Some(target) => {
                let node = self.node(&target)?;
                self.route(&node, msg.clone(), hops + 1)?;
            }
            None => sub.queue.notify.notify_waiters(),
        }
        Ok(())
    }
}
