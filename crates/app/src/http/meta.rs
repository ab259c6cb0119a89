//! Health, readiness, metrics and the OpenAPI document.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::AppState;
use super::auth::Principal;
use super::dto::{HealthBody, HealthCheckBody};
use super::error::{ApiError, ErrorBody};
use super::reused::Reused;
use crate::metrics::Scope;
use ports::DriverHealth;
use tracing::warn;

/// Liveness: the process serves requests.
#[utoipa::path(
    get, path = "/healthz", tag = "meta",
    responses((status = 200, description = "the process serves requests", body = HealthBody))
)]
pub async fn healthz() -> Json<HealthBody> {
    Json(HealthBody { status: "ok".into(), checks: Vec::new() })
}

/// What `/readyz` says of a database that does not answer; the error is in the log.
pub const DATABASE_UNREACHABLE: &str = "unreachable; see the server log";
/// What `/readyz` says of a driver that is not usable; why is in the log.
pub const DRIVER_UNUSABLE: &str = "not usable; see the server log";

/// Readiness: the database is reachable and the driver usable. A failed check says so in
/// fixed words (anyone may ask); the database's or driver's own message goes to the log.
#[utoipa::path(
    get, path = "/readyz", tag = "meta",
    responses((status = 200, description = "every check passed", body = HealthBody),
        (status = 503, description = "a check failed; `checks` says which", body = HealthBody))
)]
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<HealthBody>) {
    let database = match state.readiness.database().await {
        Ok(()) => HealthCheckBody { name: "database".into(), ok: true, detail: "reachable".into() },
        Err(e) => {
            warn!(error = %e, "readiness: the database does not answer");
            HealthCheckBody { name: "database".into(), ok: false, detail: DATABASE_UNREACHABLE.into() }
        }
    };
    let health = state.driver_health.get(|| state.deps.driver.health()).await;
    let detail = if health.usable {
        health.detail
    } else {
        warn!(detail = %health.detail, "readiness: the driver is not usable");
        DRIVER_UNUSABLE.into()
    };
    let driver = HealthCheckBody { name: "driver".into(), ok: health.usable, detail };
    let ok = database.ok && driver.ok;
    let body =
        HealthBody { status: if ok { "ok" } else { "unavailable" }.into(), checks: vec![database, driver] };
    (if ok { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE }, Json(body))
}

/// The driver's health, asked of the driver at most once per 30 s (the bubblewrap driver
/// runs `bwrap --version` to answer): `/readyz` is polled, and must not start a process per
/// call.
pub type DriverHealthCache = Reused<DriverHealth, 30_000>;

/// What a scrape reads of the store and the driver: the live sandboxes, their counts and
/// workspace bytes by org, the audit log's unsealed tail.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    live: Option<u64>,
    /// Without `commands` (this replica's own count, read at each scrape).
    orgs: crate::metrics::OrgSnapshot,
    backlog: Option<(u64, f64)>,
}

/// [`Gathered`], reused for 5 s by scrapes without a key: `/metrics` is open to anyone and
/// what it reads grows with the live sandboxes (a `statfs` of each running one), so an
/// anonymous client that scrapes in a loop costs one gathering per 5 s, not one per request
/// (a scrape interval is 15 s or more).
pub type ScrapeCache = Reused<Gathered, 5_000>;

/// What a scrape reads, from the store and the driver.
async fn gather(deps: &crate::usecase::LaneDeps) -> Gathered {
    let live = deps.registry.live_ids().await.ok();
    let mut orgs = crate::metrics::OrgSnapshot::default();
    if let Ok(counts) = deps.registry.live_counts().await {
        orgs.sandboxes =
            counts.into_iter().map(|c| (c.org.to_string(), c.state.as_str().to_owned(), c.count)).collect();
    }
    if let Ok(warm) = deps.registry.list_warm().await {
        let mut pooled = std::collections::BTreeMap::new();
        for w in warm.iter().filter(|w| w.ready) {
            *pooled.entry(w.org.to_string()).or_insert(0u64) += 1;
        }
        orgs.sandboxes.extend(pooled.into_iter().map(|(org, n)| (org, "pooled".to_owned(), n)));
    }
    let mut bytes = std::collections::BTreeMap::new();
    for sandbox in live.iter().flatten().filter(|l| l.state == domain::SandboxState::Ready) {
        if let Some(used) = deps.driver.workspace_usage(&sandbox.id).await {
            *bytes.entry(sandbox.org.to_string()).or_insert(0u64) += used;
        }
    }
    orgs.workspace_bytes = bytes.into_iter().collect();
    let now = deps.clock.now().unix_millis();
    let backlog = deps.audit.seal_status().await.ok().map(|status| {
        let lag = status.oldest_unsealed.map_or(0.0, |t| (now - t.unix_millis()).max(0) as f64 / 1000.0);
        (status.unsealed, lag)
    });
    Gathered { live: live.map(|live| live.len() as u64), orgs, backlog }
}

/// Prometheus metrics (OpenMetrics text). Without a key: the totals, no series names an
/// org. With a service caller's key: also the `sandlane_org_*` series of its orgs (and of
/// no other). A scrape runs bounded queries only: the live sandboxes (and their counts per
/// org and state), the warm sandboxes, and the audit rows not yet sealed (the log's tail,
/// never the whole log); and asks the driver for the bytes of each running sandbox's
/// workspace (a `statfs`). Without a key, those readings are reused for 5 s.
#[utoipa::path(
    get, path = "/metrics", tag = "meta",
    responses((status = 200, description = "OpenMetrics text format",
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8", body = String),
        (status = 403, description = "a key that is not a service caller's", body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn metrics(
    State(state): State<Arc<AppState>>,
    principal: Option<Principal>,
) -> Result<impl IntoResponse, ApiError> {
    let caller = principal.as_ref().map(Principal::service_caller).transpose()?;
    let scope = caller.map_or(Scope::Totals, |caller| Scope::Orgs(caller.orgs()));
    let deps = &state.deps;
    // Anyone may scrape without a key: such scrapes share one gathering per TTL. A service
    // caller's (accountable, and the series of its orgs) reads afresh.
    let Gathered { live, mut orgs, backlog } =
        if principal.is_some() { gather(deps).await } else { state.scrape.get(|| gather(deps)).await };
    state.metrics.set_live_sandboxes(live);
    orgs.commands = deps.activity.running_by_org().into_iter().map(|(org, n)| (org.to_string(), n)).collect();
    state.metrics.set_audit_backlog(backlog);
    Ok(([(CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], state.metrics.render(scope, &orgs)))
}

/// This API's OpenAPI document, generated from the handlers.
#[utoipa::path(
    get, path = "/openapi.json", tag = "meta",
    responses((status = 200, description = "OpenAPI 3.1", content_type = "application/json"))
)]
pub async fn openapi() -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], super::openapi::document())
}
