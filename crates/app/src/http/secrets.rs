//! The secret routes: set, list and delete an org's brokered secrets. Write-only: no
//! answer holds a value (the request's value is dropped once stored).

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use domain::broker::SecretScope;
use domain::broker::binding::{MAX_ITEMS, MAX_PATH_LEN, MAX_VALUE_LEN};
use domain::{CallerClass, IdentityId, OrgId, SecretValue};
use ports::SecretEntry;
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{
    AdditionalProperties, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type,
};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::dto::OrgPath;
use super::error::{ApiError, ErrorBody};
use crate::usecase::{self, SecretError, SecretRequest};

/// The path of a secret.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SecretPath {
    /// The org.
    #[param(value_type = super::dto::Id)]
    pub org: String,
    /// The secret's name: 1-64 of a-z A-Z 0-9 . _ -, the first a letter or digit.
    #[param(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    pub name: String,
}

/// Who a secret is for: exactly one of `identity`, `class` or `org`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopeBody {
    /// One caller's identity id (a user caller may set only its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<String>,
    /// Every caller of a class: `user` or `service`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Every caller of the org: `true`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub org: Option<bool>,
}

impl utoipa::PartialSchema for ScopeBody {
    fn schema() -> RefOr<Schema> {
        let one = |name: &str, schema: Schema, description: &str| -> Schema {
            ObjectBuilder::new()
                .property(name, schema)
                .required(name)
                .additional_properties(Some(AdditionalProperties::FreeForm(false)))
                .description(Some(description))
                .into()
        };
        let identity = match <super::dto::Id as utoipa::PartialSchema>::schema() {
            RefOr::T(schema) => schema,
            RefOr::Ref(_) => ObjectBuilder::new().schema_type(Type::String).into(),
        };
        OneOfBuilder::new()
            .item(one("identity", identity, "One caller's identity id (a user caller may set only its own)."))
            .item(one(
                "class",
                ObjectBuilder::new().schema_type(Type::String).enum_values(Some(["user", "service"])).into(),
                "Every caller of a class.",
            ))
            .item(one(
                "org",
                ObjectBuilder::new().schema_type(Type::Boolean).enum_values(Some([true])).into(),
                "Every caller of the org.",
            ))
            .description(Some("Who a secret is for: exactly one of `identity`, `class` or `org`."))
            .into()
    }
}

impl ToSchema for ScopeBody {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("ScopeBody")
    }
}

/// A value: 1 to [`MAX_VALUE_LEN`] bytes, no control character but tab, no white space at
/// either end (the domain's [`domain::broker::check_value`]).
fn value_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_VALUE_LEN))
        .pattern(Some(r"^[^\s\x00-\x1f\x7f]([^\x00-\x08\x0a-\x1f\x7f]*[^\s\x00-\x1f\x7f])?$"))
        .description(Some(format!(
            "The value: 1 to {MAX_VALUE_LEN} bytes, no control characters but tab, no white space at either end."
        )))
        .into()
}

/// A list of at most [`MAX_ITEMS`] strings, each matching `pattern`.
fn items(min: usize, pattern: &str, max_length: usize, description: &str) -> Schema {
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(max_length))
                .pattern(Some(pattern)),
        )
        .min_items(Some(min))
        .max_items(Some(MAX_ITEMS))
        .description(Some(description))
        .into()
}

fn hosts_schema() -> Schema {
    items(
        1,
        r"^\S+$",
        300,
        "The hosts it is sent to (1 to 32): `api.example.com`, `*.example.com`, either with `:port` \
         (without one: 443; a secret goes over plain HTTP only to a port named here, never 443). Each must be in the org's egress allowlist for the scope's classes.",
    )
}

