//! Density: what the server keeps per live sandbox whose egress it serves is bounded, and
//! holds no thread. N idle bubblewrap sandboxes (`SANDLANE_DENSITY_SANDBOXES`, default
//! 50), each with its egress proxy served (`serve_egress`, as the server's background
//! does), add no thread to the server's process (at most 0.01 per sandbox) and a few
//! descriptors each; each proxy still answers. Its own test binary, so no other test's
//! threads are counted.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver, Limits};
use domain::execution::AgentExecution;
use domain::{
    CallerClass, Durability, ExecRequest, ExecutionId, IdentityId, OrgId, Phase, SandboxCaller, SandboxId,
    SandboxToken, SessionId, split_caller,
};
use ports::driver::{ProvisionSpec, SandboxDriver};

/// Refuses every destination, counting the requests it is asked.
struct RefuseAll(AtomicUsize);

#[async_trait::async_trait]
impl ports::EgressGate for RefuseAll {
    async fn open(&self, request: &ports::EgressRequest) -> Result<ports::EgressGrant, ports::EgressRefusal> {
        self.0.fetch_add(1, Ordering::SeqCst);
        Err(ports::EgressRefusal::NotAllowed(format!("{} is not allowed", request.host)))
    }
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

fn spec(n: usize) -> ProvisionSpec {
    let millis = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis();
    let id = SandboxId::generate(u64::try_from(millis).unwrap(), u128::try_from(n).unwrap() + 1);
    let execution = AgentExecution {
        org: OrgId::parse("density").unwrap(),
        session_id: SessionId::parse(format!("s{n}")).unwrap(),
        execution_id: ExecutionId::parse(format!("exec-{n}")).unwrap(),
        phase: Phase::InProgress,
    };
    let caller = SandboxCaller::from_record(IdentityId::parse("ident").unwrap(), CallerClass::User);
    let (_mint, environment) = split_caller(&execution, &caller, &id);
    ProvisionSpec {
        key: domain::execution::SandboxSubject::sandbox_key(&execution),
        environment,
        durability: Durability::Ephemeral,
        credential: SandboxToken::new("tok"),
        epoch: 1,
        workspace_bytes: None,
        from_snapshot: None,
    }
}

/// Runs a request through the sandbox's proxy (as its environment names it): the gate's
/// refusal comes back.
async fn through_the_proxy(driver: &BwrapDriver, id: &SandboxId) {
    let argv = ["sh", "-c", "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' http://refused.test/"];
    let request =
        ExecRequest::new(argv.iter().map(|a| (*a).to_owned()).collect(), Vec::new(), Some(20_000)).unwrap();
    let out = driver.exec(id, &request).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "403", "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sandboxes_with_egress_served_add_no_server_threads() {
    let n: usize =
        std::env::var("SANDLANE_DENSITY_SANDBOXES").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let dir = tempfile::tempdir().unwrap();
    let mut config = BwrapConfig::new(dir.path().join("data"));
    config.supervisor = adapters::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    config.warm_starts = 0;
    config.started_ahead = 0;
    config.cgroup_parent = "sandlane-test".to_owned();
    config.limits = Limits {
        processes: 64,
        open_files: 256,
        address_space_bytes: 256 << 20,
        file_size_bytes: 16 << 20,
        cpu_secs: 10,
        memory_bytes: 64 << 20,
        cpu_millis: 1000,
    };
    let driver = BwrapDriver::new(config).unwrap();
    let fds_before = count("/proc/self/fd");
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let spec = spec(i);
        driver.provision(&spec).await.unwrap();
        ids.push(spec.sandbox_id().clone());
    }
    let gate = Arc::new(RefuseAll(AtomicUsize::new(0)));
    // One sandbox served and used first, so whatever the runtime starts once is running.
    let mut serving = Vec::with_capacity(n);
    let serve = |id: SandboxId| {
        let (driver, gate) = (driver.clone(), gate.clone());
        tokio::spawn(async move { driver.serve_egress(&id, gate).await })
    };
    serving.push(serve(ids[0].clone()));
    through_the_proxy(&driver, &ids[0]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (threads, fds) = (count("/proc/self/task"), count("/proc/self/fd"));

    for id in &ids[1..] {
        serving.push(serve(id.clone()));
    }
    // Every proxy is served: a request through the last ones is answered by the gate.
    for id in ids.iter().rev().take(3) {
        through_the_proxy(&driver, id).await;
    }
    assert_eq!(gate.0.load(Ordering::SeqCst), 4);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (threads_after, fds_after) = (count("/proc/self/task"), count("/proc/self/fd"));
    let served = n - 1;
    let per_sandbox = fds_after.saturating_sub(fds_before) as f64 / n as f64;
    println!(
        "{served} more sandboxes served: threads {threads} -> {threads_after}, descriptors {fds} -> {fds_after}; \
         {n} sandboxes live and served: {per_sandbox:.2} descriptors each"
    );
    assert!(
        threads_after.saturating_sub(threads) * 100 <= served,
        "{served} sandboxes served added {} threads (threads {threads} -> {threads_after})",
        threads_after.saturating_sub(threads)
    );
    // The proxy's socket, its init's pidfd, bubblewrap's pidfd (reaped by the server):
    // a few descriptors each, nothing more.
    assert!(per_sandbox <= 4.0, "descriptors {fds_before} -> {fds_after} for {n} sandboxes");

    for id in &ids {
        driver.deprovision(id).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for task in serving {
        let left = deadline.saturating_duration_since(Instant::now());
        let ended = tokio::time::timeout(left, task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "serving ends with the sandbox: {ended:?}");
    }
}
