//! The bubblewrap sandbox driver: each sandbox is one live bubblewrap sandbox (user, pid,
//! network, ipc, uts and mount namespaces, an unprivileged uid with no capabilities, a
//! read-only root with `/workspace` and `/tmp` the only writable places) around the
//! supervisor (`sandlane-supervisor`) as its init. Commands are the supervisor's
//! children: no namespace set-up and no cgroup move per command.
//!
//! # A sandbox
//! Provision creates the workspace, the token directory and the sandbox's cgroup, binds a
//! listening unix socket in the sandbox's root-only `control/` directory, and starts
//! `bwrap --unshare-all --unshare-user --uid 1000 --gid 1000 --disable-userns --cap-drop
//! ALL --new-session --as-pid-1 --clearenv …` with the read-only system binds, private
//! `/proc`, `/dev` (then read-only) and `/tmp`, `/workspace` read-write, the token
//! directory read-only at `/run/sandlane`, the supervisor's program read-only, `/`
//! remounted read-only, then the supervisor with the listening socket inherited on
//! descriptor 3. The spawned child joins the cgroup, takes the rlimits, starts a session
//! of its own and drops to the workspace's host uid before `exec`. The sandbox is ready
//! when the supervisor answers its hello (no probe process). There is no
//! `--die-with-parent`: a sandbox outlives a server restart, and the restarted server
//! finds it again by connecting to the socket's path.
//!
//! # Commands
//! One connection to the supervisor per exec: argv, exactly the sandbox environment of
//! its latest ensure (kept beside its token, see `workspace`), `/workspace`, the timeout, the output cap and
//! the per-command rlimits. Dropping the exec closes the connection, and the supervisor
//! kills the command's process group.
//!
//! # Ids
//! When the server runs as root, each workspace gets its own unprivileged host uid and
//! gid ([`HostIds`]), which it keeps for as long as it exists (a durable workspace across
//! deprovisions); no two workspaces on the host ever hold one, whatever their data dirs
//! (the claims are the host's: `host`). Inside, it is [`BwrapConfig::inner_id`]. When the
//! server is not root, sandboxes run as its uid.
//!
//! # What a sandbox's uid reaches
//! Only the sandbox root (its workspace and token directory) and the supervisor's
//! program, bound by bubblewrap already running as that uid. A root server's default
//! sandbox root is under the host dir, not beside the data dir, and a supervisor program
//! under a directory the uid cannot search (a clone in a 0700 home) is copied into the
//! sandbox root's `bin/`: the server runs wherever a user cloned it
//! ([`BwrapConfig::resolved_sandbox_root`]).
//!
//! # Sandboxes nobody owns
//! At its start the driver ends the sandboxes whose data dir or record is gone, on the
//! whole host ([`reap_host`], also `sandlane host reap`).
//!
//! # Limits and the end of a sandbox
//! Rlimits always; where cgroup controllers are writable (v2, or v1 `memory`, `pids`,
//! `cpu`, `freezer`), one cgroup per sandbox holds the limits for the whole tree.
//! Deprovision asks the supervisor to exit (as the pid namespace's init, its end takes
//! every process of the sandbox with it), then empties the cgroup (v2 `cgroup.kill`; v1
//! freeze, kill what is listed, thaw) and removes it. A sandbox whose supervisor is gone
//! is cleaned up the same way, and exec and refresh then answer
//! [`DriverError::NotFound`].
//!
//! # Protections
//! [`SandboxDriver::health`] says which protections this host gives (user namespaces,
//! cgroup controllers, seccomp); provision refuses when one that is required
//! ([`BwrapConfig::required_protections`]) is missing, or the supervisor does not confirm
//! its seccomp filter.
//!
//! # Zombies
//! The server reaps the bubblewrap processes it started. One started by an earlier
//! server process is reparented to the host's init when that server dies: on a host
//! whose init does not reap orphans, it stays a zombie after its sandbox ends (no
//! memory, no cgroup, one pid entry). Run the server under an init that reaps.

mod ahead;
pub(crate) mod command;
mod config;
mod host;
pub(crate) mod limits;
mod quota;
mod snapshot;
pub(crate) mod spawn;
mod token_root;
mod workspace;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use domain::split::WORKSPACE_PATH;
use domain::{
    DriverEnvironment, Durability, ExecOutput, ExecRequest, ProcessCaps, ProcessInfo, ProcessRequest,
    SandboxId, SandboxPath, SandboxToken, Signal,
};
use ports::Cause;
use ports::driver::{
    ByteSource, ByteStream, DriverError, DriverHealth, OutputStream, ProvisionSpec, ReadOutcome,
    SandboxDriver, Unpacked,
};

pub use config::{
    BwrapConfig, BwrapSettings, DEFAULT_HOST_DIR, DEFAULT_RO_BINDS, HostIds, Limits, Protection,
    default_sandbox_root,
};
pub use host::{GoneRoot, Reaped, StaleUid};
pub use token_root::in_memory as tokens_in_memory;

use crate::supervisor_link::client::{self, ClientError};
use crate::supervisor_link::listener::{self, ProxyListener};
use crate::supervisor_link::ops::{self, Host};
use command::{SandboxSpec, SystemBind, one_off_args, resolve_binds, resolve_program, supervisor_args};
use limits::CgroupMode;
use supervisor::protocol::ExecSpec;
use workspace::{IdMode, Layout, SandboxMeta, effective_ids};

/// The most bytes of a sandbox's log a failed start's error shows.
const LOG_SHOWN: usize = 2048;

/// A [`spawn::Launch`] that owns its program path, for a blocking thread.
struct OwnedLaunch {
    program: PathBuf,
    args: Vec<OsString>,
    listener: Option<OwnedFd>,
    log: std::fs::File,
    rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    drop_to: spawn::DropTo,
    cgroup: Option<limits::SandboxCgroup>,
    workspace: Option<spawn::WorkspaceMount>,
}

impl From<spawn::Launch<'_>> for OwnedLaunch {
    fn from(l: spawn::Launch<'_>) -> Self {
        Self {
            program: l.program.to_owned(),
            args: l.args,
            listener: l.listener,
            log: l.log,
            rlimits: l.rlimits,
            drop_to: l.drop_to,
            cgroup: l.cgroup,
            workspace: l.workspace,
        }
    }
}

impl OwnedLaunch {
    fn spawn(self) -> std::io::Result<spawn::Started> {
        spawn::spawn(spawn::Launch {
            program: &self.program,
            args: self.args,
            listener: self.listener,
            log: self.log,
            rlimits: self.rlimits,
            drop_to: self.drop_to,
            cgroup: self.cgroup,
            workspace: self.workspace,
        })
    }
}

/// `path` as a C string (for the forked child, which must not allocate).
fn c_path(path: &Path) -> Result<std::ffi::CString, DriverError> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| failed(format!("the path {} holds a NUL byte", path.display())))
}

/// One command as a one-off bubblewrap would run it (see [`BwrapDriver::command_line`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// The bubblewrap program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The host uid and gid the process runs as (`None`: the server's own).
    pub host_id: Option<u32>,
}

/// How long a connection to a live supervisor may take to say hello.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long past a command's timeout the server waits for its supervisor's answer.
const EXEC_GRACE: Duration = Duration::from_secs(10);

