//! The HTTP API v1 (`docs/api.md`): routes, authentication, one JSON error shape for every
//! failure, body limits, per-request timeouts and panic capture.

pub mod audit;
pub mod auth;
pub mod console;
pub mod dto;
pub mod error;
pub mod files;
pub mod isolation;
pub mod listener;
pub mod meta;
pub mod ndjson;
pub mod openapi;
pub mod org_sandboxes;
pub mod policy;
pub mod preview;
pub mod processes;
pub mod reused;
pub mod sandboxes;
pub mod secrets;
pub mod snapshots;
pub mod terminals;
pub mod tokens;
mod trace;
pub mod webhooks;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod operations_tests;

#[cfg(test)]
mod secrets_tests;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::to_bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use ports::{CallerDirectory, CredentialVerifier};
use tower_http::catch_panic::CatchPanicLayer;

use crate::metrics::Metrics;
use crate::usecase::LaneDeps;
use error::{ApiError, Code};
pub use listener::ListenerLimits;

/// Whether the database answers (for `/readyz`).
#[async_trait]
pub trait Readiness: Send + Sync {
    /// `Ok` when the database is reachable.
    ///
    /// # Errors
    /// A message saying what failed.
    async fn database(&self) -> Result<(), String>;
}

/// What the handlers share.
pub struct AppState {
    /// The lane's ports and policy.
    pub deps: Arc<LaneDeps>,
    /// Caller keys.
    pub directory: Arc<dyn CallerDirectory>,
    /// Sandbox tokens.
    pub verifier: Arc<dyn CredentialVerifier>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Database readiness.
    pub readiness: Arc<dyn Readiness>,
    /// The driver's health for `/readyz`, refreshed at most every 30 s.
    pub driver_health: meta::DriverHealthCache,
    /// What `/metrics` read of the store and the driver, reused for a few seconds.
    pub scrape: meta::ScrapeCache,
    /// The audit log's verdict for `GET /v1/orgs/{org}/audit/verify`, reused for 10 s.
    pub audit_verdict: audit::VerdictCache,
    /// The limit on every request but exec (whose limit is its own timeout).
    pub request_timeout: Duration,
    /// The largest request body accepted (a file or archive upload has its own cap,
    /// [`crate::usecase::StreamLimits`]).
    pub body_limit: usize,
    /// Tells streamed responses the server is stopping.
    pub shutdown: ndjson::Shutdown,
    /// The webhooks (their deliveries' route); `None`: not served (tests).
    pub webhooks: Option<Arc<crate::usecase::webhooks::WebhookDeps>>,
    /// The domain a sandbox's ports are served under (`http.preview_domain`).
    pub preview_domain: String,
}

