//! Health, readiness, metrics and the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::AppState;
use super::dto::{HealthBody, HealthCheckBody};
use crate::metrics::Gauge;

/// Liveness: the process serves requests.
#[utoipa::path(
    get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "the process serves requests", body = HealthBody))
)]
pub async fn healthz() -> Json<HealthBody> {
    Json(HealthBody { status: "ok".into(), checks: Vec::new() })
}

/// Readiness: the database is reachable and the driver usable.
#[utoipa::path(
    get, path = "/readyz", tag = "meta",
    responses((status = 200, description = "every check passed", body = HealthBody),
        (status = 503, description = "a check failed; `checks` says which", body = HealthBody))
)]
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<HealthBody>) {
    let database = match state.readiness.database().await {
        Ok(()) => HealthCheckBody { name: "database".into(), ok: true, detail: "reachable".into() },
        Err(e) => HealthCheckBody { name: "database".into(), ok: false, detail: e },
    };
    let health = state.deps.driver.health().await;
    let driver = HealthCheckBody { name: "driver".into(), ok: health.usable, detail: health.detail };
    let ok = database.ok && driver.ok;
    let body =
        HealthBody { status: if ok { "ok" } else { "unavailable" }.into(), checks: vec![database, driver] };
    (if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body))
}

/// Prometheus metrics.
#[utoipa::path(
    get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "Prometheus text format", content_type = "text/plain"))
)]
pub async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let mut gauges = Vec::new();
    if let Ok(live) = state.deps.registry.list_live().await {
        gauges.push(Gauge {
            name: "sandlane_live_sandboxes",
            help: "Live sandboxes.",
            value: live.len() as f64,
        });
    }
    if let Ok(status) = state.deps.audit.seal_status().await {
        let lag = status
            .oldest_unsealed
            .map_or(0.0, |t| (state.deps.clock.now().unix_millis() - t.unix_millis()).max(0) as f64 / 1000.0);
        gauges.push(Gauge {
            name: "sandlane_audit_unsealed_rows",
            help: "Audit rows waiting for a seal.",
            value: status.unsealed as f64,
        });
        gauges.push(Gauge {
            name: "sandlane_audit_seal_lag_seconds",
            help: "Age of the oldest unsealed audit row.",
            value: lag,
        });
    }
    ([(CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render(&gauges))
}

/// This API's OpenAPI document, generated from the handlers.
#[utoipa::path(
    get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json"))
)]
pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], super::openapi::document())
}
