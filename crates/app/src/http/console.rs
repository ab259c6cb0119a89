//! The console at `/console` (`docs/console.md`): static files built into the binary (from
//! `crates/app/console/`), a page that signs in with a service key kept in the tab's
//! `sessionStorage` and does everything through the public API with it. The server gives
//! the page nothing else: no cookie, no route of its own.

use std::sync::Arc;

use axum::Router;
use axum::extract::Path;
use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderName};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::AppState;
use super::error::ApiError;

/// The Content-Security-Policy of every console response: scripts, styles, images and
/// connections from this server only (`'self'` covers its WebSockets too: the same host
/// over `ws:`/`wss:`, no other), no inline script, no frame,
/// no plugin. Inline *styles* are allowed: xterm.js's renderer writes its theme and cell
/// sizes into a `<style>` element it creates.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// One file of the console.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $type:literal) => {
        Asset {
            path: $path,
            content_type: $type,
            body: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/console/", $path)),
        }
    };
}

/// Every file the console is made of (`vendor/` is copied from the pinned xterm.js package
/// by `scripts/console-assets.sh`).
const ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("console.css", "text/css; charset=utf-8"),
    asset!("console.js", "text/javascript; charset=utf-8"),
    asset!("api.js", "text/javascript; charset=utf-8"),
    asset!("terminal.js", "text/javascript; charset=utf-8"),
    asset!("vendor/xterm.mjs", "text/javascript; charset=utf-8"),
    asset!("vendor/xterm.css", "text/css; charset=utf-8"),
    asset!("vendor/LICENSE-xterm.txt", "text/plain; charset=utf-8"),
];

/// The console's routes (anonymous: the files hold no tenant's data).
pub fn router() -> Router<Arc<AppState>> {
    Router::new()
        .route("/console", get(|| async { serve("index.html") }))
        .route("/console/", get(|| async { serve("index.html") }))
        .route("/console/{*path}", get(|Path(path): Path<String>| async move { serve(&path) }))
}

fn serve(path: &str) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.path == path) else {
        return ApiError::not_found(format!("no console file {path}")).into_response();
    };
    let mut response = (StatusCode::OK, asset.body).into_response();
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(asset.content_type));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(
        HeaderName::from_static("content-security-policy"),
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(HeaderName::from_static("x-frame-options"), HeaderValue::from_static("DENY"));
    headers.insert(HeaderName::from_static("x-content-type-options"), HeaderValue::from_static("nosniff"));
    headers.insert(HeaderName::from_static("referrer-policy"), HeaderValue::from_static("no-referrer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_is_served_with_the_policy_and_nothing_else_is() {
        for asset in ASSETS {
            let response = serve(asset.path);
            assert_eq!(response.status(), StatusCode::OK, "{}", asset.path);
            let h = response.headers();
            assert_eq!(h["content-security-policy"], CONTENT_SECURITY_POLICY);
            assert_eq!(h["x-frame-options"], "DENY");
            assert_eq!(h["x-content-type-options"], "nosniff");
        }
        assert_eq!(serve("../Cargo.toml").status(), StatusCode::NOT_FOUND);
        assert_eq!(serve("vendor/xterm.mjs.map").status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_page_loads_no_inline_script_and_nothing_from_elsewhere() {
        let page = std::str::from_utf8(ASSETS[0].body).unwrap();
        assert!(CONTENT_SECURITY_POLICY.contains("default-src 'self'"));
        assert!(CONTENT_SECURITY_POLICY.contains("connect-src 'self';"), "connections to this server alone");
        assert!(!CONTENT_SECURITY_POLICY.contains(" ws:") && !CONTENT_SECURITY_POLICY.contains(" wss:"));
        for script in page.split("<script").skip(1) {
            let tag = &script[..script.find('>').unwrap()];
            assert!(tag.contains("src=\"/console/"), "every script is a file of the console: {tag}");
        }
        assert!(!page.contains("http://") && !page.contains("https://"), "nothing from another origin");
        for asset in ASSETS.iter().filter(|a| a.path.ends_with(".js")) {
            let text = std::str::from_utf8(asset.body).unwrap();
            assert!(!text.contains("localStorage"), "{}: the key lives in sessionStorage only", asset.path);
            assert!(!text.contains("document.cookie"), "{}: no cookie", asset.path);
        }
    }
}
