//! Every span, attribute and metric name the worker emits, in one place. Those the Service
//! Bus client emits are its own (`sb_servicebus::names`), named here again for the worker's.
//!
//! A leaf module: any layer may import it, and `tests/infra` checks that every name the
//! dashboards and alert rules in `infra/` query is one of these. The messaging names follow the
//! OpenTelemetry messaging semantic conventions for Azure Service Bus; ours start with
//! `sb_inbox.`.
//!
//! Metric names reach Prometheus-style backends (Grafana) through the collector's translation:
//! dots become underscores, the unit is appended (`_seconds`) and counters end in `_total`, so
//! `messaging.process.duration` is queried as `messaging_process_duration_seconds_bucket` and
//! `sb_inbox.outcomes` as `sb_inbox_outcomes_total`. [`prometheus_name`] implements that mapping.

/// `messaging.system` of everything this worker emits.
pub const SYSTEM: &str = sb_servicebus::names::SYSTEM;

/// Span names are `{operation} {entity}`; these are the operation parts.
pub mod span {
    use sb_servicebus::names::span as client;

    /// Client span of one receive call.
    pub const RECEIVE: &str = client::RECEIVE;
    /// Consumer span of handling one delivery, from the start of handling to settlement.
    pub const PROCESS: &str = "process";
    /// Client span of completing a delivery.
    pub const COMPLETE: &str = client::COMPLETE;
    /// Client span of abandoning a delivery.
    pub const ABANDON: &str = client::ABANDON;
    /// Client span of dead-lettering a delivery.
    pub const DEAD_LETTER: &str = client::DEAD_LETTER;
    /// Client span of releasing a delivery never started (not a delivery attempt).
    pub const RELEASE: &str = client::RELEASE;
    /// Client span of one lock renewal.
    pub const RENEW_LOCK: &str = client::RENEW_LOCK;
    /// Producer span of one send.
    pub const SEND: &str = client::SEND;
    /// Internal span of the inbox transaction (inbox row, handler, commit or rollback); its name
    /// has no entity.
    pub const STORE_TRANSACTION: &str = "sb_inbox.transaction";

    pub use client::name;
}

/// Attribute names (span attributes and metric labels).
pub mod attr {
    use sb_servicebus::names::attr as client;

    /// `servicebus`.
    pub const MESSAGING_SYSTEM: &str = client::MESSAGING_SYSTEM;
    /// `create`, `send`, `receive`, `process` or `settle`.
    pub const OPERATION_TYPE: &str = client::OPERATION_TYPE;
    /// The Service Bus operation: `receive`, `process`, `complete`, `abandon`, `dead_letter`,
    /// `renew_lock`, `send`.
    pub const OPERATION_NAME: &str = client::OPERATION_NAME;
    /// Queue or topic name.
    pub const DESTINATION: &str = client::DESTINATION;
    /// Subscription name (topic subscriptions only).
    pub const SUBSCRIPTION: &str = client::SUBSCRIPTION;
    /// The message id. Spans only: never a metric label.
    pub const MESSAGE_ID: &str = client::MESSAGE_ID;
    /// The correlation id. Spans only.
    pub const CONVERSATION_ID: &str = client::CONVERSATION_ID;
    /// Deliveries attempted, this one included (the broker's count + 1, as the Azure SDKs
    /// report it).
    pub const DELIVERY_COUNT: &str = client::DELIVERY_COUNT;
    /// When the broker accepted the message, UTC epoch seconds. Spans only.
    pub const ENQUEUED_TIME: &str = client::ENQUEUED_TIME;
    /// `complete`, `abandon` or `dead_letter`.
    pub const DISPOSITION_STATUS: &str = client::DISPOSITION_STATUS;
    /// The namespace host.
    pub const SERVER_ADDRESS: &str = client::SERVER_ADDRESS;
    /// A bounded error class: see [`super::error`].
    pub const ERROR_TYPE: &str = client::ERROR_TYPE;
    /// Messages in one receive call.
    pub const BATCH_MESSAGE_COUNT: &str = client::BATCH_MESSAGE_COUNT;

