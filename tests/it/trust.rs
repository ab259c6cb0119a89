//! Trust end to end: who may touch a sandbox (ownership by route), callers revoked on every
//! replica, work that outlives a client that goes away, and the embedded default's data
//! dir (absolute, private).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server, assert_error};
use crate::token::verify_with_jwks;

struct Keys {
    service: String,
    ada: String,
    bob: String,
}

fn setup(backend: Backend) -> Option<(Env, Keys)> {
    let env = Env::new(backend)?;
    let keys = Keys {
        service: env.add_caller("svc-platform", "service", &["acme"]),
        ada: env.add_caller("user-ada", "user", &["acme"]),
        bob: env.add_caller("user-bob", "user", &["acme"]),
    };
    Some((env, keys))
}

fn session(server: &Server, key: &str, session: &str, execution: &str) -> (u16, Value) {
    server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({ "execution_id": execution })),
    )
}

fn ready(got: &(u16, Value)) -> String {
    assert_eq!(got.0, 200, "{}", got.1);
    assert_eq!(got.1["outcome"], "ready", "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn exec(server: &Server, key: &str, sandbox: &str, script: &str) -> (u16, Value) {
    server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({ "argv": ["/bin/sh", "-c", script] })),
    )
}

fn exec_out(server: &Server, key: &str, sandbox: &str, script: &str) -> String {
    let got = exec(server, key, sandbox, script);
    assert_eq!((got.0, &got.1["exit_code"]), (200, &json!(0)), "{}", got.1);
    got.1["stdout"].as_str().unwrap().to_owned()
}

/// A second user of the org gets 403 on every route naming the first user's key or
/// sandbox (404 on GET); a service caller of the org may use each; ownership outlives the
/// sandbox.
pub fn ownership_by_route(backend: Backend) {
    let Some((env, k)) = setup(backend) else { return };
    let server = Server::start(&env);
    let s = ready(&session(&server, &k.ada, "own-s", "e1"));
    let w = server.call("PUT", "/v1/orgs/acme/workflow-executions/own-w/sandbox", Some(&k.ada), None);
    let w = ready(&w);

    // Bob, a user of the same org: refused everywhere.
    assert_error(&session(&server, &k.bob, "own-s", "e2"), 403, "permission_denied");
    assert_error(
        &server.call("PUT", "/v1/orgs/acme/workflow-executions/own-w/sandbox", Some(&k.bob), None),
        403,
        "permission_denied",
    );
    for id in [&s, &w] {
        assert_error(
            &server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.bob), None),
            404,
            "not_found",
        );
        assert_error(&exec(&server, &k.bob, id, "cat $SANDLANE_TOKEN_FILE"), 403, "permission_denied");
    }
    assert_error(
        &server.call("DELETE", "/v1/orgs/acme/sessions/own-s/sandbox", Some(&k.bob), None),
        403,
        "permission_denied",
    );
    assert_error(
        &server.call("DELETE", "/v1/orgs/acme/workflow-executions/own-w/sandbox", Some(&k.bob), None),
        403,
        "permission_denied",
    );
    assert_error(
        &server.call("POST", "/v1/orgs/acme/workflow-executions/own-w/sandbox/recover", Some(&k.bob), None),
        403,
        "permission_denied",
    );
    // Nothing Bob tried touched Ada's sandboxes.
    for id in [&s, &w] {
        let got = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.ada), None);
        assert_eq!((got.0, got.1["state"].as_str()), (200, Some("ready")), "{}", got.1);
    }
    assert_eq!(exec_out(&server, &k.ada, &s, "echo mine > /workspace/f; echo ok"), "ok\n");

    // The service caller of the org may do each.
    for id in [&s, &w] {
        assert_eq!(
            server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.service), None).0,
            200
        );
        assert_eq!(exec_out(&server, &k.service, id, "echo svc"), "svc\n");
    }
    let recovered = server.call(
        "POST",
        "/v1/orgs/acme/workflow-executions/own-w/sandbox/recover",
        Some(&k.service),
        None,
    );
    assert_ne!(ready(&recovered), w, "recovery gives a new sandbox");
    assert_eq!(
        server.call("DELETE", "/v1/orgs/acme/workflow-executions/own-w/sandbox", Some(&k.service), None).0,
        204
    );
    assert_eq!(server.call("DELETE", "/v1/orgs/acme/sessions/own-s/sandbox", Some(&k.service), None).0, 204);

    // The key is still Ada's after deprovision: Bob may not take it; Ada gets her durable
    // workspace back.
    assert_error(&session(&server, &k.bob, "own-s", "e3"), 403, "permission_denied");
    let again = ready(&session(&server, &k.ada, "own-s", "e4"));
    assert_ne!(again, s);
    assert_eq!(exec_out(&server, &k.ada, &again, "cat /workspace/f"), "mine\n");

    // Bob's refusals are in the org's audit log.
    let events = crate::lane::audit_events(&server, &k.service);
    let denied: Vec<_> = events.iter().filter(|e| e["outcome"] == "denied").collect();
    assert_eq!(denied.len(), 6, "ensure ×3, deprovision ×2, recover: {denied:?}");
    assert!(denied.iter().all(|e| e["caller_id"] == "user-bob"), "{denied:?}");
}