/// The bubblewrap driver. Build it once with [`BwrapDriver::new`] and share it.
#[derive(Debug)]
pub struct BwrapDriver {
    config: BwrapConfig,
    layout: Layout,
    binds: Vec<SystemBind>,
    cgroups: CgroupMode,
    ids: IdMode,
    /// What this host gives.
    available: Vec<Protection>,
    /// What a sandbox needs.
    required: Vec<Protection>,
    /// Why the driver cannot work whatever the program (found at construction).
    setup_problem: Option<String>,
    /// Where tokens and ensure environments are kept (in memory, or why on disk).
    tokens: token_root::TokenRoot,
    /// One provision or removal at a time per sandbox.
    locks: Mutex<HashMap<SandboxId, Arc<tokio::sync::Mutex<()>>>>,
    /// One host uid allocation at a time in this process (the host's lock is taken too:
    /// [`BwrapDriver::allocating`]).
    allocation: Mutex<()>,
    /// Sandbox starts prepared ahead ([`BwrapConfig::warm_starts`]).
    warm: Mutex<Vec<Warm>>,
    /// Ephemeral sandboxes started ahead ([`BwrapConfig::started_ahead`]).
    ahead: Mutex<ahead::AheadPool>,
    /// This driver, for the background work that starts sandboxes ahead.
    me: std::sync::Weak<BwrapDriver>,
    /// Provisions starting a sandbox themselves right now.
    cold_starts: std::sync::atomic::AtomicUsize,
    /// Egress proxy listeners opened as their sandboxes started, until served.
    proxies: listener::Parked,
    /// How brokered upstreams are verified.
    upstream_tls: Arc<rustls::ClientConfig>,
}

/// Where a sandbox's processes start: its workspace and the host uid it runs as.
#[derive(Debug, Clone, Copy)]
struct Placement<'a> {
    workspace: &'a Path,
    host_id: u32,
}

/// A sandbox start prepared ahead: bubblewrap forked into a cgroup of its own (named
/// after the slot until a provision renames it), its listening socket bound in the slot's
/// directory, its binds pointing at the slot's `ws` and `run` symlinks; it waits for the
/// host uid on `release`.
#[derive(Debug)]
struct Warm {
    slot: String,
    /// Its socket (in the data dir).
    dir: PathBuf,
    /// Its log (in memory: [`spawn::SupervisorLog`]).
    log: spawn::SupervisorLog,
    /// Its binds' links (in the sandbox root).
    binds: PathBuf,
    release: std::fs::File,
    child: tokio::sync::oneshot::Receiver<std::io::Result<spawn::Started>>,
}

impl Drop for BwrapDriver {
    fn drop(&mut self) {
        // Sandboxes started ahead run without a server holding them: they end here.
        self.discard_ahead_now(self.take_all_ahead());
        // Closing the release pipes ends the waiting processes; then their cgroups go.
        let warm: Vec<Warm> =
            std::mem::take(&mut *self.warm.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let slots: Vec<(String, PathBuf, PathBuf)> =
            warm.into_iter().map(|w| (w.slot, w.dir, w.binds)).collect();
        for (slot, dir, binds) in slots {
            for _ in 0..50 {
                if self.cgroups.remove_empty(&slot) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = std::fs::remove_dir_all(dir);
            let _ = std::fs::remove_dir_all(binds);
        }
    }
}

/// Binds the supervisor's listening socket `sock` in `dir` (mode 0600, a leftover of an
/// earlier start replaced), through a descriptor of `dir`.
///
/// The address `bind(2)` gets is `/proc/self/fd/<n>/sock`, `n` an `O_PATH` descriptor of
/// `dir`: at most 30 bytes, whatever the data dir's length. A unix socket's address holds
/// at most 107 bytes, and a data dir may be anywhere (a project 150 characters deep), so
/// the socket's own path would not do. The server connects the same way round (the
/// client opens the socket file without following a link and connects through
/// `/proc/self/fd/<n>` of it), so no socket path of a sandbox depends on the data dir's
/// length. Chosen over a short runtime directory (`/run/sandlane/…`): the socket stays
/// in the sandbox's own root-only state directory, renamed and removed with it, and found
/// there by a restarted server.
fn bind_socket(dir: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use rustix::fs::{AtFlags, Mode, OFlags};
    use std::os::fd::AsRawFd;
    let dir = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())?;
    match rustix::fs::unlinkat(&dir, "sock", AtFlags::empty()) {
        Ok(()) | Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(e.into()),
    }
    let listener = std::os::unix::net::UnixListener::bind(format!("/proc/self/fd/{}/sock", dir.as_raw_fd()))?;
    rustix::fs::chmodat(&dir, "sock", Mode::from_raw_mode(0o600), AtFlags::empty())?;
    Ok(listener)
}

/// Whether users other than the owner reach `path` (every directory above it searchable)
/// and may run it. A path that cannot be resolved is said reachable: its absence is
/// reported on its own.
fn reachable_by_others(path: &Path) -> bool {
    let Ok(canonical) = std::fs::canonicalize(path) else { return true };
    workspace::unsearchable_ancestor(&canonical).is_none()
        && std::fs::metadata(&canonical).is_ok_and(|m| m.permissions().mode() & 0o001 != 0)
}

/// Puts the supervisor's program `program` into `<sandbox_root>/bin/` (searchable, not
/// listable), where the sandboxes' uids reach it, and returns that path. A hard link
/// where the program is on the same filesystem and runnable by others but writable by
/// its owner alone (a clone's `target/release/sandlane` under a 0700 home: no copy of a
/// large binary at every start); otherwise a copy, root's, 0711 (runnable, not readable).
/// Named after the program's file (device, inode, size, modification time), so a
/// restarted server of the same build finds it, and a new build gets a new one; those of
/// other builds are removed (a running sandbox keeps the one it bound).
///
/// # Errors
/// A message when the program cannot be read, linked or copied.
fn copy_supervisor(program: &Path, sandbox_root: &Path) -> Result<PathBuf, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(program).map_err(|e| format!("cannot read {}: {e}", program.display()))?;
    let stamp =
        format!("{}:{}:{}:{}.{}", meta.dev(), meta.ino(), meta.size(), meta.mtime(), meta.mtime_nsec());
    let digest = Sha256::digest(stamp.as_bytes());
    let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let dir = sandbox_root.join("bin");
    workspace::mkdir_all(&dir, 0o711)?;
    workspace::set_mode(&dir, 0o711)?;
    let name = format!("supervisor-{tag}");
    let copy = dir.join(&name);
    let runnable = |m: &std::fs::Metadata| m.is_file() && m.mode() & 0o001 != 0 && m.mode() & 0o022 == 0;
    let done = std::fs::symlink_metadata(&copy).is_ok_and(|m| runnable(&m) && m.len() == meta.size());
    if !done {
        let tmp = dir.join(format!(".{name}.{}.new", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let linked = runnable(&meta) && std::fs::hard_link(program, &tmp).is_ok();
        let placed = if linked {
            Ok(())
        } else {
            std::fs::copy(program, &tmp)
                .and_then(|_| std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o711)))
        };
        if let Err(e) = placed.and_then(|()| std::fs::rename(&tmp, &copy)) {
            let _ = std::fs::remove_file(&tmp);
            return Err(format!(
                "the sandboxes' uids cannot reach the supervisor program {}, and it cannot be copied to {}: {e}",
                program.display(),
                copy.display()
            ));
        }
    }
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let other = entry.file_name();
            if other.to_str().is_some_and(|n| n.starts_with("supervisor-") && n != name) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
    Ok(copy)
}

/// Logs what a reap at start found.
fn log_reaped(reaped: &Reaped) {
    for s in &reaped.uids {
        tracing::info!(
            uid = s.uid,
            workspace = %s.identity,
            data_dir = %s.data_dir.display(),
            reason = %s.why,
            processes = s.processes,
            "ended a sandbox nobody owns and released its host uid"
        );
    }
    for r in &reaped.roots {
        tracing::info!(root = %r.root.display(), data_dir = %r.data_dir.display(), "removed the sandbox root of a data dir that is gone");
    }
    for f in &reaped.failures {
        tracing::warn!(problem = %f, "a sandbox nobody owns could not be ended");
    }
}