/// The API's router.
pub fn router(state: Arc<AppState>) -> Router {
    let timeout = state.request_timeout;
    let body_limit = state.body_limit;
    let bounded = Router::new()
        .route(
            "/v1/orgs/{org}/sessions/{session_id}/sandbox",
            put(sandboxes::ensure_session).delete(sandboxes::deprovision_session),
        )
        .route(
            "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox",
            put(sandboxes::ensure_workflow).delete(sandboxes::deprovision_workflow),
        )
        .route(
            "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox/recover",
            post(sandboxes::recover_workflow),
        )
        .route("/v1/orgs/{org}/sandboxes", get(org_sandboxes::list_sandboxes))
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}", get(sandboxes::get_sandbox))
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/snapshots", post(snapshots::take_snapshot))
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/restore", post(snapshots::restore_sandbox))
        .route("/v1/orgs/{org}/snapshots", get(snapshots::list_snapshots))
        .route(
            "/v1/orgs/{org}/snapshots/{snapshot_id}",
            get(snapshots::get_snapshot).delete(snapshots::delete_snapshot),
        )
        // Background processes: each call is quick (the process outlives it).
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes",
            post(processes::start_process).get(processes::list_processes),
        )
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}", get(processes::get_process))
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/stdin", post(processes::process_stdin))
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/signal",
            post(processes::signal_process),
        )
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals",
            post(terminals::create_terminal).get(terminals::list_terminals),
        )
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals/{terminal_id}/tickets",
            post(terminals::create_ticket),
        )
        .route("/v1/orgs/{org}/audit", get(audit::read_audit))
        .route("/v1/orgs/{org}/audit/verify", get(audit::verify_audit))
        .route("/v1/orgs/{org}/policy", get(policy::read_policy))
        .route("/v1/orgs/{org}/webhooks/deliveries", get(webhooks::list_deliveries))
        .route("/v1/orgs/{org}/secrets", get(secrets::list_secrets))
        .route("/v1/orgs/{org}/secrets/{name}", put(secrets::put_secret).delete(secrets::delete_secret))
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/ports/{port}/links",
            post(preview::create_link).get(preview::list_links),
        )
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/ports/{port}/links/{link_id}",
            axum::routing::delete(preview::revoke_link),
        )
        .route("/v1/introspect", post(tokens::introspect))
        .route("/.well-known/jwks.json", get(tokens::jwks))
        .route("/healthz", get(meta::healthz))
        .route("/readyz", get(meta::readyz))
        .route("/metrics", get(meta::metrics))
        .route("/openapi.json", get(meta::openapi))
        .merge(console::router())
        .layer(middleware::from_fn_with_state(timeout, request_timeout));
    // Exec is bounded by its own `timeout_ms`, enforced by the driver; a followed output
    // lasts as long as its process; transfers as long as their bytes move.
    let exec = Router::new()
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/exec", post(sandboxes::exec))
        .route("/v1/orgs/{org}/sandboxes/{sandbox_id}/processes/{pid}/output", get(processes::process_output))
        // An attached terminal lasts as long as its WebSocket; ending one is quick, on the
        // same path.
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/terminals/{terminal_id}",
            get(terminals::get_terminal).delete(terminals::delete_terminal),
        )
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/files",
            get(files::read_file).put(files::write_file).delete(files::delete_file),
        )
        .route(
            "/v1/orgs/{org}/sandboxes/{sandbox_id}/archive",
            get(files::read_archive).put(files::write_archive),
        );
    // The MCP endpoint: a tool call lasts as long as the use case it runs (exec's own
    // timeout bounds it).
    bounded
        .merge(exec)
        .merge(crate::mcp::router(state.clone()))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(unknown_route)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state(body_limit, json_errors))
        // Host-based routing before the API: a preview host's requests go to the sandbox.
        .layer(middleware::from_fn_with_state(state.clone(), preview::route))
        .layer(CatchPanicLayer::custom(|_| {
            ApiError::new(Code::Internal, "internal error; see the server log").into_response()
        }))
        .layer(middleware::from_fn(trace::trace_request))
        .with_state(state)
}

/// Serves the API on `listener` within `limits` (see [`listener`]) until `shutdown`
/// completes; in-flight requests finish.
///
/// # Errors
/// The listener's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    limits: ListenerLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let stopping = state.shutdown.clone();
    let shutdown = async move {
        shutdown.await;
        // Followed output and streamed commands end, so in-flight requests can finish.
        stopping.begin();
    };
    listener::serve_router(listener, router(state), limits, shutdown).await
}

async fn unknown_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

/// 405 for a method the path lacks; the router adds the `Allow` header listing the ones it
/// has. The code is `invalid_argument` (the request names a method this path does not
/// take), the closest of the API's fixed codes: the path exists, so not `not_found`.
async fn method_not_allowed(method: Method, uri: Uri) -> Response {
    let mut response =
        ApiError::invalid(format!("{method} is not allowed on {}; see the Allow header", uri.path()))
            .into_response();
    *response.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    response
}

async fn request_timeout(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::unavailable(format!("the request took longer than {} ms", limit.as_millis()))
            .into_response(),
    }
}

/// Turns every error response that is not already our JSON (axum's rejections of a
/// malformed body, path or query; an oversized body) into `{"error", "message"}` with the
/// status of its code (a 415 or 422 rejection becomes 400 `invalid_argument`).
async fn json_errors(State(body_limit): State<usize>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json =
        response.headers().get(CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let code = match status.as_u16() {
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::Conflict,
        413 => Code::TooLarge,
        429 => Code::ResourceExhausted,
        408 | 503 | 504 => Code::Unavailable,
        400..=499 => Code::InvalidArgument,
        _ => Code::Internal,
    };
    let reason = status.canonical_reason().unwrap_or("error");
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!("the body of {method} {path} is over the limit of {body_limit} bytes")
    } else {
        let body = to_bytes(response.into_body(), 64 * 1024).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body).trim().to_owned();
        if status.is_server_error() {
            // A layer's text about a failure of ours (an I/O error, say): for the log only.
            tracing::warn!(%method, %path, status = status.as_u16(), error = %text, "request failed");
            format!("{reason}; see the server log")
        } else if text.is_empty() {
            reason.to_owned()
        } else {
            text
        }
    };
    ApiError::new(code, message).into_response()
}
