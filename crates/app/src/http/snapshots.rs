//! The snapshot routes: take a snapshot of a sandbox, list, read and delete snapshots,
//! restore a sandbox from one (forks are ensures with `from_snapshot`).

use std::borrow::Cow;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use domain::{OrgId, SandboxId, Snapshot, SnapshotId, SnapshotName};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::dto::{OrgPath, SandboxBody, SandboxPath};
use super::error::{ApiError, Code, ErrorBody};
use super::ndjson::driver_error;
use crate::usecase::{self, SnapshotError, chain};

/// `SnapshotId`: `snp_` then 26 Crockford base32 characters.
pub struct SnapshotIdSchema;

impl PartialSchema for SnapshotIdSchema {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("`snp_` then 26 Crockford base32 characters (time-ordered)"))
            .min_length(Some(domain::id::SANDBOX_ID_LEN))
            .max_length(Some(domain::id::SANDBOX_ID_LEN))
            .pattern(Some(domain::id::snapshot_id_pattern()))
            .examples(["snp_01KA2B3C4D5E6F7G8H9JKMNPQR"])
            .into()
    }
}

impl ToSchema for SnapshotIdSchema {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("SnapshotId")
    }
}

/// The path of a snapshot.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SnapshotPath {
    /// The org.
    #[param(value_type = super::dto::Id)]
    pub org: String,
    /// The snapshot.
    #[param(value_type = SnapshotIdSchema)]
    pub snapshot_id: String,
}

/// The query of a snapshot listing.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListSnapshotsQuery {
    /// Only the snapshots taken of this sandbox (one branch point's attempts).
    #[param(value_type = Option<super::dto::SandboxId>)]
    pub sandbox_id: Option<String>,
}

/// The body of a snapshot request.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeSnapshotBody {
    /// A label: 1-64 of A-Z a-z 0-9 . _ - (not unique).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9._-]{1,64}$")]
    pub name: Option<String>,
}

/// The body of a restore.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    /// The snapshot the workspace becomes.
    #[schema(value_type = SnapshotIdSchema)]
    pub snapshot: String,
}

/// A snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotBody {
    /// `snp_…`.
    pub id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// The org.
    pub org: String,
    /// That sandbox's key: `session` or `workflow`.
    pub source_kind: String,
    /// That sandbox's key: the session id or workflow execution id.
    pub source_key: String,
    /// The owner of that key: who (besides the org's service callers) may fork from it.
    pub owner: String,
    /// Who took it.
    pub created_by: String,
    /// Its label, if any.
    pub name: Option<String>,
    /// RFC 3339.
    pub created_at: String,
    /// The bytes it holds (what counts against `snapshot_bytes`).
    pub bytes: u64,
}

impl From<&Snapshot> for SnapshotBody {
    fn from(s: &Snapshot) -> Self {
        Self {
            id: s.id.to_string(),
            sandbox_id: s.source.to_string(),
            org: s.org.to_string(),
            source_kind: s.source_key.kind().as_str().to_owned(),
            source_key: s.source_key.key().to_owned(),
            owner: s.owner.to_string(),
            created_by: s.created_by.to_string(),
            name: s.name.as_ref().map(ToString::to_string),
            created_at: s.created_at.to_rfc3339(),
            bytes: s.bytes,
        }
    }
}

/// The snapshots of an org the caller may use.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SnapshotListBody {
    /// Oldest first.
    pub snapshots: Vec<SnapshotBody>,
}

/// A restored sandbox.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct RestoredBody {
    /// The sandbox (same id, a fresh token).
    pub sandbox: SandboxBody,
}

impl From<SnapshotError> for ApiError {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Access(e) => e.into(),
            e @ (SnapshotError::NotLive { .. } | SnapshotError::Conflict(_)) => {
                Self::new(Code::Conflict, e.to_string())
            }
            e @ (SnapshotError::Quota(_) | SnapshotError::TokenCap { .. }) => {
                Self::new(Code::ResourceExhausted, e.to_string())
            }
            e @ SnapshotError::Unsupported(_) => Self::new(Code::Conflict, e.to_string()),
            SnapshotError::Driver(e) => driver_error(e),
            e @ (SnapshotError::Store(_)
            | SnapshotError::Policy(_)
            | SnapshotError::Audit(_)
            | SnapshotError::Entropy(_)
            | SnapshotError::Task) => Self::unavailable_from(&e),
            // Starting it again would pass the org's quota of running sandboxes.
            SnapshotError::Claim(r) if matches!(*r, usecase::ResumeError::Quota(_)) => {
                Self::new(Code::ResourceExhausted, SnapshotError::Claim(r).to_string())
            }
            e @ (SnapshotError::Resume(_) | SnapshotError::Claim(_)) => Self::unavailable(chain(&e)),
        }
    }
}

