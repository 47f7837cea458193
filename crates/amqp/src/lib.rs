//! AMQP 1.0 engine for sb-inbox: client and server roles on one protocol core.
//!
//! # Layout
//!
//! - `frame`: parses and encodes frames; never touches a socket ([`Frame::parse`]).
//! - `performative`: one file per performative (open … close) with byte-level tests;
//!   field layouts come from `fe2o3-amqp-types`.
//! - `decode`: the bounds check every untrusted byte passes before `serde_amqp` reads it
//!   ([`validate_encoding`]; lengths, counts, nesting, an element budget).
//! - `sasl`: SASL frames and the settings of the client (ANONYMOUS, PLAIN) and server
//!   (configurable list, e.g. MSSBCBS, PLAIN, ANONYMOUS) exchanges, which run in `core`.
//! - `transport`: URLs, TCP, TLS (rustls with the `ring` provider); `websocket`: AMQP over
//!   WebSockets (`ws://`, `wss://`, subprotocol `AMQPWSB10`, [`Listener::bind_websocket`]).
//! - `core`: the role-neutral connection core: frame I/O ([`FramedIo`]), the SASL exchanges,
//!   the driver (one task per connection running every session and link state machine:
//!   windows, credit, drain, multi-frame transfers, heartbeats, settlement) and the handles
//!   both roles use:
//!   [`Connection`], [`Session`], [`Sender`], [`Receiver`].
//! - `client`: the client role on the core: [`Connection::open`] and [`ConnectionOptions`].
//! - `server`: the server role on the core: [`Listener`] → [`IncomingConnection`] →
//!   [`ServerConnection`] → [`ConnectionEvent::Link`] ([`LinkRequest`]) → [`Sender`] /
//!   [`Receiver`].
//! - Imports go one way: `client` and `server` use `core`, never each other, and `core` uses
//!   neither (a unit test reads the sources to keep it so).
//! - `request`: [`RequestResponse`], the `$cbs` / `$management` helper.
//! - [`servicebus`]: the Service Bus wire vocabulary (annotations, operations, properties,
//!   filters, conditions) that the client and the emulator share.
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
//!
//! # Cargo features
//! - `websockets` (off by default): AMQP over WebSockets, `ws://` and `wss://` addresses
//!   and [`Listener::bind_websocket`] / [`Listener::bind_amqp_and_websocket`], with the
//!   handshake from `tokio-tungstenite`. Without it a `ws`/`wss` [`Address`] is refused and a
//!   WebSocket listener fails every handshake, each naming the feature.
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]
// docs.rs (all features, `--cfg docsrs`): each feature-gated item shows the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![doc(test(attr(deny(warnings), allow(dead_code))))]

mod builder;
mod client;
mod core;
mod decode;
mod delivery;
mod error;
pub mod frame;
#[cfg(test)]
mod hostile_tests;
pub mod performative;
mod proxy;
mod request;
pub mod sasl;
mod server;
pub mod servicebus;
mod transport;
mod websocket;

pub use client::ConnectionOptions;
pub use core::{
    BoxIo, Connection, FramedIo, Io, LinkStatus, Receiver, ReceiverOptions, Sender, SenderOptions,
    Session, SessionOptions, Settler, unique_name,
};
pub use decode::{EncodingError, MAX_NESTING, validate_encoding};
pub use delivery::{
    AnyMessage, BATCH_MESSAGE_FORMAT, Delivery, IncomingDisposition, LinkFlow, Outcome, Sendable,
    decode_message, encode_message,
};
pub use error::{AmqpError, Error, Result, condition};
pub use frame::{Frame, FrameBody};
pub use proxy::HttpProxy;
pub use request::{DEFAULT_MAX_REPLY_SIZE, RequestResponse};
pub use sasl::{SaslClient, SaslIdentity, SaslServer};
pub use server::{
    Accepted, ConnectionEvent, IncomingConnection, LinkAnswer, LinkRequest, Listener,
    ServerConnection, ServerOptions, UnfinishedBytesBound, serve_io,
};
pub use transport::{Address, default_tls_config};
pub use websocket::{SERVICE_BUS_PATH as WEBSOCKET_PATH, SUBPROTOCOL as WEBSOCKET_SUBPROTOCOL};

/// The codec crates, re-exported: `types` is `fe2o3-amqp-types`, `codec` is `serde_amqp`.
pub use fe2o3_amqp_types as types;
/// rustls, re-exported for building TLS configurations.
pub use rustls;
/// `serde_amqp`, for its value types and the encoder. Its decoder (`codec::from_slice`) trusts
/// the lengths it reads: decode untrusted bytes with [`decode_message`] (or check them with
/// [`validate_encoding`] first).
pub use serde_amqp as codec;

/// The default connection-wide bound on bytes held in unfinished incoming deliveries
/// ([`ConnectionOptions::max_unfinished_bytes`], [`ServerOptions::max_unfinished_bytes`]):
/// 64 MiB, room for many deliveries of the sizes Service Bus takes by default (256 KB Standard,
/// 1 MB Premium); a connection whose links take larger messages raises it.
pub const DEFAULT_MAX_UNFINISHED_BYTES: u64 = 64 * 1024 * 1024;

/// Compiles the README's examples as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
