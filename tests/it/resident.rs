//! Resident sandboxes across a server crash: `kill -9` of the server leaves every sandbox
//! running; the restarted server re-attaches to them (same ids, same processes) and its
//! reconciler removes the one whose record was retired while it was down.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};

/// How many host processes have `marker` in their command line.
fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).replace('\0', " ").contains(marker))
        .count()
}

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ensure(server: &Server, key: &str, session: &str) -> String {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn exec(server: &Server, key: &str, sandbox: &str, script: &str) -> Value {
    let got = server.exec_sh(key, sandbox, script);
    assert_eq!(got.0, 200, "{}", got.1);
    got.1
}

pub fn a_killed_server_restarts_and_reattaches() {
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let key = env.add_caller("svc-crash", "service", &["acme"]);
    let mut server = Server::start_binary(&env);
    let nonce = std::process::id();
    let kept_marker = format!("4242.{nonce}");
    let orphan_marker = format!("4343.{nonce}");
    let kept = ensure(&server, &key, "kept");
    let orphan = ensure(&server, &key, "orphan");
    let out = exec(&server, &key, &kept, &format!("sleep {kept_marker} >/dev/null 2>&1 & echo started"));
    assert_eq!(out["stdout"], "started\n", "{out}");
    exec(&server, &key, &orphan, &format!("sleep {orphan_marker} >/dev/null 2>&1 &"));
    wait_until("the background processes", Duration::from_secs(5), || {
        processes_with(&format!("sleep {kept_marker}")) == 1
            && processes_with(&format!("sleep {orphan_marker}")) == 1
    });

    // Each sandbox is one bubblewrap process naming the sandbox root; so is each of the
    // two new ephemeral sandboxes the driver starts ahead.
    let root = adapters::bwrap::default_sandbox_root(&env.data.path().join("data")).display().to_string();
    let root = format!("{root}/");
    wait_until("two sandboxes and two started ahead", Duration::from_secs(20), || processes_with(&root) == 4);

    server.kill9();
    // The sandboxes outlive the server.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(processes_with(&format!("sleep {kept_marker}")), 1, "a sandbox died with the server");
    assert_eq!(processes_with(&format!("sleep {orphan_marker}")), 1, "a sandbox died with the server");

    // While the server is down, the orphan's record is retired (as a deprovision that
    // reached the database but not the driver would leave it).
    let db = env.data.path().join("data/sandlane.db");
    let status = std::process::Command::new("sqlite3")
        .arg(&db)
        .arg(format!("UPDATE sandboxes SET state = 'deprovisioned' WHERE id = '{orphan}'"))
        .status()
        .expect("run sqlite3");
    assert!(status.success());
    let orphan_state = env.data.path().join("data/sandboxes").join(&orphan);
    assert!(orphan_state.is_dir(), "positive control: the orphan's driver state is there");

    let mut server = Server::start_binary(&env);
    // Re-attached: the same sandbox, the same live process tree, a command runs in it.
    let out = exec(
        &server,
        &key,
        &kept,
        &format!(
            "ps -o args 2>/dev/null | grep -c '^sleep {kept_marker}' || pgrep -fc 'sleep {kept_marker}'"
        ),
    );
    assert_eq!(
        out["stdout"].as_str().map(str::trim),
        Some("1"),
        "the sandbox's processes are the same: {out}"
    );
    assert_eq!(ensure(&server, &key, "kept"), kept, "the ready sandbox is reused, not provisioned again");
    // The reconciler's first pass at start removes the sandbox no live record owns.
    wait_until("the reconciler to remove the orphan", Duration::from_secs(20), || {
        !Path::new(&orphan_state).exists() && processes_with(&format!("sleep {orphan_marker}")) == 0
    });
    assert_eq!(processes_with(&format!("sleep {kept_marker}")), 1, "the kept sandbox was left alone");
    // The killed server's starts ahead were ended by the restarted one.
    assert_eq!(processes_with(&root), 1, "only the kept sandbox runs");
    // A new ephemeral sandbox: the driver starts two ahead again; a clean stop ends them
    // and leaves the sandboxes.
    ensure(&server, &key, "fresh");
    wait_until("two sandboxes and two started ahead", Duration::from_secs(20), || processes_with(&root) == 4);

    let got = server.call("DELETE", "/v1/orgs/acme/sessions/kept/sandbox", Some(&key), None);
    assert_eq!(got.0, 204, "{}", got.1);
    wait_until("the kept sandbox to end", Duration::from_secs(5), || {
        processes_with(&format!("sleep {kept_marker}")) == 0
    });
    assert!(server.stop(), "the restarted server stops cleanly");
    assert_eq!(processes_with(&root), 1, "the sandbox stays; what was started ahead went with the server");
}
