//! Snapshots, forks and restore end to end, on bubblewrap and on containers: a snapshot is
//! the workspace at one instant (later writes to the source never reach a fork), forks
//! are independent of each other, a restore brings the source back under the same id with
//! a fresh token, a fork acts for its ensurer, a user cannot fork another user's snapshot
//! (a service of the org can), the org's quota refuses with 429, and the audit log names
//! every fork's source.

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, assert_error};
use crate::token::verify_with_jwks;

pub enum Driver {
    Bubblewrap,
    Container,
}

fn ensure(server: &Server, key: &str, session: &str, from: Option<&str>) -> Value {
    let mut body = json!({"execution_id": "e1"});
    if let Some(from) = from {
        body["from_snapshot"] = json!(from);
    }
    let got = server.call("PUT", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(key), Some(body));
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["outcome"], "ready", "{}", got.1);
    got.1["sandbox"].clone()
}

fn sh(server: &Server, key: &str, sandbox: &Value, script: &str) -> String {
    let (code, out) = server.exec_sh(key, sandbox["id"].as_str().unwrap(), script);
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["exit_code"], 0, "{script}: {out}");
    out["stdout"].as_str().unwrap().to_owned()
}

fn token_sub(server: &Server, key: &str, sandbox: &Value) -> String {
    let token = sh(server, key, sandbox, "cat /run/sandlane/token");
    let jwks = server.call("GET", "/.well-known/jwks.json", None, None).1;
    verify_with_jwks(&token, &jwks)["sub"].as_str().unwrap().to_owned()
}

/// Whether a snapshot is being copied under `dir` (a `.snp_….partial` directory).
fn copying(dir: &std::path::Path, depth: u32) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else { return false };
    entries.flatten().any(|e| {
        let name = e.file_name().to_string_lossy().into_owned();
        (name.starts_with(".snp_") && name.ends_with(".partial"))
            || (depth > 0 && e.file_type().is_ok_and(|t| t.is_dir()) && copying(&e.path(), depth - 1))
    })
}

