//! Brokered secrets end to end on bubblewrap and on containers (issue 35): a user's secret
//! reaches the services an agent calls, and never enters the sandbox.
//!
//! The outside world is two servers on this machine's loopback (`upstream.py`): one over
//! TLS with a certificate from a test CA the proxy is told to trust
//! (`egress.upstream_ca_file`), one plain. `api.test` and `plain.test` resolve to them
//! through a fixed table given to the server. Inside the sandbox, `curl`, Python's
//! `urllib`, `git ls-remote` and Node's `fetch` reach `https://api.test` with nothing but the
//! environment the sandbox gets (the proxy, the sandbox CA's bundle), and the upstream sees
//! the injected `Authorization`; the value is then searched for everywhere the sandbox can
//! look, in every API answer, the server's log and the audit events.
//!
//! On bubblewrap the sandbox runs this host's programs; on containers, an image made of them
//! (`podman-throwaway.sh tools-image`), since the test image has only busybox.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::egress::{Killed, TableResolver, free_port};
use crate::support::{Backend, Env, Server};

/// The secret's value: distinctive enough that finding it anywhere is a finding.
const VALUE: &str = "ghp_brokered_e2e_7f3a9c2d51b84e06";
const SERVICE_VALUE: &str = "svc_brokered_e2e_0c4e2b9a7d";

/// Where the sandboxes run.
enum Driver {
    Bubblewrap,
    /// The container driver on this Docker Engine API endpoint, with this image.
    Container {
        docker_host: String,
        image: String,
    },
}

/// The undici release Node 20 bundles. Node 20's `fetch` takes no proxy from the
/// environment (Node 22.21 and 24 do, with `NODE_USE_ENV_PROXY=1`, which every sandbox
/// gets); an agent on Node 20 passes undici's `EnvHttpProxyAgent`, which reads the same
/// variables, as `fetch`'s dispatcher.
const UNDICI: &str = "undici@6.24.1";

/// The undici package as `npm pack` makes it: fetched from the registry once, kept in the
/// test target's tmp dir.
fn undici_package() -> Vec<u8> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let file = dir.join(format!("{}.tgz", UNDICI.replace('@', "-")));
    if !file.is_file() {
        std::fs::create_dir_all(dir).unwrap();
        let fetched = tempfile::tempdir_in(dir).unwrap();
        let out = Command::new("timeout")
            .args(["300", "npm", "pack", "--silent", UNDICI, "--pack-destination"])
            .arg(fetched.path())
            .stdin(Stdio::null())
            .output()
            .expect("run npm (Node's package manager)");
        assert!(out.status.success(), "npm pack {UNDICI}: {}", String::from_utf8_lossy(&out.stderr));
        let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        // Whole or not at all: a rename, so a concurrent or interrupted fetch leaves no half file.
        std::fs::rename(fetched.path().join(name), &file).unwrap();
    }
    std::fs::read(&file).unwrap()
}

