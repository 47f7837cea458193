//! The reference consumer (`src/inventory`) is written on the library's public API only, as a
//! user writes theirs (docs/architecture.md), and this test binary enforces it twice:
//!
//! - **It compiles here, outside the crate.** Its sources are this crate's `inventory` module,
//!   where `crate::` means this test crate: the public API of `sb_inbox` and nothing else. A
//!   path into a `pub(crate)` item, a private module, or a method added to a library type
//!   fails to compile. The application's modules (`ops`, `demo`) are public for the binary's
//!   sake but are not API: they are shadowed here by empty modules. (`worker`, the hosting API,
//!   is the library's.)
//! - **`layering`** reads the sources and names every `crate::` path whose first segment the
//!   library's API does not export (read from `src/lib.rs`), with a clearer message than the
//!   compiler's; a test shows that the check fails when it should.

// The library's public API, as a dependent crate sees it.
pub use sb_inbox::*;

/// Not API (the application's modules): `crate::ops::…` in the consumer does not resolve.
pub mod demo {}
/// Not API, as [`demo`].
pub mod ops {}

/// The reference consumer's sources, compiled against the public API. Its items are public
/// in the library; nothing here uses them all.
#[path = "../../src/inventory/mod.rs"]
#[allow(dead_code)]
pub mod inventory;

mod layering;

/// The consumer's handler works with the public store types it was compiled against.
#[test]
fn the_consumer_compiles_on_the_public_api() {
    fn is_handler<H: Handler<SqliteTx>>(_: &H) {}
    is_handler(&inventory::OrderPlacedConsumer::new());
}
