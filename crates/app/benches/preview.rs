//! The preview ports benchmark (issue 37): a sandbox's port reached through the server's
//! preview host, beside the same port reached from inside the sandbox, through a real
//! `sandlane serve` (SQLite, bubblewrap), printed as one table and written into
//! `BENCHMARKS.md` by `scripts/bench.sh`.
//!
//! The server inside is `tests/it/preview_app.py` (Python's `http.server`); the client is
//! curl on both sides, with its own timings (`-w`): inside, `curl --noproxy '*'` to
//! `127.0.0.1:PORT` in the sandbox (run by an exec, the timings printed by curl itself);
//! outside, curl on the host to the server's listener with the preview host in `Host` and
//! the caller key in `Authorization`. Rounds interleave the two.
//!
//! - 10 MiB download: median MiB/s of each side, and their ratio (target ≥ 0.7).
//! - First byte of a small answer (`time_starttransfer`): p50 of each side, and the
//!   difference (target ≤ 1 ms added).
//!
//! `cargo bench -p app --bench preview -- [--smoke] [--out FILE]`: `--smoke` (tiny counts,
//! part of the test command) writes nothing; `--out` prints the table into FILE too.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod support;
use support::{Row, Served, quantile, table};

const ORG: &str = "bench";
const MIB: usize = 1 << 20;
const PORT: u16 = 8000;

/// A `sandlane serve` on its own data dir (SQLite, bubblewrap).
struct Server {
    served: Served,
    address: String,
    key: String,
}

impl Server {
    fn start() -> Self {
        let served = Served::start("sandlane-bench-preview-", "svc-bench", ORG, &[]);
        Self { address: served.address.clone(), key: served.key.clone(), served }
    }

