//! The server with `SANDLANE_DRIVER=kubernetes` against the Kubernetes driver's fake API
//! server (its kubelet runs pods as bubblewrap sandboxes): ensure and exec through the
//! API, a streamed exec, a file round trip and a background process through the
//! port-forward, a preview port (HTTP and a WebSocket relayed in frames), then a restarted
//! server (same database) serves the same live pod and finds the process still running.

use std::collections::HashMap;
use std::path::PathBuf;

use adapters::kubernetes::fake::store::Kind;
use adapters::kubernetes::fake::{FakeCluster, FakeImage, KubeletConfig};
use serde_json::{Value, json};

use crate::streams::{exec_lines, get_bytes, put_bytes, random_bytes};
use crate::support::{Backend, Env, Server, supervisor_binary};

const IMAGE: &str = "e2e-tools:1";

fn exec(server: &Server, key: &str, sandbox: &str, script: &str) -> Value {
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script]})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    got.1
}

pub fn streams_files_processes_and_a_restarted_server() {
    // The fake cluster on threads of its own; the servers start and stop around it.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let images = HashMap::from([(
        IMAGE.to_owned(),
        FakeImage {
            supervisor_at: "/opt/sandlane/sandlane-supervisor".to_owned(),
            supervisor_host: supervisor_binary(),
        },
    )]);
    let fake = runtime
        .block_on(FakeCluster::start(KubeletConfig {
            images,
            bwrap: PathBuf::from("bwrap"),
            cgroup_parent: "sandlane-e2e-kubelet".to_owned(),
        }))
        .expect("the fake API server starts");
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    for (k, v) in [
        ("SANDLANE_DRIVER", "kubernetes"),
        ("SANDLANE_KUBE_API_URL", fake.url().as_str()),
        ("SANDLANE_KUBE_NAMESPACE", "e2e"),
        ("SANDLANE_KUBE_IMAGE", IMAGE),
        ("SANDLANE_KUBE__SUPERVISOR_PATH", "/opt/sandlane/sandlane-supervisor"),
    ] {
        env.set(k, v);
    }
    let key = env.add_caller("user-ada", "user", &["acme"]);

    let mut first = Server::start(&env);
    let got = first.call(
        "PUT",
        "/v1/orgs/acme/sessions/s1/sandbox",
        Some(&key),
        Some(json!({"execution_id": "exec-1"})),
    );
    assert_eq!(
        (got.0, got.1["outcome"].as_str()),
        (200, Some("ready")),
        "{}\nthe server's log:\n{}",
        got.1,
        first.log_text()
    );
    assert_eq!(got.1["sandbox"]["driver"], "kubernetes", "{}", got.1);
    let sandbox = got.1["sandbox"]["id"].as_str().unwrap().to_owned();
    let out = exec(
        &first,
        &key,
        &sandbox,
        "echo before > /tmp/alive; sleep 600 >/dev/null 2>&1 & echo $SANDLANE_ORG",
    );
    assert_eq!((out["exit_code"].as_i64(), out["stdout"].as_str()), (Some(0), Some("acme\n")), "{out}");

    // A streamed exec: the first line arrives while the command still runs.
    let started = std::time::Instant::now();
    let mut lines =
        exec_lines(&first, &key, &sandbox, &["sh", "-c", "echo one; sleep 1; echo two >&2; exit 3"]);
    assert_eq!(lines.next(), Some(json!({"type": "stdout", "text": "one\n"})));
    let first_at = started.elapsed();
    let rest: Vec<Value> = lines.collect();
    assert!(first_at < std::time::Duration::from_millis(900), "the first line came only at {first_at:?}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(1), "positive control: the command slept");
    assert_eq!(
        rest,
        [
            json!({"type": "stderr", "text": "two\n"}),
            json!({"type": "exit", "exit_code": 3, "timed_out": false, "truncated": false})
        ]
    );

    // A file round-trips byte-exact through the files API, and the sandbox sees it.
    let files = format!("/v1/orgs/acme/sandboxes/{sandbox}/files");
    let blob = random_bytes(3 << 20);
    let got = put_bytes(&first, &key, &format!("{files}?path=/workspace/in/blob.bin"), &blob);
    assert_eq!((got.0, got.1["size"].as_u64()), (200, Some(blob.len() as u64)), "{}", got.1);
    let (status, back) = get_bytes(&first, &key, &format!("{files}?path=in/blob.bin"));
    assert_eq!(status, 200);
    assert!(back == blob, "the file round-trips ({} bytes back of {})", back.len(), blob.len());
    let out = exec(&first, &key, &sandbox, "wc -c < /workspace/in/blob.bin");
    assert_eq!(out["stdout"].as_str(), Some(format!("{}\n", blob.len()).as_str()), "{out}");

    // A preview port through the port-forward: the supervisor connects inside the pod and
    // relays the connection in frames (no descriptor crosses a port-forward), plain HTTP and
    // a WebSocket alike.
    crate::preview::start_in(
        &first,
        &key,
        &sandbox,
        ("preview_app.py", include_bytes!("preview_app.py")),
        json!(["python3", "/workspace/preview_app.py", "8000"]),
    );
    let host = crate::preview::preview_host(&first, &sandbox, 8000);
    let bearer = format!("Bearer {key}");
    crate::preview::wait_serving(&first, &host, "/headers", &bearer);
    let addr = crate::preview::address(&first);
    let got =
        crate::preview::http(&addr, &host, "GET", "/bytes?n=3145728", &[("authorization", &bearer)], b"");
    assert_eq!(
        (got.status, got.body.len()),
        (200, 3 << 20),
        "{}",
        String::from_utf8_lossy(&got.body[..200.min(got.body.len())])
    );
    let got = crate::preview::http(&addr, &host, "GET", "/headers", &[("authorization", &bearer)], b"");
    assert_eq!(got.json()["authorization"], Value::Null, "{}", got.text());
    let echoed = crate::preview::websocket_echo(&first, &host, &[("authorization", &bearer)], "pod");
    assert_eq!(echoed.as_deref(), Ok("echo:pod"));
    let got = crate::preview::http(
        &addr,
        &crate::preview::preview_host(&first, &sandbox, 8009),
        "GET",
        "/",
        &[("authorization", &bearer)],
        b"",
    );
    assert_eq!(got.status, 502, "{}", got.text());

    // A background process, kept across the restart below.
    let processes = format!("/v1/orgs/acme/sandboxes/{sandbox}/processes");
    let ticker = json!(["sh", "-c", "echo serving; while :; do sleep 0.2; echo tick; done"]);
    let got = first.call("POST", &processes, Some(&key), Some(json!({"argv": ticker})));
    assert_eq!(got.0, 201, "{}", got.1);
    let pid = got.1["pid"].as_u64().unwrap();
    assert!(first.stop(), "the first server stops cleanly");
    assert_eq!(fake.objects(Kind::Pod).len(), 1, "the pod outlives the server");

    // A new server on the same database finds the pod through the API server.
    let second = Server::start(&env);
    let out = exec(&second, &key, &sandbox, "cat /tmp/alive; cat /run/sandlane/token | cut -c1-3");
    assert_eq!(out["stdout"].as_str(), Some("before\neyJ\n"), "the same live sandbox: {out}");
    let got = second.call("GET", &format!("{processes}/{pid}"), Some(&key), None);
    assert_eq!((got.0, got.1["running"].as_bool()), (200, Some(true)), "still running: {}", got.1);
    let (status, body) = get_bytes(&second, &key, &format!("{processes}/{pid}/output"));
    assert_eq!(status, 200);
    assert!(
        String::from_utf8_lossy(&body).starts_with(r#"{"type":"stdout","text":"serving\n"#),
        "its output replays from the start: {}",
        String::from_utf8_lossy(&body)
    );
    let got = second.call(
        "POST",
        &format!("{processes}/{pid}/signal"),
        Some(&key),
        Some(json!({"signal": "TERM"})),
    );
    assert_eq!(got.0, 204, "{}", got.1);
    let got = second.call("DELETE", "/v1/orgs/acme/sessions/s1/sandbox", Some(&key), None);
    assert_eq!(got.0, 204, "{}", got.1);
    assert!(fake.objects(Kind::Pod).is_empty(), "deprovision ended the pod");
    assert!(fake.objects(Kind::Secret).is_empty(), "and removed its secret");
    drop(second);
    runtime.block_on(fake.shutdown());
}
