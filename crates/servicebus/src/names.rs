//! The span, attribute, metric and property names the client emits and reads, per the
//! OpenTelemetry semantic conventions for messaging and their Azure Service Bus page
//! (<https://opentelemetry.io/docs/specs/semconv/messaging/azure-messaging/>, "Azure Service
//! Bus"; the metrics from
//! <https://opentelemetry.io/docs/specs/semconv/messaging/messaging-metrics/>).
//!
//! Spans are named `{operation} {entity}` ([`span::name`]); every operation also records
//! [`metric::OPERATION_DURATION`], and a receive that delivered counts
//! [`metric::CONSUMED_MESSAGES`].

/// `messaging.system` of everything the client emits.
pub const SYSTEM: &str = "servicebus";

/// The operation part of span names (and `messaging.operation.name`).
pub mod span {
    /// Client span of one receive call.
    pub const RECEIVE: &str = "receive";
    /// Client span of completing a delivery.
    pub const COMPLETE: &str = "complete";
    /// Client span of abandoning a delivery.
    pub const ABANDON: &str = "abandon";
    /// Client span of dead-lettering a delivery.
    pub const DEAD_LETTER: &str = "dead_letter";
    /// Client span of releasing a delivery (AMQP `released`: no delivery counted).
    pub const RELEASE: &str = "release";
    /// Client span of one lock renewal.
    pub const RENEW_LOCK: &str = "renew_lock";
    /// Producer span of one send.
    pub const SEND: &str = "send";

    /// `{operation} {entity}`.
    pub fn name(operation: &str, entity: &str) -> String {
        format!("{operation} {entity}")
    }
}

/// Attribute names (span attributes and metric labels).
pub mod attr {
    /// `servicebus`.
    pub const MESSAGING_SYSTEM: &str = "messaging.system";
    /// `create`, `send`, `receive`, `process` or `settle`.
    pub const OPERATION_TYPE: &str = "messaging.operation.type";
    /// The Service Bus operation: `receive`, `complete`, `abandon`, `dead_letter`,
    /// `renew_lock`, `send`, …
    pub const OPERATION_NAME: &str = "messaging.operation.name";
    /// Queue or topic name.
    pub const DESTINATION: &str = "messaging.destination.name";
    /// Subscription name (topic subscriptions only).
    pub const SUBSCRIPTION: &str = "messaging.destination.subscription.name";
    /// The message id. Spans only: never a metric label.
    pub const MESSAGE_ID: &str = "messaging.message.id";
    /// The correlation id. Spans only.
    pub const CONVERSATION_ID: &str = "messaging.message.conversation_id";
    /// Deliveries attempted, this one included (the broker's count + 1, as the Azure SDKs
    /// report it).
    pub const DELIVERY_COUNT: &str = "messaging.servicebus.message.delivery_count";
    /// When the broker accepted the message, UTC epoch seconds. Spans only.
    pub const ENQUEUED_TIME: &str = "messaging.servicebus.message.enqueued_time";
    /// `complete`, `abandon`, `dead_letter` (and `release`).
    pub const DISPOSITION_STATUS: &str = "messaging.servicebus.disposition_status";
    /// The namespace host.
    pub const SERVER_ADDRESS: &str = "server.address";
    /// A bounded error class: see [`super::error`].
    pub const ERROR_TYPE: &str = "error.type";
    /// Messages in one receive call.
    pub const BATCH_MESSAGE_COUNT: &str = "messaging.batch.message_count";
    /// The message's session id. Spans only: never a metric label.
    pub const SESSION_ID: &str = "messaging.servicebus.message.session_id";
}

/// Values of `messaging.operation.type`.
pub mod value {
    /// A receive.
    pub const TYPE_RECEIVE: &str = "receive";
    /// Processing (an application's consumer span).
    pub const TYPE_PROCESS: &str = "process";
    /// A settlement or a lock renewal.
    pub const TYPE_SETTLE: &str = "settle";
    /// A send.
    pub const TYPE_SEND: &str = "send";
}

/// `error.type` values: the .NET SDK's `ServiceBusFailureReason` names where one fits.
pub mod error {
    /// The lock expired or the broker no longer knows it.
    pub const LOCK_LOST: &str = "MessageLockLost";
    /// Timeout, throttling or a broken connection.
    pub const TRANSIENT: &str = "ServiceCommunicationProblem";
    /// The broker refused the operation.
    pub const REFUSED: &str = "Refused";
    /// The entity does not exist.
    pub const NOT_FOUND: &str = "MessagingEntityNotFound";
    /// The message is larger than the entity allows.
    pub const SIZE_EXCEEDED: &str = "MessageSizeExceeded";
    /// The namespace is throttling.
    pub const SERVER_BUSY: &str = "ServiceBusy";
}

/// Metric names, each with its unit.
pub mod metric {
    /// Messages delivered to the application (counter, `{message}`).
    pub const CONSUMED_MESSAGES: &str = "messaging.client.consumed.messages";
    /// The deliveries a pipelined receiver keeps in flight, as it sized its window (gauge,
    /// `{message}`; [`crate::window`]).
    pub const RECEIVE_WINDOW: &str = "messaging.servicebus.receive.window";
    /// The broker's round trip the receive window was sized over (gauge, `s`).
    pub const RECEIVE_ROUND_TRIP: &str = "messaging.servicebus.receive.round_trip";
    /// One client operation: receive, settle, renew, send (histogram, `s`).
    pub const OPERATION_DURATION: &str = "messaging.client.operation.duration";
    /// The semantic conventions' bucket boundaries for duration histograms, in seconds.
    pub const DURATION_BUCKETS: [f64; 14] = [
        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];
}

/// Application properties the client writes on send and reads on receive: the producer's
/// trace context (W3C Trace Context, <https://www.w3.org/TR/trace-context/>), and the Azure
/// SDKs' copy of it (`Diagnostic-Id`, "Distributed tracing and correlation through Service Bus
/// messaging", learn.microsoft.com/azure/service-bus-messaging/service-bus-end-to-end-tracing).
pub mod property {
    /// W3C trace context of the producer.
    pub const TRACEPARENT: &str = "traceparent";
    /// W3C trace state of the producer.
    pub const TRACESTATE: &str = "tracestate";
    /// The Azure SDKs' copy of `traceparent`, read when `traceparent` is absent.
    pub const DIAGNOSTIC_ID: &str = "Diagnostic-Id";
}
