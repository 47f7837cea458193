//! The one panic boundary around everything the runtime calls that users write: the envelope
//! reader, decoding (a router's upcasters, `JsonContract::validate`, custom `Deserialize`
//! impls), and the handler with its middleware. A caught panic is an outcome
//! ([`crate::Outcome::HandlerPanicked`], counted against `max_panics`), in plain, batched and
//! session mode alike. Without it the task's unwinding drops the delivery (released, which the
//! broker does not count as an attempt), so a message that always panics loops forever and is
//! never dead-lettered, a batch goes down with all its members, and in session mode each panic
//! ends a session slot for good.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::pin;
use std::task::Poll;

use crate::envelope;

/// The longest panic message kept (it goes into the abandon's last-error property and the
/// dead letter's description).
const MAX_MESSAGE_LEN: usize = 256;

/// A caught panic, with its message when it had one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Panicked(pub(super) String);

/// Runs `work`, turning a panic in any of its polls into [`Panicked`].
///
/// The future is not used again after it panicked (it is dropped here), so whatever state the
/// panic left it in is never observed; the transaction it borrowed is rolled back by the caller,
/// which is why asserting unwind safety is sound.
pub(super) async fn catch<F: Future>(work: F) -> Result<F::Output, Panicked> {
    let mut work = pin!(work);
    std::future::poll_fn(move |cx| {
        match std::panic::catch_unwind(AssertUnwindSafe(|| work.as_mut().poll(cx))) {
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Ok(Poll::Pending) => Poll::Pending,
            Err(payload) => Poll::Ready(Err(Panicked(message("handler", payload.as_ref())))),
        }
    })
    .await
}

/// Runs `work` (the envelope reader and the body's decoding: user code before any
/// transaction), turning a panic into [`Panicked`]. Nothing `work` touched is used again after
/// a panic but the delivery, which it only reads.
pub(super) fn catch_decoding<T>(work: impl FnOnce() -> T) -> Result<T, Panicked> {
    std::panic::catch_unwind(AssertUnwindSafe(work))
        .map_err(|payload| Panicked(message("decoding", payload.as_ref())))
}

fn message(what: &str, payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    format!(
        "{what} panicked: {}",
        envelope::truncate(&text, MAX_MESSAGE_LEN)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_panic_after_a_pending_poll_is_caught_with_its_message() {
        let caught = catch(async {
            tokio::task::yield_now().await;
            if std::hint::black_box(true) {
                panic!("stock for {} is negative", "sku-1");
            }
            7
        })
        .await;
        assert_eq!(
            caught,
            Err(Panicked(
                "handler panicked: stock for sku-1 is negative".into()
            ))
        );
        assert_eq!(catch(async { 7 }).await, Ok(7));
    }

    /// Unwinds with `payload` (no panic hook runs), as a handler of output `u8` would.
    async fn unwinding(payload: Box<dyn std::any::Any + Send>) -> u8 {
        std::panic::resume_unwind(payload)
    }

    #[tokio::test]
    async fn a_long_or_odd_payload_is_bounded() {
        let long = Box::new("x".repeat(1000));
        let Err(Panicked(text)) = catch(unwinding(long)).await else {
            panic!("the future unwinds")
        };
        assert!(text.len() <= MAX_MESSAGE_LEN + 20, "{}", text.len());
        let Err(Panicked(text)) = catch(unwinding(Box::new(42_u8))).await else {
            panic!("the future unwinds")
        };
        assert_eq!(text, "handler panicked: a panic without a message");
    }

    #[test]
    fn a_panic_while_decoding_is_caught_with_its_message() {
        let caught = catch_decoding(|| -> u8 {
            let lines: Vec<u8> = Vec::new();
            lines[std::hint::black_box(0)]
        });
        let Err(Panicked(text)) = caught else {
            panic!("the closure unwinds")
        };
        assert!(
            text.starts_with("decoding panicked: index out of bounds"),
            "{text}"
        );
        assert_eq!(catch_decoding(|| 7), Ok(7));
    }
}
