//! The runtime's telemetry: the `process {entity}` consumer span (from the start of handling to
//! settlement, linked to the producer's context), its store-transaction child, and the outcome
//! metrics. Through `tracing` and the `opentelemetry` API only: no-ops without an exporter.

use std::future::Future;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter};
use tokio::time::Instant;
use tracing::field::Empty;
use tracing::{Instrument as _, Span};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use super::lock_keeper::RenewalMeter;
use super::{Clock, ConsumerName, Contract, Outcome, Report, Settlement};
use crate::envelope;
use crate::ports::{Delivery, DuplicateScope, PropertyValue, Source};
use crate::telemetry::cardinality::LabelSet;
use crate::telemetry::names::{attr, error, metric, property, span, value};
use crate::telemetry::propagation::producer_context;

/// Distinct producers reported before the rest share [`value::OTHER`].
const MAX_PRODUCERS: usize = 64;

/// Instruments and fixed labels of one runtime.
#[derive(Debug)]
pub(crate) struct Observer {
    source: Source,
    consumer: String,
    process_name: String,
    base: Vec<KeyValue>,
    producers: LabelSet,
    clock: Clock,
    process_duration: Histogram<f64>,
    transaction_duration: Histogram<f64>,
    message_age: Histogram<f64>,
    outcomes: Counter<u64>,
    duplicates: Counter<u64>,
    renewals: Counter<u64>,
    lock_lost: Counter<u64>,
    session_lock_lost: Counter<u64>,
    unknown_contracts: Counter<u64>,
    settlement_failures: Counter<u64>,
    batch_size: Histogram<u64>,
}

/// One delivery being handled.
#[derive(Debug)]
pub(crate) struct Processing {
    pub(crate) span: Span,
    started: Instant,
}

fn counter(meter: &Meter, name: &'static str, unit: &'static str) -> Counter<u64> {
    meter.u64_counter(name).with_unit(unit).build()
}

fn histogram(meter: &Meter, name: &'static str, buckets: &[f64]) -> Histogram<f64> {
    meter
        .f64_histogram(name)
        .with_unit("s")
        .with_boundaries(buckets.to_vec())
        .build()
}

fn text(message: &crate::ports::Message, key: &str) -> Option<String> {
    match message.application_properties.get(key) {
        Some(PropertyValue::String(value)) => Some(envelope::truncate(value, 128)),
        _ => None,
    }
}

impl Observer {
    /// Binds the instruments to the global meter provider present now.
    pub(crate) fn new(source: Source, consumer: &ConsumerName, clock: Clock) -> Self {
        let meter = opentelemetry::global::meter("sb-inbox");
        let mut base = vec![
            KeyValue::new(attr::MESSAGING_SYSTEM, source.system.clone()),
            KeyValue::new(attr::DESTINATION, source.destination.clone()),
            KeyValue::new(attr::CONSUMER, consumer.as_str().to_owned()),
        ];
        if let Some(subscription) = &source.subscription {
            base.push(KeyValue::new(attr::SUBSCRIPTION, subscription.clone()));
        }
        if let Some(server) = &source.server_address {
            base.push(KeyValue::new(attr::SERVER_ADDRESS, server.clone()));
        }
        Observer {
            process_name: span::name(span::PROCESS, &source.destination),
            consumer: consumer.as_str().to_owned(),
            source,
            base,
            producers: LabelSet::new(MAX_PRODUCERS),
            clock,
            process_duration: histogram(
                &meter,
                metric::PROCESS_DURATION,
                &metric::DURATION_BUCKETS,
            ),
            transaction_duration: histogram(
                &meter,
                metric::TRANSACTION_DURATION,
                &metric::DURATION_BUCKETS,
            ),
            message_age: histogram(&meter, metric::MESSAGE_AGE, &metric::AGE_BUCKETS),
            outcomes: counter(&meter, metric::OUTCOMES, "{message}"),
            duplicates: counter(&meter, metric::DUPLICATES, "{message}"),
            renewals: counter(&meter, metric::LOCK_RENEWALS, "{renewal}"),
            lock_lost: counter(&meter, metric::LOCK_LOST, "{lock}"),
            session_lock_lost: counter(&meter, metric::SESSION_LOCK_LOST, "{session}"),
            settlement_failures: counter(&meter, metric::SETTLEMENT_FAILURES, "{settlement}"),
            unknown_contracts: counter(&meter, metric::UNKNOWN_CONTRACTS, "{message}"),
            batch_size: meter
                .u64_histogram(metric::BATCH_SIZE)
                .with_unit("{message}")
                .with_boundaries(metric::BATCH_SIZE_BUCKETS.to_vec())
                .build(),
        }
    }

    /// A held session's lock was lost (session mode).
    pub(crate) fn session_lock_lost(&self) {
        self.session_lock_lost.add(1, &self.base);
    }

    /// The renewal counter for the lock keeper.
    pub(crate) fn renewal_meter(&self) -> RenewalMeter {
        RenewalMeter {
            counter: self.renewals.clone(),
            labels: self.base.clone().into(),
        }
    }

