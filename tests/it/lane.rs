//! The lane end to end: every route, authentication and authorisation, postures,
//! durability by class, tokens, recovery, concurrency, the audit trail and its verify.

use std::collections::HashSet;

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, assert_error};
use crate::token::verify_with_jwks;

const PREFIX: &str = "Sandbox provisioning failed: ";

struct Keys {
    service: String,
    user: String,
    user2: String,
    stranger: String,
}

fn setup(backend: Backend, tweak: impl FnOnce(&mut Env)) -> Option<(Env, Keys)> {
    let mut env = Env::new(backend)?;
    tweak(&mut env);
    let keys = Keys {
        service: env.add_caller("svc-platform", "service", &["acme"]),
        user: env.add_caller("user-ada", "user", &["acme"]),
        user2: env.add_caller("user-bob", "user", &["acme"]),
        stranger: env.add_caller("svc-other", "service", &["globex"]),
    };
    Some((env, keys))
}

fn ensure_session(server: &Server, key: &str, session: &str, execution: &str) -> (u16, Value) {
    server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": execution})),
    )
}

fn ready_sandbox(got: &(u16, Value)) -> Value {
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["outcome"], "ready", "{}", got.1);
    got.1["sandbox"].clone()
}

fn exec(server: &Server, key: &str, sandbox: &str, argv: &[&str]) -> (u16, Value) {
    server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": argv})),
    )
}

fn exec_ok(server: &Server, key: &str, sandbox: &str, script: &str) -> String {
    let got = exec(server, key, sandbox, &["/bin/sh", "-c", script]);
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["exit_code"], 0, "{}", got.1);
    got.1["stdout"].as_str().unwrap().to_owned()
}

pub fn audit_events(server: &Server, key: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let got = server.call("GET", &format!("/v1/orgs/acme/audit?after={after}&limit=2"), Some(key), None);
        assert_eq!(got.0, 200, "{}", got.1);
        let page = got.1["events"].as_array().unwrap().clone();
        if page.is_empty() {
            return events;
        }
        after = got.1["next"].as_i64().unwrap();
        events.extend(page);
    }
}

