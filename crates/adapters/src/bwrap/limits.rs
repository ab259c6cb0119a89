//! Resource limits and the end of a sandbox: rlimits (set on the sandbox at spawn, and on
//! each command by the supervisor), and one cgroup per sandbox where controllers are
//! writable (cgroup v2, or v1 `memory`, `pids`, `cpu` and `freezer`), entered once when
//! the sandbox starts, so the limits hold for its whole process tree. Deprovision ends
//! the tree through that cgroup: v2 `cgroup.kill`; v1 freeze, kill every listed process,
//! thaw, until the cgroup is empty. No pid remembered from earlier, no `/proc` walk.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::Limits;
use supervisor::protocol::Rlimit;

/// The rlimits of the sandbox as a whole, set on bubblewrap before it starts (and so on
/// the supervisor): `(resource, soft, hard)`. `RLIMIT_NPROC` counts the sandbox's host
/// uid, which is the sandbox's own. The CPU-time limit is per command (see
/// [`command_rlimits`]): the supervisor lives long.
pub(crate) fn sandbox_rlimits(limits: &Limits) -> [(libc::__rlimit_resource_t, u64, u64); 5] {
    [
        (libc::RLIMIT_NPROC, limits.processes, limits.processes),
        (libc::RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (libc::RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
        (libc::RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (libc::RLIMIT_CORE, 0, 0),
    ]
}

/// The rlimits the supervisor sets in each command before it starts.
pub(crate) fn command_rlimits(limits: &Limits) -> Vec<(Rlimit, u64)> {
    vec![
        (Rlimit::Processes, limits.processes),
        (Rlimit::OpenFiles, limits.open_files),
        (Rlimit::AddressSpace, limits.address_space_bytes),
        (Rlimit::FileSize, limits.file_size_bytes),
        (Rlimit::CpuSecs, limits.cpu_secs),
        (Rlimit::Core, 0),
    ]
}

/// The cgroup v1 controllers the driver uses, where mounted and writable.
const V1_CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "freezer"];
/// The cgroup v2 controllers it enables (killing needs none: `cgroup.kill`).
const V2_CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// How sandboxes are grouped and limited beyond rlimits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CgroupMode {
    /// No writable controller: rlimits only. Holds why.
    None(String),
    /// cgroup v1: one hierarchy per controller, `(controller, parent dir)`.
    V1(Vec<(String, PathBuf)>),
    /// cgroup v2: one hierarchy; the parent dir and the enabled controllers.
    V2(PathBuf, Vec<String>),
}

impl fmt::Display for CgroupMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::None(why) => write!(f, "rlimits (no cgroup: {why})"),
            Self::V1(_) => write!(f, "rlimits+cgroup-v1({})", self.controllers().join(",")),
            Self::V2(_, ctrls) => write!(f, "rlimits+cgroup-v2({})", ctrls.join(",")),
        }
    }
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    fs::write(path, value.as_bytes())
}

impl CgroupMode {
    /// Finds out which controllers are writable under `root`, creating `parent` in each.
    pub fn detect(enabled: bool, root: &Path, parent: &str) -> Self {
        if !enabled {
            return Self::None("disabled by configuration".to_owned());
        }
        if parent.is_empty() || parent.contains('/') || parent == "." || parent == ".." {
            return Self::None(format!("invalid cgroup parent {parent:?}"));
        }
        if let Ok(available) = fs::read_to_string(root.join("cgroup.controllers")) {
            return Self::detect_v2(root, parent, &available);
        }
        let mut found = Vec::new();
        let mut why = Vec::new();
        for ctrl in V1_CONTROLLERS {
            let hierarchy = root.join(ctrl);
            if !hierarchy.join("cgroup.procs").exists() {
                why.push(format!("{} is not mounted", hierarchy.display()));
                continue;
            }
            let dir = hierarchy.join(parent);
            match fs::create_dir_all(&dir) {
                Ok(()) if probe_writable(&dir) => found.push((ctrl.to_owned(), dir)),
                Ok(()) => why.push(format!("{} is not writable", dir.display())),
                Err(e) => why.push(format!("cannot create {}: {e}", dir.display())),
            }
        }
        // Without memory or pids nothing is limited: that is not worth a cgroup.
        if found.iter().any(|(c, _)| c == "memory" || c == "pids") {
            Self::V1(found)
        } else {
            Self::None(why.join("; "))
        }
    }

