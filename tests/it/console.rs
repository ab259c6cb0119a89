//! The console (`/console`, docs/console.md) and the routes made for it: the org's
//! sandboxes a page at a time, and the audit log's verdict, through the API of a real
//! server; then the console itself in headless Chromium (`tests/browser/console.mjs`),
//! driven as a person does, with a screenshot of each step.

use serde_json::Value;

use crate::support::{Backend, Env, Server, assert_error};

fn ensure(server: &Server, key: &str, session: &str) -> String {
    let (status, body) = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(serde_json::json!({"execution_id": "e1"})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["outcome"], "ready", "{body}");
    body["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn ids(page: &Value) -> Vec<String> {
    page["sandboxes"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap().to_owned()).collect()
}

/// Pages of two over five sandboxes: every one once, oldest first, each with its owner;
/// ended records only when asked; service callers of the org only. The verdict says
/// `intact`, and `tampered` once a row of the log is changed (as `sandlane audit verify`).
pub fn sandboxes_are_listed_a_page_at_a_time_and_the_verdict_follows_the_log(backend: Backend) {
    let Some(env) = Env::new(backend) else { return };
    let svc = env.add_caller("svc-console", "service", &["acme"]);
    let user = env.add_caller("user-ada", "user", &["acme"]);
    let other = env.add_caller("svc-globex", "service", &["globex"]);
    let server = Server::start(&env);

    let mut made = Vec::new();
    for i in 0..5 {
        let key = if i % 2 == 0 { &svc } else { &user };
        made.push(ensure(&server, key, &format!("s{i}")));
    }
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &after {
            Some(a) => format!("/v1/orgs/acme/sandboxes?limit=2&after={a}"),
            None => "/v1/orgs/acme/sandboxes?limit=2".to_owned(),
        };
        let (status, page) = server.call("GET", &path, Some(&svc), None);
        assert_eq!(status, 200, "{page}");
        pages += 1;
        for s in page["sandboxes"].as_array().unwrap() {
            let i = made.iter().position(|m| m == s["id"].as_str().unwrap()).expect("a sandbox made here");
            assert_eq!(s["key"], format!("s{i}"), "{s}");
            assert_eq!(s["state"], "ready", "{s}");
            let (owner, class, durability) = if i % 2 == 0 {
                ("svc-console", "service", "ephemeral")
            } else {
                ("user-ada", "user", "durable")
            };
            assert_eq!((s["owner"].as_str(), s["owner_class"].as_str()), (Some(owner), Some(class)), "{s}");
            assert_eq!(s["durability"], durability, "{s}");
            assert!(s["created_at"].as_str().is_some() && s["last_active_at"].as_str().is_some(), "{s}");
        }
        seen.extend(ids(&page));
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => break,
        }
        assert!(pages < 10, "the pages never end");
    }
    assert_eq!(seen, made, "every sandbox once, in the order they were made");
    assert_eq!(pages, 3, "two full pages and a last one");

    // Ended records only when asked.
    let (status, _) = server.call("DELETE", "/v1/orgs/acme/sessions/s0/sandbox", Some(&svc), None);
    assert_eq!(status, 204);
    let (_, live) = server.call("GET", "/v1/orgs/acme/sandboxes", Some(&svc), None);
    assert_eq!(ids(&live), made[1..].to_vec());
    assert!(live["next"].is_null(), "{live}");
    let (_, all) = server.call("GET", "/v1/orgs/acme/sandboxes?ended=true", Some(&svc), None);
    assert_eq!(ids(&all), made);
    assert_eq!(all["sandboxes"][0]["state"], "deprovisioned", "{all}");

    // Service callers of the org only; nothing of another org.
    assert_error(&server.call("GET", "/v1/orgs/acme/sandboxes", Some(&user), None), 403, "permission_denied");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/sandboxes", Some(&other), None),
        403,
        "permission_denied",
    );
    let (status, globex) = server.call("GET", "/v1/orgs/globex/sandboxes", Some(&other), None);
    assert_eq!((status, ids(&globex)), (200, vec![]), "{globex}");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/sandboxes?limit=0", Some(&svc), None),
        400,
        "invalid_argument",
    );

    // The verdict.
    let (status, verdict) = server.call("GET", "/v1/orgs/acme/audit/verify", Some(&svc), None);
    assert_eq!(status, 200, "{verdict}");
    assert_eq!(verdict["verdict"], "intact", "{verdict}");
    assert!(verdict["checked_at"].as_str().is_some(), "{verdict}");
    assert!(verdict.get("rows").is_none(), "nothing of the log but its verdict: {verdict}");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/audit/verify", Some(&user), None),
        403,
        "permission_denied",
    );
    assert_error(
        &server.call("GET", "/v1/orgs/acme/audit/verify", Some(&other), None),
        403,
        "permission_denied",
    );
    let (code, out, err) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "the CLI agrees: {out}{err}");

    if backend == Backend::Sqlite {
        // A row changed behind the server's back (by someone who holds the database file,
        // so its append-only trigger is no obstacle): the route says so, as the CLI does.
        drop(server);
        let db = env.data.path().join("data/sandlane.db");
        let status = std::process::Command::new("sqlite3")
            .arg(&db)
            .arg(
                "DROP TRIGGER audit_events_no_update; UPDATE audit_events SET message = 'nothing happened' \
                 WHERE seq = (SELECT MIN(seq) FROM audit_events)",
            )
            .status()
            .expect("run sqlite3");
        assert!(status.success());
        let server = Server::start(&env);
        let (status, verdict) = server.call("GET", "/v1/orgs/acme/audit/verify", Some(&svc), None);
        assert_eq!(status, 200, "{verdict}");
        assert_eq!(verdict["verdict"], "tampered", "{verdict}");
        assert!(verdict["message"].as_str().unwrap().contains("sandlane audit verify"), "{verdict}");
        let (code, out, _) = env.cli(&["audit", "verify"]);
        assert_eq!(code, 1, "the CLI agrees: {out}");
    }
}

