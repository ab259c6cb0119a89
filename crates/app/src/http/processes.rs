//! The background process routes: start, list, read one, its output (NDJSON, replayed
//! then followed), its standard input, signals. Each parses, calls one use case
//! ([`crate::usecase`]'s processes) and maps.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use domain::exec::MAX_EXEC_TIMEOUT_MS;
use domain::{OrgId, ProcessInfo, ProcessRequest, SandboxId, Signal};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::dto::{Id, SandboxId as SandboxIdSchema, argv_schema, whole_number};
use super::error::{ApiError, ErrorBody};
use super::ndjson::{NDJSON, StreamFrame, body, operation_error, streamed};
use crate::usecase;

/// The path of a background process.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProcessPath {
    /// The org the sandbox belongs to.
    #[param(value_type = Id)]
    pub org: String,
    /// The sandbox.
    #[param(value_type = SandboxIdSchema)]
    pub sandbox_id: String,
    /// The process's pid inside the sandbox.
    #[param(minimum = 1, maximum = 2_147_483_647, format = Int32)]
    pub pid: u32,
}

fn process_timeout_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64)))
        .minimum(Some(1))
        .maximum(Some(MAX_EXEC_TIMEOUT_MS as f64))
        .description(Some(format!(
            "Wall-clock limit in milliseconds, 1 to {MAX_EXEC_TIMEOUT_MS}; absent or null: none (the process \
             runs until it ends, is signalled, or its sandbox ends)."
        )))
        .into()
}

/// A background process to start.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcessBody {
    /// The program and its arguments.
    #[schema(schema_with = argv_schema)]
    pub argv: Vec<String>,
    /// Text written to its standard input first (the input stays open).
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds.
    #[schema(schema_with = process_timeout_schema)]
    #[serde(default, deserialize_with = "whole_number")]
    pub timeout_ms: Option<u64>,
}

/// A background process.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProcessBody {
    /// Its pid inside the sandbox (and its process group's id).
    pub pid: u32,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit status once ended (`128 + signal` when a signal ended it); null while it
    /// runs.
    pub exit_code: Option<i32>,
    /// Whether its timeout ended it.
    pub timed_out: bool,
    /// The terminal it runs on (`term_…`, see the terminal routes); null for a process
    /// started without one.
    #[schema(value_type = Option<super::terminals::TerminalIdSchema>)]
    pub terminal: Option<String>,
}

impl From<ProcessInfo> for ProcessBody {
    fn from(p: ProcessInfo) -> Self {
        Self {
            pid: p.pid,
            argv: p.argv,
            running: p.running,
            exit_code: p.exit_code,
            timed_out: p.timed_out,
            terminal: p.terminal.map(|t| t.as_str().to_owned()),
        }
    }
}

/// The sandbox's background processes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProcessListBody {
    /// Running ones and ended ones the sandbox still keeps, by pid.
    pub processes: Vec<ProcessBody>,
}

/// A signal to send.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalBody {
    /// `TERM`, `INT` or `KILL` (sent to the process's whole group).
    #[schema(schema_with = signal_schema)]
    pub signal: String,
}

fn signal_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(Signal::ALL.iter().map(|s| s.as_str())))
        .into()
}

/// The query of an output read.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct OutputQuery {
    /// After the buffered output, go on with the output as it arrives until the process
    /// ends (default false: end after what is buffered).
    pub follow: Option<bool>,
}

/// The query of a write to standard input.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct StdinQuery {
    /// Close the input after the bytes (default false).
    pub close: Option<bool>,
}

/// The schema of a raw request body.
pub struct RawBytes;

impl utoipa::PartialSchema for RawBytes {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Binary)))
            .description(Some("Raw bytes."))
            .into()
    }
}

impl ToSchema for RawBytes {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("RawBytes")
    }
}

pub(super) fn ids(org: String, sandbox_id: String) -> Result<(OrgId, SandboxId), ApiError> {
    Ok((OrgId::parse(org)?, SandboxId::parse(sandbox_id)?))
}

fn pid_of(pid: u32) -> Result<u32, ApiError> {
    if pid == 0 || pid > i32::MAX as u32 {
        return Err(ApiError::invalid(format!("pid {pid} is not between 1 and {}", i32::MAX)));
    }
    Ok(pid)
}

