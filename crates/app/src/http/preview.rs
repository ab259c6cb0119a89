//! Preview ports over HTTP: the host-based relay in front of the API router (a request
//! whose host is `{port}-{sandbox label}.{http.preview_domain}` goes to that port inside
//! the sandbox, HTTP/1.1 and WebSocket upgrades alike), and the routes of preview links.
//!
//! Who may open a port: a `Bearer` caller key allowed to exec in the sandbox, or the
//! cookie a preview link's token was traded for (`?sandlane_preview_token=…` on the first
//! visit: the link is checked, the opening audited, and the visitor redirected to the same
//! URL without the token, with a cookie scoped to that host, `__Host-` over TLS). The
//! cookie's link is read from the store on every request, so a revoked link refuses the
//! next one. A request with
//! the cookie must also pass the Fetch Metadata rule of [`super::isolation`]: every preview
//! host is the same site, so `SameSite=Lax` alone would let one sandbox's pages use the
//! visitor's cookie of another's.
//!
//! What crosses into the sandbox is what the visitor's application needs, never the lane's
//! credentials: the `Authorization` header and the lane's cookie are removed, as are the
//! hop-by-hop headers; a request body is held to `http.body_limit_bytes`. What comes back
//! is relayed as it comes (never buffered whole), without hop-by-hop headers, and without
//! any `Set-Cookie` that names a `Domain` (it could toss cookies onto other sandboxes'
//! hosts) or the lane's cookie. A visitor that goes away closes the sandbox's connection.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use domain::preview::{MAX_LINK_TTL_S, MIN_LINK_TTL_S};
use domain::{
    Actor, CallerClass, CallerKey, LinkRefusal, OrgId, PreviewHost, PreviewLink, PreviewLinkId, SandboxId,
};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, Code, ErrorBody};
use crate::usecase::preview::{self as usecase, PreviewError};

mod relay;

/// The lane's cookie on a preview host: the link's token.
pub const COOKIE: &str = "sandlane_preview";
/// The same cookie given over TLS: a browser keeps a `__Host-` cookie only when it is
/// `Secure`, has `Path=/` and no `Domain`, so no page of another sandbox (every preview host
/// is the same site) can set one that the browser would send here.
pub const HOST_COOKIE: &str = "__Host-sandlane_preview";

/// Whether a cookie's name is the lane's (either form).
fn is_lane_cookie(name: &str) -> bool {
    name == COOKIE || name == HOST_COOKIE
}
/// The query parameter a preview link's URL carries its token in.
pub const TOKEN_PARAM: &str = "sandlane_preview_token";

/// The middleware in front of the API router: requests to a preview host are relayed to
/// the sandbox's port; every other request goes on to the API.
pub async fn route(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
    match host.as_deref().and_then(|h| PreviewHost::route(h, &state.preview_domain)) {
        None => next.run(request).await,
        Some(Err(e)) => page(StatusCode::NOT_FOUND, "No such preview", &e.to_string()),
        Some(Ok(host)) => serve(&state, &host, request).await,
    }
}

