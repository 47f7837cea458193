//! Dispatch of the handles' [`Command`]s to the driver modules that carry them out.

use super::Driver;
use crate::core::command::Command;

impl Driver {
    pub(super) fn on_command(&mut self, c: Command) {
        match c {
            Command::Begin {
                incoming_window,
                outgoing_window,
                ended,
                reply,
            } => self.begin_session(incoming_window, outgoing_window, ended, reply),
            Command::End {
                channel,
                error,
                reply,
            } => self.end_session(channel, error, reply),
            Command::Attach {
                channel,
                attach,
                setup,
                reply,
            } => self.attach(channel, attach, setup, reply),
            Command::AnswerAttach {
                channel,
                remote_handle,
                attach,
                setup,
                reject,
                reply,
            } => self.answer_attach(channel, remote_handle, attach, setup, reject, reply),
            Command::Detach {
                channel,
                handle,
                name,
                error,
                reply,
            } => self.detach(channel, handle, &name, error, reply),
            Command::Send {
                channel,
                handle,
                send,
                track,
                reply,
            } => self.send(channel, handle, send, track, reply),
            Command::Credit {
                channel,
                handle,
                op,
                drain,
                reply,
            } => self.set_credit(channel, handle, op, drain, reply),
            Command::AnswerDrain { channel, handle } => self.answer_drain(channel, handle),
            Command::Dispose { disposition, reply } => self.dispose(disposition, reply),
            Command::Unsettled { channel, reply } => self.unsettled(channel, reply),
            Command::Close { error, reply } => self.close(error, reply),
        }
    }
}
