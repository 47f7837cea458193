//! Integration tests for sb-amqp: engine-to-engine, RabbitMQ interop, Qpid Proton interop.
// Helpers outside #[test] functions panic on setup failures by design.
#![allow(clippy::unwrap_used)]

mod coalesce;
mod e2e;
mod model;
mod proton;
mod rabbitmq;
mod raw;
mod raw_peer;
mod settlement;
mod support;
mod timing;
