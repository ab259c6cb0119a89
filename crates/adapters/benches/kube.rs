//! Benchmark of the Kubernetes driver through the fake API server beside the bubblewrap
//! driver: ensure (provision + the first exec of `true`), a warm exec, deprovision;
//! interleaved, one new ephemeral sandbox per round; medians (and p90).
//!
//! The fake's own latency says nothing about a cluster's, so the bench also measures the
//! time spent in the driver itself: the fake (API server and kubelet) runs on a runtime
//! of its own threads, the driver alone on this thread (a current-thread runtime: the
//! kube client's connections, watches and port-forward tasks run here too), and the
//! thread's CPU time over a call is the driver's work (client serialisation, response and
//! watch decoding, websocket framing, the supervisor protocol), beside the call's wall
//! time. A third exec row goes to the same supervisor straight over TCP (no API server,
//! no websocket): the port-forward's own cost.
//!
//! `cargo bench -p adapters --features testing --bench kube` (bubblewrap and the
//! `sandlane` binary: `cargo build -p app --bin sandlane`). `SANDLANE_BENCH_ROUNDS`
//! (default 20).

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

#[path = "../src/driver_contract.rs"]
#[allow(dead_code)]
mod driver_contract;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::kubernetes::fake::store::Kind;
use adapters::kubernetes::fake::{FakeCluster, FakeImage, KubeletConfig};
use adapters::kubernetes::{KubeConfig, KubeConnection, KubeDriver, objects};
use adapters::supervisor_link::client::{self, ClientError, Connect};
use domain::{CallerClass, Durability, ExecRequest};
use ports::driver::SandboxDriver;
use supervisor::gate::ChannelKey;
use supervisor::protocol::ExecSpec;

const NAMESPACE: &str = "bench";
const IMAGE: &str = "bench-tools:1";

/// This thread's CPU time.
#[allow(unsafe_code)]
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes only into `ts`.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut ts) };
    Duration::new(u64::try_from(ts.tv_sec).unwrap_or(0), u32::try_from(ts.tv_nsec).unwrap_or(0))
}

#[derive(Default)]
struct Samples {
    ensure: Vec<Duration>,
    ensure_cpu: Vec<Duration>,
    warm_exec: Vec<Duration>,
    exec_cpu: Vec<Duration>,
    deprovision: Vec<Duration>,
    deprovision_cpu: Vec<Duration>,
    direct_exec: Vec<Duration>,
    requests: Vec<u64>,
}

fn quantile(samples: &[Duration], q: f64) -> f64 {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    if ms.is_empty() {
        return f64::NAN;
    }
    ms[((ms.len() - 1) as f64 * q).round() as usize]
}

/// The same supervisor straight over TCP (through the fake kubelet's connect, as a
/// port-forward's last hop), with the channel key.
struct Direct<'a> {
    fake: &'a FakeCluster,
    pod: String,
    key: ChannelKey,
}

impl Connect for Direct<'_> {
    type Stream = tokio::net::TcpStream;

    async fn open(&self) -> Result<tokio::net::TcpStream, ClientError> {
        let tcp = self.fake.connect_pod(NAMESPACE, &self.pod, 7070).await.map_err(ClientError::Gone)?;
        let _ = tcp.set_nodelay(true);
        Ok(tcp)
    }

    fn preamble(&self) -> &[u8] {
        self.key.preamble()
    }
}

fn channel_key(fake: &FakeCluster, pod: &str) -> ChannelKey {
    use base64::Engine as _;
    let secret = fake.objects(Kind::Secret).into_iter().find(|s| s["metadata"]["name"] == pod).unwrap();
    let text = secret["data"][objects::SECRET_CHANNEL].as_str().unwrap();
    let raw = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
    ChannelKey::parse(std::str::from_utf8(&raw).unwrap()).unwrap()
}

async fn round(driver: &dyn SandboxDriver, into: &mut Samples, n: usize, fake: Option<&FakeCluster>) {
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
    let requests_before = fake.map(|f| f.busy().requests);
    let (start, cpu) = (Instant::now(), thread_cpu());
    driver.provision(&spec).await.unwrap();
    let out = driver.exec(&id, &request).await.unwrap();
    into.ensure.push(start.elapsed());
    into.ensure_cpu.push(thread_cpu() - cpu);
    assert_eq!(out.exit_code, 0, "{out:?}");
    if let (Some(f), Some(before)) = (fake, requests_before) {
        into.requests.push(f.busy().requests - before);
    }
    let (start, cpu) = (Instant::now(), thread_cpu());
    let out = driver.exec(&id, &request).await.unwrap();
    into.warm_exec.push(start.elapsed());
    into.exec_cpu.push(thread_cpu() - cpu);
    assert_eq!(out.exit_code, 0, "{out:?}");
    if let Some(f) = fake {
        let pod = objects::object_name("sandlane", &id);
        let direct = Direct { fake: f, pod: pod.clone(), key: channel_key(f, &pod) };
        let spec = ExecSpec {
            argv: vec!["true".to_owned()],
            env: Vec::new(),
            cwd: "/workspace".to_owned(),
            timeout_ms: 10_000,
            output_cap: 1 << 20,
            stdin: false,
            rlimits: Vec::new(),
        };
        let start = Instant::now();
        let out = client::exec(&direct, &spec, b"", Duration::from_secs(10), Duration::from_secs(10))
            .await
            .unwrap();
        into.direct_exec.push(start.elapsed());
        assert_eq!(out.exit_code, 0, "{out:?}");
    }
    let (start, cpu) = (Instant::now(), thread_cpu());
    driver.deprovision(&id).await.unwrap();
    into.deprovision.push(start.elapsed());
    into.deprovision_cpu.push(thread_cpu() - cpu);
}

