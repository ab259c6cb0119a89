//! Brokered secrets end to end: the operator's `sandlane secret …` commands (the value from
//! standard input, never shown; `rotate-key` seals every value again, and they still open),
//! and the secret routes of the real `sandlane serve` (set, list, delete as a user and a
//! service; the gate brokering a secret on a sandbox's plain-HTTP request), each followed by
//! `sandlane audit verify` over the events they wrote. The value is in no output, answer,
//! log line or audit event.

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};

/// The value every test sets: it must never be shown.
const VALUE: &str = "ghp_E2eS3cretValue_do_not_print_7731";

/// The settings the CLI and the server read from `env`.
fn settings(env: &Env) -> app::config::Settings {
    let vars: std::collections::HashMap<String, String> =
        env.vars.iter().filter(|(k, _)| k.starts_with("SANDLANE_")).cloned().collect();
    app::config::Settings::load(None, &vars).expect("the test's settings")
}

/// The values the store opens for `host:port` in org acme, as the egress gate reads them.
fn opened(env: &Env, host: &str, port: u16) -> Vec<(String, String)> {
    let settings = settings(env);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let store = app::compose::open_store(&settings, false).await.expect("open the store");
        let org = domain::OrgId::parse("acme").unwrap();
        let found = store.secrets().for_host(&org, host, port).await.expect("open the values");
        store.close().await;
        found.into_iter().map(|(b, v)| (b.name.to_string(), v.expose().to_owned())).collect()
    })
}

/// The key files of the data dir's `secret-keys/`, and the one `current` names.
fn keys(env: &Env) -> (Vec<String>, String) {
    let dir = env.data.path().join("data/secret-keys");
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".key"))
        .collect();
    files.sort();
    let current = std::fs::read_to_string(dir.join("current")).unwrap().trim().to_owned();
    (files, current)
}

fn assert_hidden(what: &str, text: &str) {
    assert!(!text.contains(VALUE), "the value is in {what}: {text}");
}

fn verify(env: &Env) {
    let (code, stdout, stderr) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {stdout}{stderr}");
    assert!(stdout.contains("intact"), "{stdout}");
}

pub fn secret_commands_read_the_value_from_stdin_and_rotate_the_key() {
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let (code, out, err) = env.cli(&["org", "set", "acme", "--egress-allow", "api.github.com"]);
    assert_eq!(code, 0, "org set: {out}{err}");

    // The value from standard input (one trailing newline dropped); the binding printed.
    let set = ["secret", "set", "acme", "gh", "--host", "api.github.com", "--org", "--method", "GET"];
    let (code, out, err) = env.cli_with_stdin(&set, format!("{VALUE}\n").as_bytes());
    assert_eq!(code, 0, "secret set: {out}{err}");
    assert_hidden("set's output", &format!("{out}{err}"));
    let binding: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(binding["name"], "gh");
    assert_eq!(binding["scope"], json!({"org": true}));
    assert_eq!(binding["methods"], json!(["GET"]));
    assert!(binding.get("value").is_none(), "{out}");
    assert_eq!(opened(&env, "api.github.com", 443), [("gh".to_owned(), VALUE.to_owned())]);

    // Refusals: a value with a line break inside, one over the limit, none; a host the
    // allowlist does not allow. Nothing is stored; the value is not echoed.
    for (stdin, want) in [
        (format!("{VALUE}\r\nX-Evil: 1\n"), "no control characters"),
        (format!("{VALUE}{}", "v".repeat(9000)), "1 to 8192 bytes"),
        (String::new(), "1 to 8192 bytes"),
    ] {
        let args = ["secret", "set", "acme", "bad", "--host", "api.github.com", "--org"];
        let (code, out, err) = env.cli_with_stdin(&args, stdin.as_bytes());
        assert_ne!(code, 0, "{out}{err}");
        assert!(err.contains(want), "want {want:?}: {err}");
        assert_hidden("a refusal", &format!("{out}{err}"));
    }
    let args = ["secret", "set", "acme", "bad", "--host", "evil.example.com", "--org"];
    let (code, out, err) = env.cli_with_stdin(&args, VALUE.as_bytes());
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("evil.example.com:443 is not in the egress allowlist"), "{err}");

    let (code, out, err) = env.cli(&["secret", "list", "acme"]);
    assert_eq!(code, 0, "{err}");
    assert_hidden("list", &out);
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 1, "{out}");
    assert_eq!(listed[0]["name"], "gh");

    // rotate-key: a new current key, every value sealed again under it, the old key gone;
    // the value still opens.
    let (before, old) = keys(&env);
    assert_eq!(before, [format!("{old}.key")]);
    let (code, out, err) = env.cli(&["secret", "rotate-key"]);
    assert_eq!(code, 0, "rotate-key: {out}{err}");
    let new = out.trim().to_owned();
    assert_ne!(new, old);
    assert!(err.contains("sealed 1 values again") && err.contains(&old), "{err}");
    let (after, current) = keys(&env);
    assert_eq!((after, current), (vec![format!("{new}.key")], new.clone()));
    assert_eq!(opened(&env, "api.github.com", 443), [("gh".to_owned(), VALUE.to_owned())]);
    // No file of the data dir holds the value in the clear.
    let db = std::fs::read_dir(env.data.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| std::fs::read(p).unwrap())
        .any(|bytes| bytes.windows(VALUE.len()).any(|w| w == VALUE.as_bytes()));
    assert!(!db, "the value is in a data-dir file in the clear");

    let (code, out, err) = env.cli(&["secret", "delete", "acme", "gh"]);
    assert_eq!((code, out.trim()), (0, "deleted gh"), "{err}");
    let (code, _, err) = env.cli(&["secret", "delete", "acme", "gh"]);
    assert_ne!(code, 0);
    assert!(err.contains("no secret gh in org acme"), "{err}");
    assert!(opened(&env, "api.github.com", 443).is_empty());
    verify(&env);
}

