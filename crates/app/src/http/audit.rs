//! The audit route: pages of an org's audit events, for its service callers.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use domain::OrgId;

use super::AppState;
use super::auth::Principal;
use super::dto::{AuditEventBody, AuditPageBody, AuditQuery, OrgPath};
use super::error::{ApiError, ErrorBody};

/// The largest page.
const MAX_LIMIT: u32 = AuditQuery::MAX_LIMIT;

/// Read the org's audit events, oldest first.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/audit", tag = "audit",
    params(OrgPath, AuditQuery),
    responses((status = 200, description = "a page of events, oldest first", body = AuditPageBody),
        (status = 400, description = "the org, `after` or `limit` breaks the rules", body = ErrorBody),
        (status = 403, description = "only service callers of the org may read its audit", body = ErrorBody),
        (status = 503, description = "the audit log is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn read_audit(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
    Query(query): Query<AuditQuery>,
) -> Result<Json<AuditPageBody>, ApiError> {
    let org = OrgId::parse(org)?;
    principal.service_in(&org)?;
    let after = query.after.unwrap_or(0);
    if after < 0 {
        return Err(ApiError::invalid(format!("after must be >= 0, got {after}")));
    }
    let limit = query.limit.unwrap_or(AuditQuery::DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(format!("limit must be between 1 and {MAX_LIMIT}, got {limit}")));
    }
    let page = state
        .deps
        .audit
        .page(&org, after, limit)
        .await
        .map_err(|e| ApiError::dependency("cannot read the audit log now", &e))?;
    Ok(Json(AuditPageBody {
        events: page.entries.iter().map(AuditEventBody::from).collect(),
        next: page.next,
    }))
}