fn methods_schema() -> Schema {
    items(0, r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", 32, "The methods it may be sent with (at most 32; none: any).")
}

fn paths_schema() -> Schema {
    items(
        0,
        r"^/[!-~]*$",
        MAX_PATH_LEN,
        "The path prefixes it may be sent to (at most 32, each from `/`; none: any).",
    )
}

impl ScopeBody {
    fn scope(&self) -> Result<SecretScope, ApiError> {
        match (&self.identity, &self.class, self.org) {
            (Some(id), None, None) => Ok(SecretScope::Identity(IdentityId::parse(id.clone())?)),
            (None, Some(class), None) => {
                let class = CallerClass::parse_wire(class).map_err(|e| ApiError::invalid(e.to_string()))?;
                SecretScope::class(class).map_err(|e| ApiError::invalid(e.to_string()))
            }
            (None, None, Some(true)) => Ok(SecretScope::Org),
            _ => Err(ApiError::invalid(
                "scope must be exactly one of {\"identity\": ID}, {\"class\": \"user\"|\"service\"} or {\"org\": true}",
            )),
        }
    }

    fn of(scope: &SecretScope) -> Self {
        match scope {
            SecretScope::Identity(id) => Self { identity: Some(id.to_string()), ..Self::default() },
            SecretScope::Class(c) => Self { class: Some(c.as_str().to_owned()), ..Self::default() },
            SecretScope::Org => Self { org: Some(true), ..Self::default() },
        }
    }
}

/// A secret to set. Its value is stored sealed and never shown again.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutSecretBody {
    /// The value (1-8192 bytes, no control characters, no leading or trailing space).
    #[serde(deserialize_with = "value_text")]
    #[schema(schema_with = value_schema)]
    pub value: SecretValue,
    /// The hosts it is sent to: `api.example.com`, `*.example.com`, either with `:port`
    /// (without one: 443; a secret goes over plain HTTP only to a port named here, never
    /// 443). Each must be in the org's egress allowlist for the
    /// scope's classes.
    #[schema(schema_with = hosts_schema)]
    pub hosts: Vec<String>,
    /// The header it is sent in (default `authorization`).
    #[serde(default)]
    #[schema(min_length = 1, max_length = 64, pattern = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")]
    pub header: Option<String>,
    /// How the value becomes the header's value: `{value}` exactly once (default `Bearer
    /// {value}` for `authorization`, `{value}` otherwise).
    #[serde(default)]
    #[schema(max_length = 256, pattern = r"\{value\}")]
    pub format: Option<String>,
    /// Who it is for.
    pub scope: ScopeBody,
    /// The methods it may be sent with (default: any); others are refused by the proxy.
    #[serde(default)]
    #[schema(schema_with = methods_schema)]
    pub methods: Option<Vec<String>>,
    /// The path prefixes it may be sent to (default: any); others are refused by the proxy.
    #[serde(default)]
    #[schema(schema_with = paths_schema)]
    pub paths: Option<Vec<String>>,
}

/// A value must be a JSON string. Anything else is refused in fixed words: serde's own
/// message would quote a number or a boolean given as the value, and the message goes to the
/// response body (and to axum's rejection log).
fn value_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<SecretValue, D::Error> {
    // A syntax error's message (an invalid escape, the end of the input) quotes nothing.
    match serde_json::Value::deserialize(d)? {
        serde_json::Value::String(s) => Ok(SecretValue::new(s)),
        _ => Err(serde::de::Error::custom("the value must be a JSON string")),
    }
}

impl std::fmt::Debug for PutSecretBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutSecretBody")
            .field("hosts", &self.hosts)
            .field("scope", &self.scope)
            .finish_non_exhaustive()
    }
}

/// A secret as listed: its binding, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct SecretBody {
    /// Its name.
    pub name: String,
    /// The hosts it is sent to.
    pub hosts: Vec<String>,
    /// The header, lower case.
    pub header: String,
    /// The format.
    pub format: String,
    /// Who it is for.
    pub scope: ScopeBody,
    /// The methods allowed (empty: any).
    pub methods: Vec<String>,
    /// The path prefixes allowed (empty: any).
    pub paths: Vec<String>,
    /// When it was first set (RFC 3339).
    pub created_at: String,
    /// When it was last set (RFC 3339).
    pub updated_at: String,
}

