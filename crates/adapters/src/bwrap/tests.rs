//! Tests of the bubblewrap driver against the real `bwrap` (installed by the test
//! command when missing): isolation, limits, environment, token, durability.
//!
//! They run as root, as on the test machine: the sandboxes then get their own host uids,
//! which the process checks count. As another user the sandboxes share the server's uid
//! and those checks do not apply (the driver contract still passes).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::driver_contract;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, Instant};

use domain::{CallerClass, Durability, ExecOutput, SandboxId, SandboxToken};
use ports::driver::{DriverError, ProvisionSpec, SandboxDriver};

use super::limits::pids_of_uid;
use super::{BwrapConfig, BwrapDriver, Limits};
use driver_contract::{run, shown, spec_for};

/// The driver's settings for a test: the data dir `data_dir`, the host dir beside it (its
/// own: host uid claims and sandbox roots stay in the test's temporary directory).
fn test_config(data_dir: &Path) -> BwrapConfig {
    let mut config = BwrapConfig::new(data_dir);
    config.host_dir = data_dir.parent().unwrap().join("host");
    config.limits = Limits {
        processes: 64,
        open_files: 256,
        address_space_bytes: 256 << 20,
        file_size_bytes: 16 << 20,
        cpu_secs: 10,
        memory_bytes: 256 << 20,
        cpu_millis: 1000,
    };
    config.supervisor = crate::supervisor_link::locate_for_tests().unwrap_or_else(|e| panic!("{e}"));
    config.output_cap_bytes = 64 << 10;
    config.tmp_size_bytes = Some(32 << 20);
    config.probe_timeout = Duration::from_secs(5);
    config.cgroup_parent = "sandlane-test".to_owned();
    config
}

struct Fixture {
    dir: tempfile::TempDir,
    driver: std::sync::Arc<BwrapDriver>,
}

impl Drop for Fixture {
    /// Resident sandboxes outlive their driver: end the ones a test left.
    fn drop(&mut self) {
        let driver = &self.driver;
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                rt.block_on(async {
                    for id in driver.list().await.unwrap_or_default() {
                        let _ = driver.deprovision(&id).await;
                    }
                });
            });
        });
        // The test's token root in /dev/shm, once empty (the driver never removes it).
        if driver.tokens.in_memory {
            let _ = std::fs::remove_dir(driver.tokens.path.join("env"));
            let _ = std::fs::remove_dir(&driver.tokens.path);
        }
    }
}

fn fixture_with(edit: impl FnOnce(&mut BwrapConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&dir.path().join("data"));
    edit(&mut config);
    let driver = BwrapDriver::new(config).unwrap();
    Fixture { dir, driver }
}

fn fixture() -> Fixture {
    fixture_with(|_| {})
}

/// An org of this test process: durable keys (and so host uids) differ between tests
/// running at the same time.
fn org() -> String {
    static ORG: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ORG.get_or_init(|| {
        let id = driver_contract::new_sandbox_id();
        format!("org-{}", id.as_str()[4..].to_ascii_lowercase())
    })
    .clone()
}

fn user_spec(session: &str) -> ProvisionSpec {
    spec_for(&org(), session, "user-ident-42", CallerClass::User, Durability::Durable, "tok-secret-1")
}

async fn provisioned(f: &Fixture, spec: &ProvisionSpec) -> SandboxId {
    f.driver.provision(spec).await.unwrap();
    spec.sandbox_id().clone()
}

