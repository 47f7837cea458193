//! Issue 41, the delayed-retry fork: a delayed retry schedules its copy and then completes the
//! original; when that completion fails both live on, and each can decide the message's fate.
//! The dead letters decided by a message's history (`RetriesExhausted`, `HandlerPanicked`) are
//! recorded as its inbox row first (a verdict), so the twins end with one outcome: a twin that
//! meets a verdict is dead-lettered too, one that meets a processed row completes as its
//! duplicate, and a resubmitted dead letter takes the verdict over and takes effect once. On
//! SQLite and PostgreSQL.

use std::time::Duration;

use sb_inbox::runtime::{LOGICAL_ID_PROPERTY, RETRY_ATTEMPT_PROPERTY, RetryPolicy};
use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, DuplicateScope, InboxEntry, Message, Outcome, PropertyValue, Runtime, RuntimeConfig,
    Store, StoreTx, Verdict,
};
use sb_inbox_cli::inventory::{CONSUMER, InventoryStore, OrderPlacedConsumer};

use crate::support::handlers::Flaky;
use crate::support::orders::two_line_order;
use crate::support::runtime::config;
use crate::support::{pg_store, sqlite_store};

/// The last delayed retry (attempt 1 of 1) of `m-1`, as the runtime sends it.
fn last_copy() -> Message {
    let mut copy = two_line_order("m-1/retry-1", "o-1");
    let properties = &mut copy.application_properties;
    properties.insert(LOGICAL_ID_PROPERTY.to_owned(), "m-1".into());
    properties.insert(RETRY_ATTEMPT_PROPERTY.to_owned(), PropertyValue::Long(1));
    copy
}

/// Delayed retries, one of them; panics dead-letter on a message's first delivery.
fn retry_config(broker: &MemoryBroker) -> RuntimeConfig {
    let policy = RetryPolicy::new(1, Duration::from_secs(10), Duration::from_secs(30)).unwrap();
    let mut config = config(CONSUMER);
    config.delayed_retry = Some(sb_inbox::runtime::DelayedRetry::new(
        policy,
        broker.clone(),
        "orders",
    ));
    config.max_panics = 1;
    config
}

/// The message's inbox row, read through the port.
async fn entry<S: Store>(store: &S) -> Option<InboxEntry> {
    let mut tx = store.begin().await.unwrap();
    let entry = tx.inbox_entry(CONSUMER, "m-1").await.unwrap();
    tx.rollback().await.unwrap();
    entry
}

/// The fork with the copy deciding first: the last copy fails (retries spent, dead-lettered
/// `RetriesExhausted` with its verdict recorded), then the original, whose completion failed
/// after it scheduled that copy, comes back and would succeed: it meets the verdict and is
/// dead-lettered too, nothing reserved. Then an operator resubmits the dead letters: the first
/// takes the verdict over and takes effect, the second is its duplicate.
async fn the_copy_decides_first<S>(store: S)
where
    S: InventoryStore + Clone,
    OrderPlacedConsumer: sb_inbox::Handler<S::Tx>,
{
    let broker = MemoryBroker::new(Clock::new());
    let handler = Flaky::new(OrderPlacedConsumer::new(), 1);
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        handler,
        retry_config(&broker),
    );
    broker.send(last_copy());
    broker.send(two_line_order("m-1", "o-1"));

    let copy = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(
        copy.outcome,
        Outcome::Permanent(sb_inbox::DeadLetterReason::RetriesExhausted)
    );
    let verdict = Verdict {
        reason: "RetriesExhausted".to_owned(),
        resubmission: 0,
    };
    assert_eq!(entry(&store).await, Some(InboxEntry::DeadLettered(verdict)));
    let original = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(
        original.outcome,
        Outcome::Permanent(sb_inbox::DeadLetterReason::RetriesExhausted),
        "the twin meets the verdict: {original:?}"
    );
    let dead = broker.dead_letters();
    assert_eq!(dead.len(), 2, "{dead:#?}");
    assert!(
        dead[1].description.contains("twin"),
        "{}",
        dead[1].description
    );
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 1));

    // `dlq resubmit`: the resubmission takes the verdict over and takes effect once.
    for dead in &dead {
        broker.send(sb_inbox::servicebus::resubmission(&dead.message).unwrap());
    }
    let first = runtime.process(broker.try_receive().unwrap()).await;
    let second = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(
        (first.outcome, second.outcome),
        (
            Outcome::Processed,
            Outcome::Duplicate(DuplicateScope::Inbox)
        )
    );
    assert_eq!(entry(&store).await, Some(InboxEntry::Processed));
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (1, 1));
    assert_eq!(broker.dead_letters().len(), 2);
}

