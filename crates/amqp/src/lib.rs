//! AMQP 1.0 engine for sb-inbox: client and server roles on one protocol core.
//!
//! # Layout
//!
//! - `frame`: parses and encodes frames; never touches a socket ([`Frame::parse`]).
//! - `performative`: one file per performative (open … close) with byte-level tests;
//!   field layouts come from `fe2o3-amqp-types`.
//! - `sasl`: SASL frames plus client (ANONYMOUS, PLAIN) and server (configurable list, e.g.
//!   MSSBCBS, PLAIN, ANONYMOUS) exchanges.
//! - `connection`: owns the socket and buffers ([`FramedIo`]); `transport`: URLs, TCP, TLS
//!   (rustls with the `ring` provider); `websocket`: AMQP over WebSockets (`ws://`, `wss://`,
//!   subprotocol `AMQPWSB10`, [`Listener::bind_websocket`]).
//! - `driver`: one task per connection running every session and link state machine
//!   (windows, credit, drain, multi-frame transfers, heartbeats, settlement).
//! - `client` / `server`: the handles applications use: [`Connection`], [`Session`],
//!   [`Sender`], [`Receiver`]; [`Listener`] → [`IncomingConnection`] → [`ServerConnection`]
//!   → [`ConnectionEvent::Link`] ([`LinkRequest`]) → [`Sender`] / [`Receiver`].
//! - `request`: [`RequestResponse`], the `$cbs` / `$management` helper.
//!
//! Dropping any handle detaches, ends or closes it in the background; siblings keep working.
//! Losing the socket fails every pending operation with a typed [`Error`].
//!
//! # Examples
//! ```no_run
//! # async fn f() -> sb_amqp::Result<()> {
//! use sb_amqp::{Connection, ReceiverOptions, Sendable, SenderOptions};
//! use sb_amqp::types::messaging::Message;
//!
//! let conn = Connection::open("amqp://guest:guest@127.0.0.1:5672").await?;
//! let session = conn.begin().await?;
//! let sender = session.attach_sender(SenderOptions::new("s", "/queue/a")).await?;
//! let msg = Message::builder().value("hello").build();
//! let outcome = sender.send(Sendable::message(&msg)?).await?;
//! assert!(outcome.is_accepted());
//!
//! let receiver = session
//!     .attach_receiver(ReceiverOptions::new("r", "/queue/a").credit(10))
//!     .await?;
//! let delivery = receiver.recv().await?;
//! receiver.accept(&delivery).await?;
//! # Ok(()) }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod client;
mod connection;
mod delivery;
mod driver;
mod error;
pub mod frame;
pub mod performative;
mod request;
pub mod sasl;
mod server;
mod transport;
mod websocket;

pub use client::{
    Connection, ConnectionOptions, Receiver, ReceiverOptions, Sender, SenderOptions, Session,
    SessionOptions, Settler, unique_name,
};
pub use connection::{BoxIo, FramedIo, Io};
pub use delivery::{
    AnyMessage, BATCH_MESSAGE_FORMAT, Delivery, IncomingDisposition, LinkFlow, Outcome, Sendable,
    decode_message, encode_message,
};
pub use error::{AmqpError, Error, Result, condition};
pub use frame::{Frame, FrameBody};
pub use request::RequestResponse;
pub use sasl::{SaslClient, SaslIdentity, SaslServer};
pub use server::{
    ConnectionEvent, IncomingConnection, LinkAnswer, LinkRequest, Listener, ServerConnection,
    ServerOptions, serve_io,
};
pub use transport::{Address, default_tls_config};
pub use websocket::{SERVICE_BUS_PATH as WEBSOCKET_PATH, SUBPROTOCOL as WEBSOCKET_SUBPROTOCOL};

/// The codec crates, re-exported: `types` is `fe2o3-amqp-types`, `codec` is `serde_amqp`.
pub use fe2o3_amqp_types as types;
/// rustls, re-exported for building TLS configurations.
pub use rustls;
pub use serde_amqp as codec;

/// Compiles the README's examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
