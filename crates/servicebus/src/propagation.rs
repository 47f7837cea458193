//! The producer's trace context in application properties: read on receive (the receive span
//! links to the producer's span), written on send (the send span's context).
//!
//! Producers following the OpenTelemetry conventions write W3C `traceparent` (and
//! `tracestate`); the Azure SDKs also write the same value as `Diagnostic-Id`, older ones only
//! that ("Distributed tracing and correlation through Service Bus messaging",
//! learn.microsoft.com/azure/service-bus-messaging/service-bus-end-to-end-tracing).

use std::collections::BTreeMap;

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, TraceContextExt};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::PropertyValue;
use crate::names::property::{DIAGNOSTIC_ID, TRACEPARENT};
use crate::trace_context::TraceContext;

struct Carrier<'a>(&'a BTreeMap<String, PropertyValue>);

impl Carrier<'_> {
    fn text(&self, key: &str) -> Option<&str> {
        match self.0.get(key) {
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
        self.0.keys().map(String::as_str).collect()
    }
}

struct Writer<'a>(&'a mut BTreeMap<String, PropertyValue>);

impl Injector for Writer<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key.to_owned(), PropertyValue::String(value));
    }
}

/// The producer's span context in `properties` (`traceparent`, else `Diagnostic-Id`), if valid.
pub(crate) fn producer_context(
    properties: &BTreeMap<String, PropertyValue>,
) -> Option<SpanContext> {
    let context = TraceContext.extract(&Carrier(properties));
    let span = context.span().span_context().clone();
    span.is_valid().then_some(span)
}

/// Writes `span`'s context as `traceparent` (unless one is there: the producer's own wins)
/// and copies it to `Diagnostic-Id` for the Azure SDKs.
pub(crate) fn stamp(properties: &mut BTreeMap<String, PropertyValue>, span: &tracing::Span) {
    if !properties.contains_key(TRACEPARENT) {
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return;
        }
        TraceContext.inject_context(&context, &mut Writer(properties));
    }
    if !properties.contains_key(DIAGNOSTIC_ID)
        && let Some(traceparent) = properties.get(TRACEPARENT).cloned()
    {
        properties.insert(DIAGNOSTIC_ID.to_owned(), traceparent);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    fn properties(entries: &[(&str, &str)]) -> BTreeMap<String, PropertyValue> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect()
    }

    #[test]
    fn traceparent_wins_over_diagnostic_id_which_is_the_fallback() {
        let other = "00-11111111111111111111111111111111-2222222222222222-01";
        let both = properties(&[(TRACEPARENT, PARENT), (DIAGNOSTIC_ID, other)]);
        let context = producer_context(&both).unwrap();
        assert_eq!(context.span_id().to_string(), "b7ad6b7169203331");
        let fallback = properties(&[(DIAGNOSTIC_ID, PARENT)]);
        assert_eq!(
            producer_context(&fallback).unwrap().span_id().to_string(),
            "b7ad6b7169203331"
        );
        assert_eq!(
            producer_context(&properties(&[(TRACEPARENT, "garbage")])),
            None
        );
    }

    #[test]
    fn stamping_keeps_the_producers_traceparent_and_copies_it() {
        let mut stamped = properties(&[(TRACEPARENT, PARENT)]);
        stamp(&mut stamped, &tracing::Span::none());
        assert_eq!(stamped.get(DIAGNOSTIC_ID), Some(&PARENT.into()));
    }
}
