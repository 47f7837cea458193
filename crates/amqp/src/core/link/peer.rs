//! [`PeerAttach`]: an attach the peer sent, waiting for the application's answer. Dropping it
//! unanswered refuses the link with `amqp:not-found`.

use std::sync::Arc;

use fe2o3_amqp_types::definitions::{Handle, Role};
use tokio::sync::oneshot;

use super::{LinkCore, LinkParts, LinkPipes};
use crate::core::command::{Command, ConnCtx, ConnInner, LinkRef, Reply, SessionRef, next_key};
use crate::error::{AmqpError, Result, condition};
use crate::performative::Attach;

/// A peer's attach, as the driver hands it to the application.
#[derive(Debug)]
pub(crate) struct PeerAttach {
    ctx: ConnCtx,
    /// Keeps the connection open while the link lives.
    conn: Option<Arc<ConnInner>>,
    session: SessionRef,
    remote: Box<Attach>,
    answered: bool,
}

impl PeerAttach {
    pub(crate) fn new(
        ctx: ConnCtx,
        conn: Option<Arc<ConnInner>>,
        session: SessionRef,
        remote: Attach,
    ) -> Self {
        Self {
            ctx,
            conn,
            session,
            remote: Box::new(remote),
            answered: false,
        }
    }

    /// The peer's attach.
    pub(crate) fn remote(&self) -> &Attach {
        &self.remote
    }

    /// Our local channel.
    pub(crate) fn channel(&self) -> u16 {
        self.session.channel
    }

    /// The role we take: the opposite of the peer's.
    pub(crate) fn our_role(&self) -> Role {
        if self.remote.role == Role::Sender {
            Role::Receiver
        } else {
            Role::Sender
        }
    }

    /// Completes the attach with `attach` (our answer) and returns the link's parts.
    pub(crate) async fn accept(
        mut self,
        attach: Attach,
        auto_credit: Option<u32>,
        auto_drain: bool,
        max_incoming: Option<u64>,
    ) -> Result<LinkParts> {
        self.answered = true;
        let (mut setup, pipes) = LinkPipes::open(auto_credit, auto_drain);
        setup.max_incoming = max_incoming;
        let session = self.session;
        let key = next_key();
        let remote_handle = self.remote.handle.0;
        let handle = self
            .ctx
            .call(|reply| Command::AnswerAttach {
                session,
                key,
                remote_handle,
                attach: Box::new(attach.clone()),
                setup: Some(setup),
                reject: None,
                reply,
            })
            .await?;
        let name = self.remote.name.clone();
        let at = LinkRef {
            channel: session.channel,
            session: session.key,
            handle,
            key,
        };
        let core = LinkCore::new(self.ctx.clone(), at, name, None, self.conn.clone());
        Ok(pipes.into_parts(core, attach, self.remote.clone()))
    }

    /// Refuses the link: completes the attach with `attach`, then detaches with `error`.
    pub(crate) async fn refuse(mut self, attach: Attach, error: AmqpError) -> Result<()> {
        self.answered = true;
        let (tx, rx) = oneshot::channel();
        self.ctx.send(self.refuse_command(attach, error, tx))?;
        rx.await.map_err(|_| self.ctx.err())?.map(|_| ())
    }

    fn refuse_command(&self, attach: Attach, error: AmqpError, reply: Reply<u32>) -> Command {
        Command::AnswerAttach {
            session: self.session,
            // A refused link gets no state in the driver, so its key names nothing.
            key: next_key(),
            remote_handle: self.remote.handle.0,
            attach: Box::new(attach),
            setup: None,
            reject: Some(error),
            reply,
        }
    }

    /// The plainest answer: the peer's terminus and settle modes echoed.
    pub(crate) fn echo_attach(&self) -> Attach {
        let r = &self.remote;
        let role = self.our_role();
        Attach {
            name: r.name.clone(),
            handle: Handle(0),
            role: role.clone(),
            snd_settle_mode: r.snd_settle_mode.clone(),
            rcv_settle_mode: r.rcv_settle_mode.clone(),
            source: r.source.clone(),
            target: r.target.clone(),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: (role == Role::Sender).then_some(0),
            max_message_size: None,
            offered_capabilities: None,
            desired_capabilities: None,
            properties: None,
        }
    }
}

impl Drop for PeerAttach {
    fn drop(&mut self) {
        if !self.answered {
            let (tx, _rx) = oneshot::channel();
            let error = AmqpError::new(condition::NOT_FOUND, Some("link not served".to_string()));
            let cmd = self.refuse_command(self.echo_attach(), error, tx);
            // The connection may already be gone; then there is nothing to refuse.
            let _ = self.ctx.cmd.send(cmd);
        }
    }
}