/// Ends, on this whole host, the sandboxes whose data dir or record is gone: every
/// process of a host uid in `config`'s range whose claim is stale (its data dir, or its
/// workspace, is gone) is ended and the claim removed; the default sandbox root of a data
/// dir that is gone is removed. With `dry_run`, only says what it would do. A root driver
/// does this at its start; `sandlane host reap` does it on demand. Needs root (the claims
/// are root's, and only root may become the uids to end their processes).
///
/// # Errors
/// [`DriverError::Unavailable`] when not root; [`DriverError::Failed`] when the host
/// directory cannot be read or locked.
pub fn reap_host(config: &BwrapConfig, dry_run: bool) -> Result<Reaped, DriverError> {
    if effective_ids().0 != 0 {
        return Err(DriverError::Unavailable(Cause::msg(
            "only root runs sandboxes as host uids of their own, and only root may end them",
        )));
    }
    let ids = config.host_ids;
    if ids.base == 0 || ids.span == 0 || ids.base.checked_add(ids.span).is_none() {
        return Err(failed("host_ids must start above uid 0, span at least one id and end below 2^32"));
    }
    let cgroups = CgroupMode::detect(config.use_cgroups, &config.cgroup_root, &config.cgroup_parent);
    host::reap(&host::HostDir::new(&config.host_dir), ids, &cgroups, &config.cgroup_parent, dry_run)
        .map_err(failed)
}

fn failed(message: impl Into<String>) -> DriverError {
    DriverError::Failed(Cause::msg(message))
}

/// `cannot {what}: error`, the error kept whole as the source.
fn cannot(what: &str, error: impl std::error::Error + Send + Sync + 'static) -> DriverError {
    failed_by(format!("cannot {what}"), error)
}

/// A step that failed with `error`: `what: error`, the error kept whole as the source.
fn failed_by(what: impl Into<String>, error: impl std::error::Error + Send + Sync + 'static) -> DriverError {
    DriverError::Failed(Cause::context(what, error))
}

