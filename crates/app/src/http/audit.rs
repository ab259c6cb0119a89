//! The audit routes, for an org's service callers: pages of its audit events, and the
//! log's verdict.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use domain::{OrgId, Timestamp};
use ports::AuditError;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::dto::{AuditEventBody, AuditPageBody, AuditQuery, OrgPath};
use super::error::{ApiError, ErrorBody};
use super::reused::Reused;

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

/// What verifying the audit log found.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditVerdictBody {
    /// `intact` (every row hash, seal link and signature checks) or `tampered`.
    pub verdict: String,
    /// When the log was verified (RFC 3339); a verdict is reused for up to 10 s.
    pub checked_at: String,
    /// For `tampered`: where to learn which record is bad (`sandlane audit verify` on the
    /// server names it; the log is every org's, so the answer names no record).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The audit log's verdict and when it was checked, computed at most once per 10 s whoever
/// asks: verifying reads the whole log (every org's rows, one chain), so no caller can make
/// the server do it more often.
pub type VerdictCache = Reused<(Timestamp, bool), 10_000>;

/// Verify the audit log, as `sandlane audit verify` does: every row hash, seal link and
/// signature.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/audit/verify", tag = "audit",
    params(OrgPath),
    responses((status = 200, description = "the verdict (`intact` or `tampered`)", body = AuditVerdictBody),
        (status = 400, description = "the org breaks the id rules", body = ErrorBody),
        (status = 403, description = "only service callers of the org may verify its audit", body = ErrorBody),
        (status = 503, description = "the audit log cannot be read now", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn verify_audit(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
) -> Result<Json<AuditVerdictBody>, ApiError> {
    let org = OrgId::parse(org)?;
    principal.service_in(&org)?;
    let now = state.deps.clock.now();
    let (checked, intact) = state
        .audit_verdict
        .try_get(|| async { Ok::<_, AuditError>((now, state.deps.audit.verify().await?.is_intact())) })
        .await
        .map_err(|e| ApiError::dependency("cannot verify the audit log now", &e))?;
    Ok(Json(AuditVerdictBody {
        verdict: if intact { "intact" } else { "tampered" }.to_owned(),
        checked_at: checked.to_rfc3339(),
        message: (!intact).then(|| {
            "the audit log does not verify; `sandlane audit verify` on the server names the first bad record"
                .to_owned()
        }),
    }))
}