/// A small HTML page saying what went wrong (what a person opening a preview sees).
fn page(status: StatusCode, title: &str, message: &str) -> Response {
    let escape =
        |s: &str| s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;");
    let body = format!(
        "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>{title}</title></head>\
         <body><h1>{} {title}</h1><p>{}</p><p><small>sandlane preview</small></p></body></html>\n",
        status.as_u16(),
        escape(message),
        title = escape(title),
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

fn error_page(e: &PreviewError) -> Response {
    use crate::usecase::AccessError;
    let message = e.to_string();
    match e {
        PreviewError::Access(AccessError::Denied(_)) => page(StatusCode::FORBIDDEN, "Forbidden", &message),
        PreviewError::Access(AccessError::NotFound { .. } | AccessError::NoSnapshot { .. })
        | PreviewError::NoSandbox(_)
        | PreviewError::NoLink(_) => page(StatusCode::NOT_FOUND, "No such sandbox", &message),
        PreviewError::PortClosed(_) => page(StatusCode::FORBIDDEN, "Port not open to previews", &message),
        PreviewError::Link(_) => page(StatusCode::FORBIDDEN, "Preview link not valid here", &message),
        PreviewError::NotRunning { .. } => {
            page(StatusCode::SERVICE_UNAVAILABLE, "Sandbox not running", &message)
        }
        PreviewError::Unreachable { port, .. } => page(
            StatusCode::BAD_GATEWAY,
            "Nothing answers on this port",
            &format!(
                "Nothing in the sandbox answered on port {port}: is a server listening on 127.0.0.1:{port}?"
            ),
        ),
        PreviewError::Invalid(_) => page(StatusCode::BAD_REQUEST, "Bad request", &message),
        PreviewError::Busy { .. } => {
            let mut response = page(StatusCode::TOO_MANY_REQUESTS, "Too many connections", &message);
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
        PreviewError::Access(AccessError::Unavailable(_))
        | PreviewError::Admission(_)
        | PreviewError::Store(_)
        | PreviewError::Registry(_)
        | PreviewError::Directory(_)
        | PreviewError::Audit(_)
        | PreviewError::Entropy => {
            tracing::warn!(error = %crate::usecase::chain(e), "a preview could not be opened");
            page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", &message)
        }
    }
}

/// Whether the visitor came over TLS (to the server, or to a proxy in front of it that
/// says so): the cookie is then `Secure`.
fn over_tls(request: &Request) -> bool {
    request.uri().scheme_str() == Some("https")
        || request
            .headers()
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

/// The most values of the lane's cookie a request is tried with.
const MAX_LANE_COOKIES: usize = 4;

/// The values of the lane's cookie in the request's `Cookie` headers (the first
/// [`MAX_LANE_COOKIES`]), those of [`HOST_COOKIE`] first. A browser may send several: a
/// page of another sandbox (the same site) can set a [`COOKIE`] for the whole preview
/// domain, which the browser then sends first; it can never set a [`HOST_COOKIE`].
fn lane_cookies(headers: &HeaderMap) -> Vec<String> {
    let pairs = || {
        headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|pair| pair.trim().split_once('='))
    };
    let named = |wanted: &'static str| {
        pairs().filter(move |(name, _)| *name == wanted).map(|(_, value)| value.trim().to_owned())
    };
    named(HOST_COOKIE).chain(named(COOKIE)).take(MAX_LANE_COOKIES).collect()
}

/// Opens `host` with the first of `tokens` whose link opens it (the last refusal when
/// none does).
async fn open_with_cookies(
    state: &AppState,
    tokens: &[String],
    host: &PreviewHost,
) -> Result<usecase::PreviewConnection, PreviewError> {
    let mut refused = PreviewError::Link(domain::LinkRefusal::Unknown);
    for token in tokens {
        match usecase::open_with_link(&state.deps, token, host).await {
            Err(e @ PreviewError::Link(_)) => refused = e,
            other => return other,
        }
    }
    Err(refused)
}

/// The token in the query, and the query without it.
fn split_token(uri: &Uri) -> Option<(String, String)> {
    let query = uri.query()?;
    let mut token = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.split_once('=') {
            Some((TOKEN_PARAM, value)) => {
                token = Some(value.to_owned());
                false
            }
            _ => *pair != TOKEN_PARAM,
        })
        .collect();
    Some((token?, rest.join("&")))
}

async fn serve(state: &AppState, host: &PreviewHost, request: Request) -> Response {
    // A link's first visit: its token for a cookie, and the same URL without the token.
    if let Some((token, rest)) = split_token(request.uri()) {
        // One leading slash: `//evil.example/` or `/\evil.example/` would send the browser to
        // another host.
        let path = format!("/{}", request.uri().path().trim_start_matches(['/', '\\']));
        let location = if rest.is_empty() { path } else { format!("{path}?{rest}") };
        return trade(state, host, over_tls(&request), &token, &location).await;
    }
    let authorization = request.headers().get(header::AUTHORIZATION).cloned();
    let cookies = lane_cookies(request.headers());
    let opened = if let Some(value) = authorization {
        match bearer_actor(state, &value).await {
            Ok(actor) => usecase::open_as(&state.deps, &actor, host).await,
            Err(response) => return response,
        }
    } else if !cookies.is_empty() {
        // The cookie is ambient: a page of another sandbox (same site) could make the
        // visitor's browser send it (see `isolation`).
        if !super::isolation::admits(request.method(), request.headers()) {
            return page(
                StatusCode::FORBIDDEN,
                "Refused",
                "This request came from another site's page; a preview link's cookie opens this host only for                  its own pages and for pages opened directly.",
            );
        }
        open_with_cookies(state, &cookies, host).await
    } else {
        return page(
            StatusCode::UNAUTHORIZED,
            "Sign-in needed",
            "This preview opens with a preview link, or with an Authorization: Bearer caller key allowed to \
             exec in the sandbox.",
        );
    };
    match opened {
        Ok(connection) => relay::relay(state, connection, request).await,
        Err(e) => error_page(&e),
    }
}

/// The caller a preview's `Authorization: Bearer` names (caller keys only).
async fn bearer_actor(state: &AppState, value: &HeaderValue) -> Result<Actor, Response> {
    let unauthenticated = |m: &str| page(StatusCode::UNAUTHORIZED, "Not signed in", m);
    let key = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| unauthenticated("The Authorization header must be `Bearer <caller key>`."))?;
    match state.directory.authenticate(&CallerKey::new(key)).await {
        Ok(Some(identity)) if identity.class() != CallerClass::Internal => Ok(Actor::Caller(identity)),
        Ok(_) => Err(unauthenticated("Unknown or revoked caller key (a preview takes a caller key).")),
        Err(e) => {
            tracing::warn!(error = %e, "a preview's caller key could not be checked");
            Err(page(StatusCode::SERVICE_UNAVAILABLE, "Unavailable", "The caller key cannot be checked now."))
        }
    }
}