/// The protections this host gives the sandboxes of a driver with `cgroups`.
fn detect_protections(cgroups: &CgroupMode, seccomp_enabled: bool) -> Vec<Protection> {
    let mut found = Vec::new();
    let userns = std::fs::read_to_string("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .is_some_and(|n| n > 0);
    if userns {
        found.push(Protection::UserNamespaces);
    }
    let ctrls = cgroups.controllers();
    for (name, p) in [
        ("memory", Protection::CgroupMemory),
        ("pids", Protection::CgroupPids),
        ("cpu", Protection::CgroupCpu),
    ] {
        if ctrls.iter().any(|c| c == name) {
            found.push(p);
        }
    }
    if seccomp_enabled && supervisor::seccomp::available() {
        found.push(Protection::Seccomp);
    }
    found
}

impl BwrapDriver {
    /// A driver over `config`: creates the data dir layout and finds out which cgroup
    /// controllers and protections this host gives. A missing bubblewrap or supervisor
    /// program is not an error here: [`SandboxDriver::health`] reports it and
    /// [`SandboxDriver::provision`] fails.
    ///
    /// # Errors
    /// [`DriverError::Failed`] when the data dir cannot be prepared.
    pub fn new(mut config: BwrapConfig) -> Result<Arc<Self>, DriverError> {
        let (euid, egid) = effective_ids();
        let ids = if euid == 0 {
            let ids = config.host_ids;
            if ids.base == 0 || ids.span == 0 || ids.base.checked_add(ids.span).is_none() {
                return Err(failed(
                    "host_ids must start above uid 0, span at least one id and end below 2^32",
                ));
            }
            IdMode::PerWorkspace(config.host_ids)
        } else {
            IdMode::Own { uid: euid, gid: egid }
        };
        let searchable = matches!(ids, IdMode::PerWorkspace(_));
        // The data dir first, by its canonical path: the default sandbox root and the host
        // uid claims name it so.
        workspace::mkdir_all(&config.data_dir, 0o700).map_err(failed)?;
        if let Ok(canonical) = std::fs::canonicalize(&config.data_dir) {
            config.data_dir = canonical;
        }
        let default_root = config.sandbox_root.is_none();
        let sandbox_root = config.resolved_sandbox_root();
        config.sandbox_root = Some(sandbox_root.clone());
        let host = host::HostDir::new(&config.host_dir);
        if searchable {
            host.prepare().map_err(|e| {
                failed(format!(
                    "cannot prepare the host directory {} (set bwrap.host_dir): {e}",
                    host.path().display()
                ))
            })?;
            if default_root && sandbox_root.starts_with(host.path()) {
                let _lock = host.lock().map_err(failed)?;
                host.register_root(&config.data_dir).map_err(failed)?;
            }
        }
        let layout = Layout::new(config.data_dir.clone(), sandbox_root.clone(), config.host_dir.clone());
        layout.prepare(searchable).map_err(failed)?;
        // The token root is as searchable as the sandbox root (see `workspace::Layout::prepare`).
        let tokens = token_root::TokenRoot::choose(&sandbox_root, if searchable { 0o711 } else { 0o700 });
        if let Some(why) = &tokens.why_disk {
            tracing::warn!(reason = %why, "sandbox tokens are kept on disk, not in memory");
        }
        let layout = layout.with_token_root(tokens.path.clone());
        layout.prepare_tokens().map_err(failed)?;
        let mut setup_problem = match ids {
            IdMode::PerWorkspace(_) => workspace::unsearchable_ancestor(&sandbox_root).map(|dir| {
                format!(
                    "{} is not searchable by other users, so the sandboxes' unprivileged uids \
                     cannot reach the sandbox root {}; put it under searchable directories or \
                     `chmod o+x` them (or leave bwrap.sandbox_root unset)",
                    dir.display(),
                    sandbox_root.display()
                )
            }),
            IdMode::Own { .. } => None,
        };
        if setup_problem.is_none() && !config.supervisor.is_file() {
            setup_problem = Some(format!(
                "the supervisor program {} does not exist: build it with `cargo build --release -p \
                 supervisor` (it is looked for beside the running executable) or name it with \
                 supervisor_program",
                config.supervisor.display()
            ));
        }
        if setup_problem.is_none() && searchable && !reachable_by_others(&config.supervisor) {
            match copy_supervisor(&config.supervisor, &sandbox_root) {
                Ok(copy) => {
                    tracing::info!(
                        program = %config.supervisor.display(),
                        copy = %copy.display(),
                        "the sandboxes' uids cannot reach the supervisor program; they run a copy"
                    );
                    config.supervisor = copy;
                }
                Err(e) => setup_problem = Some(e),
            }
        }
        let cgroups = CgroupMode::detect(config.use_cgroups, &config.cgroup_root, &config.cgroup_parent);
        config.limits = config.limits.bounded(cgroups.controllers().iter().any(|c| c == "memory"));
        let available = detect_protections(&cgroups, config.seccomp);
        let required = config.required_protections.clone().unwrap_or_else(|| available.clone());
        let binds = resolve_binds(&config.ro_binds);
        let upstream_tls = crate::egress::upstream_tls(config.upstream_ca_file.as_deref())
            .map_err(|e| failed(format!("egress.upstream_ca_file: {e}")))?;
        let driver = Arc::new_cyclic(|me| Self {
            config,
            layout,
            binds,
            cgroups,
            ids,
            available,
            required,
            setup_problem,
            tokens,
            locks: Mutex::new(HashMap::new()),
            allocation: Mutex::new(()),
            warm: Mutex::new(Vec::new()),
            ahead: Mutex::new(ahead::AheadPool::default()),
            me: me.clone(),
            cold_starts: std::sync::atomic::AtomicUsize::new(0),
            proxies: listener::Parked::default(),
            upstream_tls,
        });
        if searchable {
            driver.adopt_claims_and_reap();
        }
        driver.thaw_all();
        driver.remove_stale_warm();
        driver.discard_ahead_now(driver.stale_ahead());
        Ok(driver)
    }

    /// At start: thaws every frozen sandbox of the data dir and its workspace's filesystem
    /// (a server that stopped while it took a snapshot left them frozen; the filesystem is
    /// frozen only while its sandbox is, so a sandbox that is not costs one read).
    fn thaw_all(&self) {
        for id in self.layout.list().unwrap_or_default() {
            if !self.cgroups.is_frozen(id.as_str()) {
                continue;
            }
            if let Ok(Some(meta)) = self.layout.read_meta(&id)
                && meta.workspace_image.is_some()
                && let Some(mounted) = self.mounted_workspace(&id, &meta)
            {
                crate::snapshot_files::thaw_fs(&mounted);
            }
            let _ = self.cgroups.thaw(id.as_str());
        }
    }

    /// At start (root): takes over the host uid claims an earlier version kept in the
    /// data dir, then ends the sandboxes on this host whose data dir or record is gone.
    fn adopt_claims_and_reap(&self) {
        match self.allocating() {
            Ok(_held) => {
                for problem in self.layout.adopt_data_dir_claims() {
                    tracing::warn!(problem = %problem, "a host uid claim of this data dir could not be moved to the host's");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot take the host's uid lock"),
        }
        let IdMode::PerWorkspace(ids) = self.ids else { return };
        match host::reap(self.layout.host(), ids, &self.cgroups, &self.config.cgroup_parent, false) {
            Ok(reaped) => log_reaped(&reaped),
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for sandboxes whose data dir or record is gone")
            }
        }
    }

    /// Removes the prepared starts a previous server left (their processes ended with it).
    fn remove_stale_warm(&self) {
        for dir in [self.layout.warm_dir(), self.layout.warm_binds_dir()] {
            let Ok(entries) = std::fs::read_dir(dir) else { continue };
            for entry in entries.flatten() {
                if let Some(slot) = entry.file_name().to_str() {
                    self.cgroups.remove_empty(slot);
                }
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    /// Prepares sandbox starts until [`BwrapConfig::warm_starts`] wait.
    fn refill(&self) {
        let full = || self.warm.lock().map(|w| w.len()).unwrap_or(usize::MAX) >= self.config.warm_starts;
        if full() || !self.cgroups.can_rename() || self.program().is_err() {
            return;
        }
        loop {
            if full() {
                return;
            }
            match self.prepare_warm() {
                Ok(warm) => {
                    if let Ok(mut pool) = self.warm.lock() {
                        pool.push(warm);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot prepare a sandbox start ahead");
                    return;
                }
            }
        }
    }

    #[allow(unsafe_code)]
    fn prepare_warm(&self) -> Result<Warm, DriverError> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let program = self.program()?;
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let slot = format!("warm-{}-{n}", std::process::id());
        let dir = self.layout.warm_dir().join(&slot);
        workspace::mkdir_all(&dir, 0o700).map_err(failed)?;
        let binds = self.layout.warm_binds_dir().join(&slot);
        let binds_mode = if matches!(self.ids, IdMode::PerWorkspace(_)) { 0o711 } else { 0o700 };
        workspace::mkdir_all(&binds, binds_mode).map_err(failed)?;
        let listener = bind_socket(&dir).map_err(|e| cannot("bind a socket", e))?;
        let log = spawn::SupervisorLog::new().map_err(|e| cannot("make a log", e))?;
        let cgroup =
            self.cgroups.create(&slot, &self.config.limits).map_err(|e| cannot("create a cgroup", e))?;
        let seccomp = self.available.contains(&Protection::Seccomp) && self.config.seccomp;
        let (ws, run) = (binds.join("ws"), binds.join("run"));
        let args = supervisor_args(
            &self.config,
            &self.binds,
            SandboxSpec { workspace: &ws, run_dir: &run },
            seccomp,
            !self.proxy_in_namespace(),
        );
        let mut fds = [0; 2];
        // SAFETY: pipe2 writes two descriptors into `fds`, which this function then owns.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(cannot("make a pipe", std::io::Error::last_os_error()));
        }
        // SAFETY: both descriptors were just created and are owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let launch = spawn::Launch {
            program: &program,
            args,
            listener: Some(OwnedFd::from(listener)),
            log: log.writer().map_err(|e| cannot("open the log", e))?,
            rlimits: limits::sandbox_rlimits(&self.config.limits).to_vec(),
            drop_to: spawn::DropTo::Later(
                read,
                self.cgroups.parent_procs().map_err(|e| cannot("open cgroups", e))?,
            ),
            cgroup,
            workspace: Some(spawn::WorkspaceMount { target: c_path(&ws)?, device: None }),
        };
        // The spawn returns when the child execs, i.e. once a provision releases it.
        let owned = OwnedLaunch::from(launch);
        let handle = tokio::runtime::Handle::current();
        let (tx, child) = tokio::sync::oneshot::channel();
        // A thread of its own (not the runtime's blocking pool) waits in the spawn.
        std::thread::Builder::new()
            .name("sandlane-warm".to_owned())
            .spawn(move || {
                let _runtime = handle.enter();
                let _ = tx.send(owned.spawn());
            })
            .map_err(|e| cannot("start a thread", e))?;
        Ok(Warm { slot, dir, log, binds, release: std::fs::File::from(write), child })
    }

    fn take_warm(&self) -> Option<Warm> {
        self.warm.lock().ok().and_then(|mut w| w.pop())
    }

    /// How limits are enforced: `rlimits+cgroup-v1(memory,pids,cpu,freezer)`, `rlimits (…)`.
    pub fn limits_mode(&self) -> String {
        self.cgroups.to_string()
    }

    /// The protections this host gives (found at construction).
    pub fn protections(&self) -> &[Protection] {
        &self.available
    }

    /// What a one-off bubblewrap in `sandbox`'s isolation would run for `request`: the
    /// resolved program, the full argument vector and the host id it drops to (rlimits
    /// and cgroups are not in the arguments). For benchmarks: the cost of a sandbox per
    /// command, which resident sandboxes replace.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for an unknown sandbox; [`DriverError::Unavailable`].
    pub fn command_line(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
    ) -> Result<CommandLine, DriverError> {
        let program = self.program()?;
        let meta = self.meta(sandbox)?;
        let run_dir = self.layout.run_dir(sandbox);
        let env = meta.environment.vars();
        let args = one_off_args(
            &self.config,
            &self.binds,
            SandboxSpec { workspace: &meta.workspace, run_dir: &run_dir },
            &env,
            request.argv(),
        );
        Ok(CommandLine { program, args, host_id: self.drop_to_id(meta.host_id) })
    }

    /// The host pids of the sandbox's processes as its cgroup lists them (`None` without
    /// cgroups). For tests and benchmarks.
    pub fn cgroup_pids(&self, sandbox: &SandboxId) -> Option<Vec<i32>> {
        self.cgroups.sandbox_dirs(sandbox.as_str()).first().map(|d| limits::pids_in(d))
    }

    fn program(&self) -> Result<PathBuf, DriverError> {
        if let Some(problem) = &self.setup_problem {
            return Err(DriverError::Unavailable(Cause::msg(problem.clone())));
        }
        resolve_program(&self.config.program).map_err(|why| DriverError::Unavailable(Cause::msg(why)))
    }

    fn meta(&self, sandbox: &SandboxId) -> Result<SandboxMeta, DriverError> {
        self.layout.read_meta(sandbox).map_err(failed)?.ok_or_else(|| DriverError::NotFound(sandbox.clone()))
    }

    /// The record of a sandbox that runs (not suspended).
    fn running_meta(&self, sandbox: &SandboxId) -> Result<SandboxMeta, DriverError> {
        let meta = self.meta(sandbox)?;
        if meta.suspended {
            return Err(failed(format!(
                "sandbox {sandbox} is suspended; provisioning it with a newer epoch resumes it"
            )));
        }
        Ok(meta)
    }

    fn lock(&self, sandbox: &SandboxId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        locks.retain(|_, l| Arc::strong_count(l) > 1);
        locks.entry(sandbox.clone()).or_default().clone()
    }

    fn drop_to_id(&self, host_id: u32) -> Option<u32> {
        match self.ids {
            IdMode::PerWorkspace(_) => Some(host_id),
            IdMode::Own { .. } => None,
        }
    }

    fn missing_protections(&self) -> Vec<Protection> {
        self.required.iter().copied().filter(|p| !self.available.contains(p)).collect()
    }

    /// Creates the workspace at `workspace` (named `identity`, see
    /// [`workspace::workspace_identity`]) and claims its host uid: the uid and whether the
    /// workspace was created.
    fn claim_workspace(&self, workspace: &Path, identity: &str) -> Result<(u32, bool), DriverError> {
        let parent_mode = if matches!(self.ids, IdMode::PerWorkspace(_)) { 0o711 } else { 0o700 };
        match self.ids {
            IdMode::Own { uid, .. } => {
                let (created, _) =
                    workspace::ensure_workspace(workspace, parent_mode, None).map_err(failed)?;
                Ok((uid, created))
            }
            IdMode::PerWorkspace(ids) => {
                let _held = self.allocating()?;
                let end = |uid| host::end_uid(uid, &self.cgroups, &self.config.cgroup_parent);
                workspace::allocate_host_id(&self.layout, ids, identity, workspace, parent_mode, &end)
                    .map_err(failed)
            }
        }
    }

    /// The allocation lock: this process's, then (as root) the host's (`flock`, shared
    /// with every server on the host), for a claim, release or move of a host uid.
    ///
    /// # Errors
    /// [`DriverError::Failed`] when the host's lock cannot be taken.
    fn allocating(&self) -> Result<(std::sync::MutexGuard<'_, ()>, Option<host::HostLock>), DriverError> {
        let one = self.allocation.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let host = match self.ids {
            IdMode::PerWorkspace(_) => Some(self.layout.host().lock().map_err(failed)?),
            IdMode::Own { .. } => None,
        };
        Ok((one, host))
    }

    /// Gives host `uid` back if the workspace `identity` holds it (root only).
    fn release_host_id(&self, uid: u32, identity: &str) {
        if !matches!(self.ids, IdMode::PerWorkspace(_)) {
            return;
        }
        match self.allocating() {
            Ok(_held) => self.layout.release_host_id(uid, identity),
            Err(e) => {
                tracing::warn!(uid, error = %e, "cannot give a host uid back; it is released once found stale")
            }
        }
    }

    /// Creates the sandbox's token directory: readable by its uid only (`owner`), and not
    /// writable from inside.
    fn make_run_dir(&self, id: &SandboxId, owner: Option<u32>) -> Result<(), DriverError> {
        let run = self.layout.run_dir(id);
        workspace::mkdir_all(&run, 0o700).map_err(failed)?;
        if let Some(uid) = owner {
            std::os::unix::fs::chown(&run, Some(uid), Some(uid))
                .map_err(|e| failed_by(format!("cannot chown {}", run.display()), e))?;
        }
        workspace::set_mode(&run, 0o500).map_err(failed)
    }

    /// A new CA for sandbox `id` (at every start): its key beside the sandbox's record in
    /// the private data dir, its certificate and bundle in the token directory.
    pub(super) fn new_ca(&self, id: &SandboxId) -> Result<(), DriverError> {
        let ca = crate::egress::ca::SandboxCa::generate(id).map_err(|e| failed(e.to_string()))?;
        // The certificates belong to whoever owns the token directory: the sandbox's uid.
        let run = self.layout.run_dir(id);
        let owner = std::fs::metadata(&run)
            .map(|m| (std::os::unix::fs::MetadataExt::uid(&m), std::os::unix::fs::MetadataExt::gid(&m)))
            .map_err(|e| failed_by(format!("cannot read {}", run.display()), e))?;
        ca.write(&self.layout.sandbox_dir(id), &run, Some(owner)).map_err(|e| failed(e.to_string()))
    }

    /// The workspace, token directory, host uid and record of a sandbox (everything but
    /// its processes). Returns the record and whether the workspace was created.
    fn prepare(&self, spec: &ProvisionSpec) -> Result<(SandboxMeta, bool), DriverError> {
        let id = spec.sandbox_id();
        let workspace = self.layout.workspace(id, &spec.key, spec.durability).map_err(failed)?;
        // The state directory first (private): it is what makes an ephemeral workspace's
        // uid claim live.
        let dir = self.layout.sandbox_dir(id);
        workspace::mkdir_all(&dir, 0o700).map_err(failed)?;
        let identity = workspace::workspace_identity(id, &spec.key, spec.durability);
        let (host_id, created) = self.claim_workspace(&workspace, &identity)?;
        let owner = self.drop_to_id(host_id);
        let control = self.layout.control_dir(id);
        workspace::mkdir_all(&control, 0o700).map_err(failed)?;
        self.make_run_dir(id, owner)?;
        self.layout.write_token(id, spec.credential.expose().as_bytes(), owner).map_err(failed)?;
        self.new_ca(id)?;
        let meta = SandboxMeta::of(spec, workspace, host_id, None);
        self.layout.write_meta(id, &meta).map_err(failed)?;
        Ok((meta, created))
    }

    /// Hands a prepared start to sandbox `id`: its cgroup and socket take the sandbox's
    /// names, its binds point at the sandbox's workspace and token directory,
    /// and it is told the host uid. `Ok(None)` when the prepared process is gone.
    async fn start_warm(
        &self,
        warm: Warm,
        id: &SandboxId,
        place: Placement<'_>,
        device: Option<spawn::Device>,
    ) -> Result<Option<spawn::Started>, DriverError> {
        use std::io::Write;
        self.cgroups.rename(&warm.slot, id.as_str()).map_err(|e| cannot("rename the prepared cgroup", e))?;
        let control = self.layout.control_dir(id);
        std::fs::rename(warm.dir.join("sock"), control.join("sock"))
            .map_err(|e| cannot("move the socket", e))?;
        std::os::unix::fs::symlink(place.workspace, warm.binds.join("ws")).map_err(|e| cannot("link", e))?;
        std::os::unix::fs::symlink(self.layout.run_dir(id), warm.binds.join("run"))
            .map_err(|e| cannot("link", e))?;
        let uid = self.drop_to_id(place.host_id).unwrap_or(spawn::NO_DROP);
        let mut release = warm.release;
        if release.write_all(&spawn::Release { uid, device }.encode()).is_err() {
            return Ok(None);
        }
        drop(release);
        match warm.child.await {
            Ok(Ok(child)) => Ok(Some(child)),
            Ok(Err(e)) => Err(cannot("start bubblewrap", e)),
            Err(e) => Err(cannot("start bubblewrap", e)),
        }
    }

    /// Starts the sandbox's processes and waits for the supervisor's hello; `device` is
    /// the workspace image's loop device, mounted by the start (see
    /// [`spawn::WorkspaceMount`]).
    async fn start(
        &self,
        id: &SandboxId,
        place: Placement<'_>,
        device: Option<spawn::Device>,
    ) -> Result<(), DriverError> {
        let program = self.program()?;
        let socket = self.layout.socket_path(id);
        if let Some(warm) = self.take_warm() {
            let (dir, binds) = (warm.dir.clone(), warm.binds.clone());
            // The log is read if the supervisor does not answer.
            let log = warm.log.try_clone().map_err(|e| failed_by("cannot open the log", e))?;
            let started = self.start_warm(warm, id, place, device).await;
            // The next start is prepared while this one's namespaces are set up and its
            // supervisor starts, not after (it was ≈ 2 ms of every ensure's path).
            self.refill();
            let done = match started {
                Ok(Some(child)) => Some(self.wait_ready(child, &socket, &log).await),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            };
            // bubblewrap has resolved the slot's links by the time the supervisor answers.
            let _ = std::fs::remove_dir_all(dir);
            let _ = std::fs::remove_dir_all(binds);
            if let Some(done) = done {
                return done;
            }
            // The prepared process was gone: start cold.
            self.cgroups.kill_and_remove(id.as_str()).await;
        }
        let listener = bind_socket(&self.layout.control_dir(id))
            .map_err(|e| failed_by(format!("cannot listen on {}", socket.display()), e))?;
        let log = spawn::SupervisorLog::new().map_err(|e| failed_by("cannot make a log", e))?;
        let cgroup = self
            .cgroups
            .create(id.as_str(), &self.config.limits)
            .map_err(|e| failed_by("cannot create the sandbox's cgroup", e))?;
        let seccomp = self.available.contains(&Protection::Seccomp) && self.config.seccomp;
        let run_dir = self.layout.run_dir(id);
        let args = supervisor_args(
            &self.config,
            &self.binds,
            SandboxSpec { workspace: place.workspace, run_dir: &run_dir },
            seccomp,
            !self.proxy_in_namespace(),
        );
        let launch = spawn::Launch {
            program: &program,
            args,
            listener: Some(OwnedFd::from(listener)),
            log: log.writer().map_err(|e| failed_by("cannot open the log", e))?,
            rlimits: limits::sandbox_rlimits(&self.config.limits).to_vec(),
            drop_to: spawn::DropTo::Now(self.drop_to_id(place.host_id)),
            cgroup,
            workspace: match device {
                Some(device) => {
                    Some(spawn::WorkspaceMount { target: c_path(place.workspace)?, device: Some(device) })
                }
                None => None,
            },
        };
        let child = spawn::spawn(launch).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DriverError::Unavailable(Cause::msg(format!(
                    "bubblewrap program `{}` not found; install it with `apt-get install bubblewrap` or set \
                     SANDLANE_BWRAP",
                    program.display()
                )))
            } else {
                failed_by(format!("cannot start bubblewrap `{}`", program.display()), e)
            }
        })?;
        self.wait_ready(child, &socket, &log).await
    }

    /// Waits for the supervisor's hello (or bubblewrap's exit), then reaps bubblewrap in
    /// the background.
    async fn wait_ready(
        &self,
        mut child: spawn::Started,
        socket: &Path,
        log: &spawn::SupervisorLog,
    ) -> Result<(), DriverError> {
        let hello = tokio::select! {
            hello = client::connect(socket, self.config.probe_timeout) => hello,
            status = child.wait() => {
                let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                return Err(failed(format!(
                    "the sandbox exited before its supervisor answered ({status}): {}",
                    log.tail(1, LOG_SHOWN)
                )));
            }
        };
        let bwrap = child.id();
        // The server reaps its bubblewrap when the sandbox ends (the process watch does,
        // holding no descriptor for it meanwhile).
        child.reap_in_background();
        let (_stream, hello) = hello.map_err(|e| {
            failed(format!("the sandbox's supervisor did not answer: {e} {}", log.tail(8, LOG_SHOWN)))
        })?;
        if self.required.contains(&Protection::Seccomp) && !hello.protections.seccomp {
            return Err(DriverError::Unavailable(Cause::msg(
                "the sandbox's supervisor runs without the seccomp filter, which is required",
            )));
        }
        if self.proxy_in_namespace() {
            let control = socket.parent().unwrap_or(socket);
            let proxy = self
                .open_proxy(bwrap, control)
                .await
                .map_err(|e| failed_by("cannot open the egress proxy's socket in the sandbox", e))?;
            self.proxies.park(proxy);
        }
        Ok(())
    }

    /// Whether the server opens each sandbox's egress proxy socket in the sandbox's
    /// network namespace itself (it must hold `CAP_SYS_ADMIN` over it: it runs as root);
    /// otherwise the supervisor listens on the proxy's port and hands its clients over.
    fn proxy_in_namespace(&self) -> bool {
        matches!(self.ids, IdMode::PerWorkspace(_))
    }

    /// Opens the proxy's socket in the namespace of the sandbox whose bubblewrap is
    /// process `bwrap` (just started: its only child is the supervisor, the sandbox's
    /// init), and records which process that init is in `control/init` (pid and start
    /// time), so a restarted server finds it again ([`Host::proxy_listener`]).
    async fn open_proxy(&self, bwrap: Option<u32>, control: &Path) -> std::io::Result<ProxyListener> {
        let bwrap = bwrap.ok_or_else(|| std::io::Error::other("bubblewrap has exited"))?;
        let pid = listener::only_child(bwrap)?;
        let init = listener::Init::open(pid)?;
        let started = listener::start_time(pid)?;
        // In `control/` (root only, like everything there).
        std::fs::write(control.join(INIT_FILE), format!("{pid} {started}\n"))?;
        listener::open_in_namespace(init, domain::egress::PROXY_PORT).await
    }

    /// Ends a sandbox's processes (the supervisor's exit, then the cgroup) and removes
    /// its state; the workspace and its uid go too when ephemeral.
    async fn remove(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let meta = self.layout.read_meta(sandbox).map_err(failed)?;
        self.stop(sandbox).await;
        match &meta {
            Some(m) if m.durability == Durability::Ephemeral => {
                self.release_workspace(m, true).await?;
                workspace::remove_dir_all_quiet(&m.workspace).map_err(failed)?;
            }
            Some(m) => self.release_workspace(m, false).await?,
            None => {
                self.release_orphan_image(sandbox).await;
                workspace::remove_dir_all_quiet(&self.layout.ephemeral_workspace(sandbox)).map_err(failed)?;
            }
        }
        self.layout.remove_sandbox_dir(sandbox).map_err(failed)?;
        if let Some(m) = meta.as_ref().filter(|m| m.durability == Durability::Ephemeral) {
            let identity = format!("ephemeral/{sandbox}");
            self.release_host_id(m.host_id, &identity);
        }
        Ok(())
    }

    /// Ends a sandbox's processes, keeping its files.
    async fn stop(&self, sandbox: &SandboxId) {
        let socket = self.layout.socket_path(sandbox);
        if let Err(e) = client::shutdown(&socket, Duration::from_millis(500)).await
            && !matches!(e, ClientError::Gone(_))
        {
            tracing::debug!(sandbox = %sandbox, error = %e, "the supervisor did not take the shutdown");
        }
        self.cgroups.kill_and_remove(sandbox.as_str()).await;
        let _ = std::fs::remove_file(&socket);
    }

    /// A sandbox whose supervisor is gone: clean up what is left and say it is gone.
    async fn gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        // A supervisor that went because its sandbox was suspended (a connection that
        // raced the suspension) is not a broken sandbox: nothing is removed.
        if self.meta(sandbox).is_ok_and(|m| m.suspended) {
            return failed(format!(
                "sandbox {sandbox} is suspended; provisioning it with a newer epoch resumes it"
            ));
        }
        tracing::warn!(sandbox = %sandbox, error = %why, "the sandbox's supervisor is gone; removing what is left");
        if let Err(e) = self.remove(sandbox).await {
            tracing::warn!(sandbox = %sandbox, error = %e, "could not clean up a broken sandbox");
        }
        DriverError::NotFound(sandbox.clone())
    }

    async fn version(&self, program: &Path) -> String {
        let out =
            tokio::process::Command::new(program).arg("--version").env_clear().kill_on_drop(true).output();
        match tokio::time::timeout(Duration::from_secs(5), out).await {
            Ok(Ok(o)) if o.status.success() => {
                let text = String::from_utf8_lossy(&o.stdout);
                text.trim().replace("bubblewrap", "bwrap")
            }
            _ => "bwrap (version unknown)".to_owned(),
        }
    }

    async fn provision_locked(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        self.program()?;
        let missing = self.missing_protections();
        if !missing.is_empty() {
            let names: Vec<&str> = missing.iter().map(|p| p.as_str()).collect();
            return Err(DriverError::Unavailable(Cause::msg(format!(
                "this host does not give the required sandbox protections: {}",
                names.join(", ")
            ))));
        }
        let id = spec.sandbox_id();
        let existing = self.layout.read_meta(id).map_err(failed)?;
        if let Some(existing) = &existing {
            // A sandbox is its key's; a warm one (provisioned under its org's pool key, then
            // adopted by a claim) may be started again under any key of its org.
            let same_owner = existing.is_for(&spec.key)
                || (domain::policy::is_warm_key(existing.kind, &existing.key)
                    && &existing.org == spec.key.org());
            if !same_owner || existing.durability != spec.durability {
                return Err(failed(format!(
                    "sandbox {id} is already provisioned for {}/{}/{} ({})",
                    existing.org, existing.kind, existing.key, existing.durability
                )));
            }
            if existing.epoch > spec.epoch {
                return Err(failed(format!(
                    "sandbox {id} was provisioned by a newer claim (epoch {} > {}): this attempt is fenced",
                    existing.epoch, spec.epoch
                )));
            }
            if existing.epoch == spec.epoch
                && client::ping(&self.layout.socket_path(id), CONNECT_TIMEOUT).await.is_ok()
            {
                // The same attempt again: the live sandbox stays, with this credential.
                let owner = self.drop_to_id(existing.host_id);
                self.layout.write_token(id, spec.credential.expose().as_bytes(), owner).map_err(failed)?;
                // Its CA stays (made only if it has none: started before sandboxes had one).
                if !self.layout.sandbox_dir(id).join(crate::egress::ca::CA_KEY_FILE).is_file() {
                    self.new_ca(id)?;
                }
                if existing.environment != spec.environment {
                    self.layout.write_environment(id, &spec.environment).map_err(failed)?;
                }
                return Ok(());
            }
            // A newer claim (or a dead tree): what the older attempt started goes.
            self.stop(id).await;
        } else if self.adopt_ahead(spec).await? {
            tracing::debug!(sandbox = %id, "bubblewrap sandbox ready (started ahead)");
            self.start_ahead(spec);
            return Ok(());
        }
        let _starting = ahead::Starting::new(&self.cold_starts);
        let (meta, created) = match self.prepare(spec) {
            Ok(done) => done,
            Err(e) => {
                self.undo(spec, false).await;
                return Err(e);
            }
        };
        // A fork's workspace starts as its snapshot's files (a new workspace only).
        let quota = match self.fork_quota(spec) {
            Ok(quota) => quota,
            Err(e) => {
                self.undo(spec, created).await;
                return Err(e);
            }
        };
        let give_later = if existing.is_none() {
            match self.seed_fork(spec, &meta, quota, self.workspace_owner(&meta)).await {
                Ok(from) => from,
                Err(e) => {
                    self.undo(spec, created).await;
                    return Err(e);
                }
            }
        } else {
            None
        };
        let (meta, image) = match self.prepare_workspace(spec, quota, meta).await {
            Ok(prepared) => prepared,
            Err(e) => {
                self.undo(spec, created).await;
                return Err(e);
            }
        };
        let place = Placement { workspace: &meta.workspace, host_id: meta.host_id };
        let started = self.start(id, place, image.as_ref().map(|(_, device)| *device)).await;
        // The sandbox's mount (if it was made) holds the device from here.
        drop(image);
        let started = match started {
            Ok(()) => match give_later {
                Some(from) => self.give_to_owner(id, &meta, from).await,
                None => Ok(()),
            },
            other => other,
        };
        if let Err(e) = started {
            self.undo(spec, created).await;
            return Err(e);
        }
        tracing::debug!(sandbox = %id, durability = %spec.durability, "bubblewrap sandbox ready");
        self.refill();
        if spec.durability == Durability::Ephemeral {
            self.start_ahead(spec);
        }
        Ok(())
    }

    /// Removes what a failed provision left: the processes, the record, and the workspace
    /// when it is ephemeral or was created by this attempt.
    async fn undo(&self, spec: &ProvisionSpec, created: bool) {
        let id = spec.sandbox_id();
        self.stop(id).await;
        let meta = self.layout.read_meta(id).ok().flatten();
        if let Some(m) = &meta {
            let delete = spec.durability == Durability::Ephemeral || created;
            if let Err(e) = self.release_workspace(m, delete).await {
                tracing::warn!(sandbox = %id, error = %e, "could not release a failed sandbox's workspace");
            }
        }
        if (spec.durability == Durability::Ephemeral || created)
            && let Ok(path) = self.layout.workspace(id, &spec.key, spec.durability)
        {
            let _ = workspace::remove_dir_all_quiet(&path);
        }
        let _ = self.layout.remove_sandbox_dir(id);
        if let Some(m) = meta {
            let identity = workspace::workspace_identity(id, &spec.key, spec.durability);
            if spec.durability == Durability::Ephemeral || created {
                self.release_host_id(m.host_id, &identity);
            }
        }
    }
}

