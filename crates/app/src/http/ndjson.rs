//! Output streamed as NDJSON (`application/x-ndjson`): one JSON object a line, written
//! and flushed as each frame arrives, nothing buffered in the server beyond the frame at
//! hand. The lines are [`StreamFrame`]s; how bytes stay exact is said on
//! [`StreamFrame::Stdout`].
//!
//! Also what every streaming and file route shares: the mapping of an operation's error
//! onto the API's codes, and the shutdown signal long-lived responses end on.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use domain::OutputEvent;
use ports::{ByteSource, DriverError, OutputStream, SourceError};
use serde::Serialize;
use tokio::sync::watch;
use utoipa::ToSchema;

use super::error::{ApiError, Code};
use crate::usecase::{CommandRefusal, ExecError, OperationError, chain};

/// The media type of a streamed response.
pub const NDJSON: &str = "application/x-ndjson";

/// One line of a streamed output: bytes as they arrive, then how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum StreamFrame {
    /// Bytes written to standard output. Exactly one of `text` and `data` is present:
    /// `text` when the bytes are UTF-8 (a character split between two writes is held
    /// back until it is whole, so text stays text), `data` (standard base64, padded)
    /// otherwise. The concatenation of every frame's bytes is exactly what was written.
    #[schema(title = "StdoutFrame")]
    Stdout {
        /// The bytes, when they are UTF-8.
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The bytes in base64, when they are not UTF-8.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(content_encoding = "base64")]
        data: Option<String>,
    },
    /// Bytes written to standard error, as [`StreamFrame::Stdout`].
    #[schema(title = "StderrFrame")]
    Stderr {
        /// The bytes, when they are UTF-8.
        #[serde(skip_serializing_if = "Option::is_none")]
        text: Option<String>,
        /// The bytes in base64, when they are not UTF-8.
        #[serde(skip_serializing_if = "Option::is_none")]
        #[schema(content_encoding = "base64")]
        data: Option<String>,
    },
    /// The command ended: the last line of a stream that ran to the end.
    #[schema(title = "ExitFrame")]
    Exit {
        /// The exit status (`128 + signal` when a signal ended it).
        exit_code: i32,
        /// Whether its timeout killed it.
        timed_out: bool,
        /// Whether output was left out: past the output cap (exec), or dropped from a
        /// background process's buffer before this reader got it.
        truncated: bool,
    },
    /// The stream broke off (the sandbox went away, the server is stopping): the last
    /// line; the command may still run (a background process does).
    #[schema(title = "ErrorFrame")]
    Error {
        /// The error's code.
        error: Code,
        /// What happened.
        message: String,
    },
}

/// Turns output events into lines, holding back a UTF-8 character split across events.
#[derive(Default)]
pub struct Encoder {
    /// The incomplete character at the end of the last stdout and stderr bytes.
    carry: [Vec<u8>; 2],
}

fn line(frame: &StreamFrame) -> Bytes {
    let mut bytes = serde_json::to_vec(frame).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

fn frame(stderr: bool, text: Option<String>, data: Option<String>) -> StreamFrame {
    if stderr { StreamFrame::Stderr { text, data } } else { StreamFrame::Stdout { text, data } }
}

impl Encoder {
    fn bytes(&mut self, stderr: bool, bytes: Vec<u8>, out: &mut Vec<Bytes>) {
        let carry = &mut self.carry[usize::from(stderr)];
        let mut all = std::mem::take(carry);
        all.extend_from_slice(&bytes);
        match std::str::from_utf8(&all) {
            Ok(text) => out.push(line(&frame(stderr, Some(text.to_owned()), None))),
            // Only an incomplete character at the end: keep it for the next bytes.
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                *carry = all.split_off(valid);
                if !all.is_empty() {
                    out.push(line(&frame(stderr, Some(String::from_utf8_lossy(&all).into_owned()), None)));
                }
            }
            Err(_) => {
                let data = base64::engine::general_purpose::STANDARD.encode(&all);
                out.push(line(&frame(stderr, None, Some(data))));
            }
        }
    }

    /// What is held back, as `data` lines (the stream ends, or the bytes never completed).
    fn flush(&mut self, out: &mut Vec<Bytes>) {
        for (i, carry) in self.carry.iter_mut().enumerate() {
            if !carry.is_empty() {
                let data = base64::engine::general_purpose::STANDARD.encode(std::mem::take(carry));
                out.push(line(&frame(i == 1, None, Some(data))));
            }
        }
    }

    /// The lines of one event.
    pub fn push(&mut self, event: OutputEvent) -> Vec<Bytes> {
        let mut out = Vec::new();
        match event {
            OutputEvent::Stdout(bytes) => self.bytes(false, bytes, &mut out),
            OutputEvent::Stderr(bytes) => self.bytes(true, bytes, &mut out),
            OutputEvent::Exit(exit) => {
                self.flush(&mut out);
                out.push(line(&StreamFrame::Exit {
                    exit_code: exit.exit_code,
                    timed_out: exit.timed_out,
                    truncated: exit.truncated,
                }));
            }
        }
        out
    }

    /// The lines that end a stream without an exit: what is held back, then `error`.
    pub fn end(&mut self, error: Option<ApiError>) -> Vec<Bytes> {
        let mut out = Vec::new();
        self.flush(&mut out);
        if let Some(e) = error {
            out.push(line(&StreamFrame::Error { error: e.code, message: e.message }));
        }
        out
    }
}