/// The console in headless Chromium at 1280×720: a wrong key is refused clearly and kept
/// nowhere; the right one is kept in the tab's sessionStorage only (no localStorage, no
/// cookie); the sandbox made through the API is listed with its state, owner, durability
/// and age; its processes, files, terminal (where the server has terminals: `echo
/// $((6*7))` answers 42; else a clear message), preview links (the same) and snapshots;
/// the audit tail with the verdict `intact`; the policy; no horizontal scrollbar on any
/// of them; Tab order, Enter and focus rings. Screenshots of each step are taken into a
/// temp dir, kept (its path printed) only when the test fails.
pub fn the_console_in_a_browser() {
    let Some((chromium, playwright)) = tests::services::browser() else { return };
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let svc = env.add_caller("svc-console", "service", &["acme"]);
    let server = Server::start(&env);
    let sandbox = ensure(&server, &svc, "console-1");
    let (status, body) = server.exec_sh(&svc, &sandbox, "printf 'hello from the API' > /workspace/hello.txt");
    assert_eq!((status, body["exit_code"].as_i64()), (200, Some(0)), "{body}");

    let shots = Shots(Some(tempfile::Builder::new().prefix("sandlane-console-shots-").tempdir().unwrap()));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/browser/console.mjs");
    let out = std::process::Command::new("node")
        .arg(script)
        .env("SANDLANE_TEST_CHROMIUM", &chromium)
        .env("SANDLANE_TEST_PLAYWRIGHT", &playwright)
        .env("CONSOLE_URL", &server.base)
        .env("CONSOLE_ORG", "acme")
        .env("CONSOLE_KEY", &svc)
        .env("CONSOLE_SANDBOX", &sandbox)
        .env("CONSOLE_SHOTS", shots.path())
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "console.mjs failed: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(stdout.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("console.mjs's report: {e}: {stdout}"));
    let steps = &report["steps"];

    assert_eq!(report["problems"], serde_json::json!([]), "the page logged errors: {report}");
    let page = &steps["page"];
    assert_eq!(page["status"], 200);
    let csp = page["csp"].as_str().unwrap();
    assert!(csp.contains("default-src 'self'") && csp.contains("script-src 'self';"), "{csp}");
    assert!(csp.contains("connect-src 'self';"), "{csp}");
    assert_eq!(page["frame"], "DENY");

    let wrong = &steps["wrong_key"];
    assert!(wrong["error"].as_str().unwrap().contains("The key was not accepted (401"), "{wrong}");
    assert_eq!(wrong["stored"], serde_json::json!({"session": null, "local": [], "cookie": ""}), "{wrong}");

    let signed = &steps["signed_in"];
    let row = signed["row"].as_str().unwrap();
    let cells: Vec<&str> = row.split('\t').collect();
    assert_eq!(
        cells[..5],
        [sandbox.as_str(), "session console-1", "ready", "svc-console (service)", "ephemeral"],
        "the list shows the sandbox, its key, state, owner and durability: {row:?}"
    );
    assert!(cells[5].ends_with(" s") || cells[5].ends_with(" min"), "and its age: {row:?}");
    assert_eq!(signed["session_has_key"], true, "{signed}");
    assert_eq!(signed["local_has_key"], false, "{signed}");
    assert_eq!(
        (&signed["document_cookie"], &signed["cookies"]),
        (&Value::from(""), &Value::from(0)),
        "{signed}"
    );

    assert!(steps["processes"]["row"].as_str().unwrap().contains("running"), "{steps}");
    assert_eq!(steps["files"]["content"], "hello from the API", "{steps}");
    assert!(steps["files"]["entries"].as_str().unwrap().contains("hello.txt"), "{steps}");
    let terminal = &steps["terminal"];
    if terminal["route"] == true {
        assert!(terminal["screen"].as_str().unwrap().lines().any(|l| l.trim() == "42"), "{terminal}");
        assert_eq!(terminal["running_after_close"], 0, "Close ends the terminal's shell: {terminal}");
    } else {
        assert!(terminal["note"].as_str().unwrap().contains("no terminals"), "{terminal}");
    }
    let preview = &steps["preview"];
    if preview["route"] == true {
        assert!(preview["url"].as_str().is_some_and(|u| u.starts_with("http")), "{preview}");
    } else {
        assert!(preview["note"].as_str().unwrap().contains("no preview links"), "{preview}");
    }
    assert!(steps["snapshots"]["row"].as_str().unwrap().contains("from-the-console"), "{steps}");
    assert_eq!(steps["audit"]["verdict"], "intact", "{steps}");
    assert!(steps["audit"]["verdict_text"].as_str().unwrap().contains("intact"), "{steps}");
    assert!(
        steps["audit"]["newest"].as_str().unwrap().contains("snapshot"),
        "the newest event first: {steps}"
    );
    assert!(steps["policy"]["table"].as_str().unwrap().contains("Session sandboxes\ton"), "{steps}");
    assert_eq!(steps["other_tab"]["sign_in_shown"], true, "another tab does not get the key");
    assert_eq!(
        steps["signed_out"]["stored"],
        serde_json::json!({"session": null, "local": [], "cookie": ""}),
        "signing out forgets the key"
    );
    let taken = report["shots"].as_array().unwrap();
    assert!(taken.len() >= 9, "{taken:?}");
    for shot in taken {
        let bytes = std::fs::metadata(shot.as_str().unwrap()).map(|m| m.len()).unwrap_or(0);
        assert!(bytes > 1000, "{shot} is a screenshot");
    }
}

/// The console test's screenshots: removed with the test when it passes, kept when it
/// fails (a panic is under way when this drops), so a failure can be looked at.
struct Shots(Option<tempfile::TempDir>);

impl Shots {
    fn path(&self) -> &std::path::Path {
        self.0.as_ref().map_or(std::path::Path::new(""), tempfile::TempDir::path)
    }
}

impl Drop for Shots {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(dir) = self.0.take()
        {
            eprintln!("the console test failed; its screenshots are kept in {}", dir.keep().display());
        }
    }
}
