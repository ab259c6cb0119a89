//! The server with `SANDLANE_DRIVER=kubernetes` against the Kubernetes driver's fake API
//! server (its kubelet runs pods as bubblewrap sandboxes): ensure and exec through the
//! API, then a restarted server (same database) serves the same live pod.

use std::collections::HashMap;
use std::path::PathBuf;

use adapters::kubernetes::fake::store::Kind;
use adapters::kubernetes::fake::{FakeCluster, FakeImage, KubeletConfig};
use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, binary};

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

pub fn a_restarted_server_serves_its_live_pods() {
    // The fake cluster on threads of its own; the servers start and stop around it.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let images = HashMap::from([(
        IMAGE.to_owned(),
        FakeImage { supervisor_at: "/opt/sandlane/sandlane".to_owned(), supervisor_host: binary() },
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
        ("SANDLANE_KUBE__SUPERVISOR_PATH", "/opt/sandlane/sandlane"),
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
    assert!(first.stop(), "the first server stops cleanly");
    assert_eq!(fake.objects(Kind::Pod).len(), 1, "the pod outlives the server");

    // A new server on the same database finds the pod through the API server.
    let second = Server::start(&env);
    let out = exec(&second, &key, &sandbox, "cat /tmp/alive; cat /run/sandlane/token | cut -c1-3");
    assert_eq!(out["stdout"].as_str(), Some("before\neyJ\n"), "the same live sandbox: {out}");
    let got = second.call("DELETE", "/v1/orgs/acme/sessions/s1/sandbox", Some(&key), None);
    assert_eq!(got.0, 204, "{}", got.1);
    assert!(fake.objects(Kind::Pod).is_empty(), "deprovision ended the pod");
    assert!(fake.objects(Kind::Secret).is_empty(), "and removed its secret");
    drop(second);
    runtime.block_on(fake.shutdown());
}