/// The `Set-Cookie` of a trade: [`HOST_COOKIE`] (and `Secure`) over TLS, [`COOKIE`]
/// otherwise (a browser keeps no `Secure` cookie from a plain-HTTP host).
fn trade_cookie(tls: bool, token: &str, max_age: i64) -> String {
    let (name, secure) = if tls { (HOST_COOKIE, "; Secure") } else { (COOKIE, "") };
    format!("{name}={token}; Path=/; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}")
}

async fn trade(state: &AppState, host: &PreviewHost, tls: bool, token: &str, location: &str) -> Response {
    match usecase::trade_token(&state.deps, token, host).await {
        Ok(link) => {
            let now = state.deps.clock.now();
            let max_age = (link.expires_at.unix_millis() - now.unix_millis()).max(0) / 1000;
            let cookie = trade_cookie(tls, token, max_age);
            let mut response = StatusCode::SEE_OTHER.into_response();
            let headers = response.headers_mut();
            if let (Ok(cookie), Ok(location)) =
                (HeaderValue::from_str(&cookie), HeaderValue::from_str(location))
            {
                headers.insert(header::SET_COOKIE, cookie);
                headers.insert(header::LOCATION, location);
            }
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
            response
        }
        Err(e) => error_page(&e),
    }
}

/// The body of a new preview link.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateLinkBody {
    /// How long the link opens the port, in seconds (default 3600).
    #[schema(minimum = 60, maximum = 604800)]
    #[serde(default, deserialize_with = "super::dto::whole_number")]
    pub ttl_s: Option<u64>,
}

