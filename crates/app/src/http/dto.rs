//! The JSON bodies of the API, with their OpenAPI schemas.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::usecase::SandboxView;

/// `S`: a sandbox as callers see it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxBody {
    /// The sandbox id (`sbx_…`).
    pub id: String,
    /// `session` or `workflow`.
    pub kind: String,
    /// The session id or workflow execution id.
    pub key: String,
    /// The org.
    pub org: String,
    /// `durable` or `ephemeral`.
    pub durability: String,
    /// `provisioning`, `ready`, `failed` or `deprovisioned`.
    pub state: String,
    /// The driver.
    pub driver: String,
    /// RFC 3339.
    pub created_at: String,
    /// The `jti` minted by this ensure (or the last one, for a read).
    pub token_id: Option<String>,
}

impl From<&SandboxView> for SandboxBody {
    fn from(v: &SandboxView) -> Self {
        Self {
            id: v.id.to_string(),
            kind: v.kind.as_str().to_owned(),
            key: v.key.clone(),
            org: v.org.to_string(),
            durability: v.durability.as_str().to_owned(),
            state: v.state.as_str().to_owned(),
            driver: v.driver.clone(),
            created_at: v.created_at.to_rfc3339(),
            token_id: v.token_id.as_ref().map(ToString::to_string),
        }
    }
}

/// The body of a session ensure.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnsureSessionRequest {
    /// The agent execution being launched in the session.
    pub execution_id: String,
}

/// The result of an ensure.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum EnsureResponse {
    /// The sandbox is ready.
    Ready {
        /// The sandbox.
        sandbox: SandboxBody,
    },
    /// Provisioning failed (session ensures only); the message has the prefix.
    Failed {
        /// `Sandbox provisioning failed: …`.
        message: String,
    },
    /// The lane is off: nothing was provisioned.
    Disabled,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequestBody {
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// Text fed to standard input.
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds (default 30000, at most 600000).
    pub timeout_ms: Option<u64>,
}

/// What a command produced.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecResponseBody {
    /// The exit status (`128 + signal` when a signal ended it).
    pub exit_code: i32,
    /// Standard output (UTF-8, invalid bytes replaced), capped.
    pub stdout: String,
    /// Standard error, capped.
    pub stderr: String,
    /// Whether the timeout killed it.
    pub timed_out: bool,
    /// Whether an output stream was cut at the cap.
    pub truncated: bool,
}

/// One audit event.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditEventBody {
    /// Position in the log.
    pub seq: i64,
    /// `ensure`, `recover`, `deprovision`, `refresh`, `reconcile`.
    pub action: String,
    /// The org.
    pub org: String,
    /// `session` or `workflow`.
    pub kind: String,
    /// The session id or workflow execution id.
    pub key: String,
    /// The sandbox, when one was claimed.
    pub sandbox_id: Option<String>,
    /// Who asked.
    pub caller_id: String,
    /// Their class.
    pub caller_class: String,
    /// The durability decided.
    pub durability: Option<String>,
    /// The driver.
    pub driver: String,
    /// How it ended.
    pub outcome: String,
    /// The message (the failure message, for failures).
    pub message: String,
    /// The `jti` minted, when one was.
    pub token_id: Option<String>,
    /// RFC 3339.
    pub at: String,
    /// Whether a seal covers it yet.
    pub sealed: bool,
}

impl From<&ports::AuditEntry> for AuditEventBody {
    fn from(entry: &ports::AuditEntry) -> Self {
        let e = &entry.event;
        Self {
            seq: entry.seq,
            action: e.action.as_str().to_owned(),
            org: e.key.org().to_string(),
            kind: e.key.kind().as_str().to_owned(),
            key: e.key.key().to_owned(),
            sandbox_id: e.sandbox_id.as_ref().map(ToString::to_string),
            caller_id: e.caller_id.to_string(),
            caller_class: e.caller_class.as_str().to_owned(),
            durability: e.durability.map(|d| d.as_str().to_owned()),
            driver: e.driver.clone(),
            outcome: e.outcome.as_str().to_owned(),
            message: e.message.clone(),
            token_id: e.token_id.as_ref().map(ToString::to_string),
            at: e.at.to_rfc3339(),
            sealed: entry.sealed,
        }
    }
}

/// A page of audit events.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct AuditPageBody {
    /// Oldest first.
    pub events: Vec<AuditEventBody>,
    /// Pass as `after` for the next page.
    pub next: i64,
}

/// The query of an audit read.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Events with a greater seq (default 0).
    pub after: Option<i64>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<u32>,
}

/// The RFC 7662 introspection request (form-encoded).
#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct IntrospectRequest {
    /// The token to introspect.
    pub token: String,
    /// Ignored hint (RFC 7662).
    pub token_type_hint: Option<String>,
}

/// The RFC 7662 introspection response: `{"active": false}` or the claims.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct IntrospectResponse {
    /// Whether the token is active.
    pub active: bool,
    /// `sbx+jwt` when active.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_type: Option<String>,
    /// Issuer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// Audience.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub aud: Option<String>,
    /// The caller the token acts for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    /// The org.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    /// The session (empty for a workflow sandbox).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The execution.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_id: Option<String>,
    /// The sandbox.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox_id: Option<String>,
    /// Issued at.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iat: Option<i64>,
    /// Not before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nbf: Option<i64>,
    /// Expiry.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exp: Option<i64>,
    /// Token id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jti: Option<String>,
}

impl IntrospectResponse {
    /// `{"active": false}`.
    pub fn inactive() -> Self {
        Self {
            active: false,
            token_type: None,
            iss: None,
            aud: None,
            sub: None,
            org_id: None,
            session_id: None,
            execution_id: None,
            sandbox_id: None,
            iat: None,
            nbf: None,
            exp: None,
            jti: None,
        }
    }

    /// The response for verified claims.
    pub fn active(c: &ports::TokenClaims) -> Self {
        Self {
            active: true,
            token_type: Some("sbx+jwt".to_owned()),
            iss: Some(c.iss.clone()),
            aud: Some(c.aud.clone()),
            sub: Some(c.sub.to_string()),
            org_id: Some(c.org_id.to_string()),
            session_id: Some(c.session_id.clone()),
            execution_id: Some(c.execution_id.clone()),
            sandbox_id: Some(c.sandbox_id.to_string()),
            iat: Some(c.iat),
            nbf: Some(c.nbf),
            exp: Some(c.exp),
            jti: Some(c.jti.to_string()),
        }
    }
}

/// A health or readiness answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthBody {
    /// `ok` or `unavailable`.
    pub status: String,
    /// Per-check details.
    pub checks: Vec<HealthCheckBody>,
}

/// One readiness check.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HealthCheckBody {
    /// `database` or `driver`.
    pub name: String,
    /// Whether it passed.
    pub ok: bool,
    /// What it found.
    pub detail: String,
}
