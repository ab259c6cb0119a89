//! The secret routes over an in-memory store: status codes, the authorisation matrix as
//! HTTP callers meet it, malformed bodies answered 400 in the API's error shape (never 500),
//! the limits, and the value in no response body, header or log line.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use domain::policy::parse_egress;
use domain::{
    AuditAction, AuditEvent, CallerClass, CallerIdentity, DurabilityPolicy, IdentityId, OrgId, PolicyPatch,
    SandboxId, Timestamp, TokenId,
};
use ports::{
    CallerEntry, MockAuditLog, MockCallerDirectory, MockClock, MockCredentialMinter, MockCredentialVerifier,
    MockSandboxDriver, MockSandboxLane, MockSandboxRegistry, PolicyOverrides, SecretStore, TokenClaims,
    VerifyError,
};
use serde_json::{Value, json};
use tower::ServiceExt;

use super::tests::AlwaysReady;
use super::{AppState, router};
use crate::metrics::Metrics;
use crate::test_support::{MemorySecretStore, NOW};
use crate::usecase::tests::Logs;
use crate::usecase::{LaneDeps, MAX_SECRETS_PER_IDENTITY};

/// The value every test sets: it must appear in no answer, header or log line.
const VALUE: &str = "ghp_S3CRETvalue_never_shown_0451";

fn acme() -> OrgId {
    OrgId::parse("acme").unwrap()
}

fn identity(id: &str, class: CallerClass, org: &str) -> CallerIdentity {
    CallerIdentity::from_wire(IdentityId::parse(id).unwrap(), class, vec![OrgId::parse(org).unwrap()], None)
        .unwrap()
}

/// The router, its store and its audit events. Keys: `svc-key` (service `svc` of acme),
/// `alice-key` and `bob-key` (users of acme), `other-key` (a service of org `other`); the
/// sandbox token `a.b.c` (a sandbox of acme acting for alice). Acme's allowlist allows
/// api.github.com for everyone and *.internal.example for services only.
struct Fixture {
    router: Router,
    store: Arc<MemorySecretStore>,
    events: Arc<Mutex<Vec<AuditEvent>>>,
}

