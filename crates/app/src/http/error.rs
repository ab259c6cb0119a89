//! The API's one error shape: `{"error": CODE, "message": TEXT, "trace_id": ID}` with the
//! status of CODE.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// An API error code (`docs/api.md`, "Errors").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// 400: the request is malformed or names an invalid id.
    InvalidArgument,
    /// 401: no credential, or one that does not authenticate.
    Unauthenticated,
    /// 403: authenticated, but not allowed here.
    PermissionDenied,
    /// 404: no such resource or route.
    NotFound,
    /// 409: the resource is not in a state that allows this.
    Conflict,
    /// 413: the request body (or a file or archive) is over the configured cap.
    TooLarge,
    /// 429: a quota or cap is used up (the org's or the sandbox's concurrent commands, the
    /// org's running sandboxes when a command would resume one; a sandbox's background
    /// processes, their buffered output, the sandbox's disk).
    ResourceExhausted,
    /// 503: a dependency (the sandbox provisioning, the database) is unavailable.
    Unavailable,
    /// 500: an unexpected failure.
    Internal,
}

impl Code {
    /// Every code.
    pub const ALL: [Code; 9] = [
        Self::InvalidArgument,
        Self::Unauthenticated,
        Self::PermissionDenied,
        Self::NotFound,
        Self::Conflict,
        Self::TooLarge,
        Self::ResourceExhausted,
        Self::Unavailable,
        Self::Internal,
    ];

    /// The HTTP status of this code.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidArgument => StatusCode::BAD_REQUEST,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Conflict => StatusCode::CONFLICT,
            Self::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

/// The JSON body of every error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The code.
    pub error: Code,
    /// What went wrong, for a person. Never a secret.
    pub message: String,
    /// The request's trace id (32 hex digits; the caller's `traceparent`'s when it sent
    /// one), as in the server's log lines and exported spans. Absent outside a request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// An error a handler returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The code.
    pub code: Code,
    /// The message.
    pub message: String,
}

impl ApiError {
    /// An error with `code` and `message`.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    /// 400.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }
    /// 401.
    pub fn unauthenticated(message: impl Into<String>) -> Self {
        Self::new(Code::Unauthenticated, message)
    }
    /// 403.
    pub fn denied(message: impl Into<String>) -> Self {
        Self::new(Code::PermissionDenied, message)
    }
    /// 404.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }
    /// 503.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }
    /// 503 for a dependency that failed (the database, the driver, the sandbox's side):
    /// the body says `what` in fixed words; the error with its causes, which may hold a
    /// database's, driver's or kernel's message, goes to the log at warn level only.
    pub fn dependency(what: &str, error: &(dyn std::error::Error + 'static)) -> Self {
        tracing::warn!(error = %crate::usecase::chain(error), "{what}");
        Self::new(Code::Unavailable, format!("{what}; see the server log"))
    }
    /// 503 for a use case's error whose own message names the failed step in fixed words
    /// (what failed below it, a store's or driver's message, is its source): the body is
    /// that message, the log has every cause (see [`ApiError::dependency`]).
    pub fn unavailable_from(error: &(dyn std::error::Error + 'static)) -> Self {
        Self::dependency(&error.to_string(), error)
    }
    /// 500. The detail is logged; the caller sees a generic message.
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        tracing::error!(error = %detail, "internal error");
        Self::new(Code::Internal, "internal error; see the server log")
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let trace_id = crate::telemetry::current_trace_id().map(|t| t.as_str().to_owned());
        let body = ErrorBody { error: self.code, message: self.message, trace_id };
        (self.code.status(), Json(body)).into_response()
    }
}

impl From<domain::IdError> for ApiError {
    fn from(e: domain::IdError) -> Self {
        Self::invalid(e.to_string())
    }
}
