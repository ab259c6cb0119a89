//! Traces and trace ids: the OTLP exporter of `tracing`'s spans (built only when
//! `otlp.endpoint` is set), the W3C `traceparent` a request continues, the trace id every
//! request carries (in its log lines and its error body), and the JSON log format that
//! prints it. The binary (or an embedding host) installs the subscriber; this module only
//! builds its parts.

use std::fmt;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use serde::{Deserialize, Serialize};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime as _, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The OTLP exporter's settings (`[otlp]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpSettings {
    /// The collector's OTLP/HTTP base URL (`http://collector:4318`; `/v1/traces` is
    /// added unless the URL already ends with it). Unset: no traces are exported and no
    /// exporter is built.
    pub endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
    /// The longest one export may take, in milliseconds.
    pub timeout_ms: u64,
}

impl Default for OtlpSettings {
    fn default() -> Self {
        Self { endpoint: None, service_name: "sandlane".into(), timeout_ms: 10_000 }
    }
}

impl OtlpSettings {
    /// The URL spans are posted to, when an endpoint is set.
    pub fn traces_url(&self) -> Option<String> {
        let base = self.endpoint.as_deref().map(str::trim).filter(|e| !e.is_empty())?;
        let base = base.trim_end_matches('/');
        Some(if base.ends_with("/v1/traces") { base.to_owned() } else { format!("{base}/v1/traces") })
    }
}

/// Why the exporter could not be built.
#[derive(Debug, thiserror::Error)]
#[error("cannot build the OTLP exporter for {endpoint}: {message}")]
pub struct TelemetryError {
    endpoint: String,
    message: String,
}

/// The exporter's owner: flushes and stops it on [`Traces::shutdown`].
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Builds the exporter (a batch processor on the current tokio runtime, posting OTLP
    /// protobuf over HTTP with hyper's client) when `settings` names an endpoint; `None`
    /// otherwise, building nothing. Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`TelemetryError`] when the endpoint is not a URL the exporter takes.
    pub fn build(settings: &OtlpSettings) -> Result<Option<Self>, TelemetryError> {
        let Some(url) = settings.traces_url() else { return Ok(None) };
        let fail = |message: String| TelemetryError { endpoint: url.clone(), message };
        if !(url.starts_with("http://")) {
            return Err(fail("only http:// endpoints are supported (a collector beside the server)".into()));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(Duration::from_millis(settings.timeout_ms))
            .with_headers(Default::default())
            .build()
            .map_err(|e| fail(e.to_string()))?;
        let processor = BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
        let provider = SdkTracerProvider::builder()
            // Every span is exported: the default sampler follows a remote parent's
            // sampled flag, so any caller (one without a credential too) could take its
            // requests out of the export with a `traceparent` ending in `-00`.
            .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
            .with_span_processor(processor)
            .with_resource(Resource::builder().with_service_name(settings.service_name.clone()).build())
            .build();
        Ok(Some(Self { provider }))
    }

    /// The `tracing` layer that turns spans into OpenTelemetry spans for this exporter.
    pub fn layer<S>(&self) -> impl Layer<S> + Send + Sync + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a> + Send + Sync,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("sandlane"))
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
    }

    /// Exports what is buffered and stops the exporter; blocks (call it off the runtime's
    /// workers, with the runtime still running).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("sandlane: the trace exporter did not stop cleanly: {e}");
        }
    }
}

/// A W3C trace id (32 lowercase hex digits, not all zero).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceId(String);