impl From<&SecretEntry> for SecretBody {
    fn from(e: &SecretEntry) -> Self {
        let b = &e.binding;
        Self {
            name: b.name.to_string(),
            hosts: b.hosts.iter().map(ToString::to_string).collect(),
            header: b.header.as_str().to_owned(),
            format: b.format.as_str().to_owned(),
            scope: ScopeBody::of(&b.scope),
            methods: b.methods.clone(),
            paths: b.paths.clone(),
            created_at: e.created_at.to_rfc3339(),
            updated_at: e.updated_at.to_rfc3339(),
        }
    }
}

/// The secrets of an org the caller may see.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SecretListBody {
    /// By name.
    pub secrets: Vec<SecretBody>,
}

impl From<SecretError> for ApiError {
    fn from(e: SecretError) -> Self {
        match e {
            SecretError::Denied(m) => Self::denied(m),
            e @ SecretError::NotFound { .. } => Self::not_found(e.to_string()),
            SecretError::Invalid(m) => Self::invalid(m),
            e @ SecretError::Taken(_) => Self::new(super::error::Code::Conflict, e.to_string()),
            SecretError::Exhausted(m) => Self::new(super::error::Code::ResourceExhausted, m),
            SecretError::Unavailable(m) => Self::unavailable(m),
        }
    }
}

/// Set a secret (make or replace it).
#[utoipa::path(
    put, path = "/v1/orgs/{org}/secrets/{name}", tag = "secrets",
    params(SecretPath),
    request_body = PutSecretBody,
    responses(
        (status = 200, description = "replaced (never with its value)", body = SecretBody),
        (status = 201, description = "made (never with its value)", body = SecretBody),
        (status = 400, description = "the org, name, value or binding breaks the rules, or a host is not in the org's egress allowlist for the scope's classes (named)", body = ErrorBody),
        (status = 403, description = "a sandbox token; a caller of another org; a user caller naming a scope other than its own identity", body = ErrorBody),
        (status = 409, description = "the name is taken by a secret the caller cannot manage", body = ErrorBody),
        (status = 429, description = "the org holds 500 secrets, or the identity scope 50", body = ErrorBody),
        (status = 503, description = "the store, the policy or the audit log is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn put_secret(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, name)): Path<(String, String)>,
    Json(b): Json<PutSecretBody>,
) -> Result<(StatusCode, Json<SecretBody>), ApiError> {
    let org = OrgId::parse(org)?;
    let request = SecretRequest {
        value: b.value,
        hosts: b.hosts,
        header: b.header,
        format: b.format,
        scope: b.scope.scope()?,
        methods: b.methods.unwrap_or_default(),
        paths: b.paths.unwrap_or_default(),
    };
    let (created, entry) =
        usecase::set_secret(&state.deps.secret_ports(), &principal.0, &org, &name, request).await?;
    let status = if created { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(SecretBody::from(&entry))))
}

/// List the org's secrets the caller may manage (never their values).
#[utoipa::path(
    get, path = "/v1/orgs/{org}/secrets", tag = "secrets",
    params(OrgPath),
    responses(
        (status = 200, description = "the secrets, by name: a service caller sees every one, a user caller its own", body = SecretListBody),
        (status = 400, description = "the org breaks the id rules", body = ErrorBody),
        (status = 403, description = "a sandbox token, or a caller of another org", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_secrets(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path(org): Path<String>,
) -> Result<Json<SecretListBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let secrets = usecase::list_secrets(&state.deps.secret_ports(), &principal.0, &org).await?;
    Ok(Json(SecretListBody { secrets: secrets.iter().map(SecretBody::from).collect() }))
}

/// Delete a secret: no connection opened after this carries it.
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/secrets/{name}", tag = "secrets",
    params(SecretPath),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "the org breaks the id rules", body = ErrorBody),
        (status = 403, description = "a sandbox token, or a caller of another org", body = ErrorBody),
        (status = 404, description = "no such secret the caller may manage", body = ErrorBody),
        (status = 503, description = "the store or the audit log is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete_secret(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, name)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let org = OrgId::parse(org)?;
    usecase::delete_secret(&state.deps.secret_ports(), &principal.0, &org, &name).await?;
    Ok(StatusCode::NO_CONTENT)
}