pub fn secrets_through_the_api_of_the_real_server() {
    let Some(env) = Env::new(Backend::Sqlite) else { return };
    let service = env.add_caller("svc-secrets", "service", &["acme"]);
    let alice = env.add_caller("alice", "user", &["acme"]);
    let bob = env.add_caller("bob", "user", &["acme"]);
    let world = tempfile::tempdir().unwrap();
    std::fs::write(world.path().join("page"), "hello from the outside\n").unwrap();
    let log = world.path().join("http.log");
    let (port, _http) = crate::egress::http_server(world.path(), &log);
    // The test server is on the loopback: the allowlist names that one address and port.
    let rule = format!("127.0.0.1/32:{port}");
    let (code, out, err) =
        env.cli(&["org", "set", "acme", "--egress-allow", &rule, "--egress-allow", "api.github.com"]);
    assert_eq!(code, 0, "org set: {out}{err}");
    let mut server = Server::start_binary(&env);

    // Alice's own, for the loopback server; the org's, as the service.
    let host = format!("127.0.0.1:{port}");
    let mine =
        json!({"value": VALUE, "hosts": [host], "scope": {"identity": "alice"}, "header": "x-api-key"});
    let got = server.call("PUT", "/v1/orgs/acme/secrets/alice-page", Some(&alice), Some(mine.clone()));
    assert_eq!(got.0, 201, "{}", got.1);
    assert_hidden("an answer", &got.1.to_string());
    assert_eq!(server.call("PUT", "/v1/orgs/acme/secrets/alice-page", Some(&alice), Some(mine)).0, 200);
    let org = json!({"value": VALUE, "hosts": ["api.github.com"], "scope": {"org": true}});
    assert_eq!(server.call("PUT", "/v1/orgs/acme/secrets/gh", Some(&service), Some(org.clone())).0, 201);
    // Alice may not set the org's; bob may not take alice's name; a host outside the
    // allowlist is named.
    let got = server.call("PUT", "/v1/orgs/acme/secrets/x", Some(&alice), Some(org));
    crate::support::assert_error(&got, 403, "permission_denied");
    let bobs = json!({"value": VALUE, "hosts": ["api.github.com"], "scope": {"identity": "bob"}});
    let got = server.call("PUT", "/v1/orgs/acme/secrets/alice-page", Some(&bob), Some(bobs));
    crate::support::assert_error(&got, 409, "conflict");
    let evil = json!({"value": VALUE, "hosts": ["evil.example.com"], "scope": {"identity": "alice"}});
    let got = server.call("PUT", "/v1/orgs/acme/secrets/evil", Some(&alice), Some(evil));
    crate::support::assert_error(&got, 400, "invalid_argument");
    assert!(got.1["message"].as_str().unwrap().contains("evil.example.com:443"), "{}", got.1);

    let names = |key: &str| -> Vec<String> {
        let got = server.call("GET", "/v1/orgs/acme/secrets", Some(key), None);
        assert_eq!(got.0, 200, "{}", got.1);
        assert_hidden("a list", &got.1.to_string());
        got.1["secrets"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(names(&alice), ["alice-page"]);
    assert_eq!(names(&bob), Vec::<String>::new());
    assert_eq!(names(&service), ["alice-page", "gh"]);

    // A sandbox acting for alice asks the proxy for the loopback server over plain HTTP:
    // the gate allows it and brokers alice's secret for that connection (whether the proxy
    // sets the header yet is the proxy's business; the decision is audited).
    let got = server.call(
        "PUT",
        "/v1/orgs/acme/sessions/secrets-1/sandbox",
        Some(&alice),
        Some(json!({"execution_id": "exec-secrets-1"})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    let sandbox = got.1["sandbox"]["id"].as_str().unwrap().to_owned();
    let (status, ran) = server.exec_sh(
        &alice,
        &sandbox,
        &format!("curl -sS --max-time 20 --noproxy '' -x http://127.0.0.1:3128 http://{host}/page"),
    );
    assert_eq!(status, 200, "{ran}");
    assert_eq!(ran["stdout"], "hello from the outside\n", "{ran}");
    // Inside, nothing holds the value: not the environment, not the files it can read.
    let (_, ran) = server.exec_sh(&alice, &sandbox, "env; cat \"$SANDLANE_TOKEN_FILE\" 2>/dev/null");
    assert_hidden("the sandbox", &ran.to_string());

    let got = server.call("DELETE", "/v1/orgs/acme/secrets/alice-page", Some(&bob), None);
    crate::support::assert_error(&got, 404, "not_found");
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/secrets/alice-page", Some(&alice), None).0, 204);
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/secrets/gh", Some(&service), None).0, 204);
    assert_eq!(names(&service), Vec::<String>::new());

    let got = server.call("GET", "/v1/orgs/acme/audit?limit=1000", Some(&service), None);
    assert_eq!(got.0, 200, "{}", got.1);
    assert_hidden("the audit", &got.1.to_string());
    let events = got.1["events"].as_array().unwrap();
    let of = |action: &str| events.iter().filter(|e| e["action"] == action).count();
    assert_eq!((of("secret_set"), of("secret_delete")), (3, 2), "{events:#?}");
    let brokered = events.iter().any(|e| {
        e["action"] == "egress"
            && e["message"].as_str().is_some_and(|m| m.contains("brokered secrets alice-page"))
    });
    assert!(brokered, "the gate brokered alice's secret: {events:#?}");

    assert!(server.stop(), "the server stops cleanly");
    assert_hidden("the server's log", &server.log_text());
    verify(&env);
}
