//! The streams benchmark (issue 13): what an agent does inside its sandbox, measured
//! through a real `sandlane serve` (SQLite, bubblewrap) in one run, printed as one table
//! and written into `BENCHMARKS.md` by `scripts/bench.sh`.
//!
//! - First stdout frame latency: a streamed exec whose command prints the wall clock
//!   (`date +%s%N`, the kernel's clock the host shares) after a short sleep; the client
//!   reads the first NDJSON line and takes the clock again. p50 and p99 of the difference.
//! - Upload and download of 64 MiB through the files API beside `cat > file` and `cat
//!   file` on the same disk (a directory beside the server's data dir), interleaved, each
//!   pair in one round; medians of MiB/s and their ratio.
//! - Server RSS while 1 GiB of output streams through it (NDJSON read and dropped by the
//!   client), sampled every 10 ms, beside its idle RSS just before.
//!
//! `cargo bench -p app --bench streams -- [--smoke] [--out FILE]`: `--smoke` (tiny sizes,
//! part of the test command) writes nothing; `--out` prints the table into FILE too.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

mod support;
use support::{Row, Served, quantile, table};

const ORG: &str = "bench";
const MIB: u64 = 1 << 20;

struct Counts {
    latency_rounds: usize,
    transfer_rounds: usize,
    transfer_bytes: usize,
    stream_bytes: u64,
}

/// A `sandlane serve` on its own data dir (SQLite, bubblewrap).
struct Server {
    served: Served,
    base: String,
    key: String,
}

impl Server {
    fn start(output_cap: u64, file_cap: u64) -> Self {
        let caps = [
            ("SANDLANE_BWRAP__OUTPUT_CAP_BYTES", output_cap.to_string()),
            ("SANDLANE_STREAMS__MAX_FILE_BYTES", file_cap.to_string()),
        ];
        let served = Served::start("sandlane-bench-streams-", "svc-bench", ORG, &caps);
        Self { base: served.base(), key: served.key.clone(), served }
    }

    fn rss(&self) -> u64 {
        rss_of(self.served.child.id())
    }

    fn agent() -> ureq::Agent {
        Served::agent()
    }

    fn auth(&self) -> String {
        format!("Bearer {}", self.key)
    }

    fn ensure(&self, session: &str) -> String {
        let mut r = Self::agent()
            .put(&format!("{}/v1/orgs/{ORG}/sessions/{session}/sandbox", self.base))
            .header("authorization", &self.auth())
            .send_json(json!({"execution_id": "e-bench"}))
            .expect("ensure");
        let body: Value = r.body_mut().read_json().expect("ensure body");
        assert_eq!(body["outcome"], "ready", "ensure: {body}");
        body["sandbox"]["id"].as_str().unwrap().to_owned()
    }