/// Tells long-lived responses (followed output, streamed commands) that the server is
/// stopping, so they end with an `error` line and a graceful shutdown is not held up.
#[derive(Debug, Clone)]
pub struct Shutdown(Arc<watch::Sender<bool>>);

impl Default for Shutdown {
    fn default() -> Self {
        Self(Arc::new(watch::channel(false).0))
    }
}

impl Shutdown {
    /// Says the server is stopping.
    pub fn begin(&self) {
        self.0.send_replace(true);
    }

    /// Completes once the server is stopping.
    pub fn stopping(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|stopping| *stopping).await;
        }
    }
}

/// Called once a stream ends, with how it ended (`None`: it broke off).
pub type OnEnd = Box<dyn FnOnce(Option<domain::ExitStatus>) + Send>;

/// The body of an NDJSON response over `stream`: a line per frame as it arrives; an
/// `error` line when the stream breaks off or the server stops. Dropping the body (the
/// client went away) drops the stream, which ends what it reads from.
pub fn body(stream: Box<dyn OutputStream>, shutdown: &Shutdown, on_end: Option<OnEnd>) -> Body {
    struct State {
        stream: Box<dyn OutputStream>,
        encoder: Encoder,
        pending: VecDeque<Bytes>,
        done: bool,
        stopping: std::pin::Pin<Box<dyn Future<Output = ()> + Send>>,
        on_end: Option<OnEnd>,
    }
    let state = State {
        stream,
        encoder: Encoder::default(),
        pending: VecDeque::new(),
        done: false,
        stopping: Box::pin(shutdown.stopping()),
        on_end,
    };
    let lines = futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(line) = s.pending.pop_front() {
                return Some((Ok::<_, std::io::Error>(line), s));
            }
            if s.done {
                return None;
            }
            tokio::select! {
                next = s.stream.next() => match next {
                    Ok(Some(event)) => {
                        let exit = match &event {
                            OutputEvent::Exit(exit) => Some(*exit),
                            _ => None,
                        };
                        s.pending.extend(s.encoder.push(event));
                        if let Some(exit) = exit {
                            s.done = true;
                            if let Some(on_end) = s.on_end.take() {
                                on_end(Some(exit));
                            }
                        }
                    }
                    Ok(None) => {
                        s.done = true;
                        s.pending.extend(s.encoder.end(None));
                    }
                    Err(e) => {
                        s.done = true;
                        if let Some(on_end) = s.on_end.take() {
                            on_end(None);
                        }
                        s.pending.extend(s.encoder.end(Some(driver_error(e))));
                    }
                },
                () = &mut s.stopping => {
                    s.done = true;
                    let stop = ApiError::unavailable("the server is stopping; ask again");
                    s.pending.extend(s.encoder.end(Some(stop)));
                }
            }
        }
    });
    Body::from_stream(lines)
}

/// A 200 response of `body` with `content_type`.
pub fn streamed(content_type: &'static str, body: Body, length: Option<u64>) -> Response {
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(length) = length {
        headers.insert(axum::http::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    (StatusCode::OK, headers, body).into_response()
}

/// Whether the request asks for NDJSON (`Accept: application/x-ndjson`).
pub fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| item.split(';').next().is_some_and(|media| media.trim().eq_ignore_ascii_case(NDJSON)))
}