pub fn routes_auth_and_errors(backend: Backend) {
    let Some((env, k)) = setup(backend, |_| {}) else { return };
    // The binary: the process environment (DATABASE_URL) must not reach a sandbox.
    let server = Server::start_binary(&env);

    // Public routes.
    assert_eq!(server.call("GET", "/healthz", None, None).0, 200);
    let ready = server.call("GET", "/readyz", None, None);
    assert_eq!(ready.0, 200, "{}", ready.1);
    let (status, metrics) = server.get_text("/metrics");
    assert_eq!(status, 200);
    assert!(metrics.contains("sandlane_live_sandboxes"), "{metrics}");
    let openapi = server.call("GET", "/openapi.json", None, None).1;
    assert!(openapi["paths"]["/v1/orgs/{org}/sandboxes/{sandbox_id}/exec"].is_object());
    let jwks = server.call("GET", "/.well-known/jwks.json", None, None).1;
    assert!(!jwks["keys"].as_array().unwrap().is_empty(), "{jwks}");

    // 401.
    assert_error(&ensure_session(&server, "", "s1", "e1"), 401, "unauthenticated");
    assert_error(&ensure_session(&server, "sk_not_a_key", "s1", "e1"), 401, "unauthenticated");
    assert_error(&server.call("GET", "/v1/orgs/acme/audit", None, None), 401, "unauthenticated");
    // 403: another org's caller; a user reading the audit.
    assert_error(&ensure_session(&server, &k.stranger, "s1", "e1"), 403, "permission_denied");
    assert_error(&server.call("GET", "/v1/orgs/acme/audit", Some(&k.user), None), 403, "permission_denied");
    // 400: malformed body, bad ids, bad exec.
    assert_error(
        &server.raw("PUT", "/v1/orgs/acme/sessions/s1/sandbox", Some(&k.user), "application/json", "{"),
        400,
        "invalid_argument",
    );
    assert_error(
        &server.call("PUT", "/v1/orgs/acme/sessions/s1/sandbox", Some(&k.user), Some(json!({"exec": 1}))),
        400,
        "invalid_argument",
    );
    assert_error(&ensure_session(&server, &k.user, "s1", "bad id!"), 400, "invalid_argument");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/sandboxes/nope", Some(&k.user), None),
        400,
        "invalid_argument",
    );
    assert_error(
        &server.call("GET", "/v1/orgs/acme/audit?limit=0", Some(&k.service), None),
        400,
        "invalid_argument",
    );
    // 404: unknown route and unknown sandbox.
    assert_error(&server.call("GET", "/v1/nothing", Some(&k.user), None), 404, "not_found");
    assert_error(
        &server.call("GET", "/v1/orgs/acme/sandboxes/sbx_01M8V5JFHXMPKJJV67AVDWWJVK", Some(&k.user), None),
        404,
        "not_found",
    );

    // A ready sandbox, read back.
    let s = ready_sandbox(&ensure_session(&server, &k.user, "s1", "e1"));
    for field in ["id", "kind", "key", "org", "durability", "state", "driver", "created_at", "token_id"] {
        assert!(!s[field].is_null(), "S lacks {field}: {s}");
    }
    assert_eq!(
        (s["kind"].as_str(), s["key"].as_str(), s["org"].as_str()),
        (Some("session"), Some("s1"), Some("acme"))
    );
    assert_eq!(s["durability"], "durable", "a user's workspace is durable");
    let id = s["id"].as_str().unwrap();
    let got = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.user), None);
    assert_eq!((got.0, got.1["id"].as_str(), got.1["state"].as_str()), (200, Some(id), Some("ready")));
    assert_error(
        &server.call("GET", &format!("/v1/orgs/globex/sandboxes/{id}"), Some(&k.stranger), None),
        404,
        "not_found",
    );

    // Exec: the user who ensured it, a service of the org; not another user, not another org.
    assert_eq!(exec_ok(&server, &k.user, id, "echo hi"), "hi\n");
    assert_eq!(exec_ok(&server, &k.service, id, "echo svc"), "svc\n");
    assert_error(&exec(&server, &k.user2, id, &["true"]), 403, "permission_denied");
    assert_error(&exec(&server, &k.stranger, id, &["true"]), 403, "permission_denied");
    assert_error(&exec(&server, &k.user, id, &[]), 400, "invalid_argument");
    let timed = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{id}/exec"),
        Some(&k.user),
        Some(json!({"argv": ["sleep", "5"], "timeout_ms": 200})),
    );
    assert_eq!((timed.0, &timed.1["timed_out"]), (200, &json!(true)), "{}", timed.1);
    let stdin = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{id}/exec"),
        Some(&k.user),
        Some(json!({"argv": ["cat"], "stdin": "piped"})),
    );
    assert_eq!(stdin.1["stdout"], "piped", "{}", stdin.1);

    // The environment: the contract, the class, never the id nor a host variable.
    let env_out = exec_ok(&server, &k.user, id, "env");
    assert!(env_out.contains("SANDLANE_CALLER_CLASS=user"), "{env_out}");
    assert!(env_out.contains(&format!("SANDLANE_SANDBOX_ID={id}")), "{env_out}");
    assert!(!env_out.contains("user-ada"), "the caller id leaked into the environment: {env_out}");
    assert!(!env_out.contains("DATABASE_URL") && !env_out.contains("SANDLANE_DATA_DIR"), "{env_out}");

    drop(server);
}