    /// The stable consumer name.
    pub const CONSUMER: &str = "sb_inbox.consumer";
    /// The contract `name.vN` when the handler supports it, else [`super::value::OTHER`].
    pub const CONTRACT: &str = "sb_inbox.contract";
    /// The outcome: `processed`, `duplicate`, `stale`, `transient`, `permanent`, `lock_lost`,
    /// `handler_panicked`, `ignored`.
    pub const OUTCOME: &str = "sb_inbox.outcome";
    /// The settlement the outcome asked for: `complete`, `abandon`, `dead_letter`, `none`.
    pub const SETTLEMENT: &str = "sb_inbox.settlement";
    /// Whether that settlement succeeded: `ok`, or the failure's `error.type`.
    pub const SETTLEMENT_RESULT: &str = "sb_inbox.settlement.result";
    /// The dead-letter reason (permanent outcomes), from the runtime's fixed vocabulary.
    pub const DEAD_LETTER_REASON: &str = "sb_inbox.dead_letter.reason";
    /// Which constraint recognised a duplicate: `inbox` or `business_key`.
    pub const DUPLICATE_SCOPE: &str = "sb_inbox.duplicate.scope";
    /// The producer named by the message's [`super::property::PRODUCER`] property, bounded.
    pub const PRODUCER: &str = "sb_inbox.producer";
    /// The causation id property of the message. Spans only.
    pub const CAUSATION_ID: &str = "sb_inbox.causation_id";
    /// How the transaction ended: `commit` or `rollback`.
    pub const TRANSACTION_RESULT: &str = "sb_inbox.transaction.result";
    /// Whether a lock renewal succeeded: `ok` or the failure's `error.type`.
    pub const RENEWAL_RESULT: &str = "sb_inbox.renewal.result";

    /// The message's session id (session mode). Spans only: never a metric label.
    pub const SESSION_ID: &str = client::SESSION_ID;

    /// Attributes that carry per-message values: allowed on spans, never on metrics.
    pub const PER_MESSAGE: [&str; 5] = [
        MESSAGE_ID,
        CONVERSATION_ID,
        CAUSATION_ID,
        ENQUEUED_TIME,
        SESSION_ID,
    ];

    /// Every attribute above.
    pub const ALL: [&str; 25] = [
        MESSAGING_SYSTEM,
        OPERATION_TYPE,
        OPERATION_NAME,
        DESTINATION,
        SUBSCRIPTION,
        MESSAGE_ID,
        CONVERSATION_ID,
        DELIVERY_COUNT,
        ENQUEUED_TIME,
        DISPOSITION_STATUS,
        SERVER_ADDRESS,
        ERROR_TYPE,
        BATCH_MESSAGE_COUNT,
        CONSUMER,
        CONTRACT,
        OUTCOME,
        SETTLEMENT,
        SETTLEMENT_RESULT,
        DEAD_LETTER_REASON,
        DUPLICATE_SCOPE,
        PRODUCER,
        CAUSATION_ID,
        TRANSACTION_RESULT,
        RENEWAL_RESULT,
        SESSION_ID,
    ];
}

/// Values of the attributes above that are not free text.
pub mod value {
    use sb_servicebus::names::value as client;

    /// `messaging.operation.type` of a receive.
    pub const TYPE_RECEIVE: &str = client::TYPE_RECEIVE;
    /// `messaging.operation.type` of processing.
    pub const TYPE_PROCESS: &str = client::TYPE_PROCESS;
    /// `messaging.operation.type` of a settlement or a lock renewal.
    pub const TYPE_SETTLE: &str = client::TYPE_SETTLE;
    /// `messaging.operation.type` of a send.
    pub const TYPE_SEND: &str = client::TYPE_SEND;
    /// A success in `*.result` attributes.
    pub const OK: &str = "ok";
    /// A label value past the cardinality bound, or not from the allowed set.
    pub const OTHER: &str = "_other";
    /// No settlement (lock lost).
    pub const NONE: &str = "none";
    /// A committed transaction.
    pub const COMMIT: &str = "commit";
    /// A rolled-back transaction.
    pub const ROLLBACK: &str = "rollback";
}

/// `error.type` values.
pub mod error {
    use sb_servicebus::names::error as client;

    /// The lock expired or the broker no longer knows it.
    pub const LOCK_LOST: &str = client::LOCK_LOST;
    /// Timeout, throttling or a broken connection.
    pub const TRANSIENT: &str = client::TRANSIENT;
    /// The broker refused the operation.
    pub const REFUSED: &str = client::REFUSED;
    /// A transient failure of the handler or the store.
    pub const TRANSIENT_FAILURE: &str = "TransientFailure";
    /// The entity does not exist.
    pub const NOT_FOUND: &str = client::NOT_FOUND;
    /// The message is larger than the entity allows.
    pub const SIZE_EXCEEDED: &str = client::SIZE_EXCEEDED;
    /// The namespace is throttling.
    pub const SERVER_BUSY: &str = client::SERVER_BUSY;
    /// The handler panicked (caught; the delivery abandoned or dead-lettered).
    pub const HANDLER_PANICKED: &str = "HandlerPanicked";
}

