//! Org policy end to end (issue 14): two orgs with different policies on one server, quota
//! hits with their posture and audit events, a write past the workspace quota, idle
//! suspension and resume, maximum lifetime, the warm pool, a change on one replica obeyed
//! by another; and the policy on streams, background processes and files (activity,
//! resume, command places, the workspace quota).

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, assert_error};

const PREFIX: &str = "Sandbox provisioning failed: ";

/// A server's env with fast policy passes; callers: a service and a user of `acme`, a
/// service of `beta`.
struct Setup {
    env: Env,
    acme: String,
    ada: String,
    beta: String,
}

fn setup(backend: Backend) -> Option<Setup> {
    let mut env = Env::new(backend)?;
    env.set("SANDLANE_BACKGROUND__POLICY_INTERVAL_MS", "200");
    env.set("SANDLANE_BACKGROUND__ACTIVITY_INTERVAL_MS", "100");
    let acme = env.add_caller("svc-acme", "service", &["acme"]);
    let ada = env.add_caller("user-ada", "user", &["acme"]);
    let beta = env.add_caller("svc-beta", "service", &["beta"]);
    Some(Setup { env, acme, ada, beta })
}

/// `sandlane org set ORG ARGS…`: the printed policy.
fn org_set(env: &Env, org: &str, args: &[&str]) -> Value {
    let mut all = vec!["org", "set", org];
    all.extend_from_slice(args);
    let (code, out, err) = env.cli(&all);
    assert_eq!(code, 0, "org set {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("org set prints JSON: {e}: {out}"))
}

/// Waits until `server` serves `org`'s policy at `version` (the cache is re-read within a
/// second), and returns how long that took.
fn wait_for_version(server: &Server, key: &str, org: &str, version: i64) -> Duration {
    let start = Instant::now();
    loop {
        let got = server.call("GET", &format!("/v1/orgs/{org}/policy"), Some(key), None);
        assert_eq!(got.0, 200, "{}", got.1);
        if got.1["version"] == version {
            return start.elapsed();
        }
        assert!(start.elapsed() < Duration::from_secs(5), "policy v{version} not served: {}", got.1);
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn session(server: &Server, key: &str, org: &str, session: &str) -> (u16, Value) {
    server.call(
        "PUT",
        &format!("/v1/orgs/{org}/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    )
}

fn workflow(server: &Server, key: &str, org: &str, execution: &str) -> (u16, Value) {
    server.call("PUT", &format!("/v1/orgs/{org}/workflow-executions/{execution}/sandbox"), Some(key), None)
}

fn ready_id(got: &(u16, Value)) -> String {
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn exec(server: &Server, key: &str, org: &str, sandbox: &str, script: &str) -> (u16, Value) {
    server.call(
        "POST",
        &format!("/v1/orgs/{org}/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 60_000})),
    )
}

fn exec_out(server: &Server, key: &str, org: &str, sandbox: &str, script: &str) -> String {
    let got = exec(server, key, org, sandbox, script);
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["exit_code"], 0, "{}", got.1);
    got.1["stdout"].as_str().unwrap().to_owned()
}

fn audit(server: &Server, key: &str, org: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let got =
            server.call("GET", &format!("/v1/orgs/{org}/audit?after={after}&limit=100"), Some(key), None);
        assert_eq!(got.0, 200, "{}", got.1);
        let page = got.1["events"].as_array().unwrap().clone();
        if page.is_empty() {
            return events;
        }
        after = got.1["next"].as_i64().unwrap();
        events.extend(page);
    }
}

/// The org's audit events once one matches `want` (an event appears on a page once no
/// earlier one can still commit: polled).
fn audit_until(server: &Server, key: &str, org: &str, want: impl Fn(&Value) -> bool) -> Vec<Value> {
    let start = Instant::now();
    loop {
        let events = audit(server, key, org);
        if events.iter().any(&want) {
            return events;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no such audit event: {events:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn state_of(server: &Server, key: &str, org: &str, sandbox: &str) -> String {
    let got = server.call("GET", &format!("/v1/orgs/{org}/sandboxes/{sandbox}"), Some(key), None);
    assert_eq!(got.0, 200, "{}", got.1);
    got.1["state"].as_str().unwrap().to_owned()
}

fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A series' value, as a service caller with `key` scrapes it (per-org series are its
/// orgs' alone).
fn metric(server: &Server, key: &str, line_start: &str) -> Option<f64> {
    let (_, text) = server.get_text_as("/metrics", Some(key));
    text.lines().find(|l| l.starts_with(line_start)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Two orgs, two policies, one server: the workflow lane off in `acme` only; the policy is
/// read by the org's service callers only; bad values are refused naming the field.
pub fn two_orgs_with_different_policies(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    let set = org_set(&s.env, "acme", &["--lane-workflow", "off", "--max-sandboxes", "5"]);
    assert_eq!((set["lane_workflow"].as_bool(), set["max_sandboxes"].as_u64()), (Some(false), Some(5)));
    assert_eq!(set["overridden"], json!(["lane_workflow", "max_sandboxes"]));
    wait_for_version(&server, &s.acme, "acme", 1);

    // acme: workflow off (nothing touched), session on; beta: both on.
    assert_eq!(workflow(&server, &s.acme, "acme", "w1"), (200, json!({"outcome": "disabled"})));
    ready_id(&session(&server, &s.acme, "acme", "s1"));
    ready_id(&workflow(&server, &s.beta, "beta", "w1"));
    ready_id(&session(&server, &s.beta, "beta", "s1"));
    // (The positive control: the session's event is there; the workflow's is not.)
    let events = audit_until(&server, &s.acme, "acme", |e| e["key"] == "s1" && e["outcome"] == "provisioned");
    assert!(events.iter().all(|e| e["key"] != "w1"), "lane off audits nothing: {events:?}");

    // The policy route: the org's service callers only.
    let got = server.call("GET", "/v1/orgs/acme/policy", Some(&s.acme), None);
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(
        (got.1["lane_session"].as_bool(), got.1["lane_workflow"].as_bool()),
        (Some(true), Some(false))
    );
    let beta = server.call("GET", "/v1/orgs/beta/policy", Some(&s.beta), None);
    assert_eq!((beta.1["lane_workflow"].as_bool(), beta.1["version"].as_i64()), (Some(true), Some(0)));
    assert_error(&server.call("GET", "/v1/orgs/acme/policy", Some(&s.ada), None), 403, "permission_denied");
    assert_error(&server.call("GET", "/v1/orgs/acme/policy", Some(&s.beta), None), 403, "permission_denied");
    assert_error(&server.call("GET", "/v1/orgs/acme/policy", None, None), 401, "unauthenticated");

    // A flag not given keeps its value; `show` prints the same.
    let set = org_set(&s.env, "acme", &["--idle-timeout", "15m"]);
    assert_eq!(
        (set["lane_workflow"].as_bool(), set["idle_timeout_ms"].as_u64()),
        (Some(false), Some(900_000))
    );
    let (code, shown, _) = s.env.cli(&["org", "show", "acme"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&shown).unwrap(), set);

    // Bad values: exit 2, the field named, nothing written.
    for (args, field) in [
        (vec!["--max-sandboxes", "0"], "max_sandboxes"),
        (vec!["--workspace-bytes", "64mb"], "workspace_bytes"),
        (vec!["--idle-timeout", "10"], "idle_timeout"),
        (vec!["--lane-session", "maybe"], "lane_session"),
        (vec!["--egress-allow", "*.com"], "egress_allow"),
        (vec!["--warm-pool", "5000"], "warm_pool"),
    ] {
        let mut all = vec!["org", "set", "acme"];
        all.extend(args.iter().copied());
        let (code, _, err) = s.env.cli(&all);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(&format!("{field}: ")), "{args:?} names the field: {err}");
    }
    let (_, shown, _) = s.env.cli(&["org", "show", "acme"]);
    assert_eq!(serde_json::from_str::<Value>(&shown).unwrap()["version"], 2, "nothing was written");
}

/// Quotas: the running-sandbox quota follows each posture and is audited; the command
/// quotas answer 429; refusals are counted per org.
pub fn quota_hits_follow_the_posture(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--max-sandboxes", "2"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let first = ready_id(&session(&server, &s.acme, "acme", "q1"));
    ready_id(&session(&server, &s.acme, "acme", "q2"));
    // Session: 200 failed with the prefix; workflow: 503 with the prefix.
    let over = session(&server, &s.acme, "acme", "q3");
    assert_eq!((over.0, over.1["outcome"].as_str()), (200, Some("failed")), "{}", over.1);
    let message = over.1["message"].as_str().unwrap();
    assert!(message.starts_with(PREFIX) && message.contains("max_sandboxes"), "{message}");
    let over = workflow(&server, &s.acme, "acme", "qw");
    assert_error(&over, 503, "unavailable");
    assert!(over.1["message"].as_str().unwrap().starts_with(PREFIX), "{}", over.1);
    // Another org is not affected; a key that has its sandbox is not a new one.
    ready_id(&session(&server, &s.beta, "beta", "q3"));
    assert_eq!(ready_id(&session(&server, &s.acme, "acme", "q1")), first);
    let refusals: Vec<Value> = audit_until(&server, &s.acme, "acme", |e| e["key"] == "qw")
        .into_iter()
        .filter(|e| e["outcome"] == "quota_exceeded")
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert_eq!(
        refusals.iter().map(|e| (e["action"].as_str(), e["key"].as_str())).collect::<Vec<_>>(),
        [(Some("ensure"), Some("q3")), (Some("ensure"), Some("qw"))]
    );
    assert!(refusals.iter().all(|e| e["message"].as_str().unwrap().starts_with(PREFIX)));
    // A deprovision frees a place.
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/sessions/q2/sandbox", Some(&s.acme), None).0, 204);
    ready_id(&session(&server, &s.acme, "acme", "q3"));

    // Commands: one at a time per sandbox, two in the org.
    org_set(&s.env, "acme", &["--max-commands-per-sandbox", "1", "--max-commands", "2"]);
    wait_for_version(&server, &s.acme, "acme", 2);
    let other = ready_id(&session(&server, &s.acme, "acme", "q3"));
    std::thread::scope(|scope| {
        let long = scope.spawn(|| exec(&server, &s.acme, "acme", &first, "sleep 2; echo done"));
        std::thread::sleep(Duration::from_millis(500));
        let busy = exec(&server, &s.acme, "acme", &first, "echo second");
        assert_error(&busy, 429, "resource_exhausted");
        assert!(busy.1["message"].as_str().unwrap().contains("max_commands_per_sandbox"), "{}", busy.1);
        // The org has one more place: another sandbox runs.
        let elsewhere = scope.spawn(|| exec(&server, &s.acme, "acme", &other, "sleep 1; echo there"));
        assert_eq!(long.join().unwrap().1["stdout"], "done\n");
        assert_eq!(elsewhere.join().unwrap().1["stdout"], "there\n");
    });
    // Free again.
    assert_eq!(exec_out(&server, &s.acme, "acme", &first, "echo free"), "free\n");
    let refused =
        metric(&server, &s.acme, "sandlane_org_quota_refusals_total{org=\"acme\",quota=\"max_sandboxes\"}");
    assert_eq!(refused, Some(2.0));
    assert_eq!(
        metric(
            &server,
            &s.acme,
            "sandlane_org_quota_refusals_total{org=\"acme\",quota=\"max_commands_per_sandbox\"}"
        ),
        Some(1.0)
    );
}

/// The org's command quota holds across sandboxes: with `--max-commands 1`, a command in
/// one sandbox makes a command in another wait its turn (429).
pub fn the_org_command_quota_spans_sandboxes(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--max-commands", "1"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let a = ready_id(&session(&server, &s.acme, "acme", "c1"));
    let b = ready_id(&session(&server, &s.acme, "acme", "c2"));
    std::thread::scope(|scope| {
        let long = scope.spawn(|| exec(&server, &s.acme, "acme", &a, "sleep 2; echo done"));
        std::thread::sleep(Duration::from_millis(500));
        let busy = exec(&server, &s.acme, "acme", &b, "echo other");
        assert_error(&busy, 429, "resource_exhausted");
        assert!(busy.1["message"].as_str().unwrap().contains("max_commands"), "{}", busy.1);
        assert_eq!(long.join().unwrap().1["stdout"], "done\n");
    });
    assert_eq!(exec_out(&server, &s.acme, "acme", &b, "echo other"), "other\n");
    // Another org is not counted in acme's.
    let c = ready_id(&session(&server, &s.beta, "beta", "c1"));
    assert_eq!(exec_out(&server, &s.beta, "beta", &c, "echo beta"), "beta\n");
}

/// `dd` past the workspace quota fails inside the sandbox with ENOSPC; the host's
/// filesystem gives at most the quota.
pub fn a_write_past_the_workspace_quota_fails_inside() {
    let Some(s) = setup(Backend::Sqlite) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--workspace-bytes", "8MiB"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let id = ready_id(&session(&server, &s.acme, "acme", "disk"));
    let host = s.env.data.path();
    let before = statvfs_available(host);
    let got =
        exec(&server, &s.acme, "acme", &id, "dd if=/dev/zero of=/workspace/fill bs=1M count=256; echo rc=$?");
    assert_eq!(got.0, 200, "{}", got.1);
    let said = format!("{}{}", got.1["stdout"], got.1["stderr"]);
    assert!(said.contains("No space left on device"), "{said}");
    assert!(!said.contains("rc=0"), "{said}");
    // On the host the workspace is its image: it holds at most the quota and the image's
    // metadata. (The host's free space moves with every other process on it too: only a
    // gross loss is checked there.)
    let image = s.env.data.path().join("data/images/ephemeral").join(format!("{id}.img"));
    // The loop device writes the image back lazily: flushed first, so its blocks are all
    // counted.
    assert!(std::process::Command::new("sync").status().unwrap().success());
    let taken = std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&image).unwrap()) * 512;
    assert!((7 << 20..=(8 << 20) + (4 << 20)).contains(&taken), "the image holds {taken} bytes for 8 MiB");
    let after = statvfs_available(host);
    // 256 MiB were asked for: without the quota the host would have lost them all.
    assert!(before.saturating_sub(after) < 128 << 20, "the host lost {} bytes", before.saturating_sub(after));
    // What fits stays usable, and df inside says the quota.
    let df = exec_out(
        &server,
        &s.acme,
        "acme",
        &id,
        "rm /workspace/fill; echo ok > /workspace/small; cat /workspace/small",
    );
    assert_eq!(df, "ok\n");
    let used = metric(&server, &s.acme, "sandlane_org_workspace_bytes{org=\"acme\"}").unwrap_or(0.0);
    assert!(used > 0.0, "the workspace bytes are counted per org");
}

fn statvfs_available(path: &std::path::Path) -> u64 {
    let out = std::process::Command::new("stat").args(["-f", "-c", "%a %S"]).arg(path).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut parts = text.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    parts.next().unwrap() * parts.next().unwrap()
}

/// A sandbox idle past a 2 s timeout is suspended (its processes end, audited); the next
/// exec resumes it under the same id with its durable workspace and a fresh token file;
/// the next ensure resumes it too.
pub fn an_idle_sandbox_is_suspended_and_resumed(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--idle-timeout", "2s"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    // A user's sandbox: a durable workspace.
    let id = ready_id(&session(&server, &s.ada, "acme", "idle"));
    let marker = marker();
    let token_before = exec_out(
        &server,
        &s.ada,
        "acme",
        &id,
        &format!(
            "echo kept > /workspace/note; sleep {marker} >/dev/null 2>&1 & cat \"$SANDLANE_TOKEN_FILE\""
        ),
    );
    wait_until("the background process", Duration::from_secs(5), || {
        processes_with(&format!("sleep {marker}")) == 1
    });
    // Activity keeps it ready: an exec every second for 3 s.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(1));
        exec_out(&server, &s.ada, "acme", &id, "true");
        assert_eq!(state_of(&server, &s.ada, "acme", &id), "ready", "active: not suspended");
    }
    wait_until("the suspension", Duration::from_secs(10), || {
        state_of(&server, &s.ada, "acme", &id) == "suspended"
    });
    wait_until("its processes to end", Duration::from_secs(5), || {
        processes_with(&format!("sleep {marker}")) == 0
    });
    let mut events = Vec::new();
    wait_until("the suspend event", Duration::from_secs(10), || {
        events = audit(&server, &s.acme, "acme");
        events.iter().any(|e| e["action"] == "suspend")
    });
    let suspended = events.iter().find(|e| e["action"] == "suspend").expect("a suspend event");
    assert_eq!(
        (suspended["outcome"].as_str(), suspended["caller_class"].as_str()),
        (Some("suspended"), Some("internal"))
    );
    assert!(suspended["message"].as_str().unwrap().contains("2s"), "{suspended}");
    assert!(metric(&server, &s.acme, "sandlane_org_sandboxes{org=\"acme\",state=\"suspended\"}").is_some());

    // The next exec resumes it: same id, the workspace intact, a fresh token.
    let back = exec_out(&server, &s.ada, "acme", &id, "cat /workspace/note; cat \"$SANDLANE_TOKEN_FILE\"");
    let (note, token_after) = back.split_once('\n').unwrap();
    assert_eq!(note, "kept");
    assert!(!token_after.is_empty() && token_after != token_before, "a fresh token file");
    assert_eq!(state_of(&server, &s.ada, "acme", &id), "ready");
    assert_eq!(processes_with(&format!("sleep {marker}")), 0, "the old processes stay gone");
    let resumed = audit_until(&server, &s.acme, "acme", |e| e["action"] == "resume");
    assert!(
        resumed
            .iter()
            .any(|e| e["action"] == "resume" && e["outcome"] == "resumed" && e["sandbox_id"] == id.as_str())
    );
    // The token verifies.
    let got = server.post_form("/v1/introspect", Some(&s.acme), &[("token", token_after)]);
    assert_eq!(got.1["active"], true, "{}", got.1);

    // Suspended again, the next ensure resumes it, for the caller who asked.
    wait_until("the second suspension", Duration::from_secs(10), || {
        state_of(&server, &s.ada, "acme", &id) == "suspended"
    });
    assert_eq!(ready_id(&session(&server, &s.ada, "acme", "idle")), id, "the same id");
    let ensured =
        audit_until(&server, &s.acme, "acme", |e| e["outcome"] == "resumed" && e["action"] == "ensure");
    assert!(
        ensured
            .iter()
            .any(|e| e["action"] == "ensure" && e["outcome"] == "resumed" && e["caller_id"] == "user-ada")
    );
    assert_eq!(exec_out(&server, &s.ada, "acme", &id, "cat /workspace/note"), "kept\n");
}

fn processes_with(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit())))
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| String::from_utf8_lossy(c).replace('\0', " ").contains(marker))
        .count()
}

/// A sandbox older than the org's maximum lifetime is deprovisioned, audited with the
/// reason; its tokens stop verifying.
pub fn a_sandbox_past_its_lifetime_is_deprovisioned(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--max-lifetime", "2s"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let id = ready_id(&session(&server, &s.acme, "acme", "old"));
    let token = exec_out(&server, &s.acme, "acme", &id, "cat \"$SANDLANE_TOKEN_FILE\"");
    wait_until("the expiry", Duration::from_secs(10), || {
        state_of(&server, &s.acme, "acme", &id) == "deprovisioned"
    });
    // The record leaves the live state first (its tokens stop verifying), then the driver
    // removes the sandbox, then the event is written.
    let mut events = Vec::new();
    wait_until("the expired event", Duration::from_secs(10), || {
        events = audit(&server, &s.acme, "acme");
        events.iter().any(|e| e["outcome"] == "expired")
    });
    let expired = events.iter().find(|e| e["outcome"] == "expired").expect("an expired event");
    assert_eq!(expired["action"], "deprovision");
    assert!(expired["message"].as_str().unwrap().contains("maximum lifetime of 2s"), "{expired}");
    let got = server.post_form("/v1/introspect", Some(&s.acme), &[("token", &token)]);
    assert_eq!(got.1, json!({"active": false}));
    // The key's next ensure gets a new sandbox.
    assert_ne!(ready_id(&session(&server, &s.acme, "acme", "old")), id);
}

/// The warm pool: kept at its size, adopted by an ensure with an ephemeral workspace (its
/// environment and token bound then), never by another org, never visible to callers,
/// counted in metrics, refilled.
pub fn warm_sandboxes_are_adopted_and_refilled(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--warm-pool", "2", "--workspace-bytes", "16MiB"]);
    // acme has a stored policy, so the pool pass knows it.
    let pooled = "sandlane_org_sandboxes{org=\"acme\",state=\"pooled\"}";
    wait_until("two warm sandboxes", Duration::from_secs(20), || {
        metric(&server, &s.acme, pooled) == Some(2.0)
    });
    // beta (no pool) does not take acme's.
    ready_id(&session(&server, &s.beta, "beta", "w"));
    assert_eq!(metric(&server, &s.acme, pooled), Some(2.0));
    // A service ensure (ephemeral) adopts one.
    let got = session(&server, &s.acme, "acme", "adopter");
    let id = ready_id(&got);
    let events = audit_until(&server, &s.acme, "acme", |e| e["sandbox_id"] == id.as_str());
    let adopted = events.iter().find(|e| e["sandbox_id"] == id.as_str()).unwrap();
    assert_eq!(
        (adopted["outcome"].as_str(), adopted["caller_id"].as_str()),
        (Some("adopted"), Some("svc-acme"))
    );
    let env =
        exec_out(&server, &s.acme, "acme", &id, "env | sort; test -s \"$SANDLANE_TOKEN_FILE\" && echo token");
    assert!(env.contains(&format!("SANDLANE_SANDBOX_ID={id}\n")), "{env}");
    assert!(
        env.contains("SANDLANE_SESSION_ID=adopter\n") && env.contains("SANDLANE_CALLER_CLASS=service\n"),
        "{env}"
    );
    assert!(env.contains("SANDLANE_EXECUTION_ID=exec-adopter\n") && env.ends_with("token\n"), "{env}");
    let df = exec(&server, &s.acme, "acme", &id, "dd if=/dev/zero of=/workspace/f bs=1M count=32 2>&1");
    assert!(df.1["stdout"].as_str().unwrap().contains("No space left"), "the pool's quota: {}", df.1);
    // A user's ensure (durable) does not take from the pool.
    let durable = ready_id(&session(&server, &s.ada, "acme", "mine"));
    audit_until(&server, &s.acme, "acme", |e| {
        e["sandbox_id"] == durable.as_str() && e["outcome"] == "provisioned"
    });
    // The pool refills.
    wait_until("the refill", Duration::from_secs(20), || metric(&server, &s.acme, pooled) == Some(2.0));
    // A pool shrunk to 0 is emptied.
    org_set(&s.env, "acme", &["--warm-pool", "0"]);
    wait_until("the pool to empty", Duration::from_secs(20), || metric(&server, &s.acme, pooled).is_none());
}

/// Two replicas on one database: a change made with replica A's settings is obeyed by
/// replica B within a second, without a restart.
pub fn a_change_on_one_replica_is_obeyed_by_another() {
    let Some(s) = setup(Backend::Postgres) else { return };
    let a = Server::start(&s.env);
    let b = Server::start(&s.env);
    ready_id(&session(&b, &s.acme, "acme", "r1"));
    // Replica A reads the policy first (so both have it cached), then it changes.
    wait_for_version(&a, &s.acme, "acme", 0);
    wait_for_version(&b, &s.acme, "acme", 0);
    org_set(&s.env, "acme", &["--lane-session", "off"]);
    let start = Instant::now();
    // A's and B's ensures obey within a second (and a poll).
    for replica in [&a, &b] {
        loop {
            let got = session(replica, &s.acme, "acme", "r2");
            if got.1 == json!({"outcome": "disabled"}) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_millis(1_500),
                "not obeyed after {:?}: {}",
                start.elapsed(),
                got.1
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }
    // A quota set now is obeyed by B too.
    org_set(&s.env, "acme", &["--lane-session", "on", "--max-sandboxes", "1"]);
    wait_for_version(&b, &s.acme, "acme", 2);
    let over = session(&b, &s.acme, "acme", "r3");
    assert_eq!(over.1["outcome"], "failed", "{}", over.1);
    assert!(over.1["message"].as_str().unwrap().contains("max_sandboxes"), "{}", over.1);
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().new_agent()
}

/// A PUT of raw bytes (a file or a tar archive), the body sent beside reading the answer
/// (a server that refuses part-way answers before it has read it all): the status and
/// the JSON answer.
fn put_bytes(server: &Server, key: &str, route: &str, bytes: &[u8]) -> (u16, Value) {
    use std::io::{BufRead, Read, Write};
    let address = server.base.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    let head = format!(
        "PUT {route} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {key}\r\n\
         content-type: application/octet-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        bytes.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let body = bytes.to_vec();
    let feeder = std::thread::spawn(move || {
        for chunk in body.chunks(256 << 10) {
            if writer.write_all(chunk).is_err() {
                return;
            }
        }
    });
    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut reader = std::io::BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).unwrap();
    let code: u16 = status.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line.trim().is_empty() {
            break;
        }
        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = v.trim().parse().unwrap();
        }
    }
    let mut answer = vec![0u8; length];
    reader.read_exact(&mut answer).unwrap();
    drop(reader);
    feeder.join().unwrap();
    (code, serde_json::from_slice(&answer).unwrap_or(Value::Null))
}

/// A GET of raw bytes: the status and the body.
fn get_bytes(server: &Server, key: &str, route: &str) -> (u16, Vec<u8>) {
    let mut r = agent()
        .get(&format!("{}{route}", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .call()
        .expect("GET");
    let status = r.status().as_u16();
    (status, r.body_mut().with_config().limit(u64::MAX).read_to_vec().expect("the body"))
}

/// A streamed exec (NDJSON): the status, and the lines once the stream ended (or the JSON
/// error).
fn exec_streamed(server: &Server, key: &str, org: &str, sandbox: &str, script: &str) -> (u16, Vec<Value>) {
    let mut r = agent()
        .post(&format!("{}/v1/orgs/{org}/sandboxes/{sandbox}/exec", server.base))
        .header("authorization", &format!("Bearer {key}"))
        .header("accept", "application/x-ndjson")
        .send_json(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 60_000}))
        .expect("exec");
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap_or_default();
    (status, text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect())
}

/// Starts a background process running `script`: its pid.
fn start_process(server: &Server, key: &str, org: &str, sandbox: &str, script: &str) -> (u16, Value) {
    server.call(
        "POST",
        &format!("/v1/orgs/{org}/sandboxes/{sandbox}/processes"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script]})),
    )
}

