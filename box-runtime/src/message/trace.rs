//! OpenTelemetry (feature `otel`): the consumer continues the trace whose W3C `traceparent` a
//! message carries, and the outbox stores the current span's trace context.

use std::collections::HashMap;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::Delivery;
use crate::names::HEADER_TRACEPARENT;

/// A message's headers as OpenTelemetry reads them.
struct Headers<'a>(&'a Delivery);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.header_str(key)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.headers.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Makes `span` a child of the trace context in the message's headers, if it has a valid one
/// (the propagator ignores an invalid `traceparent`).
pub(crate) fn continue_trace(span: &Span, d: &Delivery) {
    if span.is_disabled() || d.header(HEADER_TRACEPARENT).is_none() {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(d));
    if parent.span().span_context().is_valid() {
        // Without an OpenTelemetry layer in the subscriber there is nothing to attach to.
        let _ = span.set_parent(parent);
    }
}

/// The W3C `traceparent` of the current span, when it belongs to a valid OpenTelemetry trace.
pub(crate) fn current_traceparent() -> Option<String> {
    let context = Span::current().context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    carrier.remove(HEADER_TRACEPARENT)
}
