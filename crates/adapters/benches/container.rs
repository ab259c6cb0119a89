//! Benchmark of the container driver beside the bubblewrap driver: ensure (provision,
//! with its readiness probe) + the first exec of `true`, then a warm exec of `true`, then
//! deprovision; interleaved, one sandbox per round; medians (and p90) printed as a table.
//!
//! `scripts/bench.sh` runs it and writes its table into `BENCHMARKS.md`. It needs the
//! throwaway podman service and bubblewrap, and fails without them:
//! `eval "$(bash scripts/podman-throwaway.sh start)"; cargo bench -p adapters --bench container`
//! (`SANDLANE_BENCH_ROUNDS`, default 20). The engine's version is the engine's answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../src/driver_contract.rs"]
#[allow(dead_code)]
mod driver_contract;

use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::container::{ContainerConfig, ContainerDriver};
use domain::{CallerClass, Durability, ExecRequest};
use ports::driver::SandboxDriver;

#[derive(Default)]
struct Samples {
    ensure_first_exec: Vec<Duration>,
    provision: Vec<Duration>,
    warm_exec: Vec<Duration>,
    deprovision: Vec<Duration>,
    /// The same `true` through the engine's exec API in the same container (container
    /// driver only), interleaved with the warm exec.
    engine_exec: Vec<Duration>,
}

/// `true` through the Engine API's exec (create, start attached, read to the end,
/// inspect): what the container driver did per command before its supervisor.
async fn engine_exec(docker: &bollard::Docker, container: &str) -> Duration {
    use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
    use futures_util::StreamExt;
    let start = Instant::now();
    let exec = docker
        .create_exec(
            container,
            CreateExecOptions {
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                cmd: Some(vec!["true".to_owned()]),
                user: Some("1000:1000".to_owned()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let started = docker
        .start_exec(&exec.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: None }))
        .await
        .unwrap();
    if let StartExecResults::Attached { mut output, .. } = started {
        while let Some(Ok(_)) = output.next().await {}
    }
    let info = docker.inspect_exec(&exec.id).await.unwrap();
    assert_eq!(info.exit_code, Some(0));
    start.elapsed()
}

fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return f64::NAN;
    }
    let at = ((ms.len() - 1) as f64 * q).round() as usize;
    ms[at]
}

async fn round(
    driver: &dyn SandboxDriver,
    into: &mut Samples,
    n: usize,
    engine: Option<(&bollard::Docker, &str)>,
) {
    let spec = driver_contract::spec_for(
        "bench",
        &format!("s{n}"),
        "svc-bench",
        CallerClass::Service,
        Durability::Ephemeral,
        "tok-bench",
    );
    let id = spec.sandbox_id().clone();
    let request = ExecRequest::new(vec!["true".to_owned()], vec![], Some(10_000)).unwrap();
    let start = Instant::now();
    driver.provision(&spec).await.unwrap();
    let provisioned = Instant::now();
    let out = driver.exec(&id, &request).await.unwrap();
    let first = Instant::now();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let out = driver.exec(&id, &request).await.unwrap();
    let warm = first.elapsed();
    assert_eq!(out.exit_code, 0, "{out:?}");
    if let Some((docker, prefix)) = engine {
        into.engine_exec.push(engine_exec(docker, &format!("{prefix}-{id}")).await);
    }
    let gone = Instant::now();
    driver.deprovision(&id).await.unwrap();
    into.deprovision.push(gone.elapsed());
    into.provision.push(provisioned - start);
    into.ensure_first_exec.push(first - start);
    into.warm_exec.push(warm);
}

fn main() {
    let rounds: usize =
        std::env::var("SANDLANE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
    let (Ok(host), Ok(image)) =
        (std::env::var("SANDLANE_TEST_DOCKER_HOST"), std::env::var("SANDLANE_TEST_CONTAINER_IMAGE"))
    else {
        eprintln!(
            "container bench: SANDLANE_TEST_DOCKER_HOST / SANDLANE_TEST_CONTAINER_IMAGE unset; run \
             `eval \"$(bash scripts/podman-throwaway.sh start)\"` first (scripts/bench.sh does)"
        );
        std::process::exit(1);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    let mut bwrap_config = BwrapConfig::new(dir.path().join("data"));
    bwrap_config.supervisor = supervisor.clone();
    let bwrap = BwrapDriver::new(bwrap_config).unwrap();
    let mut config = ContainerConfig::new(host.clone(), image);
    config.name_prefix = "slbench".to_owned();
    config.supervisor = supervisor;
    config.state_dir = dir.path().join("containers");
    let container = ContainerDriver::new(config).unwrap();
    let socket = host.trim_start_matches("unix://").to_owned();
    let docker = bollard::Docker::connect_with_unix(&socket, 120, bollard::API_DEFAULT_VERSION).unwrap();

    let (bwrap_health, container_health) =
        runtime.block_on(async { (bwrap.health().await, container.health().await) });
    // The engine's default OCI runtime, as the engine says.
    let oci_runtime = runtime.block_on(async {
        let docker =
            bollard::Docker::connect_with_unix(&socket, 30, &adapters::container::MAX_API_VERSION).unwrap();
        docker.info().await.unwrap().default_runtime.unwrap_or_else(|| "unknown runtime".to_owned())
    });
    assert!(bwrap_health.usable, "bubblewrap: {}", bwrap_health.detail);
    assert!(container_health.usable, "container engine: {}", container_health.detail);

    let (mut b, mut c) = (Samples::default(), Samples::default());
    runtime.block_on(async {
        // One warm-up round each (engine caches, page cache), not counted.
        round(&*bwrap, &mut Samples::default(), 0, None).await;
        round(&container, &mut Samples::default(), 0, Some((&docker, "slbench"))).await;
        for n in 1..=rounds {
            round(&*bwrap, &mut b, n, None).await;
            round(&container, &mut c, n, Some((&docker, "slbench"))).await;
        }
    });

    // The versions as the drivers report them: `bwrap --version`, the engine's own answer.
    let version = |detail: &str| detail.split(';').next().unwrap_or_default().trim().to_owned();
    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or_else(|_| "by hand".to_owned());
    println!(
        "Run: {run}; `cargo bench -p adapters --bench container`, {rounds} interleaved rounds (one \
         warm-up round each not counted), each round a new ephemeral sandbox; milliseconds, median \
         (p90).\n"
    );
    println!("Container driver: {}.\n", container_health.detail);
    println!(
        "| driver | ensure (provision) + first exec `true` | provision | warm exec `true` | deprovision |"
    );
    println!("|---|---|---|---|---|");
    for (name, s) in [
        (format!("bubblewrap ({})", version(&bwrap_health.detail)), &b),
        (format!("container ({}, {oci_runtime})", version(&container_health.detail)), &c),
    ] {
        let cell = |v: &[Duration]| format!("{:.1} ({:.1})", quantile(v, 0.5), quantile(v, 0.9));
        println!(
            "| {name} | {} | {} | {} | {} |",
            cell(&s.ensure_first_exec),
            cell(&s.provision),
            cell(&s.warm_exec),
            cell(&s.deprovision)
        );
    }
    let (through, engine) = (quantile(&c.warm_exec, 0.5), quantile(&c.engine_exec, 0.5));
    println!();
    println!(
        "container exec `true`: through the supervisor p50 {through:.2} ms; through the engine's exec API \
         p50 {engine:.1} ms (p90 {:.1}); engine / supervisor {:.1}× (target ≥ 10×)",
        quantile(&c.engine_exec, 0.9),
        engine / through
    );
}
