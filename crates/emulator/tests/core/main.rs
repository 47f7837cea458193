//! Broker core integration tests.
