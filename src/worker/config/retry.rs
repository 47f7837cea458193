//! `[retry]`: the delayed-retry policy for transient failures (off by default: abandon).

use std::time::Duration;

use serde::Deserialize;

use super::keys::{
    RETRY_BASE_DELAY_SECS, RETRY_JITTER_PERCENT, RETRY_MAX_DELAY_SECS, RETRY_MAX_RETRIES,
};
use super::reader::Reader;
use crate::runtime::{JitterSource, RetryPolicy};

/// The `[retry]` section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RetryFile {
    max_retries: Option<u64>,
    base_delay_secs: Option<u64>,
    max_delay_secs: Option<u64>,
    jitter_percent: Option<u64>,
}

/// The delayed-retry policy, or `None` when `retry.max_retries` is 0 (the default: abandon).
/// `subscription` is a consumed subscription, if any: copies cannot go back to one.
pub(super) fn policy(
    r: &mut Reader<'_>,
    file: &RetryFile,
    subscription: Option<&str>,
) -> Option<RetryPolicy> {
    const DAY: u64 = 86_400;
    let max_retries = r
        .number(RETRY_MAX_RETRIES, file.max_retries, 0..=100)
        .unwrap_or(0);
    let base = r.number(RETRY_BASE_DELAY_SECS, file.base_delay_secs, 1..=7 * DAY);
    let max = r.number(RETRY_MAX_DELAY_SECS, file.max_delay_secs, 1..=7 * DAY);
    let jitter = r.number(RETRY_JITTER_PERCENT, file.jitter_percent, 0..=100);
    if max_retries == 0 {
        return None;
    }
    if subscription.is_some() {
        r.fail(
            RETRY_MAX_RETRIES,
            "delayed retries need a queue: a copy sent to the topic would reach every \
             subscription. Forward the subscription to a queue (ForwardTo) and consume the queue, \
             or set 0 (abandon)",
        );
        return None;
    }
    let (base, max) = (base.unwrap_or(10), max.unwrap_or(600));
    let policy = RetryPolicy::new(
        u32::try_from(max_retries).unwrap_or(u32::MAX),
        Duration::from_secs(base),
        Duration::from_secs(max),
    )
    .and_then(|policy| {
        let fraction = f64::from(u32::try_from(jitter.unwrap_or(20)).unwrap_or(100)) / 100.0;
        policy.with_jitter(fraction, JitterSource::random())
    });
    match policy {
        Ok(policy) => Some(policy),
        Err(_) => {
            r.fail(
                RETRY_MAX_DELAY_SECS,
                format!("{max} s must not be shorter than retry.base_delay_secs {base} s"),
            );
            None
        }
    }
}

/// How much later than its original a delayed-retry copy can come (zero without retries).
pub(super) fn span(policy: Option<&RetryPolicy>) -> Duration {
    policy.map_or(Duration::ZERO, |policy| {
        policy.max_delay().saturating_mul(policy.max_retries())
    })
}
