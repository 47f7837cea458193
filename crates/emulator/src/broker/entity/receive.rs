//! Receiving from an entity: waiting or not, peeking, deferred messages by sequence number.

use std::time::Duration;

use crate::error::Result;
use crate::message::{ReceiveMode, ReceivedMessage};

use super::Entity;

impl Entity {
    /// Takes the next receivable message without waiting (`Ok(None)` when there is none or
    /// delivery is paused).
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics and session-enabled entities.
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
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics and on session-enabled entities (use
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

    /// `com.microsoft:peek-message`: up to `count` messages with sequence number ≥ `from`, in
    /// sequence order, without locking. Like Service Bus, includes locked and deferred
    /// messages, and scheduled ones on queues (not on subscriptions); the dead-letter queue is
    /// peeked through its own address.
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn peek(&self, from_sequence_number: i64, count: usize) -> Result<Vec<ReceivedMessage>> {
        self.with_queue("peek-message", |q, st, dlq, _| {
            Ok(st.peek(dlq, from_sequence_number, count, !q.is_subscription))
        })
    }

    /// `com.microsoft:batch-delete-messages`: deletes up to `count` unlocked messages
    /// enqueued before `older_than` (of `session_id` when given), oldest first; returns how
    /// many.
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on a topic.
    pub fn delete_messages(
        &self,
        count: usize,
        older_than: std::time::SystemTime,
        session_id: Option<&str>,
    ) -> Result<usize> {
        self.with_queue("batch-delete-messages", |_, st, dlq, _| {
            Ok(st.delete_messages(dlq, count, older_than, session_id))
        })
    }

    /// `com.microsoft:receive-by-sequence-number`: receives deferred messages (locked in
    /// peek-lock mode).
    ///
    /// # Errors
    /// [`Error::MessageNotFound`](crate::Error::MessageNotFound) if any sequence number is not a deferred, unlocked message
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
}
