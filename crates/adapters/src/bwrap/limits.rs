//! Resource limits: rlimits set in the spawned bubblewrap process (always), and one
//! cgroup per command where a controller is writable (cgroup v2, or v1 `memory`/`pids`),
//! whose processes are killed as a whole at timeout and at deprovision.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::config::Limits;

/// The rlimits of a command, as `(resource, soft, hard)`.
pub(crate) fn rlimits(limits: &Limits) -> [(libc::__rlimit_resource_t, u64, u64); 6] {
    [
        (libc::RLIMIT_NPROC, limits.processes, limits.processes),
        (libc::RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (libc::RLIMIT_AS, limits.address_space_bytes, limits.address_space_bytes),
        (libc::RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (libc::RLIMIT_CPU, limits.cpu_secs, limits.cpu_secs.saturating_add(1)),
        (libc::RLIMIT_CORE, 0, 0),
    ]
}

/// The cgroup controllers the driver sets limits with.
const CONTROLLERS: [&str; 2] = ["memory", "pids"];

/// How commands are grouped and limited beyond rlimits.
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
            Self::V1(ctrls) => {
                let names: Vec<&str> = ctrls.iter().map(|(c, _)| c.as_str()).collect();
                write!(f, "rlimits+cgroup-v1({})", names.join(","))
            }
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
        let v2_controllers = root.join("cgroup.controllers");
        if let Ok(available) = fs::read_to_string(&v2_controllers) {
            return Self::detect_v2(root, parent, &available);
        }
        let mut found = Vec::new();
        let mut why = Vec::new();
        for ctrl in CONTROLLERS {
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
        if found.is_empty() { Self::None(why.join("; ")) } else { Self::V1(found) }
    }

    fn detect_v2(root: &Path, parent: &str, available: &str) -> Self {
        let wanted: Vec<String> = CONTROLLERS
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

    /// The cgroup directories of a sandbox, one per hierarchy.
    pub fn sandbox_dirs(&self, sandbox: &str) -> Vec<PathBuf> {
        match self {
            Self::None(_) => Vec::new(),
            Self::V1(ctrls) => ctrls.iter().map(|(_, dir)| dir.join(sandbox)).collect(),
            Self::V2(dir, _) => vec![dir.join(sandbox)],
        }
    }

    /// Creates the cgroup of one command of `sandbox`, sets its limits, and opens its
    /// `cgroup.procs` files for the spawned process to join. `Ok(None)` without cgroups.
    pub fn create_exec(&self, sandbox: &str, exec: &str, limits: &Limits) -> io::Result<Option<ExecCgroup>> {
        // The sandbox's cgroup may be removed by a command of it that just ended.
        let mut attempt = 0;
        loop {
            match self.try_create_exec(sandbox, exec, limits) {
                Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 3 => attempt += 1,
                other => return other,
            }
        }
    }

    fn try_create_exec(&self, sandbox: &str, exec: &str, limits: &Limits) -> io::Result<Option<ExecCgroup>> {
        let mut group = ExecCgroup { dirs: Vec::new(), procs: Vec::new() };
        match self {
            Self::None(_) => return Ok(None),
            Self::V1(ctrls) => {
                for (ctrl, parent) in ctrls {
                    let dir = parent.join(sandbox).join(exec);
                    fs::create_dir_all(&dir)?;
                    group.dirs.push(dir.clone());
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
                        _ => {}
                    }
                }
            }
            Self::V2(parent, ctrls) => {
                let sandbox_dir = parent.join(sandbox);
                fs::create_dir_all(&sandbox_dir)?;
                let enable: Vec<String> = ctrls.iter().map(|c| format!("+{c}")).collect();
                write_file(&sandbox_dir.join("cgroup.subtree_control"), &enable.join(" "))?;
                let dir = sandbox_dir.join(exec);
                fs::create_dir_all(&dir)?;
                group.dirs.push(dir.clone());
                for ctrl in ctrls {
                    match ctrl.as_str() {
                        "memory" => {
                            write_file(&dir.join("memory.max"), &limits.memory_bytes.to_string())?;
                            let _ = write_file(&dir.join("memory.swap.max"), "0");
                        }
                        "pids" => write_file(&dir.join("pids.max"), &limits.processes.to_string())?,
                        _ => {}
                    }
                }
            }
        }
        for dir in &group.dirs {
            group.procs.push(OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?);
        }
        Ok(Some(group))
    }
}

fn probe_writable(dir: &Path) -> bool {
    let probe = dir.join(format!("probe-{}", std::process::id()));
    let ok = fs::create_dir(&probe).is_ok() && probe.join("cgroup.procs").exists();
    let _ = fs::remove_dir(&probe);
    ok
}

/// The cgroup of one running command.
#[derive(Debug)]
pub(crate) struct ExecCgroup {
    dirs: Vec<PathBuf>,
    procs: Vec<File>,
}

impl ExecCgroup {
    /// The open `cgroup.procs` files the spawned process writes itself into.
    pub fn procs_files(&self) -> &[File] {
        &self.procs
    }

    /// Kills every process in the command's cgroup and removes it, and the sandbox's
    /// cgroup too when no other command of it is running.
    pub async fn kill_and_remove(self) {
        drop(self.procs);
        for dir in &self.dirs {
            kill_tree(dir).await;
            if let Some(sandbox_dir) = dir.parent() {
                let _ = fs::remove_dir(sandbox_dir);
            }
        }
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

/// Sends SIGKILL to the process group `pgid`.
#[allow(unsafe_code)]
pub(crate) fn sigkill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: as for `sigkill`: a negative pid names a process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

fn pids_in(dir: &Path) -> Vec<i32> {
    fs::read_to_string(dir.join("cgroup.procs"))
        .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn child_dirs(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills every process in `dir` and the cgroups below it, then removes them, bottom up.
/// Gives up after about two seconds (a process stuck in the kernel keeps its cgroup).
pub(crate) async fn kill_tree(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let mut stack = vec![dir.to_path_buf()];
    let mut all = Vec::new();
    while let Some(d) = stack.pop() {
        stack.extend(child_dirs(&d));
        all.push(d);
    }
    // A cgroup v2 kernel kills a whole subtree at once.
    let _ = write_file(&dir.join("cgroup.kill"), "1");
    for _ in 0..200 {
        let mut alive = false;
        for d in &all {
            for pid in pids_in(d) {
                alive = true;
                sigkill(pid);
            }
        }
        if !alive {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for d in all.iter().rev() {
        for _ in 0..50 {
            match fs::remove_dir(d) {
                Ok(()) => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }
}

fn status_field(pid: i32, name: &str) -> Option<String> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_owned)
}

fn all_pids() -> Vec<i32> {
    fs::read_dir("/proc")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// The processes whose real uid is `uid` (from `/proc`), zombies included when
/// `with_zombies`.
pub(crate) fn pids_of_uid_filtered(uid: u32, with_zombies: bool) -> Vec<i32> {
    let uid = uid.to_string();
    all_pids()
        .into_iter()
        .filter(|pid| status_field(*pid, "Uid:").as_deref() == Some(uid.as_str()))
        .filter(|pid| with_zombies || status_field(*pid, "State:").as_deref() != Some("Z"))
        .collect()
}

/// The processes whose real uid is `uid`, zombies included.
#[cfg(test)]
pub(crate) fn pids_of_uid(uid: u32) -> Vec<i32> {
    pids_of_uid_filtered(uid, true)
}

/// The direct children of `pid`.
pub(crate) fn children_of(pid: i32) -> Vec<i32> {
    if pid <= 0 {
        return Vec::new();
    }
    if let Ok(list) = fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        return list.split_whitespace().filter_map(|p| p.parse().ok()).collect();
    }
    let parent = pid.to_string();
    all_pids().into_iter().filter(|p| status_field(*p, "PPid:").as_deref() == Some(parent.as_str())).collect()
}

/// Kills every live process of host uid `uid` until none is left (about two seconds at
/// most). Zombies are left to their parent to reap.
pub(crate) async fn kill_uid(uid: u32) {
    for _ in 0..200 {
        let pids = pids_of_uid_filtered(uid, false);
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            sigkill(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
