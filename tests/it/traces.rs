//! Traces end to end: the real binary exports its spans as OTLP/HTTP protobuf to a receiver
//! on loopback (decoded here with `opentelemetry-proto`), a caller's `traceparent` is the
//! parent of its requests' spans, the trace id is in error bodies and JSON log lines, no
//! exported attribute holds a caller key, a sandbox token or a brokered secret's value, and
//! with no endpoint nothing is exported at all.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";
/// A trace whose caller marked it not sampled.
const UNSAMPLED_TRACE: &str = "5cf92f3577b34da6a3ce929d0e0e4737";
const SECRET_VALUE: &str = "sk-live-traces-Zq81mW0pVb3x";

/// An OTLP/HTTP receiver on loopback: every request's body decoded, kept with its path.
struct Receiver {
    url: String,
    requests: Arc<Mutex<Vec<(String, ExportTraceServiceRequest)>>>,
}

impl Receiver {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let sink = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let sink = sink.clone();
                std::thread::spawn(move || serve(stream, &sink));
            }
        });
        Self { url, requests }
    }

    fn spans(&self) -> Vec<Span> {
        let requests = self.requests.lock().unwrap();
        let mut spans = Vec::new();
        for (path, request) in requests.iter() {
            assert_eq!(path, "/v1/traces");
            for resource in &request.resource_spans {
                for scope in &resource.scope_spans {
                    spans.extend(scope.spans.iter().cloned());
                }
            }
        }
        spans
    }

    fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

/// HTTP/1.1 with keep-alive, as the exporter's client sends it.
fn serve(stream: TcpStream, sink: &Mutex<Vec<(String, ExportTraceServiceRequest)>>) {
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut start = String::new();
        if reader.read_line(&mut start).unwrap_or(0) == 0 {
            return;
        }
        let path = start.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; length];
        reader.read_exact(&mut body).unwrap();
        let request =
            ExportTraceServiceRequest::decode(body.as_slice()).expect("an ExportTraceServiceRequest");
        sink.lock().unwrap().push((path, request));
        let _ = writer.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A request with a `traceparent`; (status, JSON body).
