//! Typed JSON handlers: a message type names its contract ([`JsonContract`]), a handler takes
//! the decoded value ([`JsonHandler`]), and [`Json`] turns it into a [`Handler`] with the
//! envelope check, decoding and validation done once, here.

use std::future::Future;
use std::sync::OnceLock;

use serde::de::DeserializeOwned;

use super::{Context, Contract, DecodeError, Handled, Handler, HandlerError};
use crate::ports::Tx;

/// A message body in JSON under one contract: `NAME.vVERSION` in the subject.
///
/// # Examples
/// ```
/// use sb_inbox::{DecodeError, JsonContract};
///
/// #[derive(serde::Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct PaymentCaptured {
///     payment_id: String,
///     amount_cents: i64,
/// }
///
/// impl JsonContract for PaymentCaptured {
///     const NAME: &'static str = "payments.payment-captured";
///     const VERSION: u32 = 1;
///
///     fn validate(&self) -> Result<(), DecodeError> {
///         if self.payment_id.is_empty() || self.amount_cents <= 0 {
///             return Err(DecodeError::new("paymentId must be set, amountCents positive"));
///         }
///         Ok(())
///     }
/// }
///
/// let ok = sb_inbox::runtime::decode_json::<PaymentCaptured>(br#"{"paymentId":"p-1","amountCents":500}"#);
/// assert_eq!(ok.map(|p| p.amount_cents), Ok(500));
/// let bad = sb_inbox::runtime::decode_json::<PaymentCaptured>(br#"{"paymentId":"p-1","amountCents":0}"#);
/// assert!(bad.is_err());
/// // Tolerant: a field added by a newer producer is ignored.
/// let newer = br#"{"paymentId":"p-1","amountCents":500,"currency":"EUR"}"#;
/// assert!(sb_inbox::runtime::decode_json::<PaymentCaptured>(newer).is_ok());
/// ```
///
/// # Tolerant by default, strict by choice
/// Fields the type does not know are ignored (serde's default): a producer that adds a field
/// does not turn every message into `InvalidPayload` at consumers not yet updated. Do not put
/// `#[serde(deny_unknown_fields)]` on contract types; a contract that must refuse unknown fields
/// (a command whose every field has to be understood) sets [`JsonContract::STRICT`]: an unknown
/// field is then `InvalidPayload`, described by its path (`lines.0.discount`), never its value.
pub trait JsonContract: DeserializeOwned + Send + Sync + 'static {
    /// The contract name: the subject without its `.vN` suffix (`orders.order-placed`).
    const NAME: &'static str;
    /// The contract version accepted; other versions are dead-lettered before any database
    /// work (`UnsupportedContractVersion`).
    const VERSION: u32;
    /// Refuse bodies with fields this type does not know (`InvalidPayload` naming the first
    /// one's path). `false`, the default, ignores them: see "Tolerant by default" above.
    const STRICT: bool = false;

    /// Rules beyond the JSON shape (lengths, ranges, non-empty lists). The default accepts
    /// everything that parses.
    ///
    /// # Errors
    /// [`DecodeError`] naming the broken rule (never quoting values): the message is
    /// dead-lettered with reason `InvalidPayload`.
    fn validate(&self) -> Result<(), DecodeError> {
        Ok(())
    }

    /// `NAME` and `VERSION` as a [`Contract`].
    fn contract() -> Contract {
        Contract::new(Self::NAME, Self::VERSION)
    }
}

/// Decodes a JSON body as `M` and validates it; the error describes the failure by category
/// and position only (never the payload).
///
/// # Errors
/// [`DecodeError`] for malformed JSON, a shape that does not match `M`, or a broken rule of
/// [`JsonContract::validate`].
pub fn decode_json<M: JsonContract>(body: &[u8]) -> Result<M, DecodeError> {
    let message: M = if M::STRICT {
        strict(body)?
    } else {
        serde_json::from_slice(body).map_err(|e| DecodeError::json(&e))?
    };
    message.validate()?;
    Ok(message)
}