fn snapshot_id(raw: String) -> Result<SnapshotId, ApiError> {
    Ok(SnapshotId::parse(raw)?)
}

/// Take a snapshot of the sandbox's workspace (its processes frozen for the copy).
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/snapshots", tag = "snapshots",
    params(SandboxPath),
    request_body = TakeSnapshotBody,
    responses(
        (status = 201, description = "taken", body = SnapshotBody),
        (status = 400, description = "an id or the name breaks its rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox the caller may see", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready or suspended, or its driver keeps no snapshots of it", body = ErrorBody),
        (status = 413, description = "too_large: the body is over `http.body_limit_bytes`; or, on Kubernetes, the workspace's archive (apparent sizes: holes and hard links copied whole) passed what its workspace can hold", body = ErrorBody),
        (status = 429, description = "the org's snapshot quota (max_snapshots, snapshot_bytes) is used up or would be passed by this copy, or a sandbox token's sandbox holds 10 snapshots", body = ErrorBody),
        (status = 503, description = "the driver, the store or the audit log is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn take_snapshot(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Json(body): Json<TakeSnapshotBody>,
) -> Result<(StatusCode, Json<SnapshotBody>), ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let name =
        body.name.map(SnapshotName::parse).transpose().map_err(|e| ApiError::invalid(e.to_string()))?;
    let snapshot = usecase::take_snapshot(&state.deps, &principal.0, &org, &sandbox_id, name).await?;
    Ok((StatusCode::CREATED, Json(SnapshotBody::from(&snapshot))))
}

/// List the org's snapshots the caller may use.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/snapshots", tag = "snapshots",
    params(OrgPath, ListSnapshotsQuery),
    responses(
        (status = 200, description = "a service caller sees every snapshot of the org, a user its own", body = SnapshotListBody),
        (status = 400, description = "the org or the sandbox id breaks the id rules", body = ErrorBody),
        (status = 403, description = "a sandbox token, or a caller of another org", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_snapshots(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
    Query(query): Query<ListSnapshotsQuery>,
) -> Result<Json<SnapshotListBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let of = query.sandbox_id.map(SandboxId::parse).transpose()?;
    let mut list = usecase::list_snapshots(&state.deps, &principal.0, &org).await?;
    if let Some(of) = of {
        list.retain(|s| s.source == of);
    }
    Ok(Json(SnapshotListBody { snapshots: list.iter().map(SnapshotBody::from).collect() }))
}

/// Read one snapshot.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/snapshots/{snapshot_id}", tag = "snapshots",
    params(SnapshotPath),
    responses(
        (status = 200, description = "the snapshot", body = SnapshotBody),
        (status = 400, description = "an id breaks its rules", body = ErrorBody),
        (status = 403, description = "a sandbox token, or a caller of another org", body = ErrorBody),
        (status = 404, description = "no such snapshot the caller may use", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn get_snapshot(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, id)): Path<(String, String)>,
) -> Result<Json<SnapshotBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let snapshot = usecase::usable_snapshot(&state.deps, &principal.0, &org, &snapshot_id(id)?).await?;
    Ok(Json(SnapshotBody::from(&snapshot)))
}

/// Delete a snapshot (forks made from it keep their files).
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/snapshots/{snapshot_id}", tag = "snapshots",
    params(SnapshotPath),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "an id breaks its rules", body = ErrorBody),
        (status = 403, description = "a sandbox token, or a caller of another org", body = ErrorBody),
        (status = 404, description = "no such snapshot the caller may use", body = ErrorBody),
        (status = 503, description = "the driver or the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete_snapshot(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let org = OrgId::parse(org)?;
    usecase::delete_snapshot(&state.deps, &principal.0, &org, &snapshot_id(id)?).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restore the sandbox from a snapshot: same id, its processes ended, its workspace the
/// snapshot's, started again with a fresh token.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/restore", tag = "snapshots",
    params(SandboxPath),
    request_body = RestoreBody,
    responses(
        (status = 200, description = "restored and running again", body = RestoredBody),
        (status = 400, description = "an id breaks its rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox or snapshot the caller may use", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready or suspended, or changed meanwhile", body = ErrorBody),
        (status = 429, description = "starting it again would pass the org's quota of running sandboxes: it stays suspended, its files its own", body = ErrorBody),
        (status = 503, description = "the driver, the store or the resume failed", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn restore_sandbox(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Json(body): Json<RestoreBody>,
) -> Result<Json<RestoredBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let id = snapshot_id(body.snapshot)?;
    let view = usecase::restore_sandbox(&state.deps, &principal.0, &org, &sandbox_id, &id).await?;
    Ok(Json(RestoredBody { sandbox: SandboxBody::from(&view) }))
}
