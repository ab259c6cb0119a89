//! Egress end to end on bubblewrap: a plain HTTP server and a TLS server on this
//! machine's loopback stand in for the outside world (nothing else is reached). `curl`
//! inside a sandbox reaches an allowed host through `HTTPS_PROXY` (TLS end to end, the
//! certificate made here with `openssl` and trusted with `--cacert`) and through
//! `HTTP_PROXY`; a host not allowed is refused with a clear message and an audit event; a
//! raw socket to the servers' port fails; an allowed name that resolves into a refused
//! range is refused; the loopback range the test servers need is refused unless the
//! policy names it; the events verify with `sandlane audit verify`.
//!
//! The allowlists are the orgs' policies, set with `sandlane org set --egress-allow`.
//! Names resolve through a fixed table given to the server (its resolver is injectable),
//! so `tls.test` is 127.0.0.1 and `internal.test` 10.20.30.40 without touching the host's
//! `/etc/hosts` (shared with everything else on this machine) or DNS.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Backend, Env, Server};

/// Names as the test's world resolves them.
pub struct TableResolver(pub HashMap<&'static str, IpAddr>);

#[async_trait::async_trait]
impl ports::Resolver for TableResolver {
    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ports::ResolveError> {
        if let Ok(ip) = host.parse() {
            return Ok(vec![ip]);
        }
        self.0
            .get(host)
            .map(|ip| vec![*ip])
            .ok_or_else(|| ports::ResolveError(format!("{host} does not resolve")))
    }
}

/// A child process killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn wait_listening(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `python3 -m http.server` serving `dir` on the loopback; its request log in `log`.
pub fn http_server(dir: &Path, log: &Path) -> (u16, impl Drop) {
    let port = free_port();
    let child = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1", &port.to_string(), "--directory"])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("python3 (Debian: apt-get install python3)");
    let child = Killed(child);
    wait_listening(port);
    (port, child)
}

/// A self-signed certificate for `name` (`openssl req`), and `openssl s_server -WWW`
/// serving `dir` over TLS with it; returns the port and the certificate (PEM).
pub fn tls_server(dir: &Path, name: &str) -> (u16, String, impl Drop) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj"])
        .arg(format!("/CN={name}"))
        .args(["-addext"])
        .arg(format!("subjectAltName=DNS:{name}"))
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl (Debian: apt-get install openssl)");
    assert!(made.success(), "openssl req failed");
    let port = free_port();
    let child = Command::new("openssl")
        .args(["s_server", "-quiet", "-WWW", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("openssl s_server");
    let child = Killed(child);
    wait_listening(port);
    (port, std::fs::read_to_string(&cert).unwrap(), child)
}

fn ensure(server: &Server, key: &str, org: &str, session: &str) -> String {
    let got = server.call(
        "PUT",
        &format!("/v1/orgs/{org}/sessions/{session}/sandbox"),
        Some(key),
        Some(json!({"execution_id": format!("exec-{session}")})),
    );
    assert_eq!((got.0, got.1["outcome"].as_str()), (200, Some("ready")), "{}", got.1);
    got.1["sandbox"]["id"].as_str().unwrap().to_owned()
}

fn sh(server: &Server, key: &str, org: &str, sandbox: &str, script: &str) -> Value {
    let got = server.call(
        "POST",
        &format!("/v1/orgs/{org}/sandboxes/{sandbox}/exec"),
        Some(key),
        Some(json!({"argv": ["/bin/sh", "-c", script], "timeout_ms": 60_000})),
    );
    assert_eq!(got.0, 200, "{}", got.1);
    got.1
}

fn out(v: &Value) -> (i64, String, String) {
    (
        v["exit_code"].as_i64().unwrap(),
        v["stdout"].as_str().unwrap_or_default().to_owned(),
        v["stderr"].as_str().unwrap_or_default().to_owned(),
    )
}

fn audit(server: &Server, key: &str, org: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut after = 0;
    loop {
        let got =
            server.call("GET", &format!("/v1/orgs/{org}/audit?after={after}&limit=1000"), Some(key), None);
        assert_eq!(got.0, 200, "{}", got.1);
        let page = got.1["events"].as_array().unwrap().clone();
        if page.is_empty() {
            return events;
        }
        after = got.1["next"].as_i64().unwrap();
        events.extend(page);
    }
}

pub fn egress_on_bubblewrap() {
    let Some(mut env) = Env::new(Backend::Sqlite) else { return };
    // Summaries come quickly, so the test sees one.
    env.set("SANDLANE_EGRESS__AUDIT_BURST", "3");
    env.set("SANDLANE_EGRESS__AUDIT_WINDOW_MS", "2000");
    let service = env.add_caller("svc-egress", "service", &["acme", "beta"]);
    let user = env.add_caller("user-egress", "user", &["acme", "beta"]);

    let world = tempfile::tempdir().unwrap();
    std::fs::write(world.path().join("page"), "hello from the outside\n").unwrap();
    let log = world.path().join("http.log");
    let (http_port, _http) = http_server(world.path(), &log);
    let (tls_port, cert, _tls) = tls_server(world.path(), "tls.test");

    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    let resolver = TableResolver(HashMap::from([
        ("allowed.test", loopback),
        ("tls.test", loopback),
        ("internal.test", "10.20.30.40".parse().unwrap()),
        ("metadata.test", "169.254.169.254".parse().unwrap()),
    ]));
    // The orgs' policies, set as an operator does: acme names the loopback range the test
    // servers listen on; beta allows the same names but names no range.
    let names = [
        format!("allowed.test:{http_port}"),
        format!("tls.test:{tls_port}"),
        "internal.test".to_owned(),
        "metadata.test".to_owned(),
        // Only for sandboxes acting for a service caller.
        "svc-only.test@service".to_owned(),
    ];
    // A rule that could never match is refused, naming the form that works; nothing is
    // written.
    for (rule, form) in [("127.0.0.1:8080", "127.0.0.1/32:8080"), ("[::1]:8080@user", "::1/128:8080@user")] {
        let (code, out, err) = env.cli(&["org", "set", "acme", "--egress-allow", rule]);
        assert_eq!(code, 2, "org set {rule}: {out}{err}");
        assert!(
            err.contains(&format!(
                "egress_allow: an address is written as a range ADDRESS/PREFIX, or it never matches: {form} (got {rule:?})"
            )),
            "{err}"
        );
    }
    let (code, shown, _) = env.cli(&["org", "show", "acme"]);
    assert_eq!(code, 0);
    assert_eq!(serde_json::from_str::<Value>(&shown).unwrap()["version"], 0, "nothing was written: {shown}");
    for (org, extra) in [("acme", Some("127.0.0.0/8")), ("beta", None)] {
        let mut args = vec!["org", "set", org];
        for rule in names.iter().map(String::as_str).chain(extra) {
            args.extend(["--egress-allow", rule]);
        }
        let (code, out, err) = env.cli(&args);
        assert_eq!(code, 0, "org set: {out}{err}");
        assert!(out.contains("127.0.0.0/8") == extra.is_some(), "{out}");
    }
    let overrides = app::compose::Overrides { resolver: Some(Arc::new(resolver)) };
    let server = Server::start_with(&env, overrides);

    let id = ensure(&server, &user, "acme", "egress-1");
    let run = |script: &str| out(&sh(&server, &user, "acme", &id, script));

    // The environment names the proxy.
    let (code, vars, _) = run("env | grep -i _proxy= | sort");
    assert_eq!(code, 0);
    assert!(vars.contains("HTTPS_PROXY=http://127.0.0.1:3128\n"), "{vars}");
    assert!(vars.contains("no_proxy=localhost,127.0.0.1,::1\n"), "{vars}");

    // HTTPS through CONNECT, TLS end to end: curl checks the certificate of tls.test.
    let (code, _, err) = run(&format!("printf '%s' '{cert}' > ca.pem"));
    assert_eq!(code, 0, "{err}");
    let (code, page, err) =
        run(&format!("curl -sS --max-time 20 --cacert ca.pem https://tls.test:{tls_port}/page"));
    assert_eq!((code, page.as_str()), (0, "hello from the outside\n"), "{err}");
    // Plain HTTP in absolute form.
    let (code, page, err) = run(&format!("curl -sS --max-time 20 http://allowed.test:{http_port}/page"));
    assert_eq!((code, page.as_str()), (0, "hello from the outside\n"), "{err}");

    // A host not allowed: a clear refusal, by the proxy.
    let (code, body, err) = run("curl -sS --max-time 20 -D - http://denied.test/page");
    assert_eq!(code, 0, "{err}");
    assert!(body.starts_with("HTTP/1.1 403"), "{body}");
    assert!(body.contains("x-sandlane-egress: refused"), "{body}");
    assert!(
        body.contains(
            "sandlane egress: denied.test:80 is not in the egress allowlist of org acme for user callers"
        ),
        "{body}"
    );
    let (code, _, err) = run("curl -sS --max-time 20 https://denied.test/");
    assert_eq!(code, 56, "curl's 'failure receiving network data' (the CONNECT refused): {err}");
    assert!(err.contains("403"), "{err}");
    // An allowed port only: the HTTP server's host on another port is refused.
    let (_, body, _) = run(&format!("curl -sS --max-time 20 http://allowed.test:{tls_port}/page"));
    assert!(body.contains("is not in the egress allowlist"), "{body}");

    // An allowed name that resolves into a refused range is refused, naming the range.
    let (_, body, _) = run("curl -sS --max-time 20 http://internal.test/");
    assert!(
        body.contains("internal.test resolves only to addresses no sandbox may reach: 10.20.30.40 (private"),
        "{body}"
    );
    let (_, body, _) = run("curl -sS --max-time 20 http://metadata.test/latest/meta-data/");
    assert!(body.contains("169.254.169.254 (link-local"), "{body}");
    // A rule for service callers only does not hold for this sandbox (its token is a user's).
    let (_, body, _) = run("curl -sS --max-time 20 http://svc-only.test/");
    assert!(
        body.contains("svc-only.test:80 is not in the egress allowlist of org acme for user callers"),
        "{body}"
    );
    // An address literal is held to the same rules.
    let (_, body, _) = run("curl -sS --max-time 20 http://10.20.30.40/");
    assert!(body.contains("10.20.30.40:80 is not in the egress allowlist"), "{body}");

    // A raw socket to the servers' port fails: the sandbox has only its own loopback.
    let hits_before = std::fs::read_to_string(&log).unwrap().matches("GET /page").count();
    let (code, _, err) =
        run(&format!("curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:{http_port}/page"));
    assert_eq!(code, 7, "curl's 'cannot connect': {err}");
    let (code, _, err) = run(&format!("bash -c 'echo hi > /dev/tcp/127.0.0.1/{tls_port}'"));
    assert_ne!(code, 0, "{err}");
    assert_eq!(std::fs::read_to_string(&log).unwrap().matches("GET /page").count(), hits_before);
    assert_eq!(hits_before, 1, "exactly the one proxied request reached the HTTP server");

    // The default refuses loopback: org beta allows the same names but no address range.
    let beta = ensure(&server, &user, "beta", "egress-2");
    let (_, body, _) = out(&sh(
        &server,
        &user,
        "beta",
        &beta,
        &format!("curl -sS --max-time 20 http://allowed.test:{http_port}/page"),
    ));
    assert!(
        body.contains("allowed.test resolves only to addresses no sandbox may reach: 127.0.0.1 (loopback"),
        "{body}"
    );

    // Hammering one host: a burst of events, then a summary with the count.
    let (code, _, err) =
        run("for i in 1 2 3 4 5 6 7 8 9; do curl -s -o /dev/null --max-time 5 http://hammer.test/; done");
    assert_eq!(code, 0, "{err}");

    // The audit: each destination, with the caller whose token the sandbox holds.
    let deadline = Instant::now() + Duration::from_secs(20);
    let events = loop {
        let events = audit(&server, &service, "acme");
        if events.iter().any(|e| e["action"] == "egress_summary") || Instant::now() > deadline {
            break events;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let egress: Vec<&Value> = events.iter().filter(|e| e["action"] == "egress").collect();
    let has = |outcome: &str, message: &str| {
        egress.iter().any(|e| e["outcome"] == outcome && e["message"].as_str().unwrap().starts_with(message))
    };
    assert!(
        has("allowed", &format!("connect tls.test:{tls_port}: allowed by tls.test:{tls_port}")),
        "{egress:#?}"
    );
    assert!(has("allowed", &format!("http allowed.test:{http_port}: allowed by")), "{egress:#?}");
    assert!(has("refused", "http denied.test:80: refused: denied.test:80 is not in"), "{egress:#?}");
    assert!(has("refused", "connect denied.test:443: refused"), "{egress:#?}");
    assert!(has("refused", "http internal.test:80: refused: internal.test resolves only"), "{egress:#?}");
    for e in &egress {
        assert_eq!(
            (e["caller_id"].as_str(), e["caller_class"].as_str()),
            (Some("user-egress"), Some("user"))
        );
        assert_eq!(e["sandbox_id"].as_str(), Some(id.as_str()));
    }
    let one_by_one =
        egress.iter().filter(|e| e["message"].as_str().unwrap().starts_with("http hammer.test:80:")).count();
    assert_eq!(one_by_one, 3, "the burst, then counted");
    let summary = events.iter().find(|e| e["action"] == "egress_summary").expect("a summary");
    assert_eq!(summary["outcome"], "refused");
    assert!(
        summary["message"].as_str().unwrap().starts_with("6 more refused decisions for hammer.test:80"),
        "{summary}"
    );

    // Refusals are counted in the metrics, by org (for a service caller of the orgs).
    let (status, metrics) = server.get_text_as("/metrics", Some(&service));
    assert_eq!(status, 200);
    assert!(
        metrics.contains("sandlane_org_egress_refusals_total{org=\"acme\",reason=\"not_allowed\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("sandlane_org_egress_refusals_total{org=\"beta\",reason=\"refused_address\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("sandlane_org_egress_allowed_total{org=\"acme\"} 2"), "{metrics}");

    // The log, egress events included, verifies.
    let mut server = server;
    assert!(server.stop(), "the server stops cleanly");
    let (code, stdout, stderr) = env.cli(&["audit", "verify"]);
    assert_eq!(code, 0, "audit verify: {stdout}{stderr}");
    assert!(stdout.contains("intact"), "{stdout}");
}