    fn agent() -> ureq::Agent {
        Served::agent()
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    fn auth(&self) -> String {
        format!("Bearer {}", self.key)
    }

    fn ensure(&self) -> String {
        let mut r = Self::agent()
            .put(&self.url(&format!("/v1/orgs/{ORG}/sessions/bench/sandbox")))
            .header("authorization", &self.auth())
            .send_json(json!({"execution_id": "e-bench"}))
            .expect("ensure");
        let body: Value = r.body_mut().read_json().expect("ensure body");
        assert_eq!(body["outcome"], "ready", "ensure: {body}");
        body["sandbox"]["id"].as_str().unwrap().to_owned()
    }

    fn upload(&self, sandbox: &str, name: &str, bytes: &[u8]) {
        let r = Self::agent()
            .put(&self.url(&format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/files?path=/workspace/{name}")))
            .header("authorization", &self.auth())
            .content_type("application/octet-stream")
            .send(bytes)
            .expect("upload");
        assert!(r.status().is_success(), "upload: {}", r.status());
    }

    fn start_process(&self, sandbox: &str, argv: Value) {
        let r = Self::agent()
            .post(&self.url(&format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/processes")))
            .header("authorization", &self.auth())
            .send_json(json!({"argv": argv}))
            .expect("start a process");
        assert_eq!(r.status().as_u16(), 201);
    }

    /// A shell script in the sandbox: its standard output.
    fn sh(&self, sandbox: &str, script: &str) -> String {
        let mut r = Self::agent()
            .post(&self.url(&format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/exec")))
            .header("authorization", &self.auth())
            .send_json(json!({"argv": ["sh", "-c", script], "timeout_ms": 600_000}))
            .expect("exec");
        let body: Value = r.body_mut().read_json().expect("exec body");
        assert_eq!(body["exit_code"], 0, "{script}: {body}");
        body["stdout"].as_str().unwrap().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Self::agent()
            .delete(&self.url(&format!("/v1/orgs/{ORG}/sessions/bench/sandbox")))
            .header("authorization", &self.auth())
            .call();
        self.served.stop();
    }
}

/// curl's `-w` timings, one line per request: (bytes, time_starttransfer s, time_total s).
const FORMAT: &str = "%{size_download} %{time_starttransfer} %{time_total}\\n";

fn timings(out: &str) -> Vec<(usize, f64, f64)> {
    out.lines()
        .map(|l| {
            let mut f = l.split_whitespace();
            let bytes = f.next().unwrap().parse().unwrap();
            (bytes, f.next().unwrap().parse().unwrap(), f.next().unwrap().parse().unwrap())
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let (rounds, per_round, download) = if smoke { (1, 3, MIB) } else { (10, 10, 10 * MIB) };
    let step = |s: &str| eprintln!("preview bench: {s}");

    let server = Server::start();
    let sandbox = server.ensure();
    server.upload(&sandbox, "preview_app.py", include_bytes!("../../../tests/it/preview_app.py"));
    server.start_process(&sandbox, json!(["python3", "/workspace/preview_app.py", PORT.to_string()]));
    let host = format!("{PORT}-{}.preview.localhost", sandbox.to_ascii_lowercase().replace('_', "-"));
    let outside = |path: &str, n: usize| -> Vec<(usize, f64, f64)> {
        let mut all = Vec::new();
        for _ in 0..n {
            let got = Command::new("curl")
                .args(["-s", "-o", "/dev/null", "--noproxy", "*", "-w", &FORMAT.replace("\\n", "\n")])
                .args(["-H", &format!("Host: {host}"), "-H", &format!("Authorization: {}", server.auth())])
                .arg(server.url(path))
                .output()
                .expect("curl (Debian: apt-get install curl)");
            all.extend(timings(&String::from_utf8_lossy(&got.stdout)));
        }
        all
    };
    let inside = |path: &str, n: usize| -> Vec<(usize, f64, f64)> {
        let script = format!(
            "for i in $(seq {n}); do curl -s -o /dev/null --noproxy '*' -w '{FORMAT}' \
             'http://127.0.0.1:{PORT}{path}'; done"
        );
        timings(&server.sh(&sandbox, &script))
    };
    // The server inside is up when a request through the preview answers 200.
    let deadline = Instant::now() + Duration::from_secs(30);
    while outside("/bytes?n=1", 1).first().is_none_or(|(bytes, _, _)| *bytes != 1) {
        assert!(Instant::now() < deadline, "the server inside did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Warm-up of both paths.
    let _ = (outside("/bytes?n=1", 3), inside("/bytes?n=1", 3));

    step(&format!("{rounds} rounds of {per_round} downloads of {} MiB each way", download / MIB));
    let path = format!("/bytes?n={download}");
    let (mut thr_in, mut thr_out) = (Vec::new(), Vec::new());
    let (mut first_in, mut first_out) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (bytes, _, total) in inside(&path, per_round) {
            assert_eq!(bytes, download, "every byte came inside (positive control)");
            thr_in.push(bytes as f64 / MIB as f64 / total);
        }
        for (bytes, _, total) in outside(&path, per_round) {
            assert_eq!(bytes, download, "every byte came through the preview");
            thr_out.push(bytes as f64 / MIB as f64 / total);
        }
        first_in.extend(inside("/bytes?n=1", per_round).into_iter().map(|(_, first, _)| first * 1e3));
        first_out.extend(outside("/bytes?n=1", per_round).into_iter().map(|(_, first, _)| first * 1e3));
    }
    let (tin, tout) = (quantile(&mut thr_in, 0.5), quantile(&mut thr_out, 0.5));
    let ratio = tout / tin;
    let (fin, fout) = (quantile(&mut first_in, 0.5), quantile(&mut first_out, 0.5));
    let (fin99, fout99) = (quantile(&mut first_in, 0.99), quantile(&mut first_out, 0.99));
    let added = fout - fin;
    let rows = vec![
        Row {
            what: format!(
                "{} MiB download from a sandbox's port: through the preview host beside from inside the sandbox \
                 (median of {} each)",
                download / MIB,
                thr_in.len()
            ),
            result: format!("{tout:.0} MiB/s vs {tin:.0} MiB/s: {ratio:.2}×"),
            target: "≥ 0.7×".into(),
            met: Some(ratio >= 0.7),
        },
        Row {
            what: format!(
                "first byte of a 1-byte answer (curl's time_starttransfer), p50 (p99) of {} each",
                first_in.len()
            ),
            result: format!(
                "{fout:.2} ms ({fout99:.2}) vs {fin:.2} ms ({fin99:.2}) inside: +{added:.2} ms at p50"
            ),
            target: "≤ +1 ms".into(),
            met: Some(added <= 1.0),
        },
    ];

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
        "Machine: {machine}. One `sandlane serve` (SQLite, bubblewrap); one sandbox running Python's \
         `http.server` (tests/it/preview_app.py) on port {PORT}; curl on both sides with its own timings, a new \
         connection per request; through the preview: a caller key, the connection to the sandbox's port handed \
         over by its supervisor. {rounds} interleaved rounds.\n"
    );
    section.push_str(&table("P", &rows));
    println!("\n{section}");
    if let Some(path) = out {
        std::fs::write(&path, &section).expect("write the section");
        eprintln!("preview bench: wrote {path}");
    }
}