fn fixture(body_limit: usize) -> Fixture {
    let mut directory = MockCallerDirectory::new();
    directory.expect_authenticate().returning(|key| {
        Ok(match key.expose() {
            "svc-key" => Some(identity("svc", CallerClass::Service, "acme")),
            "alice-key" => Some(identity("alice", CallerClass::User, "acme")),
            "bob-key" => Some(identity("bob", CallerClass::User, "acme")),
            "other-key" => Some(identity("svc-other", CallerClass::Service, "other")),
            _ => None,
        })
    });
    let mut verifier = MockCredentialVerifier::new();
    verifier.expect_verify().returning(|t| {
        if t.expose() != "a.b.c" {
            return Err(VerifyError::Invalid("bad signature".into()));
        }
        Ok(TokenClaims {
            iss: "sandlane".into(),
            aud: "sandlane-sandbox".into(),
            sub: IdentityId::parse("alice").unwrap(),
            org_id: acme(),
            session_id: "s1".into(),
            execution_id: "e1".into(),
            sandbox_id: SandboxId::generate(1, 1),
            iat: 0,
            nbf: 0,
            exp: 900,
            jti: TokenId::parse("j1").unwrap(),
        })
    });
    // The lane's directory (the class of an identity scope's caller).
    let mut callers = MockCallerDirectory::new();
    callers.expect_list().returning(|| {
        Ok(["alice", "bob"]
            .into_iter()
            .map(|id| CallerEntry {
                identity: identity(id, CallerClass::User, "acme"),
                created_at: Timestamp::from_unix_millis(NOW),
                revoked_at: None,
            })
            .collect())
    });
    let mut audit = MockAuditLog::new();
    let events = crate::test_support::recording_audit(&mut audit);
    let mut clock = MockClock::new();
    clock.expect_now().return_const(Timestamp::from_unix_millis(NOW));
    let clock: Arc<dyn ports::Clock> = Arc::new(clock);
    let rules =
        parse_egress(&["api.github.com".to_owned(), "*.internal.example@service".to_owned()]).unwrap();
    let mut policies = ports::MockPolicyStore::new();
    policies.expect_overrides().returning(move |_| {
        Ok(Some(PolicyOverrides {
            patch: PolicyPatch { egress_allow: Some(rules.clone()), ..PolicyPatch::default() },
            version: 1,
            updated_at: Timestamp::from_unix_millis(NOW),
        }))
    });
    let mut driver = MockSandboxDriver::new();
    driver.expect_name().return_const("bubblewrap");
    let store = Arc::new(MemorySecretStore::default());
    let deps = LaneDeps {
        lane: Arc::new(MockSandboxLane::new()),
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
        directory: Arc::new(callers),
        policies: Arc::new(crate::usecase::Policies::new(Arc::new(policies), domain::OrgPolicy::builtin())),
        activity: Arc::default(),
        commands: Arc::new(crate::usecase::CommandGate::new(
            Arc::new(ports::MockQuotaLeases::new()),
            clock,
            "r",
        )),
        streams: crate::usecase::StreamLimits::default(),
        file_ops: Arc::default(),
        previews: Arc::default(),
        pool_demand: Arc::default(),
        secrets: store.clone(),
        snapshots: Arc::new(ports::MockSnapshotStore::new()),
        tickets: Arc::new(ports::MockTerminalTickets::new()),
        preview_links: Arc::new(ports::MockPreviewLinkStore::new()),
    };
    let router = router(Arc::new(AppState {
        deps: Arc::new(deps),
        directory: Arc::new(directory),
        verifier: Arc::new(verifier),
        metrics: Arc::new(Metrics::default()),
        readiness: Arc::new(AlwaysReady),
        driver_health: Default::default(),
        scrape: Default::default(),
        audit_verdict: Default::default(),
        request_timeout: Duration::from_secs(5),
        body_limit,
        shutdown: Default::default(),
        webhooks: None,
        preview_domain: "preview.localhost".into(),
    }));
    Fixture { router, store, events }
}

/// One answer: status, body (JSON, or `Null`) and the whole response as text (status line,
/// headers, body) for the checks that a value never leaves.
struct Answer {
    status: u16,
    body: Value,
    text: String,
}

impl Fixture {
    async fn call(&self, method: &str, uri: &str, key: Option<&str>, body: &str) -> Answer {
        let mut req = Request::builder().method(method).uri(uri).header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let resp = self.router.clone().oneshot(req.body(Body::from(body.to_owned())).unwrap()).await.unwrap();
        let status = resp.status().as_u16();
        let mut text = format!("{status}\n");
        for (name, value) in resp.headers() {
            text.push_str(&format!("{name}: {}\n", String::from_utf8_lossy(value.as_bytes())));
        }
        let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap();
        text.push_str(&String::from_utf8_lossy(&bytes));
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        assert!(!text.contains(VALUE), "the value is in an answer: {text}");
        assert_ne!(status, 500, "{method} {uri}: {text}");
        Answer { status, body, text }
    }

    async fn put(&self, name: &str, key: &str, body: &Value) -> Answer {
        self.call("PUT", &format!("/v1/orgs/acme/secrets/{name}"), Some(key), &body.to_string()).await
    }