fn call_traced(
    server: &Server,
    method: &str,
    path: &str,
    key: &str,
    body: Option<Value>,
    span: &str,
) -> (u16, Value) {
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let url = format!("{}{path}", server.base);
    let traceparent = format!("00-{TRACE}-{span}-01");
    let auth = format!("Bearer {key}");
    let response = match (method, body) {
        ("PUT", Some(b)) => {
            agent.put(&url).header("authorization", &auth).header("traceparent", &traceparent).send_json(b)
        }
        ("POST", Some(b)) => {
            agent.post(&url).header("authorization", &auth).header("traceparent", &traceparent).send_json(b)
        }
        ("GET", _) => {
            agent.get(&url).header("authorization", &auth).header("traceparent", &traceparent).call()
        }
        (m, _) => panic!("unsupported {m}"),
    };
    let mut response = response.expect("HTTP request");
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// An ensure, an exec (reading the sandbox's own token), a secret set and a refused read,
/// each with a `traceparent` of [`TRACE`]; returns the caller key and the token.
fn traced_work(server: &Server, key: &str) -> String {
    let got = call_traced(
        server,
        "PUT",
        "/v1/orgs/acme/sessions/s-traced/sandbox",
        key,
        Some(json!({"execution_id": "e-1"})),
        PARENT,
    );
    assert_eq!(got.0, 200, "{}", got.1);
    let sandbox = got.1["sandbox"]["id"].as_str().unwrap().to_owned();
    let got = call_traced(
        server,
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        key,
        Some(json!({"argv": ["/bin/sh", "-c", "cat \"$SANDLANE_TOKEN_FILE\""]})),
        PARENT,
    );
    assert_eq!(got.0, 200, "{}", got.1);
    let token = got.1["stdout"].as_str().unwrap().trim().to_owned();
    assert!(token.len() > 20, "the sandbox's token: {token:?}");
    let got = call_traced(
        server,
        "PUT",
        "/v1/orgs/acme/secrets/traced",
        key,
        Some(json!({"value": SECRET_VALUE, "hosts": ["api.example.com"], "scope": {"org": true}})),
        PARENT,
    );
    assert_eq!(got.0, 201, "{}", got.1);
    // A refusal's body carries the trace id.
    let got = call_traced(server, "GET", "/v1/orgs/acme/sandboxes/sbx_nope", key, None, PARENT);
    assert!(matches!(got.0, 400 | 404), "{}", got.1);
    assert_eq!(got.1["trace_id"], TRACE, "{}", got.1);
    token
}

fn setup(tweak: impl FnOnce(&mut Env)) -> Option<(Env, String)> {
    let mut env = Env::new(Backend::Sqlite)?;
    tweak(&mut env);
    let key = env.add_caller("svc-traced", "service", &["acme"]);
    let (code, _, err) = env.cli(&["org", "set", "acme", "--egress-allow", "api.example.com"]);
    assert_eq!(code, 0, "{err}");
    Some((env, key))
}

#[test]
fn spans_of_an_ensure_and_an_exec_reach_the_collector_under_the_callers_parent() {
    let receiver = Receiver::start();
    let Some((env, key)) = setup(|env| {
        env.set("SANDLANE_OTLP_ENDPOINT", &receiver.url);
        env.set("OTEL_BSP_SCHEDULE_DELAY", "100");
    }) else {
        return;
    };
    let server = Server::start_binary(&env);
    let token = traced_work(&server, &key);
    // A caller that marks its parent as not sampled (`-00`) does not take the server's
    // spans out of the export.
    let unsampled = format!("00-{UNSAMPLED_TRACE}-{PARENT}-00");
    let agent = ureq::Agent::config_builder().http_status_as_error(false).build().new_agent();
    let got = agent
        .get(&format!("{}/v1/orgs/acme/sandboxes/sbx_nope", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .header("traceparent", &unsampled)
        .call()
        .expect("HTTP request");
    assert!(matches!(got.status().as_u16(), 400 | 404));
    let wanted = ["ensure_session_sandbox", "claim", "mint", "provision", "exec"];
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = receiver.spans();
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        // The four requests' own spans too (exported as each request ends).
        let requests = spans.iter().filter(|s| hex(&s.parent_span_id) == PARENT).count();
        let unsampled_exported = spans.iter().any(|s| hex(&s.trace_id) == UNSAMPLED_TRACE);
        if wanted.iter().all(|w| names.contains(w)) && requests >= 5 && unsampled_exported {
            break spans;
        }
        assert!(Instant::now() < deadline, "spans missing after 30 s; got {names:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let ours: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    for name in wanted {
        assert!(ours.iter().any(|s| s.name == name), "no {name} span in trace {TRACE}");
    }
    // Every span of the trace descends from the caller's span: follow the parents up.
    let by_id: std::collections::HashMap<String, &Span> =
        ours.iter().map(|s| (hex(&s.span_id), *s)).collect();
    for span in &ours {
        let mut at = *span;
        let mut hops = 0;
        while hex(&at.parent_span_id) != PARENT {
            at = by_id
                .get(&hex(&at.parent_span_id))
                .unwrap_or_else(|| panic!("span {} has a parent outside the trace", span.name));
            hops += 1;
            assert!(hops < 50);
        }
    }
    let requests: Vec<&&Span> = ours.iter().filter(|s| hex(&s.parent_span_id) == PARENT).collect();
    assert!(requests.len() >= 4, "one request span per call under the caller's span");
    // The ensure span says who and how, not with what credential.
    let ensure = ours.iter().find(|s| s.name == "ensure_session_sandbox").unwrap();
    let attribute = |span: &Span, name: &str| {
        span.attributes.iter().find(|a| a.key == name).map(|a| format!("{:?}", a.value))
    };
    for field in ["org", "caller_class", "key_kind", "outcome"] {
        assert!(attribute(ensure, field).is_some(), "{field} on the ensure span");
    }
    assert!(attribute(ensure, "outcome").unwrap().contains("ready"));
    for name in ["claim", "mint", "provision"] {
        let span = ours.iter().find(|s| s.name == name).unwrap();
        for field in ["org", "caller_class", "key_kind", "outcome"] {
            assert!(attribute(span, field).is_some(), "{field} on the {name} span");
        }
    }
    let exec = ours.iter().find(|s| s.name == "exec").unwrap();
    for field in ["org", "caller_class", "outcome"] {
        assert!(attribute(exec, field).is_some(), "{field} on the exec span");
    }
    // No exported span (attributes, events, anything) holds a credential or secret value.
    let everything = format!("{spans:?}");
    for (what, secret) in
        [("the caller key", key.as_str()), ("the sandbox token", &token), ("the secret", SECRET_VALUE)]
    {
        assert!(!everything.contains(secret), "{what} is in an exported span");
    }
    // Every JSON log line of these requests carries the trace id.
    let logs = server.log_text();
    let traced = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["trace_id"] == TRACE)
        .count();
    assert!(traced > 0, "no log line with trace_id {TRACE}:\n{logs}");
    assert!(!logs.contains(&key) && !logs.contains(&token) && !logs.contains(SECRET_VALUE));
}

#[test]
fn no_endpoint_exports_nothing() {
    let receiver = Receiver::start();
    // The standard variable names the receiver: the server must not build an exporter.
    let Some((env, key)) = setup(|env| {
        env.set("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.url);
        env.set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", &format!("{}/v1/traces", receiver.url));
        env.set("OTEL_BSP_SCHEDULE_DELAY", "100");
    }) else {
        return;
    };
    let server = Server::start_binary(&env);
    traced_work(&server, &key);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(receiver.request_count(), 0, "something was exported with no endpoint set");
    // The trace id is still the caller's, in the logs as in the error bodies.
    assert!(server.log_text().contains(TRACE));
}
