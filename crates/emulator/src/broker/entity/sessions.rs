//! Message sessions through an entity handle: accept, receive from, renew and release a
//! session; session state; listing sessions.

use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::error::Result;
use crate::message::{ReceiveMode, ReceivedMessage};
use crate::queue::SessionLock;

use super::Entity;

impl Entity {
    /// Accepts a session of a session-enabled queue or subscription: `session_id`, or (with
    /// `None`) the session of the oldest receivable message whose session is free, waiting at
    /// most `max_wait` for one (`Ok(None)` on timeout). The session lock lasts `LockDuration`.
    ///
    /// # Errors
    /// [`Error::SessionCannotBeLocked`](crate::Error::SessionCannotBeLocked) when another receiver holds `session_id`;
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) when the entity does not require sessions.
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
    /// [`Error::SessionLockLost`](crate::Error::SessionLockLost) once the session lock expired or was released.
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
    /// [`Error::SessionLockLost`](crate::Error::SessionLockLost) once `lock` expired, was released or was superseded.
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
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) when the entity does not require sessions.
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
    /// [`Error::SessionLockLost`](crate::Error::SessionLockLost) when the session lock already expired.
    pub fn renew_session_lock(&self, session_id: &str) -> Result<SystemTime> {
        self.check_sessionful("renew-session-lock")?;
        self.with_queue("renew-session-lock", |_, st, _, now| {
            st.renew_session(session_id, now)
        })
    }

    /// Releases a session lock (call when the session receiver's link closes).
    ///
    /// # Errors
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) when the entity does not require sessions.
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
    /// [`Error::SessionLockLost`](crate::Error::SessionLockLost) without a valid session lock.
    pub fn session_state(&self, session_id: &str) -> Result<Option<Bytes>> {
        self.check_sessionful("get-session-state")?;
        self.with_queue("get-session-state", |_, st, _, now| {
            st.session_state(session_id, now)
        })
    }

    /// `com.microsoft:set-session-state` (`None` clears it).
    ///
    /// # Errors
    /// [`Error::SessionLockLost`](crate::Error::SessionLockLost) without a valid session lock.
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
    /// [`Error::NotAllowed`](crate::Error::NotAllowed) when the entity does not require sessions.
    pub fn message_sessions(&self, updated_after: Option<SystemTime>) -> Result<Vec<String>> {
        self.check_sessionful("get-message-sessions")?;
        self.with_queue("get-message-sessions", |_, st, _, _| {
            Ok(st.session_ids(updated_after))
        })
    }
}