/// Panics on the broker message `m-1/retry-1`, as a handler written with `unwrap` does.
#[derive(Debug)]
struct PanicsOnCopy<H> {
    inner: H,
}

crate::support::handlers::wrapper_handler!(PanicsOnCopy, inner, |self, ctx, tx| {
    if ctx.message.message_id.as_deref() == Some("m-1/retry-1") {
        panic!("injected panic on the copy");
    }
    self.inner.handle(ctx, tx).await
});

/// `HandlerPanicked` asks the inbox too: the copy panics out (`max_panics` 1) and its verdict
/// is recorded; the original, back after its completion failed, meets it and is dead-lettered
/// `HandlerPanicked` as well. Before, the panic's dead letter asked nothing and the original
/// was processed: both outcomes (issue 41's seeds 3582, 3838, 9350).
async fn the_copy_panics_out_first<S>(store: S)
where
    S: InventoryStore + Clone,
    OrderPlacedConsumer: sb_inbox::Handler<S::Tx>,
{
    let broker = MemoryBroker::new(Clock::new());
    let handler = PanicsOnCopy {
        inner: OrderPlacedConsumer::new(),
    };
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        handler,
        retry_config(&broker),
    );
    broker.send(last_copy());
    broker.send(two_line_order("m-1", "o-1"));
    let panicked = Outcome::Permanent(sb_inbox::DeadLetterReason::HandlerPanicked);
    let copy = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(copy.outcome, panicked);
    let original = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(original.outcome, panicked, "{original:?}");
    let verdict = Verdict {
        reason: "HandlerPanicked".to_owned(),
        resubmission: 0,
    };
    assert_eq!(entry(&store).await, Some(InboxEntry::DeadLettered(verdict)));
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 1));
    assert_eq!(broker.dead_letters().len(), 2);
}