fn marker() -> String {
    let mut bytes = [0u8; 4];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut bytes).unwrap();
    format!("{}", 600_000 + u32::from_le_bytes(bytes) % 100_000)
}

/// A tar archive of one file `name` of `size` zero bytes, made by the host's `tar`.
fn tar_of(name: &str, size: usize) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(name), vec![0u8; size]).unwrap();
    let out = std::process::Command::new("tar")
        .arg("-C")
        .arg(dir.path())
        .args(["-cf", "-", name])
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {}", String::from_utf8_lossy(&out.stderr));
    out.stdout
}

/// Streams, background processes and files under the idle timeout: each counts as
/// activity (the sandbox stays ready while they go on), a background process that merely
/// runs does not keep it awake, suspension ends it, and each route resumes a suspended
/// sandbox transparently (same id, the durable workspace intact).
pub fn streams_processes_and_files_resume_and_count_as_activity(backend: Backend) {
    let Some(s) = setup(backend) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--idle-timeout", "2s"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let id = ready_id(&session(&server, &s.ada, "acme", "ops-idle"));
    let files = format!("/v1/orgs/acme/sandboxes/{id}/files");
    let mark = marker();
    let started = start_process(&server, &s.ada, "acme", &id, &format!("exec sleep {mark}"));
    assert_eq!(started.0, 201, "{}", started.1);
    wait_until("the background process", Duration::from_secs(5), || {
        processes_with(&format!("sleep {mark}")) == 1
    });
    // Activity through the new routes only, every ~0.7 s for 4 s (twice the timeout):
    // file writes and reads, a streamed exec, a process listing.
    let begun = Instant::now();
    let mut round = 0;
    while begun.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(700));
        round += 1;
        match round % 4 {
            0 => assert_eq!(
                put_bytes(&server, &s.ada, &format!("{files}?path=/workspace/note"), b"kept").0,
                200
            ),
            1 => assert_eq!(get_bytes(&server, &s.ada, &format!("{files}?path=/workspace")).0, 200),
            2 => assert_eq!(exec_streamed(&server, &s.ada, "acme", &id, "true").0, 200),
            _ => {
                let listed = server.call(
                    "GET",
                    &format!("/v1/orgs/acme/sandboxes/{id}/processes"),
                    Some(&s.ada),
                    None,
                );
                assert_eq!(listed.0, 200, "{}", listed.1);
            }
        }
        assert_eq!(state_of(&server, &s.ada, "acme", &id), "ready", "active through round {round}");
    }
    assert_eq!(put_bytes(&server, &s.ada, &format!("{files}?path=/workspace/note"), b"kept").0, 200);
    // Left alone (the background process still running), it is suspended, which ends the
    // process.
    wait_until("the suspension", Duration::from_secs(10), || {
        state_of(&server, &s.ada, "acme", &id) == "suspended"
    });
    wait_until("the background process to end with the suspension", Duration::from_secs(5), || {
        processes_with(&format!("sleep {mark}")) == 0
    });

    // A file read resumes it.
    assert_eq!(get_bytes(&server, &s.ada, &format!("{files}?path=/workspace/note")), (200, b"kept".to_vec()));
    assert_eq!(state_of(&server, &s.ada, "acme", &id), "ready");
    let listed = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}/processes"), Some(&s.ada), None);
    assert_eq!(listed.0, 200, "{}", listed.1);
    assert!(
        listed.1["processes"].as_array().unwrap().iter().all(|p| p["running"] == false),
        "no process outlived the suspension: {}",
        listed.1
    );
    // A streamed exec resumes it.
    wait_until("the second suspension", Duration::from_secs(10), || {
        state_of(&server, &s.ada, "acme", &id) == "suspended"
    });
    let (status, lines) = exec_streamed(&server, &s.ada, "acme", &id, "cat /workspace/note");
    assert_eq!(status, 200, "{lines:?}");
    assert_eq!(lines[0], json!({"type": "stdout", "text": "kept"}), "{lines:?}");
    assert_eq!(lines.last().unwrap()["exit_code"], 0, "{lines:?}");
    // Starting a background process resumes it.
    wait_until("the third suspension", Duration::from_secs(10), || {
        state_of(&server, &s.ada, "acme", &id) == "suspended"
    });
    let started = start_process(&server, &s.ada, "acme", &id, "cat /workspace/note");
    assert_eq!(started.0, 201, "{}", started.1);
    assert_eq!(state_of(&server, &s.ada, "acme", &id), "ready");
    let resumes = audit_until(&server, &s.acme, "acme", |e| e["action"] == "resume");
    assert!(
        resumes.iter().filter(|e| e["action"] == "resume" && e["sandbox_id"] == id.as_str()).count() >= 1
    );
}