/// The API's error for a driver's.
pub fn driver_error(e: DriverError) -> ApiError {
    match e {
        e @ (DriverError::NoSuchProcess { .. } | DriverError::NoSuchPath(_)) => {
            ApiError::not_found(e.to_string())
        }
        e @ DriverError::Invalid(_) => ApiError::invalid(e.to_string()),
        e @ DriverError::Conflict(_) => ApiError::new(Code::Conflict, e.to_string()),
        e @ DriverError::TooLarge(_) => ApiError::new(Code::TooLarge, e.to_string()),
        e @ DriverError::ResourceExhausted(_) => ApiError::new(Code::ResourceExhausted, e.to_string()),
        e @ DriverError::Source(_) => ApiError::invalid(chain(&e)),
        e @ (DriverError::NotFound(_) | DriverError::Unsupported(_)) => ApiError::unavailable(e.to_string()),
        // Their text is the driver's, the engine's or the kernel's: for the log only.
        e @ (DriverError::Unavailable(_) | DriverError::Failed(_)) => {
            ApiError::dependency("the sandbox's driver failed", &e)
        }
    }
}

impl From<OperationError> for ApiError {
    fn from(e: OperationError) -> Self {
        match e {
            OperationError::Access(e) => e.into(),
            e @ OperationError::NotReady { .. } => Self::new(Code::Conflict, e.to_string()),
            e @ OperationError::Gone(_) => Self::unavailable(e.to_string()),
            e @ OperationError::TooLarge { .. } => Self::new(Code::TooLarge, e.to_string()),
            e @ OperationError::Invalid(_) => Self::invalid(e.to_string()),
            OperationError::Driver(e) => driver_error(e),
            e @ (OperationError::Busy(CommandRefusal::Org { .. } | CommandRefusal::Sandbox { .. })
            | OperationError::OverQuota { .. }
            | OperationError::FilesBusy { .. }) => Self::new(Code::ResourceExhausted, chain(&e)),
            e @ (OperationError::Resume { .. }
            | OperationError::Busy(CommandRefusal::Store(_))
            | OperationError::Policy(_)
            | OperationError::Activity(_)
            | OperationError::Tickets(_)) => Self::unavailable_from(&e),
            e @ OperationError::NoSuchTerminal { .. } => Self::not_found(e.to_string()),
        }
    }
}

/// The API's error for an operation inside a sandbox, counting a quota's refusal in the
/// metrics (by org and quota).
pub fn operation_error<'a>(
    state: &'a super::AppState,
    org: &'a domain::OrgId,
) -> impl FnOnce(OperationError) -> ApiError + 'a {
    move |e| {
        if let Some(quota) = e.quota() {
            state.metrics.observe_quota_refusal(org.as_str(), quota);
        }
        e.into()
    }
}

/// The API's error for an exec that did not start.
pub fn exec_error(e: ExecError) -> ApiError {
    match e {
        ExecError::Access(e) => e.into(),
        e @ ExecError::NotReady { .. } => ApiError::new(Code::Conflict, e.to_string()),
        e @ (ExecError::Busy(CommandRefusal::Org { .. } | CommandRefusal::Sandbox { .. })
        | ExecError::OverQuota { .. }) => ApiError::new(Code::ResourceExhausted, chain(&e)),
        e @ (ExecError::Gone(_)
        | ExecError::Resume { .. }
        | ExecError::Busy(CommandRefusal::Store(_))
        | ExecError::Policy(_)
        | ExecError::Activity(_)) => ApiError::unavailable_from(&e),
        ExecError::Driver(e) => driver_error(e),
    }
}

/// A streamed exec: the response's head once the command started, then its output.
///
/// # Errors
/// As the buffered exec, before anything is streamed.
pub async fn exec_streamed(
    state: &super::AppState,
    principal: &super::auth::Principal,
    org: &domain::OrgId,
    sandbox_id: &domain::SandboxId,
    request: &domain::ExecRequest,
) -> Result<Response, ApiError> {
    let started = std::time::Instant::now();
    let stream =
        match crate::usecase::exec_stream_in_sandbox(&state.deps, &principal.0, org, sandbox_id, request)
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                if let Some(quota) = e.quota() {
                    state.metrics.observe_quota_refusal(org.as_str(), quota);
                }
                if matches!(
                    e,
                    ExecError::Gone(_)
                        | ExecError::Driver(_)
                        | ExecError::Resume { .. }
                        | ExecError::Busy(CommandRefusal::Store(_))
                        | ExecError::Policy(_)
                        | ExecError::Activity(_)
                ) {
                    state.metrics.observe_exec("error", started.elapsed().as_secs_f64());
                }
                return Err(exec_error(e));
            }
        };
    let metrics = state.metrics.clone();
    let on_end: OnEnd = Box::new(move |exit| {
        let outcome = match exit {
            Some(exit) if exit.timed_out => "timed_out",
            Some(_) => "ok",
            None => "error",
        };
        metrics.observe_exec(outcome, started.elapsed().as_secs_f64());
    });
    Ok(streamed(NDJSON, body(stream, &state.shutdown, Some(on_end)), None))
}