/// `caller revoke` takes effect at once on every replica: the key gets 401, every token
/// minted for that identity introspects inactive; the sandbox stays.
pub fn revoked_callers(backend: Backend) {
    let Some((env, k)) = setup(backend) else { return };
    let a = Server::start(&env);
    let b = Server::start(&env);
    let id = ready(&session(&a, &k.ada, "rev-s", "e1"));
    let token = exec_out(&a, &k.ada, &id, "cat \"$SANDLANE_TOKEN_FILE\"");
    let token = token.trim();
    for replica in [&a, &b] {
        let active = replica.post_form("/v1/introspect", Some(&k.service), &[("token", token)]);
        assert_eq!(active.1["active"], true, "{}", active.1);
        assert_eq!(exec_out(replica, token, &id, "echo as-token"), "as-token\n");
    }
    let (code, out, err) = env.cli(&["caller", "revoke", "--id", "user-ada"]);
    assert_eq!(code, 0, "{out}{err}");
    for replica in [&a, &b] {
        assert_error(&session(replica, &k.ada, "rev-s", "e2"), 401, "unauthenticated");
        let inactive = replica.post_form("/v1/introspect", Some(&k.service), &[("token", token)]);
        assert_eq!(inactive.1, json!({ "active": false }));
        assert_error(&exec(replica, token, &id, "true"), 401, "unauthenticated");
        // The sandbox itself stays, for the org's service callers.
        let got = replica.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&k.service), None);
        assert_eq!(got.1["state"], "ready", "{}", got.1);
    }
    // A service re-ensure mints for the service: the sandbox goes on, for whoever asks now.
    let again = ready(&session(&b, &k.service, "rev-s", "e3"));
    assert_eq!(again, id);
    let jwks = b.call("GET", "/.well-known/jwks.json", None, None).1;
    let fresh = exec_out(&b, &k.service, &id, "cat \"$SANDLANE_TOKEN_FILE\"");
    assert_eq!(verify_with_jwks(&fresh, &jwks)["sub"], "svc-platform");
    // Reserved ids are refused by `caller add`.
    let (code, _, err) =
        env.cli(&["caller", "add", "--id", "sandlane:sweeper", "--class", "service", "--org", "acme"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("reserved"), "{err}");
}

