//! The snapshots benchmark (issue 36): snapshot and fork (an ensure from a snapshot) of a
//! workspace holding 10 MiB, 100 MiB and 1 GiB, through a real `sandlane serve` (SQLite,
//! bubblewrap), beside a new empty ensure and beside `cp --reflink=auto --sparse=always`
//! of the same image (the floor), on the data dir's own filesystem and on an XFS
//! filesystem with reflinks, in one run, printed as tables and written into
//! `BENCHMARKS.md` by `scripts/bench.sh`.
//!
//! Per filesystem: server B (`bwrap.started_ahead = 0`, the default one fork started
//! ahead) holds the source sandbox, its snapshots, the forks and the cold new empty
//! ensures; server A (same filesystem, the server's defaults: two sandboxes started ahead)
//! the new empty ensures as a caller gets them. Both give every workspace a quota of 2 GiB
//! (an ext4 image per workspace, sparse). Per size the source is filled with random bytes
//! (files of 1 MiB) and snapshotted twice (the reference snapshot and a second one, for
//! forks with none started ahead); then each round runs seven measurements in an order
//! that rotates every round:
//!
//! 1. snapshot of the source (`POST …/snapshots`; the snapshot is deleted afterwards),
//! 2. the floor: `cp --reflink=auto --sparse=always` of the reference snapshot's image to
//!    a new file on the same filesystem, as the issue defines it (no fsync); then, timed
//!    apart, an fsync of that copy and its directory, which the snapshot makes before it
//!    is recorded (the "synced floor": `cp` and the fsync),
//! 3. fork: a session ensure of a new key with `from_snapshot` = the reference snapshot,
//!    which takes the fork B started ahead (when the last fork on B was of the other
//!    snapshot, an untimed fork of the reference comes first, so that B starts one ahead),
//! 4. cold fork: the same from the second snapshot, while B's fork ahead is the
//!    reference's (a fork nothing was started ahead for: the snapshot's files copied, the
//!    sandbox started),
//! 5. a new empty session ensure on server A (a start ahead adopted: one is ready),
//! 6. a new empty session ensure on server B (cold: image, mount, bubblewrap, supervisor),
//! 7. the fork's file steps replayed in this process with the driver's own functions: the
//!    image copy (`clone_or_copy`) and the chown walk (`rechown`), which a cold fork makes
//!    through the sandbox's own mount once it has started and the replay through a mount
//!    on the host (`WorkspaceImage::with_mounted`; that mount and unmount are timed apart,
//!    for reference: a fork makes none).
//!
//! Every measurement starts after `sync` (nothing dirty: what the sandbox wrote is on disk,
//! and no earlier copy's write-back runs beside it), once server A has its starts ahead
//! ready and B its fork ahead (nothing being started or ended ahead on either), and after
//! a short pause. Sandboxes made are deprovisioned between measurements.
//!
//! `cargo bench -p app --bench snapshots -- [--smoke] [--out FILE]`: `--smoke` (1 MiB, one
//! round; part of the test command) writes nothing; `--out` writes the section into FILE.
//! `SANDLANE_BENCH_XFS_DIR` names a directory on an XFS filesystem made with `-m
//! reflink=1` (`scripts/bench.sh` makes and mounts one); unset, the XFS rows are skipped.

#![allow(clippy::expect_used, clippy::unwrap_used, clippy::cast_precision_loss)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use adapters::bwrap::{BwrapConfig, BwrapDriver};
use adapters::snapshot_files::{clone_or_copy, rechown};
use adapters::workspace_image::WorkspaceImage;
use ports::SandboxDriver;
use serde_json::{Value, json};

mod support;
use support::{Served, Setup};

const ORG: &str = "bench";
const MIB: u64 = 1 << 20;
/// The workspace quota of every sandbox: 1 GiB of data and room.
const QUOTA: &str = "2GiB";
/// Sandboxes server A keeps started ahead (the server's default).
const STARTED_AHEAD: usize = 2;
/// Forks server B keeps started ahead once it has forked (the server's default).
const FORKS_AHEAD: usize = 1;

