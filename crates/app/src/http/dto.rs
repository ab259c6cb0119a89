//! The JSON bodies and parameters of the API, with their OpenAPI schemas. Every rule a
//! schema states (patterns, lengths, bounds) is read from the domain's own constants, so
//! the document says exactly what the server accepts.

use std::borrow::Cow;

use domain::exec::{ARG_PATTERN, MAX_ARGV, MAX_EXEC_TIMEOUT_MS};
use domain::id::{MAX_ID_LEN, SANDBOX_ID_LEN, id_pattern, sandbox_id_pattern};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type};
use utoipa::{IntoParams, PartialSchema, ToSchema};

use crate::usecase::SandboxView;

/// The schema of an id (org, session id, execution id, identity id): the domain's rule.
pub struct Id;

impl PartialSchema for Id {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!("1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 . _ : @ -")))
            .min_length(Some(1))
            .max_length(Some(MAX_ID_LEN))
            .pattern(Some(id_pattern()))
            .examples(["acme"])
            .into()
    }
}

impl ToSchema for Id {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("Id")
    }
}

/// The schema of a sandbox id: `sbx_` and 26 Crockford base32 characters.
pub struct SandboxId;

impl PartialSchema for SandboxId {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some("`sbx_` then 26 Crockford base32 characters (time-ordered)"))
            .min_length(Some(SANDBOX_ID_LEN))
            .max_length(Some(SANDBOX_ID_LEN))
            .pattern(Some(sandbox_id_pattern()))
            .examples(["sbx_01KA2B3C4D5E6F7G8H9JKMNPQR"])
            .into()
    }
}

impl ToSchema for SandboxId {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("SandboxId")
    }
}

/// `argv`: a program (non-empty) and its arguments, none holding a NUL byte.
pub(crate) fn argv_schema() -> Schema {
    let arg = |min: usize| {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(min))
            .pattern(Some(ARG_PATTERN))
            .build()
    };
    ArrayBuilder::new()
        .prefix_items([arg(1)])
        .items(arg(0))
        .min_items(Some(1))
        .max_items(Some(MAX_ARGV))
        .description(Some("The program and its arguments: `argv[0]` is looked up on `PATH`."))
        .into()
}

/// `timeout_ms`: absent or null for the default, else 1 to the domain's maximum.
fn timeout_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Integer, Type::Null]))
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int64)))
        .minimum(Some(1))
        .maximum(Some(MAX_EXEC_TIMEOUT_MS as f64))
        .description(Some(format!(
            "Wall-clock limit in milliseconds (default {}, at most {MAX_EXEC_TIMEOUT_MS}).",
            domain::exec::DEFAULT_EXEC_TIMEOUT_MS
        )))
        .into()
}

/// A JSON Schema `integer` is any number with no fraction, `5.0` as well as `5`: accept
/// what the schema promises.
pub(crate) fn whole_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let Some(number) = Option::<serde_json::Number>::deserialize(d)? else { return Ok(None) };
    if let Some(n) = number.as_u64() {
        return Ok(Some(n));
    }
    match number.as_f64() {
        // Every whole f64 in 0..2^64 converts exactly.
        Some(f) if f.fract() == 0.0 && (0.0..18_446_744_073_709_551_616.0).contains(&f) => Ok(Some(f as u64)),
        _ => Err(serde::de::Error::custom(format!("{number} is not a whole number of milliseconds"))),
    }
}

/// `limit` of an audit read.
fn audit_limit_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::Integer)
        .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Int32)))
        .minimum(Some(1))
        .maximum(Some(AuditQuery::MAX_LIMIT))
        .description(Some(format!(
            "At most this many events (default {}, at most {}).",
            AuditQuery::DEFAULT_LIMIT,
            AuditQuery::MAX_LIMIT
        )))
        .into()
}

/// The path of a session's sandbox.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// The org.
    #[param(value_type = Id)]
    pub org: String,
    /// The session.
    #[param(value_type = Id)]
    pub session_id: String,
}

/// The path of a workflow execution's sandbox.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct WorkflowPath {
    /// The org.
    #[param(value_type = Id)]
    pub org: String,
    /// The workflow execution.
    #[param(value_type = Id)]
    pub execution_id: String,
}

/// The path of a sandbox.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SandboxPath {
    /// The org the sandbox belongs to.
    #[param(value_type = Id)]
    pub org: String,
    /// The sandbox.
    #[param(value_type = SandboxId)]
    pub sandbox_id: String,
}

/// The path of an org.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct OrgPath {
    /// The org.
    #[param(value_type = Id)]
    pub org: String,
}

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
    /// The snapshot this ensure forked the sandbox from (`snp_…`), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    /// The snapshot this ensure named but did not fork from: the key's sandbox was live
    /// already, and an ensure reuses it as it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub snapshot_ignored: Option<String>,
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
            forked_from: v.forked_from.as_ref().map(ToString::to_string),
            snapshot_ignored: v.snapshot_ignored.as_ref().map(ToString::to_string),
        }
    }
}

/// The body of a session ensure.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnsureSessionRequest {
    /// The agent execution being launched in the session.
    #[schema(value_type = Id)]
    pub execution_id: String,
    /// A fork: when the session has no live sandbox, the new one's workspace starts as
    /// this snapshot's files (the snapshot's owner or a service caller of the org only).
    #[schema(value_type = Option<super::snapshots::SnapshotIdSchema>)]
    pub from_snapshot: Option<String>,
}

/// The optional body of a workflow ensure.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EnsureWorkflowRequest {
    /// A fork, as for a session ensure.
    #[schema(value_type = Option<super::snapshots::SnapshotIdSchema>)]
    pub from_snapshot: Option<String>,
}

/// The result of an ensure.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "lowercase")]
pub enum EnsureResponse {
    /// The sandbox is ready.
    #[schema(title = "EnsureReady")]
    Ready {
        /// The sandbox.
        sandbox: Box<SandboxBody>,
    },
    /// Provisioning failed (session ensures only); the message has the prefix.
    #[schema(title = "EnsureFailed")]
    Failed {
        /// `Sandbox provisioning failed: …`.
        message: String,
    },
    /// The lane is off: nothing was provisioned.
    #[schema(title = "EnsureDisabled")]
    Disabled,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecRequestBody {
    /// The program and its arguments.
    #[schema(schema_with = argv_schema)]
    pub argv: Vec<String>,
    /// Text fed to standard input.
    pub stdin: Option<String>,
    /// Wall-clock limit in milliseconds.
    #[schema(schema_with = timeout_schema)]
    #[serde(default, deserialize_with = "whole_number")]
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
    /// `ensure`, `recover`, `deprovision`, `refresh`, `reconcile`, `egress`,
    /// `egress_summary`.
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
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Events with a greater seq (default 0): pass the `next` of the previous page.
    #[param(minimum = 0)]
    pub after: Option<i64>,
    /// At most this many events.
    #[param(schema_with = audit_limit_schema)]
    pub limit: Option<u32>,
}

impl AuditQuery {
    /// The largest page.
    pub const MAX_LIMIT: u32 = 1000;
    /// The page size when none is asked for.
    pub const DEFAULT_LIMIT: u32 = 100;
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
