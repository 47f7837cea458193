//! Runtime tests on the in-memory broker and real stores: the article's verification at the
//! runtime level, lock keeping under tokio's paused clock, and shutdown.
#![allow(clippy::unwrap_used, clippy::panic, clippy::unwrap_in_result)]

#[path = "../support/mod.rs"]
mod support;

mod batch;
mod circuit;
mod cli;
mod holes;
mod limits;
mod lock;
mod panics;
mod relay;
mod retry;
mod router;
mod scenarios;
mod shutdown;
mod verdict;
