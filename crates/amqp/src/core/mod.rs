//! The role-neutral connection core: everything a connection does once `open` is exchanged,
//! the same whichever side opened the socket. The client role (`crate::client`) and the
//! server role (`crate::server`) sit on top; this module imports neither.
//!
//! # Layout
//! - `framed_io`: the socket and its buffers ([`FramedIo`]), split into reader and writer.
//! - `open`: the `open` exchange both roles share, and starting the driver.
//! - `sasl`: the SASL exchanges (client and server) run before `open`.
//! - `driver`: one task per connection running every session and link state machine
//!   (windows, credit, drain, multi-frame transfers, heartbeats, settlement).
//! - `command`: what handles send the driver ([`command::Command`]) and what the driver sends
//!   a link handle ([`command::LinkEvent`]).
//! - `connection`, `session`, `link`: the handles: [`Connection`], [`Session`], [`Sender`],
//!   [`Receiver`], [`Settler`], and the peer's attach waiting for an answer.
//! - `naming`: [`unique_name`].
//!
//! Imports go one way: `client` and `server` use `core`; `core` uses neither, and they do not
//! use each other (checked by the `layering` test below).

pub(crate) mod command;
mod connection;
mod driver;
mod framed_io;
pub(crate) mod link;
mod naming;
pub(crate) mod open;
pub(crate) mod sasl;
mod session;

pub use connection::Connection;
pub use framed_io::{BoxIo, FramedIo, Io};
pub use link::{LinkStatus, Receiver, ReceiverOptions, Sender, SenderOptions, Settler};
pub use naming::unique_name;
pub use session::{Session, SessionOptions};

#[cfg(test)]
mod layering;