/// The command quotas hold for a streamed exec (its place held until the stream ends) and
/// for background processes (until the process ends, by exit or by signal); file
/// operations run no program and are not counted.
pub fn streams_and_processes_take_command_places() {
    let Some(s) = setup(Backend::Sqlite) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--max-commands", "1"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let id = ready_id(&session(&server, &s.acme, "acme", "ops-quota"));
    let other = ready_id(&session(&server, &s.acme, "acme", "ops-quota-2"));
    let files = format!("/v1/orgs/acme/sandboxes/{id}/files");
    let busy = |got: &(u16, Value)| {
        assert_error(got, 429, "resource_exhausted");
        assert!(got.1["message"].as_str().unwrap().contains("max_commands"), "{}", got.1);
    };

    // A background process holds the org's one place while it runs.
    let mark = marker();
    let started = start_process(&server, &s.acme, "acme", &id, &format!("exec sleep {mark}"));
    assert_eq!(started.0, 201, "{}", started.1);
    let pid = started.1["pid"].as_u64().unwrap();
    busy(&exec(&server, &s.acme, "acme", &other, "echo no"));
    busy(&start_process(&server, &s.acme, "acme", &id, "echo no"));
    let (status, lines) = exec_streamed(&server, &s.acme, "acme", &other, "echo no");
    assert_eq!(status, 429, "{lines:?}");
    // Files are not commands.
    assert_eq!(put_bytes(&server, &s.acme, &format!("{files}?path=/workspace/f"), b"x").0, 200);
    // Ended by a signal, it gives its place back.
    let signalled = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{id}/processes/{pid}/signal"),
        Some(&s.acme),
        Some(json!({"signal": "KILL"})),
    );
    assert_eq!(signalled.0, 204, "{}", signalled.1);
    wait_until("the place to come back", Duration::from_secs(5), || {
        exec(&server, &s.acme, "acme", &other, "echo yes").0 == 200
    });
    // One that ends by itself gives it back too.
    let started = start_process(&server, &s.acme, "acme", &id, "sleep 1");
    assert_eq!(started.0, 201, "{}", started.1);
    busy(&exec(&server, &s.acme, "acme", &other, "echo no"));
    wait_until("the place to come back after the exit", Duration::from_secs(5), || {
        exec(&server, &s.acme, "acme", &other, "echo yes").0 == 200
    });

    // A streamed exec holds the place until its stream ends.
    std::thread::scope(|scope| {
        let long = scope.spawn(|| exec_streamed(&server, &s.acme, "acme", &id, "sleep 2; echo done"));
        std::thread::sleep(Duration::from_millis(700));
        busy(&exec(&server, &s.acme, "acme", &other, "echo no"));
        let (status, lines) = long.join().unwrap();
        assert_eq!(status, 200);
        assert_eq!(lines[0], json!({"type": "stdout", "text": "done\n"}), "{lines:?}");
    });
    assert_eq!(exec_out(&server, &s.acme, "acme", &other, "echo yes"), "yes\n");
    let refusals =
        metric(&server, &s.acme, "sandlane_org_quota_refusals_total{org=\"acme\",quota=\"max_commands\"}");
    assert!(refusals.is_some_and(|n| n >= 4.0), "refusals counted: {refusals:?}");
}

