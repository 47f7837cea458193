//! The server role: a [`Listener`] yields [`IncomingConnection`]s; after the handshake a
//! [`ServerConnection`] yields [`ConnectionEvent`]s, e.g. a [`LinkRequest`] for every link a
//! client attaches. Each accepted link is a [`crate::Sender`] or [`crate::Receiver`] handle,
//! the same types as on the client side.
//!
//! Sessions a client begins are accepted automatically (Python clients pipeline `begin` and
//! `attach` before seeing our `open`).
//!
//! # Layout
//! - `listener`: [`Listener`], [`IncomingConnection`], [`ServerOptions`], [`serve_io`]: TLS,
//!   WebSocket upgrade, headers, SASL as a server, the `open` exchange.
//! - `connection`: [`ServerConnection`] and its [`ConnectionEvent`]s.
//! - `link_request`: [`LinkRequest`] and [`LinkAnswer`]: answering a client's attach.

mod connection;
mod link_request;
mod listener;
mod sniff;

pub use connection::{ConnectionEvent, ServerConnection};
pub use link_request::{LinkAnswer, LinkRequest};
pub use listener::{
    Accepted, IncomingConnection, Listener, ServerOptions, UnfinishedBytesBound, serve_io,
};
