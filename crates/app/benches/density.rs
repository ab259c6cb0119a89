//! The density benchmark (issue 34): what each idle resident sandbox costs a `sandlane
//! serve` process and the host, and whether an ensure slows down with many live.
//!
//! One server (SQLite, the bubblewrap driver, no workspace quota images so the run needs
//! no loop device per sandbox) is taken to 10 live idle sandboxes, then to K
//! (`SANDLANE_DENSITY_K`, default 50; `--smoke`: 15); each time its egress is served (the
//! background scan's every 250 ms) before anything is read. Printed, per sandbox between
//! 10 and K: the server's RSS, threads (`/proc/<pid>/task`) and descriptors
//! (`/proc/<pid>/fd`); the host memory of the sandboxes' processes (PSS of every process
//! in their cgroups) and the drop of the host's `MemAvailable`; and the ensure p50 at K
//! beside at 10 (ensure + deprovision pairs of new sessions, `SANDLANE_DENSITY_PAIRS`,
//! default 30), one pair every `SANDLANE_DENSITY_GAP_MS` (default 100) and back to back;
//! and how many sandboxes a second the server starts, from 10 to K and over the last tenth.
//! `SANDLANE_DENSITY_SAMPLES=1` also prints every ensure's time of each set (sorted) to
//! stderr, to tell a slower ensure from a few that wait.
//! As root it raises `kernel.pid_max` and its open-files limit when K needs them. Run it with `cargo bench -p app --bench density` (release; build the
//! supervisor with `cargo build --release -p supervisor` first) or `--profile dev`; as
//! root, on a quiet machine for K in the thousands.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use ports::SandboxDriver;
use serde_json::{Value, json};

mod support;
use support::Served;

const ORG: &str = "density";

static SESSIONS: AtomicU64 = AtomicU64::new(0);

fn new_session() -> String {
    format!("s-{}", SESSIONS.fetch_add(1, Ordering::Relaxed))
}

/// A `sandlane serve` process on its own data dir and SQLite database.
struct Server {
    served: Served,
    base: String,
    key: String,
}

impl Server {
    fn start() -> Self {
        let unlimited = [("SANDLANE_POLICY__WORKSPACE_BYTES", "unlimited".to_owned())];
        let served = Served::start("sandlane-density-", "svc-density", ORG, &unlimited);
        Self { base: served.base(), key: served.key.clone(), served }
    }

    fn proc_count(&self, what: &str) -> usize {
        std::fs::read_dir(format!("/proc/{}/{what}", self.served.child.id())).map_or(0, Iterator::count)
    }

    fn rss(&self) -> u64 {
        self.served.rss()
    }