    /// Records the size of one batched transaction.
    pub(crate) fn batch(&self, size: usize) {
        self.batch_size
            .record(u64::try_from(size).unwrap_or(u64::MAX), &self.base);
    }

    /// Opens the process span of `delivery`, linked to its producer's context.
    pub(crate) fn start<D: Delivery>(&self, delivery: &D) -> Processing {
        let message = delivery.message();
        let span = tracing::info_span!(
            "process",
            otel.name = %self.process_name,
            otel.kind = "consumer",
            otel.status_code = Empty,
            { attr::MESSAGING_SYSTEM } = %self.source.system,
            { attr::OPERATION_TYPE } = value::TYPE_PROCESS,
            { attr::OPERATION_NAME } = span::PROCESS,
            { attr::DESTINATION } = %self.source.destination,
            { attr::SUBSCRIPTION } = self.source.subscription.as_deref(),
            { attr::SERVER_ADDRESS } = self.source.server_address.as_deref(),
            { attr::MESSAGE_ID } = message.message_id.as_deref().map(|id| envelope::truncate(id, 128)),
            { attr::SESSION_ID } = message.session_id.as_deref().map(|id| envelope::truncate(id, 128)),
            { attr::CONVERSATION_ID } = message.correlation_id.as_deref().map(|id| envelope::truncate(id, 128)),
            { attr::CAUSATION_ID } = text(message, property::CAUSATION_ID),
            { attr::DELIVERY_COUNT } = i64::from(delivery.delivery_count()) + 1,
            { attr::ENQUEUED_TIME } = delivery.enqueued_time().and_then(epoch_seconds),
            { attr::CONSUMER } = %self.consumer,
            { attr::CONTRACT } = Empty,
            { attr::OUTCOME } = Empty,
            { attr::SETTLEMENT } = Empty,
            { attr::DEAD_LETTER_REASON } = Empty,
            { attr::ERROR_TYPE } = Empty,
        );
        if let Some(producer) = producer_context(message) {
            span.add_link(producer);
        }
        Processing {
            span,
            started: Instant::now(),
        }
    }

    /// Runs one store transaction under its own span, timed; a transaction dropped unfinished
    /// (lost lock, shutdown) counts as rolled back.
    pub(crate) async fn transaction<T, E>(
        &self,
        work: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let mut timer = Transaction {
            observer: self,
            started: Instant::now(),
            span: tracing::info_span!(
                "transaction",
                otel.name = span::STORE_TRANSACTION,
                otel.kind = "internal",
                { attr::TRANSACTION_RESULT } = Empty,
            ),
            committed: false,
        };
        let result = work.instrument(timer.span.clone()).await;
        timer.committed = result.is_ok();
        result
    }

    /// Closes the process span with the outcome and records the metrics of `report`.
    /// `contracts` are the handler's: any other subject is labelled [`value::OTHER`].
    pub(crate) fn finish<D: Delivery>(
        &self,
        processing: Processing,
        delivery: &D,
        report: &Report,
        contracts: &[Contract],
    ) {
        let Processing { span, started } = processing;
        let ending = Ending::of(delivery.message(), report, contracts);
        ending.close(span);
        self.record_ending(&ending, started, delivery);
    }

    /// The metrics of one finished delivery: its duration and age, its outcome, and the
    /// counters that single out duplicates, lost locks, unknown contracts and failed
    /// settlements.
    fn record_ending<D: Delivery>(&self, ending: &Ending, started: Instant, delivery: &D) {
        let Ending {
            outcome,
            settlement,
            settle_error,
            error_type,
            ..
        } = *ending;
        let mut labels = self.base.clone();
        labels.push(KeyValue::new(attr::CONTRACT, ending.contract.clone()));
        let mut outcome_labels = labels.clone();
        outcome_labels.push(KeyValue::new(attr::OUTCOME, outcome.as_str()));
        let mut process_labels = outcome_labels.clone();
        process_labels.push(KeyValue::new(attr::OPERATION_NAME, span::PROCESS));
        if let Some(error_type) = error_type {
            process_labels.push(KeyValue::new(attr::ERROR_TYPE, error_type));
        }
        self.process_duration
            .record(started.elapsed().as_secs_f64(), &process_labels);
        if let Some(enqueued) = delivery.enqueued_time()
            && let Ok(age) = self.clock.now().duration_since(enqueued)
        {
            self.message_age.record(age.as_secs_f64(), &outcome_labels);
        }
        if let Outcome::Permanent(reason) = outcome {
            outcome_labels.push(KeyValue::new(attr::DEAD_LETTER_REASON, reason.as_str()));
        }
        outcome_labels.push(KeyValue::new(attr::SETTLEMENT, settlement));
        outcome_labels.push(KeyValue::new(
            attr::SETTLEMENT_RESULT,
            settle_error.unwrap_or(value::OK),
        ));
        self.outcomes.add(1, &outcome_labels);
        self.count_singled_out(ending, delivery.message(), labels);
    }

