//! [`WorkerError`]: why a [`super::Worker`] stopped.

use crate::{RuntimeError, StoreError};

/// Why the worker stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The store could not be opened.
    #[error("store: {0}")]
    Store(#[from] StoreError),
    /// The runtime failed (a receiver that cannot go on).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The health endpoints could not be served.
    #[error("health endpoints: {0}")]
    Health(String),
    /// The consumers cannot be hosted as given (none, one name twice, delayed retries on a
    /// subscription).
    #[error("worker: {0}")]
    Config(String),
    /// A consumer's task ended abnormally (a panic in a handler).
    #[error("consumer {0}")]
    Consumer(String),
}