    fn sandbox_ids(&self) -> Vec<String> {
        std::fs::read_dir(self.served.data.path().join("data/sandboxes"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
            .unwrap_or_default()
    }

    fn ensure(&self, agent: &ureq::Agent, session: &str) {
        let url = format!("{}/v1/orgs/{ORG}/sessions/{session}/sandbox", self.base);
        let mut r = agent
            .put(&url)
            .header("authorization", &format!("Bearer {}", self.key))
            .send_json(json!({ "execution_id": format!("e-{session}") }))
            .expect("ensure");
        let body: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(body["outcome"], "ready", "ensure: {body}");
    }

    fn deprovision(&self, agent: &ureq::Agent, session: &str) {
        let url = format!("{}/v1/orgs/{ORG}/sessions/{session}/sandbox", self.base);
        let r = agent.delete(&url).header("authorization", &format!("Bearer {}", self.key)).call();
        assert!(r.is_ok_and(|r| r.status().as_u16() < 300), "deprovision");
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.served.stop();
        // Resident sandboxes outlive their server: end this run's with the driver itself.
        let mut config = BwrapConfig::new(self.served.data.path().join("data"));
        config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
        if let Ok(driver) = BwrapDriver::new(config)
            && let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build()
        {
            rt.block_on(async {
                for id in driver.list().await.unwrap_or_default() {
                    let _ = driver.deprovision(&id).await;
                }
            });
        }
    }
}

/// PSS in bytes of every process in the cgroups of `ids`, and how many processes.
fn sandboxes_pss(ids: &[String]) -> (u64, usize) {
    let (mut pss, mut processes) = (0, 0);
    for id in ids {
        let procs = ["pids/sandlane", "unified/sandlane", "sandlane"]
            .iter()
            .find_map(|root| std::fs::read_to_string(format!("/sys/fs/cgroup/{root}/{id}/cgroup.procs")).ok())
            .unwrap_or_default();
        for pid in procs.lines() {
            let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
            if let Some(kb) = rollup
                .lines()
                .find_map(|l| l.strip_prefix("Pss:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
            {
                pss += kb * 1024;
                processes += 1;
            }
        }
    }
    (pss, processes)
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Ensures new sessions on `clients` threads until `total` are done.
fn load(server: &Server, clients: usize, total: usize) {
    let next = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..clients {
            scope.spawn(|| {
                let agent = ureq::Agent::config_builder().build().new_agent();
                while next.fetch_add(1, Ordering::Relaxed) < total as u64 {
                    server.ensure(&agent, &new_session());
                }
            });
        }
    });
}

/// The ensure p50 over `pairs` ensure + deprovision pairs of new sessions, one pair every
/// `gap` at most (a host's steady rate of new sessions, so the driver's starts ahead are
/// refilled between them as they are in service; `0`: back to back, which measures how
/// fast sandboxes can be started instead).
fn ensure_p50(server: &Server, pairs: usize, gap: Duration) -> Duration {
    let agent = ureq::Agent::config_builder().build().new_agent();
    let mut samples: Vec<Duration> = (0..pairs)
        .map(|_| {
            let s = new_session();
            let t = Instant::now();
            server.ensure(&agent, &s);
            let took = t.elapsed();
            server.deprovision(&agent, &s);
            std::thread::sleep(gap.saturating_sub(t.elapsed()));
            took
        })
        .collect();
    samples.sort();
    if std::env::var_os("SANDLANE_DENSITY_SAMPLES").is_some() {
        let ms: Vec<String> = samples.iter().map(|d| format!("{:.1}", d.as_secs_f64() * 1e3)).collect();
        eprintln!("density bench: ensure samples (ms, sorted): {}", ms.join(" "));
    }
    samples[samples.len() / 2]
}

/// Makes room on the host for `k` sandboxes: two processes each (bubblewrap's monitor and
/// the supervisor) under `kernel.pid_max`, and one descriptor each in the server (its egress
/// proxy's socket) under its open-files limit (the server raises its soft limit to the hard
/// one it inherits; raising the hard one needs `CAP_SYS_RESOURCE`).
/// As root both are raised when short, and said so; otherwise the run stops, naming what
/// to raise.
fn make_room_for(k: usize) {
    let pids_needed = 2 * k + 4096;
    let pid_max: usize = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    if pid_max < pids_needed {
        let raised = std::fs::write("/proc/sys/kernel/pid_max", "4194304").is_ok();
        assert!(
            raised,
            "{k} sandboxes need kernel.pid_max >= {pids_needed} (it is {pid_max}): run as root or raise it"
        );
        eprintln!("density bench: raised kernel.pid_max from {pid_max} to 4194304 for {k} sandboxes");
    }
    let fds_needed = k + 4096;
    let hard = Command::new("sh").args(["-c", "ulimit -Hn"]).output().ok();
    let hard: usize =
        hard.and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(usize::MAX);
    if hard < fds_needed {
        let pid = std::process::id().to_string();
        let limit = format!("--nofile={}:{}", fds_needed.max(65_536), fds_needed.max(65_536));
        let raised =
            Command::new("prlimit").args(["--pid", &pid, &limit]).status().is_ok_and(|s| s.success());
        assert!(
            raised,
            "{k} sandboxes need an open-files limit >= {fds_needed} (it is {hard}): run as root or raise it"
        );
        eprintln!(
            "density bench: raised the open-files limit from {hard} to {} for {k} sandboxes",
            fds_needed.max(65_536)
        );
    }
}

/// What is read at one count of live sandboxes.
struct Reading {
    live: usize,
    rss: u64,
    threads: usize,
    fds: usize,
    pss: u64,
    processes: usize,
    available: u64,
}

fn read(server: &Server) -> Reading {
    // Every sandbox's egress served (the scan runs every 250 ms), the runtime settled.
    std::thread::sleep(Duration::from_secs(2));
    let ids = server.sandbox_ids();
    let (pss, processes) = sandboxes_pss(&ids);
    Reading {
        live: ids.len(),
        rss: server.rss(),
        threads: server.proc_count("task"),
        fds: server.proc_count("fd"),
        pss,
        processes,
        available: mem_available(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let env =
        |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    let k = env("SANDLANE_DENSITY_K", if smoke { 15 } else { 50 }).max(11);
    let pairs = env("SANDLANE_DENSITY_PAIRS", if smoke { 5 } else { 30 });
    make_room_for(k);
    let gap = Duration::from_millis(env("SANDLANE_DENSITY_GAP_MS", 100) as u64);
    let server = Server::start();
    load(&server, 2, 10);
    let at10 = read(&server);
    let p50_10 = ensure_p50(&server, pairs, gap);
    let burst_10 = ensure_p50(&server, pairs, Duration::ZERO);
    eprintln!("density bench: 10 live, ensuring {} more", k - 10);
    let t = Instant::now();
    let last = ((k - 10) / 10).max(1);
    load(&server, 4, k - 10 - last);
    let t_last = Instant::now();
    load(&server, 4, last);
    let (took, took_last) = (t.elapsed(), t_last.elapsed());
    eprintln!("density bench: {k} live after {:.1} s", took.as_secs_f64());
    let at_k = read(&server);
    let p50_k = ensure_p50(&server, pairs, gap);
    let burst_k = ensure_p50(&server, pairs, Duration::ZERO);

    let n = (at_k.live - at10.live).max(1) as f64;
    let mib = |b: f64| b / (1024.0 * 1024.0);
    let per = |a: f64, b: f64| (b - a) / n;
    println!(
        "\nDensity: {} → {} live idle sandboxes, egress served; release build: {}",
        at10.live,
        at_k.live,
        !cfg!(debug_assertions)
    );
    println!("| what | at {} | at {} | per sandbox |", at10.live, at_k.live);
    println!("|---|---|---|---|");
    println!(
        "| server RSS | {:.1} MiB | {:.1} MiB | {:.1} KiB |",
        mib(at10.rss as f64),
        mib(at_k.rss as f64),
        per(at10.rss as f64, at_k.rss as f64) / 1024.0
    );
    println!(
        "| server threads | {} | {} | {:.3} |",
        at10.threads,
        at_k.threads,
        per(at10.threads as f64, at_k.threads as f64)
    );
    println!(
        "| server descriptors | {} | {} | {:.2} |",
        at10.fds,
        at_k.fds,
        per(at10.fds as f64, at_k.fds as f64)
    );
    println!(
        "| host memory of the sandboxes (PSS of their {} processes) | {:.1} MiB | {:.1} MiB | {:.2} MiB |",
        at_k.processes,
        mib(at10.pss as f64),
        mib(at_k.pss as f64),
        mib(per(at10.pss as f64, at_k.pss as f64))
    );
    println!(
        "| host MemAvailable | {:.0} MiB | {:.0} MiB | {:.2} MiB less |",
        mib(at10.available as f64),
        mib(at_k.available as f64),
        mib(per(at_k.available as f64, at10.available as f64))
    );
    println!(
        "| ensure p50, one pair every {} ms ({pairs} pairs) | {:.2} ms | {:.2} ms | {:.2}× at {} |",
        gap.as_millis(),
        p50_10.as_secs_f64() * 1e3,
        p50_k.as_secs_f64() * 1e3,
        p50_k.as_secs_f64() / p50_10.as_secs_f64(),
        at_k.live
    );
    println!(
        "| ensure p50, back to back ({pairs} pairs) | {:.2} ms | {:.2} ms | {:.2}× at {} |",
        burst_10.as_secs_f64() * 1e3,
        burst_k.as_secs_f64() * 1e3,
        burst_k.as_secs_f64() / burst_10.as_secs_f64(),
        at_k.live
    );
    println!(
        "| sandboxes started per second (4 clients) | {:.0} (10 → {k}) | {:.0} (the last {last}) | |",
        (k - 10) as f64 / took.as_secs_f64(),
        last as f64 / took_last.as_secs_f64()
    );
    let _ = at10.processes;
}
