//! [`TraceContext`]: the W3C Trace Context propagator (`traceparent`, `tracestate`) on the
//! `opentelemetry` API alone.
//!
//! Ours rather than `opentelemetry_sdk`'s `TraceContextPropagator` so that the library reads and
//! writes producers' trace context without the SDK, which is the application's choice (feature
//! `logs`). The format is W3C Trace Context Level 1, §3.2 (<https://www.w3.org/TR/trace-context/>):
//! `version-traceid-parentid-flags`, lowercase hex of 2, 32, 16 and 2 digits; version `ff` is
//! invalid; version `00` has exactly four fields, a later version may append more (read as
//! `00`, §4.3); an all-zero trace or parent id is invalid. Only the sampled flag is kept, as
//! the SDK's propagator does.

use std::str::FromStr as _;
use std::sync::OnceLock;

use opentelemetry::Context;
use opentelemetry::propagation::text_map_propagator::FieldIter;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};

use crate::names::property::{TRACEPARENT, TRACESTATE};

/// Reads and writes W3C `traceparent` / `tracestate`: an `opentelemetry`
/// [`TextMapPropagator`].
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceContext;

/// `n` lowercase hex digits, as §3.2.2 requires for every field.
fn lower_hex(text: &str, n: usize) -> bool {
    text.len() == n && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The span context a `traceparent` (and `tracestate`) carries, if valid.
fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut fields = traceparent.trim().split('-');
    let version = fields.next()?;
    let (trace_id, parent_id, flags) = (fields.next()?, fields.next()?, fields.next()?);
    let more = fields.next().is_some();
    if !lower_hex(version, 2) || version == "ff" || (version == "00" && more) {
        return None;
    }
    if !lower_hex(trace_id, 32) || !lower_hex(parent_id, 16) || !lower_hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(parent_id).ok()?;
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?) & TraceFlags::SAMPLED;
    // A malformed tracestate is dropped, not the trace (§3.3.1.5 lets a vendor discard it).
    let state = tracestate
        .and_then(|text| TraceState::from_str(text).ok())
        .unwrap_or_default();
    let context = SpanContext::new(trace_id, span_id, flags, true, state);
    context.is_valid().then_some(context)
}

impl TextMapPropagator for TraceContext {
    fn inject_context(&self, cx: &Context, injector: &mut dyn Injector) {
        let span = cx.span();
        let context = span.span_context();
        if context.is_valid() {
            let flags = context.trace_flags() & TraceFlags::SAMPLED;
            injector.set(
                TRACEPARENT,
                format!(
                    "00-{}-{}-{:02x}",
                    context.trace_id(),
                    context.span_id(),
                    flags.to_u8()
                ),
            );
            injector.set(TRACESTATE, context.trace_state().header());
        }
    }

    fn extract_with_context(&self, cx: &Context, extractor: &dyn Extractor) -> Context {
        match extractor
            .get(TRACEPARENT)
            .and_then(|traceparent| parse(traceparent, extractor.get(TRACESTATE)))
        {
            Some(context) => cx.with_remote_span_context(context),
            None => cx.clone(),
        }
    }

    fn fields(&self) -> FieldIter<'_> {
        static FIELDS: OnceLock<[String; 2]> = OnceLock::new();
        FieldIter::new(FIELDS.get_or_init(|| [TRACEPARENT.to_owned(), TRACESTATE.to_owned()]))
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const PARENT: &str = "00f067aa0ba902b7";

    #[test]
    fn valid_traceparents_read_with_the_sampled_flag_only() {
        for (text, sampled) in [
            (format!("00-{TRACE}-{PARENT}-01"), true),
            (format!("00-{TRACE}-{PARENT}-00"), false),
            (format!("00-{TRACE}-{PARENT}-09"), true),
            (format!("00-{TRACE}-{PARENT}-08"), false),
            // A later version may append fields (§4.3).
            (format!("02-{TRACE}-{PARENT}-01-later"), true),
            (format!(" 00-{TRACE}-{PARENT}-01 "), true),
        ] {
            let context = parse(&text, Some("foo=bar")).unwrap_or_else(|| panic!("{text}"));
            assert_eq!(context.trace_id().to_string(), TRACE, "{text}");
            assert_eq!(context.span_id().to_string(), PARENT, "{text}");
            assert_eq!(context.is_sampled(), sampled, "{text}");
            assert!(context.is_remote());
            assert_eq!(context.trace_state().get("foo"), Some("bar"));
        }
    }

    #[test]
    fn invalid_traceparents_read_as_none() {
        let zero_trace = "0".repeat(32);
        let zero_parent = "0".repeat(16);
        for text in [
            String::new(),
            format!("ff-{TRACE}-{PARENT}-01"),
            format!("00-{TRACE}-{PARENT}-01-extra"),
            format!("00-{}-{PARENT}-01", TRACE.to_uppercase()),
            format!("00-{TRACE}-{}-01", PARENT.to_uppercase()),
            format!("00-{TRACE}-{PARENT}-0A"),
            format!("00-{}-{PARENT}-01", &TRACE[1..]),
            format!("00-{TRACE}-{}-01", &PARENT[1..]),
            format!("00-{TRACE}-{PARENT}-1"),
            format!("0-{TRACE}-{PARENT}-01"),
            format!("00-{zero_trace}-{PARENT}-01"),
            format!("00-{TRACE}-{zero_parent}-01"),
            format!("00-{TRACE}-{PARENT}"),
            format!("0x-{TRACE}-{PARENT}-01"),
        ] {
            assert!(parse(&text, None).is_none(), "{text:?}");
        }
    }

    #[test]
    fn a_bad_tracestate_drops_only_the_state() {
        let context = parse(&format!("00-{TRACE}-{PARENT}-01"), Some("no separator")).unwrap();
        assert_eq!(context.trace_state().header(), "");
    }
}