pub fn session_lifecycle_tokens_and_audit(backend: Backend) {
    let Some((env, k)) = setup(backend, |_| {}) else { return };
    // The binary: this test ends with SIGTERM and reads the process's own log.
    let mut server = Server::start_binary(&env);

    let s = ready_sandbox(&ensure_session(&server, &k.user, "s2", "e1"));
    let id = s["id"].as_str().unwrap().to_owned();
    // The token read from inside verifies against the JWKS; sub is the caller; no class.
    let token = exec_ok(&server, &k.user, &id, "cat \"$SANDLANE_TOKEN_FILE\"");
    assert!(!exec_ok(&server, &k.user, &id, "env").contains(token.trim()), "the token is in no variable");
    let jwks = server.call("GET", "/.well-known/jwks.json", None, None).1;
    let claims = verify_with_jwks(&token, &jwks);
    assert_eq!(claims["sub"], "user-ada");
    assert_eq!(claims["sandbox_id"], id.as_str());
    assert_eq!(claims["org_id"], "acme");
    assert_eq!(claims["session_id"], "s2");
    assert_eq!(claims["jti"], s["token_id"]);
    let mut names: Vec<_> = claims.as_object().unwrap().keys().cloned().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "aud",
            "execution_id",
            "exp",
            "iat",
            "iss",
            "jti",
            "nbf",
            "org_id",
            "sandbox_id",
            "session_id",
            "sub"
        ]
    );

    // The token: exec in its own sandbox only; refused everywhere else.
    assert_eq!(exec_ok(&server, token.trim(), &id, "echo via-token"), "via-token\n");
    assert_error(&ensure_session(&server, token.trim(), "s2", "e2"), 403, "permission_denied");
    assert_error(
        &server.post_form("/v1/introspect", Some(token.trim()), &[("token", token.trim())]),
        403,
        "permission_denied",
    );
    let active = server.post_form("/v1/introspect", Some(&k.service), &[("token", token.trim())]);
    assert_eq!(active.1["active"], true, "{}", active.1);
    assert_eq!(active.1["sub"], "user-ada");

    // Another user of the org may not re-ensure it; a service caller may: the ready
    // sandbox is reused with a fresh token, and the token file follows the latest ensurer.
    assert_error(&ensure_session(&server, &k.user2, "s2", "e2"), 403, "permission_denied");
    assert_error(&exec(&server, &k.user2, &id, &["true"]), 403, "permission_denied");
    let again = ready_sandbox(&ensure_session(&server, &k.service, "s2", "e2"));
    assert_eq!(again["id"], s["id"]);
    assert_ne!(again["token_id"], s["token_id"]);
    let latest = exec_ok(&server, &k.user, &id, "cat \"$SANDLANE_TOKEN_FILE\"");
    let latest = verify_with_jwks(&latest, &jwks);
    assert_eq!((latest["sub"].as_str(), latest["execution_id"].as_str()), (Some("svc-platform"), Some("e2")));
    assert_eq!(latest["jti"], again["token_id"]);

    // 32 concurrent ensures of one new session: one sandbox id.
    let ids: HashSet<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..32)
            .map(|i| {
                let server = &server;
                let key = &k.service;
                scope.spawn(move || {
                    let got = ensure_session(server, key, "crowd", &format!("e{i}"));
                    ready_sandbox(&got)["id"].as_str().unwrap().to_owned()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(ids.len(), 1, "{ids:?}");

    // Deprovision: 204, idempotent; the token goes inactive before its exp.
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/sessions/s2/sandbox", Some(&k.user), None).0, 204);
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/sessions/s2/sandbox", Some(&k.user), None).0, 204);
    let inactive = server.post_form("/v1/introspect", Some(&k.service), &[("token", token.trim())]);
    assert_eq!(inactive.1, json!({"active": false}));
    assert_error(&exec(&server, token.trim(), &id, &["true"]), 401, "unauthenticated");
    let gone = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.user), None);
    assert_eq!(gone.1["state"], "deprovisioned");

    // Workflow: ensure, then recovery gives a new sandbox id and revokes the old tokens.
    let w = server.call("PUT", "/v1/orgs/acme/workflow-executions/wf1/sandbox", Some(&k.service), None);
    let w = ready_sandbox(&w);
    assert_eq!((w["kind"].as_str(), w["durability"].as_str()), (Some("workflow"), Some("ephemeral")));
    let wid = w["id"].as_str().unwrap().to_owned();
    let wtoken = exec_ok(&server, &k.service, &wid, "cat \"$SANDLANE_TOKEN_FILE\"");
    assert_eq!(verify_with_jwks(&wtoken, &jwks)["session_id"], "");
    assert_eq!(exec_ok(&server, &k.service, &wid, "printf %s \"$SANDLANE_SESSION_ID\""), "");
    let r =
        server.call("POST", "/v1/orgs/acme/workflow-executions/wf1/sandbox/recover", Some(&k.service), None);
    let r = ready_sandbox(&r);
    assert_ne!(r["id"].as_str(), Some(wid.as_str()), "recovery gives a new sandbox id");
    let old = server.post_form("/v1/introspect", Some(&k.service), &[("token", wtoken.trim())]);
    assert_eq!(old.1, json!({"active": false}));
    assert_eq!(
        server.call("DELETE", "/v1/orgs/acme/workflow-executions/wf1/sandbox", Some(&k.service), None).0,
        204
    );

    // The audit trail: oldest first, one event per ensure and deprovision.
    let events = audit_events(&server, &k.service);
    let seqs: Vec<i64> = events.iter().map(|e| e["seq"].as_i64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let count = |action: &str, outcome: &str| {
        events.iter().filter(|e| e["action"] == action && e["outcome"] == outcome).count()
    };
    assert_eq!(count("ensure", "provisioned"), 3, "s2, crowd, wf1");
    assert_eq!(count("ensure", "reused"), 1 + 31);
    assert_eq!(count("ensure", "denied"), 1, "user-bob's refused ensure is audited");
    assert_eq!(count("deprovision", "deprovisioned"), 2);
    assert_eq!(count("deprovision", "absent"), 1);
    assert_eq!(count("recover", "provisioned"), 1);
    assert!(events.iter().all(|e| e["caller_class"] != "internal" || e["action"] == "refresh"));

    // Graceful stop; the log verifies; no token was ever logged.
    assert!(server.stop(), "the server stops cleanly on SIGTERM");
    let logs = server.log_text();
    assert!(!logs.contains(token.trim()) && !logs.contains(wtoken.trim()), "a token reached the log");
    let (code, out, err) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {out}{err}");
    assert!(out.contains("intact"), "{out}");
    assert!(out.contains("0 rows not yet sealed"), "the sealer flushed at shutdown: {out}");
}

pub fn durability_by_class(backend: Backend) {
    let Some((env, k)) = setup(backend, |_| {}) else { return };
    let server = Server::start(&env);
    for (key, class, session, survives) in
        [(&k.user, "user", "dur-u", true), (&k.service, "service", "dur-s", false)]
    {
        let s = ready_sandbox(&ensure_session(&server, key, session, "e1"));
        assert_eq!(s["durability"], if survives { "durable" } else { "ephemeral" }, "{class}");
        let id = s["id"].as_str().unwrap();
        assert_eq!(
            exec_ok(&server, key, id, "echo kept > /workspace/note && printf %s \"$SANDLANE_CALLER_CLASS\""),
            class
        );
        assert_eq!(
            server.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(key), None).0,
            204
        );
        let s2 = ready_sandbox(&ensure_session(&server, key, session, "e2"));
        assert_ne!(s2["id"], s["id"], "a new sandbox for the same key");
        let seen =
            exec_ok(&server, key, s2["id"].as_str().unwrap(), "cat /workspace/note 2>/dev/null || echo gone");
        assert_eq!(seen, if survives { "kept\n" } else { "gone\n" }, "{class}");
    }
}

pub fn postures(backend: Backend) {
    let Some((env, k)) = setup(backend, |e| e.set("SANDLANE_BWRAP", "/nonexistent/bwrap")) else { return };
    let server = Server::start(&env);
    let session = ensure_session(&server, &k.user, "p1", "e1");
    assert_eq!(session.0, 200, "session posture: never fails the launch: {}", session.1);
    assert_eq!(session.1["outcome"], "failed");
    let message = session.1["message"].as_str().unwrap();
    assert!(message.starts_with(PREFIX), "{message}");
    assert!(message.contains("/nonexistent/bwrap"), "the message names the program: {message}");
    let workflow =
        server.call("PUT", "/v1/orgs/acme/workflow-executions/wp1/sandbox", Some(&k.service), None);
    assert_error(&workflow, 503, "unavailable");
    assert!(workflow.1["message"].as_str().unwrap().starts_with(PREFIX), "{}", workflow.1);
    let events = audit_events(&server, &k.service);
    let failed: Vec<_> = events.iter().filter(|e| e["outcome"] == "failed").collect();
    assert_eq!(failed.len(), 2, "{events:?}");
    assert!(failed.iter().all(|e| e["message"].as_str().unwrap().starts_with(PREFIX)));
    let logs = server.log_text();
    assert!(
        logs.lines().any(|l| l.contains("\"level\":\"ERROR\"") && l.contains(PREFIX)),
        "an error-level log line: {logs}"
    );
    let ready = server.call("GET", "/readyz", None, None);
    assert_eq!(ready.0, 503, "the driver is not usable: {}", ready.1);
}

pub fn lane_off(backend: Backend) {
    let Some((env, k)) = setup(backend, |e| e.set("SANDLANE_LANE_ENABLED", "false")) else { return };
    let server = Server::start(&env);
    assert_eq!(ensure_session(&server, &k.user, "off", "e1").1, json!({"outcome": "disabled"}));
    let w = server.call("PUT", "/v1/orgs/acme/workflow-executions/woff/sandbox", Some(&k.service), None);
    assert_eq!(w.1, json!({"outcome": "disabled"}));
    assert!(audit_events(&server, &k.service).is_empty(), "nothing audited");
    let entries = |dir: &str| std::fs::read_dir(env.data.path().join(dir)).map(|d| d.count()).unwrap_or(0);
    let provisioned = (
        entries("data/sandboxes"),
        entries("data.sandboxes/workspaces/durable"),
        entries("data.sandboxes/workspaces/ephemeral"),
    );
    assert_eq!(provisioned, (0, 0, 0), "nothing provisioned");
}
