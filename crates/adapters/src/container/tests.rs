//! Tests of the container driver against a real engine: the podman service started by
//! `scripts/podman-throwaway.sh start` (`SANDLANE_TEST_DOCKER_HOST`,
//! `SANDLANE_TEST_CONTAINER_IMAGE`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use bollard::query_parameters::InspectContainerOptions;
use domain::{CallerClass, Durability, ExecOutput, SandboxId, SandboxToken};
use ports::driver::{DriverError, ProvisionSpec, SandboxDriver};

use super::spec::{container_name, ephemeral_volume_name, volume_name};
use super::{ContainerConfig, ContainerDriver, ContainerLimits};
use crate::driver_contract;
use driver_contract::{new_sandbox_id, run, shown, spec_for};

/// The engine and image under test: the test fails without them, unless the developer
/// skips `podman` by name (then `None`, said loudly).
fn engine() -> Option<(String, String)> {
    let engine = tests::services::podman_engine()?;
    Some((engine.docker_host, engine.image))
}

/// A small-limits config with a name prefix of its own, so tests never see each other.
pub(crate) fn test_config(host: &str, image: &str) -> ContainerConfig {
    let mut config = ContainerConfig::new(host, image);
    config.name_prefix = format!("sltest-{}", new_sandbox_id().as_str()[20..].to_ascii_lowercase());
    config.limits = ContainerLimits {
        memory_bytes: 64 << 20,
        processes: 32,
        cpu_millis: 500,
        open_files: 256,
        file_size_bytes: 1 << 20,
        cpu_secs: 10,
        user_processes: 4096,
    };
    config.output_cap_bytes = 64 << 10;
    config.tmp_size_bytes = 16 << 20;
    config.probe_timeout = Duration::from_secs(10);
    config.supervisor = crate::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    config.state_dir = std::env::temp_dir().join(format!("{}-state", config.name_prefix));
    config
}

fn driver_with(edit: impl FnOnce(&mut ContainerConfig)) -> Option<ContainerDriver> {
    let (host, image) = engine()?;
    let mut config = test_config(&host, &image);
    edit(&mut config);
    Some(ContainerDriver::new(config).unwrap())
}

fn user_spec(session: &str) -> ProvisionSpec {
    spec_for("acme", session, "user-ident-42", CallerClass::User, Durability::Durable, "tok-secret-1")
}

fn service_spec(session: &str) -> ProvisionSpec {
    spec_for("acme", session, "svc-9", CallerClass::Service, Durability::Ephemeral, "tok-secret-2")
}

