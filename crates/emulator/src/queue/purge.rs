//! Batch deletion (`com.microsoft:batch-delete-messages`, the JavaScript SDK 7.10 beta's
//! `deleteMessages` / `purgeMessages`, .NET `ServiceBusReceiver.DeleteMessagesAsync`): up to a
//! count of the oldest messages enqueued before a time are removed without being received.
//!
//! Locked messages stay: deleting them would pull a message from under its receiver, and
//! .NET documents the operation as deleting messages "that are not locked"
//! (`ServiceBusReceiver.DeleteMessagesAsync`, azure-sdk-for-net).

use std::time::SystemTime;

use super::QueueState;

impl QueueState {
    /// Deletes up to `count` unlocked messages of the main (or dead-letter) subqueue enqueued
    /// before `older_than`, lowest sequence numbers first, of `session_id` when given; returns
    /// how many.
    pub(crate) fn delete_messages(
        &mut self,
        dlq: bool,
        count: usize,
        older_than: SystemTime,
        session_id: Option<&str>,
    ) -> usize {
        let store = self.store(dlq);
        let doomed: Vec<i64> = store
            .messages
            .values()
            .filter(|s| s.lock.is_none() && s.enqueued_time < older_than)
            .filter(|s| session_id.is_none() || s.msg.session_id.as_deref() == session_id)
            .map(|s| s.seq)
            .take(count)
            .collect();
        for seq in &doomed {
            store.remove(*seq);
        }
        self.counts.completed += doomed.len() as u64;
        doomed.len()
    }
}
