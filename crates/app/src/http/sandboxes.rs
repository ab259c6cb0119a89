//! The sandbox routes: ensure (session, workflow), recover, deprovision, read, exec.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use domain::{
    AgentExecution, ExecRequest, ExecutionId, OrgId, Phase, SandboxId, SandboxKey, SessionId, SnapshotId,
    WorkflowExecution,
};

use super::AppState;
use super::auth::Principal;
use super::dto::{
    EnsureResponse, EnsureSessionRequest, EnsureWorkflowRequest, ExecRequestBody, ExecResponseBody,
    SandboxBody, SandboxPath, SessionPath, WorkflowPath,
};
use super::error::{ApiError, Code, ErrorBody};
use crate::usecase::{
    AccessError, CommandRefusal, DeprovisionError, EnsureError, ExecError, ProvisionError, ProvisionFailure,
    SandboxView, SessionEnsureOutcome, WorkflowEnsureOutcome, chain, deprovision_sandbox,
    ensure_session_sandbox_from, ensure_workflow_sandbox_from, exec_in_sandbox, recover_workflow_sandbox,
};

impl From<AccessError> for ApiError {
    fn from(e: AccessError) -> Self {
        match e {
            AccessError::Denied(denial) => Self::denied(denial.to_string()),
            e @ (AccessError::NotFound { .. } | AccessError::NoSnapshot { .. }) => {
                Self::not_found(e.to_string())
            }
            e @ AccessError::Unavailable(_) => Self::unavailable_from(&e),
        }
    }
}

/// The 503 message of a failed workflow ensure: the posture's prefix and the failed step.
/// What failed below the step (a database's, driver's or kernel's message) is in the log
/// and the audit event, not in the body.
fn workflow_failure_message(failure: &ProvisionFailure) -> String {
    let step = failure.error.to_string();
    if std::error::Error::source(&failure.error).is_some() {
        domain::posture::provisioning_failed_message(&format!("{step}; see the server log"))
    } else {
        domain::posture::provisioning_failed_message(&step)
    }
}

/// Counts an ensure refused by the org's quota of running sandboxes.
fn count_quota_refusal(state: &AppState, org: &OrgId, failure: &ProvisionFailure) {
    if matches!(failure.error, ProvisionError::Quota { .. }) {
        state.metrics.observe_quota_refusal(org.as_str(), "max_sandboxes");
    }
}

fn ready(view: &SandboxView) -> EnsureResponse {
    EnsureResponse::Ready { sandbox: Box::new(SandboxBody::from(view)) }
}