/// Decodes as `inner` does, but panics while `on` is set: an upcaster or decoder whose panic
/// depends on more than the body (a lookup that fails for a while, a cache that is cold).
#[derive(Debug)]
struct DecoderPanicsWhile<H> {
    inner: H,
    on: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<T: sb_inbox::Tx, H: sb_inbox::Handler<T>> sb_inbox::Handler<T> for DecoderPanicsWhile<H> {
    type Payload = H::Payload;

    fn contracts(&self) -> &[sb_inbox::Contract] {
        self.inner.contracts()
    }

    // The panic is the test's: user code that panics while decoding.
    #[allow(clippy::panic_in_result_fn)]
    fn decode(
        &self,
        contract: &sb_inbox::Contract,
        body: &[u8],
    ) -> Result<H::Payload, sb_inbox::DecodeError> {
        if self.on.load(std::sync::atomic::Ordering::Acquire) {
            panic!("injected panic in the decoder");
        }
        self.inner.decode(contract, body)
    }

    async fn handle(
        &self,
        ctx: &sb_inbox::Context<'_, H::Payload>,
        tx: &mut T,
    ) -> Result<sb_inbox::Handled, sb_inbox::HandlerError> {
        self.inner.handle(ctx, tx).await
    }
}

/// A decoder's panic counted out is a verdict too: the copy's decoding panics (one panic
/// dead-letters) and it is dead-lettered `HandlerPanicked` with its verdict recorded; the
/// original, back after its completion failed, decodes and meets the verdict: dead-lettered as
/// well. Before, a panic before the envelope's logical id was handed on dead-lettered without a
/// verdict and the original was processed: both outcomes for one message (issue 41, item 4).
async fn the_copy_panics_out_in_its_decoder_first<S>(store: S)
where
    S: InventoryStore + Clone,
    OrderPlacedConsumer: sb_inbox::Handler<S::Tx>,
{
    use std::sync::atomic::Ordering;
    let broker = MemoryBroker::new(Clock::new());
    let on = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let handler = DecoderPanicsWhile {
        inner: OrderPlacedConsumer::new(),
        on: on.clone(),
    };
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        handler,
        retry_config(&broker),
    );
    broker.send(last_copy());
    broker.send(two_line_order("m-1", "o-1"));
    let panicked = Outcome::Permanent(sb_inbox::DeadLetterReason::HandlerPanicked);
    let copy = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(copy.outcome, panicked);
    on.store(false, Ordering::Release);
    let original = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(original.outcome, panicked, "{original:?}");
    let verdict = Verdict {
        reason: "HandlerPanicked".to_owned(),
        resubmission: 0,
    };
    assert_eq!(entry(&store).await, Some(InboxEntry::DeadLettered(verdict)));
    let counts = store.inventory_counts().await.unwrap();
    assert_eq!((counts.reservations, counts.inbox_rows), (0, 1));
    assert_eq!(broker.dead_letters().len(), 2);
}

/// The fork with the original deciding first: it is processed; the last copy then meets the
/// processed row and completes as its duplicate, nothing dead-lettered.
async fn the_original_decides_first<S>(store: S)
where
    S: InventoryStore + Clone,
    OrderPlacedConsumer: sb_inbox::Handler<S::Tx>,
{
    let broker = MemoryBroker::new(Clock::new());
    let runtime = Runtime::new(
        broker.receiver(),
        store.clone(),
        OrderPlacedConsumer::new(),
        retry_config(&broker),
    );
    broker.send(two_line_order("m-1", "o-1"));
    broker.send(last_copy());
    let original = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(original.outcome, Outcome::Processed);
    let copy = runtime.process(broker.try_receive().unwrap()).await;
    assert_eq!(copy.outcome, Outcome::Duplicate(DuplicateScope::Inbox));
    assert!(broker.dead_letters().is_empty());
    assert_eq!(entry(&store).await, Some(InboxEntry::Processed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_meets_the_verdict_and_a_resubmission_takes_it_over_sqlite() {
    the_copy_decides_first(sqlite_store("verdict_copy_first", 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_meets_the_verdict_and_a_resubmission_takes_it_over_postgres() {
    the_copy_decides_first(pg_store("rt_verdict_copy_first", 2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_after_the_processed_one_completes_as_its_duplicate_sqlite() {
    the_original_decides_first(sqlite_store("verdict_original_first", 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_twin_after_the_processed_one_completes_as_its_duplicate_postgres() {
    the_original_decides_first(pg_store("rt_verdict_original_first", 2).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_out_copy_decides_its_twin_too_sqlite() {
    the_copy_panics_out_first(sqlite_store("verdict_panicked", 1).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_panicked_out_in_its_decoder_decides_its_twin_too_sqlite() {
    the_copy_panics_out_in_its_decoder_first(sqlite_store("verdict_decoder_panicked", 1).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_panicked_out_in_its_decoder_decides_its_twin_too_postgres() {
    the_copy_panics_out_in_its_decoder_first(pg_store("rt_verdict_decoder_panicked", 2).await)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicked_out_copy_decides_its_twin_too_postgres() {
    the_copy_panics_out_first(pg_store("rt_verdict_panicked", 2).await).await;
}