    /// The counters only some outcomes add to, each labelled by contract.
    fn count_singled_out(
        &self,
        ending: &Ending,
        message: &crate::ports::Message,
        labels: Vec<KeyValue>,
    ) {
        if let Outcome::Duplicate(scope) = ending.outcome {
            self.count_duplicate(message, scope, labels.clone());
        }
        if ending.outcome == Outcome::LockLost {
            self.lock_lost.add(1, &labels);
        }
        if ending.outcome == Outcome::Ignored {
            // `contract` is `_other` here: the name is another team's, unbounded.
            self.unknown_contracts.add(1, &labels);
        }
        if let Some(error_type) = ending.settle_error {
            let mut failure_labels = labels;
            failure_labels.push(KeyValue::new(attr::DISPOSITION_STATUS, ending.settlement));
            failure_labels.push(KeyValue::new(attr::ERROR_TYPE, error_type));
            self.settlement_failures.add(1, &failure_labels);
        }
    }

    /// Counts a duplicate by its producer (bounded to [`MAX_PRODUCERS`]) and dedupe scope.
    fn count_duplicate(
        &self,
        message: &crate::ports::Message,
        scope: DuplicateScope,
        mut labels: Vec<KeyValue>,
    ) {
        let producer = text(message, property::PRODUCER)
            .map_or_else(|| value::OTHER.to_owned(), |p| self.producers.admit(&p));
        labels.push(KeyValue::new(attr::PRODUCER, producer));
        labels.push(KeyValue::new(
            attr::DUPLICATE_SCOPE,
            match scope {
                DuplicateScope::Inbox => "inbox",
                DuplicateScope::BusinessKey => "business_key",
            },
        ));
        self.duplicates.add(1, &labels);
    }
}

/// How one delivery ended, as its span and its metrics label it.
struct Ending {
    /// The contract name if the handler knows it, else [`value::OTHER`].
    contract: String,
    outcome: Outcome,
    /// The name of the settlement the outcome asks for.
    settlement: &'static str,
    /// Why the settlement failed, if it did.
    settle_error: Option<&'static str>,
    /// The error the process span reports: the outcome's failure, else the settlement's.
    error_type: Option<&'static str>,
}

impl Ending {
    fn of(message: &crate::ports::Message, report: &Report, contracts: &[Contract]) -> Self {
        let contract = message
            .subject
            .as_deref()
            .and_then(|s| s.parse::<Contract>().ok())
            .filter(|c| contracts.contains(c))
            .map_or_else(|| value::OTHER.to_owned(), |c| c.to_string());
        let outcome = report.outcome;
        let settle_error = match &report.settled {
            Some(Err(error)) => Some(error.error_type()),
            _ => None,
        };
        let error_type = match outcome {
            Outcome::Transient => Some(error::TRANSIENT_FAILURE),
            Outcome::Permanent(reason) => Some(reason.as_str()),
            Outcome::LockLost => Some(error::LOCK_LOST),
            Outcome::HandlerPanicked => Some(error::HANDLER_PANICKED),
            _ => settle_error,
        };
        Ending {
            contract,
            outcome,
            settlement: settlement_name(outcome.settlement()),
            settle_error,
            error_type,
        }
    }

    /// Records the ending on the process span and closes it.
    fn close(&self, span: Span) {
        span.record(attr::CONTRACT, self.contract.as_str());
        span.record(attr::OUTCOME, self.outcome.as_str());
        span.record(attr::SETTLEMENT, self.settlement);
        if let Outcome::Permanent(reason) = self.outcome {
            span.record(attr::DEAD_LETTER_REASON, reason.as_str());
        }
        if let Some(error_type) = self.error_type {
            span.record(attr::ERROR_TYPE, error_type);
            span.record("otel.status_code", "error");
        }
    }
}

fn settlement_name(settlement: Settlement) -> &'static str {
    match settlement {
        Settlement::Complete => span::COMPLETE,
        Settlement::Abandon => span::ABANDON,
        Settlement::DeadLetter => span::DEAD_LETTER,
        Settlement::None => value::NONE,
    }
}

fn epoch_seconds(time: std::time::SystemTime) -> Option<i64> {
    let seconds = time.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs();
    i64::try_from(seconds).ok()
}

/// Records the transaction's span result and duration when it ends, however it ends.
struct Transaction<'a> {
    observer: &'a Observer,
    started: Instant,
    span: Span,
    committed: bool,
}

impl Drop for Transaction<'_> {
    fn drop(&mut self) {
        let result = if self.committed {
            value::COMMIT
        } else {
            value::ROLLBACK
        };
        self.span.record(attr::TRANSACTION_RESULT, result);
        let mut labels = self.observer.base.clone();
        labels.push(KeyValue::new(attr::TRANSACTION_RESULT, result));
        self.observer
            .transaction_duration
            .record(self.started.elapsed().as_secs_f64(), &labels);
    }
}
