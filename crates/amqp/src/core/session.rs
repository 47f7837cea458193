//! The [`Session`] handle: attaching links by name (either role may), ending. It holds its
//! connection's shared state, not the connection handle: the connection module answers
//! [`Session::connection`] (issue 46: imports go down the ownership).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::command::{Command, ConnInner, LinkRef, SessionRef, next_key};
use super::link::{
    LinkCore, LinkParts, LinkPipes, Receiver, ReceiverOptions, Sender, SenderOptions,
};
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::performative::Attach;

/// Session windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionOptions {
    /// Transfer frames the peer may send before we widen the window again.
    pub incoming_window: u32,
    /// Our advertised outgoing window.
    pub outgoing_window: u32,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            incoming_window: 2048,
            outgoing_window: 2048,
        }
    }
}

/// What the handles of one session share; dropping the last one ends the session.
#[derive(Debug)]
pub(crate) struct SessionInner {
    conn: Arc<ConnInner>,
    at: SessionRef,
    /// Set by the driver once the session ended, by either side or with the connection.
    ended: Arc<AtomicBool>,
}

impl Drop for SessionInner {
    fn drop(&mut self) {
        // An ended session's channel may already carry a new session (the driver also checks
        // the key, so a race with the peer's `end` cannot end that one).
        if self.ended.load(Ordering::Acquire) {
            return;
        }
        // The driver may already be gone; then the session is gone too.
        let _ = self.conn.ctx.cmd.send(Command::End {
            channel: self.at.channel,
            key: Some(self.at.key),
            error: None,
            reply: None,
        });
    }
}

/// A session. Links keep it alive; it ends when the last handle is dropped or on
/// [`Session::end`].
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
}

impl Session {
    pub(crate) fn new(conn: Arc<ConnInner>, at: SessionRef, ended: Arc<AtomicBool>) -> Self {
        Self {
            inner: Arc::new(SessionInner { conn, at, ended }),
        }
    }

    /// True once the session ended: the peer sent `end` (a broker may end a session while
    /// the connection lives), we ended it, or the connection failed. Its links are gone;
    /// begin a new session.
    pub fn is_ended(&self) -> bool {
        self.inner.ended.load(Ordering::Acquire)
    }

    /// The local channel number.
    pub fn channel(&self) -> u16 {
        self.inner.at.channel
    }

    /// What keeps this session's connection open ([`Session::connection`] is answered by the
    /// connection module, which owns sessions).
    pub(crate) fn conn(&self) -> &Arc<ConnInner> {
        &self.inner.conn
    }

    async fn attach(
        &self,
        attach: Attach,
        auto_credit: Option<u32>,
        auto_drain: bool,
    ) -> Result<LinkParts> {
        let (setup, pipes) = LinkPipes::open(auto_credit, auto_drain);
        let ctx = self.inner.conn.ctx.clone();
        let session = self.inner.at;
        let key = next_key();
        let name = attach.name.clone();
        let (handle, remote) = ctx
            .call(|reply| Command::Attach {
                session,
                key,
                attach: Box::new(attach.clone()),
                setup,
                reply,
            })
            .await?;
        let link = LinkRef {
            channel: session.channel,
            session: session.key,
            handle,
            key,
        };
        let core = LinkCore::new(ctx, link, name, Some(self.inner.clone()), None);
        Ok(pipes.into_parts(core, attach, remote))
    }

    /// Attaches a sending link.
    ///
    /// # Examples
    /// ```no_run
    /// # async fn f(session: sb_amqp::Session) -> sb_amqp::Result<()> {
    /// use sb_amqp::{SenderOptions, Sendable};
    /// let sender = session.attach_sender(SenderOptions::new("s1", "queue-a")).await?;
    /// let outcome = sender.send(Sendable::raw(&b"\x00\x53\x77\xa1\x02hi"[..])).await?;
    /// assert!(outcome.is_accepted());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::AttachRefused`] with the peer's condition, or session/connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %opts.name, channel = self.inner.at.channel))]
    pub async fn attach_sender(&self, opts: SenderOptions) -> Result<Sender> {
        let auto_drain = opts.auto_drain;
        let p = self.attach(opts.into_attach(), None, auto_drain).await?;
        Ok(Sender::from_parts(p))
    }

    /// Attaches a receiving link.
    ///
    /// # Errors
    /// [`Error::AttachRefused`] with the peer's condition, or session/connection errors.
    #[tracing::instrument(level = "debug", skip_all, fields(link = %opts.name, channel = self.inner.at.channel))]
    pub async fn attach_receiver(&self, opts: ReceiverOptions) -> Result<Receiver> {
        let auto = opts.auto_credit;
        let initial = opts.credit;
        let p = self.attach(opts.into_attach(), auto, true).await?;
        let r = Receiver::from_parts(p);
        let c = auto.or(initial);
        if let Some(c) = c.filter(|c| *c > 0) {
            r.set_credit(c).await?;
        }
        Ok(r)
    }

    /// Ends the session and waits for the peer's `end`.
    ///
    /// # Errors
    /// Connection errors.
    pub async fn end(self) -> Result<()> {
        if self.is_ended() {
            // Its channel may carry a new session by now.
            return Ok(());
        }
        let at = self.inner.at;
        self.inner
            .conn
            .ctx
            .call(|reply| Command::End {
                channel: at.channel,
                key: Some(at.key),
                error: None,
                reply: Some(reply),
            })
            .await
    }
}
