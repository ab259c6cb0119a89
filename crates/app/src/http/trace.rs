//! Every request's span and trace id: a caller's W3C `traceparent` is the parent of the
//! request's span (when traces are exported), its trace id is the request's (in every log
//! line inside it and in an error body); without one, a new trace starts.

use axum::extract::{MatchedPath, Request};
use axum::middleware::Next;
use axum::response::Response;
use opentelemetry::propagation::{Extractor, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::telemetry::{TraceId, with_trace_id};

struct Headers<'a>(&'a axum::http::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(axum::http::HeaderName::as_str).collect()
    }
}

/// The request's span (`request`, with the method, the route's template and, at the
/// end, the status; never a header or a body) under the caller's `traceparent`, and its
/// trace id for everything the request does.
pub(super) async fn trace_request(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |p| p.as_str().to_owned());
    let method = request.method().clone();
    let span = tracing::info_span!(
        "request",
        otel.name = %format_args!("{method} {route}"),
        otel.kind = "server",
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
    );
    let traceparent = request.headers().get("traceparent").and_then(|v| v.to_str().ok());
    if traceparent.is_some() {
        let parent = TraceContextPropagator::new().extract(&Headers(request.headers()));
        // Without an exporter's layer there is no OpenTelemetry span to parent: nothing.
        let _ = span.set_parent(parent);
    }
    let exported = TraceId::from_otel(span.context().span().span_context().trace_id());
    let trace_id =
        exported.or_else(|| traceparent.and_then(TraceId::from_traceparent)).unwrap_or_else(TraceId::random);
    span.record("trace_id", trace_id.as_str());
    let response = with_trace_id(trace_id, next.run(request).instrument(span.clone())).await;
    span.record("http.response.status_code", response.status().as_u16());
    response
}
