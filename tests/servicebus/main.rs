//! The Service Bus client against the emulator, in-process on an ephemeral port, and the
//! runtime end to end over both.
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

#[path = "../support/mod.rs"]
mod support;

mod admin;
mod bad_day;
mod bad_input;
mod cli;
mod client;
mod emulator_wire;
mod entity_check;
mod envelopes;
mod external;
mod external_key;
mod fidelity;
mod holes;
mod host;
mod hostile_peer;
mod identity;
mod js;
mod links;
mod ops;
mod outbox_envelopes;
mod pipeline;
mod python;
mod recovery;
mod relay;
mod retry;
mod router;
mod sessions;
mod strict;
mod survival;
mod tls;
mod verification;
mod verify_command;
mod vocabulary;
mod websocket;
mod worker;
