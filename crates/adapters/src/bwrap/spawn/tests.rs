//! The sandbox's log ([`SupervisorLog`]): whatever writes it, and however, it never holds
//! more than [`LOG_CAP`] bytes, the server never reads more, and nothing of it is on the
//! data dir's disk: a supervisor that writes without end is stopped at the cap.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use domain::{CallerClass, Durability};
use ports::driver::SandboxDriver;

use super::{DropTo, LOG_CAP, Launch, SupervisorLog, spawn};
use crate::bwrap::{BwrapConfig, BwrapDriver};
use crate::driver_contract::spec_for;

/// Runs `script` with the log as its standard output and error; its exit code.
async fn run_into(log: &SupervisorLog, script: &str) -> i32 {
    let launch = Launch {
        program: Path::new("/bin/sh"),
        args: vec!["-c".into(), script.into()],
        listener: None,
        log: log.writer().unwrap(),
        rlimits: Vec::new(),
        drop_to: DropTo::Now(None),
        cgroup: None,
        workspace: None,
    };
    let mut child = spawn(launch).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("the writer was stopped, not left writing")
        .unwrap();
    status.code().unwrap_or(-1)
}

fn size(log: &SupervisorLog) -> u64 {
    log.file.metadata().unwrap().size()
}

#[tokio::test]
async fn a_log_written_without_end_stops_at_its_cap() {
    // A short log reads back as written.
    let log = SupervisorLog::new().unwrap();
    assert_eq!(run_into(&log, "echo one; echo two >&2; echo three").await, 0);
    assert_eq!(log.read(), "one\ntwo\nthree\n");
    assert_eq!(log.tail(1, 100), "three");
    assert_eq!(log.tail(2, 100), "two\nthree");
    assert_eq!(log.tail(5, 4), "hree", "at most that many bytes");

    // A writer without end (as root, the server's own uid) is refused past the cap and
    // ends: `yes` exits on its first failed write.
    let log = SupervisorLog::new().unwrap();
    let started = Instant::now();
    let code = run_into(&log, "yes 0123456789abcdef; echo \"yes=$?\" > /dev/null").await;
    assert_eq!(code, 0, "the script goes on after the refused write");
    let text = log.read();
    assert_eq!(text.len() as u64, LOG_CAP, "full to the cap, no more");
    let lines: Vec<&str> = text.split('\n').collect();
    let (last, whole) = lines.split_last().unwrap();
    assert!(whole.iter().all(|l| *l == "0123456789abcdef"), "the writer's lines, from the start");
    assert!("0123456789abcdef".starts_with(last), "cut at the cap: {last:?}");
    assert_eq!(size(&log), LOG_CAP);
    eprintln!("an endless writer was stopped at {LOG_CAP} bytes in {:?}", started.elapsed());

    // A writer that tries the other ways to make it hold more: appending through a new
    // open of the file, truncating it (to write it again), and writing it again from its
    // start through a new open, which stays within the cap.
    let log = SupervisorLog::new().unwrap();
    let script = "printf start; \
                  printf more >> /proc/self/fd/1; appended=$(($? != 0)); \
                  (: > /proc/self/fd/2); truncated=$(($? != 0)); \
                  head -c 200000 /dev/zero 2>/dev/null | tr '\\0' y 2>/dev/null 1<> /proc/self/fd/1; rewritten=$(($? != 0)); \
                  exit $((appended * 100 + truncated * 10 + rewritten))";
    let code = run_into(&log, script).await;
    assert_eq!(code, 111, "every write past the cap, and the truncation, were refused");
    assert_eq!(size(&log), LOG_CAP);
    let text = log.read();
    assert_eq!(text.len() as u64, LOG_CAP);
    assert!(text.bytes().all(|b| b == b'y'), "a rewrite stays within the cap: {:?}", text.find(|c| c != 'y'));
}

fn largest_file(dir: &Path) -> (u64, String) {
    let mut largest = (0, String::new());
    let Ok(entries) = std::fs::read_dir(dir) else { return largest };
    for entry in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else { continue };
        let found = if meta.is_dir() {
            largest_file(&entry.path())
        } else {
            (meta.blocks() * 512, entry.path().display().to_string())
        };
        if found.0 > largest.0 {
            largest = found;
        }
    }
    largest
}

/// A supervisor that only ever writes its log: its start fails at the probe's deadline
/// with the log's end in the error (a bounded part of it), and meanwhile nothing under
/// the data dir or the sandbox root grows past the cap: the log is not on their disk and
/// stops at the cap. Both ways a sandbox starts (cold, and from a prepared start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervisor_writing_its_log_without_end_is_stopped_at_the_cap() {
    for warm_starts in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake-supervisor");
        std::fs::write(
            &fake,
            "#!/bin/sh\necho 'fake supervisor: writing without end' >&2\n\
             while :; do head -c 1048576 /dev/zero | tr '\\0' x >&2 || sleep 0.01; done\n",
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut config = BwrapConfig::new(dir.path().join("data"));
        config.supervisor = fake;
        config.probe_timeout = Duration::from_secs(3);
        config.cgroup_parent = "sandlane-test".to_owned();
        config.started_ahead = 0;
        config.warm_starts = warm_starts;
        // Past what the supervisor could write anywhere before, were its log a file.
        config.limits.file_size_bytes = 16 << 20;
        let roots = [config.data_dir.clone(), config.resolved_sandbox_root()];
        let driver = BwrapDriver::new(config).unwrap();
        if warm_starts > 0 {
            // Wait for the prepared start, so the provision takes it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while driver.warm.lock().unwrap().is_empty() {
                assert!(Instant::now() < deadline, "no start was prepared");
                driver.refill();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        let spec = spec_for("acme", "log-flood", "user-1", CallerClass::User, Durability::Ephemeral, "tok");
        let watch = {
            let roots = roots.clone();
            tokio::task::spawn_blocking(move || {
                let deadline = Instant::now() + Duration::from_secs(4);
                let mut largest = (0, String::new());
                while Instant::now() < deadline {
                    for root in &roots {
                        let found = largest_file(root);
                        if found.0 > largest.0 {
                            largest = found;
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                largest
            })
        };
        let got = driver.provision(&spec).await;
        let largest = watch.await.unwrap();
        let Err(e) = got else { panic!("a supervisor that never answers cannot be ready") };
        let message = e.to_string();
        assert!(message.contains("did not answer") && message.contains("xxxx"), "{message}");
        assert!(message.len() < 4096, "a bounded part of the log is shown: {} bytes", message.len());
        assert!(
            largest.0 < LOG_CAP,
            "warm starts {warm_starts}: {} grew to {} bytes, past the log's cap",
            largest.1,
            largest.0
        );
        drop(driver);
    }
}
