//! The producer's trace context in message application properties.
//!
//! Producers following the OpenTelemetry conventions write W3C `traceparent` (and
//! `tracestate`); the Azure SDKs also write the same value as `Diagnostic-Id`, and older ones
//! only that. [`producer_context`] reads `traceparent` first and falls back to
//! `Diagnostic-Id`; [`stamp`] writes both on outgoing messages.

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::names::property::{DIAGNOSTIC_ID, TRACEPARENT};
use crate::ports::{Message, PropertyValue};
use sb_servicebus::trace_context::TraceContext;

/// Reads one property as the W3C propagator asks for `traceparent` / `tracestate`, with
/// `Diagnostic-Id` standing in for a missing `traceparent`.
struct Carrier<'a>(&'a Message);

impl Carrier<'_> {
    fn text(&self, key: &str) -> Option<&str> {
        match self.0.application_properties.get(key) {
            Some(PropertyValue::String(value)) => Some(value),
            _ => None,
        }
    }
}

impl Extractor for Carrier<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        let value = self.text(key);
        if key == TRACEPARENT {
            value.or_else(|| self.text(DIAGNOSTIC_ID))
        } else {
            value
        }
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .application_properties
            .keys()
            .map(String::as_str)
            .collect()
    }
}

struct Writer<'a>(&'a mut BTreeMap<String, PropertyValue>);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), PropertyValue::String(value));
    }
}

/// The producer's span context carried by `message`, if it carries a valid one.
///
/// # Examples
/// ```
/// use sb_inbox::Message;
/// use sb_inbox::telemetry::propagation::producer_context;
/// let mut message = Message::new("m-1", "orders.order-placed.v1", "{}");
/// message.application_properties.insert(
///     "Diagnostic-Id".into(),
///     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".into(),
/// );
/// let context = producer_context(&message).expect("a valid context");
/// assert_eq!(context.trace_id().to_string(), "0af7651916cd43dd8448eb211c80319c");
/// ```
pub fn producer_context(message: &Message) -> Option<SpanContext> {
    let context = TraceContext.extract(&Carrier(message));
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Writes the trace context of `span` into `message` as `traceparent`, `tracestate` and
/// `Diagnostic-Id`, unless the message already carries a `traceparent` (a message written to
/// the outbox inside a handler keeps the handler's context through the relay). Nothing is
/// written when `span` has no OpenTelemetry context (no exporter configured).
pub fn stamp(message: &mut Message, span: &tracing::Span) {
    stamp_properties(&mut message.application_properties, span);
}

/// As [`stamp`], on bare application properties: e.g. an outbox row's, written inside a handler
/// with `tracing::Span::current()` so the relayed message keeps the handler's context.
pub fn stamp_properties(properties: &mut BTreeMap<String, PropertyValue>, span: &tracing::Span) {
    if !properties.contains_key(TRACEPARENT) {
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return;
        }
        TraceContext.inject_context(&context, &mut Writer(properties));
    }
    copy_diagnostic_id(properties);
}

/// Service Bus consumers on the Azure SDKs read `Diagnostic-Id`: keep it equal to
/// `traceparent` when only the latter is set.
fn copy_diagnostic_id(properties: &mut BTreeMap<String, PropertyValue>) {
    if properties.contains_key(DIAGNOSTIC_ID) {
        return;
    }
    if let Some(traceparent) = properties.get(TRACEPARENT).cloned() {
        properties.insert(DIAGNOSTIC_ID.to_owned(), traceparent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn message_with(properties: &[(&str, &str)]) -> Message {
        let mut message = Message::new("m-1", "orders.order-placed.v1", "{}");
        for (key, value) in properties {
            message
                .application_properties
                .insert((*key).to_owned(), (*value).into());
        }
        message
    }

    #[test]
    fn traceparent_wins_over_diagnostic_id() {
        let other = "00-11111111111111111111111111111111-2222222222222222-01";
        let message = message_with(&[(TRACEPARENT, PARENT), (DIAGNOSTIC_ID, other)]);
        let context = producer_context(&message).unwrap();
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
        assert!(context.is_remote() && context.is_sampled());
    }

    #[test]
    fn diagnostic_id_is_the_fallback() {
        let context = producer_context(&message_with(&[(DIAGNOSTIC_ID, PARENT)])).unwrap();
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
    }

    #[test]
    fn missing_or_malformed_context_is_none() {
        assert_eq!(producer_context(&message_with(&[])), None);
        assert_eq!(
            producer_context(&message_with(&[(TRACEPARENT, "garbage")])),
            None
        );
        // Legacy hierarchical Request-Id values are not W3C trace contexts.
        assert_eq!(
            producer_context(&message_with(&[(DIAGNOSTIC_ID, "|abc.1.")])),
            None
        );
    }

    #[test]
    fn stamp_keeps_an_existing_context_and_mirrors_diagnostic_id() {
        let mut message = message_with(&[(TRACEPARENT, PARENT)]);
        stamp(&mut message, &tracing::Span::none());
        assert_eq!(
            message.application_properties.get(DIAGNOSTIC_ID),
            Some(&PropertyValue::String(PARENT.to_owned()))
        );
    }

    #[test]
    fn stamp_without_a_context_writes_nothing() {
        let mut message = message_with(&[]);
        stamp(&mut message, &tracing::Span::none());
        assert!(message.application_properties.is_empty());
    }
}
