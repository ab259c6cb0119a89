//! The OpenAPI document, generated from the handlers' annotations so it cannot drift.
//!
//! Each handler's `#[utoipa::path]` lists the responses the handler itself decides; the
//! `LayerResponses` modifier adds the ones the router's layers give every route they
//! wrap (authentication, body and query parsing, the body limit, the request timeout,
//! panic capture), so no operation can forget them.

use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, Ref, ResponseBuilder};
use utoipa::{Modify, OpenApi};

use super::{
    audit, dto, error, files, meta, ndjson, org_sandboxes, policy, preview, processes, sandboxes, secrets,
    snapshots, terminals, tokens, webhooks,
};

/// The API document.
#[derive(OpenApi)]
#[openapi(
    info(title = "sandlane", description = "The sandbox lane of an agent-execution server: the HTTP API v1. \
        Errors are `{\"error\": CODE, \"message\": TEXT, \"trace_id\": ID}`; a method a path lacks gets 405 (code \
        `invalid_argument`) with an `Allow` header."),
    paths(
        sandboxes::ensure_session, sandboxes::ensure_workflow, sandboxes::recover_workflow,
        sandboxes::deprovision_session, sandboxes::deprovision_workflow, sandboxes::get_sandbox,
        sandboxes::exec, processes::start_process, processes::list_processes, processes::get_process,
        processes::process_output, processes::process_stdin, processes::signal_process,
        terminals::create_terminal, terminals::list_terminals, terminals::get_terminal,
        terminals::delete_terminal, terminals::create_ticket, files::read_file,
        files::write_file, files::delete_file, files::read_archive, files::write_archive,
        audit::read_audit, audit::verify_audit, org_sandboxes::list_sandboxes, webhooks::list_deliveries, policy::read_policy, secrets::put_secret, secrets::list_secrets,
        secrets::delete_secret, snapshots::take_snapshot, snapshots::list_snapshots, snapshots::get_snapshot,
        snapshots::delete_snapshot, snapshots::restore_sandbox, preview::create_link, preview::list_links,
        preview::revoke_link, tokens::introspect, tokens::jwks,
        meta::healthz, meta::readyz, meta::metrics, meta::openapi,
    ),
    components(schemas(
        error::ErrorBody, error::Code, dto::Id, dto::SandboxId, dto::SandboxBody, dto::EnsureSessionRequest,
        dto::EnsureResponse, dto::ExecRequestBody, dto::ExecResponseBody, dto::AuditEventBody,
        dto::AuditPageBody, dto::IntrospectRequest, dto::IntrospectResponse, dto::HealthBody,
        dto::HealthCheckBody, policy::PolicyBody, secrets::ScopeBody, secrets::PutSecretBody,
        secrets::SecretBody, secrets::SecretListBody, ndjson::StreamFrame, processes::StartProcessBody,
        processes::ProcessBody, processes::ProcessListBody, processes::SignalBody, processes::RawBytes,
        files::DirectoryBody, files::EntryBody, files::FileWrittenBody, files::UnpackedBody,
        files::TarArchive, files::PathText, snapshots::SnapshotIdSchema, snapshots::TakeSnapshotBody,
        snapshots::RestoreBody, snapshots::SnapshotBody, snapshots::SnapshotListBody, snapshots::RestoredBody,
        dto::EnsureWorkflowRequest, terminals::TerminalIdSchema, terminals::StartTerminalBody,
        terminals::TerminalBody, terminals::TerminalListBody, terminals::TicketBody,
        audit::AuditVerdictBody, org_sandboxes::ListedSandboxBody, org_sandboxes::SandboxListBody,
        webhooks::DeliveryBody, webhooks::DeliveryListBody,
        preview::CreateLinkBody, preview::LinkBody, preview::LinkListBody,
    )),
    modifiers(&BearerAuth, &LayerResponses)
)]
pub struct ApiDoc;

/// The document as served at `/openapi.json`, built once.
pub fn document() -> &'static str {
    static DOCUMENT: OnceLock<String> = OnceLock::new();
    DOCUMENT.get_or_init(|| {
        let mut value = serde_json::to_value(ApiDoc::openapi()).unwrap_or(Value::Null);
        camel_case_links(&mut value);
        value.to_string()
    })
}

/// utoipa 5 writes a Link object's `operationId`, `operationRef` and `requestBody` in
/// snake case; OpenAPI readers (and the stateful fuzzer) look for the camel-case names.
fn camel_case_links(document: &mut Value) {
    let Some(paths) = document.get_mut("paths").and_then(Value::as_object_mut) else { return };
    let links = paths
        .values_mut()
        .filter_map(Value::as_object_mut)
        .flat_map(|item| item.values_mut())
        .filter_map(|operation| operation.get_mut("responses").and_then(Value::as_object_mut))
        .flat_map(|responses| responses.values_mut())
        .filter_map(|response| response.get_mut("links").and_then(Value::as_object_mut))
        .flat_map(|links| links.values_mut())
        .filter_map(Value::as_object_mut);
    for link in links {
        for (snake, camel) in [
            ("operation_id", "operationId"),
            ("operation_ref", "operationRef"),
            ("request_body", "requestBody"),
        ] {
            if let Some(v) = link.remove(snake) {
                link.insert(camel.to_owned(), v);
            }
        }
    }
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "A caller key from `sandlane caller add`, or (for exec, files and processes \
                             in its own sandbox) a sandbox token",
                        ))
                        .build(),
                ),
            );
        }
    }
}

/// Adds the responses of the router's layers to every operation they apply to, keeping
/// any the handler documents itself.
struct LayerResponses;

fn error_response(operation: &mut Operation, status: u16, description: &str) {
    let response = ResponseBuilder::new()
        .description(description)
        .content("application/json", Content::new(Some(Ref::from_schema_name("ErrorBody"))))
        .build();
    operation.responses.responses.entry(status.to_string()).or_insert_with(|| response.into());
}

impl Modify for LayerResponses {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            let operations =
                [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for operation in operations.into_iter().flatten() {
                let secured = operation.security.as_ref().is_some_and(|s| !s.is_empty());
                let has_body = operation.request_body.is_some();
                let has_query = operation
                    .parameters
                    .iter()
                    .flatten()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Query));
                if has_body || has_query {
                    error_response(
                        operation,
                        400,
                        "invalid_argument: the body or query does not match its schema",
                    );
                }
                if secured {
                    error_response(
                        operation,
                        401,
                        "unauthenticated: no `Authorization: Bearer` credential, or one that does \
                         not authenticate (unknown, revoked, expired)",
                    );
                }
                if has_body {
                    error_response(operation, 413, "too_large: the body is over `http.body_limit_bytes`");
                }
                error_response(operation, 500, "internal: a failure the server did not expect (see its log)");
                error_response(
                    operation,
                    503,
                    "unavailable: a dependency (the database, the driver) cannot answer now, or the \
                     request took longer than `http.request_timeout_ms`",
                );
            }
        }
    }
}
