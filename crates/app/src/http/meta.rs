//! Health, readiness, metrics and the OpenAPI document.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;

use super::AppState;
use super::auth::Principal;
use super::dto::{HealthBody, HealthCheckBody};
use super::error::{ApiError, ErrorBody};
use crate::metrics::Scope;
use ports::{DriverHealth, SandboxDriver};
use tokio::sync::Mutex;
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
    let health = state.driver_health.get(state.deps.driver.as_ref()).await;
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

/// The driver's health, asked of the driver at most once per `ttl` (the bubblewrap
/// driver runs `bwrap --version` to answer): `/readyz` is polled, and must not start a
/// process per call. Concurrent callers of a stale entry wait for one refresh.
#[derive(Debug)]
pub struct DriverHealthCache {
    ttl: Duration,
    slot: Mutex<Option<(Instant, DriverHealth)>>,
}

impl DriverHealthCache {
    /// How long an answer is reused when none is given.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

    /// A cache that reuses an answer for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, slot: Mutex::new(None) }
    }

    /// The driver's health, from the cache while it is fresh.
    pub async fn get(&self, driver: &dyn SandboxDriver) -> DriverHealth {
        let mut slot = self.slot.lock().await;
        if let Some((at, health)) = slot.as_ref()
            && at.elapsed() < self.ttl
        {
            return health.clone();
        }
        let health = driver.health().await;
        *slot = Some((Instant::now(), health.clone()));
        health
    }
}

impl Default for DriverHealthCache {
    fn default() -> Self {
        Self::new(Self::DEFAULT_TTL)
    }
}

/// What a scrape reads of the store and the driver: the live sandboxes, their counts and
/// workspace bytes by org, the audit log's unsealed tail.
#[derive(Debug, Clone, Default)]
pub struct Gathered {
    live: Option<u64>,
    /// Without `commands` (this replica's own count, read at each scrape).
    orgs: crate::metrics::OrgSnapshot,
    backlog: Option<(u64, f64)>,
}

/// [`Gathered`], reused for [`ScrapeCache::TTL`] by scrapes without a key: `/metrics` is
/// open to anyone and what it reads grows with the live sandboxes (a `statfs` of each
/// running one), so an anonymous client that scrapes in a loop costs one gathering per
/// TTL, not one per request. Concurrent scrapes of a stale entry wait for one gathering.
#[derive(Debug, Default)]
pub struct ScrapeCache {
    slot: Mutex<Option<(tokio::time::Instant, Gathered)>>,
}

impl ScrapeCache {
    /// How long a gathering is reused (a scrape interval is 15 s or more).
    pub const TTL: Duration = Duration::from_secs(5);

    /// The last gathering while it is fresh, else `gather`'s.
    pub async fn get<F, Fut>(&self, gather: F) -> Gathered
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Gathered>,
    {
        let mut slot = self.slot.lock().await;
        if let Some((at, gathered)) = slot.as_ref()
            && at.elapsed() < Self::TTL
        {
            return gathered.clone();
        }
        let gathered = gather().await;
        *slot = Some((tokio::time::Instant::now(), gathered.clone()));
        gathered
    }
}

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

#[cfg(test)]
mod scrape_tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Scrapes within the TTL reuse one gathering, concurrent ones too; the first after it
    /// gathers again.
    #[tokio::test(start_paused = true)]
    async fn scrapes_within_the_ttl_gather_once() {
        let cache = Arc::new(ScrapeCache::default());
        let gathered = Arc::new(AtomicUsize::new(0));
        let scrape = |cache: Arc<ScrapeCache>, gathered: Arc<AtomicUsize>| async move {
            cache
                .get(|| async move {
                    gathered.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Gathered { live: Some(7), ..Gathered::default() }
                })
                .await
        };
        let both =
            tokio::join!(scrape(cache.clone(), gathered.clone()), scrape(cache.clone(), gathered.clone()));
        assert_eq!((both.0.live, both.1.live), (Some(7), Some(7)));
        assert_eq!(gathered.load(Ordering::SeqCst), 1, "concurrent scrapes: one gathering");
        tokio::time::sleep(ScrapeCache::TTL / 2).await;
        scrape(cache.clone(), gathered.clone()).await;
        assert_eq!(gathered.load(Ordering::SeqCst), 1, "within the TTL: reused");
        tokio::time::sleep(ScrapeCache::TTL).await;
        scrape(cache.clone(), gathered.clone()).await;
        assert_eq!(gathered.load(Ordering::SeqCst), 2, "after it: gathered again");
    }
}