    /// A streamed exec: the response's lines, as they come.
    fn exec_lines(&self, sandbox: &str, script: &str) -> impl Iterator<Item = String> + use<> {
        let response = Self::agent()
            .post(&format!("{}/v1/orgs/{ORG}/sandboxes/{sandbox}/exec", self.base))
            .header("authorization", &self.auth())
            .header("accept", "application/x-ndjson")
            .send_json(json!({"argv": ["sh", "-c", script], "timeout_ms": 600_000}))
            .expect("exec");
        assert_eq!(response.status().as_u16(), 200);
        BufReader::with_capacity(1 << 16, response.into_body().into_reader())
            .lines()
            .map(|l| l.expect("a line"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The sandboxes end with their records; then the server stops.
        let _ = Self::agent()
            .delete(&format!("{}/v1/orgs/{ORG}/sessions/bench/sandbox", self.base))
            .header("authorization", &self.auth())
            .call();
        self.served.stop();
    }
}

fn rss_of(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_nanos()
}

fn mib_per_s(bytes: usize, d: Duration) -> f64 {
    bytes as f64 / MIB as f64 / d.as_secs_f64()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let c = if smoke {
        Counts {
            latency_rounds: 3,
            transfer_rounds: 1,
            transfer_bytes: (4 * MIB) as usize,
            stream_bytes: 16 * MIB,
        }
    } else {
        Counts {
            latency_rounds: 200,
            transfer_rounds: 10,
            transfer_bytes: (64 * MIB) as usize,
            stream_bytes: 1 << 30,
        }
    };
    let step = |s: &str| eprintln!("streams bench: {s}");
    let server = Server::start(c.stream_bytes + MIB, 2 * c.transfer_bytes as u64);
    let sandbox = server.ensure("bench");
    let mut rows = Vec::new();

    // S1: the first stdout frame after the process writes.
    step("first frame latency");
    let mut lags = Vec::with_capacity(c.latency_rounds);
    for _ in 0..c.latency_rounds {
        let mut lines = server.exec_lines(&sandbox, "sleep 0.02; date +%s%N");
        let first = lines.next().expect("a first line");
        let read_at = now_ns();
        let frame: Value = serde_json::from_str(&first).expect("JSON");
        let printed: u128 = frame["text"].as_str().expect("text").trim().parse().expect("nanoseconds");
        lags.push(read_at.saturating_sub(printed) as f64 / 1e6);
        assert!(lines.any(|l| l.contains("\"exit\"")), "the command ends");
    }
    let (p50, p99) = (quantile(&mut lags, 0.5), quantile(&mut lags, 0.99));
    rows.push(Row {
        what: "streamed exec: first stdout frame read by the client after the process wrote it (its clock \
               beside the client's)"
            .into(),
        result: format!("p50 {p50:.2} ms, p99 {p99:.2} ms ({} runs)", lags.len()),
        target: "p50 ≤ 5 ms".into(),
        met: Some(p50 <= 5.0),
    });

    // S2, S3: 64 MiB up and down through the files API, beside cat on the same disk.
    step("transfers");
    let disk = server.served.data.path().join("cat");
    std::fs::create_dir_all(&disk).expect("a directory for cat");
    let mut payload = vec![0u8; c.transfer_bytes];
    std::fs::File::open("/dev/urandom").unwrap().read_exact(&mut payload).unwrap();
    let files =
        format!("{}/v1/orgs/{ORG}/sandboxes/{sandbox}/files?path=/workspace/payload.bin", server.base);
    let (mut up, mut cat_up, mut down, mut cat_down) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..c.transfer_rounds {
        // Alternate which goes first in each pair.
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                let t = Instant::now();
                let r = Server::agent()
                    .put(&files)
                    .header("authorization", &server.auth())
                    .send(&payload[..])
                    .expect("upload");
                assert_eq!(r.status().as_u16(), 200, "upload");
                up.push(mib_per_s(payload.len(), t.elapsed()));
            } else {
                let t = Instant::now();
                let mut cat = Command::new("cat")
                    .stdin(Stdio::piped())
                    .stdout(std::fs::File::create(disk.join("payload.bin")).unwrap())
                    .spawn()
                    .expect("cat >");
                cat.stdin.take().unwrap().write_all(&payload).unwrap();
                assert!(cat.wait().unwrap().success());
                cat_up.push(mib_per_s(payload.len(), t.elapsed()));
            }
        }
        for k in 0..2 {
            if (round + k) % 2 == 0 {
                let t = Instant::now();
                let mut r = Server::agent()
                    .get(&files)
                    .header("authorization", &server.auth())
                    .call()
                    .expect("download");
                let mut got = 0usize;
                let mut reader = r.body_mut().as_reader();
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = reader.read(&mut buf).expect("download body");
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                assert_eq!(got, payload.len(), "the whole file");
                down.push(mib_per_s(got, t.elapsed()));
            } else {
                let t = Instant::now();
                let mut cat =
                    Command::new("cat").arg(disk.join("payload.bin")).stdout(Stdio::piped()).spawn().unwrap();
                let mut got = Vec::with_capacity(payload.len());
                cat.stdout.take().unwrap().read_to_end(&mut got).unwrap();
                assert!(cat.wait().unwrap().success());
                assert_eq!(got.len(), payload.len());
                cat_down.push(mib_per_s(got.len(), t.elapsed()));
            }
        }
    }
    let size = c.transfer_bytes as u64 / MIB;
    for (name, api, cat, cat_what) in [
        ("upload", &mut up, &mut cat_up, "`cat > file`"),
        ("download", &mut down, &mut cat_down, "`cat file`"),
    ] {
        let (a, b) = (quantile(api, 0.5), quantile(cat, 0.5));
        let ratio = a / b;
        rows.push(Row {
            what: format!("{name} of {size} MiB through the files API beside {cat_what} on the same disk"),
            result: format!(
                "{a:.0} MiB/s vs {b:.0} MiB/s = {ratio:.2}× (medians of {} interleaved rounds)",
                api.len()
            ),
            target: "≥ 0.4×".into(),
            met: Some(ratio >= 0.4),
        });
    }

    // S4: RSS while 1 GiB of output streams through the server.
    step("1 GiB of output");
    std::thread::sleep(Duration::from_millis(500));
    let idle = server.rss();
    let peak = Arc::new(AtomicU64::new(idle));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, pid) = (peak.clone(), done.clone(), server.served.child.id());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_of(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let script = format!(
        "yes 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ | head -c {}",
        c.stream_bytes
    );
    let t = Instant::now();
    let mut streamed = 0u64;
    let mut exit = Value::Null;
    for line in server.exec_lines(&sandbox, &script) {
        let frame: Value = serde_json::from_str(&line).expect("JSON");
        match frame["type"].as_str() {
            Some("stdout") => streamed += frame["text"].as_str().map_or(0, str::len) as u64,
            Some("exit") => exit = frame,
            other => panic!("unexpected frame {other:?}: {line}"),
        }
    }
    let took = t.elapsed();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(streamed, c.stream_bytes, "every byte came through (positive control): {exit}");
    assert_eq!(exit["truncated"], false, "{exit}");
    let peak = peak.load(Ordering::Relaxed);
    let grew = peak.saturating_sub(idle);
    let mb = |b: u64| b as f64 / 1e6;
    rows.push(Row {
        what: format!(
            "server RSS while {} MiB of output streams through it ({:.0} MiB/s), beside idle",
            c.stream_bytes / MIB,
            c.stream_bytes as f64 / MIB as f64 / took.as_secs_f64()
        ),
        result: format!("peak {:.1} MB vs idle {:.1} MB: +{:.1} MB", mb(peak), mb(idle), mb(grew)),
        target: "≤ +20 MB".into(),
        met: Some(grew <= 20_000_000),
    });

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
        "Machine: {machine}. One `sandlane serve` (SQLite, bubblewrap); one sandbox; HTTP client ureq 3 \
         (blocking). The cat baselines run on the host into a directory beside the server's data dir (the same \
         disk as the sandbox's workspace).\n"
    );
    section.push_str(&table("S", &rows));
    println!("\n{section}");
    if let Some(path) = out {
        std::fs::write(&path, &section).expect("write the section");
        eprintln!("streams bench: wrote {path}");
    }
}
