//! The allocation bounds for untrusted AMQP bytes reach a dependent. Cargo ignores `[patch]`
//! outside the root manifest, so a bound carried by a patched `serde_amqp` would protect our
//! workspace and not this crate: here `serde_amqp` is the crates.io release, unpatched, and the
//! bound has to come from `sb-amqp`'s own check in front of it.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Records the largest single allocation, so the test sees a wire-claimed length being
/// allocated even when the allocation itself would succeed.
struct Largest;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Largest {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract for `GlobalAlloc::alloc`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System.alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Largest = Largest;

/// Issue 18's fuzz finding: a `sym32` whose length field claims 3,250,700,737 bytes, in six
/// bytes. Upstream `serde_amqp` 0.18 allocates the claim before reading it.
#[test]
fn six_bytes_claiming_three_gigabytes_are_refused_without_allocating_the_claim() {
    let six = [0xb3, 0xc1, 0xc1, 0xc1, 0xc1, 0xc1];
    LARGEST.store(0, Ordering::Relaxed);
    let decoded = sb_amqp::decode_message(&six);
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        matches!(decoded, Err(sb_amqp::Error::Decode(_))),
        "{decoded:?}"
    );
    assert!(
        largest < 1 << 20,
        "the decoder allocated {largest} bytes for a 6-byte input"
    );
}

/// What the test above runs against: the `serde_amqp` this crate resolves is the registry's,
/// not a path or a patch (`cargo tree` prints a local source in parentheses).
#[test]
fn serde_amqp_is_the_registry_release_with_no_patch_in_between() {
    let tree = common::cargo_tree(&["-i", "serde_amqp", "--depth", "0"]);
    let line = tree.lines().next().unwrap_or_default();
    assert!(line.starts_with("serde_amqp v0.18"), "{tree}");
    assert!(
        !line.contains('('),
        "serde_amqp comes from a local path: {tree}"
    );
}
