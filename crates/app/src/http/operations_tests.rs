//! The streaming, process and file routes over mocks: NDJSON negotiation and framing,
//! the mapping of each refusal onto its status, caps answered before a body is read, and
//! streams that end when the server stops.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::{Body, to_bytes};
use axum::http::{Request, StatusCode};
use domain::execution::SandboxSubject;
use domain::{
    CallerClass, CallerIdentity, DurabilityPolicy, ExitStatus, IdentityId, OrgId, OutputEvent, SandboxId,
    Timestamp,
};
use ports::{
    DriverError, MockAuditLog, MockCallerDirectory, MockClock, MockCredentialMinter, MockCredentialVerifier,
    MockSandboxDriver, MockSandboxLane, MockSandboxRegistry, OutputStream,
};
use serde_json::Value;
use tower::ServiceExt;

use super::ndjson::Shutdown;
use super::tests::AlwaysReady;
use super::{AppState, router};
use crate::metrics::Metrics;
use crate::test_support::{agent_execution, existing_ready};
use crate::usecase::{LaneDeps, StreamLimits};

fn sandbox() -> SandboxId {
    SandboxId::generate(31, 31)
}

fn base() -> String {
    format!("/v1/orgs/acme/sandboxes/{}", sandbox())
}

/// A stream of the given events, then (when `hang`) nothing more, ever.
struct Events {
    events: Vec<OutputEvent>,
    hang: bool,
}

#[async_trait]
impl OutputStream for Events {
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError> {
        if self.events.is_empty() {
            if self.hang {
                std::future::pending::<()>().await;
            }
            return Ok(None);
        }
        Ok(Some(self.events.remove(0)))
    }
}

/// A router where `svc-key` is a service caller of acme, the sandbox is ready, and the
/// driver is `driver`; the caps are `limits`.
fn app(driver: MockSandboxDriver, limits: StreamLimits, shutdown: Shutdown) -> Router {
    let mut directory = MockCallerDirectory::new();
    directory.expect_authenticate().returning(|key| {
        Ok((key.expose() == "svc-key").then(|| {
            let org = vec![OrgId::parse("acme").unwrap()];
            CallerIdentity::from_wire(IdentityId::parse("svc").unwrap(), CallerClass::Service, org, None)
                .unwrap()
        }))
    });
    let mut registry = MockSandboxRegistry::new();
    let record = existing_ready(agent_execution().sandbox_key(), &sandbox());
    registry.expect_get_with_owner().returning(move |_| Ok(Some((record.clone(), None))));
    let mut clock = MockClock::new();
    clock.expect_now().return_const(Timestamp::from_unix_millis(0));
    let clock: Arc<dyn ports::Clock> = Arc::new(clock);
    let mut policies = ports::MockPolicyStore::new();
    policies.expect_overrides().returning(|_| Ok(None));
    let mut driver = driver;
    driver.expect_name().return_const("bubblewrap");
    let deps = LaneDeps {
        lane: Arc::new(MockSandboxLane::new()),
        minter: Arc::new(MockCredentialMinter::new()),
        driver: Arc::new(driver),
        registry: Arc::new(registry),
        audit: Arc::new(MockAuditLog::new()),
        clock: clock.clone(),
        policy: DurabilityPolicy::default(),
        replica_id: "r".into(),
        lease_ms: 1000,
        wait_poll_ms: 1,
        ensure_deadline: Duration::from_secs(5),
        directory: Arc::new(MockCallerDirectory::new()),
        policies: Arc::new(crate::usecase::Policies::new(Arc::new(policies), domain::OrgPolicy::builtin())),
        activity: Arc::default(),
        commands: Arc::new(crate::usecase::CommandGate::new(
            Arc::new(ports::MockQuotaLeases::new()),
            clock.clone(),
            "r",
        )),
        streams: limits,
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
        verifier: Arc::new(MockCredentialVerifier::new()),
        metrics: Arc::new(Metrics::default()),
        readiness: Arc::new(AlwaysReady),
        driver_health: Default::default(),
        scrape: Default::default(),
        audit_verdict: Default::default(),
        request_timeout: Duration::from_secs(5),
        body_limit: 1024,
        shutdown,
        webhooks: None,
        preview_domain: "preview.localhost".into(),
    }))
}