/// Sends a snapshot request and closes the connection once the copy is under way (the
/// request has passed everything a closed connection could still stop), or after 10 s.
fn leave_once_copying(server: &Server, route: &str, key: &str, data: &std::path::Path) {
    use std::io::Write;
    let address = server.base.trim_start_matches("http://");
    let body = json!({"name": "left"}).to_string();
    let mut stream = std::net::TcpStream::connect(address).expect("connect");
    write!(
        stream,
        "POST {route} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let started = std::time::Instant::now();
    while !copying(data, 5) && started.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    eprintln!(
        "left the snapshot request after {:?}, the copy under way: {}",
        started.elapsed(),
        copying(data, 5)
    );
    drop(stream);
}

/// Bubblewrap starts the next ephemeral fork of a snapshot ahead (after `earlier`, a
/// service's fork of it): once one is ready, the next service fork takes it (its state
/// directory renamed), with its own token and the snapshot's files, and the two forks
/// never see each other's writes.
fn forks_ahead(server: &Server, env: &Env, svc: &str, session: &str, snapshot: &str, earlier: &Value) {
    let sandboxes = env.data.path().join("data").join("sandboxes");
    let ready = || -> Vec<std::path::PathBuf> {
        let dirs = std::fs::read_dir(&sandboxes).into_iter().flatten().flatten().map(|e| e.path());
        dirs.filter(|d| d.join("ahead-ready").is_file()).collect()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut ahead = ready();
    while ahead.is_empty() {
        assert!(std::time::Instant::now() < deadline, "no fork was started ahead");
        std::thread::sleep(std::time::Duration::from_millis(20));
        ahead = ready();
    }
    let fork = ensure(server, svc, session, Some(snapshot));
    assert!(ahead.iter().any(|d| !d.exists()), "the fork took the one started ahead: {ahead:?}");
    assert_eq!(token_sub(server, svc, &fork), "svc", "its token is its own");
    assert_eq!(fork["durability"], "ephemeral");
    assert_eq!(sh(server, svc, &fork, "cat /workspace/a"), "one\n", "the snapshot's files");
    sh(server, svc, earlier, "echo other > /workspace/a");
    assert_eq!(sh(server, svc, &fork, "cat /workspace/a && echo mine > /workspace/a"), "one\n");
    assert_eq!(
        sh(server, svc, earlier, "cat /workspace/a"),
        "other\n",
        "forks never see each other's writes"
    );
}

pub fn snapshots_forks_and_restore(driver: Driver) {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    if let Driver::Container = driver {
        let Some(engine) = tests::services::podman_engine() else { return };
        env.set("SANDLANE_DRIVER", "container");
        env.set("SANDLANE_DOCKER_HOST", &engine.docker_host);
        env.set("SANDLANE_CONTAINER_IMAGE", &engine.image);
    }
    env.set("SANDLANE_POLICY__WORKSPACE_BYTES", "64MiB");
    let alice = env.add_caller("alice", "user", &["acme"]);
    let bob = env.add_caller("bob", "user", &["acme"]);
    let svc = env.add_caller("svc", "service", &["acme"]);
    let server = Server::start(&env);
    // Session ids of their own, so durable workspaces of earlier runs are never met.
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let session = |n: &str| format!("{n}{tag}");

    let source = ensure(&server, &alice, &session("src"), None);
    let src_id = source["id"].as_str().unwrap().to_owned();
    sh(
        &server,
        &alice,
        &source,
        "echo one > /workspace/a && mkdir -p /workspace/d && echo deep > /workspace/d/b",
    );
    // A process that keeps writing while the snapshot is taken: the source keeps running.
    sh(
        &server,
        &alice,
        &source,
        "(while true; do date >> /workspace/log; sleep 0.05; done) >/dev/null 2>&1 &",
    );

    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{src_id}/snapshots"),
        Some(&alice),
        Some(json!({"name": "before-change"})),
    );
    assert_eq!(got.0, 201, "{}", got.1);
    let snap = got.1.clone();
    let snap_id = snap["id"].as_str().unwrap().to_owned();
    assert!(snap_id.starts_with("snp_"), "{snap}");
    assert_eq!(
        (snap["sandbox_id"].as_str(), snap["owner"].as_str(), snap["name"].as_str()),
        (Some(src_id.as_str()), Some("alice"), Some("before-change"))
    );
    assert!(snap["bytes"].as_u64().unwrap() > 0, "{snap}");
    // The source goes on: its writer still writes, and it can be changed.
    let before = sh(&server, &alice, &source, "wc -l < /workspace/log").trim().parse::<u64>().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let after = sh(&server, &alice, &source, "wc -l < /workspace/log").trim().parse::<u64>().unwrap();
    assert!(after > before, "the source's process runs on after the snapshot ({before} → {after})");
    sh(&server, &alice, &source, "echo two > /workspace/a");

    // Three forks from the snapshot: each sees its content, none the later change.
    let forks: Vec<Value> =
        (1..=3).map(|n| ensure(&server, &alice, &session(&format!("fork{n}-")), Some(&snap_id))).collect();
    for f in &forks {
        assert_eq!(f["forked_from"].as_str(), Some(snap_id.as_str()), "{f}");
        assert_ne!(f["id"], source["id"]);
        assert_eq!(sh(&server, &alice, f, "cat /workspace/a /workspace/d/b"), "one\ndeep\n");
        assert!(
            !sh(&server, &alice, f, "ls -a /run/sandlane").contains(&src_id),
            "nothing of the source's run dir"
        );
    }
    // Writes of one fork are invisible to the others (and to the source).
    sh(&server, &alice, &forks[0], "echo mine > /workspace/a && touch /workspace/only-in-fork1");
    assert_eq!(sh(&server, &alice, &forks[1], "cat /workspace/a; ls /workspace"), "one\na\nd\nlog\n");
    assert_eq!(sh(&server, &alice, &source, "cat /workspace/a"), "two\n");
    // Files in a fork belong to the fork's own user: it can write everywhere.
    sh(&server, &alice, &forks[2], "echo w >> /workspace/d/b && rm /workspace/log");

    // An ensure of a live key ignores the snapshot, and says so.
    let again = ensure(&server, &alice, &session("fork1-"), Some(&snap_id));
    assert_eq!(
        (again["id"].clone(), again["snapshot_ignored"].as_str()),
        (forks[0]["id"].clone(), Some(snap_id.as_str()))
    );
    assert_eq!(sh(&server, &alice, &again, "cat /workspace/a"), "mine\n");

    // Identity across a fork: the token is minted for the fork's ensurer.
    assert_eq!(token_sub(&server, &alice, &forks[0]), "alice");
    let by_service = ensure(&server, &svc, &session("svcfork"), Some(&snap_id));
    assert_eq!(token_sub(&server, &svc, &by_service), "svc", "a service may fork the user's snapshot");
    assert_eq!(by_service["durability"], "ephemeral", "durability by the ensurer's class");
    assert_eq!(sh(&server, &svc, &by_service, "cat /workspace/a"), "one\n");
    if let Driver::Bubblewrap = driver {
        forks_ahead(&server, &env, &svc, &session("svcfork2"), &snap_id, &by_service);
    }
    // Another user may not fork it (nor see it).
    let body = json!({"execution_id": "e1", "from_snapshot": snap_id});
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{}/sandbox", session("bob")),
        Some(&bob),
        Some(body),
    );
    assert_error(&got, 404, "not_found");
    assert_error(
        &server.call("GET", &format!("/v1/orgs/acme/snapshots/{snap_id}"), Some(&bob), None),
        404,
        "not_found",
    );
    let listed = server.call("GET", "/v1/orgs/acme/snapshots", Some(&bob), None);
    assert_eq!(listed.1["snapshots"].as_array().unwrap().len(), 0, "{}", listed.1);
    let listed = server.call("GET", "/v1/orgs/acme/snapshots", Some(&svc), None);
    assert_eq!(listed.1["snapshots"][0]["id"], snap["id"], "{}", listed.1);
    let of_source =
        server.call("GET", &format!("/v1/orgs/acme/snapshots?sandbox_id={src_id}"), Some(&svc), None);
    assert_eq!(of_source.1["snapshots"].as_array().unwrap().len(), 1, "{}", of_source.1);
    let of_fork = format!("/v1/orgs/acme/snapshots?sandbox_id={}", forks[0]["id"].as_str().unwrap());
    assert_eq!(server.call("GET", &of_fork, Some(&svc), None).1["snapshots"].as_array().unwrap().len(), 0);
    // A sandbox token may not list or fork.
    let token = sh(&server, &alice, &source, "cat /run/sandlane/token");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/snapshots", Some(token.trim()), None),
        403,
        "permission_denied",
    );

    // Restore: same id, the snapshot's files, a fresh token.
    let old_token = sh(&server, &alice, &source, "cat /run/sandlane/token");
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{src_id}/restore"),
        Some(&alice),
        Some(json!({"snapshot": snap_id})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    let restored = got.1["sandbox"].clone();
    assert_eq!(restored["id"].as_str(), Some(src_id.as_str()));
    assert_ne!(restored["token_id"], source["token_id"]);
    assert_eq!(sh(&server, &alice, &restored, "cat /workspace/a /workspace/d/b"), "one\ndeep\n");
    assert_ne!(sh(&server, &alice, &restored, "cat /run/sandlane/token"), old_token, "a fresh token");
    assert_eq!(token_sub(&server, &alice, &restored), "alice");
    // Bob may not restore alice's sandbox.
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{src_id}/restore"),
        Some(&bob),
        Some(json!({"snapshot": snap_id})),
    );
    assert_error(&got, 403, "permission_denied");

    // The org's quota: one snapshot at most now.
    let (code, _, err) = env.cli(&["org", "set", "acme", "--max-snapshots", "1"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_millis(1500)); // the policy cache's second
    let got = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{src_id}/snapshots"),
        Some(&alice),
        Some(json!({})),
    );
    assert_error(&got, 429, "resource_exhausted");

    // The lineage in the audit log: every fork names the snapshot and its source.
    let got = server.call("GET", "/v1/orgs/acme/audit?after=0&limit=1000", Some(&svc), None);
    assert_eq!(got.0, 200, "{}", got.1);
    let events = got.1["events"].as_array().unwrap();
    let of = |action: &str| events.iter().filter(|e| e["action"] == action).collect::<Vec<_>>();
    let fork_events = of("fork");
    // Three by alice, one by the service (and on bubblewrap its second, started ahead).
    let services = if let Driver::Bubblewrap = driver { 2 } else { 1 };
    assert_eq!(fork_events.len(), 3 + services, "{events:?}");
    for e in &fork_events {
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(&snap_id) && message.contains(&src_id), "{message}");
    }
    let forked: Vec<&str> = fork_events.iter().map(|e| e["sandbox_id"].as_str().unwrap()).collect();
    for f in forks.iter().chain([&by_service]) {
        assert!(forked.contains(&f["id"].as_str().unwrap()), "{forked:?}");
    }
    assert_eq!(of("snapshot").len(), 1);
    assert!(of("restore")[0]["message"].as_str().unwrap().contains(&snap_id));

    // The same through the CLI: snapshot, fork, restore, each printing its JSON.
    env.set("SANDLANE_KEY", &svc);
    let server_url = server.base.clone();
    let run = |args: &[&str]| -> Value {
        let mut all = args.to_vec();
        all.extend(["--server", server_url.as_str()]);
        let (code, out, err) = env.cli(&all);
        assert_eq!(code, 0, "sandlane {args:?}: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let (code, _, err) = env.cli(&["org", "set", "acme", "--max-snapshots", "unlimited"]);
    assert_eq!(code, 0, "{err}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let by_cli = run(&["sandbox", "snapshot", "acme", &src_id, "--name", "cli"]);
    let cli_snap = by_cli["id"].as_str().unwrap().to_owned();
    let fork =
        run(&["sandbox", "fork", "acme", &cli_snap, "--session", &session("clifork"), "--execution", "e9"]);
    assert_eq!(fork["sandbox"]["forked_from"].as_str(), Some(cli_snap.as_str()), "{fork}");
    let wf = run(&["sandbox", "fork", "acme", &cli_snap, "--workflow", &session("cliwf")]);
    assert_eq!(wf["sandbox"]["forked_from"].as_str(), Some(cli_snap.as_str()), "{wf}");
    assert_eq!(sh(&server, &svc, &wf["sandbox"], "cat /workspace/a"), "one\n");
    let back = run(&["sandbox", "restore", "acme", &src_id, &cli_snap]);
    assert_eq!(back["sandbox"]["id"].as_str(), Some(src_id.as_str()));
    let (code, _, err) =
        env.cli(&["sandbox", "fork", "acme", &cli_snap, "--session", "a/b", "--execution", "e"]);
    assert_eq!(code, 2, "a path in an id is refused: {err}");
    for (what, key) in [("clifork", "sessions"), ("cliwf", "workflow-executions")] {
        let got = server.call(
            "DELETE",
            &format!("/v1/orgs/acme/{key}/{}/sandbox", session(what)),
            Some(&svc),
            None,
        );
        assert_eq!(got.0, 204, "{}", got.1);
    }

    // A fork never overwrites a key's durable workspace: the ensure fails (the posture's
    // message), and the workspace comes back as it was.
    let got = server.call(
        "DELETE",
        &format!("/v1/orgs/acme/sessions/{}/sandbox", session("fork2-")),
        Some(&alice),
        None,
    );
    assert_eq!(got.0, 204, "{}", got.1);
    let body = json!({"execution_id": "e2", "from_snapshot": snap_id});
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{}/sandbox", session("fork2-")),
        Some(&alice),
        Some(body),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("failed")), "{}", got.1);
    let message = got.1["message"].as_str().unwrap();
    assert!(message.starts_with("Sandbox provisioning failed: "), "{message}");
    let back = ensure(&server, &alice, &session("fork2-"), None);
    assert_eq!(sh(&server, &alice, &back, "cat /workspace/a"), "one\n", "the durable workspace as it was");

    // Delete: the snapshot goes, the forks keep their files.
    assert_eq!(
        server.call("DELETE", &format!("/v1/orgs/acme/snapshots/{snap_id}"), Some(&alice), None).0,
        204
    );
    assert_error(
        &server.call("GET", &format!("/v1/orgs/acme/snapshots/{snap_id}"), Some(&svc), None),
        404,
        "not_found",
    );
    assert_eq!(sh(&server, &alice, &forks[2], "cat /workspace/a"), "one\n");
    // A service's ephemeral sandbox (on bubblewrap, one started ahead and handed out):
    // its snapshot and fork work as any other.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let eph = ensure(&server, &svc, &session("svceph"), None);
    assert_eq!(eph["durability"], "ephemeral");
    sh(&server, &svc, &eph, "echo eph > /workspace/e");
    let route = format!("/v1/orgs/acme/sandboxes/{}/snapshots", eph["id"].as_str().unwrap());
    let got = server.call("POST", &route, Some(&svc), Some(json!({})));
    assert_eq!(got.0, 201, "{}", got.1);
    let eph_snap = got.1["id"].as_str().unwrap().to_owned();
    let eph_fork = ensure(&server, &svc, &session("svcephfork"), Some(&eph_snap));
    assert_eq!(sh(&server, &svc, &eph_fork, "cat /workspace/e"), "eph\n");
    for s in ["svceph", "svcephfork"] {
        let got = server.call(
            "DELETE",
            &format!("/v1/orgs/acme/sessions/{}/sandbox", session(s)),
            Some(&svc),
            None,
        );
        assert_eq!(got.0, 204, "{}", got.1);
    }
    let gone = server.call("DELETE", &format!("/v1/orgs/acme/snapshots/{eph_snap}"), Some(&svc), None);
    assert_eq!(gone.0, 204, "{}", gone.1);

    // A client that goes away while its snapshot is taken: the snapshot is made whole and
    // recorded, and the sandbox is not left frozen.
    sh(&server, &alice, &restored, "head -c 40000000 /dev/urandom > /workspace/blob");
    let route = format!("/v1/orgs/acme/sandboxes/{src_id}/snapshots");
    leave_once_copying(&server, &route, &alice, env.data.path());
    let started = std::time::Instant::now();
    let left = loop {
        let listed = server.call("GET", "/v1/orgs/acme/snapshots", Some(&alice), None).1;
        if let Some(s) = listed["snapshots"].as_array().unwrap().iter().find(|s| s["name"] == "left") {
            break s.clone();
        }
        assert!(
            started.elapsed().as_secs() < 30,
            "the snapshot of a client that left never landed: {listed}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(left["bytes"].as_u64().unwrap() >= 40_000_000, "{left}");
    assert_eq!(sh(&server, &alice, &restored, "echo thawed"), "thawed\n", "the sandbox runs on");
    let fork = ensure(&server, &alice, &session("leftfork"), left["id"].as_str());
    assert_eq!(sh(&server, &alice, &fork, "wc -c < /workspace/blob").trim(), "40000000");
    let got = server.call(
        "DELETE",
        &format!("/v1/orgs/acme/sessions/{}/sandbox", session("leftfork")),
        Some(&alice),
        None,
    );
    assert_eq!(got.0, 204, "{}", got.1);
    let gone = server.call(
        "DELETE",
        &format!("/v1/orgs/acme/snapshots/{}", left["id"].as_str().unwrap()),
        Some(&alice),
        None,
    );
    assert_eq!(gone.0, 204, "{}", gone.1);

    let (code, out, err) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "{out}{err}");

    for s in ["src", "fork1-", "fork2-", "fork3-", "svcfork"] {
        let key = if s == "svcfork" { &svc } else { &alice };
        let got =
            server.call("DELETE", &format!("/v1/orgs/acme/sessions/{}/sandbox", session(s)), Some(key), None);
        assert_eq!(got.0, 204, "{}", got.1);
    }
}
