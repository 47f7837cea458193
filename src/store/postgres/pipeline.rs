//! Pipelining: several statements on one connection in one round trip.
//!
//! `tokio-postgres` sends a request when its future is first polled and reads the answers in
//! order, so futures polled together go out in one write and come back in one wait. Polling
//! them in a fixed order puts them on the wire in that order (`tokio::join!` may rotate which
//! future it polls first; this does not).
//!
//! Each request ends with a `Sync`, so the server runs them one by one: when one fails inside a
//! transaction block, PostgreSQL aborts the transaction and answers every later one with 25P02
//! (`in_failed_sql_transaction`) without running it. The first failure in order is the error
//! that counts ([`super::PgTx`] keeps it); the later answers say only that they were refused.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

/// Polls every future in the order given until all are done; their outputs in that order.
pub(crate) async fn in_order<F: Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        if done { Poll::Ready(()) } else { Poll::Pending }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each future records when it is first polled; the order must be the order given, every
    /// time, and the outputs come back in that order too.
    #[tokio::test]
    async fn first_polls_follow_the_given_order() {
        let log = std::sync::Mutex::new(Vec::new());
        let futures = (0..5).map(|i| {
            let log = &log;
            async move {
                log.lock().unwrap().push(i);
                // Pending once, so completion order is not the argument order by accident.
                tokio::task::yield_now().await;
                i * 10
            }
        });
        assert_eq!(in_order(futures).await, [0, 10, 20, 30, 40]);
        assert_eq!(*log.lock().unwrap(), [0, 1, 2, 3, 4]);
    }
}
