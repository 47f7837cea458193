//! [`ContextBuilder`]: the [`Context`] the runtime would hand a handler, built in a test.

use crate::envelope::{EnvelopeReader, Headers};
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
    // What the handler decodes and sees as headers: the message's own, or what its envelope
    // holds (MassTransit's `message` and `headers`, say).
    body: Vec<u8>,
    headers: Headers,
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
            body: message.body.to_vec(),
            headers: message.application_properties.clone(),
            message,
            contract,
            logical_id,
            delivery_count: 0,
        })
    }

    /// The context of `message` opened with `envelope` exactly as the runtime opens it: the
    /// contract from the envelope's type (through its [`TypeMap`](crate::envelope::TypeMap)),
    /// the logical id from the envelope's own id (MassTransit `messageId`,
    /// `NServiceBus.MessageId`, the CloudEvent's id) unless the message carries the
    /// `sb-inbox-logical-id` property, the envelope's payload as the body the handler decodes
    /// and its headers as [`Context::headers`]. For a MassTransit, NServiceBus or CloudEvents
    /// fixture, so a test sees what the handler will: `caused_by(ctx)`, the envelope headers.
    ///
    /// # Errors
    /// [`ContextError`] when the consumer name is invalid, or [`ContextError::Rejected`] with
    /// the reason the runtime would dead-letter the message with (an unmapped type, a
    /// malformed envelope, no usable id).
    ///
    /// # Examples
    /// ```
    /// use sb_inbox::envelope::{MASSTRANSIT_CONTENT_TYPE, MassTransit, TypeMap};
    /// use sb_inbox::testing::ContextBuilder;
    /// use sb_inbox::{Contract, Message};
    ///
    /// let reader = MassTransit::new(
    ///     TypeMap::new().with("urn:message:Shop.Contracts:OrderPlaced", "orders.order-placed.v1")?,
    /// )?;
    /// let fixture = Message::new(
    ///     "broker-1",
    ///     "",
    ///     r#"{"messageId":"mt-1","conversationId":"c-1","messageType":["urn:message:Shop.Contracts:OrderPlaced"],"message":{"orderId":"o-1"}}"#,
    /// )
    /// .with_content_type(MASSTRANSIT_CONTENT_TYPE);
    /// let builder = ContextBuilder::with_envelope("shop.orders", fixture, &reader)?;
    /// let ctx = builder.build(());
    /// assert_eq!(ctx.logical_id(), "mt-1");
    /// assert_eq!(*ctx.contract, Contract::new("orders.order-placed", 1));
    /// assert_eq!(builder.body(), br#"{"orderId":"o-1"}"#);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_envelope(
        consumer: &str,
        message: Message,
        envelope: &dyn EnvelopeReader,
    ) -> Result<Self, ContextError> {
        let consumer = ConsumerName::new(consumer)?;
        let opened = crate::envelope::open(&message, envelope).map_err(ContextError::Rejected)?;
        let (logical_id, contract) = (opened.logical_id, opened.contract);
        let (body, headers) = (opened.body.into_owned(), opened.headers.into_owned());
        Ok(ContextBuilder {
            consumer,
            message,
            contract,
            logical_id,
            body,
            headers,
            delivery_count: 0,
        })
    }

    /// The bytes the handler decodes: the message body, or the envelope's payload.
    pub fn body(&self) -> &[u8] {
        &self.body
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
            headers: &self.headers,
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
            .decode(&self.contract, &self.body)
            .map_err(|error| {
                HandlerError::rejection(Rejection::new(
                    DeadLetterReason::InvalidPayload,
                    error.to_string(),
                ))
            })?;
        handler.handle(&self.build(payload), tx).await
    }
}
