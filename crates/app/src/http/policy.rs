//! The policy route: an org's effective policy, for its service callers; and its JSON
//! body, which `sandlane org show` prints too.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use domain::OrgId;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::auth::Principal;
use super::dto::OrgPath;
use super::error::{ApiError, ErrorBody};
use crate::usecase::{EffectivePolicy, GetPolicyError, get_org_policy};

/// An org's effective policy: the config file's defaults with the org's changes. `null`
/// means `unlimited` (a quota) or `off` (a timeout).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PolicyBody {
    /// The org.
    pub org: String,
    /// The version of the org's changes (0: it has none).
    pub version: i64,
    /// When they were last changed (RFC 3339), `null` when never.
    pub updated_at: Option<String>,
    /// Whether session sandboxes are provisioned.
    pub lane_session: bool,
    /// Whether workflow sandboxes are provisioned.
    pub lane_workflow: bool,
    /// The most sandboxes the org runs at once (provisioning or ready).
    pub max_sandboxes: Option<u32>,
    /// The most commands the org runs at once, over every sandbox and replica.
    pub max_commands: Option<u32>,
    /// The most commands one sandbox runs at once.
    pub max_commands_per_sandbox: Option<u32>,
    /// The most bytes a sandbox writes into its workspace.
    pub workspace_bytes: Option<u64>,
    /// How long a sandbox may be idle before it is suspended, in ms.
    pub idle_timeout_ms: Option<u64>,
    /// How long a sandbox may live before it is deprovisioned, in ms.
    pub max_lifetime_ms: Option<u64>,
    /// How many warm ephemeral sandboxes are kept for the org.
    pub warm_pool: u32,
    /// What sandboxes may reach through the egress proxy: `host`, `*.suffix` or an address
    /// range `ADDRESS/PREFIX`, each with an optional `:port`, then an optional `@user` or
    /// `@service` (the rule holds only for sandboxes whose token is for that class).
    pub egress_allow: Vec<String>,
    /// The fields the org changed (the others are the defaults).
    pub overridden: Vec<String>,
}

impl From<&EffectivePolicy> for PolicyBody {
    fn from(e: &EffectivePolicy) -> Self {
        let p = &e.policy;
        Self {
            org: e.org.to_string(),
            version: e.version,
            updated_at: e.updated_at.map(|t| t.to_rfc3339()),
            lane_session: p.lane(domain::SandboxKind::Session),
            lane_workflow: p.lane(domain::SandboxKind::Workflow),
            max_sandboxes: p.max_sandboxes(),
            max_commands: p.max_commands(),
            max_commands_per_sandbox: p.max_commands_per_sandbox(),
            workspace_bytes: p.workspace_bytes(),
            idle_timeout_ms: p.idle_timeout_ms(),
            max_lifetime_ms: p.max_lifetime_ms(),
            warm_pool: p.warm_pool(),
            egress_allow: p.egress_allow().iter().map(ToString::to_string).collect(),
            overridden: e.overridden.iter().map(|f| f.as_str().to_owned()).collect(),
        }
    }
}

/// Read the org's policy.
#[utoipa::path(
    get, path = "/v1/orgs/{org}/policy", tag = "policy",
    params(OrgPath),
    responses((status = 200, description = "the org's effective policy", body = PolicyBody),
        (status = 400, description = "the org breaks the id rules", body = ErrorBody),
        (status = 403, description = "only service callers of the org may read its policy", body = ErrorBody),
        (status = 503, description = "the policy store is unavailable", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn read_policy(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
) -> Result<Json<PolicyBody>, ApiError> {
    let org = OrgId::parse(org)?;
    match get_org_policy(&state.deps.policies, &principal.0, &org).await {
        Ok(policy) => Ok(Json(PolicyBody::from(policy.as_ref()))),
        Err(GetPolicyError::Access(e)) => Err(e.into()),
        Err(e @ GetPolicyError::Read(_)) => Err(ApiError::unavailable_from(&e)),
    }
}
