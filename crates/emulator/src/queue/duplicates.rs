//! Duplicate detection: the message ids a queue or topic saw within its history window.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, SystemTime};

/// Duplicate detection history: message ids seen within the window.
#[derive(Debug, Default)]
pub(crate) struct DupWindow {
    seen: HashMap<String, SystemTime>,
    order: VecDeque<(SystemTime, String)>,
}

impl DupWindow {
    /// Records `id`; returns true when it was already seen within `window`.
    pub(crate) fn is_duplicate(&mut self, id: &str, now: SystemTime, window: Duration) -> bool {
        while let Some((t, old)) = self.order.front() {
            let age = now.duration_since(*t).unwrap_or(Duration::ZERO);
            if age < window {
                break;
            }
            if self.seen.get(old) == Some(t) {
                self.seen.remove(old);
            }
            self.order.pop_front();
        }
        if self.seen.contains_key(id) {
            return true;
        }
        self.seen.insert(id.to_owned(), now);
        self.order.push_back((now, id.to_owned()));
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_window_slides() {
        let t0 = SystemTime::UNIX_EPOCH;
        let w = Duration::from_secs(10);
        let mut d = DupWindow::default();
        assert!(!d.is_duplicate("a", t0, w));
        assert!(d.is_duplicate("a", t0 + Duration::from_secs(9), w));
        assert!(!d.is_duplicate("b", t0 + Duration::from_secs(9), w));
        assert!(!d.is_duplicate("a", t0 + Duration::from_secs(10), w));
        assert!(d.is_duplicate("b", t0 + Duration::from_secs(10), w));
    }
}
