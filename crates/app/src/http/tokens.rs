//! Token routes: RFC 7662 introspection and the JWKS document.

use std::sync::Arc;

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::{Form, Json};
use domain::SandboxToken;

use super::AppState;
use super::auth::Principal;
use super::dto::{IntrospectRequest, IntrospectResponse};
use super::error::{ApiError, ErrorBody};

/// RFC 7662 introspection of a sandbox token; any caller key may ask.
#[utoipa::path(
    post, path = "/v1/introspect", tag = "tokens",
    request_body(content = IntrospectRequest, content_type = "application/x-www-form-urlencoded"),
    responses((status = 200, description = "`{\"active\": false}`, or the claims of an active token", body = IntrospectResponse),
        (status = 403, description = "a sandbox token may not introspect", body = ErrorBody)),
    security(("bearer" = []))
)]
pub async fn introspect(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Form(form): Form<IntrospectRequest>,
) -> Result<Json<IntrospectResponse>, ApiError> {
    principal.any_caller()?;
    let response = match state.verifier.verify(&SandboxToken::new(form.token)).await {
        Ok(claims) => IntrospectResponse::active(&claims),
        Err(_) => IntrospectResponse::inactive(),
    };
    Ok(Json(response))
}

/// The public keys that verify sandbox tokens (RFC 7517).
#[utoipa::path(
    get, path = "/.well-known/jwks.json", tag = "tokens",
    responses((status = 200, description = "a JWKS document", content_type = "application/json"))
)]
pub async fn jwks(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(CONTENT_TYPE, "application/json")], state.verifier.jwks_json())
}
