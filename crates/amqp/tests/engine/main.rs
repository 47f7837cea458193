//! Integration tests for sb-amqp: engine-to-engine, RabbitMQ interop, Qpid Proton interop.

mod e2e;
mod proton;
mod rabbitmq;
mod support;
