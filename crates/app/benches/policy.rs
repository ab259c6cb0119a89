//! The org policy benchmark (issue 14), in the same run of `scripts/bench.sh` as the lane
//! bench: a new workflow ensure that adopts a warm sandbox beside a cold one; a burst of as
//! many ensures as the pool holds, from 16 clients; the resume of a suspended sandbox
//! beside a new provision. Durable Postgres, the bubblewrap driver, the real `sandlane
//! serve` over HTTP; pairs interleaved (A, B, A, B, …), medians and ratios of medians.
//!
//! `cargo bench -p app --bench policy -- [--smoke] [--out BENCHMARKS.md]` with
//! `SANDLANE_TEST_POSTGRES_URL` naming an admin URL of a Postgres it may create a database
//! in (scripts/bench.sh starts one).

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use ports::SandboxDriver;
use serde_json::Value;

struct Counts {
    /// Interleaved warm/cold pairs.
    pairs: usize,
    /// The burst's pool.
    burst: usize,
    /// Concurrent clients of the burst.
    clients: usize,
    /// Interleaved resume/provision pairs.
    resume_pairs: usize,
}

impl Counts {
    fn full() -> Self {
        Self { pairs: 100, burst: 400, clients: 16, resume_pairs: 60 }
    }

    fn smoke() -> Self {
        Self { pairs: 3, burst: 16, clients: 4, resume_pairs: 3 }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    let i = ((samples.len().saturating_sub(1)) as f64 * 0.99).round() as usize;
    samples.get(i).copied().unwrap_or_default()
}

fn random_hex(bytes: usize) -> String {
    let mut b = vec![0u8; bytes];
    getrandom::fill(&mut b).expect("entropy");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn fresh_database(admin: &str) -> String {
    let name = format!("bench_policy_{}", random_hex(4));
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(admin).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(&mut conn)
        .await
        .expect("create database");
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    format!("{base}/{name}")
}

/// The pause before each sample of a pair, once the warm pool is full: longer than the
/// driver takes to prepare its next start after a provision (a cgroup v1 move, an RCU grace
/// period: 10–17 ms here).
mod support;
use support::{Served, Setup};

const SETTLE: Duration = Duration::from_millis(30);

const ORGS: [&str; 4] = ["warm", "cold", "burst", "resume"];

/// A `sandlane serve` process, its settings' variables, and a service key of every org.
struct Server {
    served: Served,
    base: String,
    key: String,
    vars: Vec<(String, String)>,
}

impl Server {
    fn start(database_url: &str) -> Self {
        let extra = [
            ("SANDLANE_DATABASE_URL", database_url.to_owned()),
            ("SANDLANE_BACKGROUND__POLICY_INTERVAL_MS", "250".to_owned()),
        ];
        // Its refusals are what it measures: their warnings are not shown.
        let served = Served::start_with(&Setup {
            prefix: "sandlane-bench-policy-",
            parent: None,
            caller: "svc-bench",
            orgs: &ORGS,
            extra: &extra,
            warnings: false,
        });
        Self { base: served.base(), key: served.key.clone(), vars: served.vars.clone(), served }
    }

    fn agent() -> ureq::Agent {
        Served::agent()
    }

    /// A new workflow ensure in `org`; the sandbox id.
    fn ensure(&self, agent: &ureq::Agent, org: &str, execution: &str) -> String {
        let url = format!("{}/v1/orgs/{org}/workflow-executions/{execution}/sandbox", self.base);
        let mut r = agent
            .put(&url)
            .header("authorization", &format!("Bearer {}", self.key))
            .send_empty()
            .expect("ensure");
        let body: Value = r.body_mut().read_json().unwrap_or(Value::Null);
        assert_eq!(body["outcome"], "ready", "ensure in {org}: {body}");
        body["sandbox"]["id"].as_str().expect("id").to_owned()
    }

    fn get(&self, agent: &ureq::Agent, path: &str) -> Value {
        let mut r = agent
            .get(&format!("{}{path}", self.base))
            .header("authorization", &format!("Bearer {}", self.key))
            .call()
            .expect("GET");
        r.body_mut().read_json().unwrap_or(Value::Null)
    }

    fn metric(&self, agent: &ureq::Agent, line_start: &str) -> f64 {
        // The per-org series are a service caller's (of those orgs) to see.
        let mut r = agent
            .get(&format!("{}/metrics", self.base))
            .header("authorization", &format!("Bearer {}", self.key))
            .call()
            .expect("metrics");
        let text = r.body_mut().read_to_string().unwrap_or_default();
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    }

    fn pooled(&self, agent: &ureq::Agent, org: &str) -> f64 {
        self.metric(agent, &format!("sandlane_org_sandboxes{{org=\"{org}\",state=\"pooled\"}}"))
    }

    fn wait_pooled(&self, agent: &ureq::Agent, org: &str, at_least: f64) {
        let start = Instant::now();
        while self.pooled(agent, org) < at_least {
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "the pool of {org} did not fill to {at_least}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Audit outcomes of `org`'s events.
    fn outcomes(&self, agent: &ureq::Agent, org: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut after = 0;
        loop {
            let page = self.get(agent, &format!("/v1/orgs/{org}/audit?after={after}&limit=1000"));
            let events = page["events"].as_array().cloned().unwrap_or_default();
            if events.is_empty() {
                return out;
            }
            after = page["next"].as_i64().expect("next");
            out.extend(events.iter().map(|e| {
                (
                    e["outcome"].as_str().unwrap_or("").to_owned(),
                    e["action"].as_str().unwrap_or("").to_owned(),
                )
            }));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.served.stop();
        // Resident sandboxes (warm ones included) outlive their server: end this run's.
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

fn cli(vars: &[(String, String)], args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sandlane"))
        .args(args)
        .envs(vars.iter().cloned())
        .output()
        .expect("run sandlane");
    assert!(out.status.success(), "sandlane {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

static EXECUTIONS: AtomicU64 = AtomicU64::new(0);

fn new_execution() -> String {
    format!("x-{}", EXECUTIONS.fetch_add(1, Ordering::Relaxed))
}

struct Row {
    what: String,
    result: String,
    target: &'static str,
    met: Option<bool>,
}

fn table(rows: &[Row]) -> String {
    let mut out = String::from("| measurement | result | target | status |\n|---|---|---|---|\n");
    for r in rows {
        let status = match r.met {
            Some(true) => "met",
            Some(false) => "**missed**",
            None => "",
        };
        let _ = writeln!(out, "| {} | {} | {} | {status} |", r.what, r.result, r.target);
    }
    out
}

fn write_report(path: &Path, section: &str) {
    let begin = "<!-- bench:policy:begin (written by `scripts/bench.sh`; edit outside the markers) -->";
    let end = "<!-- bench:policy:end -->";
    let text = std::fs::read_to_string(path).expect("read the report");
    let (Some(b), Some(e)) = (text.find(begin), text.find(end)) else {
        panic!("{} has no policy bench markers", path.display());
    };
    let new = format!("{}{begin}\n{section}{}", &text[..b], &text[e..]);
    std::fs::write(path, new).expect("write the report");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let c = if smoke { Counts::smoke() } else { Counts::full() };
    let admin = std::env::var("SANDLANE_TEST_POSTGRES_URL")
        .expect("SANDLANE_TEST_POSTGRES_URL must name a Postgres admin URL (scripts/bench.sh starts one)");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    let url = rt.block_on(fresh_database(&admin));
    let step = |s: &str| eprintln!("policy bench: {s}");
    step("starting the server");
    let server = Server::start(&url);
    let agent = Server::agent();
    let pool = 8usize;
    cli(&server.vars, &["org", "set", "warm", "--warm-pool", &pool.to_string()]);
    cli(&server.vars, &["org", "set", "cold", "--warm-pool", "0"]);
    let mut rows = Vec::new();

    // 1: a new workflow ensure that adopts a warm sandbox, beside a cold one.
    step("warm beside cold");
    server.wait_pooled(&agent, "warm", pool as f64);
    server.ensure(&agent, "cold", &new_execution()); // warm-up
    let (mut warm, mut cold) = (Vec::new(), Vec::new());
    // Every sample starts from the same quiet server: the warm org's pool full again (its
    // refill, a provision of its own, is not running) and a pause after that, so the
    // previous sample's follow-up work (the driver's next prepared start after a cold
    // provision) is done. Otherwise each sample would measure, beside itself, the tail of
    // the one before it, by an amount that depends on where the 250 ms policy pass falls.
    let settle = |server: &Server| {
        server.wait_pooled(&agent, "warm", pool as f64);
        std::thread::sleep(SETTLE);
    };
    for _ in 0..c.pairs {
        settle(&server);
        let t = Instant::now();
        server.ensure(&agent, "warm", &new_execution());
        warm.push(t.elapsed());
        settle(&server);
        let t = Instant::now();
        server.ensure(&agent, "cold", &new_execution());
        cold.push(t.elapsed());
    }
    let adopted = server.outcomes(&agent, "warm").iter().filter(|(o, _)| o == "adopted").count();
    assert_eq!(adopted, c.pairs, "every warm ensure adopted a warm sandbox");
    let (warm50, cold50) = (p50(&mut warm), p50(&mut cold));
    rows.push(Row {
        what: "new workflow ensure adopting a warm sandbox (durable Postgres), 1 client".into(),
        result: format!("p50 {:.2} ms, p99 {:.2} ms", ms(warm50), ms(p99(&mut warm))),
        target: "p50 ≤ 3 ms",
        met: Some(warm50 <= Duration::from_millis(3)),
    });
    rows.push(Row {
        what: "new workflow ensure, cold (provision: workspace image, bubblewrap, supervisor)".into(),
        result: format!(
            "p50 {:.2} ms, p99 {:.2} ms; cold / warm {:.1}×",
            ms(cold50),
            ms(p99(&mut cold)),
            cold50.as_secs_f64() / warm50.as_secs_f64()
        ),
        target: "",
        met: None,
    });

    // 2: a burst of as many ensures as the pool holds, from `clients` clients.
    step(&format!("a burst of {} ensures from {} clients", c.burst, c.clients));
    cli(&server.vars, &["org", "set", "burst", "--warm-pool", &c.burst.to_string()]);
    server.wait_pooled(&agent, "burst", c.burst as f64);
    let claimed = AtomicU64::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..c.clients {
            let (server, claimed) = (&server, &claimed);
            s.spawn(move || {
                let agent = Server::agent();
                while claimed.fetch_add(1, Ordering::Relaxed) < c.burst as u64 {
                    server.ensure(&agent, "burst", &new_execution());
                }
            });
        }
    });
    let elapsed = start.elapsed();
    let rate = c.burst as f64 / elapsed.as_secs_f64();
    let adopted = server.outcomes(&agent, "burst").iter().filter(|(o, _)| o == "adopted").count();
    rows.push(Row {
        what: format!(
            "burst: {} new workflow ensures, as many as the pool holds, {} clients",
            c.burst, c.clients
        ),
        result: format!("{rate:.0}/s ({adopted} adopted, {:.0} ms in all)", ms(elapsed)),
        target: "≥ 1,000/s",
        met: Some(rate >= 1000.0 && adopted == c.burst),
    });
    cli(&server.vars, &["org", "set", "burst", "--warm-pool", "0"]);

    // 3: resume of a suspended sandbox beside a new provision.
    step("resume beside provision");
    let suspended: Vec<String> = (0..c.resume_pairs).map(|_| new_execution()).collect();
    for execution in &suspended {
        server.ensure(&agent, "resume", execution);
    }
    cli(&server.vars, &["org", "set", "resume", "--idle-timeout", "1s"]);
    let state = "sandlane_org_sandboxes{org=\"resume\",state=\"suspended\"}";
    let start = Instant::now();
    while server.metric(&agent, state) < c.resume_pairs as f64 {
        assert!(start.elapsed() < Duration::from_secs(120), "the sandboxes were not suspended");
        std::thread::sleep(Duration::from_millis(50));
    }
    // No more suspensions while measuring (they would run beside the measured ensures).
    cli(&server.vars, &["org", "set", "resume", "--idle-timeout", "off"]);
    std::thread::sleep(Duration::from_secs(1));
    let (mut resumed, mut fresh) = (Vec::new(), Vec::new());
    for execution in &suspended {
        let t = Instant::now();
        server.ensure(&agent, "resume", execution);
        resumed.push(t.elapsed());
        let t = Instant::now();
        server.ensure(&agent, "resume", &new_execution());
        fresh.push(t.elapsed());
    }
    let resumes =
        server.outcomes(&agent, "resume").iter().filter(|(o, a)| o == "resumed" && a == "ensure").count();
    assert_eq!(resumes, c.resume_pairs, "every one was resumed");
    let (res50, new50) = (p50(&mut resumed), p50(&mut fresh));
    rows.push(Row {
        what: "resume of a suspended sandbox (ensure: same id, workspace image mounted again, new processes)"
            .into(),
        result: format!("p50 {:.2} ms, p99 {:.2} ms", ms(res50), ms(p99(&mut resumed))),
        target: "",
        met: None,
    });
    rows.push(Row {
        what: "new provision in the same org (ensure of a new key), interleaved".into(),
        result: format!(
            "p50 {:.2} ms, p99 {:.2} ms; resume / new {:.2}×",
            ms(new50),
            ms(p99(&mut fresh)),
            res50.as_secs_f64() / new50.as_secs_f64()
        ),
        target: "",
        met: None,
    });
    let driver = {
        let mut config = BwrapConfig::new(server.served.data.path().join("data"));
        config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
        BwrapDriver::new(config).map(|d| rt.block_on(d.health()).detail).unwrap_or_default()
    };
    drop(server);

    let mode = if smoke { "SMOKE run (tiny counts, not a measurement)" } else { "full run" };
    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or_default();
    let mut section = String::new();
    let _ = writeln!(section, "Run: {run}; {mode}, release build: {}.\n", !cfg!(debug_assertions));
    let _ = writeln!(
        section,
        "Set-up: one `sandlane serve` on a durable PostgreSQL (the lane bench's cluster), the bubblewrap \
         driver ({driver}), the default workspace quota (1 GiB, an image per workspace); pool of 8 in org \
         `warm`; policy passes every 250 ms. Samples: {} warm/cold pairs (each sample after the warm pool is \
         full again and a 30 ms pause), a burst of {} from {} clients, {} resume/provision pairs; pairs \
         interleaved.\n",
        c.pairs, c.burst, c.clients, c.resume_pairs
    );
    section.push_str(&table(&rows));
    println!("\n{section}");
    if let Some(path) = out {
        write_report(&path, &section);
        eprintln!("policy bench: wrote {}", path.display());
    }
}