/// Sizes (MiB) and the rounds measured at each (after one warm-up round).
struct Counts {
    sizes: Vec<(u64, usize)>,
    warm_up: bool,
}

impl Counts {
    fn full() -> Self {
        Self { sizes: vec![(10, 21), (100, 15), (1024, 9)], warm_up: true }
    }

    fn smoke() -> Self {
        Self { sizes: vec![(1, 1)], warm_up: false }
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The server under test

/// A `sandlane serve` process on its own data dir (SQLite, bubblewrap) under `parent`.
struct Server {
    served: Served,
    base: String,
    key: String,
    agent: ureq::Agent,
}

static SESSIONS: AtomicU64 = AtomicU64::new(0);

fn new_session(tag: &str) -> String {
    format!("{tag}-{}", SESSIONS.fetch_add(1, Ordering::Relaxed))
}

impl Server {
    fn start(parent: &Path, started_ahead: Option<usize>) -> Self {
        let mut extra = vec![
            ("SANDLANE_POLICY__WORKSPACE_BYTES", QUOTA.to_owned()),
            // A fork of 1 GiB on a slow disk must not meet the default deadlines.
            ("SANDLANE_HTTP__REQUEST_TIMEOUT_MS", "600000".to_owned()),
            ("SANDLANE_HTTP__ENSURE_DEADLINE_MS", "300000".to_owned()),
        ];
        if let Some(n) = started_ahead {
            extra.push(("SANDLANE_BWRAP__STARTED_AHEAD", n.to_string()));
        }
        let served = Served::start_with(&Setup {
            prefix: "sandlane-bench-snapshots-",
            parent: Some(parent),
            caller: "svc-bench",
            orgs: &[ORG],
            extra: &extra,
            warnings: true,
        });
        Self { base: served.base(), key: served.auth(), agent: Served::agent(), served }
    }

    fn data(&self) -> PathBuf {
        self.served.data.path().join("data")
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let url = format!("{}{path}", self.base);
        let auth = self.key.as_str();
        let sent = match (method, body) {
            ("PUT", Some(b)) => self.agent.put(&url).header("authorization", auth).send_json(b),
            ("POST", Some(b)) => self.agent.post(&url).header("authorization", auth).send_json(b),
            ("DELETE", None) => self.agent.delete(&url).header("authorization", auth).call(),
            (m, b) => panic!("no such call: {m} with body {b:?}"),
        };
        let mut response = sent.unwrap_or_else(|e| panic!("{method} {path}: {e}"));
        let status = response.status().as_u16();
        let body = response.body_mut().read_json::<Value>().unwrap_or(Value::Null);
        (status, body)
    }

    /// A session ensure (a fork when `from` names a snapshot); the sandbox's id.
    fn ensure(&self, session: &str, from: Option<&str>) -> String {
        let mut body = json!({"execution_id": "e1"});
        if let Some(from) = from {
            body["from_snapshot"] = json!(from);
        }
        let (status, got) =
            self.call("PUT", &format!("/v1/orgs/{ORG}/sessions/{session}/sandbox"), Some(body));
        assert_eq!(status, 200, "ensure: {got}");
        assert_eq!(got["outcome"], "ready", "ensure: {got}");
        if let Some(from) = from {
            assert_eq!(got["sandbox"]["forked_from"].as_str(), Some(from), "a fork: {got}");
        }
        got["sandbox"]["id"].as_str().expect("sandbox id").to_owned()
    }

    fn deprovision(&self, session: &str) {
        let (status, got) = self.call("DELETE", &format!("/v1/orgs/{ORG}/sessions/{session}/sandbox"), None);
        assert!(status < 300, "deprovision: HTTP {status}: {got}");
    }

    fn sh(&self, sandbox: &str, script: &str) -> String {
        let (status, got) = self.call(
            "POST",
            &format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/exec"),
            Some(json!({"argv": ["sh", "-c", script], "timeout_ms": 600_000})),
        );
        assert_eq!(status, 200, "exec: {got}");
        assert_eq!(got["exit_code"], 0, "{script}: {got}");
        got["stdout"].as_str().unwrap_or_default().to_owned()
    }

    /// A snapshot of `sandbox`: its id and the bytes it holds.
    fn snapshot(&self, sandbox: &str) -> (String, u64) {
        let (status, got) =
            self.call("POST", &format!("/v1/orgs/{ORG}/sandboxes/{sandbox}/snapshots"), Some(json!({})));
        assert_eq!(status, 201, "snapshot: {got}");
        (got["id"].as_str().expect("snapshot id").to_owned(), got["bytes"].as_u64().unwrap_or(0))
    }

    fn delete_snapshot(&self, id: &str) {
        let (status, got) = self.call("DELETE", &format!("/v1/orgs/{ORG}/snapshots/{id}"), None);
        assert_eq!(status, 204, "delete snapshot: {got}");
    }

    fn snapshot_image(&self, id: &str) -> PathBuf {
        self.data().join("snapshots").join(ORG).join(id).join("workspace.img")
    }

    /// Sandboxes started ahead: (ready, being started or ended). A start ahead's marker
    /// is written first and its ready marker once it can be taken.
    fn ahead(&self) -> (usize, usize) {
        let mut counts = (0, 0);
        for entry in std::fs::read_dir(self.data().join("sandboxes")).into_iter().flatten().flatten() {
            let dir = entry.path();
            match (dir.join("ahead").is_file(), dir.join("ahead-ready").is_file()) {
                (true, true) => counts.0 += 1,
                (true, false) => counts.1 += 1,
                _ => {}
            }
        }
        counts
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.served.stop();
        // Resident sandboxes outlive their server: end what is left with the driver itself
        // (its construction ends the starts ahead a server left), so that nothing holds a
        // mount on the filesystem under test when it goes.
        let mut config = BwrapConfig::new(self.data());
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

// ---------------------------------------------------------------------------------------
// One filesystem

/// The samples of one size on one filesystem.
#[derive(Default)]
struct Samples {
    snapshot: Vec<Duration>,
    floor: Vec<Duration>,
    floor_synced: Vec<Duration>,
    fork: Vec<Duration>,
    fork_cold: Vec<Duration>,
    new: Vec<Duration>,
    cold: Vec<Duration>,
    copy: Vec<Duration>,
    mount: Vec<Duration>,
    walk: Vec<Duration>,
    /// What the reference snapshot holds (bytes on disk).
    bytes: u64,
}

/// The medians of one size on one filesystem.
struct Medians {
    mib: u64,
    rounds: usize,
    bytes: u64,
    snapshot: Duration,
    floor: Duration,
    floor_synced: Duration,
    fork: Duration,
    fork_cold: Duration,
    new: Duration,
    cold: Duration,
    copy: Duration,
    mount: Duration,
    walk: Duration,
}

impl Samples {
    fn medians(mut self, mib: u64) -> Medians {
        Medians {
            mib,
            rounds: self.fork.len(),
            bytes: self.bytes,
            snapshot: median(&mut self.snapshot),
            floor: median(&mut self.floor),
            floor_synced: median(&mut self.floor_synced),
            fork: median(&mut self.fork),
            fork_cold: median(&mut self.fork_cold),
            new: median(&mut self.new),
            cold: median(&mut self.cold),
            copy: median(&mut self.copy),
            mount: median(&mut self.mount),
            walk: median(&mut self.walk),
        }
    }
}

/// What the bench found of one filesystem.
struct FsResult {
    name: String,
    described: String,
    rows: Vec<Medians>,
}

/// `findmnt` of the filesystem holding `dir`: type, source and mount point.
fn describe(dir: &Path) -> String {
    let dir = dir.display().to_string();
    let found = command_line("findmnt", &["-n", "-o", "FSTYPE,SOURCE,TARGET", "--target", &dir]);
    let mut parts = found.split_whitespace();
    match (parts.next(), parts.next(), parts.next()) {
        (Some(fs), Some(source), Some(target)) => format!("{fs} ({source} on {target})"),
        _ => "unknown filesystem".to_owned(),
    }
}

/// A session ensure of a new key on `server` (from `snapshot`, a fork), timed; the sandbox
/// is deprovisioned afterwards, untimed.
fn timed_ensure(server: &Server, tag: &str, snapshot: Option<&str>) -> Duration {
    let session = new_session(tag);
    let t = Instant::now();
    server.ensure(&session, snapshot);
    let took = t.elapsed();
    server.deprovision(&session);
    took
}

/// Before each measurement: server A's starts ahead and B's forks ahead (`b_ahead`)
/// ready and none being started or ended, nothing dirty, a short pause.
fn quiesce(a: &Server, b: &Server, b_ahead: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while (a.ahead() != (STARTED_AHEAD, 0) || b.ahead() != (b_ahead, 0)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = Command::new("sync").status();
    std::thread::sleep(Duration::from_millis(150));
}

/// `cp --reflink=auto --sparse=always FROM TO`, timed (the process included), then an
/// fsync of the copy and of its directory: (the copy, the copy and the fsync).
fn floor_copy(from: &Path, to: &Path) -> (Duration, Duration) {
    let t = Instant::now();
    let out = Command::new("cp")
        .args(["--reflink=auto", "--sparse=always"])
        .arg(from)
        .arg(to)
        .output()
        .expect("run cp");
    let copied = t.elapsed();
    assert!(out.status.success(), "cp: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::File::open(to).and_then(|f| f.sync_all()).expect("sync the floor's copy");
    let dir = to.parent().expect("the copy's directory");
    std::fs::File::open(dir).and_then(|d| d.sync_all()).expect("sync the copy's directory");
    let synced = t.elapsed();
    std::fs::remove_file(to).expect("remove the floor's copy");
    (copied, synced)
}

/// The fork's file steps on `image` (a snapshot's), in a scratch directory `dir` on the
/// same filesystem: the copy, then the chown walk inside a mount on the host (the fork's
/// walk is through the sandbox's mount). Returns (copy, mount + unmount, walk).
fn replay_fork(image: &Path, dir: &Path) -> (Duration, Duration, Duration) {
    std::fs::create_dir_all(dir).expect("scratch dir");
    let copy = dir.join("workspace.img");
    let t = Instant::now();
    clone_or_copy(image, &copy).expect("clone_or_copy");
    let copied = t.elapsed();
    let ws = WorkspaceImage::new(copy, dir.join("mnt"), dir.join("templates")).synced(false);
    let mut walk = Duration::ZERO;
    let t = Instant::now();
    ws.with_mounted(|root| {
        let t = Instant::now();
        let done = rechown(root, (65_534, 65_534));
        walk = t.elapsed();
        done
    })
    .expect("mount and walk");
    let mounted = t.elapsed().saturating_sub(walk);
    std::fs::remove_dir_all(dir).expect("remove the scratch dir");
    (copied, mounted, walk)
}

fn measure_fs(name: &str, parent: &Path, c: &Counts) -> FsResult {
    let step = |s: &str| eprintln!("snapshots bench [{name}]: {s}");
    let described = describe(parent);
    step(&format!("servers on {described}"));
    // B: the source, snapshots, forks, cold ensures; A: new ensures (starts ahead).
    let a = Server::start(parent, None);
    let b = Server::start(parent, Some(0));
    let scratch = b.served.data.path().join("scratch");
    // Warm-up: templates made, caches warm, A's starts ahead begun.
    for server in [&a, &b, &a] {
        timed_ensure(server, "warm", None);
    }
    let mut rows = Vec::new();
    for &(mib, rounds) in &c.sizes {
        step(&format!("{mib} MiB: filling the source"));
        let source_session = new_session("source");
        let source = b.ensure(&source_session, None);
        let filled = b.sh(
            &source,
            &format!(
                "mkdir -p /workspace/data && i=0 && while [ $i -lt {mib} ]; do \
                 head -c {MIB} /dev/urandom > /workspace/data/f$i || exit 1; i=$((i+1)); done && \
                 du -sm /workspace/data | cut -f1"
            ),
        );
        assert!(filled.trim().parse::<u64>().unwrap_or(0) >= mib, "the source holds {filled} MiB");
        quiesce(&a, &b, 0);
        let (reference, bytes) = b.snapshot(&source);
        let (second, _) = b.snapshot(&source);
        let image = b.snapshot_image(&reference);
        assert!(image.is_file(), "the reference snapshot's image is at {}", image.display());
        let mut samples = Samples { bytes, ..Samples::default() };
        let total = rounds + usize::from(c.warm_up);
        // Which snapshot B last forked (and so starts a fork of ahead).
        let mut forked: Option<&str> = None;
        for round in 0..total {
            step(&format!("{mib} MiB: round {}/{total}", round + 1));
            let keep = round >= usize::from(c.warm_up);
            for k in 0..7 {
                quiesce(&a, &b, if forked.is_some() { FORKS_AHEAD } else { 0 });
                match (round + k) % 7 {
                    0 => {
                        let t = Instant::now();
                        let (id, _) = b.snapshot(&source);
                        let took = t.elapsed();
                        b.delete_snapshot(&id);
                        if keep {
                            samples.snapshot.push(took);
                        }
                    }
                    1 => {
                        let (copied, synced) = floor_copy(&image, &b.served.data.path().join("floor.img"));
                        if keep {
                            samples.floor.push(copied);
                            samples.floor_synced.push(synced);
                        }
                    }
                    2 => {
                        if forked != Some(reference.as_str()) {
                            // B starts forks of the reference ahead from here.
                            timed_ensure(&b, "fork", Some(&reference));
                            forked = Some(&reference);
                            quiesce(&a, &b, FORKS_AHEAD);
                        }
                        let took = timed_ensure(&b, "fork", Some(&reference));
                        if keep {
                            samples.fork.push(took);
                        }
                    }
                    6 => {
                        if forked == Some(second.as_str()) {
                            // B's fork ahead is the reference's again, not this snapshot's.
                            timed_ensure(&b, "fork", Some(&reference));
                            quiesce(&a, &b, FORKS_AHEAD);
                        }
                        let took = timed_ensure(&b, "fork-cold", Some(&second));
                        forked = Some(&second);
                        if keep {
                            samples.fork_cold.push(took);
                        }
                    }
                    3 => {
                        let took = timed_ensure(&a, "new", None);
                        if keep {
                            samples.new.push(took);
                        }
                    }
                    4 => {
                        let took = timed_ensure(&b, "cold", None);
                        if keep {
                            samples.cold.push(took);
                        }
                    }
                    _ => {
                        let (copy, mount, walk) = replay_fork(&image, &scratch);
                        if keep {
                            samples.copy.push(copy);
                            samples.mount.push(mount);
                            samples.walk.push(walk);
                        }
                    }
                }
            }
        }
        b.delete_snapshot(&reference);
        b.delete_snapshot(&second);
        b.deprovision(&source_session);
        rows.push(samples.medians(mib));
    }
    drop((a, b));
    FsResult { name: name.to_owned(), described, rows }
}

// ---------------------------------------------------------------------------------------
// The report

fn size(mib: u64) -> String {
    if mib >= 1024 && mib.is_multiple_of(1024) { format!("{} GiB", mib / 1024) } else { format!("{mib} MiB") }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-9)
}

fn tables(results: &[FsResult], xfs_skipped: Option<&str>) -> String {
    let mut s = String::from(
        "| filesystem | workspace data | snapshot | floor: `cp` of its image | snapshot / floor | \
         synced floor: `cp` + fsync | snapshot / synced floor | fork (ensure from snapshot) | new empty \
         ensure | fork / new | fork, none started ahead | new empty ensure, cold | cold fork / cold \
         ensure | rounds |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for fs in results {
        for r in &fs.rows {
            let _ = writeln!(
                s,
                "| {} | {} ({:.0} MiB on disk) | {:.1} ms | {:.1} ms | {:.2}× | {:.1} ms | {:.2}× | {:.1} ms | \
                 {:.1} ms | {:.2}× | {:.1} ms | {:.1} ms | {:.2}× | {} |",
                fs.name,
                size(r.mib),
                r.bytes as f64 / MIB as f64,
                ms(r.snapshot),
                ms(r.floor),
                ratio(r.snapshot, r.floor),
                ms(r.floor_synced),
                ratio(r.snapshot, r.floor_synced),
                ms(r.fork),
                ms(r.new),
                ratio(r.fork, r.new),
                ms(r.fork_cold),
                ms(r.cold),
                ratio(r.fork_cold, r.cold),
                r.rounds,
            );
        }
    }
    if let Some(why) = xfs_skipped {
        let _ = writeln!(s, "| XFS | skipped: {why} | | | | | | | | | | | | |");
    }
    s.push_str(
        "\nThe file steps of a fork with none started ahead, replayed in the bench process with the \
         driver's functions on the reference snapshot's image (medians of the same rounds); the \
         rest of such a fork is its start (the records, the image's mount in the sandbox, \
         bubblewrap, the supervisor). A fork started ahead made these steps before it was asked \
         for. The replay walks through a mount on the host (a cold fork through the sandbox's \
         own): that mount and unmount are for reference, not a cold fork's step.\n\n\
         | filesystem | workspace data | image copy (`clone_or_copy`) | chown walk (`rechown`) | \
         cold fork − these two | for reference: mount + unmount on the host |\n|---|---|---|---|---|---|\n",
    );
    for fs in results {
        for r in &fs.rows {
            let rest = r.fork_cold.saturating_sub(r.copy + r.walk);
            let _ = writeln!(
                s,
                "| {} | {} ({} × 1 MiB files) | {:.1} ms | {:.1} ms | {:.1} ms | {:.1} ms |",
                fs.name,
                size(r.mib),
                r.mib,
                ms(r.copy),
                ms(r.walk),
                ms(rest),
                ms(r.mount),
            );
        }
    }
    s.push_str("\n| target | result | status |\n|---|---|---|\n");
    let status = |met: bool| if met { "met" } else { "**missed**" };
    for fs in results.iter().filter(|f| f.name == "XFS") {
        for r in &fs.rows {
            let x = ratio(r.fork, r.new);
            let _ = writeln!(
                s,
                "| XFS, {}: fork p50 ≤ 1.5× a new empty ensure | {:.1} ms / {:.1} ms = {x:.2}× | {} |",
                size(r.mib),
                ms(r.fork),
                ms(r.new),
                status(x <= 1.5)
            );
        }
    }
    if xfs_skipped.is_some() {
        s.push_str("| XFS: fork p50 ≤ 1.5× a new empty ensure | not measured | |\n");
    }
    for fs in results.iter().filter(|f| f.name == "ext4") {
        for r in &fs.rows {
            let x = ratio(r.snapshot, r.floor);
            let _ = writeln!(
                s,
                "| ext4, {}: snapshot p50 ≤ 1.3× the floor copy | {:.1} ms / {:.1} ms = {x:.2}× | {} |",
                size(r.mib),
                ms(r.snapshot),
                ms(r.floor),
                status(x <= 1.3)
            );
        }
    }
    s
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let smoke = args.iter().any(|a| a == "--smoke");
    let out = args.iter().position(|a| a == "--out").and_then(|i| args.get(i + 1)).cloned();
    let c = if smoke { Counts::smoke() } else { Counts::full() };
    let started = command_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]);

    let mut results = Vec::new();
    let home = std::env::temp_dir();
    let own = describe(&home);
    let name = own.split_whitespace().next().unwrap_or("?").to_owned();
    results.push(measure_fs(&name, &home, &c));
    let xfs_dir = std::env::var("SANDLANE_BENCH_XFS_DIR").ok().filter(|d| !d.is_empty()).map(PathBuf::from);
    let xfs_skipped = match &xfs_dir {
        Some(dir) => {
            let found = describe(dir);
            assert!(found.starts_with("xfs "), "SANDLANE_BENCH_XFS_DIR is on {found}, not XFS");
            results.push(measure_fs("XFS", dir, &c));
            None
        }
        None => Some("SANDLANE_BENCH_XFS_DIR unset (`scripts/bench.sh` sets it where it can make one)"),
    };

    let run = std::env::var("SANDLANE_BENCH_RUN").unwrap_or(started);
    let mode = if smoke { "SMOKE run (1 MiB, one round, not a measurement)" } else { "full run" };
    let mut section = String::new();
    let _ = writeln!(section, "Run: {run}; {mode}, release build: {}.\n", !cfg!(debug_assertions));
    let _ = writeln!(
        section,
        "Machine: {} CPUs; kernel {}; {}; {}.\n",
        command_line("nproc", &[]),
        command_line("uname", &["-r"]),
        command_line("bwrap", &["--version"]),
        command_line("cp", &["--version"]).lines().next().unwrap_or("cp"),
    );
    let filesystems: Vec<String> = results.iter().map(|f| format!("{}: {}", f.name, f.described)).collect();
    let rounds: Vec<String> = c.sizes.iter().map(|(mib, n)| format!("{n} at {}", size(*mib))).collect();
    let _ = writeln!(
        section,
        "Set-up: per filesystem ({}), two `sandlane serve` (SQLite, bubblewrap; a `service` caller, so \
         ephemeral workspaces) with their data dirs on it and `policy.workspace_bytes` {QUOTA} (every \
         workspace an ext4 image, sparse): server B with `bwrap.started_ahead = 0` (and the default \
         {FORKS_AHEAD} fork started ahead) for the source, its snapshots, the forks and the cold new \
         ensures; server A with the defaults ({STARTED_AHEAD} sandboxes started ahead) for the new \
         ensures (each adopts a start ahead). The source holds random bytes in files of 1 MiB. \
         Rounds: {}{}, the seven measurements in an order rotating each round, each after `sync` and \
         once A's starts ahead and B's fork ahead are ready; medians. Snapshot: `POST …/snapshots` (the workspace's filesystem frozen, the image \
         copied, the copy and its records fsynced, the record written). Floor: `cp --reflink=auto \
         --sparse=always` of the snapshot's image on the same filesystem, no fsync (the issue's \
         floor); synced floor: that `cp` and then an fsync of the copy and its directory (what a \
         snapshot must add to answer for a copy that survives a crash). Fork: a session ensure \
         with `from_snapshot` of the reference snapshot, taking the fork B started ahead of it after \
         its last fork; fork, none started ahead: the same of a second snapshot of the source while \
         B's fork ahead is the reference's (the files copied and the sandbox started when asked).\n",
        filesystems.join("; "),
        rounds.join(", "),
        if c.warm_up { " (after one warm-up round each)" } else { "" },
    );
    section.push_str(&tables(&results, xfs_skipped));
    println!("\n{section}");
    if let Some(path) = out {
        std::fs::write(&path, &section).expect("write the section");
        eprintln!("snapshots bench: wrote {path}");
    }
}