/// The workspace quota holds for file writes and tar uploads: past it, 429
/// `resource_exhausted` saying the disk is full, nothing of the file kept; what fits is
/// written.
pub fn file_writes_and_archives_obey_the_workspace_quota() {
    let Some(s) = setup(Backend::Sqlite) else { return };
    let server = Server::start(&s.env);
    org_set(&s.env, "acme", &["--workspace-bytes", "8MiB"]);
    wait_for_version(&server, &s.acme, "acme", 1);
    let id = ready_id(&session(&server, &s.acme, "acme", "ops-disk"));
    let files = format!("/v1/orgs/acme/sandboxes/{id}/files");
    let archive = format!("/v1/orgs/acme/sandboxes/{id}/archive");
    let full = |got: &(u16, Value)| {
        assert_error(got, 429, "resource_exhausted");
        assert!(got.1["message"].as_str().unwrap().contains("disk is full"), "{}", got.1);
    };
    // Positive control: what fits is written.
    let fits = put_bytes(&server, &s.acme, &format!("{files}?path=/workspace/fits"), &vec![1u8; 4 << 20]);
    assert_eq!(fits.0, 200, "{}", fits.1);
    assert_eq!(fits.1["size"], 4 << 20);
    full(&put_bytes(&server, &s.acme, &format!("{files}?path=/workspace/big"), &vec![2u8; 12 << 20]));
    full(&put_bytes(
        &server,
        &s.acme,
        &format!("{archive}?path=/workspace/unpacked"),
        &tar_of("big", 12 << 20),
    ));
    let listed = exec_out(
        &server,
        &s.acme,
        "acme",
        &id,
        "ls -A /workspace /workspace/unpacked 2>&1 | sort; df -k /workspace | tail -1",
    );
    assert!(!listed.contains("big"), "nothing of a file that did not fit: {listed}");
    assert!(listed.contains("fits"), "{listed}");
    // An archive that fits is unpacked.
    let small =
        put_bytes(&server, &s.acme, &format!("{archive}?path=/workspace/small"), &tar_of("f", 1 << 20));
    assert_eq!(small.0, 200, "{}", small.1);
    assert_eq!(get_bytes(&server, &s.acme, &format!("{files}?path=/workspace/small/f")).1.len(), 1 << 20);
}