async fn sh(driver: &ContainerDriver, id: &SandboxId, script: &str) -> ExecOutput {
    run(driver, id, &["sh", "-c", script], b"", 10_000).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn container_exists(driver: &ContainerDriver, id: &SandboxId) -> bool {
    let docker = driver.docker().await.unwrap();
    let name = container_name(&driver.config.name_prefix, id);
    docker.inspect_container(&name, None::<InspectContainerOptions>).await.is_ok()
}

/// Removes the durable volumes a test left (durable workspaces outlive deprovision).
async fn remove_durable_volumes(driver: &ContainerDriver) {
    let docker = driver.docker().await.unwrap();
    let filter = format!("{}={}", super::spec::LABEL_PREFIX, driver.config.name_prefix);
    let options = bollard::query_parameters::ListVolumesOptions {
        filters: Some(std::collections::HashMap::from([("label".to_owned(), vec![filter])])),
    };
    let volumes = docker.list_volumes(Some(options)).await.unwrap().volumes.unwrap_or_default();
    for v in volumes {
        driver.remove_volume(&v.name).await.unwrap();
    }
}

async fn volume_exists(driver: &ContainerDriver, name: &str) -> bool {
    driver.docker().await.unwrap().inspect_volume(name).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_driver_contract() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let health = driver.health().await;
    assert!(health.usable, "{}", health.detail);
    assert!(health.detail.contains("API 1.41"), "negotiated, at most v1.41: {}", health.detail);
    let l = driver.config.limits;
    let limits = driver_contract::ExpectedLimits {
        open_files: l.open_files,
        processes: l.user_processes,
        file_size_bytes: l.file_size_bytes,
    };
    driver_contract::driver_contract(&driver, limits).await;
    assert!(driver.list().await.unwrap().is_empty(), "no container remains");
    remove_durable_volumes(&driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_quota_and_suspend_contract() {
    // Files as large as the quota test writes (the small-limits config caps them at 1 MiB).
    let Some(driver) = driver_with(|c| c.limits.file_size_bytes = 64 << 20) else { return };
    let org = driver.config.name_prefix.clone();
    driver_contract::quota_and_suspend_contract(&driver, &org).await;
    // The durable workspace's image stays (root only); nothing is left mounted.
    let images = driver.config.state_dir.join("images");
    let kept: Vec<_> = std::fs::read_dir(&images).unwrap().flatten().map(|e| e.path()).collect();
    let durable: Vec<_> = kept.iter().filter(|p| p.extension().is_some_and(|e| e == "img")).collect();
    assert_eq!(durable.len(), 1, "{kept:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&driver.config.state_dir.display().to_string()), "a workspace is still mounted");
    let _ = std::fs::remove_dir_all(&driver.config.state_dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_resident_contract() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let limits = driver_contract::ContractLimits { processes: 32, memory_mib: 64 };
    driver_contract::resident_contract(std::sync::Arc::new(driver), limits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_streams_contract() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let config = driver.config().clone();
    let limits = driver_contract::StreamsLimits {
        output_cap: config.output_cap_bytes as u64,
        file_size_bytes: config.limits.file_size_bytes,
        host_dir: config.state_dir.clone(),
    };
    driver_contract::streams_contract(std::sync::Arc::new(driver), limits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_egress_contract() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let driver = std::sync::Arc::new(driver);
    // The image is Debian's static busybox: no curl, and its wget crashes (SIGSEGV) as
    // soon as `http_proxy` is set, on the host too. So the request goes to the proxy
    // `http_proxy` names with busybox nc, headers stripped with sed.
    let fetch = "fetch() { p=${http_proxy#http://}; \
                 printf 'GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' \"$1\" \
                 | nc -w 10 ${p%:*} ${p##*:} | sed '1,/^\r$/d'; }; fetch";
    let direct = "direct() { echo hi | nc -w 3 127.0.0.1 $1; }; direct";
    // The server accepted on the socket it opened in the sandbox's namespace: the
    // supervisor serves no egress of its own (listens on no port, holds nothing).
    let path = async |id: &SandboxId| {
        let socket = crate::supervisor_link::ops::Host::socket(driver.as_ref(), id).await.unwrap();
        let (_, hello) = crate::supervisor_link::client::connect(&socket, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!hello.features.iter().any(|f| f.starts_with("egress")), "{:?}", hello.features);
    };
    driver_contract::egress_contract(driver.clone(), service_spec("egress"), fetch, direct, false, path)
        .await;
}

/// Brokered secrets in a container: the CA and bundle reach it, named by the
/// environment, the key does not, and the value is readable nowhere inside. The test
/// image is busybox (no curl, no Python, no Git: its `wget` verifies no certificate), so
/// no HTTPS client runs inside; the proxy's side is the bubblewrap and Kubernetes tests'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_brokered_contract() {
    let upstream = driver_contract::BrokeredUpstream::start().await;
    let path = upstream.ca_file.path().to_path_buf();
    let Some(driver) = driver_with(|c| c.upstream_ca_file = Some(path)) else { return };
    let driver = std::sync::Arc::new(driver);
    let clients = driver_contract::BrokeredClients::default();
    driver_contract::brokered_contract(driver, service_spec("brokered"), &upstream, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_at_all() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = user_spec("net");
    driver.provision(&spec).await.unwrap();
    let id = spec.sandbox_id();
    // A listener on every host address; the same connection from the host works.
    let listener = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let host_ip = {
        let probe = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        probe.connect("10.255.255.1:9").ok().and_then(|()| probe.local_addr().ok()).map(|a| a.ip())
    };
    let mut targets = vec!["127.0.0.1".to_owned()];
    if let Some(ip) = host_ip.filter(|ip| !ip.is_loopback() && !ip.is_unspecified()) {
        let _probe = std::net::TcpStream::connect((ip, port)).unwrap();
        drop(listener.accept().unwrap());
        targets.push(ip.to_string());
    }
    // The probe works: `nc` inside reaches a listener inside, on the sandbox's loopback.
    let out = sh(
        &driver,
        id,
        // A few tries: the listener may not be listening yet on a loaded machine.
        "for try in 1 2 3 4 5; do \
           nc -l -p 7000 > /tmp/got & sleep 0.$try; echo inside | nc -w 2 127.0.0.1 7000; r=$?; wait; \
           [ \"$r $(cat /tmp/got)\" = '0 inside' ] && break; \
         done; echo \"nc=$r\"; cat /tmp/got",
    )
    .await;
    assert_eq!(text(&out.stdout), "nc=0\ninside\n", "nc works on the sandbox's loopback: {}", shown(&out));
    for target in &targets {
        let out = sh(&driver, id, &format!("echo hi | nc -w 2 {target} {port}; echo \"nc=$?\"")).await;
        assert_eq!(text(&out.stdout), "nc=1\n", "nc ran and failed to reach {target}: {}", shown(&out));
        assert!(
            text(&out.stderr).contains("can't connect"),
            "nc ran and failed to reach {target}: {}",
            shown(&out)
        );
    }
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing reached the host listener");
    let out = sh(&driver, id, "ls /sys/class/net").await;
    assert_eq!(text(&out.stdout).split_whitespace().collect::<Vec<_>>(), ["lo"], "only loopback inside");
    driver.deprovision(id).await.unwrap();
    remove_durable_volumes(&driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_hold() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = service_spec("limits");
    driver.provision(&spec).await.unwrap();
    let id = spec.sandbox_id();

    let out = sh(&driver, id, "ulimit -n; ulimit -f; ulimit -t; id -u; grep CapEff /proc/self/status").await;
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines[..4], ["256", "2048", "10", "1000"], "rlimits (fsize in 512-byte blocks), user");
    assert!(lines[4].ends_with("0000000000000000"), "no capabilities: {}", lines[4]);

    // Memory: a 200 MiB buffer under a 64 MiB limit is killed (SIGKILL, by the OOM killer).
    let out = sh(&driver, id, "dd if=/dev/zero of=/dev/null bs=200M count=1; echo \"dd=$?\"").await;
    assert_eq!(text(&out.stdout), "dd=137\n", "200 MiB allocated under a 64 MiB limit: {}", shown(&out));

    // Files: the file size limit (1 MiB) stops the write at exactly 1 MiB: SIGXFSZ kills
    // dd, or (with the signal ignored) its write fails with EFBIG. Any other failure is
    // not the limit.
    let out = sh(
        &driver,
        id,
        "dd if=/dev/zero of=/workspace/big bs=1M count=4; echo \"dd=$?\"; stat -c %s /workspace/big",
    )
    .await;
    let said = text(&out.stdout);
    assert!(
        said == format!("dd={}\n1048576\n", 128 + libc::SIGXFSZ)
            || (said == "dd=1\n1048576\n" && text(&out.stderr).contains("File too large")),
        "a 4 MiB file under a 1 MiB limit: {}",
        shown(&out)
    );

    // CPU and memory as the engine holds them.
    let docker = driver.docker().await.unwrap();
    let info = docker
        .inspect_container(&container_name(&driver.config.name_prefix, id), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let hc = info.host_config.unwrap();
    assert_eq!(hc.nano_cpus, Some(500_000_000));
    assert_eq!(hc.memory, Some(64 << 20));
    assert_eq!(hc.pids_limit, Some(32));
    assert_eq!(hc.readonly_rootfs, Some(true));

    // Processes: no more than 32 in the container (the forks stop; the sleeps end soon).
    let out = sh(
        &driver,
        id,
        "(for i in $(seq 1 60); do sleep 3 & done) 2>/dev/null; set -- /proc/[0-9]*; echo $#",
    )
    .await;
    let live: u32 = text(&out.stdout).trim().parse().unwrap_or(999);
    assert!((20..=32).contains(&live), "at most 32 processes: saw {live} ({out:?})");
    driver.deprovision(id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_command_and_output_is_capped() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = service_spec("timeout");
    driver.provision(&spec).await.unwrap();
    let id = spec.sandbox_id();
    let started = Instant::now();
    let out = run(&driver, id, &["sh", "-c", "sleep 30 & sleep 31 & sleep 32"], b"", 300).await;
    assert!(out.timed_out, "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    // The group is killed at the timeout; its members are gone a moment later.
    let mut left = String::new();
    for _ in 0..40 {
        let out = sh(&driver, id, "ps -o args | grep -c '^sleep 3' || true").await;
        left = text(&out.stdout).trim().to_owned();
        if left == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, "0", "no sleep survives the timeout");
    // A timeout shorter than the start still kills the command once it starts.
    let out = run(&driver, id, &["sh", "-c", "sleep 40 & sleep 41 & sleep 42"], b"", 1).await;
    assert!(out.timed_out, "{}", shown(&out));
    let mut left = String::new();
    for _ in 0..40 {
        let out = sh(&driver, id, "ps -o args | grep -c '^sleep 4' || true").await;
        left = text(&out.stdout).trim().to_owned();
        if left == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left, "0", "no sleep survives a timeout before the start");

    let out = sh(&driver, id, "yes | head -c 200000; yes e | head -c 100 >&2").await;
    assert!(out.truncated);
    assert_eq!(out.stdout.len(), 64 << 10);
    assert_eq!(out.stderr.len(), 100, "stderr has its own cap and no pid line");

    // Large input is fed while output is read (no deadlock), and counted exactly.
    let input = vec![b'x'; 300_000];
    let out = run(&driver, id, &["wc", "-c"], &input, 10_000).await;
    assert_eq!(text(&out.stdout).trim(), "300000", "{out:?}");

    // The sandbox user cannot end the container: every process it may signal dies, and
    // the sandbox still runs commands.
    let out = run(&driver, id, &["sh", "-c", "kill -KILL -1; sleep 1"], b"", 10_000).await;
    assert!(!out.timed_out, "{out:?}");
    let out = sh(&driver, id, "echo alive").await;
    assert_eq!(text(&out.stdout), "alive\n", "{out:?}");
    driver.deprovision(id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_a_read_only_file_and_nowhere_else() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = user_spec("token");
    driver.provision(&spec).await.unwrap();
    let id = spec.sandbox_id();
    let out = sh(
        &driver,
        id,
        "stat -c '%a %u' \"$SANDLANE_TOKEN_FILE\"; echo x > \"$SANDLANE_TOKEN_FILE\" || echo ro; \
         chmod 666 \"$SANDLANE_TOKEN_FILE\" || echo nochmod; rm -f \"$SANDLANE_TOKEN_FILE\" || echo norm; \
         cat \"$SANDLANE_TOKEN_FILE\"",
    )
    .await;
    assert_eq!(text(&out.stdout), "400 1000\nro\nnochmod\nnorm\ntok-secret-1", "{out:?}");
    let docker = driver.docker().await.unwrap();
    let info = docker
        .inspect_container(&container_name(&driver.config.name_prefix, id), None::<InspectContainerOptions>)
        .await
        .unwrap();
    let config = info.config.unwrap();
    let everything = format!("{:?}{:?}{:?}{:?}", config.env, config.cmd, config.labels, info.args);
    assert!(!everything.contains("tok-secret-1"), "the token is in the container's config");
    assert!(!everything.contains("user-ident-42"), "the identity id is in the container's config");
    // Not on the container's disk either: a read-only bind of the host's token directory,
    // and the supervisor's socket is out of the sandbox user's reach.
    let out =
        sh(&driver, id, "grep ' /run/sandlane ' /proc/self/mountinfo; ls /.sandlane/control || echo closed")
            .await;
    assert!(text(&out.stdout).contains(" ro,") && text(&out.stdout).ends_with("closed\n"), "{out:?}");
    driver.refresh_credential(id, &SandboxToken::new("tok-refreshed"), &spec.environment).await.unwrap();
    let out = sh(
        &driver,
        id,
        "stat -c '%a %u' \"$SANDLANE_TOKEN_FILE\"; ls -A /run/sandlane; cat /run/sandlane/token",
    )
    .await;
    assert_eq!(text(&out.stdout), "400 1000\nca-bundle.pem\nca.pem\ntoken\ntok-refreshed", "{out:?}");
    driver.deprovision(id).await.unwrap();
    remove_durable_volumes(&driver).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_leaves_nothing_and_state_survives_a_restart() {
    let Some((host, image)) = engine() else { return };
    let config = test_config(&host, &image);
    let first = ContainerDriver::new(config.clone()).unwrap();
    let durable = user_spec("restart");
    let ephemeral = service_spec("restart-eph");
    first.provision(&durable).await.unwrap();
    first.provision(&ephemeral).await.unwrap();
    let prefix = config.name_prefix.clone();
    let durable_volume = volume_name(&prefix, durable.sandbox_id(), &durable.key, durable.durability);
    let eph_volume = ephemeral_volume_name(&prefix, ephemeral.sandbox_id());
    assert!(volume_exists(&first, &eph_volume).await);

    // A new driver (a restarted server) finds both by their labels.
    let second = ContainerDriver::new(config).unwrap();
    let mut listed = second.list().await.unwrap();
    listed.sort();
    let mut want = vec![durable.sandbox_id().clone(), ephemeral.sandbox_id().clone()];
    want.sort();
    assert_eq!(listed, want);
    let out = sh(&second, ephemeral.sandbox_id(), "echo $SANDLANE_CALLER_CLASS").await;
    assert_eq!(text(&out.stdout), "service\n");
    second
        .refresh_credential(durable.sandbox_id(), &SandboxToken::new("tok-new"), &durable.environment)
        .await
        .unwrap();
    let out = sh(&second, durable.sandbox_id(), "cat $SANDLANE_TOKEN_FILE").await;
    assert_eq!(text(&out.stdout), "tok-new");

    // A container whose supervisor is gone (an engine restart leaves it stopped) is
    // removed, and the sandbox answers NotFound: the lane provisions a fresh one.
    let docker = second.docker().await.unwrap();
    let name = container_name(&prefix, durable.sandbox_id());
    docker.kill_container(&name, None::<bollard::query_parameters::KillContainerOptions>).await.unwrap();
    let request = domain::ExecRequest::new(vec!["true".into()], vec![], None).unwrap();
    assert!(matches!(second.exec(durable.sandbox_id(), &request).await, Err(DriverError::NotFound(_))));
    assert!(!container_exists(&second, durable.sandbox_id()).await, "what was left is removed");
    assert!(volume_exists(&second, &durable_volume).await, "the durable workspace stays");

    for spec in [&durable, &ephemeral] {
        second.deprovision(spec.sandbox_id()).await.unwrap();
        second.deprovision(spec.sandbox_id()).await.unwrap();
        assert!(!container_exists(&second, spec.sandbox_id()).await, "the container is gone");
    }
    assert!(!volume_exists(&second, &eph_volume).await, "the ephemeral volume is gone");
    assert!(volume_exists(&second, &durable_volume).await, "the durable volume stays");
    assert!(second.list().await.unwrap().is_empty());
    // The first driver's memory of them is no help: they are gone.
    let request = domain::ExecRequest::new(vec!["true".into()], vec![], None).unwrap();
    assert!(matches!(first.exec(durable.sandbox_id(), &request).await, Err(DriverError::NotFound(_))));
    second.remove_volume(&durable_volume).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_provisions_of_one_sandbox_agree_and_a_bad_image_leaves_nothing() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = service_spec("race");
    let (a, b) = tokio::join!(driver.provision(&spec), driver.provision(&spec));
    a.unwrap();
    b.unwrap();
    assert_eq!(driver.list().await.unwrap(), [spec.sandbox_id().clone()]);
    // The same id for another key is refused.
    let mut other = service_spec("race-other");
    other.environment = spec.environment.clone();
    assert!(matches!(driver.provision(&other).await, Err(DriverError::Failed(_))));
    let out = sh(&driver, spec.sandbox_id(), "echo still").await;
    assert_eq!(text(&out.stdout), "still\n", "a refused provision leaves the live sandbox alone");
    driver.deprovision(spec.sandbox_id()).await.unwrap();

    let Some(broken) = driver_with(|c| c.image = "localhost/sandlane-no-such-image:none".to_owned()) else {
        return;
    };
    assert!(!broken.health().await.usable);
    let spec = service_spec("broken");
    let err = broken.provision(&spec).await.unwrap_err();
    assert!(matches!(&err, DriverError::Failed(m) if m.to_string().contains("not present")), "{err}");
    assert!(!container_exists(&broken, spec.sandbox_id()).await);
    let volume = ephemeral_volume_name(&broken.config.name_prefix, spec.sandbox_id());
    assert!(!volume_exists(&broken, &volume).await, "nothing left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_is_not_there_is_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let host = format!("unix://{}/none.sock", dir.path().display());
    let driver = ContainerDriver::new(ContainerConfig::new(host, "img")).unwrap();
    let health = driver.health().await;
    assert!(!health.usable);
    assert!(health.detail.contains("none.sock"), "{}", health.detail);
    let err = driver.provision(&service_spec("x")).await.unwrap_err();
    assert!(matches!(err, DriverError::Unavailable(_)), "{err}");
    assert!(matches!(
        ContainerDriver::new(ContainerConfig::new("tcp://localhost:2375", "img")),
        Err(DriverError::Unavailable(_))
    ));
}

/// Runs `script` in the sandbox's container as root, with the container's capabilities
/// (what its supervisor could do, were it taken over by the sandbox), through the
/// engine's exec: its exit code and output.
async fn as_root(driver: &ContainerDriver, id: &SandboxId, script: &str) -> (i64, String) {
    use futures_util::StreamExt;
    let docker = driver.docker().await.unwrap();
    let name = container_name(&driver.config.name_prefix, id);
    let options = bollard::exec::CreateExecOptions {
        cmd: Some(vec!["sh", "-c", script]),
        user: Some("0:0"),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        ..Default::default()
    };
    let exec = docker.create_exec(&name, options).await.unwrap();
    let mut said = String::new();
    if let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.unwrap()
    {
        while let Some(Ok(chunk)) = output.next().await {
            said.push_str(&chunk.to_string());
        }
    }
    let code = docker.inspect_exec(&exec.id).await.unwrap().exit_code.unwrap_or(-1);
    (code, said)
}

/// The bytes the files under `dir` hold on their filesystems.
fn bytes_under(dir: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match std::fs::symlink_metadata(e.path()) {
            Ok(m) if m.is_dir() => bytes_under(&e.path()),
            Ok(m) => m.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

/// The one host directory a container writes (its control directory, where its
/// supervisor listens) holds at most 64 KiB and 16 entries, whoever writes in it: its
/// root, writing without end, is stopped there (`ENOSPC`), the data dir's disk gets none
/// of it, and the sandbox goes on. Deprovision leaves no mount behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_writing_into_its_control_directory_is_stopped_at_its_cap() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = service_spec("control");
    driver.provision(&spec).await.unwrap();
    let id = spec.sandbox_id();
    let control = driver.state(id).join("control");
    let (code, said) = as_root(
        &driver,
        id,
        "dd if=/dev/zero of=/.sandlane/control/fill bs=4096 count=1024 2>&1; echo \"dd=$?\"; \
         i=0; while [ $i -lt 100 ] && (true > /.sandlane/control/f$i) 2>/dev/null; do i=$((i+1)); done; \
         echo \"files=$i\"; ls /.sandlane/control | grep -c .",
    )
    .await;
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("No space left on device") && said.contains("dd=1\n"),
        "dd stopped at the cap: {said}"
    );
    let files: u64 = said.lines().find_map(|l| l.strip_prefix("files=")).unwrap().parse().unwrap();
    assert!(files < super::control::CONTROL_INODES, "{said}");
    let fill = std::fs::metadata(control.join("fill")).unwrap().len();
    assert!(fill <= super::control::CONTROL_BYTES, "the host sees {fill} bytes written into control/");
    // Less the sandbox's CA, which the server writes once per start (the bundle holds the
    // host's system roots).
    let ca: u64 = ["run/ca.pem", "run/ca-bundle.pem", "ca.key"]
        .iter()
        .map(|f| std::fs::metadata(driver.state(id).join(f)).map_or(0, |m| m.len()))
        .sum();
    let stored = bytes_under(&driver.state(id)) - ca;
    assert!(stored <= super::control::CONTROL_BYTES + 16 * 4096, "the host state holds {stored} bytes");
    let out = sh(&driver, id, "echo alive").await;
    assert_eq!(text(&out.stdout), "alive\n", "the sandbox goes on: {}", shown(&out));
    driver.deprovision(id).await.unwrap();
    assert!(!driver.state(id).exists(), "the host state is gone");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&driver.config.state_dir.display().to_string()), "a mount is left: {mounts}");
    let _ = std::fs::remove_dir_all(&driver.config.state_dir);
}

/// A container's own messages (what its supervisor writes to standard output and error)
/// are held by the engine to `LOG_BYTES`: an init that writes without end, under the
/// driver's host config, never makes the engine's log of it larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_writing_its_log_without_end_is_stopped_at_its_cap() {
    let Some(driver) = driver_with(|_| {}) else { return };
    let spec = service_spec("log-flood");
    let id = spec.sandbox_id();
    driver.prepare_state(&spec).unwrap();
    let docker = driver.docker().await.unwrap();
    let name = container_name(&driver.config.name_prefix, id);
    let volume = ephemeral_volume_name(&driver.config.name_prefix, id);
    let body = bollard::models::ContainerCreateBody {
        image: Some(driver.config.image.clone()),
        entrypoint: Some(vec![
            "/bin/sh".to_owned(),
            "-c".to_owned(),
            "while :; do head -c 1048576 /dev/zero | tr '\\0' x; done".to_owned(),
        ]),
        cmd: Some(Vec::new()),
        user: Some("0:0".to_owned()),
        host_config: Some(driver.host_config(id, &volume).unwrap()),
        ..Default::default()
    };
    let options =
        bollard::query_parameters::CreateContainerOptions { name: Some(name.clone()), ..Default::default() };
    docker.create_container(Some(options), body).await.unwrap();
    docker.start_container(&name, None).await.unwrap();
    let info = docker.inspect_container(&name, None::<InspectContainerOptions>).await.unwrap();
    let log = std::path::PathBuf::from(info.log_path.expect("the engine's log path"));
    let mut largest = 0;
    let mut grew = false;
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let size = std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        grew |= size > 0;
        largest = largest.max(size);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    driver.remove_container(id).await.unwrap();
    driver.remove_volume(&volume).await.unwrap();
    driver.release_control(id).unwrap();
    let _ = std::fs::remove_dir_all(&driver.config.state_dir);
    assert!(grew, "the container wrote its log (positive control)");
    // The engine rotates once a write takes it past the cap: at most one write more.
    assert!(largest <= super::LOG_BYTES + (16 << 10), "the engine's log grew to {largest} bytes");
}
