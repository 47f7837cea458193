//! Dispatch of the handles' [`Command`]s to the driver modules that carry them out, and the
//! identity check every handle's command passes first.

use super::Driver;
use super::link_state::Link;
use super::session_state::Session;
use crate::core::command::{Command, LinkRef, SessionRef};
use crate::error::Error;

impl Driver {
    pub(super) fn on_command(&mut self, c: Command) {
        match c {
            Command::Begin {
                key,
                incoming_window,
                outgoing_window,
                ended,
                reply,
            } => self.begin_session(key, incoming_window, outgoing_window, ended, reply),
            Command::End {
                channel,
                key,
                error,
                reply,
            } => self.end_session(channel, key, error, reply),
            Command::Attach {
                session,
                key,
                attach,
                setup,
                reply,
            } => self.attach(session, key, attach, setup, reply),
            Command::AnswerAttach {
                session,
                key,
                remote_handle,
                attach,
                setup,
                reject,
                reply,
            } => {
                let answer = match (reject, setup) {
                    (None, Some(setup)) => Ok(setup),
                    (reject, _) => Err(reject),
                };
                self.answer_attach(session, key, remote_handle, attach, answer, reply);
            }
            Command::Detach { link, error, reply } => self.detach(link, error, reply),
            Command::Send {
                link,
                send,
                track,
                reply,
            } => self.send(link, send, track, reply),
            Command::Credit {
                link,
                op,
                drain,
                reply,
            } => self.set_credit(link, op, drain, reply),
            Command::AnswerDrain { link } => self.answer_drain(link),
            Command::Dispose { disposition, reply } => self.dispose(disposition, reply),
            Command::Unsettled { session, reply } => self.unsettled(session, reply),
            Command::Close { error, reply } => self.close(error, reply),
        }
    }

    /// The session `at` names, while it has its channel: a channel is reused as soon as its
    /// session ended, and a handle of the ended session must not act on the new one.
    pub(super) fn session_at(&mut self, at: SessionRef) -> Option<&mut Session> {
        self.sessions
            .get_mut(&at.channel)
            .filter(|s| s.key == at.key)
    }

    /// The link `at` names, while its session has its channel and the link its handle: a
    /// handle number is reused as soon as its link is gone, like a channel.
    pub(super) fn link_at(&mut self, at: LinkRef) -> Option<&mut Link> {
        self.session_at(at.session())?
            .links
            .get_mut(&at.handle)
            .filter(|l| l.key == at.key)
    }

    /// Whether the link `at` names is still in the driver's state; if not, why: its session
    /// ended ([`Error::SessionEnded`]) or the link is gone ([`Error::LinkDetached`]), whatever
    /// session or link took its channel or handle number since.
    pub(super) fn link_gone(&self, at: LinkRef) -> Option<Error> {
        match self.sessions.get(&at.channel) {
            Some(s) if s.key == at.session => match s.links.get(&at.handle) {
                Some(l) if l.key == at.key => None,
                _ => Some(Error::LinkDetached(None)),
            },
            _ => Some(Error::SessionEnded(None)),
        }
    }
}
