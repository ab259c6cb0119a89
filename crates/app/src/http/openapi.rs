//! The OpenAPI document, generated from the handlers' annotations so it cannot drift.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{audit, dto, error, meta, sandboxes, tokens};

/// The API document.
#[derive(OpenApi)]
#[openapi(
    info(title = "sandlane", description = "The sandbox lane of an agent-execution server."),
    paths(
        sandboxes::ensure_session, sandboxes::ensure_workflow, sandboxes::recover_workflow,
        sandboxes::deprovision_session, sandboxes::deprovision_workflow, sandboxes::get_sandbox,
        sandboxes::exec, audit::read_audit, tokens::introspect, tokens::jwks,
        meta::healthz, meta::readyz, meta::metrics, meta::openapi,
    ),
    components(schemas(
        error::ErrorBody, error::Code, dto::SandboxBody, dto::EnsureSessionRequest, dto::EnsureResponse,
        dto::ExecRequestBody, dto::ExecResponseBody, dto::AuditEventBody, dto::AuditPageBody,
        dto::IntrospectRequest, dto::IntrospectResponse, dto::HealthBody, dto::HealthCheckBody,
    )),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}
