//! Bounded metric label values.
//!
//! A label value that comes from a message (a producer name) is attacker- or bug-controlled:
//! left alone it could create one time series per message. [`LabelSet`] admits at most a fixed
//! number of distinct, well-formed values and maps the rest to [`OTHER`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use super::names::value::OTHER;

/// The longest label value admitted, in bytes.
pub const MAX_LABEL_LEN: usize = 64;

/// Admits up to `capacity` distinct label values; cheap to clone (shared).
///
/// # Examples
/// ```
/// use sb_inbox::telemetry::cardinality::LabelSet;
/// let producers = LabelSet::new(1);
/// assert_eq!(producers.admit("checkout"), "checkout");
/// assert_eq!(producers.admit("billing"), "_other");
/// assert_eq!(producers.admit("checkout"), "checkout");
/// assert_eq!(producers.admit("no spaces please"), "_other");
/// ```
#[derive(Debug, Clone)]
pub struct LabelSet {
    capacity: usize,
    seen: Arc<Mutex<HashSet<String>>>,
}

impl LabelSet {
    /// A set admitting `capacity` distinct values.
    pub fn new(capacity: usize) -> Self {
        LabelSet {
            capacity,
            seen: Arc::default(),
        }
    }

    /// `value` when it is well formed (`[A-Za-z0-9._:/-]`, at most [`MAX_LABEL_LEN`] bytes) and
    /// already admitted or the set has room; otherwise [`OTHER`].
    pub fn admit(&self, value: &str) -> String {
        let well_formed = !value.is_empty()
            && value.len() <= MAX_LABEL_LEN
            && value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
        if !well_formed {
            return OTHER.to_owned();
        }
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if seen.contains(value) {
            return value.to_owned();
        }
        if seen.len() < self.capacity {
            seen.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_more_than_capacity_distinct_values() {
        let set = LabelSet::new(8);
        let distinct: HashSet<String> = (0..1000).map(|i| set.admit(&format!("p-{i}"))).collect();
        // Eight admitted values plus the overflow bucket.
        assert_eq!(distinct.len(), 9);
        assert!(distinct.contains(OTHER));
    }

    #[test]
    fn rejects_long_and_odd_values() {
        let set = LabelSet::new(8);
        assert_eq!(set.admit(&"a".repeat(MAX_LABEL_LEN + 1)), OTHER);
        assert_eq!(set.admit("line\nbreak"), OTHER);
        assert_eq!(set.admit(""), OTHER);
        assert_eq!(set.admit("svc.orders-api/v2"), "svc.orders-api/v2");
    }
}
