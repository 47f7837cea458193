//! [`ContextBuilder`]: the [`Context`] the runtime would hand a handler, built in a test.

use crate::ports::{Message, Tx};
use crate::runtime::{
    ConsumerName, Context, Contract, ContractParseError, DeadLetterReason, Handled, Handler,
    HandlerError, Rejection,
};

/// Builds the [`Context`] a handler sees for one message, without a broker or a runtime, so a
/// handler can be unit-tested with a [`super::RecordingTx`] (or a real store's transaction).
///
/// The contract and the logical id are read from the message as the runtime reads them (the
/// subject `name.vN`; the `sb-inbox-logical-id` property, else the message id), so a message
/// the runtime would dead-letter before the handler fails [`ContextBuilder::handle`] with the
/// same reason.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use sb_inbox::testing::{ContextBuilder, RecordingTx};
/// use sb_inbox::{Context, Handled, HandlerError, Json, JsonContract, JsonHandler, Message, Tx};
///
/// #[derive(serde::Deserialize)]
/// struct OrderPlaced {
///     order: String,
/// }
/// impl JsonContract for OrderPlaced {
///     const NAME: &'static str = "orders.order-placed";
///     const VERSION: u32 = 1;
/// }
///
/// struct Orders;
/// impl<T: Tx> JsonHandler<T> for Orders {
///     type Message = OrderPlaced;
///     async fn handle(
///         &self,
///         ctx: &Context<'_, OrderPlaced>,
///         order: &OrderPlaced,
///         tx: &mut T,
///     ) -> Result<Handled, HandlerError> {
///         let key = format!("order:{}", order.order);
///         tx.claim_business_key(ctx.consumer.as_str(), &key, ctx.logical_id()).await?;
///         Ok(Handled::Processed)
///     }
/// }
///
/// let message = Message::new("m-1", "orders.order-placed.v1", r#"{"order":"o-1"}"#);
/// let builder = ContextBuilder::new("shop.orders", message)?.delivery_count(2);
/// let mut tx = RecordingTx::new();
/// assert_eq!(builder.handle(&Json::new(Orders), &mut tx).await?, Handled::Processed);
/// assert_eq!(tx.business_keys(), ["order:o-1"]);
///
/// // Or build the context and call the handler's own method.
/// let ctx = builder.build(OrderPlaced { order: "o-2".into() });
/// assert_eq!((ctx.logical_id(), ctx.delivery_count), ("m-1", 2));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ContextBuilder {
    consumer: ConsumerName,
    message: Message,
    contract: Contract,
    logical_id: String,
    delivery_count: u32,
}

/// Why a [`ContextBuilder`] cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The consumer name is not one the runtime accepts.
    #[error(transparent)]
    Consumer(#[from] crate::runtime::ConsumerNameError),
    /// The message's subject is not `name.vN`.
    #[error(transparent)]
    Contract(#[from] ContractParseError),
    /// The runtime would dead-letter this message before the handler (no usable id, no
    /// subject).
    #[error("{0}")]
    Rejected(Rejection),
}

impl ContextBuilder {
    /// The context of `message` for the consumer `consumer`, first delivery.
    ///
    /// # Errors
    /// [`ContextError`] when the consumer name is invalid, or the message has no usable id or
    /// no `name.vN` subject (the runtime would dead-letter it before the handler).
    pub fn new(consumer: &str, message: Message) -> Result<Self, ContextError> {
        let consumer = ConsumerName::new(consumer)?;
        let logical_id = crate::runtime::logical_id(&message)
            .map_err(ContextError::Rejected)?
            .to_owned();
        let subject = message.subject.as_deref().ok_or_else(|| {
            ContextError::Rejected(Rejection::new(
                DeadLetterReason::MissingContract,
                "the message has no subject",
            ))
        })?;
        let contract = subject.parse()?;
        Ok(ContextBuilder {
            consumer,
            message,
            contract,
            logical_id,
            delivery_count: 0,
        })
    }

    /// Earlier deliveries of this message (0 on the first).
    #[must_use]
    pub fn delivery_count(mut self, count: u32) -> Self {
        self.delivery_count = count;
        self
    }

    /// The context with `payload` as the decoded body.
    pub fn build<P>(&self, payload: P) -> Context<'_, P> {
        Context {
            payload,
            message: &self.message,
            logical_id: &self.logical_id,
            consumer: &self.consumer,
            contract: &self.contract,
            headers: &self.message.application_properties,
            delivery_count: self.delivery_count,
        }
    }

    /// Runs `handler` on this message as the runtime would after the inbox insert: refuses a
    /// contract the handler does not accept, decodes the body with [`Handler::decode`], then
    /// calls [`Handler::handle`] with `tx`. Neither commits nor rolls back: the test reads `tx`.
    ///
    /// # Errors
    /// The handler's error; an unaccepted contract or an undecodable body as the permanent
    /// [`HandlerError`] the runtime would dead-letter it with (`UnsupportedContract`,
    /// `InvalidPayload`).
    pub async fn handle<T: Tx, H: Handler<T>>(
        &self,
        handler: &H,
        tx: &mut T,
    ) -> Result<Handled, HandlerError> {
        let contracts = handler.contracts();
        if !contracts.contains(&self.contract) {
            let reason = if contracts.iter().any(|c| c.name() == self.contract.name()) {
                DeadLetterReason::UnsupportedContractVersion
            } else {
                DeadLetterReason::UnsupportedContract
            };
            return Err(HandlerError::rejection(Rejection::new(
                reason,
                format!("no handler accepts {}", self.contract),
            )));
        }
        let payload = handler
            .decode(&self.contract, &self.message.body)
            .map_err(|error| {
                HandlerError::rejection(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    error.to_string(),
                ))
            })?;
        handler.handle(&self.build(payload), tx).await
    }
}