fn run_ok(cmd: &mut Command) {
    let out = cmd.output().expect("run a helper program");
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A test CA and a leaf for `name` signed by it (`openssl`): the CA's certificate path,
/// the leaf's certificate and key paths.
fn test_pki(dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf, std::path::PathBuf) {
    let p = |f: &str| dir.join(f);
    run_ok(
        Command::new("openssl")
            .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"])
            .args(["-nodes", "-days", "1", "-subj", "/CN=sandlane test upstream CA", "-keyout"])
            .arg(p("ca.key"))
            .arg("-out")
            .arg(p("ca.pem")),
    );
    run_ok(
        Command::new("openssl")
            .args(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj"])
            .arg(format!("/CN={name}"))
            .arg("-keyout")
            .arg(p("leaf.key"))
            .arg("-out")
            .arg(p("leaf.csr")),
    );
    std::fs::write(p("ext"), format!("subjectAltName=DNS:{name}\n")).unwrap();
    run_ok(
        Command::new("openssl")
            .args(["x509", "-req", "-days", "1", "-in"])
            .arg(p("leaf.csr"))
            .arg("-CA")
            .arg(p("ca.pem"))
            .arg("-CAkey")
            .arg(p("ca.key"))
            .arg("-CAcreateserial")
            .arg("-extfile")
            .arg(p("ext"))
            .arg("-out")
            .arg(p("leaf.pem")),
    );
    (p("ca.pem"), p("leaf.pem"), p("leaf.key"))
}

/// `upstream.py` on a free port (TLS with `tls`): its port, its request log, the process.
fn upstream(
    dir: &Path,
    name: &str,
    repo: &Path,
    tls: Option<(&Path, &Path)>,
) -> (u16, std::path::PathBuf, Killed) {
    let script = dir.join("upstream.py");
    std::fs::write(&script, include_str!("upstream.py")).unwrap();
    let port = free_port();
    let log = dir.join(format!("{name}.log"));
    std::fs::write(&log, "").unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg(port.to_string()).arg(&log).arg(repo);
    if let Some((cert, key)) = tls {
        cmd.arg(cert).arg(key);
    }
    let child = Killed(cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("python3"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "upstream {name} does not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    (port, log, child)
}

/// The requests an upstream recorded: (method, path, authorization).
fn requests(log: &Path) -> Vec<(String, String, Option<String>)> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["method"].as_str().unwrap().to_owned(),
                v["path"].as_str().unwrap().to_owned(),
                v["authorization"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

fn ensure(server: &Server, key: &str, session: &str) -> (String, Value) {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/acme/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    (got.1["sandbox"]["id"].as_str().unwrap().to_owned(), got.1)
}

fn sh(server: &Server, key: &str, sandbox: &str, script: &str) -> (i64, String, String) {
    let (status, v) = server.call(
        "POST",
        &format!("/v1/orgs/acme/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/bash", "-c", script], "timeout_ms": 120_000})),
    );
    assert_eq!(status, 200, "{v}");
    assert!(!v.to_string().contains(VALUE), "an exec answer holds the value: {v}");
    (
        v["exit_code"].as_i64().unwrap(),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
        v["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

pub fn brokered_secrets_on_bubblewrap() {
    scenario(&Driver::Bubblewrap);
}

pub fn brokered_secrets_on_containers() {
    let Some(engine) = tests::services::podman_engine() else { return };
    let image = engine.tools_image();
    scenario(&Driver::Container { docker_host: engine.docker_host, image });
}

fn scenario(driver: &Driver) {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    if let Driver::Container { docker_host, image } = driver {
        env.set("SANDLANE_DRIVER", "container");
        env.set("SANDLANE_DOCKER_HOST", docker_host);
        env.set("SANDLANE_CONTAINER_IMAGE", image);
    }
    // A session of this run's own: a container's durable volume outlives a run.
    let tag = env.data.path().file_name().unwrap().to_string_lossy().replace(['.', '_'], "-");
    let session = format!("brokered-{tag}");
    let world = tempfile::tempdir().unwrap();
    let (ca, cert, key) = test_pki(world.path(), "api.test");
    env.set("SANDLANE_EGRESS__UPSTREAM_CA_FILE", ca.to_str().unwrap());
    let service = env.add_caller("svc-secrets", "service", &["acme"]);
    let user = env.add_caller("user-secrets", "user", &["acme"]);
    let other = env.add_caller("user-other", "user", &["acme"]);

    // A git repository with one commit, for `git ls-remote` over smart HTTP.
    let repo = world.path().join("repo.git");
    run_ok(Command::new("git").args(["init", "-q", "--bare"]).arg(&repo));
    let work = world.path().join("work");
    run_ok(Command::new("git").args(["init", "-q", "-b", "main"]).arg(&work));
    run_ok(Command::new("git").arg("-C").arg(&work).args([
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@t",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "one",
    ]));
    run_ok(Command::new("git").arg("-C").arg(&work).arg("push").arg("-q").arg(&repo).arg("main"));

    let (tls_port, tls_log, _tls) = upstream(world.path(), "tls", &repo, Some((&cert, &key)));
    let (plain_port, plain_log, _plain) = upstream(world.path(), "plain", &repo, None);
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let resolver = TableResolver(HashMap::from([
        ("api.test", loopback),
        ("plain.test", loopback),
        ("other.test", loopback),
    ]));
    let (api, plain) = (format!("api.test:{tls_port}"), format!("plain.test:{plain_port}"));
    let (code, out, err) = env.cli(&[
        "org",
        "set",
        "acme",
        "--egress-allow",
        &api,
        "--egress-allow",
        &plain,
        "--egress-allow",
        &format!("other.test:{tls_port}"),
        "--egress-allow",
        "127.0.0.0/8",
    ]);
    assert_eq!(code, 0, "org set: {out}{err}");
    let server = Server::start_with(&env, app::compose::Overrides { resolver: Some(Arc::new(resolver)) });

    // The user binds their token to both hosts, for themselves; GET and POST only, and only
    // under /repo.git and /user for the TLS host.
    let put = |key: &str, name: &str, body: Value| {
        let got = server.call("PUT", &format!("/v1/orgs/acme/secrets/{name}"), Some(key), Some(body));
        assert!(
            !got.1.to_string().contains(VALUE) && !got.1.to_string().contains(SERVICE_VALUE),
            "{}",
            got.1
        );
        got
    };
    let got = put(
        &user,
        "github",
        json!({
            "value": VALUE, "hosts": [api, plain], "scope": {"identity": "user-secrets"},
            "methods": ["GET", "POST"], "paths": ["/repo.git", "/user"],
        }),
    );
    assert_eq!(got.0, 201, "{}", got.1);
    let got = put(
        &service,
        "service-token",
        json!({
            "value": SERVICE_VALUE, "hosts": [api], "scope": {"class": "service"},
        }),
    );
    assert_eq!(got.0, 201, "{}", got.1);

    let (id, ensured) = ensure(&server, &user, &session);
    assert!(!ensured.to_string().contains(VALUE));
    let run = |script: &str| sh(&server, &user, &id, script);

    // The sandbox trusts its own CA through the environment every command gets.
    let (code, vars, _) = run(
        "env | grep -E '^(SSL_CERT_FILE|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE|NODE_EXTRA_CA_CERTS|GIT_SSL_CAINFO)=' | sort",
    );
    assert_eq!(code, 0);
    for var in
        ["SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"]
    {
        assert!(vars.contains(&format!("{var}=")), "{var} missing: {vars}");
    }
    let (code, pem, err) = run("cat /run/sandlane/ca.pem");
    assert_eq!(code, 0, "{err}");
    assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");

    // curl, with the sandbox's own Authorization replaced.
    let (code, body, err) =
        run(&format!("curl -sS --max-time 20 -H 'Authorization: Bearer mine' https://{api}/user"));
    assert_eq!((code, body.as_str()), (0, "ok\n"), "{err}");
    // Python's urllib (proxy and CA bundle from the environment).
    let (code, body, err) = run(&format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('https://{api}/user/emails', timeout=20).read().decode(), end='')\""
    ));
    assert_eq!((code, body.as_str()), (0, "ok\n"), "{err}");
    // git over smart HTTP.
    let (code, refs, err) = run(&format!("git ls-remote https://{api}/repo.git"));
    assert_eq!(code, 0, "{err}");
    assert!(refs.contains("refs/heads/main"), "{refs}");
    // Node's `fetch`, its TLS stack trusting the sandbox's CA through NODE_EXTRA_CA_CERTS,
    // the proxy from the environment through undici's agent (see UNDICI).
    let (status, v) = server.raw(
        "PUT",
        &format!("/v1/orgs/acme/sandboxes/{id}/files?path=/workspace/undici.tgz"),
        Some(&user),
        "application/octet-stream",
        undici_package(),
    );
    assert!((200..300).contains(&status), "upload undici: {status} {v}");
    let node = format!(
        r#"cd /workspace && tar -xzf undici.tgz && cat > fetch.js <<'JS'
const {{ EnvHttpProxyAgent }} = require('/workspace/package');
fetch('https://{api}/user/node', {{ dispatcher: new EnvHttpProxyAgent() }})
  .then(async (r) => console.log(r.status, await r.text()))
  .catch((e) => {{ console.error(e.cause ?? e); process.exit(1); }});
JS
node fetch.js"#
    );
    let (code, out, err) = run(&node);
    assert_eq!((code, out.trim()), (0, "200 ok"), "{err}");
    // Plain HTTP in absolute form.
    let (code, body, err) = run(&format!("curl -sS --max-time 20 http://{plain}/user"));
    assert_eq!((code, body.as_str()), (0, "ok\n"), "{err}");

    let bearer = Some(format!("Bearer {VALUE}"));
    let seen = requests(&tls_log);
    assert!(seen.iter().any(|(m, p, a)| m == "GET" && p == "/user" && *a == bearer), "{seen:?}");
    assert!(seen.iter().any(|(_, p, a)| p == "/user/emails" && *a == bearer), "{seen:?}");
    assert!(seen.iter().any(|(_, p, a)| p.starts_with("/repo.git/info/refs") && *a == bearer), "{seen:?}");
    assert!(seen.iter().any(|(_, p, a)| p == "/user/node" && *a == bearer), "{seen:?}");
    assert!(
        seen.iter().all(|(_, _, a)| a.as_deref() != Some("Bearer mine")),
        "the sandbox's header was sent: {seen:?}"
    );
    assert!(requests(&plain_log).iter().any(|(_, p, a)| p == "/user" && *a == bearer));

    // Outside the binding: refused by the proxy (403), and nothing reaches the upstream.
    let before = requests(&tls_log).len();
    let (_, body, _) =
        run(&format!("curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' -X DELETE https://{api}/user"));
    assert_eq!(body, "403");
    let (_, body, _) =
        run(&format!("curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' https://{api}/admin"));
    assert_eq!(body, "403");
    let (_, body, _) = run(&format!(
        "curl -sS --max-time 20 -o /dev/null -w '%{{http_code}}' --path-as-is https://{api}/user/../admin"
    ));
    assert_eq!(body, "403");
    assert_eq!(requests(&tls_log).len(), before, "a refused request reached the upstream");

    // Domain fronting: a CONNECT to api.test whose ClientHello names another host.
    let (code, _, _) = run(&format!(
        "curl -sS --max-time 20 --connect-to other.test:{tls_port}:api.test:{tls_port} https://other.test:{tls_port}/user"
    ));
    assert_ne!(code, 0, "a ClientHello naming another host than the CONNECT passed");
    let proxy_host = "127.0.0.1:3128";
    let (code, out, err) = run(&format!(
        "echo | timeout 20 openssl s_client -proxy {proxy_host} -connect api.test:{tls_port} -servername other.test 2>&1; echo rc=$?"
    ));
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("no peer certificate available") && !out.contains("Server certificate"),
        "a certificate was shown to a ClientHello naming another host: {out}"
    );

    // The value is nowhere the sandbox can look: its files, every process's environment and
    // command line.
    // The pattern reaches grep through a pipe, in two halves no command line holds whole
    // (or the search would find itself); a positive control proves the search finds.
    let (head, tail) = VALUE.split_at(8);
    let search = |needle_head: &str, needle_tail: &str| {
        run(&format!(
            "pattern() {{ printf '%s%s' '{needle_head}' '{needle_tail}'; }}; \
             grep -rlsF -f <(pattern) / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head; \
             for p in /proc/[0-9]*; do cat $p/environ $p/cmdline 2>/dev/null; done | grep -caF -f <(pattern)"
        ))
    };
    let (code, found, err) = search(head, tail);
    assert_eq!(found.trim(), "0", "the value is inside the sandbox: {found} {err} ({code})");
    let (_, found, _) = search("/usr/bin/", "env");
    assert!(found.lines().count() > 1, "the search finds what is there: {found}");

    // A service ensures the same session: the next connection acts for it.
    let (same, _) = ensure(&server, &service, &session);
    assert_eq!(same, id);
    let (code, _, err) = sh(&server, &service, &id, &format!("curl -sS --max-time 20 https://{api}/user"));
    assert_eq!(code, 0, "{err}");
    let last = requests(&tls_log).pop().unwrap();
    assert_eq!(last.2, Some(format!("Bearer {SERVICE_VALUE}")), "the service's secret, not the user's");

    // Back to the user; then the secret is deleted: injection stops at the next connection
    // (the tunnel is then end to end, so curl is told to trust the upstream's own CA).
    ensure(&server, &user, &session);
    let (code, _, err) = run(&format!("curl -sS --max-time 20 https://{api}/user/before-delete"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        requests(&tls_log).pop().unwrap(),
        ("GET".into(), "/user/before-delete".into(), bearer.clone())
    );
    let got = server.call("DELETE", "/v1/orgs/acme/secrets/github", Some(&user), None);
    assert!(got.0 == 204 || got.0 == 200, "{}", got.1);
    let upstream_ca = std::fs::read_to_string(&ca).unwrap();
    let (code, _, err) = run(&format!("printf '%s' '{upstream_ca}' > /tmp/upstream-ca.pem"));
    assert_eq!(code, 0, "{err}");
    let (code, _, err) =
        run(&format!("curl -sS --max-time 20 --cacert /tmp/upstream-ca.pem https://{api}/user/after-delete"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(requests(&tls_log).pop().unwrap(), ("GET".into(), "/user/after-delete".into(), None));

    // A revoked caller's secrets are used by no connection from then on.
    let got = put(
        &user,
        "github",
        json!({
            "value": VALUE, "hosts": [api], "scope": {"identity": "user-secrets"},
        }),
    );
    assert_eq!(got.0, 201, "{}", got.1);
    let (code, _, err) = run(&format!("curl -sS --max-time 20 https://{api}/user/before-revoke"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(requests(&tls_log).pop().unwrap().2, bearer);
    let (code, out, err) = env.cli(&["caller", "revoke", "--id", "user-secrets"]);
    assert_eq!(code, 0, "{out}{err}");
    let before = requests(&tls_log).len();
    let (_, _, _) = sh(
        &server,
        &service,
        &id,
        &format!("curl -sS --max-time 20 --cacert /tmp/upstream-ca.pem https://{api}/user/after-revoke"),
    );
    let after = requests(&tls_log);
    assert!(
        after[before..].iter().all(|(_, _, a)| a.as_deref() != bearer.as_deref()),
        "a revoked caller's secret was sent: {after:?}"
    );

    // Another user never sees the first user's secrets.
    let got = server.call("GET", "/v1/orgs/acme/secrets", Some(&other), None);
    assert_eq!(got.0, 200, "{}", got.1);
    assert!(
        !got.1.to_string().contains("github") && !got.1.to_string().contains("service-token"),
        "{}",
        got.1
    );

    // The audit: each use named, never the value; the log holds no value either.
    let got = server.call("GET", "/v1/orgs/acme/audit?limit=1000", Some(&service), None);
    assert_eq!(got.0, 200);
    let text = got.1.to_string();
    assert!(!text.contains(VALUE) && !text.contains(SERVICE_VALUE), "an audit event holds a value");
    let events = got.1["events"].as_array().unwrap();
    let uses: Vec<&Value> = events.iter().filter(|e| e["action"] == "secret_use").collect();
    assert!(
        uses.iter()
            .any(|e| e["caller_id"] == "user-secrets" && e["message"].as_str().unwrap().contains("github")),
        "{uses:#?}"
    );
    assert!(uses.iter().any(|e| e["outcome"] == "refused"), "a refused use is audited: {uses:#?}");
    let log = server.log_text();
    assert!(!log.contains(VALUE) && !log.contains(SERVICE_VALUE), "the server's log holds a value");

    // The sandbox goes with the test (a container would outlive it in the engine).
    let got =
        server.call("DELETE", &format!("/v1/orgs/acme/sessions/{session}/sandbox"), Some(&service), None);
    assert_eq!(got.0, 204, "{}", got.1);
    let mut server = server;
    assert!(server.stop(), "the server stops cleanly");
    let (code, stdout, stderr) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {stdout}{stderr}");
}