/// Application properties read from and written to messages.
pub mod property {
    use sb_servicebus::names::property as client;

    /// W3C trace context of the producer.
    pub const TRACEPARENT: &str = client::TRACEPARENT;
    /// W3C trace state of the producer.
    pub const TRACESTATE: &str = client::TRACESTATE;
    /// The Azure SDKs' copy of `traceparent`, read when `traceparent` is absent.
    pub const DIAGNOSTIC_ID: &str = client::DIAGNOSTIC_ID;
    /// The id of the message whose handling produced this one.
    pub const CAUSATION_ID: &str = "causation-id";
    /// The producing service, for the duplicate rate by producer.
    pub const PRODUCER: &str = "producer";
}

/// Metric names, each with its unit below.
pub mod metric {
    use sb_servicebus::names::metric as client;

    /// Messages delivered to the application (counter, `{message}`).
    pub const CONSUMED_MESSAGES: &str = client::CONSUMED_MESSAGES;
    /// Handling one delivery, start of handling to settlement (histogram, `s`).
    pub const PROCESS_DURATION: &str = "messaging.process.duration";
    /// One client operation: receive, settle, renew, send (histogram, `s`).
    pub const OPERATION_DURATION: &str = client::OPERATION_DURATION;
    /// Deliveries by consumer, contract and outcome (counter, `{message}`).
    pub const OUTCOMES: &str = "sb_inbox.outcomes";
    /// Duplicates by consumer, contract, producer and scope (counter, `{message}`).
    pub const DUPLICATES: &str = "sb_inbox.duplicates";
    /// Lock renewal attempts by result (counter, `{renewal}`).
    pub const LOCK_RENEWALS: &str = "sb_inbox.lock.renewals";
    /// Locks lost before commit (counter, `{lock}`).
    pub const LOCK_LOST: &str = "sb_inbox.lock.lost";
    /// Session locks lost while a session was held (session mode; counter, `{session}`).
    pub const SESSION_LOCK_LOST: &str = "sb_inbox.session.lock.lost";
    /// Settlements the broker refused or did not answer (counter, `{settlement}`).
    pub const SETTLEMENT_FAILURES: &str = "sb_inbox.settlement.failures";
    /// The inbox transaction, begin to commit or rollback (histogram, `s`).
    pub const TRANSACTION_DURATION: &str = "sb_inbox.store.transaction.duration";
    /// Enqueue to settlement of one delivery (histogram, `s`).
    pub const MESSAGE_AGE: &str = "sb_inbox.message.age";
    /// Outbox rows not yet relayed (gauge, `{message}`).
    pub const OUTBOX_BACKLOG: &str = "sb_inbox.outbox.backlog";
    /// Age of the oldest outbox row not yet relayed (gauge, `s`).
    pub const OUTBOX_AGE: &str = "sb_inbox.outbox.age";
    /// Inbox rows deleted by retention (counter, `{row}`).
    pub const RETENTION_DELETED: &str = "sb_inbox.retention.deleted";
    /// Transactions that failed because the store does not match the code: a missing table or
    /// column, a missing grant, a read-only database (counter, `{error}`, by `error.type` = the
    /// provider's code).
    pub const STORE_DEPLOYMENT_ERRORS: &str = "sb_inbox.store.deployment_errors";
    /// Deliveries per batched transaction, recorded once per batch (histogram, `{message}`;
    /// only with `runtime.batch_size` above 1).
    pub const BATCH_SIZE: &str = "sb_inbox.batch.size";

    /// Times the kill switch paused a consumer's deliveries because the store failed for every
    /// message alike (counter, `{trip}`).
    pub const CIRCUIT_TRIPS: &str = "sb_inbox.circuit.trips";
    /// Time a consumer's deliveries were paused by the kill switch, added when it resumes
    /// (counter, `s`).
    pub const CIRCUIT_PAUSED: &str = "sb_inbox.circuit.paused";

