//! Process-unique names for containers and links.

use std::sync::atomic::{AtomicU64, Ordering};

/// A process-unique name with a prefix (for link names and container ids).
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}-{:x}-{:x}-{}",
        std::process::id(),
        t & 0xffff_ffff,
        N.fetch_add(1, Ordering::Relaxed)
    )
}