#[async_trait]
impl SandboxDriver for BwrapDriver {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    async fn provision(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let lock = self.lock(spec.sandbox_id());
        let _held = lock.lock().await;
        self.provision_locked(spec).await
    }

    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError> {
        let meta = self.running_meta(sandbox)?;
        // Is the sandbox still there? A cgroup that holds processes says so without waking
        // the supervisor (the sandbox's PID 1: had it died, the kernel would have ended
        // every process of its namespace). This is what an adoption asks of a warm sandbox
        // that never ran a command, so its ensure costs no round trip to the sandbox. Only
        // without that answer (no cgroups, an empty or unreadable one) is the supervisor
        // pinged, its round trip overlapping the two file writes (sent before they start,
        // its answer read after): a token written for a sandbox found gone is removed with
        // the rest of it.
        let running = self.cgroups.holds_processes(sandbox.as_str());
        let socket = self.layout.socket_path(sandbox);
        let alive =
            async { if running { Ok(()) } else { client::ping(&socket, CONNECT_TIMEOUT).await.map(drop) } };
        let write = async {
            self.layout
                .write_token(sandbox, credential.expose().as_bytes(), self.drop_to_id(meta.host_id))
                .map_err(failed)?;
            if &meta.environment != environment {
                self.layout.write_environment(sandbox, environment).map_err(failed)?;
            }
            Ok(())
        };
        let (alive, written) = tokio::join!(alive, write);
        if let Err(e @ ClientError::Gone(_)) = alive {
            return Err(self.gone(sandbox, &e).await);
        }
        written
    }

    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError> {
        let spec =
            self.command(sandbox, request.argv(), request.timeout_ms(), !request.stdin().is_empty()).await?;
        let socket = self.layout.socket_path(sandbox);
        match client::exec(&socket, &spec, request.stdin(), CONNECT_TIMEOUT, EXEC_GRACE).await {
            Ok(out) => Ok(out),
            Err(e @ ClientError::Gone(_)) => Err(self.gone(sandbox, &e).await),
            Err(ClientError::Refused { code, message }) if code == "spawn" => Ok(ExecOutput {
                exit_code: 127,
                stdout: Vec::new(),
                stderr: message.into_bytes(),
                timed_out: false,
                truncated: false,
            }),
            Err(e) => Err(failed_by(format!("cannot run the command in sandbox {sandbox}"), e)),
        }
    }

    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.remove(sandbox).await
    }

    async fn suspend(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        let meta = self.meta(sandbox)?;
        // Recorded first: from now on an exec is refused (not mistaken for a dead sandbox
        // and cleaned up).
        self.layout.write_meta(sandbox, &SandboxMeta { suspended: true, ..meta.clone() }).map_err(failed)?;
        // The supervisor's exit, then the cgroup: every process ends. The workspace, its
        // uid, the token directory and the record stay for the resume (a provision with a
        // newer epoch).
        self.stop(sandbox).await;
        self.release_workspace(&meta, false).await
    }

    async fn workspace_usage(&self, sandbox: &SandboxId) -> Option<u64> {
        self.usage_of(sandbox)
    }

    async fn snapshot(
        &self,
        sandbox: &SandboxId,
        target: &ports::SnapshotRef,
        budget: ports::SnapshotBudget,
    ) -> Result<u64, DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.snapshot_locked(sandbox, target, budget.quota_left).await
    }

    async fn delete_snapshot(&self, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        self.delete_snapshot_files(snapshot).await
    }

    async fn restore(&self, sandbox: &SandboxId, snapshot: &ports::SnapshotRef) -> Result<(), DriverError> {
        let lock = self.lock(sandbox);
        let _held = lock.lock().await;
        self.restore_locked(sandbox, snapshot).await
    }

    async fn stand_down(&self) {
        self.end_ahead().await;
    }

    async fn list(&self) -> Result<Vec<SandboxId>, DriverError> {
        self.layout.list().map_err(failed)
    }

    async fn health(&self) -> DriverHealth {
        match self.program() {
            Err(DriverError::Unavailable(why) | DriverError::Failed(why)) => {
                DriverHealth { usable: false, detail: why.to_string() }
            }
            Err(e) => DriverHealth { usable: false, detail: e.to_string() },
            Ok(program) => {
                let version = self.version(&program).await;
                let ids = match self.ids {
                    IdMode::PerWorkspace(ids) => format!("per-workspace host uid from {}", ids.base),
                    IdMode::Own { uid, .. } => format!("server uid {uid}"),
                };
                let given: Vec<&str> = self.available.iter().map(|p| p.as_str()).collect();
                let missing = self.missing_protections();
                let detail = format!(
                    "{version}; limits: {}; ids: {ids}; protections: {}; {}",
                    self.cgroups,
                    if given.is_empty() { "none".to_owned() } else { given.join(",") },
                    self.tokens.detail()
                );
                if missing.is_empty() {
                    DriverHealth { usable: true, detail }
                } else {
                    let names: Vec<&str> = missing.iter().map(|p| p.as_str()).collect();
                    DriverHealth {
                        usable: false,
                        detail: format!("{detail}; missing required: {}", names.join(",")),
                    }
                }
            }
        }
    }

    async fn exec_stream(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
    ) -> Result<Box<dyn OutputStream>, DriverError> {
        ops::exec_stream(self, sandbox, request).await
    }

    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &ProcessRequest,
        caps: &ProcessCaps,
    ) -> Result<ProcessInfo, DriverError> {
        ops::start_process(self, sandbox, request, caps).await
    }

    async fn list_processes(&self, sandbox: &SandboxId) -> Result<Vec<ProcessInfo>, DriverError> {
        ops::list_processes(self, sandbox).await
    }

    async fn process(&self, sandbox: &SandboxId, pid: u32) -> Result<ProcessInfo, DriverError> {
        ops::process(self, sandbox, pid).await
    }

    async fn process_output(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        follow: bool,
    ) -> Result<Box<dyn OutputStream>, DriverError> {
        ops::process_output(self, sandbox, pid, follow).await
    }

    async fn write_stdin(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        bytes: &[u8],
        close: bool,
    ) -> Result<(), DriverError> {
        ops::write_stdin(self, sandbox, pid, bytes, close).await
    }

    async fn signal_process(&self, sandbox: &SandboxId, pid: u32, signal: Signal) -> Result<(), DriverError> {
        ops::signal_process(self, sandbox, pid, signal).await
    }

    async fn process_input(
        &self,
        sandbox: &SandboxId,
        pid: u32,
    ) -> Result<Box<dyn ports::ProcessInput>, DriverError> {
        ops::process_input(self, sandbox, pid).await
    }

    async fn read_path(&self, sandbox: &SandboxId, path: &SandboxPath) -> Result<ReadOutcome, DriverError> {
        ops::read_path(self, sandbox, path).await
    }

    async fn write_file(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        contents: Box<dyn ByteSource>,
    ) -> Result<u64, DriverError> {
        ops::write_file(self, sandbox, path, contents).await
    }

    async fn delete_path(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        recursive: bool,
    ) -> Result<(), DriverError> {
        ops::delete_path(self, sandbox, path, recursive).await
    }

    async fn archive_out(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
    ) -> Result<Box<dyn ByteStream>, DriverError> {
        ops::archive_out(self, sandbox, path).await
    }

    async fn archive_in(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        archive: Box<dyn ByteSource>,
    ) -> Result<Unpacked, DriverError> {
        ops::archive_in(self, sandbox, path, archive).await
    }

    async fn open_port(
        &self,
        sandbox: &SandboxId,
        port: u16,
    ) -> Result<Box<dyn ports::PortStream>, DriverError> {
        ops::open_port(self, sandbox, port).await
    }

    async fn serve_egress(
        &self,
        sandbox: &SandboxId,
        gate: std::sync::Arc<dyn ports::EgressGate>,
    ) -> Result<(), DriverError> {
        ops::serve_egress(self, sandbox, gate).await
    }
}

