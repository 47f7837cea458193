//! Sending to an entity: single messages, batches, scheduled messages.

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::message::BrokerMessage;

use crate::broker::SendOutcome;

use super::{Entity, Target};

impl Entity {
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
            && queue.props().requires_session
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
                for (_, sub) in &t.subscriptions() {
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
}
