//! Client spans and metrics of Service Bus operations: `receive`, `complete`, `abandon`,
//! `dead_letter`, `renew_lock` and `send`, each a span named `{operation} {entity}` and a
//! `messaging.client.operation.duration` measurement, per the OpenTelemetry conventions for
//! Service Bus. A settlement or renewal made while handling a delivery is a child of its
//! process span.

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Gauge, Histogram};
use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use crate::names::{SYSTEM, attr, metric, span, value};

/// Where an entity's deliveries come from, as telemetry names it: the queue or topic, the
/// subscription of a topic, and the namespace host.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EntityNames {
    /// `messaging.destination.name`: the queue or topic.
    pub destination: String,
    /// `messaging.destination.subscription.name`: the subscription (and any sub-queue) of a
    /// topic subscription.
    pub subscription: Option<String>,
    /// `server.address`: the namespace host.
    pub server_address: String,
}

/// Instruments and labels of one entity (queue, topic or subscription).
#[derive(Debug)]
pub(crate) struct EntityTelemetry {
    source: EntityNames,
    base: Vec<KeyValue>,
    duration: Histogram<f64>,
    consumed: Counter<u64>,
    window: Gauge<u64>,
    round_trip: Gauge<f64>,
}

/// One operation in flight: its span and start.
#[derive(Debug)]
pub(crate) struct Operation<'a> {
    entity: &'a EntityTelemetry,
    name: &'static str,
    pub(crate) span: Span,
    started: Instant,
}

/// What an operation is, for its span kind and `messaging.operation.type`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Kind {
    Receive,
    Settle,
    Renew,
    Send,
}

/// `TOPIC/Subscriptions/SUB` → (`TOPIC`, `SUB`); anything else is the destination itself.
fn split(entity: &str) -> (String, Option<String>) {
    let lower = entity.to_ascii_lowercase();
    match lower.find("/subscriptions/") {
        Some(at) => {
            let subscription = &entity[at + "/subscriptions/".len()..];
            (entity[..at].to_owned(), Some(subscription.to_owned()))
        }
        None => (entity.to_owned(), None),
    }
}

impl EntityTelemetry {
    /// Binds the instruments to the global meter provider present now.
    pub(crate) fn new(entity: &str, host: &str) -> Self {
        let (destination, subscription) = split(entity);
        let source = EntityNames {
            destination,
            subscription,
            server_address: host.to_owned(),
        };
        let mut base = vec![
            KeyValue::new(attr::MESSAGING_SYSTEM, SYSTEM),
            KeyValue::new(attr::DESTINATION, source.destination.clone()),
            KeyValue::new(attr::SERVER_ADDRESS, host.to_owned()),
        ];
        if let Some(subscription) = &source.subscription {
            base.push(KeyValue::new(attr::SUBSCRIPTION, subscription.clone()));
        }
        let meter = opentelemetry::global::meter("sb-servicebus");
        EntityTelemetry {
            duration: meter
                .f64_histogram(metric::OPERATION_DURATION)
                .with_unit("s")
                .with_boundaries(metric::DURATION_BUCKETS.to_vec())
                .build(),
            consumed: meter
                .u64_counter(metric::CONSUMED_MESSAGES)
                .with_unit("{message}")
                .build(),
            window: meter
                .u64_gauge(metric::RECEIVE_WINDOW)
                .with_unit("{message}")
                .build(),
            round_trip: meter
                .f64_gauge(metric::RECEIVE_ROUND_TRIP)
                .with_unit("s")
                .build(),
            source,
            base,
        }
    }

    /// Records the receive window in force and the broker's round trip it was sized over.
    pub(crate) fn window(&self, window: u32, rtt: Option<std::time::Duration>) {
        self.window.record(u64::from(window), &self.base);
        if let Some(rtt) = rtt {
            self.round_trip.record(rtt.as_secs_f64(), &self.base);
        }
    }

    /// The entity as telemetry names it.
    pub(crate) fn names(&self) -> &EntityNames {
        &self.source
    }

    /// Starts `name` (an operation from [`span`]) with its client (or producer) span.
    pub(crate) fn start(&self, name: &'static str, kind: Kind) -> Operation<'_> {
        let (otel_kind, operation_type) = match kind {
            Kind::Receive => ("client", Some(value::TYPE_RECEIVE)),
            Kind::Settle => ("client", Some(value::TYPE_SETTLE)),
            Kind::Renew => ("client", None),
            Kind::Send => ("producer", Some(value::TYPE_SEND)),
        };
        let disposition = matches!(kind, Kind::Settle).then_some(name);
        let span = tracing::info_span!(
            "servicebus",
            otel.name = %span::name(name, &self.source.destination),
            otel.kind = otel_kind,
            otel.status_code = Empty,
            { attr::MESSAGING_SYSTEM } = SYSTEM,
            { attr::OPERATION_TYPE } = operation_type,
            { attr::OPERATION_NAME } = name,
            { attr::DESTINATION } = %self.source.destination,
            { attr::SUBSCRIPTION } = self.source.subscription.as_deref(),
            { attr::SERVER_ADDRESS } = %self.source.server_address,
            { attr::DISPOSITION_STATUS } = disposition,
            { attr::BATCH_MESSAGE_COUNT } = Empty,
            { attr::MESSAGE_ID } = Empty,
            { attr::ERROR_TYPE } = Empty,
        );
        Operation {
            entity: self,
            name,
            span,
            started: Instant::now(),
        }
    }
}

impl Operation<'_> {
    /// Ends the operation: `error` is its bounded `error.type` when it failed.
    pub(crate) fn end(self, error: Option<&'static str>) {
        let mut labels = self.entity.base.clone();
        labels.push(KeyValue::new(attr::OPERATION_NAME, self.name));
        if let Some(error) = error {
            self.span.record(attr::ERROR_TYPE, error);
            self.span.record("otel.status_code", "error");
            labels.push(KeyValue::new(attr::ERROR_TYPE, error));
        }
        self.entity
            .duration
            .record(self.started.elapsed().as_secs_f64(), &labels);
    }

    /// Ends a receive that delivered one message.
    pub(crate) fn received(self) {
        self.span.record(attr::BATCH_MESSAGE_COUNT, 1);
        let mut labels = self.entity.base.clone();
        labels.push(KeyValue::new(attr::OPERATION_NAME, span::RECEIVE));
        self.entity.consumed.add(1, &labels);
        self.end(None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_split_from_their_topic() {
        assert_eq!(split("orders"), ("orders".to_owned(), None));
        assert_eq!(
            split("orders/Subscriptions/inventory"),
            ("orders".to_owned(), Some("inventory".to_owned()))
        );
        assert_eq!(
            split("orders/subscriptions/inventory/$DeadLetterQueue"),
            (
                "orders".to_owned(),
                Some("inventory/$DeadLetterQueue".to_owned())
            )
        );
    }
}
