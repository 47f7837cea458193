//! `sb-inbox migrate` waits out a database that is not there yet, as the worker's store open
//! does (`sb_inbox::worker`'s `open::until_open`: [`Backoff`] from 1 s doubling to 30 s), but
//! bounded: a job must end. Only errors the store classifies as the database being unavailable
//! ([`ErrorKind::Unavailable`]: fail-over, a serverless database resuming from auto-pause, error
//! 40613; throttling) are retried. A refused or broken connection (a wrong host or port, a
//! firewall) and a wrong credential, a missing grant or a broken migration fail at once: waiting
//! does not change them, and the migrate job's own retries (`replicaRetryLimit`) cover a
//! connection lost mid-run.

use std::future::Future;
use std::time::Duration;

use sb_inbox::runtime::Backoff;
use sb_inbox::{ErrorKind, StoreError};

/// The first retry waits about a second, later ones at most 30 s: the worker's values.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts.
pub const MAX_DELAY: Duration = Duration::from_secs(30);
/// Attempts `sb-inbox migrate` makes: about five minutes of waiting with [`FIRST_DELAY`] and
/// [`MAX_DELAY`], longer than a serverless database takes to resume.
pub const MIGRATE_ATTEMPTS: u32 = 14;

/// Whether `error` may pass by waiting: the database is unavailable.
pub fn is_retryable(error: &StoreError) -> bool {
    error.kind() == ErrorKind::Unavailable
}

/// Calls `attempt` until it succeeds, fails with an error [`is_retryable`] refuses, or has
/// failed `attempts` times; waits `backoff`'s next delay between tries, telling `on_retry`
/// the error and the wait.
///
/// # Errors
/// The last error of `attempt`.
pub async fn until_available<T, F, Fut>(
    attempts: u32,
    mut backoff: Backoff,
    mut attempt: F,
    mut on_retry: impl FnMut(&StoreError, Duration),
) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut made = 0;
    loop {
        made += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if made < attempts && is_retryable(&error) => {
                let delay = backoff.next_delay();
                on_retry(&error, delay);
                tokio::time::sleep(delay).await;
            }
            Err(error) => return Err(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn unavailable() -> StoreError {
        StoreError::of_kind(
            ErrorKind::Unavailable,
            "40613: database not currently available",
        )
    }

    #[tokio::test(start_paused = true)]
    async fn retries_unavailable_until_the_database_answers() {
        let calls = Cell::new(0);
        let waits = Cell::new(0);
        let started = tokio::time::Instant::now();
        let result = until_available(
            MIGRATE_ATTEMPTS,
            Backoff::seeded(FIRST_DELAY, MAX_DELAY, 1),
            || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 3 { Err(unavailable()) } else { Ok(n) } }
            },
            |_, _| waits.set(waits.get() + 1),
        )
        .await;
        assert_eq!(result.unwrap(), 3);
        assert_eq!(waits.get(), 2);
        // It waited (virtual time): at least half the first step, then half the second.
        assert!(
            started.elapsed() >= Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_after_the_attempts_with_the_last_error() {
        let calls = Cell::new(0);
        let result: Result<(), StoreError> = until_available(
            4,
            Backoff::seeded(FIRST_DELAY, MAX_DELAY, 1),
            || {
                calls.set(calls.get() + 1);
                async { Err(unavailable()) }
            },
            |_, _| {},
        )
        .await;
        assert_eq!(result.unwrap_err().kind(), ErrorKind::Unavailable);
        assert_eq!(calls.get(), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn does_not_retry_what_waiting_cannot_fix() {
        for error in [
            StoreError::connection("connection refused"),
            StoreError::configuration("bad store URL"),
            StoreError::of_kind(ErrorKind::Schema, "syntax"),
            StoreError::of_kind(ErrorKind::Deployment, "permission denied"),
        ] {
            let calls = Cell::new(0);
            let kind = error.kind();
            let error = Cell::new(Some(error));
            let result: Result<(), StoreError> = until_available(
                MIGRATE_ATTEMPTS,
                Backoff::seeded(FIRST_DELAY, MAX_DELAY, 1),
                || {
                    calls.set(calls.get() + 1);
                    let error = error.take();
                    async move { Err(error.unwrap_or_else(unavailable)) }
                },
                |_, _| {},
            )
            .await;
            assert_eq!(result.unwrap_err().kind(), kind);
            assert_eq!(calls.get(), 1, "{kind:?} is not retried");
        }
    }
}