/// Decodes `body` as `M`, refusing the first field `M` does not know by its path (the path
/// holds field names and indexes from the body, never values).
fn strict<M: JsonContract>(body: &[u8]) -> Result<M, DecodeError> {
    let mut unknown: Option<String> = None;
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let message: M = serde_ignored::deserialize(&mut deserializer, |path| {
        unknown.get_or_insert_with(|| path.to_string());
    })
    .map_err(|e| DecodeError::json(&e))?;
    deserializer.end().map_err(|e| DecodeError::json(&e))?;
    match unknown {
        Some(path) => Err(DecodeError::new(format!(
            "unknown field {path}: contract {} is strict",
            M::contract()
        ))),
        None => Ok(message),
    }
}

/// A handler of one JSON contract: it receives the decoded message; envelope checks, decoding
/// and `InvalidPayload` dead-lettering are done by [`Json`].
///
/// # Examples
/// ```
/// use sb_inbox::{Context, Handled, HandlerError, Json, JsonContract, JsonHandler, Tx};
///
/// #[derive(serde::Deserialize)]
/// #[serde(rename_all = "camelCase")]
/// struct OrderPlaced {
///     order_id: String,
/// }
///
/// impl JsonContract for OrderPlaced {
///     const NAME: &'static str = "orders.order-placed";
///     const VERSION: u32 = 1;
/// }
///
/// struct Orders;
///
/// impl<T: Tx> JsonHandler<T> for Orders {
///     type Message = OrderPlaced;
///
///     async fn handle(
///         &self,
///         ctx: &Context<'_, OrderPlaced>,
///         order: &OrderPlaced,
///         tx: &mut T,
///     ) -> Result<Handled, HandlerError> {
///         // One order, one effect, even when the producer republishes it under a new id.
///         let key = format!("order:{}", order.order_id);
///         tx.claim_business_key(ctx.consumer.as_str(), &key, ctx.logical_id()).await?;
///         Ok(Handled::Processed)
///     }
/// }
///
/// // A `Handler` for any store: give it to `Runtime::new` or `Worker::consumer`.
/// let handler = Json::new(Orders);
/// # let _ = handler;
/// ```
pub trait JsonHandler<T: Tx>: Send + Sync + 'static {
    /// The message type and its contract.
    type Message: JsonContract;

    /// Applies the business change in the runtime's transaction (the inbox row is already
    /// inserted in it). `message` is `ctx.payload`, the one decoded body, passed on its own for
    /// brevity: use either.
    ///
    /// # Errors
    /// [`HandlerError`], classified into duplicate, transient or permanent outcomes.
    fn handle(
        &self,
        ctx: &Context<'_, Self::Message>,
        message: &Self::Message,
        tx: &mut T,
    ) -> impl Future<Output = Result<Handled, HandlerError>> + Send;
}

/// A [`JsonHandler`] as a [`Handler`]: accepts exactly its message's contract, decodes with
/// [`decode_json`].
#[derive(Debug)]
pub struct Json<H> {
    handler: H,
    // Known only where the store's transaction type is: filled on first use.
    contracts: OnceLock<[Contract; 1]>,
}

impl<H> Json<H> {
    /// Wraps `handler`.
    pub fn new(handler: H) -> Self {
        Json {
            handler,
            contracts: OnceLock::new(),
        }
    }

    /// The wrapped handler.
    pub fn inner(&self) -> &H {
        &self.handler
    }
}

impl<T: Tx, H: JsonHandler<T>> Handler<T> for Json<H> {
    type Payload = H::Message;

    fn contracts(&self) -> &[Contract] {
        self.contracts.get_or_init(|| [H::Message::contract()])
    }

    fn decode(&self, _contract: &Contract, body: &[u8]) -> Result<H::Message, DecodeError> {
        decode_json(body)
    }

