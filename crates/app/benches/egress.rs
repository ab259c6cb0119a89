//! The egress benchmark (issue 15): what the proxy costs, measured side by side in one
//! run, interleaved, and written into `BENCHMARKS.md` by `scripts/bench.sh`.
//!
//! One server (`app::server::Server`, SQLite, bubblewrap; in this process, so its
//! resolver can name `bench.test` as 127.0.0.1) and one sandbox, the org's policy allowing
//! `bench.test` on the upstream's port and naming the loopback range; an HTTP server on the
//! host's loopback (hyper, in this process, on a runtime of its own) stands in for the
//! outside world. `curl` does every request and reports its own timings (`-w`), on the
//! host straight to the server and inside the sandbox through the proxy its environment
//! names, so the exec around it is not measured. Each round runs a batch on the host,
//! then the same batch in the sandbox.
//!
//! - Latency: a small GET on a new connection each time, `time_total`, p50 and p99; the
//!   proxied one through a `CONNECT` tunnel (`curl -p`, as HTTPS goes) and as a plain
//!   forwarded request.
//! - Throughput: a 10 MiB download, `speed_download`, medians and their ratio, both ways.
//! - For reference (no target): the same download on the host through a minimal relay
//!   (two threads copying between two sockets), the cost of any byte relay in user space
//!   on this machine, measured in the same rounds.
//!
//! `cargo bench -p app --bench egress -- [--smoke] [--out FILE]`.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::collections::HashMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::Arc;

use serde_json::{Value, json};

mod support;
use support::quantile;

const ORG: &str = "bench";
const MIB: usize = 1 << 20;

struct Resolver;

#[async_trait::async_trait]
impl ports::Resolver for Resolver {
    async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ports::ResolveError> {
        match host {
            "bench.test" => Ok(vec![IpAddr::from([127, 0, 0, 1])]),
            other => Err(ports::ResolveError(format!("{other} does not resolve"))),
        }
    }
}

/// The upstream: `/small` (2 bytes) and `/big` (`big` bytes), served by hyper.
async fn upstream(big: usize) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let body = bytes::Bytes::from(vec![b'x'; big]);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let body = body.clone();
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                        let body = if request.uri().path() == "/big" {
                            body.clone()
                        } else {
                            bytes::Bytes::from_static(b"ok")
                        };
                        async move {
                            Ok::<_, std::convert::Infallible>(hyper::Response::new(
                                http_body_util::Full::new(body),
                            ))
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    port
}

/// A minimal relay on the host: each connection to it gets a connection to `to`, and two
/// threads copy between them in 256 KiB chunks (no sandbox, no policy, no HTTP): what a
/// byte relay in user space costs on this machine, whoever writes it.
fn minimal_relay(to: u16) -> u16 {
    use std::io::{Read, Write};
    fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
        let mut buf = vec![0u8; 256 << 10];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(upstream) = std::net::TcpStream::connect(("127.0.0.1", to)) else { continue };
            let _ = (client.set_nodelay(true), upstream.set_nodelay(true));
            let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else { continue };
            std::thread::spawn(move || pump(client, upstream));
            std::thread::spawn(move || pump(upstream2, client2));
        }
    });
    port
}

/// `curl` `n` times with `args`, one line of `-w` values each.
fn curl_script(n: usize, args: &str, url: &str, format: &str) -> String {
    format!(
        "for i in $(seq {n}); do curl -sS -o /dev/null --max-time 60 -w '{format}\\n' {args} {url} || exit 1; done"
    )
}

fn parse(lines: &str) -> Vec<f64> {
    lines.lines().map(|l| l.trim().parse::<f64>().unwrap_or_else(|_| panic!("a number: {l:?}"))).collect()
}