/// Session ensure (non-critical).
#[utoipa::path(
    put, path = "/v1/orgs/{org}/sessions/{session_id}/sandbox", tag = "sandboxes",
    params(SessionPath),
    request_body = EnsureSessionRequest,
    responses(
        (status = 200, description = "ready, failed (with the prefixed message) or disabled", body = EnsureResponse,
            links(
                ("get_sandbox" = (operation_id = "get_sandbox",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("exec" = (operation_id = "exec",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("deprovision_session" = (operation_id = "deprovision_session",
                    parameters(("org" = "$request.path.org"), ("session_id" = "$request.path.session_id")))),
            )),
        (status = 400, description = "an id in the path or body breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act on this key", body = ErrorBody),
        (status = 404, description = "`from_snapshot` names no snapshot the caller may use", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn ensure_session(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, session_id)): Path<(String, String)>,
    Json(body): Json<EnsureSessionRequest>,
) -> Result<Json<EnsureResponse>, ApiError> {
    let org = OrgId::parse(org)?;
    let execution = AgentExecution {
        session_id: SessionId::parse(session_id)?,
        execution_id: ExecutionId::parse(body.execution_id)?,
        phase: Phase::Pending,
        org,
    };
    let from = body.from_snapshot.map(SnapshotId::parse).transpose()?;
    let started = Instant::now();
    let outcome = ensure_session_sandbox_from(&state.deps, &principal.0, &execution, from).await?;
    let (name, response) = match &outcome {
        SessionEnsureOutcome::Ready(view) => ("ready", ready(view)),
        SessionEnsureOutcome::Failed(failure) => {
            count_quota_refusal(&state, &execution.org, failure);
            ("failed", EnsureResponse::Failed { message: failure.message() })
        }
        SessionEnsureOutcome::Disabled => ("disabled", EnsureResponse::Disabled),
    };
    state.metrics.observe_ensure("session", name, started.elapsed().as_secs_f64());
    Ok(Json(response))
}

/// The two critical workflow calls, which differ only in the use case they run.
#[derive(Clone, Copy)]
enum WorkflowCall {
    Ensure,
    Recover,
}

async fn workflow(
    state: &AppState,
    principal: &Principal,
    org: String,
    execution_id: String,
    call: WorkflowCall,
    from: Option<SnapshotId>,
) -> Result<Json<EnsureResponse>, ApiError> {
    let execution = WorkflowExecution {
        org: OrgId::parse(org)?,
        execution_id: ExecutionId::parse(execution_id)?,
        phase: Phase::Pending,
    };
    let actor = &principal.0;
    let started = Instant::now();
    let (kind, result) = match call {
        WorkflowCall::Ensure => {
            ("workflow", ensure_workflow_sandbox_from(&state.deps, actor, &execution, from).await)
        }
        WorkflowCall::Recover => ("recover", recover_workflow_sandbox(&state.deps, actor, &execution).await),
    };
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(WorkflowEnsureOutcome::Ready(view)) => {
            state.metrics.observe_ensure(kind, "ready", secs);
            Ok(Json(ready(&view)))
        }
        Ok(WorkflowEnsureOutcome::Disabled) => {
            state.metrics.observe_ensure(kind, "disabled", secs);
            Ok(Json(EnsureResponse::Disabled))
        }
        Err(EnsureError::Provisioning(failure)) => {
            state.metrics.observe_ensure(kind, "failed", secs);
            count_quota_refusal(state, &execution.org, &failure);
            Err(ApiError::unavailable(workflow_failure_message(&failure)))
        }
        Err(EnsureError::Access(e)) => Err(e.into()),
    }
}

/// Workflow ensure (critical).
#[utoipa::path(
    put, path = "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox", tag = "sandboxes",
    params(WorkflowPath),
    request_body(content = Option<EnsureWorkflowRequest>, description = "optional: `{\"from_snapshot\"}` to fork"),
    responses(
        (status = 200, description = "ready or disabled", body = EnsureResponse,
            links(
                ("get_sandbox" = (operation_id = "get_sandbox",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("exec" = (operation_id = "exec",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("deprovision_workflow" = (operation_id = "deprovision_workflow",
                    parameters(("org" = "$request.path.org"), ("execution_id" = "$request.path.execution_id")))),
            )),
        (status = 400, description = "an id in the path or body breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act on this key", body = ErrorBody),
        (status = 404, description = "`from_snapshot` names no snapshot the caller may use", body = ErrorBody),
        (status = 503, description = "provisioning failed (the message has the prefix)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn ensure_workflow(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, execution_id)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Json<EnsureResponse>, ApiError> {
    // The body is optional: none (or blank) is a plain ensure.
    let from = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        let request: EnsureWorkflowRequest = serde_json::from_slice(&body)
            .map_err(|e| ApiError::invalid(format!("the body is not a workflow ensure request: {e}")))?;
        request.from_snapshot.map(SnapshotId::parse).transpose()?
    };
    workflow(&state, &principal, org, execution_id, WorkflowCall::Ensure, from).await
}

/// Recovery of a FAILED workflow execution: a fresh sandbox, earlier tokens revoked.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox/recover", tag = "sandboxes",
    params(WorkflowPath),
    responses(
        (status = 200, description = "ready (a new sandbox id) or disabled", body = EnsureResponse,
            links(
                ("get_sandbox" = (operation_id = "get_sandbox",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("exec" = (operation_id = "exec",
                    parameters(("org" = "$request.path.org"), ("sandbox_id" = "$response.body#/sandbox/id")))),
                ("deprovision_workflow" = (operation_id = "deprovision_workflow",
                    parameters(("org" = "$request.path.org"), ("execution_id" = "$request.path.execution_id")))),
            )),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act on this key", body = ErrorBody),
        (status = 503, description = "provisioning failed (the message has the prefix)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn recover_workflow(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, execution_id)): Path<(String, String)>,
) -> Result<Json<EnsureResponse>, ApiError> {
    workflow(&state, &principal, org, execution_id, WorkflowCall::Recover, None).await
}

async fn deprovision(
    state: &AppState,
    principal: &Principal,
    key: SandboxKey,
) -> Result<StatusCode, ApiError> {
    match deprovision_sandbox(&state.deps, &principal.0, &key).await {
        Ok(_) => Ok(StatusCode::NO_CONTENT),
        Err(DeprovisionError::Access(e)) => Err(e.into()),
        Err(
            e
            @ (DeprovisionError::Registry(_) | DeprovisionError::Audit(_) | DeprovisionError::Revocation(_)),
        ) => Err(ApiError::dependency(&format!("deprovision failed: {e}"), &e)),
        Err(e @ (DeprovisionError::Driver(_) | DeprovisionError::Task)) => {
            Err(ApiError::internal(format!("deprovision failed: {}", chain(&e))))
        }
    }
}

/// Deprovision a session's sandbox (terminal FAILED). Idempotent.
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/sessions/{session_id}/sandbox", tag = "sandboxes",
    params(SessionPath),
    responses((status = 204, description = "deprovisioned, or nothing was live"),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act on this key", body = ErrorBody),
        (status = 503, description = "the registry or audit log is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn deprovision_session(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, session_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let key = SandboxKey::Session { org: OrgId::parse(org)?, session_id: SessionId::parse(session_id)? };
    deprovision(&state, &principal, key).await
}

/// Deprovision a workflow execution's sandbox (terminal FAILED). Idempotent.
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox", tag = "sandboxes",
    params(WorkflowPath),
    responses((status = 204, description = "deprovisioned, or nothing was live"),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act on this key", body = ErrorBody),
        (status = 503, description = "the registry or audit log is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn deprovision_workflow(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, execution_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let key =
        SandboxKey::Workflow { org: OrgId::parse(org)?, execution_id: ExecutionId::parse(execution_id)? };
    deprovision(&state, &principal, key).await
}

/// Read a sandbox.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}", tag = "sandboxes",
    params(SandboxPath),
    responses((status = 200, description = "the sandbox", body = SandboxBody),
        (status = 400, description = "an id in the path breaks the id rules", body = ErrorBody),
        (status = 403, description = "the caller may not act in this org", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 503, description = "the registry is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn get_sandbox(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
) -> Result<Json<SandboxBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let view = crate::usecase::get_sandbox(&state.deps, &principal.0, &org, &sandbox_id).await?;
    Ok(Json(SandboxBody::from(&view)))
}

/// Run a command inside a sandbox. With `Accept: application/x-ndjson` its output is
/// streamed as it arrives, one StreamFrame a line, the last its exit; a client that goes
/// away ends the command.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/exec", tag = "sandboxes",
    params(SandboxPath),
    request_body = ExecRequestBody,
    responses((status = 200, description = "the command ran (whatever its exit code): its output collected (application/json), or streamed (application/x-ndjson: stdout and stderr frames as output arrives, then the exit frame; an error frame if the stream breaks off)", content(
            (ExecResponseBody = "application/json"),
            (super::ndjson::StreamFrame = "application/x-ndjson"),
        )),
        (status = 400, description = "an id in the path, or the command, breaks the rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready", body = ErrorBody),
        (status = 429, description = "a command quota is used up, or resuming the suspended sandbox would pass the org's quota", body = ErrorBody),
        (status = 503, description = "the driver or registry is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn exec(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<ExecRequestBody>,
) -> Result<Response, ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let request = ExecRequest::new(body.argv, body.stdin.unwrap_or_default().into_bytes(), body.timeout_ms)
        .map_err(|e| ApiError::invalid(e.to_string()))?;
    if super::ndjson::wants_ndjson(&headers) {
        return super::ndjson::exec_streamed(&state, &principal, &org, &sandbox_id, &request).await;
    }
    let started = Instant::now();
    let result = exec_in_sandbox(&state.deps, &principal.0, &org, &sandbox_id, &request).await;
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(out) => {
            state.metrics.observe_exec(if out.timed_out { "timed_out" } else { "ok" }, secs);
            Ok(Json(ExecResponseBody {
                exit_code: out.exit_code,
                stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
                stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
                timed_out: out.timed_out,
                truncated: out.truncated,
            })
            .into_response())
        }
        Err(e) => Err(exec_failure(&state, &org, secs, e)),
    }
}

/// The API's answer to a failed exec (shared by the route and the MCP tool), counting
/// quota refusals and driver errors in the metrics.
pub(crate) fn exec_failure(state: &AppState, org: &OrgId, secs: f64, e: ExecError) -> ApiError {
    match e {
        ExecError::Access(e) => e.into(),
        e @ ExecError::NotReady { .. } => ApiError::new(Code::Conflict, e.to_string()),
        ExecError::Busy(refusal @ (CommandRefusal::Org { .. } | CommandRefusal::Sandbox { .. })) => {
            let quota = if matches!(refusal, CommandRefusal::Org { .. }) {
                "max_commands"
            } else {
                "max_commands_per_sandbox"
            };
            state.metrics.observe_quota_refusal(org.as_str(), quota);
            ApiError::new(Code::ResourceExhausted, refusal.to_string())
        }
        e @ ExecError::OverQuota { .. } => {
            state.metrics.observe_quota_refusal(org.as_str(), "max_sandboxes");
            ApiError::new(Code::ResourceExhausted, chain(&e))
        }
        e @ (ExecError::Gone(_)
        | ExecError::Driver(_)
        | ExecError::Resume { .. }
        | ExecError::Busy(CommandRefusal::Store(_))
        | ExecError::Policy(_)
        | ExecError::Activity(_)) => {
            state.metrics.observe_exec("error", secs);
            match &e {
                // The driver's answers about the command itself stay the caller's.
                ExecError::Driver(d)
                    if !matches!(d, ports::DriverError::Unavailable(_) | ports::DriverError::Failed(_)) =>
                {
                    ApiError::unavailable(chain(&e))
                }
                _ => ApiError::unavailable_from(&e),
            }
        }
    }
}