    async fn handle(
        &self,
        ctx: &Context<'_, H::Message>,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        self.handler.handle(ctx, &ctx.payload, tx).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::envelope::DeadLetterReason;
    use crate::ports::Message;
    use crate::runtime::clock::Clock;
    use crate::runtime::consumer::ConsumerName;
    use crate::runtime::outcome::Outcome;
    use crate::runtime::{Runtime, RuntimeConfig};
    use crate::store::SqliteStore;
    use crate::testing::MemoryBroker;

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Captured {
        payment_id: String,
        amount_cents: i64,
    }

    impl JsonContract for Captured {
        const NAME: &'static str = "payments.payment-captured";
        const VERSION: u32 = 2;

        fn validate(&self) -> Result<(), DecodeError> {
            if self.amount_cents <= 0 {
                return Err(DecodeError::new("amountCents must be positive"));
            }
            Ok(())
        }
    }

    struct Ledger;

    impl<T: Tx> JsonHandler<T> for Ledger {
        type Message = Captured;

        async fn handle(
            &self,
            ctx: &Context<'_, Captured>,
            payment: &Captured,
            tx: &mut T,
        ) -> Result<Handled, HandlerError> {
            assert_eq!(ctx.contract, &Captured::contract());
            tx.claim_business_key(
                ctx.consumer.as_str(),
                &format!("payment:{}", payment.payment_id),
                ctx.logical_id(),
            )
            .await?;
            Ok(Handled::Processed)
        }
    }

    async fn outcome(subject: &str, body: &str) -> Outcome {
        let store = SqliteStore::open_in_memory().unwrap();
        store.migrate().await.unwrap();
        let broker = MemoryBroker::new(Clock::new());
        broker.send(Message::new("m-1", subject, body.to_owned()));
        let config = RuntimeConfig::new(ConsumerName::new("ledger").unwrap());
        let runtime = Runtime::new(broker.receiver(), store, Json::new(Ledger), config);
        runtime.process(broker.try_receive().unwrap()).await.outcome
    }

    #[tokio::test]
    async fn the_typed_value_reaches_the_handler_and_bad_bodies_are_invalid_payload() {
        let subject = "payments.payment-captured.v2";
        assert_eq!(
            outcome(subject, r#"{"paymentId":"p-1","amountCents":500}"#).await,
            Outcome::Processed
        );
        let invalid = Outcome::Permanent(DeadLetterReason::InvalidPayload);
        // Tolerant: a field the contract does not know is ignored.
        assert_eq!(
            outcome(
                subject,
                r#"{"paymentId":"p-1","amountCents":5,"extra":{"a":[1]}}"#
            )
            .await,
            Outcome::Processed
        );
        for body in [
            "{nope",
            r#"{"paymentId":"p-1"}"#,
            r#"{"paymentId":"p-1","amountCents":-5}"#,
        ] {
            assert_eq!(outcome(subject, body).await, invalid, "{body}");
        }
        assert_eq!(
            outcome(
                "payments.payment-captured.v1",
                r#"{"paymentId":"p-1","amountCents":500}"#
            )
            .await,
            Outcome::Permanent(DeadLetterReason::UnsupportedContractVersion)
        );
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Command {
        order_id: String,
        lines: Vec<Line>,
    }

    #[derive(Debug, serde::Deserialize)]
    struct Line {
        sku: String,
    }

    impl JsonContract for Command {
        const NAME: &'static str = "orders.place-order";
        const VERSION: u32 = 1;
        const STRICT: bool = true;
    }

    #[test]
    fn a_strict_contract_refuses_unknown_fields_by_path_never_by_value() {
        let ok = decode_json::<Command>(br#"{"orderId":"o-1","lines":[{"sku":"A"}]}"#).unwrap();
        assert_eq!(
            (ok.order_id.as_str(), ok.lines[0].sku.as_str()),
            ("o-1", "A")
        );

        let top = decode_json::<Command>(br#"{"orderId":"o-1","lines":[],"secret":"s3cr3t"}"#)
            .unwrap_err()
            .to_string();
        assert!(top.contains("unknown field secret"), "{top}");
        assert!(!top.contains("s3cr3t"), "{top}");

        let nested = br#"{"orderId":"o-1","lines":[{"sku":"A"},{"sku":"B","discount":"50%"}]}"#;
        let nested = decode_json::<Command>(nested).unwrap_err().to_string();
        assert!(
            nested.contains("unknown field lines.1.discount"),
            "{nested}"
        );
        assert!(!nested.contains("50%"), "{nested}");

        // Strict still reports malformed JSON and trailing garbage as such.
        assert!(decode_json::<Command>(br#"{"orderId":"o-1","lines":[]} x"#).is_err());
        assert!(decode_json::<Command>(br#"{"orderId":1,"lines":[]}"#).is_err());
    }
}
