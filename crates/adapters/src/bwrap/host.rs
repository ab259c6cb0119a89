//! What a bubblewrap driver running as root shares with every other server on its host:
//! the host uids its sandboxes run as, and the sandbox roots it makes for data dirs.
//!
//! ```text
//! <host_dir>/                   0711, root's     (default /var/lib/sandlane)
//! <host_dir>/uids/              0700             one claim per host uid in use
//! <host_dir>/uids/.lock                          taken (flock) by every claim, release, reap
//! <host_dir>/uids/<uid>         0600             {"data_dir","sandbox_root","identity"}
//! <host_dir>/data-dirs/<name>   0700 dir, 0600   the data dir whose default root is roots/<name>
//! <host_dir>/roots/<name>/      0711             that data dir's default sandbox root
//! ```
//!
//! # Host uids are the host's
//! A host uid is a workspace's for as long as the workspace exists, and no other
//! workspace of any data dir on the host holds it: the claim names the data dir and the
//! workspace (see [`super::workspace`]), and is created, replaced and removed only under
//! an exclusive `flock` of `uids/.lock`, which every server on the host takes (and the
//! `sandlane host reap` command). The kernel counts processes per host uid
//! (`RLIMIT_NPROC`): two sandboxes sharing one would share that budget, so a fork bomb in
//! one would stop the other from starting anything.
//!
//! A claim is stale when its data dir is gone, or its workspace is (a durable workspace
//! directory, an ephemeral sandbox's state directory). Processes still running as a
//! stale claim's uid are a sandbox nobody can reach any more (its server, records and
//! socket are gone), so they are ended before the uid is reused ([`end_uid`]) and by
//! [`reap`], which each driver runs at its start and an operator runs with `sandlane host
//! reap`. Only uids in the configured range whose claim is stale are ever signalled, and
//! only as that uid: the signal is sent by a child that has become the uid
//! (`kill(-1, SIGKILL)` from it reaches exactly the processes the uid owns, atomically
//! with respect to their forks).
//!
//! # A sandbox root the sandboxes can reach
//! A sandbox's uid must reach its workspace and token directory (bubblewrap, already
//! running as that uid, resolves what it binds). A data dir under a home directory of
//! mode 0700 (Debian's `/root`) has a parent no sandbox uid can search, so its sibling
//! cannot be the sandbox root: by default a root server makes it under the host dir,
//! `roots/<name>` with `name` the first 8 bytes of the SHA-256 of the data dir's canonical
//! path in hex, and records the data dir in `data-dirs/<name>`. Two data dirs never share
//! one (a name taken by another data dir that still exists is refused), and a root whose
//! data dir is gone is removed by [`reap`], after the processes of its uids are ended.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::HostIds;
use super::limits::CgroupMode;
use super::workspace::{effective_ids, workspace_exists};

/// The host directory of a root server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostDir {
    path: PathBuf,
}

/// The host's allocation lock, held until dropped.
#[derive(Debug)]
pub(crate) struct HostLock {
    _file: File,
}

/// One host uid's owner: a workspace of a data dir.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Claim {
    /// The data dir of the server that claimed it (canonical).
    pub data_dir: PathBuf,
    /// That server's sandbox root (where its durable workspaces are).
    pub sandbox_root: PathBuf,
    /// The workspace (`durable/<org>/<kind>/<key>` or `ephemeral/<sandbox id>`).
    pub identity: String,
}

impl Claim {
    /// Why the claim is stale (its workspace is gone), or `None` while it holds.
    pub fn why_stale(&self) -> Option<&'static str> {
        if !fs::symlink_metadata(&self.data_dir).is_ok_and(|m| m.is_dir()) {
            return Some("its data dir is gone");
        }
        if workspace_exists(&self.data_dir, &self.sandbox_root, &self.identity) {
            None
        } else if self.identity.starts_with("durable/") {
            Some("its workspace is gone")
        } else {
            Some("its sandbox's record is gone")
        }
    }
}

