//! [`ManagementRequest`]: the `$management` requests clients sent, so tests can check how a
//! client speaks to the node (which operation, on behalf of which link).

use std::collections::VecDeque;
use std::sync::Mutex;

/// How many requests the log keeps (the oldest go first).
const KEPT: usize = 1_000;

/// One `$management` request as the emulator received it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManagementRequest {
    /// The entity whose node received it, as the client addressed it.
    pub entity: String,
    /// The `operation` application property, e.g. `com.microsoft:renew-lock`.
    pub operation: String,
    /// The `associated-link-name` application property: the receive link the request acts
    /// for, when the client names one.
    pub associated_link: Option<String>,
}

/// The latest requests of every connection, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RequestLog {
    entries: Mutex<VecDeque<ManagementRequest>>,
}

impl RequestLog {
    pub(crate) fn record(&self, request: ManagementRequest) {
        if let Ok(mut entries) = self.entries.lock() {
            if entries.len() == KEPT {
                entries.pop_front();
            }
            entries.push_back(request);
        }
    }

    pub(crate) fn list(&self) -> Vec<ManagementRequest> {
        self.entries
            .lock()
            .map(|entries| entries.iter().cloned().collect())
            .unwrap_or_default()
    }
}