async fn send(app: Router, req: Request<Body>) -> (StatusCode, String, Vec<u8>) {
    let resp = app.oneshot(req).await.unwrap();
    let status = resp.status();
    let ctype =
        resp.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
    let bytes = to_bytes(resp.into_body(), 1 << 20).await.unwrap().to_vec();
    (status, ctype, bytes)
}

fn request(method: &str, uri: &str) -> axum::http::request::Builder {
    Request::builder().method(method).uri(uri).header("authorization", "Bearer svc-key")
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

#[tokio::test]
async fn exec_streams_ndjson_when_asked_and_json_otherwise() {
    let mut driver = MockSandboxDriver::new();
    driver.expect_exec_stream().times(1).returning(|_, request| {
        assert_eq!(request.argv(), ["sh"]);
        Ok(Box::new(Events {
            events: vec![
                OutputEvent::Stdout(b"one\n".to_vec()),
                OutputEvent::Stderr(vec![0xff]),
                OutputEvent::Exit(ExitStatus { exit_code: 2, timed_out: false, truncated: false }),
            ],
            hang: false,
        }) as Box<dyn OutputStream>)
    });
    driver
        .expect_exec()
        .times(1)
        .returning(|_, _| Ok(domain::ExecOutput { exit_code: 0, ..Default::default() }));
    let app = app(driver, StreamLimits::default(), Shutdown::default());
    let body = r#"{"argv":["sh"]}"#;
    let req = request("POST", &format!("{}/exec", base()))
        .header("content-type", "application/json")
        .header("accept", "application/x-ndjson")
        .body(Body::from(body))
        .unwrap();
    let (status, ctype, bytes) = send(app.clone(), req).await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "application/x-ndjson"));
    let lines: Vec<Value> =
        String::from_utf8(bytes).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(
        lines,
        vec![
            serde_json::json!({"type": "stdout", "text": "one\n"}),
            serde_json::json!({"type": "stderr", "data": "/w=="}),
            serde_json::json!({"type": "exit", "exit_code": 2, "timed_out": false, "truncated": false}),
        ]
    );
    let req = request("POST", &format!("{}/exec", base()))
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let (status, ctype, bytes) = send(app, req).await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "application/json"));
    assert_eq!(json(&bytes)["exit_code"], 0);
}

#[tokio::test]
async fn an_upload_over_the_cap_is_refused_before_its_body_is_read() {
    let mut driver = MockSandboxDriver::new();
    driver.expect_write_file().never();
    driver.expect_archive_in().never();
    let limits = StreamLimits { max_file_bytes: 100, max_archive_bytes: 100, ..StreamLimits::default() };
    let app = app(driver, limits, Shutdown::default());
    // The body never ends: only the length it declares can have been read.
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<axum::body::Bytes, std::io::Error>>(1);
    let never = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let req = request("PUT", &format!("{}/files?path=/workspace/big", base()))
        .header("content-length", "1073741824")
        .body(never)
        .unwrap();
    let (status, _, bytes) =
        tokio::time::timeout(Duration::from_secs(5), send(app.clone(), req)).await.unwrap();
    assert_eq!((status, json(&bytes)["error"].as_str()), (StatusCode::PAYLOAD_TOO_LARGE, Some("too_large")));
    let req = request("PUT", &format!("{}/archive?path=/workspace", base()))
        .header("content-length", "101")
        .body(Body::from(vec![0u8; 101]))
        .unwrap();
    assert_eq!(send(app, req).await.0, StatusCode::PAYLOAD_TOO_LARGE);
}