/// A preview link (its token only in the answer to its creation, inside `url`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LinkBody {
    /// `pvl_…`.
    pub id: String,
    /// The URL to open (with its token) when just made; the preview host's URL otherwise.
    pub url: String,
    /// The sandbox.
    pub sandbox_id: String,
    /// The port inside it.
    pub port: u16,
    /// Who made it.
    pub created_by: String,
    /// RFC 3339.
    pub created_at: String,
    /// RFC 3339: when it stops opening the port.
    pub expires_at: String,
    /// RFC 3339, when it was revoked.
    pub revoked_at: Option<String>,
}

/// The links of a sandbox's port.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LinkListBody {
    /// Oldest first, revoked and expired ones included.
    pub links: Vec<LinkBody>,
}

/// The path of a sandbox's port.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct PortPath {
    /// The org the sandbox belongs to.
    #[param(value_type = super::dto::Id)]
    pub org: String,
    /// The sandbox.
    #[param(value_type = super::dto::SandboxId)]
    pub sandbox_id: String,
    /// The TCP port inside the sandbox (not 3128, the egress proxy's).
    #[param(minimum = 1, maximum = 65535)]
    pub port: u16,
}

/// The path of one preview link.
#[derive(Debug, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct LinkPath {
    /// The org the sandbox belongs to.
    #[param(value_type = super::dto::Id)]
    pub org: String,
    /// The sandbox.
    #[param(value_type = super::dto::SandboxId)]
    pub sandbox_id: String,
    /// The TCP port inside the sandbox.
    #[param(minimum = 1, maximum = 65535)]
    pub port: u16,
    /// The link.
    #[param(value_type = String, pattern = "^pvl_[01234567][0123456789ABCDEFGHJKMNPQRSTVWXYZ]{25}$")]
    pub link_id: String,
}

impl From<PreviewError> for ApiError {
    fn from(e: PreviewError) -> Self {
        match e {
            PreviewError::Access(e) => e.into(),
            e @ (PreviewError::NoSandbox(_) | PreviewError::NoLink(_)) => Self::not_found(e.to_string()),
            e @ (PreviewError::PortClosed(_) | PreviewError::Link(LinkRefusal::OtherHost)) => {
                Self::new(Code::PermissionDenied, e.to_string())
            }
            e @ PreviewError::Link(_) => Self::new(Code::PermissionDenied, e.to_string()),
            e @ PreviewError::Invalid(_) => Self::invalid(e.to_string()),
            e @ PreviewError::NotRunning { .. } => Self::new(Code::Conflict, e.to_string()),
            e @ PreviewError::Busy { .. } => Self::new(Code::ResourceExhausted, e.to_string()),
            e @ (PreviewError::Unreachable { .. }
            | PreviewError::Admission(_)
            | PreviewError::Store(_)
            | PreviewError::Registry(_)
            | PreviewError::Directory(_)
            | PreviewError::Audit(_)
            | PreviewError::Entropy) => Self::unavailable_from(&e),
        }
    }
}

/// The scheme and port of the URLs of links made through `headers`' request: the
/// server's as the caller reached it (`X-Forwarded-Proto`, the `Host` header's port).
fn base(headers: &HeaderMap) -> (String, String) {
    let scheme = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.eq_ignore_ascii_case("https"))
        .map_or("http", |_| "https");
    let port = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .and_then(|h| h.rsplit_once(':'))
        .filter(|(_, p)| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .map(|(_, p)| format!(":{p}"))
        .unwrap_or_default();
    (scheme.to_owned(), port)
}

fn link_body(link: &PreviewLink, domain: &str, headers: &HeaderMap, token: Option<&str>) -> LinkBody {
    let (scheme, port) = base(headers);
    let host = link.host().name(domain);
    let url = match token {
        Some(token) => format!("{scheme}://{host}{port}/?{TOKEN_PARAM}={token}"),
        None => format!("{scheme}://{host}{port}/"),
    };
    LinkBody {
        id: link.id.to_string(),
        url,
        sandbox_id: link.sandbox.to_string(),
        port: link.port,
        created_by: link.created_by.identity_id().to_string(),
        created_at: link.created_at.to_rfc3339(),
        expires_at: link.expires_at.to_rfc3339(),
        revoked_at: link.revoked_at.map(|t| t.to_rfc3339()),
    }
}

