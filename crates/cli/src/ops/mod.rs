//! Operator commands behind the CLI: publish test orders (`sb-inbox send`), look at and
//! resubmit dead letters (`sb-inbox dlq peek|resubmit`).
//!
//! # Layout
//! - [`send`]: orders of `orders.order-placed.v1` from a file or generated, stable message
//!   ids, optional duplicates, published through the [`sb_inbox::Sender`] port.
//! - [`dlq`]: describe peeked dead letters; resubmit them with the logical id kept, through the
//!   [`sb_inbox::Receiver`] and [`sb_inbox::Sender`] ports.

pub mod dlq;
pub mod send;

/// Why an operator command failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpsError {
    /// Bad input (a file, an argument): nothing was sent.
    #[error("{0}")]
    Input(String),
    /// The broker failed part way: `done` of `total` went through before it.
    #[error("{error} ({done} of {total} done before the failure)")]
    Partial {
        /// Items completed before the failure.
        done: usize,
        /// Items asked for.
        total: usize,
        /// What failed.
        error: String,
    },
}