#[tokio::test]
async fn refusals_map_onto_their_codes() {
    let mut driver = MockSandboxDriver::new();
    driver.expect_start_process().returning(|_, _, _| Err(DriverError::ResourceExhausted("full".into())));
    driver.expect_process().returning(|id, pid| Err(DriverError::NoSuchProcess { sandbox: id.clone(), pid }));
    driver.expect_read_path().returning(|_, _| Err(DriverError::Invalid("leads outside".into())));
    driver.expect_delete_path().returning(|_, _, _| Err(DriverError::Conflict("not empty".into())));
    driver.expect_signal_process().never();
    let app = app(driver, StreamLimits::default(), Shutdown::default());
    let cases = [
        (
            request("POST", &format!("{}/processes", base()))
                .header("content-type", "application/json")
                .body(Body::from(r#"{"argv":["x"]}"#))
                .unwrap(),
            429,
            "resource_exhausted",
        ),
        (request("GET", &format!("{}/processes/7", base())).body(Body::empty()).unwrap(), 404, "not_found"),
        (
            request("GET", &format!("{}/processes/0", base())).body(Body::empty()).unwrap(),
            400,
            "invalid_argument",
        ),
        (
            request("GET", &format!("{}/files?path=/workspace/l", base())).body(Body::empty()).unwrap(),
            400,
            "invalid_argument",
        ),
        (
            request("GET", &format!("{}/files?path=/etc/passwd", base())).body(Body::empty()).unwrap(),
            400,
            "invalid_argument",
        ),
        (
            request("GET", &format!("{}/files?path=/workspace/../x", base())).body(Body::empty()).unwrap(),
            400,
            "invalid_argument",
        ),
        (
            request("DELETE", &format!("{}/files?path=/workspace/d", base())).body(Body::empty()).unwrap(),
            409,
            "conflict",
        ),
        (
            request("POST", &format!("{}/processes/7/signal", base()))
                .header("content-type", "application/json")
                .body(Body::from(r#"{"signal":"SIGTERM"}"#))
                .unwrap(),
            400,
            "invalid_argument",
        ),
    ];
    for (req, status, code) in cases {
        let what = format!("{} {}", req.method(), req.uri());
        let (got, _, bytes) = send(app.clone(), req).await;
        assert_eq!(
            (got.as_u16(), json(&bytes)["error"].as_str()),
            (status, Some(code)),
            "{what}: {}",
            json(&bytes)
        );
    }
}

#[tokio::test]
async fn a_followed_output_ends_when_the_server_stops() {
    let mut driver = MockSandboxDriver::new();
    driver.expect_process_output().returning(|_, _, follow| {
        assert!(follow);
        Ok(Box::new(Events { events: vec![OutputEvent::Stdout(b"tick\n".to_vec())], hang: true })
            as Box<dyn OutputStream>)
    });
    let shutdown = Shutdown::default();
    let app = app(driver, StreamLimits::default(), shutdown.clone());
    let req =
        request("GET", &format!("{}/processes/7/output?follow=true", base())).body(Body::empty()).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let reading = tokio::spawn(to_bytes(resp.into_body(), 1 << 20));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reading.is_finished(), "positive control: a followed output waits for more");
    shutdown.begin();
    let bytes = tokio::time::timeout(Duration::from_secs(5), reading).await.unwrap().unwrap().unwrap();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines[0], serde_json::json!({"type": "stdout", "text": "tick\n"}));
    assert_eq!(lines[1]["type"], "error");
    assert_eq!(lines[1]["error"], "unavailable");
}

/// A listing as it comes: some batches, then (when `hang`) nothing more, ever; or a
/// failure after its batches.
struct Listing {
    batches: Vec<Vec<domain::DirEntry>>,
    end: Option<DriverError>,
    hang: bool,
}

#[async_trait]
impl ports::EntryStream for Listing {
    async fn next(&mut self) -> Result<Option<Vec<domain::DirEntry>>, DriverError> {
        if self.batches.is_empty() {
            if self.hang {
                std::future::pending::<()>().await;
            }
            return self.end.take().map_or(Ok(None), Err);
        }
        Ok(Some(self.batches.remove(0)))
    }
}

/// A directory's entries are streamed as the JSON the API documents (`{"entries":[…]}`,
/// whatever the batches); a listing that breaks off aborts the response rather than end it
/// as if whole; and while a sandbox has `streams.max_file_ops_per_sandbox` file
/// operations under way, one more is 429 `resource_exhausted`.
#[tokio::test]
async fn listings_are_streamed_and_file_operations_are_capped() {
    let entry = |name: &str, kind| domain::DirEntry { name: name.into(), kind, size: 3 };
    let mut driver = MockSandboxDriver::new();
    driver.expect_read_path().returning(move |_, p| {
        let listing = match p.relative() {
            "empty" => Listing { batches: vec![], end: None, hang: false },
            "broken" => Listing {
                batches: vec![vec![entry("a", domain::EntryKind::File)]],
                end: Some(DriverError::Failed("gone".into())),
                hang: false,
            },
            "slow" => Listing { batches: vec![], end: None, hang: true },
            _ => Listing {
                batches: vec![
                    vec![entry("a\"b", domain::EntryKind::File), entry("c", domain::EntryKind::Directory)],
                    vec![entry("d", domain::EntryKind::Symlink)],
                ],
                end: None,
                hang: false,
            },
        };
        Ok(ports::ReadOutcome::Directory(Box::new(listing)))
    });
    driver.expect_delete_path().returning(|_, _, _| Ok(()));
    let limits = StreamLimits { max_file_ops_per_sandbox: 2, ..StreamLimits::default() };
    let app = app(driver, limits, Shutdown::default());
    let get = |p: &str| request("GET", &format!("{}/files?path={p}", base())).body(Body::empty()).unwrap();
    let (status, ctype, bytes) = send(app.clone(), get("/workspace/d")).await;
    assert_eq!((status, ctype.as_str()), (StatusCode::OK, "application/json"));
    assert_eq!(
        json(&bytes),
        serde_json::json!({"entries": [
            {"name": "a\"b", "type": "file", "size": 3},
            {"name": "c", "type": "directory", "size": 3},
            {"name": "d", "type": "symlink", "size": 3},
        ]})
    );
    let (status, _, bytes) = send(app.clone(), get("/workspace/empty")).await;
    assert_eq!((status, json(&bytes)), (StatusCode::OK, serde_json::json!({"entries": []})));
    // Broken off after a batch: the body fails, it does not end.
    let resp = app.clone().oneshot(get("/workspace/broken")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(to_bytes(resp.into_body(), 1 << 20).await.is_err(), "a broken listing is not presented as whole");
    // Two listings under way (their bodies unread) hold the sandbox's two places.
    let first = app.clone().oneshot(get("/workspace/slow")).await.unwrap();
    let second = app.clone().oneshot(get("/workspace/slow")).await.unwrap();
    assert_eq!((first.status(), second.status()), (StatusCode::OK, StatusCode::OK));
    let (status, _, bytes) = send(app.clone(), get("/workspace/d")).await;
    assert_eq!(
        (status, json(&bytes)["error"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("resource_exhausted"))
    );
    assert!(
        json(&bytes)["message"].as_str().unwrap().contains("streams.max_file_ops_per_sandbox"),
        "{}",
        json(&bytes)
    );
    let delete =
        request("DELETE", &format!("{}/files?path=/workspace/x", base())).body(Body::empty()).unwrap();
    assert_eq!(send(app.clone(), delete).await.0, StatusCode::TOO_MANY_REQUESTS);
    // A client that goes away gives its place back.
    drop(first);
    let (status, _, _) = send(app.clone(), get("/workspace/d")).await;
    assert_eq!(status, StatusCode::OK);
    drop(second);
}
