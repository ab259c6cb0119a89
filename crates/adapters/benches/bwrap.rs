//! Benchmark: `true` run through the bubblewrap driver beside raw `bwrap` with the very
//! same argument vector, interleaved in one run; prints medians and the ratio.
//!
//! `cargo bench -p adapters --bench bwrap` (needs bubblewrap; run as root to measure
//! the host-id drop and cgroups the server would use). `BENCH_ITERS` sets the rounds.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use domain::execution::{AgentExecution, SandboxSubject};
use domain::{
    CallerClass, Durability, ExecRequest, ExecutionId, IdentityId, OrgId, Phase, SandboxCaller, SandboxId,
    SandboxToken, SessionId, split_caller,
};
use ports::driver::{ProvisionSpec, SandboxDriver};

fn spec(session: &str) -> ProvisionSpec {
    let mut random = [0u8; 16];
    getrandom::fill(&mut random).unwrap();
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let id = SandboxId::generate(u64::try_from(millis.as_millis()).unwrap(), u128::from_le_bytes(random));
    let execution = AgentExecution {
        org: OrgId::parse("bench").unwrap(),
        session_id: SessionId::parse(session).unwrap(),
        execution_id: ExecutionId::parse("exec-bench").unwrap(),
        phase: Phase::InProgress,
    };
    let caller = SandboxCaller::from_record(IdentityId::parse("bench-user").unwrap(), CallerClass::Service);
    let (_mint, environment) = split_caller(&execution, &caller, &id);
    ProvisionSpec {
        key: execution.sandbox_key(),
        environment,
        durability: Durability::Ephemeral,
        credential: SandboxToken::new("bench-token"),
        epoch: 1,
        workspace_bytes: None,
        from_snapshot: None,
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn p90(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() * 9 / 10]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn main() {
    let iters: usize = std::env::var("BENCH_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();

    let supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    let mut cg_config = BwrapConfig::new(dir.path().join("cg"));
    cg_config.supervisor = supervisor.clone();
    let driver = BwrapDriver::new(cg_config).unwrap();
    let mut no_cg_config = BwrapConfig::new(dir.path().join("nocg"));
    no_cg_config.supervisor = supervisor;
    no_cg_config.use_cgroups = false;
    let no_cg = BwrapDriver::new(no_cg_config).unwrap();
    let health = rt.block_on(driver.health());
    assert!(health.usable, "{}", health.detail);

    let s1 = spec("bench-cg");
    let s2 = spec("bench-nocg");
    rt.block_on(driver.provision(&s1)).unwrap();
    rt.block_on(no_cg.provision(&s2)).unwrap();
    let request = ExecRequest::new(vec!["true".into()], vec![], Some(10_000)).unwrap();
    let line = driver.command_line(s1.sandbox_id(), &request).unwrap();

    let raw = || {
        let t = Instant::now();
        let mut cmd = Command::new(&line.program);
        if let Some(id) = line.host_id {
            std::os::unix::process::CommandExt::uid(&mut cmd, id);
            std::os::unix::process::CommandExt::gid(&mut cmd, id);
        }
        let status = cmd
            .args(&line.args)
            .env_clear()
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(status.status.success(), "raw bwrap: {}", String::from_utf8_lossy(&status.stderr));
        t.elapsed()
    };
    let plain = || {
        let t = Instant::now();
        assert!(Command::new("true").status().unwrap().success());
        t.elapsed()
    };
    let through = |d: &BwrapDriver, id: &SandboxId| {
        let t = Instant::now();
        let out = rt.block_on(d.exec(id, &request)).unwrap();
        assert_eq!(out.exit_code, 0, "{}", String::from_utf8_lossy(&out.stderr));
        t.elapsed()
    };

    // Warm up caches and the runtime.
    for _ in 0..10 {
        raw();
        through(&driver, s1.sandbox_id());
        through(&no_cg, s2.sandbox_id());
    }
    let (mut t_plain, mut t_raw, mut t_drv, mut t_nocg) = (vec![], vec![], vec![], vec![]);
    for _ in 0..iters {
        t_plain.push(plain());
        t_raw.push(raw());
        t_drv.push(through(&driver, s1.sandbox_id()));
        t_nocg.push(through(&no_cg, s2.sandbox_id()));
    }
    rt.block_on(driver.deprovision(s1.sandbox_id())).unwrap();
    rt.block_on(no_cg.deprovision(s2.sandbox_id())).unwrap();

    let raw_median = median(&mut t_raw);
    println!("exec `true`, {iters} interleaved rounds; {}", health.detail);
    println!("{:<44} {:>10} {:>10} {:>8}", "", "median ms", "p90 ms", "x raw");
    for (name, samples) in [
        ("plain `true` (no sandbox)", &mut t_plain),
        ("raw bwrap, same argv and host uid", &mut t_raw),
        ("driver exec (rlimits+cgroups, uid drop)", &mut t_drv),
        ("driver exec (rlimits only, uid drop)", &mut t_nocg),
    ] {
        let m = median(samples);
        println!(
            "{name:<44} {:>10.2} {:>10.2} {:>8.2}",
            ms(m),
            ms(p90(samples)),
            m.as_secs_f64() / raw_median.as_secs_f64()
        );
    }
}
