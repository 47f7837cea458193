//! The [`Connection`] handle, the same for both roles once `open` is exchanged: sessions,
//! close, liveness and heartbeat counters.
//!
//! Imports go down the ownership: a connection begins sessions and answers
//! [`Session::connection`] (here, not in `session`); sessions attach links; links and sessions
//! hold what they keep alive without naming the handle above them (issue 46).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::command::{Command, ConnInner, SessionRef, next_key};
use super::session::{Session, SessionOptions};
use crate::error::{AmqpError, Error, Result};
use crate::performative::Open;

/// An open AMQP connection (client or server side).
///
/// Cloning is cheap; the connection closes when the last clone and every session and link
/// opened from it are dropped, or on [`Connection::close`].
#[derive(Debug, Clone)]
pub struct Connection {
    pub(crate) inner: Arc<ConnInner>,
}

impl Connection {
    /// The peer's `open`.
    pub fn remote_open(&self) -> &Open {
        &self.inner.remote_open
    }

    /// Begins a session with default windows.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn begin(&self) -> Result<Session> {
        self.begin_with(SessionOptions::default()).await
    }

    /// Begins a session.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn begin_with(&self, opts: SessionOptions) -> Result<Session> {
        let ended = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let key = next_key();
        let channel = self
            .inner
            .ctx
            .call(|reply| Command::Begin {
                key,
                incoming_window: opts.incoming_window,
                outgoing_window: opts.outgoing_window,
                ended: ended.clone(),
                reply,
            })
            .await?;
        Ok(Session::new(
            self.inner.clone(),
            SessionRef { channel, key },
            ended,
        ))
    }

    /// Ends the session on local `channel` with `error` (a peer's session, e.g. one a server
    /// accepted: a broker may end a client's session while the connection lives) and waits
    /// for the peer's `end`. A channel with no session is already ended.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn end_session(&self, channel: u16, error: Option<AmqpError>) -> Result<()> {
        self.inner
            .ctx
            .call(|reply| Command::End {
                channel,
                key: None,
                error,
                reply: Some(reply),
            })
            .await
    }

    /// Closes the connection (with an optional error) and waits for the peer's `close`.
    ///
    /// # Errors
    /// The peer's close error, or the error that already ended the connection.
    pub async fn close_with(&self, error: Option<AmqpError>) -> Result<()> {
        let r = self
            .inner
            .ctx
            .call(|reply| Command::Close {
                error,
                reply: Some(reply),
            })
            .await;
        match r {
            Err(Error::ConnectionClosed(None)) => Ok(()),
            r => r,
        }
    }

    /// Closes the connection cleanly and waits for the peer's `close`.
    ///
    /// # Errors
    /// See [`Connection::close_with`].
    pub async fn close(&self) -> Result<()> {
        self.close_with(None).await
    }

    /// Waits until the connection ends and returns why.
    pub async fn closed(&self) -> Error {
        let mut rx = self.inner.ctx.terminal.clone();
        match rx.wait_for(|e| e.is_some()).await {
            Ok(e) => e.clone().unwrap_or(Error::ConnectionLost),
            Err(_) => Error::ConnectionLost,
        }
    }

    /// The error that ended the connection, if it has ended.
    pub fn error(&self) -> Option<Error> {
        self.inner.ctx.terminal.borrow().clone()
    }

    /// Number of empty (heartbeat) frames received so far.
    pub fn heartbeats_received(&self) -> u64 {
        self.inner.stats.heartbeats_received.load(Ordering::Relaxed)
    }

    /// Number of empty (heartbeat) frames sent so far.
    pub fn heartbeats_sent(&self) -> u64 {
        self.inner.stats.heartbeats_sent.load(Ordering::Relaxed)
    }

    /// Waits until at least `n` heartbeats were received.
    ///
    /// # Errors
    /// The connection's error if it ends first.
    pub async fn wait_heartbeats(&self, n: u64) -> Result<()> {
        loop {
            let notified = self.inner.stats.heartbeat_notify.notified();
            if self.heartbeats_received() >= n {
                return Ok(());
            }
            if let Some(e) = self.error() {
                return Err(e);
            }
            tokio::select! {
                _ = notified => {}
                e = self.closed() => return Err(e),
            }
        }
    }
}

impl Session {
    /// The connection this session belongs to.
    pub fn connection(&self) -> Connection {
        Connection {
            inner: self.conn().clone(),
        }
    }
}