fn main() {
    let rounds: usize =
        std::env::var("SANDLANE_BENCH_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(20);
    let supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    // The fake API server and kubelet on threads of their own.
    let fake_rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let images = HashMap::from([(
        IMAGE.to_owned(),
        FakeImage {
            supervisor_at: "/opt/sandlane/sandlane-supervisor".to_owned(),
            supervisor_host: supervisor.clone(),
        },
    )]);
    let fake = fake_rt
        .block_on(FakeCluster::start(KubeletConfig {
            images,
            bwrap: PathBuf::from("bwrap"),
            cgroup_parent: "sandlane-bench-kubelet".to_owned(),
        }))
        .unwrap();
    // The drivers on this thread alone.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut bwrap_config = BwrapConfig::new(dir.path().join("data"));
    bwrap_config.supervisor = supervisor;
    let bwrap = BwrapDriver::new(bwrap_config).unwrap();
    let connection = KubeConnection::Explicit { url: fake.url(), token_file: None, ca_file: None };
    let mut config = KubeConfig::new(connection, NAMESPACE, IMAGE);
    config.supervisor_path = "/opt/sandlane/sandlane-supervisor".to_owned();
    let kube = KubeDriver::new(config).unwrap();
    let (bwrap_health, kube_health) = rt.block_on(async { (bwrap.health().await, kube.health().await) });
    assert!(bwrap_health.usable, "bubblewrap: {}", bwrap_health.detail);
    assert!(kube_health.usable, "kubernetes: {}", kube_health.detail);

    let (mut b, mut k) = (Samples::default(), Samples::default());
    let busy_before = fake.busy();
    rt.block_on(async {
        // One warm-up round each, not counted.
        round(&*bwrap, &mut Samples::default(), 0, None).await;
        round(&kube, &mut Samples::default(), 0, Some(&fake)).await;
        for n in 1..=rounds {
            round(&*bwrap, &mut b, n, None).await;
            round(&kube, &mut k, n, Some(&fake)).await;
        }
    });
    let busy = fake.busy();
    fake_rt.block_on(fake.shutdown());

    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or_else(|_| "by hand".to_owned());
    println!(
        "Run: {run}; `cargo bench -p adapters --features testing --bench kube`, {rounds} interleaved \
         rounds (one warm-up round each not counted), each round a new ephemeral sandbox; \
         milliseconds, median (p90). Driver CPU: the CPU time of the one thread the driver runs \
         on (the fake runs on others) over the call, and its share of the call's wall time.\n"
    );
    println!(
        "| driver | ensure (provision + first exec `true`) | driver CPU in ensure (share) | warm exec `true` | \
         driver CPU in exec (share) | deprovision | driver CPU in deprovision |"
    );
    println!("|---|---|---|---|---|---|---|");
    let cell = |v: &[Duration]| format!("{:.1} ({:.1})", quantile(v, 0.5), quantile(v, 0.9));
    let cpu = |c: &[Duration], w: &[Duration]| {
        format!("{:.2} ({:.0} %)", quantile(c, 0.5), 100.0 * quantile(c, 0.5) / quantile(w, 0.5))
    };
    let version = |detail: &str| detail.split(';').next().unwrap_or_default().trim().to_owned();
    for (name, s) in [
        (format!("bubblewrap ({})", version(&bwrap_health.detail)), &b),
        ("kubernetes (fake API server, pods as bubblewrap sandboxes)".to_owned(), &k),
    ] {
        println!(
            "| {name} | {} | {} | {} | {} | {} | {:.2} |",
            cell(&s.ensure),
            cpu(&s.ensure_cpu, &s.ensure),
            cell(&s.warm_exec),
            cpu(&s.exec_cpu, &s.warm_exec),
            cell(&s.deprovision),
            quantile(&s.deprovision_cpu, 0.5),
        );
    }
    let mut requests = k.requests.clone();
    requests.sort_unstable();
    let counted = u32::try_from(rounds).unwrap_or(1).max(1);
    println!();
    println!(
        "Kubernetes ensure: {} API requests (median, watches counted once); the fake spent {:.1} ms handling \
         requests and {:.1} ms starting the pod per round (means over the run, warm-up included: {:.1} / {:.1}).",
        requests.get(requests.len() / 2).copied().unwrap_or(0),
        (busy.handling - busy_before.handling).as_secs_f64() * 1000.0 / f64::from(counted),
        (busy.pod_starts - busy_before.pod_starts).as_secs_f64() * 1000.0 / f64::from(counted),
        busy.handling.as_secs_f64() * 1000.0 / f64::from(counted + 1),
        busy.pod_starts.as_secs_f64() * 1000.0 / f64::from(counted + 1),
    );
    println!(
        "Kubernetes exec `true` through the port-forward p50 {:.2} ms beside the same supervisor straight over \
         TCP p50 {:.2} ms (p90 {:.2}): the websocket through the API server costs {:.2} ms per operation here.",
        quantile(&k.warm_exec, 0.5),
        quantile(&k.direct_exec, 0.5),
        quantile(&k.direct_exec, 0.9),
        quantile(&k.warm_exec, 0.5) - quantile(&k.direct_exec, 0.5),
    );
}