async fn sh(f: &Fixture, id: &SandboxId, script: &str) -> ExecOutput {
    run(&*f.driver, id, &["sh", "-c", script], b"", 10_000).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn host_uid(f: &Fixture, id: &SandboxId) -> u32 {
    f.driver.layout.read_meta(id).unwrap().unwrap().host_id
}

async fn wait_no_process(uid: u32) -> Vec<i32> {
    wait_processes(uid, 0).await
}

/// Waits until host uid `uid` has at most `n` processes (the sandbox's bubblewrap and
/// supervisor are 2); returns them.
async fn wait_processes(uid: u32, n: usize) -> Vec<i32> {
    for _ in 0..250 {
        if pids_of_uid(uid).len() <= n {
            return pids_of_uid(uid);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pids_of_uid(uid)
}

/// The sandbox's own processes when idle: bubblewrap (outside) and the supervisor.
const IDLE: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_driver_contract() {
    let f = fixture();
    let l = f.driver.config.limits;
    let limits = driver_contract::ExpectedLimits {
        open_files: l.open_files,
        processes: l.processes,
        file_size_bytes: l.file_size_bytes,
    };
    driver_contract::driver_contract(&*f.driver, limits).await;
}

#[test]
fn a_release_message_round_trips_and_loop_paths_are_written_in_place() {
    use super::spawn::{Device, NO_DROP, Release, loop_path};
    let device = |number| Some(Device { number, uid: 1_900_000_123, gid: 1_900_000_124 });
    for release in [
        Release { uid: 1_900_000_123, device: device(0) },
        Release { uid: NO_DROP, device: None },
        Release { uid: 7, device: device(u32::MAX - 1) },
    ] {
        assert_eq!(Release::decode(&release.encode()), release);
    }
    for (number, want) in [(0, "/dev/loop0"), (85, "/dev/loop85"), (4_294_967_294, "/dev/loop4294967294")] {
        let mut buf = [0xffu8; 24];
        let at = loop_path(number, &mut buf);
        assert_eq!(at, buf.as_ptr().cast(), "written in the buffer given");
        let written = std::ffi::CStr::from_bytes_until_nul(&buf).unwrap();
        assert_eq!(written.to_str().unwrap(), want);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_image_is_mounted_in_the_sandbox_alone_and_goes_with_it() {
    let f = fixture();
    for durability in [Durability::Ephemeral, Durability::Durable] {
        let mut spec =
            spec_for(&org(), &format!("mnt-{durability}"), "u-mnt", CallerClass::User, durability, "tok-m");
        spec.workspace_bytes = Some(8 << 20);
        let id = provisioned(&f, &spec).await;
        let meta = f.driver.layout.read_meta(&id).unwrap().unwrap();
        let image = meta.workspace_image.clone().expect("a workspace with a quota has an image");
        // Not in the host's mount table: other sandboxes' starts never copy or read it.
        assert!(!crate::workspace_image::is_mounted(&meta.workspace).unwrap(), "{durability}: host mount");
        assert_eq!(crate::workspace_image::loop_devices_backed_by(&image).len(), 1, "{durability}");
        // The sandbox has it: its own filesystem of the quota's size, its root the sandbox's.
        let out = sh(&f, &id, "stat -f -c '%b %S' /workspace; stat -c '%u %a' /workspace; head -c 3145728 /dev/zero > /workspace/three && echo ok").await;
        let said = text(&out.stdout);
        let mut lines = said.lines();
        let size: u64 = lines
            .next()
            .and_then(|l| l.split_once(' '))
            .map(|(b, s)| b.parse::<u64>().unwrap() * s.parse::<u64>().unwrap())
            .expect("statfs of /workspace");
        assert!((8 << 20..=24 << 20).contains(&size), "{durability}: the workspace's filesystem: {said}");
        assert_eq!(lines.next(), Some("1000 700"), "{durability}: {}", shown(&out));
        assert_eq!(lines.next(), Some("ok"), "{durability}: {}", shown(&out));
        // Metrics read it through the sandbox's own namespace.
        let used = f.driver.workspace_usage(&id).await.expect("usage of a mounted workspace");
        assert!(used >= 3 << 20, "{durability}: {used} bytes used");
        if durability == Durability::Durable {
            // Suspended: the processes end, the mount with them, the device with the mount.
            f.driver.suspend(&id).await.unwrap();
            assert_eq!(
                crate::workspace_image::wait_detached(&image),
                Vec::<String>::new(),
                "{durability}: suspended"
            );
            assert_eq!(f.driver.workspace_usage(&id).await, None);
            spec.epoch = 2;
            f.driver.provision(&spec).await.unwrap();
            let back = sh(&f, &id, "wc -c < /workspace/three").await;
            assert_eq!(text(&back.stdout).trim(), "3145728", "{}", shown(&back));
        }
        f.driver.deprovision(&id).await.unwrap();
        assert_eq!(
            crate::workspace_image::wait_detached(&image),
            Vec::<String>::new(),
            "{durability}: deprovisioned"
        );
        assert!(!crate::workspace_image::is_mounted(&meta.workspace).unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_image_that_does_not_mount_fails_the_provision_and_leaves_nothing() {
    use std::io::{Seek, SeekFrom, Write};
    let f = fixture();
    let mut spec =
        spec_for(&org(), "mnt-broken", "u-broken", CallerClass::User, Durability::Durable, "tok-b");
    spec.workspace_bytes = Some(8 << 20);
    let id = provisioned(&f, &spec).await;
    let image = f.driver.layout.read_meta(&id).unwrap().unwrap().workspace_image.expect("an image");
    let uid = host_uid(&f, &id);
    f.driver.deprovision(&id).await.unwrap();
    assert_eq!(crate::workspace_image::wait_detached(&image), Vec::<String>::new());
    // The durable image stays; its superblock is lost (a damaged disk, a bad copy).
    let mut file = std::fs::OpenOptions::new().write(true).open(&image).unwrap();
    file.seek(SeekFrom::Start(1024)).unwrap();
    file.write_all(&[0u8; 1024]).unwrap();
    drop(file);
    // The key's next sandbox (a new id) finds the image and cannot mount it.
    let mut again =
        spec_for(&org(), "mnt-broken", "u-broken", CallerClass::User, Durability::Durable, "tok-c");
    again.workspace_bytes = Some(8 << 20);
    let err = f.driver.provision(&again).await.expect_err("an image that does not mount");
    assert!(err.to_string().contains("cannot mount the sandbox's workspace image (errno "), "{err}");
    assert_eq!(crate::workspace_image::wait_detached(&image), Vec::<String>::new(), "no device left");
    assert_eq!(wait_no_process(uid).await, Vec::<i32>::new(), "no process left");
    assert!(!f.driver.list().await.unwrap().contains(again.sandbox_id()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_quota_and_suspend_contract() {
    let f = fixture();
    driver_contract::quota_and_suspend_contract(&*f.driver, &org()).await;
    f.driver.end_ahead().await;
    // The durable workspace's image stays in the data dir, root only; the ephemeral ones
    // are gone; nothing is left mounted.
    let images = f.dir.path().join("data/images");
    let durable: Vec<_> = walk(&images.join("durable"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "img"))
        .collect();
    assert_eq!(durable.len(), 1, "{durable:?}");
    assert_eq!(std::fs::metadata(&durable[0]).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(walk(&images.join("ephemeral")).iter().all(|p| p.extension().is_none_or(|e| e != "img")));
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&f.dir.path().display().to_string()), "a workspace is still mounted");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().flat_map(|e| if e.path().is_dir() { walk(&e.path()) } else { vec![e.path()] }).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_resident_contract() {
    let f = fixture();
    let limits = driver_contract::ContractLimits { processes: 64, memory_mib: 256 };
    let dir = tempfile::tempdir().unwrap();
    let driver = BwrapDriver::new(test_config(&dir.path().join("data"))).unwrap();
    drop(f);
    driver_contract::resident_contract(driver, limits).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_streams_contract() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(&dir.path().join("data"));
    let limits = driver_contract::StreamsLimits {
        output_cap: config.output_cap_bytes as u64,
        file_size_bytes: config.limits.file_size_bytes,
        host_dir: config.data_dir.clone(),
    };
    let driver = BwrapDriver::new(config).unwrap();
    driver_contract::streams_contract(driver, limits).await;
}

/// Brokered secrets in a real sandbox: curl, Python's urllib and `git ls-remote`, with
/// nothing but the sandbox's environment, reach a TLS server on the host's loopback that
/// sees the injected header; the value is not readable inside.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_brokered_contract() {
    let upstream = driver_contract::BrokeredUpstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.upstream_ca_file = Some(upstream.ca_file.path().to_path_buf());
    let driver = BwrapDriver::new(config).unwrap();
    let clients = driver_contract::BrokeredClients { curl: true, python: true, git: true };
    driver_contract::brokered_contract(driver.clone(), user_spec("brokered"), &upstream, clients).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passes_the_egress_contract() {
    let dir = tempfile::tempdir().unwrap();
    let driver = BwrapDriver::new(test_config(&dir.path().join("data"))).unwrap();
    let fetch = "curl -sS --max-time 10";
    let direct = "direct() { curl -sS --noproxy '*' --max-time 10 http://127.0.0.1:$1/direct; }; direct";
    // The server accepted on the socket it opened in the sandbox's namespace: the
    // supervisor serves no egress of its own (listens on no port, holds nothing).
    let path = async |id: &SandboxId| {
        let socket = crate::supervisor_link::ops::Host::socket(driver.as_ref(), id).await.unwrap();
        let (_, hello) = crate::supervisor_link::client::connect(&socket, std::time::Duration::from_secs(5))
            .await
            .unwrap();
        assert!(!hello.features.iter().any(|f| f.starts_with("egress")), "{:?}", hello.features);
    };
    driver_contract::egress_contract(driver.clone(), user_spec("egress"), fetch, direct, true, path).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_network_to_the_host_loopback_and_no_name_resolution() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("net")).await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // The same connection from the host works, so a refusal inside is the sandbox's.
    let _probe = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    drop(listener.accept().unwrap());
    let out = run(
        &*f.driver,
        &id,
        &["bash", "-c", &format!("echo hi > /dev/tcp/127.0.0.1/{port} && echo connected")],
        b"",
        10_000,
    )
    .await;
    // bash ran and tried: the sandbox's own loopback refuses (nothing listens there).
    assert_eq!((out.exit_code, text(&out.stdout)), (1, String::new()), "{}", shown(&out));
    assert!(text(&out.stderr).contains("Connection refused"), "{}", shown(&out));
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "nothing reached the host listener");

    // getent is there and runs inside...
    let out = run(&*f.driver, &id, &["getent", "--version"], b"", 10_000).await;
    assert_eq!(out.exit_code, 0, "getent runs inside: {}", shown(&out));
    assert!(text(&out.stdout).starts_with("getent "), "{}", shown(&out));
    // ...and finds no name: exit 2 is getent's "not found" (127 would be a missing getent,
    // 126 one it cannot run, 1 a usage error).
    for name in ["localhost", "example.com"] {
        let out = run(&*f.driver, &id, &["getent", "hosts", name], b"", 10_000).await;
        assert_eq!(out.exit_code, 2, "{name}: {}", shown(&out));
        assert_eq!(text(&out.stdout), "", "{name} resolved");
    }
    let out = sh(&f, &id, "cat /sys/class/net/*/operstate 2>/dev/null; ls /etc/resolv.conf").await;
    assert_ne!(out.exit_code, 0, "no resolv.conf inside");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_only_to_workspace_and_tmp() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("writes")).await;
    for dir in ["/", "/usr", "/usr/bin", "/etc", "/bin", "/run", "/run/sandlane", "/dev", "/proc"] {
        let out = sh(&f, &id, &format!("echo x > {dir}/sandlane-probe")).await;
        assert_ne!(out.exit_code, 0, "could write in {dir}");
    }
    let out = sh(&f, &id, "echo x > /run/sandlane/token").await;
    assert_ne!(out.exit_code, 0, "could overwrite the token");
    let out = sh(&f, &id, "mkdir -p /home/x || mkdir /root").await;
    assert_ne!(out.exit_code, 0);
    let out = sh(&f, &id, "echo a > /workspace/a && echo b > /tmp/b && cat /workspace/a /tmp/b").await;
    assert_eq!((out.exit_code, text(&out.stdout)), (0, "a\nb\n".into()), "{}", text(&out.stderr));
    // /tmp is the sandbox's own: another sandbox starts with an empty one.
    let other = provisioned(&f, &user_spec("writes-other")).await;
    let out = sh(&f, &other, "ls -A /tmp").await;
    assert_eq!(text(&out.stdout), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_paths_and_other_sandboxes_are_unreachable_even_through_links() {
    let f = fixture();
    let data_dir = f.dir.path().join("data");
    let a = provisioned(&f, &user_spec("a")).await;
    let b = provisioned(&f, &user_spec("b")).await;
    let b_ws = f.driver.layout.read_meta(&b).unwrap().unwrap().workspace;
    std::fs::write(b_ws.join("secret-of-b"), "b").unwrap();
    // A database socket in the data dir and one in the host's /tmp.
    let db_sock = data_dir.join("db.sock");
    let _db = std::os::unix::net::UnixListener::bind(&db_sock).unwrap();
    let host_tmp = tempfile::tempdir_in("/tmp").unwrap();
    let tmp_sock = host_tmp.path().join(".s.PGSQL.5432");
    let _pg = std::os::unix::net::UnixListener::bind(&tmp_sock).unwrap();

    let targets = [
        "/root".to_owned(),
        data_dir.display().to_string(),
        b_ws.display().to_string(),
        b_ws.join("secret-of-b").display().to_string(),
        db_sock.display().to_string(),
        tmp_sock.display().to_string(),
        f.driver.layout.token_path(&b).display().to_string(),
    ];
    for target in &targets {
        let out = sh(&f, &a, &format!("ls -la '{target}'")).await;
        assert_ne!(out.exit_code, 0, "{target} reachable: {}", text(&out.stdout));
        // Through a symlink and through `..` planted in the workspace.
        let out = sh(
            &f,
            &a,
            &format!("ln -sfn '{target}' /workspace/link && cat /workspace/link || ls /workspace/link/"),
        )
        .await;
        assert_ne!(out.exit_code, 0, "{target} reachable through a link");
        let out = sh(&f, &a, &format!("cd /workspace && ls ../../../..{target}")).await;
        assert_ne!(out.exit_code, 0, "{target} reachable through ..");
    }
    let out = sh(&f, &a, "cd /workspace/../.. && ls -A").await;
    let listing = text(&out.stdout);
    assert!(!listing.contains("root") && !listing.contains("home"), "{listing}");

    // The host side never follows a link planted in an ephemeral workspace.
    let eph = spec_for(&org(), "eph", "svc", CallerClass::Service, Durability::Ephemeral, "t");
    let e = provisioned(&f, &eph).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep").unwrap();
    let e_ws = f.driver.layout.read_meta(&e).unwrap().unwrap().workspace;
    std::os::unix::fs::symlink(outside.path(), e_ws.join("escape")).unwrap();
    f.driver.deprovision(&e).await.unwrap();
    assert!(!e_ws.exists());
    assert_eq!(std::fs::read_to_string(outside.path().join("precious")).unwrap(), "keep");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_capabilities_and_no_new_privileges() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("caps")).await;
    let out = run(&*f.driver, &id, &["cat", "/proc/self/status"], b"", 10_000).await;
    let status = text(&out.stdout);
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
            .unwrap_or_else(|| panic!("{name} missing in {status}"))
    };
    for cap in ["CapInh:", "CapPrm:", "CapEff:", "CapBnd:", "CapAmb:"] {
        assert_eq!(field(cap), "0000000000000000", "{cap}");
    }
    assert_eq!(field("NoNewPrivs:"), "1");
    assert!(field("Uid:").starts_with("1000"), "unprivileged uid inside");
    // And on the host the processes run as an unprivileged uid too.
    let uid = host_uid(&f, &id);
    assert!(uid >= 1_000_000, "host uid {uid}");
}

/// Sets host variables (process-wide), so it runs its own runtime after doing so.
#[test]
#[allow(unsafe_code)]
fn environment_is_exactly_the_contract_and_no_descriptor_leaks() {
    // SAFETY: nextest runs every test in its own process, and this happens before any
    // other thread of this test exists.
    unsafe {
        std::env::set_var("DATABASE_URL", "postgres://host-secret");
        std::env::set_var("SANDLANE_DATABASE_URL", "postgres://host-secret");
    }
    // A descriptor the server holds without close-on-exec must not reach the sandbox.
    let leak = std::fs::File::open("/etc/hostname").unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: clears FD_CLOEXEC on a descriptor this test owns.
        unsafe { libc::fcntl(leak.as_raw_fd(), libc::F_SETFD, 0) };
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let f = fixture();
        let spec = user_spec("env");
        let id = provisioned(&f, &spec).await;
        let mut want: Vec<String> = spec.environment.vars().iter().map(|(k, v)| format!("{k}={v}")).collect();
        want.sort();

        let out = run(&*f.driver, &id, &["env"], b"", 10_000).await;
        let mut seen: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
        seen.sort();
        assert_eq!(seen, want);

        let out = run(&*f.driver, &id, &["cat", "/proc/self/environ"], b"", 10_000).await;
        let mut environ: Vec<String> =
            text(&out.stdout).split('\0').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        environ.sort();
        assert_eq!(environ, want);
        let raw = text(&out.stdout);
        for absent in ["DATABASE_URL", "host-secret", "user-ident-42", "tok-secret-1"] {
            assert!(!raw.contains(absent), "{absent} in the environment");
        }

        let out = run(&*f.driver, &id, &["ls", "/proc/self/fd"], b"", 10_000).await;
        let fds: Vec<String> = text(&out.stdout).split_whitespace().map(str::to_owned).collect();
        // 0-2 and the directory `ls` itself opened.
        assert_eq!(fds, ["0", "1", "2", "3"], "inherited descriptors: {fds:?}");
    });
    drop(leak);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_file_is_read_only_0400_and_never_in_the_environment() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("tok")).await;
    let out = sh(&f, &id, "cat \"$SANDLANE_TOKEN_FILE\"; echo; stat -c '%a %u' /run/sandlane/token").await;
    assert_eq!(text(&out.stdout), "tok-secret-1\n400 1000\n");
    let out =
        sh(&f, &id, "chmod 600 /run/sandlane/token || rm -f /run/sandlane/token; cat /run/sandlane/token")
            .await;
    assert_eq!(text(&out.stdout), "tok-secret-1", "token untouched");
    let out = sh(&f, &id, "env; cat /proc/self/environ").await;
    assert!(!text(&out.stdout).contains("tok-secret-1"));

    let host = std::fs::metadata(f.driver.layout.token_path(&id)).unwrap();
    assert_eq!(host.permissions().mode() & 0o777, 0o400);
    assert_eq!(host.uid(), host_uid(&f, &id));

    let env = f.driver.layout.read_meta(&id).unwrap().unwrap().environment;
    f.driver.refresh_credential(&id, &SandboxToken::new("tok-secret-2"), &env).await.unwrap();
    let out = sh(&f, &id, "cat /run/sandlane/token").await;
    assert_eq!(text(&out.stdout), "tok-secret-2");
    let host = std::fs::metadata(f.driver.layout.token_path(&id)).unwrap();
    assert_eq!(host.permissions().mode() & 0o777, 0o400);

    // The token is in memory where the host has a tmpfs at /dev/shm (as this one does):
    // never written to a disk.
    let df = std::process::Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(f.driver.layout.token_path(&id))
        .output()
        .unwrap();
    let shm = std::process::Command::new("stat").args(["-f", "-c", "%T", "/dev/shm"]).output().unwrap();
    if String::from_utf8_lossy(&shm.stdout).trim() == "tmpfs" {
        assert_eq!(String::from_utf8_lossy(&df.stdout).trim(), "tmpfs");
        assert!(f.driver.health().await.detail.contains("tokens: in memory"));
    }
}

/// Forks sleeping children until a fork fails; prints how many it got.
const FORK_COUNT: &str = r#"
    my $n = 0;
    for (1..500) {
        my $p = fork();
        if (!defined $p) { print "limit at $n\n"; exit 0 }
        if ($p == 0) { sleep 2; exit 0 }
        $n++;
    }
    print "no limit\n""#;

async fn fork_limit(f: &Fixture, session: &str) {
    let id = provisioned(f, &user_spec(session)).await;
    let out = run(&*f.driver, &id, &["perl", "-e", FORK_COUNT], b"", 10_000).await;
    let said = text(&out.stdout);
    let n: u64 = said
        .strip_prefix("limit at ")
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("fork loop not stopped: {said:?} {}", text(&out.stderr)));
    assert!(n < 64, "{n} processes");
    // A real fork bomb ends at the timeout, and takes nothing with it.
    let start = Instant::now();
    let out = run(&*f.driver, &id, &["bash", "-c", "b() { b | b & }; b; sleep 30"], b"", 2_000).await;
    assert!(out.exit_code != 0 || out.timed_out);
    assert!(start.elapsed() < Duration::from_secs(8), "{:?}", start.elapsed());
    assert_eq!(wait_processes(host_uid(f, &id), IDLE).await.len(), IDLE, "the bomb's processes are gone");
    let out = sh(f, &id, "echo alive").await;
    assert_eq!(text(&out.stdout), "alive\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_is_stopped_by_the_process_limit() {
    let f = fixture();
    assert!(f.driver.limits_mode().contains("pids"), "{}", f.driver.limits_mode());
    fork_limit(&f, "forks-cgroup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_is_stopped_by_rlimits_without_cgroups() {
    let f = fixture_with(|c| c.use_cgroups = false);
    assert!(f.driver.limits_mode().starts_with("rlimits (no cgroup"));
    fork_limit(&f, "forks-rlimit").await;
}

const HOG: &str = r#"my @a; for (1..64) { push @a, "x" x (16 << 20) } print "survived\n""#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_is_stopped_by_the_address_space_limit() {
    let f = fixture_with(|c| c.use_cgroups = false);
    let id = provisioned(&f, &user_spec("hog")).await;
    let out = run(&*f.driver, &id, &["perl", "-e", HOG], b"", 10_000).await;
    assert_ne!(out.exit_code, 0);
    assert!(!text(&out.stdout).contains("survived"));
    assert!(text(&out.stderr).contains("Out of memory"), "perl ran out of address space: {}", shown(&out));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hog_is_stopped_by_the_memory_cgroup() {
    let f = fixture_with(|c| {
        c.limits.address_space_bytes = 8 << 30;
        c.limits.memory_bytes = 128 << 20;
    });
    assert!(f.driver.limits_mode().contains("memory"), "{}", f.driver.limits_mode());
    let id = provisioned(&f, &user_spec("hog2")).await;
    let out = run(&*f.driver, &id, &["perl", "-e", HOG], b"", 10_000).await;
    assert_eq!(out.exit_code, 128 + 9, "killed by the OOM killer: {out:?}");
    assert!(!text(&out.stdout).contains("survived"));
}

async fn timeout_kills_the_tree(f: &Fixture, session: &str) {
    let id = provisioned(f, &user_spec(session)).await;
    let start = Instant::now();
    let out = sh_timeout(f, &id, "sleep 30 & sleep 31 & echo started; sleep 32", 500).await;
    assert!(out.timed_out);
    assert_eq!(text(&out.stdout), "started\n");
    assert!(start.elapsed() < Duration::from_secs(5), "{:?}", start.elapsed());
    assert_eq!(wait_processes(host_uid(f, &id), IDLE).await.len(), IDLE, "children survived");
}

async fn sh_timeout(f: &Fixture, id: &SandboxId, script: &str, ms: u64) -> ExecOutput {
    run(&*f.driver, id, &["sh", "-c", script], b"", ms).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_sleeping_children() {
    timeout_kills_the_tree(&fixture(), "timeout-cgroup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_sleeping_children_without_cgroups() {
    timeout_kills_the_tree(&fixture_with(|c| c.use_cgroups = false), "timeout-rlimit").await;
}

/// The host's mount table and every mount namespace of `pids`, as text.
fn mounts_of(pids: &[i32]) -> String {
    pids.iter().filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/mountinfo")).ok()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deprovision_leaves_no_process_cgroup_or_mount() {
    let f = std::sync::Arc::new(fixture());
    let id = provisioned(&f, &user_spec("deprov")).await;
    let uid = host_uid(&f, &id);
    let running = {
        let f = f.clone();
        let id = id.clone();
        tokio::spawn(
            async move { run(&*f.driver, &id, &["sh", "-c", "sleep 60 & sleep 61"], b"", 30_000).await },
        )
    };
    for _ in 0..100 {
        if pids_of_uid(uid).len() >= IDLE + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Positive controls: processes, the cgroup and the sandbox's mounts are there.
    let pids = pids_of_uid(uid);
    assert!(pids.len() >= IDLE + 3, "the command is running: {pids:?}");
    let cgroups = f.driver.cgroups.sandbox_dirs(id.as_str());
    assert!(!cgroups.is_empty() && cgroups.iter().all(|d| d.is_dir()), "{cgroups:?}");
    let listed = f.driver.cgroup_pids(&id).unwrap();
    assert!(pids.iter().all(|p| listed.contains(p)), "the sandbox's cgroup holds all its processes");
    let workspace = f.driver.layout.read_meta(&id).unwrap().unwrap().workspace;
    let ws = workspace.display().to_string();
    assert!(mounts_of(&pids).contains(&ws), "the sandbox's mounts are visible before");

    let start = Instant::now();
    f.driver.deprovision(&id).await.unwrap();
    assert_eq!(wait_no_process(uid).await, Vec::<i32>::new());
    assert!(cgroups.iter().all(|d| !d.exists()), "a cgroup outlived deprovision");
    assert!(!mounts_of(&pids).contains(&ws), "a mount of the sandbox outlived it");
    assert!(!std::fs::read_to_string("/proc/self/mountinfo").unwrap().contains(&ws), "no mount on the host");
    let out = tokio::time::timeout(Duration::from_secs(5), running).await.unwrap();
    assert!(out.is_err() || out.as_ref().is_ok_and(|o| o.exit_code != 0), "the command ended");
    assert!(start.elapsed() < Duration::from_secs(5));
    f.driver.deprovision(&id).await.unwrap();
    assert!(!f.driver.list().await.unwrap().contains(&id));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_supervisor_is_reported_gone_and_cleaned_up() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("crash")).await;
    let uid = host_uid(&f, &id);
    let cgroups = f.driver.cgroups.sandbox_dirs(id.as_str());
    // Kill the supervisor from the host (as a crash would): the kernel ends the sandbox.
    let supervisor = *f.driver.cgroup_pids(&id).unwrap().iter().max().unwrap();
    super::limits::sigkill(supervisor);
    assert_eq!(wait_no_process(uid).await, Vec::<i32>::new());
    let request = domain::ExecRequest::new(vec!["true".into()], vec![], None).unwrap();
    assert!(matches!(f.driver.exec(&id, &request).await, Err(DriverError::NotFound(_))));
    assert!(!f.driver.list().await.unwrap().contains(&id), "what was left is removed");
    assert!(cgroups.iter().all(|d| !d.exists()));
    let spec = user_spec("crash");
    let env = spec.environment.clone();
    assert!(matches!(
        f.driver.refresh_credential(&id, &SandboxToken::new("t"), &env).await,
        Err(DriverError::NotFound(_))
    ));
}

/// The sandbox's supervisor: its process whose program is the supervisor's (bound at
/// `/.sandlane/supervisor`) and that is not bubblewrap (whose own arguments name it).
fn supervisor_pid(uid: u32) -> i32 {
    let pids = pids_of_uid(uid);
    *pids
        .iter()
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|b| *b == 0).next().is_some_and(|argv0| argv0 == b"/.sandlane/supervisor")
            })
        })
        .unwrap_or_else(|| panic!("no supervisor among {pids:?}"))
}

#[allow(unsafe_code)]
fn signal(pid: i32, signal: i32) {
    // SAFETY: kill has no memory effects.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "kill({pid}, {signal})");
}

/// A refresh (what an adoption and a re-ensure ask of the driver) learns that the sandbox
/// runs from its cgroup, without a round trip to the supervisor: one that cannot answer
/// (stopped here) does not hold it up, and the new token is in place for the next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_reads_the_cgroup_and_does_not_wait_for_the_supervisor() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("liveness")).await;
    let supervisor = supervisor_pid(host_uid(&f, &id));
    let env = f.driver.layout.read_meta(&id).unwrap().unwrap().environment;
    signal(supervisor, libc::SIGSTOP);
    let started = Instant::now();
    let refreshed = f.driver.refresh_credential(&id, &SandboxToken::new("tok-while-stopped"), &env).await;
    let took = started.elapsed();
    signal(supervisor, libc::SIGCONT);
    refreshed.unwrap();
    // A ping would have waited for its reply until CONNECT_TIMEOUT (5 s).
    assert!(took < Duration::from_millis(2500), "the refresh waited for the stopped supervisor: {took:?}");
    let out = sh(&f, &id, "cat /run/sandlane/token").await;
    assert_eq!(text(&out.stdout), "tok-while-stopped");
    f.driver.deprovision(&id).await.unwrap();
}

/// A refresh of a sandbox whose supervisor died says it is gone and cleans it up, with
/// cgroups (an empty cgroup: the supervisor is asked, and is not there) and without (the
/// supervisor is always asked).
async fn a_refresh_finds_a_dead_supervisor(f: &Fixture, session: &str) {
    let id = provisioned(f, &user_spec(session)).await;
    let uid = host_uid(f, &id);
    let env = f.driver.layout.read_meta(&id).unwrap().unwrap().environment;
    super::limits::sigkill(supervisor_pid(uid));
    assert_eq!(wait_no_process(uid).await, Vec::<i32>::new());
    assert!(matches!(
        f.driver.refresh_credential(&id, &SandboxToken::new("t"), &env).await,
        Err(DriverError::NotFound(_))
    ));
    assert!(!f.driver.list().await.unwrap().contains(&id), "what was left is removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_finds_a_dead_supervisor_with_cgroups() {
    let f = fixture();
    assert!(f.driver.limits_mode().contains("pids"), "{}", f.driver.limits_mode());
    a_refresh_finds_a_dead_supervisor(&f, "refresh-dead-cgroup").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_finds_a_dead_supervisor_without_cgroups() {
    let f = fixture_with(|c| c.use_cgroups = false);
    a_refresh_finds_a_dead_supervisor(&f, "refresh-dead-rlimit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_epoch_is_fenced_and_a_newer_one_replaces_the_tree() {
    let f = fixture();
    let mut spec = user_spec("epoch");
    spec.epoch = 2;
    let id = provisioned(&f, &spec).await;
    let first = f.driver.cgroup_pids(&id).unwrap();
    let mut older = spec.clone();
    older.epoch = 1;
    assert!(
        matches!(f.driver.provision(&older).await, Err(DriverError::Failed(m)) if m.to_string().contains("fenced"))
    );
    assert_eq!(f.driver.cgroup_pids(&id).unwrap(), first, "the live tree is untouched");
    f.driver.provision(&spec).await.unwrap();
    assert_eq!(f.driver.cgroup_pids(&id).unwrap(), first, "the same epoch again keeps the tree");
    let mut newer = spec.clone();
    newer.epoch = 3;
    newer.credential = SandboxToken::new("tok-newer");
    f.driver.provision(&newer).await.unwrap();
    let second = f.driver.cgroup_pids(&id).unwrap();
    assert!(
        first.iter().all(|p| !second.contains(p)),
        "a newer epoch replaced the tree: {first:?} {second:?}"
    );
    let out = sh(&f, &id, "cat /run/sandlane/token").await;
    assert_eq!(text(&out.stdout), "tok-newer");
    assert!(matches!(f.driver.provision(&spec).await, Err(DriverError::Failed(_))), "epoch 2 is now older");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durability_follows_the_spec() {
    let f = fixture();
    // user → durable (the app's default policy): the file comes back for the same key.
    let first = user_spec("dur");
    let id = provisioned(&f, &first).await;
    assert_eq!(sh(&f, &id, "echo mine > /workspace/file").await.exit_code, 0);
    f.driver.deprovision(&id).await.unwrap();
    let second = user_spec("dur");
    assert_ne!(first.sandbox_id(), second.sandbox_id());
    let id2 = provisioned(&f, &second).await;
    assert_eq!(text(&sh(&f, &id2, "cat /workspace/file").await.stdout), "mine\n");
    f.driver.deprovision(&id2).await.unwrap();

    // service → ephemeral: gone, also on the host.
    let svc = || spec_for(&org(), "dur", "svc-1", CallerClass::Service, Durability::Ephemeral, "t");
    let first = svc();
    let id = provisioned(&f, &first).await;
    let ws = f.driver.layout.read_meta(&id).unwrap().unwrap().workspace;
    assert_eq!(sh(&f, &id, "echo mine > /workspace/file").await.exit_code, 0);
    assert!(ws.join("file").exists());
    f.driver.deprovision(&id).await.unwrap();
    assert!(!ws.exists());
    let id2 = provisioned(&f, &svc()).await;
    assert_ne!(sh(&f, &id2, "cat /workspace/file").await.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_bubblewrap_is_reported_with_how_to_install() {
    let f = fixture_with(|c| c.program = "/nonexistent/bwrap".into());
    let health = f.driver.health().await;
    assert!(!health.usable);
    assert!(health.detail.contains("apt-get install bubblewrap"), "{}", health.detail);
    let spec = user_spec("missing");
    match f.driver.provision(&spec).await {
        Err(DriverError::Unavailable(msg)) => {
            let msg = msg.to_string();
            assert!(msg.contains("`/nonexistent/bwrap` not found") && msg.contains("SANDLANE_BWRAP"));
        }
        other => panic!("{other:?}"),
    }
    assert!(f.driver.list().await.unwrap().is_empty(), "nothing left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_bubblewrap_fails_the_provision_probe() {
    let f = fixture_with(|c| c.program = "/bin/false".into());
    let spec = user_spec("broken");
    assert!(matches!(f.driver.provision(&spec).await, Err(DriverError::Failed(_))));
    assert!(f.driver.list().await.unwrap().is_empty(), "nothing left behind");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_says_how_limits_are_enforced() {
    let f = fixture();
    let health = f.driver.health().await;
    assert!(health.usable);
    assert!(health.detail.starts_with("bwrap 0."), "{}", health.detail);
    assert!(
        health.detail.contains("limits: rlimits+cgroup-v1(memory,pids,cpu,freezer)"),
        "{}",
        health.detail
    );
    assert!(
        health.detail.contains("protections: userns,cgroup-memory,cgroup-pids,cgroup-cpu,seccomp"),
        "{}",
        health.detail
    );
    let f = fixture_with(|c| c.use_cgroups = false);
    let detail = f.driver.health().await.detail;
    assert!(
        detail.contains("limits: rlimits (no cgroup") && detail.contains("protections: userns,seccomp"),
        "{detail}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_required_protection_the_host_lacks_refuses_provision() {
    let f = fixture_with(|c| {
        c.use_cgroups = false;
        c.required_protections = Some(vec![super::Protection::CgroupPids, super::Protection::Seccomp]);
    });
    let health = f.driver.health().await;
    assert!(!health.usable && health.detail.contains("missing required: cgroup-pids"), "{}", health.detail);
    let spec = user_spec("required");
    match f.driver.provision(&spec).await {
        Err(DriverError::Unavailable(m)) => assert!(m.to_string().contains("cgroup-pids"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert!(f.driver.list().await.unwrap().is_empty(), "nothing was started");
    // The seccomp filter is confirmed by the supervisor itself.
    let f = fixture_with(|c| c.required_protections = Some(vec![super::Protection::Seccomp]));
    let id = provisioned(&f, &user_spec("seccomp")).await;
    let out = sh(&f, &id, "grep Seccomp: /proc/self/status; unshare -U true || echo refused").await;
    assert_eq!(text(&out.stdout), "Seccomp:\t2\nrefused\n", "{out:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_is_capped_and_stdin_fed() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("output")).await;
    let out = sh(&f, &id, "head -c 200000 /dev/zero; head -c 10 /dev/zero >&2").await;
    assert!(out.truncated);
    assert_eq!((out.stdout.len(), out.stderr.len()), (64 << 10, 10));
    assert_eq!(out.exit_code, 0, "the command was drained, not blocked");
    let big = vec![b'z'; 1 << 20];
    let out = run(&*f.driver, &id, &["true"], &big, 5_000).await;
    assert_eq!((out.exit_code, out.timed_out), (0, false), "unread stdin does not block");
    let out = run(&*f.driver, &id, &["wc", "-c"], &big, 5_000).await;
    assert_eq!(text(&out.stdout).trim(), "1048576");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_a_restart() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("restart")).await;
    let request = domain::ProcessRequest::new(vec!["sleep".into(), "30".into()], vec![], None).unwrap();
    let started = f.driver.start_process(&id, &request, &domain::ProcessCaps::default()).await.unwrap();
    let config = f.driver.config.clone();
    let again = BwrapDriver::new(config).unwrap();
    assert_eq!(again.list().await.unwrap(), vec![id.clone()]);
    let out = run(&*again, &id, &["sh", "-c", "echo $SANDLANE_SANDBOX_ID"], b"", 5_000).await;
    assert_eq!(text(&out.stdout).trim(), id.as_str());
    // The background process is the supervisor's: the new driver finds it running.
    let listed = again.list_processes(&id).await.unwrap();
    assert_eq!(listed.iter().map(|p| (p.pid, p.running)).collect::<Vec<_>>(), vec![(started.pid, true)]);
    again.deprovision(&id).await.unwrap();
    assert!(f.driver.list().await.unwrap().is_empty());
}

/// The egress proxy's socket is the server's alone: while one server serves it another
/// is told it is held (a conflict, tried again later); once the first server's socket
/// closed (its process ended), a restarted server opens a new one in the sandbox's
/// namespace (found again from `control/init`) and serves it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_serves_the_egress_again() {
    let f = fixture();
    let id = provisioned(&f, &user_spec("egress-restart")).await;
    let gate = |port| {
        std::sync::Arc::new(driver_contract::TestGate { port, other_port: port, seen: Default::default() })
    };
    // The serving task opens its socket on its own time: until then a connection is refused
    // (`000`), which the test waits out; any other answer than the gate's 403 fails it.
    let refused = async |driver: &BwrapDriver| {
        let script = "curl -sS --max-time 10 -o /dev/null -w '%{http_code}' http://denied.test/";
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = run(driver, &id, &["sh", "-c", script], b"", 20_000).await;
            if text(&out.stdout) == "000" && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            assert_eq!(text(&out.stdout), "403", "{}", text(&out.stderr));
            break;
        }
    };
    let (first_gate, second_gate) = (gate(1), gate(2));
    let first = tokio::spawn({
        let (driver, id, gate) = (f.driver.clone(), id.clone(), first_gate.clone());
        async move { driver.serve_egress(&id, gate).await }
    });
    refused(&f.driver).await;
    assert_eq!(first_gate.seen.lock().unwrap().len(), 1);

    let again = BwrapDriver::new(f.driver.config.clone()).unwrap();
    let held = again.serve_egress(&id, second_gate.clone()).await;
    assert!(matches!(&held, Err(DriverError::Conflict(_))), "{held:?}");
    // The first server goes away: its socket closes with it (on the thread that closes
    // sandbox descriptors, soon after). Until it has, the restarted server is told it is
    // held and tries again, as the server's egress pass does.
    first.abort();
    let _ = first.await;
    let second = tokio::spawn({
        let (driver, id, gate) = (again.clone(), id.clone(), second_gate.clone());
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match driver.serve_egress(&id, gate.clone()).await {
                    Err(DriverError::Conflict(_)) if std::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    ended => return ended,
                }
            }
        }
    });
    refused(&again).await;
    assert_eq!(second_gate.seen.lock().unwrap().len(), 1, "served by the restarted server");
    assert_eq!(first_gate.seen.lock().unwrap().len(), 1);
    again.deprovision(&id).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), second).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "serving ends with the sandbox: {ended:?}");
}

fn ephemeral_spec(session: &str, token: &str, bytes: Option<u64>) -> ProvisionSpec {
    let mut spec =
        spec_for(&org(), session, "svc-ident-7", CallerClass::Service, Durability::Ephemeral, token);
    spec.workspace_bytes = bytes;
    spec
}

/// Everything of a sandbox's name on the host: its state, workspace, image and token
/// directories.
fn named_paths(f: &Fixture, id: &SandboxId) -> Vec<std::path::PathBuf> {
    let layout = &f.driver.layout;
    [layout.sandbox_dir(id), layout.ephemeral_workspace(id), layout.ephemeral_image(id), layout.run_dir(id)]
        .into_iter()
        .filter(|p| p.exists())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_ephemeral_sandbox_is_one_started_ahead_under_its_own_name() {
    let f = fixture();
    let bytes = Some(64 << 20);
    let first = ephemeral_spec("ahead-1", "tok-first", bytes);
    let first_id = provisioned(&f, &first).await;
    let ahead = f.driver.settled_ahead().await;
    assert_eq!(ahead.len(), f.driver.config.started_ahead, "started ahead after an ephemeral provision");
    // A start ahead is no sandbox of the driver's until it is taken.
    assert_eq!(f.driver.list().await.unwrap(), vec![first_id.clone()]);
    let before: std::collections::HashMap<_, _> =
        ahead.iter().map(|p| (p.clone(), f.driver.cgroup_pids(p).unwrap_or_default())).collect();
    assert!(before.values().all(|pids| pids.len() == IDLE), "{before:?}");

    let spec = ephemeral_spec("ahead-2", "tok-second", bytes);
    let id = provisioned(&f, &spec).await;
    // Its processes are the ones one placeholder started; that placeholder's names are gone.
    let pids = f.driver.cgroup_pids(&id).unwrap();
    let taken: Vec<_> = before.iter().filter(|(_, p)| **p == pids).map(|(id, _)| id.clone()).collect();
    assert_eq!(taken.len(), 1, "the sandbox runs the processes of one start ahead: {pids:?} {before:?}");
    assert!(named_paths(&f, &taken[0]).is_empty(), "{:?}", named_paths(&f, &taken[0]));
    assert!(f.driver.cgroup_pids(&taken[0]).is_none_or(|p| p.is_empty()));
    // It is the sandbox the spec asked for: its id, its token, its environment, a fresh
    // workspace of its quota, its own uid (claimed under its name).
    let out = sh(
        &f,
        &id,
        "echo $SANDLANE_SANDBOX_ID; cat /run/sandlane/token; echo; ls -A /workspace | grep -v lost+found | wc -l;          df -k /workspace | tail -1 | awk '{print $2}'",
    )
    .await;
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(out.exit_code, 0, "{}", text(&out.stderr));
    assert_eq!(lines[0], id.as_str());
    assert_eq!(lines[1], "tok-second");
    assert_eq!(lines[2], "0", "a fresh workspace");
    let size_kib: u64 = lines[3].parse().unwrap();
    assert!(size_kib < 128 << 10 && size_kib > 32 << 10, "the workspace has its quota: {size_kib} KiB");
    let meta = f.driver.layout.read_meta(&id).unwrap().unwrap();
    assert_eq!((meta.epoch, meta.durability), (spec.epoch, Durability::Ephemeral));
    assert!(meta.is_for(&spec.key));
    let uid = meta.host_id;
    let claim = std::fs::read_to_string(f.dir.path().join(format!("host/uids/{uid}"))).unwrap();
    let claim: serde_json::Value = serde_json::from_str(&claim).unwrap();
    assert_eq!(claim["identity"], format!("ephemeral/{id}"));
    assert_ne!(uid, host_uid(&f, &first_id));
    // A write beyond the quota fails inside.
    // (Files of 15 MiB: the file size rlimit is 16 MiB.)
    let out =
        sh(&f, &id, "for i in 1 2 3 4 5 6; do dd if=/dev/zero of=/workspace/f$i bs=1M count=15 2>&1; done")
            .await;
    assert!(text(&out.stdout).contains("No space left"), "{}", text(&out.stdout));
    // Refilled, and what is taken goes as any sandbox goes.
    assert_eq!(f.driver.settled_ahead().await.len(), f.driver.config.started_ahead);
    f.driver.deprovision(&id).await.unwrap();
    assert_eq!(wait_no_process(uid).await, Vec::<i32>::new());
    assert!(named_paths(&f, &id).is_empty());
    assert!(!f.dir.path().join(format!("host/uids/{uid}")).exists(), "the uid is given back");
    f.driver.deprovision(&first_id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_ahead_of_another_quota_are_never_taken_and_none_outlive_their_drivers() {
    let f = fixture();
    let small = provisioned(&f, &ephemeral_spec("ahead-q1", "tok", Some(64 << 20))).await;
    let sixty_four = f.driver.settled_ahead().await;
    assert_eq!(sixty_four.len(), f.driver.config.started_ahead);
    // Another quota: started fresh (none of the 64 MiB ones), and the pool follows it.
    let big = provisioned(&f, &ephemeral_spec("ahead-q2", "tok", Some(256 << 20))).await;
    let out = sh(&f, &big, "df -k /workspace | tail -1 | awk '{print $2}'").await;
    let size_kib: u64 = text(&out.stdout).trim().parse().unwrap();
    assert!(size_kib > 128 << 10, "{size_kib} KiB");
    let ninety_six = f.driver.settled_ahead().await;
    assert_eq!(ninety_six.len(), f.driver.config.started_ahead);
    assert!(ninety_six.iter().all(|p| !sixty_four.contains(p)));
    assert!(sixty_four.iter().all(|p| named_paths(&f, p).is_empty()), "the 64 MiB ones are removed");
    // A durable provision never takes one.
    let durable = provisioned(&f, &user_spec("ahead-durable")).await;
    assert_eq!(f.driver.settled_ahead().await, ninety_six);

    // A server that stops ends the ones it holds and leaves its sandboxes.
    let g = fixture();
    let kept = provisioned(&g, &ephemeral_spec("ahead-q3", "tok", None)).await;
    let held = g.driver.settled_ahead().await;
    assert_eq!(held.len(), g.driver.config.started_ahead);
    let uids: Vec<u32> = held.iter().map(|p| uid_of_start_ahead(&g, p)).collect();
    g.driver.stand_down().await;
    for uid in &uids {
        assert_eq!(wait_no_process(*uid).await, Vec::<i32>::new(), "uid {uid}");
    }
    assert!(held.iter().all(|p| named_paths(&g, p).is_empty()));
    assert_eq!(g.driver.list().await.unwrap(), vec![kept.clone()]);
    assert_eq!(sh(&g, &kept, "echo on").await.stdout, b"on\n");

    // A driver dropped ends the ones it holds.
    provisioned(&g, &ephemeral_spec("ahead-q4", "tok", None)).await;
    let held = g.driver.settled_ahead().await;
    assert_eq!(held.len(), g.driver.config.started_ahead);
    let uids: Vec<u32> = held.iter().map(|p| uid_of_start_ahead(&g, p)).collect();
    let layout = g.driver.layout.clone();
    drop(g);
    for uid in &uids {
        assert_eq!(wait_no_process(*uid).await, Vec::<i32>::new(), "uid {uid}");
    }
    assert!(held.iter().all(|p| !layout.sandbox_dir(p).exists() && !layout.ephemeral_workspace(p).exists()));

    // A server killed with starts ahead: the next driver on its data dir ends them.
    let forgotten = f.driver.forget_ahead();
    let uids: Vec<u32> = forgotten.iter().map(|p| uid_of_start_ahead(&f, p)).collect();
    assert!(uids.iter().all(|u| !pids_of_uid(*u).is_empty()));
    let again = BwrapDriver::new(f.driver.config.clone()).unwrap();
    for uid in &uids {
        assert_eq!(wait_no_process(*uid).await, Vec::<i32>::new(), "uid {uid}");
    }
    assert!(forgotten.iter().all(|p| named_paths(&f, p).is_empty()));
    let mut live = again.list().await.unwrap();
    live.sort();
    let mut expected = vec![small, big, durable];
    expected.sort();
    assert_eq!(live, expected, "the sandboxes stay");
}

/// The host uid a start ahead runs as (from its supervisor's process).
fn uid_of_start_ahead(f: &Fixture, placeholder: &SandboxId) -> u32 {
    let pids = f.driver.cgroup_pids(placeholder).unwrap();
    std::fs::metadata(format!("/proc/{}", pids[0])).unwrap().uid()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_keys_never_escape_the_workspaces_dir() {
    let f = fixture();
    for key in [".", ".."] {
        let spec = spec_for(&org(), key, "u", CallerClass::User, Durability::Durable, "t");
        assert!(matches!(f.driver.provision(&spec).await, Err(DriverError::Failed(_))), "{key}");
    }
    let spec = spec_for("..", "s", "u", CallerClass::User, Durability::Durable, "t");
    assert!(f.driver.provision(&spec).await.is_err());
    assert!(f.driver.list().await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_is_idempotent_and_refuses_another_key() {
    let f = fixture();
    let spec = user_spec("idem");
    provisioned(&f, &spec).await;
    f.driver.provision(&spec).await.unwrap();
    let mut other = user_spec("other");
    other.environment = spec.environment.clone();
    assert!(matches!(f.driver.provision(&other).await, Err(DriverError::Failed(_))));
}

/// A data dir (and the supervisor's program) under a directory no sandbox uid can search
/// (a clone in a home of mode 0700): the sandboxes still start, their root made under the
/// host dir and the program copied there. A sandbox root set under such a directory is
/// reported, since nothing there can be reached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_the_sandbox_uid_cannot_reach_still_serves() {
    let dir = tempfile::tempdir().unwrap();
    let closed = dir.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    let program = closed.join("sandlane");
    let supervisor = crate::supervisor_link::locate_for_tests().unwrap();
    if std::fs::hard_link(&supervisor, &program).is_err() {
        std::fs::copy(&supervisor, &program).unwrap();
    }
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut config = test_config(&closed.join("data"));
    config.host_dir = dir.path().join("host");
    config.supervisor = program;
    let f = Fixture { driver: BwrapDriver::new(config).unwrap(), dir };
    let health = f.driver.health().await;
    assert!(health.usable, "{}", health.detail);
    let root =
        f.driver.layout.ephemeral_workspace(&SandboxId::parse("sbx_01J0000000000000000000000A").unwrap());
    assert!(root.starts_with(f.dir.path().join("host/roots")), "{}", root.display());
    assert!(f.driver.config.supervisor.starts_with(f.dir.path().join("host/roots")));
    let id = provisioned(&f, &user_spec("closed")).await;
    assert_eq!(sh(&f, &id, "echo inside").await.stdout, b"inside\n");

    let gone = tempfile::tempdir().unwrap();
    let closed = gone.path().join("closed");
    std::fs::create_dir(&closed).unwrap();
    std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
    let mut config = test_config(&gone.path().join("data"));
    config.sandbox_root = Some(closed.join("root"));
    let driver = BwrapDriver::new(config).unwrap();
    let health = driver.health().await;
    assert!(!health.usable);
    assert!(health.detail.contains("is not searchable"), "{}", health.detail);
    let spec = user_spec("closed-root");
    assert!(matches!(driver.provision(&spec).await, Err(DriverError::Unavailable(_))));
}

/// Without a configured address-space limit, a sandbox the memory cgroup bounds gets none
/// (Node's WebAssembly reserves about 10 GiB), and one without that cgroup gets 4 GiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_space_is_left_to_the_memory_cgroup_where_there_is_one() {
    for cgroups in [true, false] {
        let f = fixture_with(|c| {
            c.limits.address_space_bytes = super::config::UNLIMITED_ADDRESS_SPACE;
            c.use_cgroups = cgroups;
        });
        let memory = f.driver.limits_mode().contains("memory");
        assert_eq!(memory, cgroups, "this host gives a writable memory cgroup: {}", f.driver.limits_mode());
        let id = provisioned(&f, &user_spec(if cgroups { "as-cgroup" } else { "as-rlimit" })).await;
        let out = run(&*f.driver, &id, &["bash", "-c", "ulimit -v; ulimit -H -v"], b"", 5_000).await;
        let want = if memory { "unlimited\nunlimited\n" } else { "4194304\n4194304\n" };
        assert_eq!(text(&out.stdout), want, "{}", shown(&out));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlimits_are_applied_inside() {
    let f = fixture_with(|c| c.limits.cpu_secs = 1);
    let id = provisioned(&f, &user_spec("rlimits")).await;
    let out = run(&*f.driver, &id, &["bash", "-c", "ulimit -u -n -v -f -c"], b"", 5_000).await;
    let values: Vec<String> =
        text(&out.stdout).lines().filter_map(|l| l.split_whitespace().last()).map(str::to_owned).collect();
    // -f and -v are in KiB units of 1024 bytes (-f in 1024-byte blocks for bash).
    assert_eq!(values, ["64", "256", "262144", "16384", "0"], "{}", text(&out.stdout));
    // The sandbox as a whole: the supervisor (PID 1 inside) was started under the same
    // process and file limits, so nothing it forks starts above them.
    let out = run(&*f.driver, &id, &["cat", "/proc/1/limits"], b"", 5_000).await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let table = text(&out.stdout);
    let limit = |name: &str| {
        let line = table.lines().find(|l| l.starts_with(name)).unwrap_or_default();
        line[name.len().min(line.len())..].split_whitespace().take(2).collect::<Vec<_>>().join(" ")
    };
    assert_eq!(limit("Max processes"), "64 64", "{table}");
    assert_eq!(limit("Max open files"), "256 256", "{table}");

    // The file size limit stops the writer at exactly 16 MiB: SIGXFSZ kills it, or (with
    // the signal ignored) its write fails with EFBIG. Any other failure is not the limit.
    let out = sh(&f, &id, "head -c 20000000 /dev/zero > /workspace/big; echo \"head=$?\"").await;
    let said = text(&out.stdout);
    assert!(
        said == format!("head={}\n", 128 + libc::SIGXFSZ)
            || (said == "head=1\n" && text(&out.stderr).contains("File too large")),
        "file size limit: {}",
        shown(&out)
    );
    let size = std::fs::metadata(f.driver.layout.read_meta(&id).unwrap().unwrap().workspace.join("big"))
        .unwrap()
        .len();
    assert_eq!(size, 16 << 20);

    // One second of CPU, however long that takes on a loaded machine (under `cargo test`
    // every test of the crate shares the process and the cores): the 20 s timeout must not
    // be what ends it.
    let out = run(&*f.driver, &id, &["sh", "-c", "while :; do :; done"], b"", 20_000).await;
    assert!(!out.timed_out, "the CPU limit, not the timeout, ended it");
    // SIGXCPU at the soft limit, SIGKILL at the hard one a second later.
    assert!([128 + libc::SIGXCPU, 128 + libc::SIGKILL].contains(&out.exit_code), "{}", shown(&out));
}

#[test]
fn argv_isolates_and_runs_the_supervisor_as_init() {
    let config = test_config(Path::new("/data"));
    let binds = super::command::resolve_binds(&config.ro_binds);
    let spec =
        super::command::SandboxSpec { workspace: Path::new("/data/ws"), run_dir: Path::new("/data/run") };
    let args: Vec<String> = super::command::supervisor_args(&config, &binds, spec, true, false)
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect();
    let joined = args.join(" ");
    for flag in [
        "--unshare-all --unshare-user --uid 1000 --gid 1000 --cap-drop ALL --new-session --as-pid-1",
        "--clearenv",
        "--disable-userns",
        "--bind /data/ws /workspace --ro-bind /data/run /run/sandlane",
        "/.sandlane/supervisor --remount-ro /dev --remount-ro / --chdir /workspace -- /.sandlane/supervisor \
         --listen-fd 3 --seccomp",
    ] {
        assert!(joined.contains(flag), "{flag} missing in {joined}");
    }
    assert!(!joined.contains("--die-with-parent"), "the sandbox outlives the server");
    assert!(!joined.contains("--setenv"), "the environment is per command, from the supervisor");
    assert!(!args.iter().any(|a| a == "/etc"), "/etc is never bound wholesale");
}

#[test]
fn host_ids_are_stable_in_range_and_claimed_by_workspaces() {
    use super::workspace::{Layout, host_id_candidates};
    let ids = super::HostIds { base: 1_000_000, span: 10 };
    let first = host_id_candidates(ids, "durable/acme/session/s1").next().unwrap();
    assert_eq!(Some(first), host_id_candidates(ids, "durable/acme/session/s1").next());
    let all: Vec<u32> = host_id_candidates(ids, "durable/acme/session/s1").collect();
    assert_eq!(all.len(), 10);
    assert!(all.iter().all(|u| (1_000_000..1_000_010).contains(u)));

    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let layout = Layout::new(dir.path().join("data"), dir.path().join("reach"), host.clone());
    layout.host().prepare().unwrap();
    std::fs::create_dir(dir.path().join("data")).unwrap();
    let ended = std::cell::RefCell::new(Vec::new());
    let end = |uid| {
        ended.borrow_mut().push(uid);
        Ok(0)
    };
    let a = "durable/acme/session/a";
    let b = "durable/acme/session/b";
    assert!(layout.claim_host_id(first, a, &end).unwrap());
    assert!(layout.claim_host_id(first, a, &end).unwrap(), "a holder's claim is idempotent");
    assert_eq!(layout.host_id_owner(first), None, "a workspace not created yet holds nothing");
    assert!(ended.borrow().is_empty());
    assert!(layout.claim_host_id(first, b, &end).unwrap(), "so the claim was stale");
    assert_eq!(*ended.borrow(), vec![first], "what ran as the stale claim's uid is ended first");
    std::fs::create_dir_all(dir.path().join("reach/workspaces/durable/acme/session/b")).unwrap();
    assert_eq!(layout.host_id_owner(first).as_deref(), Some(b));
    assert!(!layout.claim_host_id(first, a, &end).unwrap(), "an existing workspace keeps its uid");
    layout.release_host_id(first, a);
    assert_eq!(layout.host_id_owner(first).as_deref(), Some(b), "only the holder releases");

    // Another data dir on the same host: the uid is taken, even for the same workspace
    // name, until the first data dir is gone.
    let other = Layout::new(dir.path().join("other"), dir.path().join("other-reach"), host);
    std::fs::create_dir(dir.path().join("other")).unwrap();
    assert!(!other.claim_host_id(first, b, &end).unwrap(), "another data dir's workspace holds it");
    other.release_host_id(first, b);
    assert_eq!(layout.host_id_owner(first).as_deref(), Some(b), "nor does another data dir release it");
    std::fs::remove_dir_all(dir.path().join("data")).unwrap();
    ended.borrow_mut().clear();
    assert!(other.claim_host_id(first, b, &end).unwrap(), "its data dir is gone");
    assert_eq!(*ended.borrow(), vec![first]);
    assert_eq!(other.host_id_owner(first), None, "not until its workspace exists");
}

/// A stale claim's uid is taken only once what runs as it has ended: here a process of
/// the uid (a sandbox whose data dir was removed) is killed by the taking.
#[test]
fn a_stale_uid_is_taken_only_once_its_processes_are_ended() {
    use super::workspace::{Layout, allocate_host_id, host_id_candidates};
    use std::os::unix::process::CommandExt;
    let ids = super::HostIds { base: 1_660_000_000, span: 1 };
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let old = Layout::new(dir.path().join("old"), dir.path().join("old-root"), host.clone());
    old.host().prepare().unwrap();
    std::fs::create_dir(dir.path().join("old")).unwrap();
    let identity = "durable/acme/session/s";
    let workspace = dir.path().join("old-root/workspaces/durable/acme/session/s");
    let none = |_| Ok(0);
    let (uid, _) = allocate_host_id(&old, ids, identity, &workspace, 0o711, &none).unwrap();
    assert_eq!(Some(uid), host_id_candidates(ids, identity).next());
    let mut left = std::process::Command::new("sleep").arg("1000").uid(uid).gid(uid).spawn().unwrap();
    std::fs::remove_dir_all(dir.path().join("old")).unwrap();

    let new = Layout::new(dir.path().join("new"), dir.path().join("new-root"), host);
    std::fs::create_dir(dir.path().join("new")).unwrap();
    let cgroups = super::limits::CgroupMode::None("test".into());
    let end = |uid| super::host::end_uid(uid, &cgroups, "sandlane-test");
    let workspace = dir.path().join("new-root/workspaces/durable/acme/session/s");
    let (taken, created) = allocate_host_id(&new, ids, identity, &workspace, 0o711, &end).unwrap();
    assert_eq!((taken, created), (uid, true));
    let status = left.wait().unwrap();
    assert_eq!(std::os::unix::process::ExitStatusExt::signal(&status), Some(libc::SIGKILL));
    assert_eq!(new.host_id_owner(uid).as_deref(), Some(identity));
}

mod uid_property {
    //! A host uid belongs to one workspace for as long as it exists, on the whole host:
    //! over arbitrary sequences of provisions and deprovisions (durable and ephemeral, same
    //! and other keys) by two data dirs sharing one host, and removals of a data dir, on a
    //! small uid range, no two live workspaces ever share a uid, and a durable workspace
    //! keeps its uid across deprovisions. Runs the driver's own allocation and release code
    //! on real data dirs (workspaces are chowned: needs root).

    use std::collections::HashMap;
    use std::path::PathBuf;

    use domain::{CallerClass, Durability, SandboxId};
    use proptest::prelude::*;

    use super::super::HostIds;
    use super::super::limits::CgroupMode;
    use super::super::workspace::{Layout, allocate_host_id, remove_dir_all_quiet, workspace_identity};
    use crate::driver_contract::spec_for;

    #[derive(Debug, Clone)]
    enum Op {
        Provision { data: usize, key: u8, durable: bool },
        Deprovision { pick: u8 },
        RemoveDataDir { data: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..2, 0u8..4, any::<bool>()).prop_map(|(data, key, durable)| Op::Provision { data, key, durable }),
            3 => any::<u8>().prop_map(|pick| Op::Deprovision { pick }),
            1 => (0usize..2).prop_map(|data| Op::RemoveDataDir { data }),
        ]
    }

    struct Live {
        data: usize,
        id: SandboxId,
        durable: bool,
        workspace: PathBuf,
        uid: u32,
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
        #[test]
        fn no_two_live_workspaces_share_a_uid(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let host = dir.path().join("host");
            let layouts: Vec<Layout> = (0..2)
                .map(|n| Layout::new(dir.path().join(format!("data{n}")), dir.path().join(format!("reach{n}")), host.clone()))
                .collect();
            layouts[0].host().prepare().unwrap();
            for layout in &layouts {
                layout.prepare(true).unwrap();
            }
            let cgroups = CgroupMode::None("test".into());
            let end = |uid| super::super::host::end_uid(uid, &cgroups, "sandlane-test");
            let ids = HostIds { base: 1_700_000_000, span: 6 };
            let mut live: Vec<Live> = Vec::new();
            // Per data dir: the durable workspaces that exist, with their uid.
            let mut durable_uids: Vec<HashMap<String, u32>> = vec![HashMap::new(), HashMap::new()];
            for op in ops {
                match op {
                    Op::Provision { data, key, durable } => {
                        let layout = &layouts[data];
                        let (class, durability) = if durable {
                            (CallerClass::User, Durability::Durable)
                        } else {
                            (CallerClass::Service, Durability::Ephemeral)
                        };
                        let spec = spec_for("acme", &format!("k{key}"), "u", class, durability, "t");
                        let id = spec.sandbox_id().clone();
                        let workspace = layout.workspace(&id, &spec.key, durability).unwrap();
                        if durable && live.iter().any(|l| l.durable && l.workspace == workspace) {
                            continue; // one live sandbox per key, as the registry keeps it
                        }
                        // A data dir removed earlier is made again, empty, by its next server.
                        layout.prepare(true).unwrap();
                        std::fs::create_dir_all(layout.sandbox_dir(&id)).unwrap();
                        let identity = workspace_identity(&id, &spec.key, durability);
                        match allocate_host_id(layout, ids, &identity, &workspace, 0o711, &end) {
                            Ok((uid, _)) => {
                                if durable {
                                    let kept = *durable_uids[data].entry(identity.clone()).or_insert(uid);
                                    prop_assert_eq!(kept, uid, "a durable workspace changed its uid");
                                }
                                live.push(Live { data, id, durable, workspace, uid });
                            }
                            Err(e) => {
                                prop_assert!(e.contains("no free host uid"), "{}", e);
                                remove_dir_all_quiet(&layout.sandbox_dir(&id)).unwrap();
                            }
                        }
                    }
                    Op::Deprovision { pick } => {
                        if live.is_empty() {
                            continue;
                        }
                        let gone = live.remove(usize::from(pick) % live.len());
                        let layout = &layouts[gone.data];
                        if !gone.durable {
                            remove_dir_all_quiet(&gone.workspace).unwrap();
                        }
                        remove_dir_all_quiet(&layout.sandbox_dir(&gone.id)).unwrap();
                        if !gone.durable {
                            layout.release_host_id(gone.uid, &format!("ephemeral/{}", gone.id));
                        }
                    }
                    Op::RemoveDataDir { data } => {
                        // Removed while its sandboxes' server is stopped: its workspaces
                        // (its sandbox root) go with it.
                        remove_dir_all_quiet(&dir.path().join(format!("data{data}"))).unwrap();
                        remove_dir_all_quiet(&dir.path().join(format!("reach{data}"))).unwrap();
                        live.retain(|l| l.data != data);
                        durable_uids[data].clear();
                    }
                }
                // Every workspace that exists on the host: the live ephemeral ones and
                // every durable one of both data dirs.
                let mut owners: HashMap<u32, String> = HashMap::new();
                for l in live.iter().filter(|l| !l.durable) {
                    let who = format!("{}: ephemeral/{}", l.data, l.id);
                    if let Some(other) = owners.insert(l.uid, who.clone()) {
                        prop_assert!(false, "uid {} shared by {} and {}", l.uid, other, who);
                    }
                }
                for (data, uids) in durable_uids.iter().enumerate() {
                    for (who, uid) in uids {
                        let who = format!("{data}: {who}");
                        if let Some(other) = owners.insert(*uid, who.clone()) {
                            prop_assert!(false, "uid {} shared by {} and {}", uid, other, who);
                        }
                    }
                }
            }
        }
    }
}

/// Calls syscalls by number from perl and prints `name=errno-text` for each.
const SYSCALLS: &str = r#"
    use Errno;
    my %calls = (
        ptrace_traceme => [101, 0, 0, 0, 0],
        keyctl_session => [250, 0, -3, 0],
        bpf => [321, 0, 0, 0],
        perf_event_open => [298, 0, 0, -1, -1, 0],
        userfaultfd => [323, 0],
        unshare_user => [272, 0x10000000],
        setns => [308, 0, 0],
        clone_newuser => [56, 0x10000000 | 17, 0, 0, 0, 0],
        clone3 => [435, 0, 0],
        mount => [165, 0, 0, 0, 0, 0],
        getpid => [39],
        io_uring_setup => [425, 1, "\0" x 120],
        x32_unshare => [0x40000000 | 272, 0x10000000],
        x32_getpid => [0x40000000 | 39],
        socket_vsock => [41, 40, 1, 0],
        socketpair_vsock => [53, 40, 1, 0, "\0" x 8],
        socket_bluetooth => [41, 31, 1, 0],
        socket_unix => [41, 1, 1, 0],
        socket_inet => [41, 2, 1, 0],
        socket_inet6 => [41, 10, 1, 0],
        socket_netlink => [41, 16, 3, 0],
    );
    for my $name (sort keys %calls) {
        $! = 0;
        my @a = @{$calls{$name}};
        my $r = syscall($a[0], @a[1 .. $#a]);
        if ($r == 0 && $name eq "clone_newuser") { exit 0 }
        print "$name=", ($r == -1 ? ($!{EPERM} ? "EPERM" : $!{ENOSYS} ? "ENOSYS" : "other") : "ok"), "\n";
    }"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_denies_what_agents_never_need() {
    let results = |out: &ExecOutput| -> std::collections::BTreeMap<String, String> {
        text(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
            .collect()
    };
    let f = fixture();
    let id = provisioned(&f, &user_spec("seccomp-on")).await;
    let on = results(&run(&*f.driver, &id, &["perl", "-e", SYSCALLS], b"", 10_000).await);
    for name in [
        "ptrace_traceme",
        "keyctl_session",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "unshare_user",
        "setns",
        "clone_newuser",
        "mount",
        "io_uring_setup",
        "x32_unshare",
        "x32_getpid",
        // Created only, never connected: AF_VSOCK reaches the host past any namespace.
        "socket_vsock",
        "socketpair_vsock",
        "socket_bluetooth",
    ] {
        assert_eq!(on.get(name).map(String::as_str), Some("EPERM"), "{name}: {on:?}");
    }
    assert_eq!(on.get("clone3").map(String::as_str), Some("ENOSYS"), "{on:?}");
    for name in ["getpid", "socket_unix", "socket_inet", "socket_inet6", "socket_netlink"] {
        assert_eq!(on.get(name).map(String::as_str), Some("ok"), "{name}: {on:?}");
    }

    // Positive control: without the filter the same sandbox user may trace itself and
    // read its keyring, so the refusals above are the filter's.
    let f = fixture_with(|c| c.seccomp = false);
    let id = provisioned(&f, &user_spec("seccomp-off")).await;
    let off = results(&run(&*f.driver, &id, &["perl", "-e", SYSCALLS], b"", 10_000).await);
    assert_eq!(off.get("ptrace_traceme").map(String::as_str), Some("ok"), "{off:?}");
    assert_eq!(off.get("keyctl_session").map(String::as_str), Some("ok"), "{off:?}");
    // Without it none of the new refusals is EPERM (this kernel creates a vsock socket and
    // an io_uring; an x32 call it does not serve is ENOSYS): the refusals are the filter's.
    for name in ["socket_vsock", "io_uring_setup", "x32_unshare", "x32_getpid"] {
        assert_ne!(off.get(name).map(String::as_str), Some("EPERM"), "{name}: {off:?}");
    }
}

/// A start runs its program with what `spawn` promises: `/` as its directory, an empty
/// environment, its own session, no signal blocked, standard output and error to the log,
/// the listener on descriptor 3 and nothing else open; its status comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_runs_its_program_as_spawn_promises() {
    use super::spawn::{DropTo, Launch, spawn};
    let dir = tempfile::tempdir().unwrap();
    let log_path = dir.path().join("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    let script = "pwd; env | grep -c -v '^PWD=\\|^SHLVL=\\|^_=\\|^OLDPWD='; \
                  ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; grep SigBlk /proc/self/status; \
                  echo to-stderr >&2; exit 7";
    let launch = Launch {
        program: Path::new("sh"),
        args: vec!["-c".into(), script.into()],
        listener: Some(listener.into()),
        log,
        rlimits: Vec::new(),
        drop_to: DropTo::Now(None),
        cgroup: None,
        workspace: None,
    };
    let mut child = spawn(launch).unwrap();
    assert!(child.id().is_some());
    let status = tokio::time::timeout(Duration::from_secs(10), child.wait()).await.unwrap().unwrap();
    assert_eq!(status.code(), Some(7));
    assert_eq!(child.id(), None, "reaped");
    let log = std::fs::read_to_string(&log_path).unwrap();
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines[0], "/", "{log}");
    assert_eq!(lines[1].trim(), "0", "nothing but what sh sets itself: {log}");
    // 0, 1, 2, the listener on 3, and the directory `ls` reads.
    assert_eq!(lines[2].trim(), "0 1 2 3 4", "{log}");
    assert_eq!(lines[3], "SigBlk:\t0000000000000000", "{log}");
    assert!(log.contains("to-stderr"), "{log}");
}

/// A prepared start waits in the server's own memory (no copy of it): while it waits,
/// none of the server's memory becomes shared with another process (a `fork` would
/// share every page), and closing its pipe lets it go without running the program.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_start_waits_without_a_copy_of_the_server() {
    use super::spawn::{DropTo, Launch, spawn};
    fn shared_dirty_kib() -> u64 {
        let text = std::fs::read_to_string("/proc/self/smaps_rollup").unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("Shared_Dirty:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
    // 32 MiB of this process's own, written.
    let ballast = vec![7u8; 32 << 20];
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let listener = std::os::unix::net::UnixListener::bind(dir.path().join("sock")).unwrap();
    let (read, write) = std::io::pipe().unwrap();
    let launch = Launch {
        program: Path::new("/bin/sh"),
        args: vec!["-c".into(), format!("touch {}", marker.display()).into()],
        listener: Some(listener.into()),
        log,
        rlimits: Vec::new(),
        drop_to: DropTo::Later(read.into(), Vec::new()),
        cgroup: None,
        workspace: None,
    };
    let before = shared_dirty_kib();
    let handle = tokio::runtime::Handle::current();
    let waiting = std::thread::spawn(move || {
        let _runtime = handle.enter();
        spawn(launch).map(|_| ())
    });
    // The child is waiting for its release by now.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let during = shared_dirty_kib();
    assert!(
        during < before + (8 << 10),
        "shared dirty memory {before} kB before, {during} kB while it waits"
    );
    drop(write);
    let let_go = waiting.join().unwrap().unwrap_err();
    assert_eq!(let_go.kind(), std::io::ErrorKind::Interrupted, "{let_go}");
    assert!(!marker.exists(), "a start let go never runs its program");
    assert_eq!(ballast[12345], 7);
}

/// The supervisor's program out of the sandboxes' reach is put where they reach it: a
/// hard link of a program only its owner may write, a copy (runnable, not readable) of
/// one that others could not run; found again by a restarted server; another build's
/// removed.
#[test]
fn an_unreachable_supervisor_is_linked_or_copied_into_the_sandbox_root() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let program = dir.path().join("sandlane");
    std::fs::write(&program, b"#!/bin/sh\necho supervisor\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
    let linked = super::copy_supervisor(&program, &root).unwrap();
    assert!(linked.starts_with(root.join("bin")));
    assert_eq!(std::fs::metadata(&linked).unwrap().ino(), std::fs::metadata(&program).unwrap().ino());
    assert_eq!(super::copy_supervisor(&program, &root).unwrap(), linked, "found again");
    assert_eq!(std::fs::metadata(root.join("bin")).unwrap().mode() & 0o7777, 0o711);

    // A new build (another file), only its owner may run: a copy, runnable by others.
    std::fs::remove_file(&program).unwrap();
    std::fs::write(&program, b"#!/bin/sh\necho rebuilt\n").unwrap();
    std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o700)).unwrap();
    let copied = super::copy_supervisor(&program, &root).unwrap();
    assert_ne!(copied, linked);
    let meta = std::fs::metadata(&copied).unwrap();
    assert_ne!(meta.ino(), std::fs::metadata(&program).unwrap().ino());
    assert_eq!(meta.mode() & 0o7777, 0o711);
    assert_eq!(std::fs::read(&copied).unwrap(), std::fs::read(&program).unwrap());
    assert!(!linked.exists(), "the earlier build's is removed");
}

/// The processes of a sandbox left frozen (its server stopped during a snapshot, and its
/// data dir is gone: no driver will thaw it) are ended all the same when their host uid
/// is: a SIGKILL waits in the freezer until the cgroup is thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_host_uid_thaws_its_frozen_sandbox() {
    let f = fixture();
    if f.driver.cgroups.sandbox_dirs("x").is_empty() {
        return; // no cgroups, no freezer: nothing is ever frozen
    }
    let id = provisioned(&f, &user_spec("frozen-uid")).await;
    let uid = host_uid(&f, &id);
    assert!(f.driver.cgroups.freeze(id.as_str()).await.unwrap());
    let parent = f.driver.config.cgroup_parent.clone();
    let cgroups = f.driver.cgroups.clone();
    let ended =
        tokio::task::spawn_blocking(move || super::host::end_uid(uid, &cgroups, &parent)).await.unwrap();
    assert!(matches!(ended, Ok(n) if n > 0), "{ended:?}");
    assert!(wait_processes(uid, 0).await.is_empty(), "the frozen sandbox's processes are gone");
}

/// A sandbox a server left frozen (it stopped during a snapshot) is thawed, with its
/// workspace's filesystem, by the next driver on the data dir; one that is not frozen is
/// left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_thaws_what_a_snapshot_left_frozen() {
    let f = fixture();
    if f.driver.cgroups.sandbox_dirs("x").is_empty() {
        return; // no cgroups, no freezer: nothing is ever frozen
    }
    let spec = ProvisionSpec { workspace_bytes: Some(64 << 20), ..user_spec("frozen") };
    let id = provisioned(&f, &spec).await;
    let meta = f.driver.meta(&id).unwrap();
    assert!(f.driver.cgroups.freeze(id.as_str()).await.unwrap());
    let mounted = f.driver.mounted_workspace(&id, &meta).expect("the workspace is mounted");
    let frozen_fs = crate::snapshot_files::freeze_fs(&mounted).unwrap();
    std::mem::forget(frozen_fs); // as a server that stopped half-way
    assert!(f.driver.cgroups.is_frozen(id.as_str()));

    let again = BwrapDriver::new(test_config(&f.dir.path().join("data"))).unwrap();
    assert!(!again.cgroups.is_frozen(id.as_str()), "thawed at the driver's start");
    let out = tokio::time::timeout(
        Duration::from_secs(10),
        sh(&f, &id, "echo more >> /workspace/f && cat /workspace/f"),
    )
    .await
    .expect("writes to the workspace go on: its filesystem is thawed too");
    assert_eq!(text(&out.stdout), "more\n", "{}", shown(&out));
}

fn snapshot_ref(n: u128) -> ports::SnapshotRef {
    ports::SnapshotRef { org: domain::OrgId::parse(org()).unwrap(), id: domain::SnapshotId::generate(7, n) }
}

/// After an ephemeral fork, the next fork of the same snapshot is started ahead: its
/// workspace holds the snapshot's files, given to its own uid, and the fork that takes it
/// runs its processes under its own name and token. A fork of another quota does not take
/// it, and deleting the snapshot ends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_ephemeral_fork_of_a_snapshot_is_started_ahead_with_its_files() {
    let f = fixture_with(|c| c.started_ahead = 0);
    let bytes = Some(64 << 20);
    let source =
        provisioned(&f, &ProvisionSpec { workspace_bytes: bytes, ..user_spec("fork-ahead-src") }).await;
    let out =
        sh(&f, &source, "echo snapped > /workspace/f && mkdir /workspace/d && echo deep > /workspace/d/g")
            .await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let snapshot = snapshot_ref(3);
    f.driver.snapshot(&source, &snapshot, ports::SnapshotBudget::default()).await.unwrap();
    let out = sh(&f, &source, "echo later > /workspace/f").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let fork_spec = |session: &str, token: &str, bytes: Option<u64>| ProvisionSpec {
        from_snapshot: Some(snapshot.clone()),
        ..ephemeral_spec(session, token, bytes)
    };
    assert!(f.driver.settled_ahead().await.is_empty(), "nothing is started ahead before a fork");

    let first = provisioned(&f, &fork_spec("fork-ahead-1", "tok-f1", bytes)).await;
    let ahead = f.driver.settled_ahead().await;
    assert_eq!(ahead.len(), f.driver.config.forks_ahead, "the next fork is started ahead");
    assert!(f.driver.config.forks_ahead > 0);
    let before = f.driver.cgroup_pids(&ahead[0]).unwrap();
    assert_eq!(before.len(), IDLE, "{before:?}");
    assert!(f.driver.layout.sandbox_dir(&ahead[0]).join("ahead-ready").is_file(), "marked ready");
    let out = sh(&f, &first, "echo first-fork > /workspace/f").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));

    let second = provisioned(&f, &fork_spec("fork-ahead-2", "tok-f2", bytes)).await;
    assert_eq!(f.driver.cgroup_pids(&second).unwrap(), before, "the fork runs the start ahead's processes");
    assert!(named_paths(&f, &ahead[0]).is_empty(), "{:?}", named_paths(&f, &ahead[0]));
    let state = f.driver.layout.sandbox_dir(&second);
    assert!(!state.join("ahead").exists() && !state.join("ahead-ready").exists(), "no longer a start ahead");
    let out = sh(
        &f,
        &second,
        "echo $SANDLANE_SANDBOX_ID; cat /run/sandlane/token; echo; cat /workspace/f /workspace/d/g; \
         stat -c %u /workspace/f /workspace/d/g | sort -u; id -u; echo mine >> /workspace/d/g && echo wrote",
    )
    .await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let lines: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines[0], second.as_str());
    assert_eq!(lines[1], "tok-f2", "the token is the fork's own, written when it was taken");
    assert_eq!(
        &lines[2..4],
        ["snapped", "deep"],
        "the snapshot's files, not the source's later write nor the first fork's"
    );
    assert_eq!(lines[4], lines[5], "the files are the fork's own uid's");
    assert_eq!(lines[6], "wrote");
    let meta = f.driver.layout.read_meta(&second).unwrap().unwrap();
    assert_eq!((meta.durability, meta.epoch), (Durability::Ephemeral, 1));
    let claim = std::fs::read_to_string(f.dir.path().join(format!("host/uids/{}", meta.host_id))).unwrap();
    assert!(claim.contains(&format!("ephemeral/{second}")), "{claim}");
    assert_ne!(meta.host_id, host_uid(&f, &first));
    // It is a sandbox like any other: it can be snapshotted in turn.
    let again = snapshot_ref(4);
    f.driver
        .snapshot(&second, &again, ports::SnapshotBudget::default())
        .await
        .expect("a fork taken from ahead can be snapshotted");
    f.driver.delete_snapshot(&again).await.unwrap();

    // Refilled; a fork of another quota does not take it (and makes it stale).
    let refilled = f.driver.settled_ahead().await;
    assert_eq!(refilled.len(), f.driver.config.forks_ahead);
    let other = provisioned(&f, &fork_spec("fork-ahead-3", "tok-f3", Some(96 << 20))).await;
    assert_ne!(f.driver.cgroup_pids(&other), f.driver.cgroup_pids(&refilled[0]));
    let now = f.driver.settled_ahead().await;
    assert!(!now.contains(&refilled[0]), "a fork ahead of another quota is discarded");
    assert!(named_paths(&f, &refilled[0]).is_empty());
    // Deleting the snapshot ends its forks ahead.
    assert_eq!(now.len(), 1);
    f.driver.delete_snapshot(&snapshot).await.unwrap();
    assert!(f.driver.settled_ahead().await.is_empty());
    assert!(named_paths(&f, &now[0]).is_empty(), "{:?}", named_paths(&f, &now[0]));
    // A fork of it that ends after the delete (it had copied the files) asks for the next
    // one ahead: that start fails before it makes or claims anything, and is not tried
    // again at the next provision.
    let claims = || std::fs::read_dir(f.dir.path().join("host/uids")).unwrap().count();
    let (dirs, uids) = (std::fs::read_dir(f.driver.layout.sandboxes()).unwrap().count(), claims());
    f.driver.start_ahead(&fork_spec("fork-ahead-late", "tok-late", bytes));
    assert!(f.driver.settled_ahead().await.is_empty());
    assert_eq!(
        std::fs::read_dir(f.driver.layout.sandboxes()).unwrap().count(),
        dirs,
        "no state directory left"
    );
    assert_eq!(claims(), uids, "no uid claimed");
    assert!(!f.driver.forking_ahead(), "the deleted snapshot is no longer the one forked ahead");
    for id in [&source, &first, &second, &other] {
        f.driver.deprovision(id).await.unwrap();
    }
}

/// Without a freezer, a running sandbox's workspace directory is not copied: the copy
/// runs as root, path by path, and a process beside it could swap a directory for a link
/// to the host's files. Once the sandbox is suspended, it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_sandbox_without_a_freezer_is_not_copied_as_a_directory() {
    let f = fixture_with(|c| c.use_cgroups = false);
    let id = provisioned(&f, &user_spec("unfrozen")).await;
    let out = sh(&f, &id, "echo kept > /workspace/f").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let target = snapshot_ref(1);
    let got = f.driver.snapshot(&id, &target, ports::SnapshotBudget::default()).await;
    assert!(matches!(&got, Err(DriverError::Conflict(m)) if m.contains("freezer")), "{got:?}");
    assert!(f.driver.snapshot_files().stored(&target).unwrap().is_none(), "nothing of it is left");
    f.driver.suspend(&id).await.unwrap();
    let bytes = f
        .driver
        .snapshot(&id, &target, ports::SnapshotBudget::default())
        .await
        .expect("a suspended sandbox is copied");
    assert!(bytes > 0);
}

/// A snapshot that would hold more than the org's snapshot quota leaves is refused before
/// anything is copied, for an image and for a directory; within it, it is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_past_what_the_quota_leaves_is_refused_before_it_is_copied() {
    let f = fixture();
    let image =
        provisioned(&f, &ProvisionSpec { workspace_bytes: Some(64 << 20), ..user_spec("big-image") }).await;
    let tree = provisioned(&f, &user_spec("big-tree")).await;
    for (n, id) in [(11, &image), (12, &tree)] {
        let out = sh(&f, id, "head -c 4194304 /dev/urandom > /workspace/data && sync").await;
        assert_eq!(out.exit_code, 0, "{}", shown(&out));
        let target = snapshot_ref(n);
        let budget = ports::SnapshotBudget { quota_left: Some(1 << 20), workspace_bytes: None };
        let got = f.driver.snapshot(id, &target, budget).await;
        assert!(
            matches!(&got, Err(DriverError::ResourceExhausted(m)) if m.contains("quota leaves 1048576")),
            "{id}: {got:?}"
        );
        assert!(f.driver.snapshot_files().stored(&target).unwrap().is_none(), "{id}: nothing of it is left");
        let org_dir = f.driver.layout.snapshots().join(target.org.as_str());
        let left: Vec<_> = std::fs::read_dir(&org_dir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{id}: no partial copy: {left:?}");
        let out = sh(&f, id, "echo still > /workspace/after && cat /workspace/after").await;
        assert_eq!(text(&out.stdout), "still\n", "{id}: the sandbox runs on, thawed");
        let budget = ports::SnapshotBudget { quota_left: Some(64 << 20), workspace_bytes: None };
        let bytes = f.driver.snapshot(id, &target, budget).await.expect("within what the quota leaves");
        assert!(bytes >= 4 << 20, "{id}: {bytes}");
        f.driver.delete_snapshot(&target).await.unwrap();
    }
    for id in [&image, &tree] {
        f.driver.deprovision(id).await.unwrap();
    }
}

/// A directory workspace restored from a directory snapshot: filled beside the workspace
/// and exchanged with it, so it holds the snapshot's files (its own uid's), none of its
/// later ones, and nothing of the exchange is left beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_workspace_is_restored_by_an_exchange() {
    let f = fixture();
    let mut spec = user_spec("tree-into-tree");
    let id = provisioned(&f, &spec).await;
    let out = sh(&f, &id, "mkdir /workspace/d && echo before > /workspace/d/kept").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let target = snapshot_ref(3);
    f.driver.snapshot(&id, &target, ports::SnapshotBudget::default()).await.expect("a snapshot");
    let out = sh(&f, &id, "echo after > /workspace/d/kept && echo later > /workspace/later").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    f.driver.suspend(&id).await.unwrap();
    f.driver.restore(&id, &target).await.expect("a directory restored into a directory");
    let workspace = f.driver.meta(&id).unwrap().workspace;
    let mut beside = workspace.clone().into_os_string();
    beside.push(".restoring");
    assert!(!std::path::Path::new(&beside).exists(), "nothing of the exchange is left");
    spec.epoch = 2;
    f.driver.provision(&spec).await.unwrap();
    let out = sh(&f, &id, "cat /workspace/d/kept; test -e /workspace/later && echo later; touch /workspace/d/mine && echo writable").await;
    assert_eq!(text(&out.stdout), "before\nwritable\n", "{}", shown(&out));
    f.driver.delete_snapshot(&target).await.unwrap();
    f.driver.deprovision(&id).await.unwrap();
}

/// An image snapshot restored into an image workspace is filled beside it and replaces it
/// only once given to the sandbox's uid and grown: a restore that fails at the mount (the
/// snapshot's image damaged here) leaves the workspace's own files, writable, and nothing
/// beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_restore_that_fails_leaves_the_workspace_as_it_was() {
    let f = fixture();
    let mut spec = ProvisionSpec { workspace_bytes: Some(64 << 20), ..user_spec("image-into-image") };
    let id = provisioned(&f, &spec).await;
    let out = sh(&f, &id, "echo before > /workspace/kept && sync").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    let target = snapshot_ref(4);
    f.driver.snapshot(&id, &target, ports::SnapshotBudget::default()).await.expect("a snapshot");
    let out = sh(&f, &id, "echo after > /workspace/kept && sync").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    // The snapshot's image loses its superblock: it no longer mounts.
    let Some(crate::snapshot_files::Stored::Image { image: stored, .. }) =
        f.driver.snapshot_files().stored(&target).unwrap()
    else {
        panic!("an image snapshot");
    };
    std::fs::OpenOptions::new()
        .write(true)
        .open(&stored)
        .and_then(|mut file| std::io::Write::write_all(&mut file, &[0u8; 8192]))
        .unwrap();
    f.driver.suspend(&id).await.unwrap();
    let got = f.driver.restore(&id, &target).await;
    assert!(got.is_err(), "a damaged image is not restored: {got:?}");
    let image = f.driver.meta(&id).unwrap().workspace_image.expect("an image workspace");
    let mut beside = image.clone().into_os_string();
    beside.push(".restoring");
    assert!(!std::path::Path::new(&beside).exists(), "nothing of the restore is left beside the image");
    spec.epoch = 2;
    f.driver.provision(&spec).await.unwrap();
    let out = sh(&f, &id, "cat /workspace/kept; touch /workspace/mine && echo writable").await;
    assert_eq!(text(&out.stdout), "after\nwritable\n", "{}", shown(&out));
    f.driver.delete_snapshot(&target).await.unwrap();
    f.driver.deprovision(&id).await.unwrap();
}

/// A snapshot of a workspace without a quota (a directory) restored into one with a quota
/// (an image): the files are the snapshot's, the workspace keeps its quota and mountpoint.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_snapshot_restores_into_a_workspace_with_a_quota() {
    let f = fixture();
    let mut spec = ProvisionSpec { workspace_bytes: Some(64 << 20), ..user_spec("tree-into-image") };
    let id = provisioned(&f, &spec).await;
    let out = sh(&f, &id, "echo before > /workspace/old").await;
    assert_eq!(out.exit_code, 0, "{}", shown(&out));
    f.driver.suspend(&id).await.unwrap();
    let tree = f.dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("restored"), "from the snapshot\n").unwrap();
    let target = snapshot_ref(2);
    f.driver.snapshot_files().take_tree(&target, &tree).unwrap();
    f.driver.restore(&id, &target).await.expect("a directory restored into an image");
    spec.epoch = 2;
    f.driver.provision(&spec).await.unwrap();
    let out = sh(
        &f,
        &id,
        "cat /workspace/restored; test -e /workspace/old && echo old; df -k /workspace | tail -1",
    )
    .await;
    let said = text(&out.stdout);
    let mut lines = said.lines();
    assert_eq!(lines.next(), Some("from the snapshot"), "{}", shown(&out));
    let df = lines.next().unwrap_or_default();
    assert!(!df.starts_with("old"), "the workspace's earlier files are gone: {}", shown(&out));
    let size_k: u64 = df.split_whitespace().nth(1).and_then(|k| k.parse().ok()).unwrap_or(0);
    assert!((32 << 10..=96 << 10).contains(&size_k), "still its own filesystem of the quota: {df}");
}