/// An ensure whose client goes away mid-provision still provisions, audits, and leaves a
/// ready sandbox.
pub fn disconnect_mid_provision(backend: Backend) {
    let Some(mut env) = Env::new(backend) else { return };
    // A bubblewrap that takes its time to start.
    let slow = env.data.path().join("slow-bwrap");
    std::fs::write(&slow, "#!/bin/sh\nsleep 1.5\nexec bwrap \"$@\"\n").unwrap();
    std::fs::set_permissions(&slow, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.set("SANDLANE_BWRAP", slow.to_str().unwrap());
    let service = env.add_caller("svc-platform", "service", &["acme"]);
    let ada = env.add_caller("user-ada", "user", &["acme"]);
    let server = Server::start(&env);
    server.call_and_leave(
        "PUT",
        "/v1/orgs/acme/sessions/left/sandbox",
        &ada,
        json!({ "execution_id": "e1" }),
        Duration::from_millis(300),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let provisioned = loop {
        let events = crate::lane::audit_events(&server, &service);
        if let Some(e) = events.iter().find(|e| e["key"] == "left" && e["outcome"] == "provisioned") {
            break e.clone();
        }
        assert!(
            Instant::now() < deadline,
            "no provisioned event within 30 s: {events:?}\n{}",
            server.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let id = provisioned["sandbox_id"].as_str().unwrap();
    let got = server.call("GET", &format!("/v1/orgs/acme/sandboxes/{id}"), Some(&ada), None);
    assert_eq!(got.1["state"], "ready", "{}", got.1);
    assert_eq!(exec_out(&server, &ada, id, "echo here"), "here\n");
}

/// Started from an empty working directory with no `SANDLANE_DATA_DIR`: ensure is ready;
/// nothing under the data dir has a group or other bit (the sandbox root beside it keeps
/// only search bits on its directories); a file made readable by others stops the next
/// start, naming it.
pub fn embedded_default_is_private() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    let cwd = env.data.path().join("empty-cwd");
    std::fs::create_dir(&cwd).unwrap();
    std::fs::set_permissions(&cwd, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.unset("SANDLANE_DATA_DIR");
    // The CLI runs in the same working directory as the server.
    let service =
        cli_in(&env, &cwd, &["caller", "add", "--id", "svc-platform", "--class", "service", "--org", "acme"]);
    let server = Server::start_in(&env, &cwd);
    let id = ready(&session(&server, &service, "private", "e1"));
    assert_eq!(exec_out(&server, &service, &id, "echo inside"), "inside\n");
    let data = cwd.join("sandlane-data");
    assert!(data.join("sandlane.db").exists(), "the default data dir is relative to the working directory");
    let mut checked = 0;
    walk(&data, &mut |path, mode, _is_dir| {
        checked += 1;
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:04o}: a group or other bit", path.display());
    });
    // The data dir itself too: no sandbox uid may even search it.
    let mode = std::fs::metadata(&data).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "the data dir has mode {mode:04o}");
    // What the sandbox's uid must reach lives where the server made it reachable (as root:
    // under the host directory; searchable, never listable).
    let root = adapters::bwrap::default_sandbox_root(&data);
    assert!(root.starts_with(adapters::bwrap::DEFAULT_HOST_DIR), "{}", root.display());
    assert!(!cwd.join("sandlane-data.sandboxes").exists(), "nothing beside the data dir");
    for dir in root.ancestors().take_while(|d| d.starts_with(adapters::bwrap::DEFAULT_HOST_DIR)) {
        let mode = std::fs::metadata(dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o711, "{} has mode {mode:04o}", dir.display());
    }
    walk(&root, &mut |path, mode, is_dir| {
        let allowed = if is_dir { 0o011 } else { 0 };
        assert_eq!(mode & 0o077 & !allowed, 0, "{} has mode {mode:04o}", path.display());
    });
    assert!(checked >= 6, "walked only {checked} entries");
    drop(server);
    let keys = data.join("signing-keys.json");
    std::fs::set_permissions(&keys, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = std::process::Command::new(crate::support::binary())
        .arg("serve")
        .current_dir(&cwd)
        .envs(env.vars.iter().cloned())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&keys.display().to_string()), "names the file: {err}");
}

fn cli_in(env: &Env, cwd: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new(crate::support::binary())
        .args(args)
        .current_dir(cwd)
        .envs(env.vars.iter().cloned())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Every entry under `dir`; directories are entered when the server owns them (a
/// workspace, owned by its sandbox's uid, is checked but not entered: its contents are the
/// sandbox's).
/// Calls `f` on every entry below `dir` that is not a symbolic link (a link's mode says
/// nothing; what it points at is walked where it lives). The server works in the
/// background while the test walks (sandboxes started ahead), so an entry gone between
/// the listing and its reading is skipped.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path, u32, bool)) {
    use std::os::unix::fs::MetadataExt;
    let Ok(me) = std::fs::metadata(dir).map(|m| m.uid()) else { return };
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        if meta.file_type().is_symlink() {
            continue;
        }
        f(&entry.path(), meta.permissions().mode() & 0o7777, meta.is_dir());
        if meta.is_dir() && meta.uid() == me {
            walk(&entry.path(), f);
        }
    }
}