    fn detect_v2(root: &Path, parent: &str, available: &str) -> Self {
        let wanted: Vec<String> = V2_CONTROLLERS
            .iter()
            .filter(|c| available.split_whitespace().any(|a| a == **c))
            .map(|c| (*c).to_owned())
            .collect();
        if wanted.is_empty() {
            return Self::None("cgroup v2 without the memory and pids controllers".to_owned());
        }
        let enable: String = wanted.iter().map(|c| format!("+{c} ")).collect();
        let dir = root.join(parent);
        let result = write_file(&root.join("cgroup.subtree_control"), enable.trim_end())
            .and_then(|()| fs::create_dir_all(&dir))
            .and_then(|()| write_file(&dir.join("cgroup.subtree_control"), enable.trim_end()));
        match result {
            Ok(()) if probe_writable(&dir) => Self::V2(dir, wanted),
            Ok(()) => Self::None(format!("{} is not writable", dir.display())),
            Err(e) => Self::None(format!("cgroup v2 controllers not writable: {e}")),
        }
    }

    /// The controllers in use.
    pub fn controllers(&self) -> Vec<String> {
        match self {
            Self::None(_) => Vec::new(),
            Self::V1(ctrls) => ctrls.iter().map(|(c, _)| c.clone()).collect(),
            Self::V2(_, ctrls) => ctrls.clone(),
        }
    }

    /// The cgroup directories of a sandbox, one per hierarchy.
    pub fn sandbox_dirs(&self, sandbox: &str) -> Vec<PathBuf> {
        match self {
            Self::None(_) => Vec::new(),
            Self::V1(ctrls) => ctrls.iter().map(|(_, dir)| dir.join(sandbox)).collect(),
            Self::V2(dir, _) => vec![dir.join(sandbox)],
        }
    }

    /// Whether the cgroup of `sandbox` is known to hold a process (`false` also when that
    /// is not known: no cgroups, no such cgroup, a read error). Only `true` is acted on
    /// (see `BwrapDriver::refresh_credential`): a supervisor that died took every process
    /// of its PID namespace with it, so a populated cgroup is a running sandbox.
    pub fn holds_processes(&self, sandbox: &str) -> bool {
        self.sandbox_dirs(sandbox).first().is_some_and(|dir| !pids_in(dir).is_empty())
    }

    /// Creates the cgroup of `sandbox`, sets its limits, and opens its `cgroup.procs`
    /// files for the sandbox's first process to write itself into. `Ok(None)` without
    /// cgroups.
    pub fn create(&self, sandbox: &str, limits: &Limits) -> io::Result<Option<SandboxCgroup>> {
        let mut procs = Vec::new();
        match self {
            Self::None(_) => return Ok(None),
            Self::V1(ctrls) => {
                for (ctrl, parent) in ctrls {
                    let dir = parent.join(sandbox);
                    fs::create_dir_all(&dir)?;
                    match ctrl.as_str() {
                        "memory" => {
                            write_file(&dir.join("memory.limit_in_bytes"), &limits.memory_bytes.to_string())?;
                            // Without swap accounting the file is missing: no swap to limit.
                            let _ = write_file(
                                &dir.join("memory.memsw.limit_in_bytes"),
                                &limits.memory_bytes.to_string(),
                            );
                        }
                        "pids" => write_file(&dir.join("pids.max"), &limits.processes.to_string())?,
                        "cpu" => {
                            write_file(&dir.join("cpu.cfs_period_us"), "100000")?;
                            write_file(
                                &dir.join("cpu.cfs_quota_us"),
                                &(limits.cpu_millis * 100).to_string(),
                            )?;
                        }
                        _ => {}
                    }
                    procs.push(OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?);
                }
            }
            Self::V2(parent, ctrls) => {
                let dir = parent.join(sandbox);
                fs::create_dir_all(&dir)?;
                for ctrl in ctrls {
                    match ctrl.as_str() {
                        "memory" => {
                            write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                            let _ = write_file(&dir.join("memory.swap.max"), "0");
                        }
                        "pids" => write_file(&dir.join("pids.max"), &limits.processes.to_string())?,
                        "cpu" => {
                            write_file(&dir.join("cpu.max"), &format!("{} 100000", limits.cpu_millis * 100))?
                        }
                        _ => {}
                    }
                }
                procs.push(OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?);
            }
        }
        Ok(Some(SandboxCgroup { procs }))
    }