/// The first 8 bytes of the SHA-256 of `path` (canonical when it exists), in hex.
fn name_of(path: &Path) -> String {
    let canonical = fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn context(what: &str, path: &Path, e: &dyn std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

/// Makes `path` a directory of this user with `mode`, or checks the one there is: a real
/// directory (not a link), this user's, writable by nobody else. Its missing parents are
/// made searchable (0711).
fn own_dir(path: &Path, mode: u32) -> Result<(), String> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        super::workspace::mkdir_all(parent, 0o711)?;
    }
    match fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(context("cannot create", path, &e)),
    }
    let meta = fs::symlink_metadata(path).map_err(|e| context("cannot read", path, &e))?;
    let (euid, _) = effective_ids();
    if !meta.is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not this server's own directory (a directory of uid {euid} that nobody else may write to)",
            path.display()
        ));
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| context("cannot set the mode of", path, &e))
}

impl HostDir {
    /// The host directory at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the claims are.
    pub fn uids(&self) -> PathBuf {
        self.path.join("uids")
    }

    fn data_dirs(&self) -> PathBuf {
        self.path.join("data-dirs")
    }

    fn roots(&self) -> PathBuf {
        self.path.join("roots")
    }

    /// The claim file of host `uid`.
    pub fn claim_path(&self, uid: u32) -> PathBuf {
        self.uids().join(uid.to_string())
    }

    /// The default sandbox root of `data_dir`.
    pub fn root_of(&self, data_dir: &Path) -> PathBuf {
        self.roots().join(name_of(data_dir))
    }

    /// Creates the host directory and its own directories, or checks the ones there (see
    /// the module's doc for their modes).
    ///
    /// # Errors
    /// A message naming the directory that cannot be made or is not this server's own.
    pub fn prepare(&self) -> Result<(), String> {
        own_dir(&self.path, 0o711)?;
        own_dir(&self.uids(), 0o700)?;
        own_dir(&self.data_dirs(), 0o700)?;
        own_dir(&self.roots(), 0o711)
    }

