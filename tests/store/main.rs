//! Store tests: one conformance suite run unchanged against each store, and the
//! classification of real provider errors.

#[path = "../support.rs"]
mod support;

mod conformance;
mod postgres_errors;
mod sqlite_errors;