    /// The parents' `cgroup.procs`, open for writing (a prepared start moves back there
    /// when it is let go).
    pub fn parent_procs(&self) -> io::Result<Vec<File>> {
        let parents: Vec<PathBuf> = match self {
            Self::None(_) => Vec::new(),
            Self::V1(ctrls) => ctrls.iter().map(|(_, d)| d.clone()).collect(),
            Self::V2(d, _) => vec![d.clone()],
        };
        parents.iter().map(|d| OpenOptions::new().write(true).open(d.join("cgroup.procs"))).collect()
    }

    /// Whether a sandbox's cgroups can be prepared under one name and renamed to its id
    /// (cgroup v1 allows renaming within a parent; v2 does not).
    pub fn can_rename(&self) -> bool {
        !matches!(self, Self::V2(..))
    }

    /// Renames the cgroups `from` to `to` in every hierarchy (v1).
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        match self {
            Self::None(_) => Ok(()),
            Self::V1(ctrls) => {
                for (_, parent) in ctrls {
                    fs::rename(parent.join(from), parent.join(to))?;
                }
                Ok(())
            }
            Self::V2(..) => Err(io::Error::other("cgroup v2 cannot rename a cgroup")),
        }
    }

    /// Freezes every process of `sandbox` (v1 `freezer.state`, v2 `cgroup.freeze`) and
    /// waits until the kernel says they are frozen (up to about a second). `Ok(false)`
    /// when there is no freezer for it (no cgroups, or v1 without the freezer): the caller
    /// goes on unfrozen. Thaw with [`CgroupMode::thaw`] whatever happens.
    ///
    /// # Errors
    /// When the freezer cannot be written, or the processes do not freeze in time (they
    /// are thawed again).
    pub async fn freeze(&self, sandbox: &str) -> io::Result<bool> {
        let (file, frozen_when): (PathBuf, fn(&str) -> bool) = match self {
            Self::None(_) => return Ok(false),
            Self::V1(ctrls) => match ctrls.iter().find(|(c, _)| c == "freezer") {
                Some((_, dir)) => (dir.join(sandbox).join("freezer.state"), |s| s.trim() == "FROZEN"),
                None => return Ok(false),
            },
            Self::V2(dir, _) => (dir.join(sandbox).join("cgroup.freeze"), |_| true),
        };
        let v2_events = match self {
            Self::V2(dir, _) => Some(dir.join(sandbox).join("cgroup.events")),
            _ => None,
        };
        write_file(&file, if v2_events.is_some() { "1" } else { "FROZEN" })?;
        for _ in 0..1000 {
            let frozen = match &v2_events {
                Some(events) => fs::read_to_string(events)?.lines().any(|l| l.trim() == "frozen 1"),
                None => frozen_when(&fs::read_to_string(&file)?),
            };
            if frozen {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let _ = self.thaw(sandbox);
        Err(io::Error::other(format!("the processes of {sandbox} did not freeze")))
    }

    /// Whether `sandbox`'s cgroup is frozen (or freezing); `false` without a freezer.
    pub fn is_frozen(&self, sandbox: &str) -> bool {
        let read = |path: PathBuf| fs::read_to_string(path).map(|s| s.trim().to_owned()).unwrap_or_default();
        match self {
            Self::None(_) => false,
            Self::V1(ctrls) => ctrls.iter().find(|(c, _)| c == "freezer").is_some_and(|(_, dir)| {
                matches!(read(dir.join(sandbox).join("freezer.state")).as_str(), "FROZEN" | "FREEZING")
            }),
            Self::V2(dir, _) => read(dir.join(sandbox).join("cgroup.freeze")) == "1",
        }
    }

    /// Thaws what [`CgroupMode::freeze`] froze.
    ///
    /// # Errors
    /// When the freezer cannot be written.
    pub fn thaw(&self, sandbox: &str) -> io::Result<()> {
        match self {
            Self::None(_) => Ok(()),
            Self::V1(ctrls) => match ctrls.iter().find(|(c, _)| c == "freezer") {
                Some((_, dir)) => write_file(&dir.join(sandbox).join("freezer.state"), "THAWED"),
                None => Ok(()),
            },
            Self::V2(dir, _) => write_file(&dir.join(sandbox).join("cgroup.freeze"), "0"),
        }
    }

    /// Removes the (empty) cgroups named `name`; `false` while one still holds a process.
    pub fn remove_empty(&self, name: &str) -> bool {
        self.sandbox_dirs(name).iter().all(|d| match fs::remove_dir(d) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        })
    }

    /// Ends every process of `sandbox` and removes its cgroups. Gives up after about
    /// five seconds (a process stuck in the kernel keeps its cgroup).
    pub async fn kill_and_remove(&self, sandbox: &str) {
        match self {
            Self::None(_) => {}
            Self::V2(parent, _) => {
                let dir = parent.join(sandbox);
                if dir.exists() {
                    let _ = write_file(&dir.join("cgroup.kill"), "1");
                    wait_empty(std::slice::from_ref(&dir)).await;
                    remove_dirs(std::slice::from_ref(&dir)).await;
                }
            }
            Self::V1(ctrls) => {
                let dirs: Vec<PathBuf> =
                    ctrls.iter().map(|(_, d)| d.join(sandbox)).filter(|d| d.exists()).collect();
                if dirs.is_empty() {
                    return;
                }
                let freezer = ctrls.iter().find(|(c, _)| c == "freezer").map(|(_, d)| d.join(sandbox));
                for _ in 0..500 {
                    if dirs.iter().all(|d| pids_in(d).is_empty()) {
                        break;
                    }
                    match &freezer {
                        // Frozen, the listed processes can neither fork nor exit, so every pid
                        // read is a live process of this cgroup when it is killed.
                        Some(f) if f.exists() => {
                            let _ = write_file(&f.join("freezer.state"), "FROZEN");
                            for _ in 0..100 {
                                if fs::read_to_string(f.join("freezer.state"))
                                    .is_ok_and(|s| s.trim() == "FROZEN")
                                {
                                    break;
                                }
                                tokio::time::sleep(Duration::from_millis(1)).await;
                            }
                            for pid in pids_in(f) {
                                sigkill(pid);
                            }
                            let _ = write_file(&f.join("freezer.state"), "THAWED");
                        }
                        _ => {
                            for d in &dirs {
                                for pid in pids_in(d) {
                                    sigkill(pid);
                                }
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                remove_dirs(&dirs).await;
            }
        }
    }
}

async fn wait_empty(dirs: &[PathBuf]) {
    for _ in 0..500 {
        if dirs.iter().all(|d| pids_in(d).is_empty()) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn remove_dirs(dirs: &[PathBuf]) {
    for d in dirs {
        for _ in 0..100 {
            match fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

fn probe_writable(dir: &Path) -> bool {
    // Unique per call, not only per process: two drivers set up at once in one process
    // (tests under `cargo test`) must not see each other's probe and call the hierarchy
    // unwritable (a driver without cgroups).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!("probe-{}-{n}", std::process::id()));
    let ok = fs::create_dir(&probe).is_ok() && probe.join("cgroup.procs").exists();
    let _ = fs::remove_dir(&probe);
    ok
}

/// A sandbox's cgroup, open for its first process to join.
#[derive(Debug)]
pub(crate) struct SandboxCgroup {
    procs: Vec<File>,
}

impl SandboxCgroup {
    /// The open `cgroup.procs` files the spawned process writes itself into.
    pub fn procs_files(&self) -> &[File] {
        &self.procs
    }
}

/// Sends SIGKILL to `pid`; a process that is already gone is not an error.
#[allow(unsafe_code)]
pub(crate) fn sigkill(pid: i32) {
    if pid > 0 {
        // SAFETY: kill has no memory effects; a stale pid at worst yields ESRCH.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

pub(crate) fn pids_in(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

/// The processes whose real uid is `uid` (from `/proc`), zombies included: for tests
/// that check nothing of a sandbox is left, never for killing.
#[cfg(test)]
pub(crate) fn pids_of_uid(uid: u32) -> Vec<i32> {
    let uid = uid.to_string();
    let field = |pid: i32, name: &str| -> Option<String> {
        let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|l| l.split_whitespace().next())
            .map(str::to_owned)
    };
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
                .filter(|pid| field(*pid, "Uid:").as_deref() == Some(uid.as_str()))
                .collect()
        })
        .unwrap_or_default()
}
