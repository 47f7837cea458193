//! Fault hooks on a queue or subscription (both subqueues): expired locks, refused renewals
//! and dispositions, delayed dispositions, undecodable deliveries, paused delivery.

use std::time::Duration;

use uuid::Uuid;

use crate::error::Result;

use super::Entity;

impl Entity {
    /// Fault hook: the lock expires now; the message is redelivered with delivery count + 1
    /// (or dead-lettered at `MaxDeliveryCount`) and the token is lost.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) for an unknown token; [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn expire_lock(&self, lock_token: Uuid) -> Result<()> {
        self.with_queue("expire-lock", |_, st, dlq, now| {
            st.expire_lock(dlq, lock_token, now)
        })
    }

    /// Whether `lock_token` still locks a message here (false on topics).
    pub fn is_locked(&self, lock_token: Uuid) -> bool {
        self.with_queue("is-locked", |_, st, dlq, now| {
            Ok(st.is_locked(dlq, lock_token, now))
        })
        .unwrap_or(false)
    }

    /// Fault hook: the next `count` renew-lock requests fail with [`Error::LockLost`](crate::Error::LockLost) (the
    /// locks themselves stay until they expire).
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn refuse_renewals(&self, count: u32) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.refuse_renewals = count;
            Ok(())
        })
    }

    /// Fault hook: the next `count` dispositions (settle or update-disposition) fail with
    /// [`Error::Refused`](crate::Error::Refused) and leave the message locked.
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn refuse_dispositions(&self, count: u32) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.refuse_dispositions = count;
            Ok(())
        })
    }

    /// Fault hook: the next `count` dispositions wait `delay` (on tokio's clock) before they
    /// apply; a lock that expires meanwhile makes them fail with [`Error::LockLost`](crate::Error::LockLost).
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
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
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
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
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn pause_delivery(&self) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.paused = true;
            Ok(())
        })
    }

    /// Fault hook: resumes delivery and wakes waiting receivers.
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) on topics.
    pub fn resume_delivery(&self) -> Result<()> {
        self.with_queue("fault", |_, st, _, _| {
            st.faults.paused = false;
            st.dirty = true;
            Ok(())
        })
    }
}
