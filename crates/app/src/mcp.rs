//! The Model Context Protocol at `/mcp` (`docs/mcp.md`): the lane's tools for an agent
//! framework, over the Streamable HTTP transport of the official Rust SDK (`rmcp`).
//!
//! # Who calls
//! Every request is authenticated before the transport sees it, exactly as an API route:
//! `Authorization: Bearer` with a caller key or a sandbox token ([`Principal`]); without
//! one the answer is the API's 401. The principal rides in the request's extensions to the
//! tools ([`tools`]), and each tool calls the use case its HTTP route calls, so who may do
//! what is decided by one rule, not a second one.
//!
//! # Stateless
//! The transport keeps no session: every POST carries a whole JSON-RPC exchange (an
//! `initialize` too), so any replica answers any request and a client holds no server
//! memory between calls. Streams the protocol would open with `GET` are refused (405).
//!
//! # Hosts
//! The SDK checks the `Host` header against loopback names by default, against DNS
//! rebinding of a local server by a web page. Here every request needs a bearer credential
//! that a page cannot make a browser send, so the check is off and the server answers on
//! whatever name it is reached by.

pub mod tools;

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::http::AppState;
use crate::http::auth::Principal;

/// The path the MCP endpoint is served at.
pub const PATH: &str = "/mcp";

/// The `/mcp` route: authentication, then the Streamable HTTP transport serving
/// [`tools::LaneTools`].
pub fn router(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let body_limit = state.body_limit;
    let tools_state = state.clone();
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(body_limit)
        .disable_allowed_hosts();
    let service = StreamableHttpService::new(
        move || Ok(tools::LaneTools::new(tools_state.clone())),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new().route_service(PATH, service).layer(middleware::from_fn_with_state(state, authenticate))
}

/// Refuses a request without a caller key or sandbox token (the API's 401 or 503), and
/// hands the principal to the tools.
async fn authenticate(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    match <Principal as FromRequestParts<Arc<AppState>>>::from_request_parts(&mut parts, &state).await {
        Ok(principal) => {
            parts.extensions.insert(principal);
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => e.into_response(),
    }
}
