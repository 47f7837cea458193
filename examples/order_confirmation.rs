//! A handler of your own, and its unit tests without a database: `orders.order-placed.v1` →
//! claim the order (a republished order is a duplicate), then write `orders.order-confirmed.v1`
//! to the outbox in the same transaction.
//!
//! ```sh
//! cargo run --example order_confirmation     # the handler on SQLite and the in-memory broker
//! cargo test --example order_confirmation    # its unit tests: ContextBuilder + RecordingTx
//! ```
//!
//! The handler is generic over [`Tx`], so the tests run it on a [`RecordingTx`] that records
//! what it wrote; production runs it on the store's transaction (`PgTx`, `SqliteTx`, ...).

use sb_inbox::testing::MemoryBroker;
use sb_inbox::{
    Clock, ConsumerName, Context, Handled, HandlerError, Json, JsonContract, JsonHandler, Message,
    OutboxMessage, Outcome, Runtime, RuntimeConfig, SqliteStore, Tx,
};

/// The consumer name: half of the inbox key.
const CONSUMER: &str = "shop.order-confirmation";

/// `orders.order-placed.v1`.
#[derive(Debug, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct OrderPlaced {
    order_id: String,
    email: String,
}

impl JsonContract for OrderPlaced {
    const NAME: &'static str = "orders.order-placed";
    const VERSION: u32 = 1;
}

/// `orders.order-confirmed.v1`, written to the outbox.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct OrderConfirmed<'a> {
    order_id: &'a str,
    email: &'a str,
}

/// Confirms each order once.
#[derive(Debug)]
struct Confirmations {
    /// Where the confirmation goes (a queue or topic).
    destination: String,
}

impl<T: Tx> JsonHandler<T> for Confirmations {
    type Message = OrderPlaced;

    async fn handle(
        &self,
        ctx: &Context<'_, OrderPlaced>,
        order: &OrderPlaced,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        if order.email.is_empty() {
            return Err(HandlerError::rejected("the order has no e-mail address"));
        }
        // A second message for the same order (republished under a new id) meets the key.
        let key = format!("order:{}", order.order_id);
        tx.claim_business_key(ctx.consumer.as_str(), &key, ctx.logical_id())
            .await?;
        let body = serde_json::to_vec(&OrderConfirmed {
            order_id: &order.order_id,
            email: &order.email,
        })?;
        let mut confirmed =
            OutboxMessage::new(self.destination.clone(), "orders.order-confirmed.v1", body);
        // Derived from the logical id: a retry writes the same outgoing id.
        confirmed.message_id = format!("{}:confirmed", ctx.logical_id());
        tx.append_outbox(&confirmed).await?;
        Ok(Handled::Processed)
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let store = SqliteStore::open_in_memory()?;
    store.migrate().await?;
    let broker = MemoryBroker::new(Clock::new());
    let body = r#"{"orderId":"o-1","email":"a@example.com"}"#;
    broker.send_copies(Message::new("m-1", "orders.order-placed.v1", body), 2);
    broker.send(Message::new("m-2", "orders.order-placed.v1", body));
    let handler = Json::new(Confirmations {
        destination: "confirmations".into(),
    });
    let config = RuntimeConfig::new(ConsumerName::new(CONSUMER)?);
    let runtime = Runtime::new(broker.receiver(), store, handler, config);
    while let Some(delivery) = broker.try_receive() {
        let outcome = runtime.process(delivery).await.outcome;
        println!("{outcome:?}");
        if !matches!(outcome, Outcome::Processed | Outcome::Duplicate(_)) {
            return Err(format!("unexpected outcome {outcome:?}").into());
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use sb_inbox::testing::{ContextBuilder, RecordingTx, TxOp};
    use sb_inbox::{DeadLetterReason, DuplicateScope, ErrorKind, StoreError};

    use super::*;

    fn handler() -> Json<Confirmations> {
        Json::new(Confirmations {
            destination: "confirmations".into(),
        })
    }

    fn placed(id: &str, body: &str) -> ContextBuilder {
        let message = Message::new(id, "orders.order-placed.v1", body.to_owned());
        ContextBuilder::new(CONSUMER, message).unwrap()
    }

    const ORDER: &str = r#"{"orderId":"o-1","email":"a@example.com"}"#;

    #[tokio::test]
    async fn an_order_claims_its_key_and_writes_one_confirmation() {
        let mut tx = RecordingTx::new();
        let handled = placed("m-1", ORDER).handle(&handler(), &mut tx).await;
        assert_eq!(handled.unwrap(), Handled::Processed);
        assert_eq!(tx.business_keys(), ["order:o-1"]);
        let [confirmed] = tx.outbox() else {
            panic!("one outbox row expected: {:?}", tx.outbox());
        };
        assert_eq!(confirmed.destination, "confirmations");
        assert_eq!(confirmed.message_id, "m-1:confirmed");
        assert_eq!(
            confirmed.body,
            br#"{"orderId":"o-1","email":"a@example.com"}"#
        );
    }

    #[tokio::test]
    async fn a_republished_order_is_a_duplicate_and_writes_nothing() {
        let mut tx = RecordingTx::new().with_claimed_key(CONSUMER, "order:o-1");
        let error = placed("m-2", ORDER)
            .handle(&handler(), &mut tx)
            .await
            .unwrap_err();
        let HandlerError::Store(error) = error else {
            panic!("a store duplicate expected: {error}");
        };
        assert_eq!(
            error.kind(),
            ErrorKind::Duplicate(DuplicateScope::BusinessKey)
        );
        assert!(tx.outbox().is_empty());
    }

    #[tokio::test]
    async fn a_failing_outbox_write_is_the_stores_error() {
        let deadlock = StoreError::of_kind(ErrorKind::Contention, "deadlock");
        let mut tx = RecordingTx::new().fail_on(TxOp::AppendOutbox, deadlock);
        let error = placed("m-1", ORDER)
            .handle(&handler(), &mut tx)
            .await
            .unwrap_err();
        assert!(error.is_transient(), "{error}");
        assert!(tx.outbox().is_empty());
    }

    #[tokio::test]
    async fn an_order_without_email_is_rejected_and_a_bad_body_is_invalid() {
        let mut tx = RecordingTx::new();
        let no_email = placed("m-1", r#"{"orderId":"o-1","email":""}"#)
            .handle(&handler(), &mut tx)
            .await
            .unwrap_err();
        assert!(no_email.is_permanent(), "{no_email}");
        assert!(tx.business_keys().is_empty());
        let garbled = placed("m-1", "{nope")
            .handle(&handler(), &mut tx)
            .await
            .unwrap_err();
        assert!(
            matches!(&garbled, HandlerError::Permanent { rejection, .. }
                if rejection.reason == DeadLetterReason::InvalidPayload),
            "{garbled}"
        );
    }
}
