//! Router tests over mocked ports: authentication, authorisation and the JSON error shape
//! for every kind of failure.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use domain::{
    CallerClass, CallerIdentity, DurabilityPolicy, IdentityId, OrgId, SandboxId, Timestamp, TokenId,
};
use ports::{
    MockAuditLog, MockCallerDirectory, MockClock, MockCredentialMinter, MockCredentialVerifier,
    MockSandboxDriver, MockSandboxLane, MockSandboxRegistry, TokenClaims, VerifyError,
};
use serde_json::Value;
use tower::ServiceExt;

use super::*;

/// A database that always answers (the HTTP tests' readiness; shared by the route tests
/// beside this module).
pub(super) struct AlwaysReady;

#[async_trait]
impl Readiness for AlwaysReady {
    async fn database(&self) -> Result<(), String> {
        Ok(())
    }
}

fn claims(sandbox: &SandboxId) -> TokenClaims {
    TokenClaims {
        iss: "sandlane".into(),
        aud: "sandlane-sandbox".into(),
        sub: IdentityId::parse("u-1").unwrap(),
        org_id: OrgId::parse("acme").unwrap(),
        session_id: "s1".into(),
        execution_id: "e1".into(),
        sandbox_id: sandbox.clone(),
        iat: 0,
        nbf: 0,
        exp: 900,
        jti: TokenId::parse("j1").unwrap(),
    }
}

/// A database's message that must never reach a response body.
const SECRET_TEXT: &str = "FATAL: password authentication failed for user sl_7Q9x at 10.1.2.3:5432";

/// A database that does not answer, saying [`SECRET_TEXT`].
struct Unreachable;

#[async_trait]
impl Readiness for Unreachable {
    async fn database(&self) -> Result<(), String> {
        Err(SECRET_TEXT.to_owned())
    }
}

/// A router whose lane is off and whose directory knows `svc-key` (service in acme) and
/// `user-key` (user in acme), and fails on `down-key` with [`SECRET_TEXT`]; the verifier
/// accepts `a.b.c` for sandbox `sbx`.
fn app(sbx: SandboxId) -> Router {
    app_with(sbx, Arc::new(AlwaysReady), MockSandboxDriver::new(), MockAuditLog::new())
}