impl TraceId {
    /// A new random trace id.
    pub fn random() -> Self {
        let mut bytes = [0u8; 16];
        if getrandom::fill(&mut bytes).is_err() || bytes == [0; 16] {
            bytes[15] = 1;
        }
        Self(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// The trace id of a `traceparent` header's value (version `00` and later, per W3C
    /// Trace Context), when it is well formed.
    pub fn from_traceparent(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let parent = parts.next()?;
        let flags = parts.next()?;
        let hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(parent, 16) || !hex(flags, 2) {
            return None;
        }
        if (version == "00" && parts.next().is_some())
            || trace.bytes().all(|b| b == b'0')
            || parent.bytes().all(|b| b == b'0')
        {
            return None;
        }
        Some(Self(trace.to_owned()))
    }

    /// From an OpenTelemetry trace id, when valid.
    pub fn from_otel(id: opentelemetry::trace::TraceId) -> Option<Self> {
        (id != opentelemetry::trace::TraceId::INVALID).then(|| Self(id.to_string()))
    }

    /// The 32 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

tokio::task_local! {
    /// The trace id of the request being served (set by the HTTP layer for the request's
    /// whole handling).
    static REQUEST_TRACE_ID: TraceId;
}

/// Runs `work` with `trace_id` as the request's trace id ([`current_trace_id`]).
pub async fn with_trace_id<F: Future>(trace_id: TraceId, work: F) -> F::Output {
    REQUEST_TRACE_ID.scope(trace_id, work).await
}

/// The trace id of the request being served on this task, if any.
pub fn current_trace_id() -> Option<TraceId> {
    REQUEST_TRACE_ID.try_with(Clone::clone).ok()
}

/// The trace id a span carries in its `trace_id` field, kept for the log format.
struct SpanTraceId(String);

/// A layer that keeps each span's `trace_id` field where [`JsonLog`] finds it, so every
/// log line inside a request carries its trace id.
#[derive(Debug, Default, Clone, Copy)]
pub struct TraceIdLayer;

struct TraceIdVisitor(Option<String>);

impl Visit for TraceIdVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "trace_id" {
            self.0 = Some(value.to_owned());
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "trace_id" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

impl<S> Layer<S> for TraceIdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut visitor = TraceIdVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(value), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut().replace(SpanTraceId(value));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut visitor = TraceIdVisitor(None);
        values.record(&mut visitor);
        if let (Some(value), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut().replace(SpanTraceId(value));
        }
    }
}

/// The JSON log format: one object a line, as `tracing-subscriber`'s JSON format
/// (`timestamp`, `level`, `fields`, `target`, `span`, `spans`) with the request's
/// `trace_id` at the top level when the line is written inside a request. Use with
/// [`JsonFields`] and [`TraceIdLayer`].
#[derive(Debug, Default, Clone, Copy)]
pub struct JsonLog;

struct JsonVisitor(serde_json::Map<String, serde_json::Value>);

impl Visit for JsonVisitor {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().to_owned(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().to_owned(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}").into());
    }
}

impl<S, N> FormatEvent<S, N> for JsonLog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        use serde_json::{Map, Value};
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), event.metadata().level().as_str().into());
        let mut fields = JsonVisitor(Map::new());
        event.record(&mut fields);
        line.insert("fields".into(), Value::Object(fields.0));
        line.insert("target".into(), event.metadata().target().into());
        let mut spans = Vec::new();
        let mut trace_id = None;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                let mut object = extensions
                    .get::<FormattedFields<N>>()
                    .and_then(|f| serde_json::from_str::<Map<String, Value>>(f.as_str()).ok())
                    .unwrap_or_default();
                object.insert("name".into(), span.name().into());
                if let Some(SpanTraceId(id)) = extensions.get::<SpanTraceId>() {
                    trace_id = Some(id.clone());
                }
                spans.push(Value::Object(object));
            }
        }
        if let Some(current) = spans.last() {
            line.insert("span".into(), current.clone());
        }
        if !spans.is_empty() {
            line.insert("spans".into(), Value::Array(spans));
        }
        if let Some(id) = trace_id.or_else(|| current_trace_id().map(|t| t.0)) {
            line.insert("trace_id".into(), id.into());
        }
        let text = serde_json::to_string(&Value::Object(line)).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// The field formatter [`JsonLog`] expects for spans' fields.
pub fn json_fields() -> JsonFields {
    JsonFields::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_parsed_per_w3c() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(TraceId::from_traceparent(good).unwrap().as_str(), "4bf92f3577b34da6a3ce929d0e0e4736");
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert!(TraceId::from_traceparent(bad).is_none(), "{bad}");
        }
        // A later version may carry more fields.
        assert!(
            TraceId::from_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x").is_some()
        );
    }

    #[test]
    fn random_trace_ids_are_32_hex_digits_and_differ() {
        let (a, b) = (TraceId::random(), TraceId::random());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn the_traces_url_gets_its_path_once() {
        let with =
            |e: &str| OtlpSettings { endpoint: Some(e.into()), ..OtlpSettings::default() }.traces_url();
        assert_eq!(with("http://c:4318").as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(with("http://c:4318/").as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(with("http://c:4318/v1/traces").as_deref(), Some("http://c:4318/v1/traces"));
        assert_eq!(with("  ").as_deref(), None);
        assert_eq!(OtlpSettings::default().traces_url(), None);
    }

    #[tokio::test]
    async fn no_endpoint_builds_no_exporter() {
        assert!(Traces::build(&OtlpSettings::default()).unwrap().is_none());
    }

    #[test]
    fn json_lines_carry_the_trace_id_of_their_request_span() {
        use std::sync::{Arc, Mutex};
        use tracing_subscriber::layer::SubscriberExt as _;
        #[derive(Clone, Default)]
        struct Buffer(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buffer {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let subscriber = tracing_subscriber::registry().with(TraceIdLayer).with(
            tracing_subscriber::fmt::layer()
                .event_format(JsonLog)
                .fmt_fields(json_fields())
                .with_writer(move || writer.clone()),
        );
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", trace_id = tracing::field::Empty, route = "/x");
            span.record("trace_id", "4bf92f3577b34da6a3ce929d0e0e4736");
            let _in = span.enter();
            tracing::info_span!("lane", org = "acme").in_scope(|| tracing::info!(n = 3, "inside"));
        });
        tracing::subscriber::with_default(
            tracing_subscriber::registry().with(TraceIdLayer).with(
                tracing_subscriber::fmt::layer().event_format(JsonLog).fmt_fields(json_fields()).with_writer(
                    {
                        let writer = buffer.clone();
                        move || writer.clone()
                    },
                ),
            ),
            || tracing::info!("outside"),
        );
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(lines[0]["fields"]["n"], 3);
        assert_eq!(lines[0]["fields"]["message"], "inside");
        assert_eq!(lines[0]["span"]["org"], "acme");
        assert_eq!(lines[0]["spans"][0]["route"], "/x");
        assert!(lines[1].get("trace_id").is_none());
    }
}