fn host(script: &str) -> String {
    let out = Command::new("sh").args(["-c", script]).output().expect("sh");
    assert!(out.status.success(), "host: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

struct Client {
    base: String,
    key: String,
}

impl Client {
    fn agent() -> ureq::Agent {
        ureq::Agent::config_builder().http_status_as_error(false).build().new_agent()
    }

    fn call(&self, method: &str, path: &str, body: Value) -> Value {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.key);
        let agent = Self::agent();
        let mut response = match method {
            "PUT" => agent.put(&url).header("authorization", &auth).send_json(body),
            "POST" => agent.post(&url).header("authorization", &auth).send_json(body),
            _ => agent.delete(&url).header("authorization", &auth).call(),
        }
        .expect("call");
        response.body_mut().read_json().unwrap_or(Value::Null)
    }

    fn sandbox(&self, id: &str, script: &str) -> String {
        let got = self.call(
            "POST",
            &format!("/v1/orgs/{ORG}/sandboxes/{id}/exec"),
            json!({"argv": ["sh", "-c", script], "timeout_ms": 600_000}),
        );
        assert_eq!(got["exit_code"], 0, "sandbox: {got}");
        got["stdout"].as_str().unwrap().to_owned()
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let (rounds, batch, big) = if smoke { (1, 2, 64 << 10) } else { (10, 10, 10 * MIB) };
    let batch = std::env::var("BENCH_BATCH").ok().and_then(|b| b.parse().ok()).unwrap_or(batch);

    let data = tempfile::Builder::new().prefix("sandlane-bench-egress-").tempdir().expect("temp dir");
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let bin = env!("CARGO_BIN_EXE_sandlane");
    let supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    let vars: HashMap<String, String> = [
        ("SANDLANE_DATA_DIR", data.path().join("data").display().to_string()),
        ("SANDLANE_LISTEN", "127.0.0.1:0".to_owned()),
        ("SANDLANE_SUPERVISOR_PROGRAM", supervisor.display().to_string()),
        // The run moves a few GiB; the default allowance (1 GiB) would end it.
        ("SANDLANE_EGRESS__MAX_BYTES_PER_SANDBOX", (1u64 << 40).to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let cli = Command::new(bin)
        .args(["caller", "add", "--id", "svc-bench", "--class", "service", "--org", ORG])
        .envs(vars.iter())
        .output()
        .expect("caller add");
    assert!(cli.status.success(), "caller add: {}", String::from_utf8_lossy(&cli.stderr));
    let key = String::from_utf8_lossy(&cli.stdout).trim().to_owned();

    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    // The outside world runs on threads of its own: on the server's, its writes and the
    // proxy's relay would take turns on the same two workers, which no real destination
    // does (measured: 0.58-0.61x sharing them, 0.62-0.65x apart, interleaved).
    let outside = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("upstream")
        .enable_all()
        .build()
        .expect("upstream runtime");
    let port = outside.block_on(upstream(big));
    // The org's policy, as an operator sets it: the upstream's name and port, and the
    // loopback range it listens on named explicitly.
    let allow = format!("bench.test:{port}");
    let cli = Command::new(bin)
        .args(["org", "set", ORG, "--egress-allow", &allow, "--egress-allow", "127.0.0.0/8"])
        .envs(vars.iter())
        .output()
        .expect("org set");
    assert!(cli.status.success(), "org set: {}", String::from_utf8_lossy(&cli.stderr));
    let settings = app::config::Settings::load(None, &vars).expect("settings");
    let overrides = app::compose::Overrides { resolver: Some(Arc::new(Resolver)) };
    let server = runtime.block_on(app::server::Server::build_with(settings, overrides)).expect("server");
    let client = Client { base: format!("http://{}", server.local_addr()), key };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = runtime.spawn(server.run_until(async move {
        let _ = stopped.await;
    }));

    let got = client.call(
        "PUT",
        &format!("/v1/orgs/{ORG}/sessions/bench/sandbox"),
        json!({"execution_id": "e-bench"}),
    );
    assert_eq!(got["outcome"], "ready", "ensure: {got}");
    let id = got["sandbox"]["id"].as_str().unwrap().to_owned();
    // Positive control, and the proxy served before anything is timed.
    let page = client.sandbox(&id, &format!("curl -sS --max-time 30 http://bench.test:{port}/small"));
    assert_eq!(page, "ok");

    let direct = format!("http://127.0.0.1:{port}");
    let relayed = format!("http://127.0.0.1:{}", minimal_relay(port));
    let proxied = format!("http://bench.test:{port}");
    let mut series: HashMap<&str, Vec<f64>> = HashMap::new();
    for round in 0..rounds {
        eprintln!("egress bench: round {}/{rounds}", round + 1);
        let lat = "%{time_total}";
        let speed = "%{speed_download}";
        let mut add = |name, text: String| series.entry(name).or_default().extend(parse(&text));
        add("host latency", host(&curl_script(batch, "", &format!("{direct}/small"), lat)));
        add(
            "tunnel latency",
            client.sandbox(&id, &curl_script(batch, "-p", &format!("{proxied}/small"), lat)),
        );
        add(
            "forward latency",
            client.sandbox(&id, &curl_script(batch, "", &format!("{proxied}/small"), lat)),
        );
        add("host speed", host(&curl_script(batch, "", &format!("{direct}/big"), speed)));
        add("relay speed", host(&curl_script(batch, "", &format!("{relayed}/big"), speed)));
        add("tunnel speed", client.sandbox(&id, &curl_script(batch, "-p", &format!("{proxied}/big"), speed)));
        add("forward speed", client.sandbox(&id, &curl_script(batch, "", &format!("{proxied}/big"), speed)));
    }
    client.call("DELETE", &format!("/v1/orgs/{ORG}/sessions/bench/sandbox"), Value::Null);
    let _ = stop.send(());
    runtime.block_on(served).expect("join").expect("the server stopped cleanly");

    let mut take = |name: &str| series.remove(name).unwrap_or_default();
    let (mut host_lat, mut tunnel_lat, mut forward_lat) =
        (take("host latency"), take("tunnel latency"), take("forward latency"));
    let (mut host_speed, mut tunnel_speed, mut forward_speed, mut relay_speed) =
        (take("host speed"), take("tunnel speed"), take("forward speed"), take("relay speed"));
    let n = host_lat.len();
    let ms = |s: f64| s * 1000.0;
    let host_p50 = ms(quantile(&mut host_lat, 0.5));
    let host_p99 = ms(quantile(&mut host_lat, 0.99));
    let mut rows: Vec<(String, String, String, Option<bool>)> = Vec::new();
    for (how, samples) in [
        ("a CONNECT tunnel (`curl -p`, as HTTPS goes)", &mut tunnel_lat),
        ("a forwarded plain request", &mut forward_lat),
    ] {
        let (p50, p99) = (ms(quantile(samples, 0.5)), ms(quantile(samples, 0.99)));
        let added = p50 - host_p50;
        rows.push((
            format!("small GET on a new connection, through {how}, beside the host straight to the server"),
            format!("p50 {p50:.2} ms vs {host_p50:.2} ms: +{added:.2} ms; p99 {p99:.2} ms vs {host_p99:.2} ms ({n} each)"),
            "≤ +1 ms p50".into(),
            Some(added <= 1.0),
        ));
    }
    let mibs = |bps: f64| bps / MIB as f64;
    let host_mid = mibs(quantile(&mut host_speed, 0.5));
    for (how, samples) in
        [("a CONNECT tunnel", &mut tunnel_speed), ("a forwarded plain request", &mut forward_speed)]
    {
        let mid = mibs(quantile(samples, 0.5));
        let ratio = mid / host_mid;
        rows.push((
            format!(
                "{} MiB download through {how}, beside the host straight to the server",
                big / MIB.max(1)
            ),
            format!("{mid:.0} MiB/s vs {host_mid:.0} MiB/s = {ratio:.2}× (medians of {n})"),
            "≥ 0.7×".into(),
            Some(ratio >= 0.7),
        ));
    }
    let mid = mibs(quantile(&mut relay_speed, 0.5));
    rows.push((
        format!(
            "for reference: {} MiB download on the host through a minimal relay (two threads copying \
             256 KiB chunks between two sockets; no sandbox, no policy, no HTTP), beside the host straight to the server",
            big / MIB.max(1)
        ),
        format!("{mid:.0} MiB/s vs {host_mid:.0} MiB/s = {:.2}× (medians of {n})", mid / host_mid),
        "none".into(),
        None,
    ));

    let machine = format!(
        "{} CPUs; kernel {}",
        String::from_utf8_lossy(&Command::new("nproc").output().map(|o| o.stdout).unwrap_or_default()).trim(),
        String::from_utf8_lossy(
            &Command::new("uname").arg("-r").output().map(|o| o.stdout).unwrap_or_default()
        )
        .trim()
    );
    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or_else(|_| "unnamed run".into());
    let mode = if smoke { "SMOKE run (tiny sizes, not a measurement)" } else { "full run" };
    let mut section = String::new();
    let _ = writeln!(section, "Run: {run}; {mode}, release build: {}.\n", !cfg!(debug_assertions));
    let _ = writeln!(
        section,
        "Machine: {machine}. One server (SQLite, bubblewrap) and one sandbox; the upstream is hyper on the host's \
         loopback; curl's own timings (`-w`), {rounds} interleaved rounds of {batch} requests per row.\n"
    );
    section.push_str("| # | measurement | result | target | status |\n|---|---|---|---|---|\n");
    for (i, (what, result, target, met)) in rows.iter().enumerate() {
        let status = match met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        let _ = writeln!(section, "| E{} | {what} | {result} | {target} | {status} |", i + 1);
    }
    println!("\n{section}");
    if let Some(path) = out {
        std::fs::write(&path, &section).expect("write the section");
        eprintln!("egress bench: wrote {path}");
    }
}
