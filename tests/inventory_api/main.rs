//! The reference consumer (`crates/cli/src/inventory`) is written on the library's public API only, as a
//! user writes theirs (docs/architecture.md), and this test binary enforces it twice:
//!
//! - **It compiles here, outside both crates.** Its sources (`crates/cli/src/inventory`, in the
//!   application crate) are compiled as this crate's `inventory` module, against `sb_inbox` as
//!   a dependent sees it and nothing of the application: a path into a `pub(crate)` item, a
//!   private module, the application's `ops`/`demo`, or a method added to a library type fails
//!   to compile.
//! - **`layering`** reads the sources and names every `sb_inbox::` path whose first segment the
//!   library's API does not export (read from `src/lib.rs`), with a clearer message than the
//!   compiler's; a test shows that the check fails when it should.

use sb_inbox::{Handler, SqliteTx};

/// The reference consumer's sources, compiled against the public API. Its items are public
/// in the library; nothing here uses them all.
#[path = "../../crates/cli/src/inventory/mod.rs"]
#[allow(dead_code)]
pub mod inventory;

mod layering;

/// The consumer's handler works with the public store types it was compiled against.
#[test]
fn the_consumer_compiles_on_the_public_api() {
    fn is_handler<H: Handler<SqliteTx>>(_: &H) {}
    is_handler(&inventory::OrderPlacedConsumer::new());
    // `sb-inbox run` hosts the router: it builds, and is a handler, on the public API too.
    let router = inventory::router::<SqliteTx>(Some("events")).expect("the routes do not overlap");
    is_handler(&router);
}