/// A request body as the bytes of an upload (empty chunks skipped).
pub struct BodySource(pub axum::body::BodyDataStream);

#[async_trait::async_trait]
impl ByteSource for BodySource {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        use futures_util::StreamExt;
        loop {
            match self.0.next().await {
                Some(Ok(bytes)) if bytes.is_empty() => {}
                Some(Ok(bytes)) => return Ok(Some(bytes.to_vec())),
                Some(Err(e)) => return Err(SourceError(format!("the request body broke off: {e}"))),
                None => return Ok(None),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use domain::ExitStatus;

    use super::*;

    fn decode(lines: &[Bytes]) -> (Vec<u8>, Vec<serde_json::Value>) {
        let mut bytes = Vec::new();
        let mut frames = Vec::new();
        for l in lines {
            assert_eq!(l.last(), Some(&b'\n'), "one object a line");
            let v: serde_json::Value = serde_json::from_slice(l).unwrap();
            match (v["text"].as_str(), v["data"].as_str()) {
                (Some(t), None) => bytes.extend(t.as_bytes()),
                (None, Some(d)) => bytes.extend(base64::engine::general_purpose::STANDARD.decode(d).unwrap()),
                (None, None) => {}
                both => panic!("both text and data: {both:?}"),
            }
            frames.push(v);
        }
        (bytes, frames)
    }

    #[test]
    fn bytes_round_trip_exactly_and_text_stays_text_across_a_split_character() {
        let mut e = Encoder::default();
        let snow = "é☃".as_bytes().to_vec(); // 2 + 3 bytes
        let mut lines = e.push(OutputEvent::Stdout(snow[..3].to_vec()));
        lines.extend(e.push(OutputEvent::Stdout(snow[3..].to_vec())));
        let binary = vec![0xff, 0x00, 0xfe, b'a'];
        lines.extend(e.push(OutputEvent::Stderr(binary.clone())));
        lines.extend(e.push(OutputEvent::Stdout(vec![0xe2, 0x98])));
        lines.extend(e.push(OutputEvent::Exit(ExitStatus {
            exit_code: 3,
            timed_out: false,
            truncated: true,
        })));
        let (_, frames) = decode(&lines);
        assert_eq!(frames[0], serde_json::json!({"type": "stdout", "text": "é"}));
        assert_eq!(frames[1], serde_json::json!({"type": "stdout", "text": "☃"}));
        assert_eq!(frames[2]["type"], "stderr");
        assert_eq!(frames[2]["data"], "/wD+YQ==");
        // The held-back bytes come out as data before the exit.
        assert_eq!(frames[3], serde_json::json!({"type": "stdout", "data": "4pg="}));
        assert_eq!(
            frames[4],
            serde_json::json!({"type": "exit", "exit_code": 3, "timed_out": false, "truncated": true})
        );
        let stdout: Vec<Bytes> =
            lines.iter().filter(|l| l.starts_with(br#"{"type":"stdout""#)).cloned().collect();
        let (bytes, _) = decode(&stdout);
        assert_eq!(bytes, [snow, vec![0xe2, 0x98]].concat());
    }

    #[test]
    fn arbitrary_bytes_in_arbitrary_pieces_come_back_exactly() {
        let all: Vec<u8> = (0..2000u32).map(|i| (i * 37 % 256) as u8).chain("ünïcødé".bytes()).collect();
        for size in [1usize, 2, 3, 7, 64, 4096] {
            let mut e = Encoder::default();
            let mut lines = Vec::new();
            for piece in all.chunks(size) {
                lines.extend(e.push(OutputEvent::Stdout(piece.to_vec())));
            }
            lines.extend(e.end(None));
            assert_eq!(decode(&lines).0, all, "pieces of {size}");
        }
    }

    #[test]
    fn accept_negotiation() {
        let mut h = HeaderMap::new();
        assert!(!wants_ndjson(&h));
        h.insert(
            axum::http::header::ACCEPT,
            HeaderValue::from_static("application/json, application/x-ndjson;q=0.9"),
        );
        assert!(wants_ndjson(&h));
        h.insert(axum::http::header::ACCEPT, HeaderValue::from_static("*/*"));
        assert!(!wants_ndjson(&h));
    }
}