    /// Messages whose contract name no handler accepts, completed without a transaction
    /// because the consumer is set to (`unknown_contracts = "complete"`; counter, `{message}`).
    pub const UNKNOWN_CONTRACTS: &str = "sb_inbox.unknown_contracts";

    /// The deliveries a consumer's receive link keeps in flight, as its self-sizing window
    /// chose (gauge, `{message}`; issue 42, `sb_servicebus::window`).
    pub const RECEIVE_WINDOW: &str = client::RECEIVE_WINDOW;
    /// The broker's round trip that window was sized over: a disposition's answer on the link
    /// (gauge, `s`).
    pub const RECEIVE_ROUND_TRIP: &str = client::RECEIVE_ROUND_TRIP;

    /// Every metric with its unit.
    pub const ALL: [(&str, &str); 21] = [
        (CONSUMED_MESSAGES, "{message}"),
        (PROCESS_DURATION, "s"),
        (OPERATION_DURATION, "s"),
        (OUTCOMES, "{message}"),
        (DUPLICATES, "{message}"),
        (LOCK_RENEWALS, "{renewal}"),
        (LOCK_LOST, "{lock}"),
        (SETTLEMENT_FAILURES, "{settlement}"),
        (TRANSACTION_DURATION, "s"),
        (MESSAGE_AGE, "s"),
        (OUTBOX_BACKLOG, "{message}"),
        (OUTBOX_AGE, "s"),
        (RETENTION_DELETED, "{row}"),
        (STORE_DEPLOYMENT_ERRORS, "{error}"),
        (BATCH_SIZE, "{message}"),
        (SESSION_LOCK_LOST, "{session}"),
        (CIRCUIT_TRIPS, "{trip}"),
        (CIRCUIT_PAUSED, "s"),
        (UNKNOWN_CONTRACTS, "{message}"),
        (RECEIVE_WINDOW, "{message}"),
        (RECEIVE_ROUND_TRIP, "s"),
    ];

    /// Counters (monotonic sums): Prometheus names end in `_total`.
    pub const COUNTERS: [&str; 12] = [
        CONSUMED_MESSAGES,
        OUTCOMES,
        DUPLICATES,
        LOCK_RENEWALS,
        LOCK_LOST,
        SETTLEMENT_FAILURES,
        RETENTION_DELETED,
        STORE_DEPLOYMENT_ERRORS,
        SESSION_LOCK_LOST,
        CIRCUIT_TRIPS,
        CIRCUIT_PAUSED,
        UNKNOWN_CONTRACTS,
    ];

    /// The semantic conventions' bucket boundaries for `messaging.process.duration` and
    /// `messaging.client.operation.duration`, in seconds.
    pub const DURATION_BUCKETS: [f64; 14] = client::DURATION_BUCKETS;

    /// Buckets of [`BATCH_SIZE`]: powers of two up to the largest batch size, 1000.
    pub const BATCH_SIZE_BUCKETS: [f64; 11] = [
        1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1000.0,
    ];

    /// Buckets of [`MESSAGE_AGE`]: the convention's, then up to a day, since a backlog ages
    /// messages by minutes or hours.
    pub const AGE_BUCKETS: [f64; 22] = [
        0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 30.0,
        60.0, 300.0, 900.0, 1800.0, 3600.0, 21600.0, 86400.0,
    ];
}

/// The name a Prometheus-compatible backend gives an OTLP metric (the collector's
/// `prometheus`/`prometheusremotewrite` translation): dots to underscores, `_seconds` for unit
/// `s`, `_total` for counters. Annotation units (`{message}`) add no suffix.
///
/// # Examples
/// ```
/// use sb_inbox::telemetry::names::{metric, prometheus_name};
/// assert_eq!(prometheus_name(metric::OUTCOMES), "sb_inbox_outcomes_total");
/// assert_eq!(prometheus_name(metric::PROCESS_DURATION), "messaging_process_duration_seconds");
/// ```
pub fn prometheus_name(metric: &str) -> String {
    let mut name = metric.replace('.', "_");
    let unit = metric::ALL
        .iter()
        .find(|(n, _)| *n == metric)
        .map(|(_, unit)| *unit);
    if unit == Some("s") {
        name.push_str("_seconds");
    }
    if metric::COUNTERS.contains(&metric) {
        name.push_str("_total");
    }
    name
}

/// The same attribute name as a Prometheus label: dots to underscores.
pub fn prometheus_label(attribute: &str) -> String {
    attribute.replace('.', "_")
}
