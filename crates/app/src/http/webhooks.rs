//! The webhooks route: an org's deliveries (the outbox), newest first, for its service
//! callers.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use domain::OrgId;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::dto::OrgPath;
use super::error::{ApiError, ErrorBody};

/// A page's size when the query names none, and the largest.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 500;

/// The query of the deliveries' list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeliveriesQuery {
    /// Only deliveries older than this one (the `next` of the previous page).
    #[param(pattern = "^msg_[0-9]{1,18}$")]
    pub before: Option<String>,
    /// At most this many (1 to 500; default 50).
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<u32>,
}

/// One delivery of a webhook event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryBody {
    /// The message id, the `webhook-id` header of every attempt (`msg_` and the audit
    /// event's seq).
    pub id: String,
    /// The event's type (`sandbox.ready`, `sandbox.failed`, `sandbox.suspended`,
    /// `sandbox.resumed`, `sandbox.deprovisioned`, `quota.refused`, `egress.refused`,
    /// `snapshot.created`).
    pub event_type: String,
    /// The audit event it carries (`GET /v1/orgs/{org}/audit`).
    pub audit_seq: i64,
    /// `pending` (to be attempted at `next_attempt_at`), `delivered` or `failed` (given
    /// up after the last attempt, or the webhook was removed).
    pub status: String,
    /// Attempts made.
    pub attempts: u32,
    /// When it is attempted next, RFC 3339 (meaningful while pending).
    pub next_attempt_at: String,
    /// The receiver's HTTP status at the last attempt, if it answered.
    pub last_status: Option<u16>,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When it was queued, RFC 3339.
    pub created_at: String,
    /// When it last changed, RFC 3339.
    pub updated_at: String,
}

/// A page of deliveries.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DeliveryListBody {
    /// Newest first.
    pub deliveries: Vec<DeliveryBody>,
    /// The `before` of the next page, absent on the last.
    pub next: Option<String>,
}

impl From<&ports::DeliveryRecord> for DeliveryBody {
    fn from(d: &ports::DeliveryRecord) -> Self {
        Self {
            id: d.id.clone(),
            event_type: d.event_type.clone(),
            audit_seq: d.audit_seq,
            status: d.status.as_str().to_owned(),
            attempts: d.attempts,
            next_attempt_at: d.next_attempt_at.to_rfc3339(),
            last_status: d.last_status,
            last_error: d.last_error.clone(),
            created_at: d.created_at.to_rfc3339(),
            updated_at: d.updated_at.to_rfc3339(),
        }
    }
}

/// List the org's webhook deliveries, newest first.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/webhooks/deliveries", tag = "webhooks",
    params(OrgPath, DeliveriesQuery),
    responses((status = 200, description = "a page of deliveries, newest first", body = DeliveryListBody),
        (status = 400, description = "the org or `limit` breaks the rules, or `before` is not a delivery id", body = ErrorBody),
        (status = 403, description = "only service callers of the org may read its deliveries", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn list_deliveries(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
    Query(query): Query<DeliveriesQuery>,
) -> Result<Json<DeliveryListBody>, ApiError> {
    let org = OrgId::parse(org)?;
    principal.service_in(&org)?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if limit == 0 || limit > MAX_LIMIT {
        return Err(ApiError::invalid(format!("limit must be between 1 and {MAX_LIMIT}, got {limit}")));
    }
    let before_seq = match query.before.as_deref() {
        None => None,
        Some(id) => Some(crate::usecase::webhooks::seq_of_delivery_id(id).ok_or_else(|| {
            ApiError::invalid("before must be a delivery id (`msg_` and a number), as `next` gives it")
        })?),
    };
    let Some(webhooks) = &state.webhooks else {
        return Err(ApiError::unavailable("webhooks are not served here"));
    };
    let found = crate::usecase::webhooks::list_deliveries(webhooks, &org, before_seq, limit)
        .await
        .map_err(|e| ApiError::dependency("cannot read the webhook deliveries now", &e))?;
    let next = if found.len() == limit as usize { found.last().map(|d| d.id.clone()) } else { None };
    Ok(Json(DeliveryListBody { deliveries: found.iter().map(DeliveryBody::from).collect(), next }))
}