    /// Takes the host's allocation lock (waits for it).
    ///
    /// # Errors
    /// A message when the lock file cannot be opened or locked.
    pub fn lock(&self) -> Result<HostLock, String> {
        let path = self.uids().join(".lock");
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| context("cannot open", &path, &e))?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| context("cannot lock", &path, &e))?;
        Ok(HostLock { _file: file })
    }

    /// Records `data_dir` as the owner of its default sandbox root; the caller holds the
    /// lock.
    ///
    /// # Errors
    /// When the root's name is recorded for another data dir that still exists, or the
    /// record cannot be written.
    pub fn register_root(&self, data_dir: &Path) -> Result<(), String> {
        let name = name_of(data_dir);
        let record = self.data_dirs().join(&name);
        let canonical = fs::canonicalize(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
        match fs::read(&record) {
            Ok(bytes) if Path::new(std::ffi::OsStr::from_bytes(&bytes)) == canonical => {
                return Ok(());
            }
            Ok(bytes) => {
                let other = PathBuf::from(String::from_utf8_lossy(&bytes).into_owned());
                if other.exists() {
                    return Err(format!(
                        "the sandbox root {} is the data dir {}'s, not {}'s",
                        self.roots().join(&name).display(),
                        other.display(),
                        canonical.display()
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(context("cannot read", &record, &e)),
        }
        write_replacing(&record, canonical.as_os_str().as_encoded_bytes())
    }
}

/// Writes `path` atomically (a new file renamed over it), 0600, synced.
pub(crate) fn write_replacing(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.new.{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .map_err(|e| context("cannot create", &tmp, &e))?;
    file.write_all(bytes).map_err(|e| context("cannot write", &tmp, &e))?;
    file.sync_all().map_err(|e| context("cannot sync", &tmp, &e))?;
    drop(file);
    fs::rename(&tmp, path).map_err(|e| context("cannot replace", path, &e))
}

/// Reads host `uid`'s claim at `path`: `Ok(None)` when there is none, `Err` naming why
/// when it cannot be read or understood (such a claim names no workspace: it is stale).
pub(crate) fn read_claim(path: &Path) -> Result<Option<Claim>, String> {
    match fs::read(path) {
        Ok(bytes) => {
            serde_json::from_slice(&bytes).map(Some).map_err(|e| format!("its claim is unreadable: {e}"))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("its claim is unreadable: {e}")),
    }
}

/// Writes `claim` for host `uid` at `path` (a new one, or over a stale one).
pub(crate) fn write_claim(path: &Path, claim: &Claim, new: bool) -> Result<(), String> {
    let bytes = serde_json::to_vec(claim).map_err(|e| format!("cannot encode a host uid claim: {e}"))?;
    if !new {
        return write_replacing(path, &bytes);
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| context("cannot create", path, &e))?;
    file.write_all(&bytes).map_err(|e| context("cannot write", path, &e))
}

/// One host process of interest: its pid, whether it is a zombie, its real uid.
#[derive(Debug, Clone, Copy)]
struct HostProcess {
    pid: i32,
    uid: u32,
    zombie: bool,
}

/// The host's processes whose real uid passes `wanted` (one pass over `/proc`).
fn processes(wanted: impl Fn(u32) -> bool) -> Vec<HostProcess> {
    let Ok(entries) = fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        // A process gone since the listing is skipped.
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else { continue };
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next())
        };
        let Some(uid) = field("Uid:").and_then(|u| u.parse::<u32>().ok()) else { continue };
        if wanted(uid) {
            found.push(HostProcess { pid, uid, zombie: field("State:") == Some("Z") });
        }
    }
    found
}

/// The live (not zombie) processes of host uid `uid`.
#[cfg(test)]
fn live_processes_of(uid: u32) -> Vec<i32> {
    processes(|u| u == uid).into_iter().filter(|p| !p.zombie).map(|p| p.pid).collect()
}

/// The names of the sandbox cgroups (directly under `parent`) that process `pid` is in.
fn cgroups_of(pid: i32, parent: &str) -> BTreeSet<String> {
    let prefix = format!("/{parent}/");
    fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .filter_map(|path| path.strip_prefix(&prefix))
        .filter_map(|rest| rest.split('/').next())
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Sends SIGKILL to every process of host uid `uid` from a child that has become that
/// uid (`kill(-1, …)` reaches exactly the processes a uid may signal: its own, and not
/// this server, which is root's), a few times over (a process that was being created
/// during one is reached by the next).
///
/// # Errors
/// When the child cannot be started or cannot take the uid.
#[allow(unsafe_code)]
fn kill_all_of(uid: u32) -> Result<(), String> {
    extern "C" fn child(arg: *mut std::ffi::c_void) -> std::ffi::c_int {
        // SAFETY: `arg` points at the parent's `u32`, valid until this child exits (the
        // parent waits in `clone_vfork` until then).
        let uid = unsafe { *arg.cast::<u32>() };
        // SAFETY: plain system calls only, as a child of `clone_vfork` must: the uid change
        // goes straight to the kernel and changes this child alone; then `kill`,
        // `nanosleep` and `_exit`.
        unsafe {
            if libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
                libc::_exit(2);
            }
            for _ in 0..5 {
                if libc::kill(-1, libc::SIGKILL) != 0 {
                    let code = if *libc::__errno_location() == libc::ESRCH { 0 } else { 3 };
                    libc::_exit(code);
                }
                let pause = libc::timespec { tv_sec: 0, tv_nsec: 2_000_000 };
                libc::nanosleep(&raw const pause, std::ptr::null_mut());
            }
            libc::_exit(0)
        }
    }
    let mut arg = uid;
    // SAFETY: `arg` outlives the child's use of it (this returns once the child exited),
    // and `child` keeps to plain system calls.
    let pid = unsafe { supervisor::vfork::clone_vfork(child, (&raw mut arg).cast()) }
        .map_err(|e| format!("cannot start a process to end host uid {uid}'s: {e}"))?;
    let mut status = 0;
    // SAFETY: waitpid writes only into `status`; `pid` is this thread's child.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
    match (libc::WIFEXITED(status), libc::WEXITSTATUS(status)) {
        (true, 0) => Ok(()),
        (true, 2) => Err(format!("cannot become host uid {uid} to end its processes")),
        _ => Err(format!("could not signal the processes of host uid {uid} (status {status})")),
    }
}

/// Ends every process of host uid `uid` (a stale claim's: see the module's doc) and
/// removes the empty sandbox cgroups (under `cgroup_parent`) they were in. Returns how
/// many live processes the uid had; `Ok(0)` at once when it had none.
///
/// # Errors
/// When they cannot be signalled, or some are still alive after five seconds.
pub(crate) fn end_uid(uid: u32, cgroups: &CgroupMode, cgroup_parent: &str) -> Result<usize, String> {
    end_uids(&BTreeSet::from([uid]), cgroups, cgroup_parent).remove(&uid).unwrap_or(Ok(0))
}

/// [`end_uid`] for many uids at once, at the cost of a few passes over `/proc` in all
/// rather than per uid (a host reap of thousands of stale uids with thousands of processes
/// alive would otherwise be quadratic): one pass finds their processes, each uid that has
/// some is signalled, then passes every 10 ms until none is left or five seconds went by.
/// Each uid's answer as [`end_uid`]'s.
pub(crate) fn end_uids(
    uids: &BTreeSet<u32>,
    cgroups: &CgroupMode,
    cgroup_parent: &str,
) -> BTreeMap<u32, Result<usize, String>> {
    if uids.is_empty() {
        // No pass over `/proc` for nothing (a server's start reaps, mostly nothing).
        return BTreeMap::new();
    }
    let mut live: BTreeMap<u32, usize> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for p in processes(|u| uids.contains(&u)).into_iter().filter(|p| !p.zombie) {
        *live.entry(p.uid).or_default() += 1;
        names.extend(cgroups_of(p.pid, cgroup_parent));
    }
    let mut ended: BTreeMap<u32, Result<usize, String>> = uids.iter().map(|uid| (*uid, Ok(0))).collect();
    let mut signalled = BTreeSet::new();
    for (uid, count) in &live {
        match kill_all_of(*uid) {
            Ok(()) => {
                signalled.insert(*uid);
                ended.insert(*uid, Ok(*count));
            }
            Err(e) => {
                ended.insert(*uid, Err(e));
            }
        }
    }
    // A sandbox its server left frozen (stopped in the middle of a snapshot) holds its
    // processes in the freezer, where a SIGKILL waits: thaw their cgroups so it lands.
    for name in &names {
        if cgroups.is_frozen(name)
            && let Err(e) = cgroups.thaw(name)
        {
            // The wait below then names the processes the freezer still holds.
            tracing::warn!(cgroup = %name, error = %e, "cannot thaw a frozen sandbox whose host uid is being ended");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut left = still_alive(&signalled);
    while !left.is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        left = still_alive(&signalled);
    }
    for name in &names {
        for _ in 0..100 {
            if cgroups.remove_empty(name) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for (uid, n) in left {
        ended.insert(uid, Err(format!("{n} processes of host uid {uid} did not end")));
    }
    ended
}

/// How many live processes each of `uids` still has (those with none are left out).
fn still_alive(uids: &BTreeSet<u32>) -> BTreeMap<u32, usize> {
    let mut left = BTreeMap::new();
    if uids.is_empty() {
        return left;
    }
    for p in processes(|u| uids.contains(&u)).into_iter().filter(|p| !p.zombie) {
        *left.entry(p.uid).or_default() += 1;
    }
    left
}

/// A host uid whose claim was stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleUid {
    /// The uid.
    pub uid: u32,
    /// The workspace that claimed it (empty when the claim was unreadable).
    pub identity: String,
    /// The data dir whose workspace it was (empty when the claim was unreadable).
    pub data_dir: PathBuf,
    /// Why the claim was stale.
    pub why: String,
    /// How many live processes ran as it (and were ended, unless it was a dry run).
    pub processes: usize,
}

/// A default sandbox root whose data dir is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GoneRoot {
    /// The root (removed, unless it was a dry run).
    pub root: PathBuf,
    /// The data dir it was made for.
    pub data_dir: PathBuf,
}

/// What a reap found (and ended, unless it was a dry run): see [`super::reap_host`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reaped {
    /// Host uids in range whose claim was stale: their processes ended, the claim gone.
    pub uids: Vec<StaleUid>,
    /// Sandbox roots of data dirs that are gone: removed.
    pub roots: Vec<GoneRoot>,
    /// What could not be ended or removed, and why.
    pub failures: Vec<String>,
}

/// Finds every claim of a host uid in `ids` that is stale and every default sandbox root
/// whose data dir is gone; unless `dry_run`, ends the uids' processes, removes their
/// claims, and removes those roots (and their tokens in memory). Holds the host's lock
/// throughout, so no server claims a uid meanwhile.
///
/// # Errors
/// When the host directory cannot be read or locked.
pub(crate) fn reap(
    host: &HostDir,
    ids: HostIds,
    cgroups: &CgroupMode,
    cgroup_parent: &str,
    dry_run: bool,
) -> Result<Reaped, String> {
    let mut reaped = Reaped::default();
    if !host.uids().is_dir() {
        return Ok(reaped);
    }
    let _lock = host.lock()?;
    let in_range = |uid: u32| uid >= ids.base && uid - ids.base < ids.span;
    let entries = fs::read_dir(host.uids()).map_err(|e| context("cannot list", &host.uids(), &e))?;
    let mut stale = Vec::new();
    for entry in entries.flatten() {
        let Some(uid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if !in_range(uid) {
            continue;
        }
        let found = match read_claim(&entry.path()) {
            Ok(None) => continue,
            Ok(Some(claim)) => match claim.why_stale() {
                None => continue,
                Some(why) => StaleUid {
                    uid,
                    identity: claim.identity,
                    data_dir: claim.data_dir,
                    why: why.to_owned(),
                    processes: 0,
                },
            },
            Err(why) => {
                StaleUid { uid, identity: String::new(), data_dir: PathBuf::new(), why, processes: 0 }
            }
        };
        stale.push(found);
    }
    // A dry run counts the stale uids' processes (one pass over the host's processes);
    // otherwise they are ended together, each uid answering how many it had.
    let wanted: BTreeSet<u32> = stale.iter().map(|s| s.uid).collect();
    let mut found: BTreeMap<u32, Result<usize, String>> = if dry_run {
        still_alive(&wanted).into_iter().map(|(uid, n)| (uid, Ok(n))).collect()
    } else {
        end_uids(&wanted, cgroups, cgroup_parent)
    };
    for mut s in stale {
        match found.remove(&s.uid) {
            Some(Ok(n)) => s.processes = n,
            Some(Err(e)) => {
                reaped.failures.push(e);
                continue;
            }
            None => {}
        }
        if !dry_run {
            let path = host.claim_path(s.uid);
            if let Err(e) = fs::remove_file(&path)
                && e.kind() != io::ErrorKind::NotFound
            {
                reaped.failures.push(context("cannot remove", &path, &e));
            }
        }
        reaped.uids.push(s);
    }
    reap_roots(host, dry_run, &mut reaped);
    Ok(reaped)
}

/// The default sandbox roots whose data dir is gone (see [`reap`]).
fn reap_roots(host: &HostDir, dry_run: bool, reaped: &mut Reaped) {
    let Ok(entries) = fs::read_dir(host.data_dirs()) else { return };
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str().filter(|n| !n.starts_with('.')) else { continue };
        let Ok(bytes) = fs::read(entry.path()) else { continue };
        let data_dir = PathBuf::from(std::ffi::OsStr::from_bytes(&bytes));
        match fs::symlink_metadata(&data_dir) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            _ => continue,
        }
        let root = host.roots().join(name);
        if !dry_run {
            // Nothing mounted under it is removed through it.
            let under = format!("{}/", root.display());
            if mounts.lines().filter_map(|l| l.split(' ').nth(4)).any(|point| point.starts_with(&under)) {
                reaped.failures.push(format!("{} still has mounts under it; left", root.display()));
                continue;
            }
            if root.exists() {
                let tokens = super::token_root::in_memory(&root);
                if fs::symlink_metadata(&tokens).is_ok_and(|m| m.is_dir() && m.uid() == effective_ids().0) {
                    let _ = fs::remove_dir_all(&tokens);
                }
            }
            if let Err(e) = super::workspace::remove_dir_all_quiet(&root) {
                reaped.failures.push(e);
                continue;
            }
            let _ = fs::remove_file(entry.path());
        }
        reaped.roots.push(GoneRoot { root, data_dir });
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;
    use std::process::{Child, Command};

    use super::*;

    /// A process running as host uid `uid` (root's tests only).
    fn sleeper(uid: u32) -> Child {
        Command::new("sleep").arg("1000").uid(uid).gid(uid).spawn().unwrap()
    }

    fn gone(child: &mut Child) -> bool {
        for _ in 0..200 {
            if child.try_wait().unwrap().is_some() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[test]
    fn the_host_dir_is_made_private_and_a_foreign_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostDir::new(dir.path().join("a/host"));
        host.prepare().unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(host.path()), 0o711);
        assert_eq!(mode(&host.uids()), 0o700);
        assert_eq!(mode(&host.roots()), 0o711);
        // Writable by others: someone else could have planted claims.
        fs::set_permissions(host.uids(), fs::Permissions::from_mode(0o777)).unwrap();
        assert!(host.prepare().unwrap_err().contains("not this server's own"));
        fs::set_permissions(host.uids(), fs::Permissions::from_mode(0o700)).unwrap();
        // A link in its place.
        let link = HostDir::new(dir.path().join("link"));
        std::os::unix::fs::symlink(host.path(), link.path()).unwrap();
        assert!(link.prepare().is_err());
    }

    #[test]
    fn a_root_is_one_data_dir_s() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostDir::new(dir.path().join("host"));
        host.prepare().unwrap();
        let (one, two) = (dir.path().join("one"), dir.path().join("two"));
        fs::create_dir(&one).unwrap();
        fs::create_dir(&two).unwrap();
        assert_ne!(host.root_of(&one), host.root_of(&two));
        host.register_root(&one).unwrap();
        host.register_root(&one).unwrap();
        // The name taken by a data dir that exists is refused to another (forged here).
        let record = host.data_dirs().join(name_of(&two));
        fs::write(&record, one.as_os_str().as_encoded_bytes()).unwrap();
        assert!(host.register_root(&two).unwrap_err().contains("not"));
        // Once that data dir is gone, the name is free again.
        fs::write(&record, dir.path().join("gone").as_os_str().as_encoded_bytes()).unwrap();
        host.register_root(&two).unwrap();
    }

    /// Stale claims in range are reaped (their processes ended, the claim removed); a
    /// live claim, a stale one out of range and a dry run end nothing. The roots of gone
    /// data dirs go.
    #[test]
    fn reap_ends_stale_uids_in_range_only() {
        let dir = tempfile::tempdir().unwrap();
        let host = HostDir::new(dir.path().join("host"));
        host.prepare().unwrap();
        let ids = HostIds { base: 1_650_000_000, span: 100 };
        let (live_data, gone_data) = (dir.path().join("live"), dir.path().join("gone"));
        let root = dir.path().join("root");
        fs::create_dir_all(live_data.join("sandboxes/sbx_01J0000000000000000000000A")).unwrap();
        let claim = |data: &Path, identity: &str| Claim {
            data_dir: data.to_path_buf(),
            sandbox_root: root.clone(),
            identity: identity.to_owned(),
        };
        let (live_uid, stale_uid, record_gone_uid, outside_uid) =
            (1_650_000_001, 1_650_000_002, 1_650_000_003, 1_650_000_200);
        write_claim(
            &host.claim_path(live_uid),
            &claim(&live_data, "ephemeral/sbx_01J0000000000000000000000A"),
            true,
        )
        .unwrap();
        write_claim(
            &host.claim_path(stale_uid),
            &claim(&gone_data, "ephemeral/sbx_01J0000000000000000000000B"),
            true,
        )
        .unwrap();
        write_claim(
            &host.claim_path(record_gone_uid),
            &claim(&live_data, "ephemeral/sbx_01J0000000000000000000000C"),
            true,
        )
        .unwrap();
        write_claim(
            &host.claim_path(outside_uid),
            &claim(&gone_data, "ephemeral/sbx_01J0000000000000000000000D"),
            true,
        )
        .unwrap();
        fs::create_dir_all(&gone_data).unwrap();
        host.register_root(&gone_data).unwrap();
        fs::create_dir_all(host.root_of(&gone_data).join("workspaces/durable")).unwrap();
        fs::remove_dir_all(&gone_data).unwrap();
        let mut processes: Vec<(u32, Child)> =
            [live_uid, stale_uid, record_gone_uid, outside_uid].iter().map(|u| (*u, sleeper(*u))).collect();
        let cgroups = CgroupMode::None("test".into());

        let looked = reap(&host, ids, &cgroups, "sandlane-test", true).unwrap();
        let uids: Vec<u32> = looked.uids.iter().map(|s| s.uid).collect();
        assert_eq!(
            uids.iter().copied().collect::<BTreeSet<_>>(),
            BTreeSet::from([stale_uid, record_gone_uid])
        );
        assert!(looked.uids.iter().all(|s| s.processes == 1), "{looked:?}");
        assert_eq!(looked.roots.len(), 1, "{looked:?}");
        assert!(processes.iter_mut().all(|(_, c)| c.try_wait().unwrap().is_none()), "a dry run ends nothing");
        assert!(host.root_of(&gone_data).exists());

        let reaped = reap(&host, ids, &cgroups, "sandlane-test", false).unwrap();
        assert_eq!(reaped.uids.len(), 2, "{reaped:?}");
        let why: BTreeSet<&str> = reaped.uids.iter().map(|s| s.why.as_str()).collect();
        assert_eq!(why, BTreeSet::from(["its data dir is gone", "its sandbox's record is gone"]));
        assert!(reaped.failures.is_empty(), "{reaped:?}");
        for (uid, child) in &mut processes {
            let ended = *uid == stale_uid || *uid == record_gone_uid;
            assert_eq!(gone(child), ended, "uid {uid}");
            assert_eq!(host.claim_path(*uid).exists(), !ended, "uid {uid}'s claim");
        }
        assert!(!host.root_of(&gone_data).exists(), "the gone data dir's root is removed");
        assert_eq!(reap(&host, ids, &cgroups, "sandlane-test", false).unwrap(), Reaped::default());
        for (_, child) in &mut processes {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A fork bomb of one uid is ended as a whole, whatever it forks meanwhile.
    #[test]
    fn end_uid_ends_a_forking_tree() {
        let uid = 1_650_000_050;
        let mut bomb = Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 1000 ]; do sleep 100 & i=$((i+1)); done; wait"])
            .uid(uid)
            .gid(uid)
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(live_processes_of(uid).len() > 2, "positive control: it forks");
        let ended = end_uid(uid, &CgroupMode::None("test".into()), "sandlane-test").unwrap();
        assert!(ended > 2, "{ended}");
        assert!(gone(&mut bomb));
        assert_eq!(live_processes_of(uid), Vec::<i32>::new());
        assert_eq!(end_uid(uid, &CgroupMode::None("test".into()), "sandlane-test").unwrap(), 0);
    }

    /// Many uids are ended together (the reap's way), each answered as if alone; a uid with
    /// no process answers 0.
    #[test]
    fn end_uids_ends_many_uids_together() {
        let uids = [1_650_000_061_u32, 1_650_000_062, 1_650_000_063];
        let mut children: Vec<Child> = uids
            .iter()
            .map(|uid| {
                Command::new("sh")
                    .args(["-c", "sleep 100 & sleep 100 & wait"])
                    .uid(*uid)
                    .gid(*uid)
                    .spawn()
                    .unwrap()
            })
            .collect();
        // Each sh forks its two sleeps when it is scheduled: on a busy machine that takes
        // longer than any fixed pause.
        let deadline = Instant::now() + Duration::from_secs(10);
        while uids.iter().any(|uid| live_processes_of(*uid).len() < 3) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for uid in uids {
            assert_eq!(live_processes_of(uid).len(), 3, "positive control: uid {uid} has sh and two sleeps");
        }
        let idle = 1_650_000_064;
        let all: BTreeSet<u32> = uids.iter().copied().chain([idle]).collect();
        let ended = end_uids(&all, &CgroupMode::None("test".into()), "sandlane-test");
        for uid in uids {
            assert_eq!(ended[&uid], Ok(3), "{uid}");
            assert_eq!(live_processes_of(uid), Vec::<i32>::new());
        }
        assert_eq!(ended[&idle], Ok(0));
        for child in &mut children {
            assert!(gone(child));
        }
    }
}