fn port_arg(port: u16) -> Result<u16, ApiError> {
    if port == 0 {
        return Err(ApiError::invalid("the port must be between 1 and 65535"));
    }
    Ok(port)
}

/// Make a preview link of a sandbox's port: anyone with its URL may open that port until
/// it expires or is revoked.
#[utoipa::path(
    post, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/ports/{port}/links", tag = "preview",
    params(PortPath),
    request_body = CreateLinkBody,
    responses(
        (status = 201, description = "made; `url` carries its token (shown only here)", body = LinkBody),
        (status = 400, description = "an id, the port or `ttl_s` breaks its rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox (sandbox tokens may not make links), or the port is the lane's own", body = ErrorBody),
        (status = 404, description = "no such sandbox the caller may see", body = ErrorBody),
        (status = 409, description = "the sandbox has ended", body = ErrorBody),
        (status = 503, description = "the store or the audit log is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn create_link(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    headers: HeaderMap,
    Path((org, sandbox_id, port)): Path<(String, String, u16)>,
    Json(body): Json<CreateLinkBody>,
) -> Result<(StatusCode, Json<LinkBody>), ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let port = port_arg(port)?;
    if body.ttl_s.is_some_and(|t| !(MIN_LINK_TTL_S..=MAX_LINK_TTL_S).contains(&t)) {
        return Err(ApiError::invalid(format!(
            "ttl_s must be between {MIN_LINK_TTL_S} and {MAX_LINK_TTL_S}"
        )));
    }
    let made = usecase::create_link(&state.deps, &principal.0, &org, &sandbox_id, port, body.ttl_s).await?;
    let body = link_body(&made.link, &state.preview_domain, &headers, Some(&made.token));
    Ok((StatusCode::CREATED, Json(body)))
}

/// List the preview links of a sandbox's port (revoked and expired ones too; no tokens).
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/ports/{port}/links", tag = "preview",
    params(PortPath),
    responses(
        (status = 200, description = "the links", body = LinkListBody),
        (status = 400, description = "an id or the port breaks its rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox the caller may see", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn list_links(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    headers: HeaderMap,
    Path((org, sandbox_id, port)): Path<(String, String, u16)>,
) -> Result<Json<LinkListBody>, ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let port = port_arg(port)?;
    let links = usecase::list_links(&state.deps, &principal.0, &org, &sandbox_id, Some(port)).await?;
    let links = links.iter().map(|l| link_body(l, &state.preview_domain, &headers, None)).collect();
    Ok(Json(LinkListBody { links }))
}

/// Revoke a preview link: the next request with its cookie is refused, on every replica.
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/ports/{port}/links/{link_id}", tag = "preview",
    params(LinkPath),
    responses(
        (status = 204, description = "revoked (or revoked already)"),
        (status = 400, description = "an id or the port breaks its rules", body = ErrorBody),
        (status = 403, description = "the caller may not exec in this sandbox", body = ErrorBody),
        (status = 404, description = "no such sandbox, or no such link of this port", body = ErrorBody),
        (status = 503, description = "the store is unavailable", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn revoke_link(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id, port, link_id)): Path<(String, String, u16, String)>,
) -> Result<StatusCode, ApiError> {
    let org = OrgId::parse(org)?;
    let sandbox_id = SandboxId::parse(sandbox_id)?;
    let port = port_arg(port)?;
    let link_id = PreviewLinkId::parse(link_id)?;
    usecase::revoke_link(&state.deps, &principal.0, &org, &sandbox_id, port, &link_id).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests;