    async fn names(&self, key: &str) -> Vec<String> {
        let got = self.call("GET", "/v1/orgs/acme/secrets", Some(key), "").await;
        assert_eq!(got.status, 200, "{}", got.text);
        got.body["secrets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap().to_owned())
            .collect()
    }

    fn actions(&self) -> Vec<(AuditAction, String)> {
        self.events.lock().unwrap().iter().map(|e| (e.action, e.caller_id.to_string())).collect()
    }
}

fn secret(scope: Value) -> Value {
    json!({"value": VALUE, "hosts": ["api.github.com"], "scope": scope})
}

fn assert_error(got: &Answer, status: u16, code: &str) {
    assert_eq!(got.status, status, "{}", got.text);
    assert_eq!(got.body["error"], code, "{}", got.text);
    assert!(got.body["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.text);
}

#[tokio::test(flavor = "current_thread")]
async fn put_makes_201_then_replaces_200_lists_without_values_and_deletes_204() {
    let (logs, _guard) = Logs::capture();
    let f = fixture(64 * 1024);
    let body = json!({
        "value": VALUE,
        "hosts": ["api.github.com:443", "api.github.com:443"],
        "header": "X-Api-Key",
        "scope": {"org": true},
        "methods": ["get", "POST"],
        "paths": ["/repos/"],
    });
    let made = f.put("gh", "svc-key", &body).await;
    assert_eq!(made.status, 201, "{}", made.text);
    assert_eq!(
        made.body,
        json!({
            "name": "gh",
            "hosts": ["api.github.com:443"],
            "header": "x-api-key",
            "format": "{value}",
            "scope": {"org": true},
            "methods": ["GET", "POST"],
            "paths": ["/repos/"],
            "created_at": made.body["created_at"],
            "updated_at": made.body["updated_at"],
        })
    );
    assert!(made.body.get("value").is_none());
    let replaced = f.put("gh", "svc-key", &secret(json!({"org": true}))).await;
    assert_eq!(replaced.status, 200, "{}", replaced.text);
    assert_eq!(replaced.body["format"], "Bearer {value}");
    assert_eq!(replaced.body["created_at"], made.body["created_at"]);

    let listed = f.call("GET", "/v1/orgs/acme/secrets", Some("svc-key"), "").await;
    assert_eq!(listed.status, 200, "{}", listed.text);
    let secrets = listed.body["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 1);
    assert!(secrets[0].get("value").is_none(), "{}", listed.text);
    // The store holds it, sealed or not, for the gate.
    let stored = f.store.for_host(&acme(), "api.github.com", 443).await.unwrap();
    assert_eq!(stored[0].1.expose(), VALUE);

    let gone = f.call("DELETE", "/v1/orgs/acme/secrets/gh", Some("svc-key"), "").await;
    assert_eq!(gone.status, 204, "{}", gone.text);
    assert!(f.names("svc-key").await.is_empty());
    assert_error(&f.call("DELETE", "/v1/orgs/acme/secrets/gh", Some("svc-key"), "").await, 404, "not_found");
    assert_eq!(
        f.actions(),
        [
            (AuditAction::SecretSet, "svc".to_owned()),
            (AuditAction::SecretSet, "svc".to_owned()),
            (AuditAction::SecretDelete, "svc".to_owned()),
        ]
    );
    for event in f.events.lock().unwrap().iter() {
        assert!(!format!("{event:?}").contains(VALUE), "{event:?}");
    }
    let text = logs.text();
    assert!(text.contains("secret set") && text.contains("secret deleted"), "the log was captured: {text}");
    assert!(!text.contains(VALUE), "{text}");
}

#[tokio::test(flavor = "current_thread")]
async fn who_may_do_what_over_http() {
    let f = fixture(64 * 1024);
    // A user sets a secret for its own identity, and no other scope.
    assert_eq!(f.put("alice-gh", "alice-key", &secret(json!({"identity": "alice"}))).await.status, 201);
    for scope in [json!({"identity": "bob"}), json!({"class": "user"}), json!({"org": true})] {
        let got = f.put("x", "alice-key", &secret(scope.clone())).await;
        assert_error(&got, 403, "permission_denied");
        assert!(got.body["message"].as_str().unwrap().contains("its own identity"), "{scope}: {}", got.text);
    }
    // A service sets any scope, its own or a user's.
    assert_eq!(f.put("org-gh", "svc-key", &secret(json!({"org": true}))).await.status, 201);
    assert_eq!(f.put("bob-gh", "svc-key", &secret(json!({"identity": "bob"}))).await.status, 201);
    // Listing: a user sees its own only, a service every one.
    assert_eq!(f.names("alice-key").await, ["alice-gh"]);
    assert_eq!(f.names("bob-key").await, ["bob-gh"]);
    assert_eq!(f.names("svc-key").await, ["alice-gh", "bob-gh", "org-gh"]);
    // Another user cannot delete alice's (404, as for a name that does not exist), nor
    // replace it (409: the name is taken).
    for name in ["alice-gh", "org-gh", "nothing-here"] {
        let got = f.call("DELETE", &format!("/v1/orgs/acme/secrets/{name}"), Some("bob-key"), "").await;
        assert_error(&got, 404, "not_found");
        assert_eq!(got.body["message"], format!("no secret {name} in org acme"), "one message for both");
    }
    let got = f.put("alice-gh", "bob-key", &secret(json!({"identity": "bob"}))).await;
    assert_error(&got, 409, "conflict");
    assert!(!got.text.contains("alice\""), "the owner is not named: {}", got.text);
    // A sandbox token manages nothing, even of the caller it acts for.
    for (method, uri, body) in [
        ("GET", "/v1/orgs/acme/secrets", String::new()),
        ("PUT", "/v1/orgs/acme/secrets/t", secret(json!({"identity": "alice"})).to_string()),
        ("DELETE", "/v1/orgs/acme/secrets/alice-gh", String::new()),
    ] {
        let got = f.call(method, uri, Some("a.b.c"), &body).await;
        assert_error(&got, 403, "permission_denied");
        assert!(got.body["message"].as_str().unwrap().contains("sandbox token"), "{}", got.text);
    }
    // A caller of another org: nothing in acme.
    for (method, uri, body) in [
        ("GET", "/v1/orgs/acme/secrets", String::new()),
        ("PUT", "/v1/orgs/acme/secrets/o", secret(json!({"org": true})).to_string()),
        ("DELETE", "/v1/orgs/acme/secrets/org-gh", String::new()),
    ] {
        assert_error(&f.call(method, uri, Some("other-key"), &body).await, 403, "permission_denied");
    }
    // No key, or one that does not authenticate: 401.
    assert_error(&f.call("GET", "/v1/orgs/acme/secrets", None, "").await, 401, "unauthenticated");
    assert_error(&f.call("GET", "/v1/orgs/acme/secrets", Some("nope"), "").await, 401, "unauthenticated");
    // Alice deletes her own; nothing else changed.
    assert_eq!(f.call("DELETE", "/v1/orgs/acme/secrets/alice-gh", Some("alice-key"), "").await.status, 204);
    assert_eq!(f.names("svc-key").await, ["bob-gh", "org-gh"]);
    assert_eq!(
        f.actions(),
        [
            (AuditAction::SecretSet, "alice".to_owned()),
            (AuditAction::SecretSet, "svc".to_owned()),
            (AuditAction::SecretSet, "svc".to_owned()),
            (AuditAction::SecretDelete, "alice".to_owned()),
        ]
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_host_outside_the_allowlist_is_400_naming_it() {
    let f = fixture(64 * 1024);
    let mut body = secret(json!({"identity": "alice"}));
    body["hosts"] = json!(["api.github.com", "evil.example.com"]);
    let got = f.put("gh", "alice-key", &body).await;
    assert_error(&got, 400, "invalid_argument");
    let message = got.body["message"].as_str().unwrap();
    assert!(
        message.contains("host evil.example.com:443 is not in the egress allowlist of org acme"),
        "{message}"
    );
    // Allowed for services only: fine for the service class, not for a user's identity.
    body["hosts"] = json!(["*.internal.example:443"]);
    body["scope"] = json!({"class": "service"});
    assert_eq!(f.put("svc", "svc-key", &body).await.status, 201);
    body["scope"] = json!({"identity": "bob"});
    let got = f.put("bob", "svc-key", &body).await;
    assert_error(&got, 400, "invalid_argument");
    assert!(got.body["message"].as_str().unwrap().contains("for user callers"), "{}", got.text);
    assert!(f.store.list(&acme()).await.unwrap().len() == 1, "nothing refused was stored");
}

#[tokio::test(flavor = "current_thread")]
async fn malformed_bodies_and_names_are_400_with_a_clear_message() {
    let (logs, _guard) = Logs::capture();
    let f = fixture(64 * 1024);
    let with = |patch: Value| {
        let mut body = secret(json!({"org": true}));
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (with(json!({"header": "Proxy-Authorization"})), "the proxy owns this header"),
        (with(json!({"header": "host"})), "the proxy owns this header"),
        (with(json!({"header": "x bad"})), "not an HTTP token"),
        (with(json!({"header": "x-a\r\nx-b"})), "not an HTTP token"),
        (with(json!({"format": "token"})), "{value} exactly once"),
        (with(json!({"format": "{value} {value}"})), "{value} exactly once"),
        (with(json!({"format": "Bearer {value}\r\nX-Evil: 1"})), "no control characters"),
        (
            with(json!({"value": format!("{VALUE}\r\nX-Evil: 1")})),
            "the value is invalid: no control characters",
        ),
        (with(json!({"value": format!("{VALUE}\n")})), "the value is invalid"),
        (with(json!({"value": format!(" {VALUE}")})), "no leading or trailing white space"),
        (with(json!({"value": ""})), "1 to 8192 bytes"),
        (with(json!({"value": "v".repeat(8193)})), "1 to 8192 bytes"),
        (with(json!({"hosts": []})), "1 to 32 hosts"),
        (with(json!({"hosts": ["*"]})), "is invalid"),
        (with(json!({"hosts": ["*.com"]})), "a wildcard needs a name of two labels"),
        (with(json!({"hosts": ["api.*.github.com"]})), "'*' only as a whole first label"),
        (with(json!({"hosts": ["api.github.com:0"]})), "the port must be 1-65535"),
        (with(json!({"hosts": ["api.github.com:99999"]})), "the port must be 1-65535"),
        (with(json!({"hosts": ["https://api.github.com/"]})), "is invalid"),
        (with(json!({"hosts": ["[::1"]})), "an unclosed '['"),
        (with(json!({"hosts": vec!["api.github.com"; 33]})), "1 to 32 hosts"),
        (with(json!({"methods": ["GET /"]})), "not an HTTP method token"),
        (with(json!({"methods": vec!["GET"; 33]})), "at most 32 methods"),
        (with(json!({"paths": ["repos"]})), "must start with '/'"),
        (with(json!({"paths": ["/a/../b"]})), "no '.' or '..' segment"),
        (with(json!({"paths": ["/a%2e%2e/b"]})), "no encoded"),
        (with(json!({"paths": [format!("/{}", "a".repeat(600))]})), "at most 512 bytes"),
        (with(json!({"scope": {}})), "scope must be exactly one of"),
        (with(json!({"scope": {"org": false}})), "scope must be exactly one of"),
        (with(json!({"scope": {"org": true, "class": "user"}})), "scope must be exactly one of"),
        (with(json!({"scope": {"class": "internal"}})), "class"),
        (with(json!({"scope": {"identity": "bad id"}})), "bad id"),
        (with(json!({"scope": {"team": "x"}})), "unknown field `team`"),
        (with(json!({"unknown": 1})), "unknown field `unknown`"),
        (json!({"hosts": ["api.github.com"], "scope": {"org": true}}), "missing field `value`"),
        (with(json!({"hosts": "api.github.com"})), "hosts"),
        // A value of the wrong type is refused without quoting it.
        (with(json!({"value": 4_242_424_242_u64})), "the value must be a JSON string"),
        (with(json!({"value": true})), "the value must be a JSON string"),
        (with(json!({"value": [VALUE]})), "the value must be a JSON string"),
        (with(json!({"value": {"v": VALUE}})), "the value must be a JSON string"),
    ];
    for (body, want) in cases {
        let got = f.put("gh", "svc-key", &body).await;
        assert_error(&got, 400, "invalid_argument");
        let message = got.body["message"].as_str().unwrap();
        assert!(message.contains(want), "{body}: want {want:?} in {message:?}");
        assert!(!message.contains("4242424242"), "the mistyped value is not quoted: {message}");
    }
    // Not JSON, or not said to be JSON.
    let got =
        f.call("PUT", "/v1/orgs/acme/secrets/gh", Some("svc-key"), &format!("{{\"value\": \"{VALUE}")).await;
    assert_error(&got, 400, "invalid_argument");
    let req = Request::builder()
        .method("PUT")
        .uri("/v1/orgs/acme/secrets/gh")
        .header("authorization", "Bearer svc-key")
        .header("content-type", "text/plain")
        .body(Body::from(secret(json!({"org": true})).to_string()))
        .unwrap();
    let resp = f.router.clone().oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Names with path characters, or breaking the rules: 400 naming the name; a delete of
    // such a name finds nothing.
    for name in ["a%2Fb", "..", ".hidden", "a%20b", "a%0Ab", "%E2%9C%93", &"n".repeat(65)] {
        let got = f.put(name, "svc-key", &secret(json!({"org": true}))).await;
        assert_error(&got, 400, "invalid_argument");
        assert!(got.body["message"].as_str().unwrap().contains("secret name"), "{name}: {}", got.text);
        let got = f.call("DELETE", &format!("/v1/orgs/acme/secrets/{name}"), Some("svc-key"), "").await;
        assert_error(&got, 404, "not_found");
    }
    let got =
        f.call("PUT", "/v1/orgs/bad%20org/secrets/gh", Some("svc-key"), &secret(json!({})).to_string()).await;
    assert_error(&got, 400, "invalid_argument");
    assert!(f.store.list(&acme()).await.unwrap().is_empty(), "nothing was stored");
    assert!(f.events.lock().unwrap().is_empty(), "nothing was audited");
    assert!(!logs.text().contains(VALUE), "{}", logs.text());
}

#[tokio::test(flavor = "current_thread")]
async fn a_ten_mib_value_is_refused_and_not_stored() {
    let big = json!({"value": "v".repeat(10 << 20), "hosts": ["api.github.com"], "scope": {"org": true}});
    // Over the body limit: 413 before anything is parsed.
    let f = fixture(1 << 20);
    let got = f.put("big", "svc-key", &big).await;
    assert_error(&got, 413, "too_large");
    assert!(f.store.list(&acme()).await.unwrap().is_empty());
    // Under a body limit raised past it: 400, the value's own limit.
    let f = fixture(16 << 20);
    let got = f.put("big", "svc-key", &big).await;
    assert_error(&got, 400, "invalid_argument");
    assert!(got.body["message"].as_str().unwrap().contains("1 to 8192 bytes"), "{}", got.text);
    assert!(f.store.list(&acme()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn a_user_holds_a_bounded_number_of_secrets() {
    let f = fixture(64 * 1024);
    for i in 0..MAX_SECRETS_PER_IDENTITY {
        let got = f.put(&format!("s{i}"), "alice-key", &secret(json!({"identity": "alice"}))).await;
        assert_eq!(got.status, 201, "{}", got.text);
    }
    let got = f.put("one-more", "alice-key", &secret(json!({"identity": "alice"}))).await;
    assert_error(&got, 429, "resource_exhausted");
    assert!(got.body["message"].as_str().unwrap().contains("its limit"), "{}", got.text);
    // Replacing one is still fine; another user is not held by alice's count.
    assert_eq!(f.put("s0", "alice-key", &secret(json!({"identity": "alice"}))).await.status, 200);
    assert_eq!(f.put("bob-1", "bob-key", &secret(json!({"identity": "bob"}))).await.status, 201);
}