#[async_trait]
impl Host for BwrapDriver {
    type Target = PathBuf;

    async fn socket(&self, sandbox: &SandboxId) -> Result<PathBuf, DriverError> {
        // A suspended sandbox has no supervisor: refused, not taken for a dead one.
        self.running_meta(sandbox)?;
        Ok(self.layout.socket_path(sandbox))
    }

    async fn command(
        &self,
        sandbox: &SandboxId,
        argv: &[String],
        timeout_ms: u64,
        stdin: bool,
    ) -> Result<ExecSpec, DriverError> {
        let meta = self.running_meta(sandbox)?;
        Ok(ExecSpec {
            argv: argv.to_vec(),
            env: meta.environment.vars().into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            cwd: WORKSPACE_PATH.to_owned(),
            timeout_ms,
            output_cap: self.config.output_cap_bytes as u64,
            stdin,
            rlimits: limits::command_rlimits(&self.config.limits),
        })
    }

    async fn supervisor_gone(&self, sandbox: &SandboxId, why: &ClientError) -> DriverError {
        self.gone(sandbox, why).await
    }

    async fn proxy_listener(&self, sandbox: &SandboxId) -> Result<Option<ProxyListener>, DriverError> {
        self.running_meta(sandbox)?;
        if !self.proxy_in_namespace() {
            return Ok(None);
        }
        let path = self.layout.control_dir(sandbox).join(INIT_FILE);
        let recorded = match std::fs::read_to_string(&path) {
            Ok(text) => text,
            // Started by an earlier version: its supervisor listens on the port itself.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failed_by(format!("cannot read {}", path.display()), e)),
        };
        let Some((pid, started)) = recorded
            .split_once(' ')
            .and_then(|(pid, started)| Some((pid.parse::<i32>().ok()?, started.trim().parse::<u64>().ok()?)))
        else {
            return Err(failed(format!("{} does not parse", path.display())));
        };
        if let Some(proxy) = self.proxies.take(pid) {
            return Ok(Some(proxy));
        }
        // Not opened by this server (a restart): opened again, if that init still runs
        // (the start time tells a reused pid).
        let init = match listener::Init::open(pid) {
            Ok(init) if listener::start_time(pid).is_ok_and(|t| t == started) => init,
            _ => return Err(DriverError::NotFound(sandbox.clone())),
        };
        match listener::open_in_namespace(init, domain::egress::PROXY_PORT).await {
            Ok(proxy) => Ok(Some(proxy)),
            // Another server on this host holds it (or a process inside took the port
            // while no server did): tried again later.
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => Err(DriverError::Conflict(format!(
                "the egress proxy's port in sandbox {sandbox} is held by another socket: {e}"
            ))),
            Err(e) => {
                Err(failed_by(format!("cannot open the egress proxy's socket in sandbox {sandbox}"), e))
            }
        }
    }

    async fn broker_tls(&self, sandbox: &SandboxId) -> crate::egress::BrokerTls {
        let ca = crate::egress::ca::CaFile::new(sandbox, &self.layout.sandbox_dir(sandbox));
        crate::egress::BrokerTls::new(Some(Arc::new(ca)), self.upstream_tls.clone())
    }

    fn connect_timeout(&self) -> Duration {
        CONNECT_TIMEOUT
    }

    fn grace(&self) -> Duration {
        EXEC_GRACE
    }
}

/// The file in a sandbox's `control/` that names its init: `<host pid> <start time>`.
const INIT_FILE: &str = "init";
