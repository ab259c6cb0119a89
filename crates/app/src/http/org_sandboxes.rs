//! The org's sandboxes, a page at a time, for its service callers (the console's list).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use domain::{OrgId, SandboxId};
use ports::OrgListing;
use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::dto::OrgPath;
use super::error::{ApiError, ErrorBody};

/// The query of a listing.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SandboxListQuery {
    /// Only sandboxes whose id sorts after this one: pass the `next` of the previous page.
    #[param(value_type = Option<super::dto::SandboxId>)]
    pub after: Option<String>,
    /// At most this many sandboxes.
    #[param(schema_with = limit_schema)]
    pub limit: Option<u32>,
    /// `true`: failed and deprovisioned records too (default `false`: the live ones,
    /// provisioning, ready and suspended).
    pub ended: Option<bool>,
}

impl SandboxListQuery {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 1000;
    /// The page size when none is asked for.
    pub const DEFAULT_LIMIT: u32 = 100;
}

fn limit_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int32)))
        .minimum(Some(1))
        .maximum(Some(SandboxListQuery::MAX_LIMIT))
        .description(Some(format!(
            "At most this many sandboxes (default {}, at most {}).",
            SandboxListQuery::DEFAULT_LIMIT,
            SandboxListQuery::MAX_LIMIT
        )))
        .into()
}

/// One sandbox of a listing.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ListedSandboxBody {
    /// The sandbox id (`sbx_…`).
    pub id: String,
    /// `session` or `workflow`.
    pub kind: String,
    /// The session id or workflow execution id.
    pub key: String,
    /// `durable` or `ephemeral`.
    pub durability: String,
    /// `provisioning`, `ready`, `suspended`, `failed` or `deprovisioned`.
    pub state: String,
    /// The driver.
    pub driver: String,
    /// The identity that owns the key (whose ensure first created it), if anyone does.
    pub owner: Option<String>,
    /// The owner's class (`user` or `service`).
    pub owner_class: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// The last command, ensure, process or file operation (RFC 3339).
    pub last_active_at: String,
}

/// A page of an org's sandboxes.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxListBody {
    /// The sandboxes, in id order (oldest first).
    pub sandboxes: Vec<ListedSandboxBody>,
    /// The `after` of the next page; `null` when this page is the last.
    pub next: Option<String>,
}

/// List the org's sandboxes, a page at a time, oldest first.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes", tag = "sandboxes",
    params(OrgPath, SandboxListQuery),
    responses((status = 200, description = "a page of the org's sandboxes, in id order", body = SandboxListBody),
        (status = 400, description = "the org, `after` or `limit` breaks the rules", body = ErrorBody),
        (status = 403, description = "only service callers of the org may list its sandboxes", body = ErrorBody),
        (status = 503, description = "the registry is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn list_sandboxes(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
    Query(query): Query<SandboxListQuery>,
) -> Result<Json<SandboxListBody>, ApiError> {
    let org = OrgId::parse(org)?;
    principal.service_in(&org)?;
    let after = query.after.map(SandboxId::parse).transpose()?;
    let limit = query.limit.unwrap_or(SandboxListQuery::DEFAULT_LIMIT);
    if limit == 0 || limit > SandboxListQuery::MAX_LIMIT {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {}, got {limit}",
            SandboxListQuery::MAX_LIMIT
        )));
    }
    let listing = OrgListing { org, after, limit, ended: query.ended.unwrap_or(false) };
    let page = state
        .deps
        .registry
        .list_org(&listing)
        .await
        .map_err(|e| ApiError::dependency("cannot list the sandboxes now", &e))?;
    let next = if page.len() == limit as usize { page.last().map(|(r, _)| r.id.to_string()) } else { None };
    let sandboxes = page
        .iter()
        .map(|(record, owner)| ListedSandboxBody {
            id: record.id.to_string(),
            kind: record.key.kind().as_str().to_owned(),
            key: record.key.key().to_owned(),
            durability: record.durability.as_str().to_owned(),
            state: record.state.as_str().to_owned(),
            driver: record.driver.clone(),
            owner: owner.as_ref().map(|o| o.identity_id.to_string()),
            owner_class: owner.as_ref().map(|o| o.class.as_str().to_owned()),
            created_at: record.created_at.to_rfc3339(),
            last_active_at: record.last_active_at.to_rfc3339(),
        })
        .collect();
    Ok(Json(SandboxListBody { sandboxes, next }))
}
