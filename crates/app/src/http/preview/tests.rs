//! The relay's header rules (what the sandbox sees of a request, what the visitor sees of
//! an answer), and the pages a visitor gets instead.

use axum::http::Uri;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::relay::{forwarded_headers, returned_headers, upgrade_of};
use super::*;

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_str(value).unwrap());
    }
    map
}

#[test]
fn the_lanes_credentials_and_hop_by_hop_headers_never_reach_the_sandbox() {
    let mut h = headers(&[
        ("authorization", "Bearer sk_caller_key"),
        ("cookie", "a=1; sandlane_preview=secret-token; b=2"),
        ("cookie", "sandlane_preview=again; __Host-sandlane_preview=over-tls"),
        ("connection", "keep-alive, x-private"),
        ("x-private", "hop"),
        ("keep-alive", "timeout=5"),
        ("te", "trailers"),
        ("proxy-authorization", "Basic x"),
        ("transfer-encoding", "chunked"),
        ("accept", "text/html"),
    ]);
    forwarded_headers(&mut h, None);
    assert!(h.get(header::AUTHORIZATION).is_none());
    assert_eq!(h.get_all(header::COOKIE).iter().collect::<Vec<_>>(), vec!["a=1; b=2"]);
    for gone in ["connection", "x-private", "keep-alive", "te", "proxy-authorization", "transfer-encoding"] {
        assert!(h.get(gone).is_none(), "{gone} was forwarded");
    }
    assert_eq!(h.get("accept").unwrap(), "text/html");
    let mut only_ours = headers(&[("cookie", "sandlane_preview=t")]);
    forwarded_headers(&mut only_ours, None);
    assert!(only_ours.get(header::COOKIE).is_none());
}

#[test]
fn an_upgrade_keeps_its_upgrade_headers() {
    let mut h = headers(&[("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-key", "k")]);
    let upgrade = upgrade_of(&h);
    assert_eq!(upgrade.as_ref().unwrap(), "websocket");
    forwarded_headers(&mut h, upgrade.as_ref());
    assert_eq!(h.get(header::CONNECTION).unwrap(), "upgrade");
    assert_eq!(h.get(header::UPGRADE).unwrap(), "websocket");
    assert_eq!(h.get("sec-websocket-key").unwrap(), "k");
    assert!(upgrade_of(&headers(&[("upgrade", "websocket")])).is_none(), "no Connection: upgrade");
}

#[test]
fn cookies_for_other_hosts_or_named_as_the_lanes_are_dropped() {
    let mut h = headers(&[
        ("set-cookie", "session=1; Path=/; HttpOnly"),
        ("set-cookie", "tossed=1; Domain=preview.localhost; Path=/"),
        ("set-cookie", "tossed2=1; path=/; domain=.localhost"),
        ("set-cookie", "sandlane_preview=forged; Path=/"),
        ("set-cookie", "__Host-sandlane_preview=forged; Path=/; Secure"),
        ("set-cookie", "garbage"),
        ("connection", "close"),
        ("content-type", "text/plain"),
    ]);
    returned_headers(&mut h, None);
    assert_eq!(h.get_all(header::SET_COOKIE).iter().collect::<Vec<_>>(), vec!["session=1; Path=/; HttpOnly"]);
    assert!(h.get(header::CONNECTION).is_none());
    assert_eq!(h.get(header::CONTENT_TYPE).unwrap(), "text/plain");
}

#[test]
fn the_token_is_taken_out_of_the_query() {
    let uri: Uri = "/a/b?x=1&sandlane_preview_token=abc&y=2".parse().unwrap();
    assert_eq!(split_token(&uri), Some(("abc".to_owned(), "x=1&y=2".to_owned())));
    let uri: Uri = "/?sandlane_preview_token=abc".parse().unwrap();
    assert_eq!(split_token(&uri), Some(("abc".to_owned(), String::new())));
    assert_eq!(split_token(&"/?x=1".parse().unwrap()), None);
    assert_eq!(split_token(&"/".parse().unwrap()), None);
}

#[test]
fn the_lanes_cookie_is_found_among_others() {
    let h = headers(&[("cookie", "a=1"), ("cookie", "b=2; sandlane_preview=tok ; c=3")]);
    assert_eq!(lane_cookies(&h), ["tok"]);
    assert!(lane_cookies(&headers(&[("cookie", "sandlane_previewx=1")])).is_empty());
    // Several (one set for the whole domain by another sandbox's page comes first): each
    // is tried, up to a few.
    let tossed = headers(&[("cookie", "sandlane_preview=junk; sandlane_preview=mine")]);
    assert_eq!(lane_cookies(&tossed), ["junk", "mine"]);
    let many = headers(&[("cookie", &"sandlane_preview=x; ".repeat(10))]);
    assert_eq!(lane_cookies(&many).len(), MAX_LANE_COOKIES);
    // Over TLS the host's own cookie is `__Host-`, which no other host can set: it is
    // tried first, however many others come before it.
    let over_tls = headers(&[
        ("cookie", &"sandlane_preview=junk; ".repeat(10)),
        ("cookie", "__Host-sandlane_preview=mine"),
    ]);
    assert_eq!(lane_cookies(&over_tls), ["mine", "junk", "junk", "junk"]);
}

#[test]
fn the_cookie_is_host_only_and_secure_over_tls() {
    assert_eq!(
        trade_cookie(true, "tok", 60),
        "__Host-sandlane_preview=tok; Path=/; Max-Age=60; HttpOnly; SameSite=Lax; Secure"
    );
    assert_eq!(
        trade_cookie(false, "tok", 60),
        "sandlane_preview=tok; Path=/; Max-Age=60; HttpOnly; SameSite=Lax"
    );
}

/// An upgraded connection whose visitor went away while the sandbox keeps its side open
/// and silent ends a grace after, rather than holding its task and descriptors.
#[tokio::test(start_paused = true)]
async fn an_upgraded_connection_ends_a_grace_after_one_side_ended() {
    let (visitor_far, visitor) = tokio::io::duplex(1024);
    let (_silent_sandbox, sandbox) = tokio::io::duplex(1024);
    drop(visitor_far);
    let started = tokio::time::Instant::now();
    let ended =
        tokio::time::timeout(std::time::Duration::from_secs(600), super::relay::pipe(visitor, sandbox)).await;
    assert!(ended.is_ok(), "the pipe ended");
    assert!(started.elapsed() >= super::relay::HALF_CLOSED_GRACE, "after the grace: {:?}", started.elapsed());
}

/// A sandbox's answer cannot clear the cookies of the whole preview domain (every other
/// sandbox's preview cookie in the visitor's browser).
#[test]
fn clear_site_data_never_reaches_the_visitor() {
    let mut h = headers(&[("clear-site-data", "\"cookies\""), ("content-type", "text/html")]);
    returned_headers(&mut h, None);
    assert!(h.get("clear-site-data").is_none());
    assert_eq!(h.get("content-type").unwrap(), "text/html");
}

#[test]
fn a_sandbox_at_its_cap_of_preview_connections_gets_a_429_page_to_retry() {
    let e = PreviewError::Busy { sandbox_id: SandboxId::generate(1, 2), limit: 64 };
    let response = error_page(&e);
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers().get(header::RETRY_AFTER).unwrap(), "1");
    assert!(response.headers().get(header::CONTENT_TYPE).unwrap().to_str().unwrap().starts_with("text/html"));
    let api: ApiError = e.into();
    assert_eq!(api.code, Code::ResourceExhausted);
    assert!(api.message.contains("streams.max_preview_connections_per_sandbox"), "{}", api.message);
}