/// Start a background process.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes", tag = "processes",
    params(super::dto::SandboxPath),
    request_body = StartProcessBody,
    responses(
        (status = 201, description = "started; it outlives this request (and a restart of the server), not the sandbox", body = ProcessBody),
        (status = 400, description = "an id in the path, or the command, breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such program in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready, or the program cannot be started (not executable)", body = ErrorBody),
        (status = 429, description = "resource_exhausted: a command quota of the org's policy is used up (a background process holds its place until it ends), resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes), or the sandbox keeps its most background processes, all running, or their output buffers are used up", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn start_process(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Json(b): Json<StartProcessBody>,
) -> Result<(StatusCode, Json<ProcessBody>), ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let request = ProcessRequest::new(b.argv, b.stdin.unwrap_or_default().into_bytes(), b.timeout_ms)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    let info = usecase::start_process(&state.deps, &principal.0, &org, &sandbox_id, &request)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok((StatusCode::CREATED, Json(info.into())))
}

/// List the sandbox's background processes.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes", tag = "processes",
    params(super::dto::SandboxPath),
    responses(
        (status = 200, description = "running ones, and ended ones the sandbox still keeps", body = ProcessListBody),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_processes(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
) -> Result<Json<ProcessListBody>, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let list = usecase::list_processes(&state.deps, &principal.0, &org, &sandbox_id)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(Json(ProcessListBody { processes: list.into_iter().map(Into::into).collect() }))
}

/// Read one background process.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}", tag = "processes",
    params(ProcessPath),
    responses(
        (status = 200, description = "the process", body = ProcessBody),
        (status = 400, description = "an id or the pid in the path breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such process in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_process(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, pid)): Path<(String, String, u32)>,
) -> Result<Json<ProcessBody>, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let pid = pid_of(pid)?;
    let info = usecase::get_process(&state.deps, &principal.0, &org, &sandbox_id, pid)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(Json(info.into()))
}

/// A background process's output as NDJSON: from the start of its buffer; with
/// `follow=true`, then as it arrives until it ends (the last line is its exit). Going
/// away stops the reading, never the process.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/output", tag = "processes",
    params(ProcessPath, OutputQuery),
    responses(
        (status = 200, description = "one StreamFrame a line: stdout and stderr frames, then the exit once the process has ended (without follow, a running process's stream ends after its buffered output, with no exit line)", content_type = "application/x-ndjson", body = StreamFrame),
        (status = 400, description = "an id or the pid in the path breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such process in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn process_output(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, pid)): Path<(String, String, u32)>,
    Query(q): Query<OutputQuery>,
) -> Result<Response, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let pid = pid_of(pid)?;
    let follow = q.follow.unwrap_or(false);
    let stream = usecase::process_output(&state.deps, &principal.0, &org, &sandbox_id, pid, follow)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(streamed(NDJSON, body(stream, &state.shutdown, None), None))
}

/// Write to a running background process's standard input (the raw body), then close it
/// with `close=true`.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/stdin", tag = "processes",
    params(ProcessPath, StdinQuery),
    request_body(content = Option<RawBytes>, content_type = "application/octet-stream", description = "the bytes to write (any content type; none: nothing, e.g. only to close), at most `http.body_limit_bytes`"),
    responses(
        (status = 204, description = "written (and closed, when asked)"),
        (status = 400, description = "an id or the pid in the path breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such process in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready, the process has ended, or its input is closed", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn process_stdin(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, pid)): Path<(String, String, u32)>,
    Query(q): Query<StdinQuery>,
    bytes: Bytes,
) -> Result<StatusCode, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let pid = pid_of(pid)?;
    let close = q.close.unwrap_or(false);
    usecase::write_process_stdin(&state.deps, &principal.0, &org, &sandbox_id, pid, &bytes, close)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(StatusCode::NO_CONTENT)
}

/// Send a signal to a running background process's process group.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/signal", tag = "processes",
    params(ProcessPath),
    request_body = SignalBody,
    responses(
        (status = 204, description = "sent"),
        (status = 400, description = "an id or the pid in the path, or the signal, breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's processes", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or no such process in it", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready, or the process has ended", body = ErrorBody),
        (status = 429, description = "resource_exhausted: resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn signal_process(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, pid)): Path<(String, String, u32)>,
    Json(b): Json<SignalBody>,
) -> Result<StatusCode, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let pid = pid_of(pid)?;
    // Exactly the names the schema lists.
    let signal = Signal::ALL
        .into_iter()
        .find(|s| s.as_str() == b.signal)
        .ok_or_else(|| ApiError::invalid(format!("signal {:?} is not one of TERM, INT, KILL", b.signal)))?;
    usecase::signal_process(&state.deps, &principal.0, &org, &sandbox_id, pid, signal)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(StatusCode::NO_CONTENT)
}