/// [`app`] with `readiness`, and `driver` and `audit` as the lane's.
fn app_with(
    sbx: SandboxId,
    readiness: Arc<dyn Readiness>,
    mut driver: MockSandboxDriver,
    audit: MockAuditLog,
) -> Router {
    let mut directory = MockCallerDirectory::new();
    directory.expect_authenticate().returning(|key| {
        let org = vec![OrgId::parse("acme").unwrap()];
        if key.expose() == "down-key" {
            return Err(ports::DirectoryError::Store(ports::Cause::msg(SECRET_TEXT)));
        }
        Ok(match key.expose() {
            "svc-key" => Some(
                CallerIdentity::from_wire(IdentityId::parse("svc").unwrap(), CallerClass::Service, org, None)
                    .unwrap(),
            ),
            "user-key" => Some(
                CallerIdentity::from_wire(IdentityId::parse("u-1").unwrap(), CallerClass::User, org, None)
                    .unwrap(),
            ),
            _ => None,
        })
    });
    let mut verifier = MockCredentialVerifier::new();
    verifier.expect_verify().returning(move |t| {
        if t.expose() == "a.b.c" {
            Ok(claims(&sbx))
        } else {
            Err(VerifyError::Invalid("bad signature".into()))
        }
    });
    verifier.expect_jwks_json().returning(|| r#"{"keys":[]}"#.to_owned());
    let mut lane = MockSandboxLane::new();
    lane.expect_enabled().returning(|_, _| false);
    driver.expect_name().return_const("bubblewrap");
    let mut clock = MockClock::new();
    clock.expect_now().return_const(Timestamp::from_unix_millis(0));
    let clock: Arc<dyn ports::Clock> = Arc::new(clock);
    let mut store = ports::MockPolicyStore::new();
    store.expect_overrides().returning(|_| Ok(None));
    let deps = LaneDeps {
        lane: Arc::new(lane),
        minter: Arc::new(MockCredentialMinter::new()),
        driver: Arc::new(driver),
        registry: Arc::new(MockSandboxRegistry::new()),
        audit: Arc::new(audit),
        clock: clock.clone(),
        policy: DurabilityPolicy::default(),
        replica_id: "r".into(),
        lease_ms: 1000,
        wait_poll_ms: 1,
        ensure_deadline: Duration::from_secs(5),
        directory: Arc::new(MockCallerDirectory::new()),
        policies: Arc::new(crate::usecase::Policies::new(Arc::new(store), domain::OrgPolicy::builtin())),
        activity: Arc::default(),
        commands: Arc::new(crate::usecase::CommandGate::new(
            Arc::new(ports::MockQuotaLeases::new()),
            clock,
            "r",
        )),
        streams: crate::usecase::StreamLimits::default(),
        file_ops: Arc::default(),
        previews: Arc::default(),
        pool_demand: std::sync::Arc::default(),
        secrets: Arc::new(crate::test_support::MemorySecretStore::default()),
        snapshots: Arc::new(ports::MockSnapshotStore::new()),
        tickets: Arc::new(ports::MockTerminalTickets::new()),
        preview_links: Arc::new(ports::MockPreviewLinkStore::new()),
    };
    router(Arc::new(AppState {
        deps: Arc::new(deps),
        directory: Arc::new(directory),
        verifier: Arc::new(verifier),
        metrics: Arc::new(Metrics::default()),
        readiness,
        driver_health: Default::default(),
        scrape: Default::default(),
        audit_verdict: Default::default(),
        request_timeout: Duration::from_secs(5),
        body_limit: 1024,
        shutdown: Default::default(),
        webhooks: None,
        preview_domain: "preview.localhost".into(),
    }))
}

async fn call(method: &str, uri: &str, auth: Option<&str>, body: &str) -> (StatusCode, Value) {
    let content_type =
        if uri == "/v1/introspect" { "application/x-www-form-urlencoded" } else { "application/json" };
    let mut req = Request::builder().method(method).uri(uri).header("content-type", content_type);
    if let Some(a) = auth {
        req = req.header("authorization", format!("Bearer {a}"));
    }
    let resp =
        app(SandboxId::generate(1, 1)).oneshot(req.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
    let status = resp.status();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json)
}

fn assert_error(got: &(StatusCode, Value), status: u16, code: &str) {
    assert_eq!(got.0.as_u16(), status, "{:?}", got.1);
    assert_eq!(got.1["error"], code, "{:?}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "{:?}", got.1);
}

const ENSURE: &str = "/v1/orgs/acme/sessions/s1/sandbox";

#[tokio::test]
async fn lane_off_ensure_is_disabled() {
    let got = call("PUT", ENSURE, Some("svc-key"), r#"{"execution_id":"e1"}"#).await;
    assert_eq!(got.0, StatusCode::OK);
    assert_eq!(got.1, serde_json::json!({"outcome": "disabled"}));
    let got = call("PUT", "/v1/orgs/acme/workflow-executions/w1/sandbox", Some("user-key"), "").await;
    assert_eq!(got.1, serde_json::json!({"outcome": "disabled"}));
}

#[tokio::test]
async fn authentication_failures_are_401() {
    assert_error(&call("PUT", ENSURE, None, r#"{"execution_id":"e1"}"#).await, 401, "unauthenticated");
    assert_error(
        &call("PUT", ENSURE, Some("nope"), r#"{"execution_id":"e1"}"#).await,
        401,
        "unauthenticated",
    );
    assert_error(
        &call("PUT", ENSURE, Some("x.y.z"), r#"{"execution_id":"e1"}"#).await,
        401,
        "unauthenticated",
    );
}

#[tokio::test]
async fn authorisation_failures_are_403() {
    // Another org.
    let got =
        call("PUT", "/v1/orgs/other/sessions/s1/sandbox", Some("svc-key"), r#"{"execution_id":"e1"}"#).await;
    assert_error(&got, 403, "permission_denied");
    // A sandbox token anywhere but exec.
    assert_error(
        &call("PUT", ENSURE, Some("a.b.c"), r#"{"execution_id":"e1"}"#).await,
        403,
        "permission_denied",
    );
    // Audit is for service callers.
    assert_error(&call("GET", "/v1/orgs/acme/audit", Some("user-key"), "").await, 403, "permission_denied");
    // A sandbox token may not introspect.
    let form = call("POST", "/v1/introspect", Some("a.b.c"), "token=a.b.c").await;
    assert_eq!(form.0.as_u16(), 403, "{:?}", form.1);
    // A sandbox token may exec only in its own sandbox.
    let other = SandboxId::generate(2, 2);
    let got =
        call("POST", &format!("/v1/orgs/acme/sandboxes/{other}/exec"), Some("a.b.c"), r#"{"argv":["true"]}"#)
            .await;
    assert_error(&got, 403, "permission_denied");
}

#[tokio::test]
async fn malformed_input_is_400_json() {
    assert_error(&call("PUT", ENSURE, Some("svc-key"), "{not json").await, 400, "invalid_argument");
    assert_error(
        &call("PUT", ENSURE, Some("svc-key"), r#"{"execution":"e1"}"#).await,
        400,
        "invalid_argument",
    );
    let got =
        call("PUT", "/v1/orgs/acme/sessions/bad%20id/sandbox", Some("svc-key"), r#"{"execution_id":"e1"}"#)
            .await;
    assert_error(&got, 400, "invalid_argument");
    assert!(
        got.1["message"].as_str().unwrap().contains("bad id"),
        "the message names the input: {:?}",
        got.1
    );
    let got = call("GET", "/v1/orgs/acme/sandboxes/not-a-sandbox", Some("svc-key"), "").await;
    assert_error(&got, 400, "invalid_argument");
    let got = call("GET", "/v1/orgs/acme/audit?limit=abc", Some("svc-key"), "").await;
    assert_error(&got, 400, "invalid_argument");
    // An empty argv, for a valid sandbox id: the request itself is refused, before any
    // lookup (the registry mock has no expectation, so a lookup would fail the test).
    let exec = format!("/v1/orgs/acme/sandboxes/{}/exec", SandboxId::generate(1, 1));
    for argv in [r#"{"argv":[]}"#, r#"{"argv":[""]}"#] {
        let got = call("POST", &exec, Some("svc-key"), argv).await;
        assert_error(&got, 400, "invalid_argument");
        let message = got.1["message"].as_str().unwrap();
        assert!(message.contains("argv must name a program"), "{argv}: {message}");
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_too_large() {
    let big = format!(r#"{{"execution_id":"{}"}}"#, "e".repeat(4096));
    let got = call("PUT", ENSURE, Some("svc-key"), &big).await;
    assert_error(&got, 413, "too_large");
    assert!(got.1["message"].as_str().unwrap().contains("1024 bytes"), "{:?}", got.1);
}

#[tokio::test]
async fn unknown_routes_are_404_and_missing_methods_405_with_allow() {
    assert_error(&call("GET", "/v2/nothing", None, "").await, 404, "not_found");
    for (method, uri, allow) in [
        ("POST", "/healthz", "GET,HEAD"),
        ("DELETE", "/v1/introspect", "POST"),
        ("GET", ENSURE, "PUT,DELETE"),
        ("PATCH", "/v1/orgs/acme/sandboxes/x/exec", "POST"),
    ] {
        let req = Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
        let resp = app(SandboxId::generate(1, 1)).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {uri}");
        let got: Vec<String> = resp
            .headers()
            .get("allow")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(',')
            .map(|m| m.trim().to_owned())
            .collect();
        let mut want: Vec<&str> = allow.split(',').collect();
        let mut got: Vec<&str> = got.iter().map(String::as_str).collect();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(got, want, "Allow of {uri}");
        let body: Value =
            serde_json::from_slice(&to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
        assert_eq!(body["error"], "invalid_argument", "{body}");
    }
}

#[tokio::test]
async fn public_routes_need_no_credential() {
    assert_eq!(call("GET", "/healthz", None, "").await.0, StatusCode::OK);
    assert_eq!(call("GET", "/.well-known/jwks.json", None, "").await.1, serde_json::json!({"keys": []}));
    let doc = call("GET", "/openapi.json", None, "").await.1;
    for path in [
        "/v1/orgs/{org}/sessions/{session_id}/sandbox",
        "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox",
        "/v1/orgs/{org}/workflow-executions/{execution_id}/sandbox/recover",
        "/v1/orgs/{org}/sandboxes/{sandbox_id}",
        "/v1/orgs/{org}/sandboxes/{sandbox_id}/exec",
        "/v1/orgs/{org}/audit",
        "/v1/introspect",
        "/.well-known/jwks.json",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    ] {
        assert!(doc["paths"][path].is_object(), "openapi lacks {path}");
    }
}

#[tokio::test]
async fn introspection_of_a_bad_token_is_inactive() {
    let mut req = Request::builder()
        .method("POST")
        .uri("/v1/introspect")
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", "Bearer user-key");
    req = req.header("accept", "application/json");
    let resp =
        app(SandboxId::generate(1, 1)).oneshot(req.body(Body::from("token=x.y.z")).unwrap()).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body: Value = serde_json::from_slice(&to_bytes(resp.into_body(), 1 << 16).await.unwrap()).unwrap();
    assert_eq!(body, serde_json::json!({"active": false}));
}

#[test]
fn exec_timeout_takes_any_json_integer() {
    let parse = |body: &str| serde_json::from_str::<super::dto::ExecRequestBody>(body).map(|b| b.timeout_ms);
    assert_eq!(parse(r#"{"argv":["true"],"timeout_ms":1500.0}"#).unwrap(), Some(1500));
    assert_eq!(parse(r#"{"argv":["true"],"timeout_ms":1500}"#).unwrap(), Some(1500));
    assert_eq!(parse(r#"{"argv":["true"],"timeout_ms":null}"#).unwrap(), None);
    assert_eq!(parse(r#"{"argv":["true"]}"#).unwrap(), None);
    for bad in ["1.5", "-1", "\"5\"", "1e30"] {
        let err = parse(&format!(r#"{{"argv":["true"],"timeout_ms":{bad}}}"#)).unwrap_err();
        assert!(err.to_string().contains("timeout_ms") || err.to_string().contains("number"), "{bad}: {err}");
    }
}

#[tokio::test]
async fn readiness_asks_the_driver_once_per_ttl() {
    let mut driver = MockSandboxDriver::new();
    driver
        .expect_health()
        .times(2)
        .returning(|| ports::DriverHealth { usable: true, detail: "bwrap 0.8.0".into() });
    let cache = meta::DriverHealthCache::new(Duration::from_millis(200));
    for _ in 0..5 {
        assert!(cache.get(|| ports::SandboxDriver::health(&driver)).await.usable);
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        cache.get(|| ports::SandboxDriver::health(&driver)).await.detail,
        "bwrap 0.8.0",
        "a stale answer is asked again"
    );
    assert!(cache.get(|| ports::SandboxDriver::health(&driver)).await.usable);
}

/// A request to `router`; returns the status and the body as text.
async fn text_of(router: Router, uri: &str, auth: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::builder().method("GET").uri(uri);
    if let Some(a) = auth {
        req = req.header("authorization", format!("Bearer {a}"));
    }
    let resp = router.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    (status, String::from_utf8_lossy(&to_bytes(resp.into_body(), 1 << 20).await.unwrap()).into_owned())
}

#[tokio::test]
async fn readiness_with_a_broken_database_and_driver_says_which_in_fixed_words() {
    let mut driver = MockSandboxDriver::new();
    driver.expect_health().returning(|| ports::DriverHealth {
        usable: false,
        detail: format!("bwrap: setting up uid map: Permission denied; {SECRET_TEXT}"),
    });
    let router = app_with(SandboxId::generate(1, 1), Arc::new(Unreachable), driver, MockAuditLog::new());
    let (status, body) = text_of(router, "/readyz", None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        !body.contains("password") && !body.contains("Permission denied"),
        "no infrastructure text: {body}"
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["checks"],
        serde_json::json!([
            {"name": "database", "ok": false, "detail": meta::DATABASE_UNREACHABLE},
            {"name": "driver", "ok": false, "detail": meta::DRIVER_UNUSABLE},
        ])
    );
}

#[tokio::test]
async fn a_failing_store_shows_no_infrastructure_text_in_a_503() {
    // The caller directory, asked by every route with a key (anonymous callers too can
    // send one).
    let got = call("PUT", ENSURE, Some("down-key"), r#"{"execution_id":"e1"}"#).await;
    assert_error(&got, 503, "unavailable");
    let message = got.1["message"].as_str().unwrap();
    assert!(!message.contains("password") && message.contains("caller key"), "{message}");
    // The audit log.
    let mut audit = MockAuditLog::new();
    audit.expect_page().returning(|_, _, _| Err(ports::AuditError::Store(ports::Cause::msg(SECRET_TEXT))));
    let router = app_with(SandboxId::generate(1, 1), Arc::new(AlwaysReady), MockSandboxDriver::new(), audit);
    let (status, body) = text_of(router, "/v1/orgs/acme/audit", Some("svc-key")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(!body.contains("password") && body.contains("audit log"), "{body}");
}

#[test]
fn a_driver_failure_is_a_503_in_fixed_words() {
    for e in [
        ports::DriverError::Unavailable(SECRET_TEXT.into()),
        ports::DriverError::Failed(format!("clone: Resource temporarily unavailable; {SECRET_TEXT}").into()),
    ] {
        let got = super::ndjson::driver_error(e);
        assert_eq!(got.code, super::error::Code::Unavailable);
        assert!(!got.message.contains("password") && !got.message.contains("Resource"), "{}", got.message);
    }
    // What the sandbox's side says of the caller's own request stays the caller's.
    let got = super::ndjson::driver_error(ports::DriverError::Conflict("bin/x is not executable".into()));
    assert_eq!(got.message, "bin/x is not executable");
}

#[tokio::test]
async fn metrics_refuse_a_key_that_is_not_a_service_callers() {
    // Refused before anything is read (the registry's mock expects nothing).
    let router = app(SandboxId::generate(1, 1));
    for (key, status) in [("user-key", 403), ("a.b.c", 403), ("nope", 401), ("down-key", 503)] {
        let (got, body) = text_of(router.clone(), "/metrics", Some(key)).await;
        assert_eq!(got.as_u16(), status, "{key}: {body}");
        assert!(!body.contains("password"), "{body}");
    }
}

#[tokio::test]
async fn listing_and_the_audit_verdict_are_for_service_callers_of_the_org() {
    for path in ["/v1/orgs/acme/sandboxes", "/v1/orgs/acme/audit/verify"] {
        assert_error(&call("GET", path, Some("user-key"), "").await, 403, "permission_denied");
        assert_error(&call("GET", path, Some("a.b.c"), "").await, 403, "permission_denied");
        assert_error(&call("GET", path, None, "").await, 401, "unauthenticated");
        let other = path.replace("/acme/", "/globex/");
        assert_error(&call("GET", &other, Some("svc-key"), "").await, 403, "permission_denied");
    }
    // The query's rules, checked before the registry is asked.
    for query in ["limit=0", "limit=1001", "after=sbx_nope", "ended=maybe", "colour=red"] {
        let got = call("GET", &format!("/v1/orgs/acme/sandboxes?{query}"), Some("svc-key"), "").await;
        assert_error(&got, 400, "invalid_argument");
    }
}

#[tokio::test]
async fn the_console_is_served_with_its_policy_to_anyone() {
    let resp = app(SandboxId::generate(1, 1))
        .oneshot(Request::builder().uri("/console").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let csp = resp.headers()["content-security-policy"].to_str().unwrap().to_owned();
    assert!(csp.starts_with("default-src 'self'") && csp.contains("connect-src 'self';"), "{csp}");
    assert!(csp.contains("script-src 'self';"), "no inline script: {csp}");
    assert_eq!(resp.headers()["x-frame-options"], "DENY");
    let body = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
    assert!(String::from_utf8_lossy(&body).contains("<script type=\"module\" src=\"/console/console.js\">"));
    let got = call("GET", "/console/nope.js", None, "").await;
    assert_error(&got, 404, "not_found");
}
