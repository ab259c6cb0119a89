//! Fetch Metadata isolation for what a browser sends with an ambient credential (a preview
//! link's cookie).
//!
//! Every preview host lies under one domain (`http.preview_domain`), so to a browser the
//! pages of all sandboxes are the *same site*: `SameSite=Lax` lets a page served from one
//! sandbox send requests, carrying the cookie, to another sandbox's host (a `fetch`, a form
//! post, an `<iframe>`, a WebSocket). A hostile sandbox would act in the application of
//! another sandbox its visitor has opened. Browsers say where a request comes from in the
//! `Sec-Fetch-*` headers; a request with the cookie is served when it comes from the same
//! host, from the person (`none`: typed, bookmarked), or is a top-level navigation to a
//! page with a safe method (a link followed); anything else is refused. Clients that send
//! no `Sec-Fetch-Site` (old browsers, programs) are served: the policy guards browsers,
//! and a program holding the cookie holds the credential anyway.

use axum::http::{HeaderMap, Method};

/// Whether a request carrying an ambient credential may be served (see the module).
pub fn admits(method: &Method, headers: &HeaderMap) -> bool {
    let field = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_ascii_lowercase);
    let Some(site) = field("sec-fetch-site") else { return true };
    if site == "same-origin" || site == "none" {
        return true;
    }
    let navigation = field("sec-fetch-mode").as_deref() == Some("navigate")
        && field("sec-fetch-dest").as_deref().is_none_or(|d| d == "document");
    navigation && (method == Method::GET || method == Method::HEAD)
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn the_same_host_the_person_and_programs_are_served() {
        assert!(admits(
            &Method::POST,
            &headers(&[("sec-fetch-site", "same-origin"), ("sec-fetch-mode", "cors")])
        ));
        assert!(admits(
            &Method::GET,
            &headers(&[("sec-fetch-site", "none"), ("sec-fetch-mode", "navigate")])
        ));
        assert!(admits(&Method::DELETE, &headers(&[])));
    }

    #[test]
    fn another_sandboxs_page_is_refused_but_a_link_to_a_page_is_followed() {
        let from = |mode: &'static str, dest: &'static str| {
            headers(&[("sec-fetch-site", "same-site"), ("sec-fetch-mode", mode), ("sec-fetch-dest", dest)])
        };
        for (mode, dest) in
            [("cors", "empty"), ("no-cors", "image"), ("websocket", "websocket"), ("navigate", "iframe")]
        {
            assert!(!admits(&Method::GET, &from(mode, dest)), "{mode} {dest}");
        }
        assert!(!admits(&Method::POST, &from("navigate", "document")), "a form posted from another host");
        assert!(admits(&Method::GET, &from("navigate", "document")));
        let cross = headers(&[
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-mode", "navigate"),
            ("sec-fetch-dest", "document"),
        ]);
        assert!(admits(&Method::GET, &cross));
        let cross_fetch = headers(&[("sec-fetch-site", "cross-site"), ("sec-fetch-mode", "cors")]);
        assert!(!admits(&Method::GET, &cross_fetch));
    }
}
