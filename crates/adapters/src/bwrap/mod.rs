//! The bubblewrap sandbox driver: one fresh `bwrap` per command, in its own user, pid,
//! network, ipc, uts and mount namespaces, as an unprivileged uid with no capabilities,
//! over a read-only root with `/workspace` the only writable bind.
//!
//! # Commands
//! `bwrap --unshare-all --unshare-user --uid 1000 --gid 1000 --disable-userns --cap-drop ALL
//! --die-with-parent --new-session --as-pid-1 --clearenv --setenv …` (exactly
//! `DriverEnvironment::vars()`), the read-only system binds, a private `/proc`, `/dev`
//! (then read-only) and `/tmp`, `/workspace` bound read-write, the token file bound
//! read-only at `TOKEN_FILE_PATH`, `/` remounted read-only, `--chdir /workspace`, then
//! `/usr/bin/env -u PWD -- <argv>` (bubblewrap exports `PWD` after its chdir). The
//! command is the pid namespace's init (`--as-pid-1`) so bubblewrap reaps it itself: with
//! bubblewrap's own init in between, that init outlives bubblewrap and, where the host's
//! pid 1 does not reap orphans (containers), stays a zombie that counts against the
//! sandbox uid's process limit. A timeout kills the command (the namespace's init, which
//! takes every process inside with it), then bubblewrap if it lingers.
//!
//! # Ids
//! When the server runs as root, each workspace gets its own unprivileged host uid and
//! gid ([`HostIds`]): the spawned `bwrap` drops to it before `exec` (`setgroups`,
//! `setgid`, `setuid`), then maps it to [`BwrapConfig::inner_id`] in a new user namespace.
//! Bubblewrap is not setuid here, so the sandbox ends with `CapEff` 0 and `NoNewPrivs`
//! set, and a process that escaped the namespaces would still be an unprivileged host
//! user that owns nothing but its own workspace. The workspace (0700) and the token file
//! (0400) are owned by that uid. When the server is not root, sandboxes run as its uid.
//!
//! # Limits
//! Rlimits always ([`Limits`]); where a cgroup controller is writable (v2, or v1
//! `memory`/`pids`), each command also runs in its own cgroup under
//! `<cgroup_root>/<controller>/<cgroup_parent>/<sandbox_id>/`, which caps its memory and
//! processes and is killed as a whole at timeout and deprovision. [`DriverHealth`]
//! says which.
//!
//! # State
//! Everything a command needs is read from `<data_dir>/sandboxes/<sandbox_id>/`, so the
//! driver keeps working across a server restart.

mod command;
mod config;
mod exec;
mod limits;
mod workspace;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use domain::{Durability, ExecOutput, ExecRequest, SandboxId, SandboxToken};
use ports::driver::{DriverError, DriverHealth, ProvisionSpec, SandboxDriver};

pub use config::{BwrapConfig, DEFAULT_RO_BINDS, HostIds, Limits};

use command::{CommandSpec, SystemBind, bwrap_args, resolve_binds, resolve_program};
use exec::{Launch, run};
use limits::{CgroupMode, kill_tree, kill_uid, sigkill};
use workspace::{IdMode, Layout, SandboxMeta, effective_ids, ensure_workspace, owner_of};

/// One command as the driver runs it (see [`BwrapDriver::command_line`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandLine {
    /// The bubblewrap program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The host uid and gid the process runs as (`None`: the server's own).
    pub host_id: Option<u32>,
}

/// The bubblewrap driver. Build it once with [`BwrapDriver::new`] and share it.
#[derive(Debug)]
pub struct BwrapDriver {
    config: BwrapConfig,
    layout: Layout,
    binds: Vec<SystemBind>,
    cgroups: CgroupMode,
    ids: IdMode,
    /// Why the driver cannot work whatever the program (found at construction).
    setup_problem: Option<String>,
    /// Pids of the running `bwrap` processes per sandbox, for deprovision.
    running: Mutex<HashMap<SandboxId, HashSet<u32>>>,
    exec_counter: AtomicU64,
}

fn failed(message: impl Into<String>) -> DriverError {
    DriverError::Failed(message.into())
}

impl BwrapDriver {
    /// A driver over `config`: creates the data dir layout and finds out which cgroup
    /// controllers are writable. A missing bubblewrap program is not an error here:
    /// [`SandboxDriver::health`] reports it and [`SandboxDriver::provision`] fails.
    ///
    /// # Errors
    /// [`DriverError::Failed`] when the data dir cannot be prepared.
    pub fn new(config: BwrapConfig) -> Result<Self, DriverError> {
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
        let layout = Layout::new(config.data_dir.clone());
        layout.prepare(matches!(ids, IdMode::PerWorkspace(_))).map_err(failed)?;
        let setup_problem = match ids {
            IdMode::PerWorkspace(_) => workspace::unsearchable_ancestor(&config.data_dir).map(|dir| {
                format!(
                    "{} is not searchable by other users, so the sandboxes' unprivileged uids \
                     cannot reach the data dir {}; put the data dir under searchable \
                     directories or `chmod o+x` them",
                    dir.display(),
                    config.data_dir.display()
                )
            }),
            IdMode::Own { .. } => None,
        };
        let cgroups = CgroupMode::detect(config.use_cgroups, &config.cgroup_root, &config.cgroup_parent);
        let binds = resolve_binds(&config.ro_binds);
        Ok(Self {
            config,
            layout,
            binds,
            cgroups,
            ids,
            setup_problem,
            running: Mutex::new(HashMap::new()),
            exec_counter: AtomicU64::new(0),
        })
    }

    /// How limits are enforced: `rlimits+cgroup-v1(memory,pids)`, `rlimits (…)`, ….
    pub fn limits_mode(&self) -> String {
        self.cgroups.to_string()
    }

    /// What `exec` would run for `request` in `sandbox`: the resolved program, the full
    /// argument vector and the host id it drops to (the rlimits and the cgroup are
    /// applied to the process, not in the arguments). For benchmarks and debugging.
    ///
    /// # Errors
    /// As [`SandboxDriver::exec`] before it starts the command.
    pub fn command_line(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
    ) -> Result<CommandLine, DriverError> {
        let program = self.program()?;
        let meta = self.meta(sandbox)?;
        Ok(CommandLine {
            program,
            args: self.args_for(sandbox, &meta, request.argv()),
            host_id: self.drop_to(&meta),
        })
    }

    fn program(&self) -> Result<PathBuf, DriverError> {
        if let Some(problem) = &self.setup_problem {
            return Err(DriverError::Unavailable(problem.clone()));
        }
        resolve_program(&self.config.program).map_err(DriverError::Unavailable)
    }

    fn meta(&self, sandbox: &SandboxId) -> Result<SandboxMeta, DriverError> {
        self.layout.read_meta(sandbox).map_err(failed)?.ok_or_else(|| DriverError::NotFound(sandbox.clone()))
    }

    fn args_for(&self, sandbox: &SandboxId, meta: &SandboxMeta, argv: &[String]) -> Vec<OsString> {
        let token = self.layout.token_path(sandbox);
        let env = meta.environment.vars();
        bwrap_args(
            &self.config,
            &self.binds,
            CommandSpec { workspace: &meta.workspace, token: &token, env: &env, argv },
        )
    }

    fn drop_to(&self, meta: &SandboxMeta) -> Option<u32> {
        self.drop_to_id(meta.host_id)
    }

    fn track(&self, sandbox: &SandboxId, pid: Option<u32>, forget: Option<u32>) {
        let Ok(mut running) = self.running.lock() else {
            return;
        };
        if let Some(pid) = pid {
            running.entry(sandbox.clone()).or_default().insert(pid);
        }
        if let Some(pid) = forget
            && let Some(set) = running.get_mut(sandbox)
        {
            set.remove(&pid);
            if set.is_empty() {
                running.remove(sandbox);
            }
        }
    }

    async fn run_in(
        &self,
        sandbox: &SandboxId,
        meta: &SandboxMeta,
        argv: &[String],
        stdin: &[u8],
        timeout: Duration,
    ) -> Result<ExecOutput, DriverError> {
        let program = self.program()?;
        let n = self.exec_counter.fetch_add(1, Ordering::Relaxed);
        let exec_name = format!("x{}-{n}", std::process::id());
        let cgroup = self
            .cgroups
            .create_exec(sandbox.as_str(), &exec_name, &self.config.limits)
            .map_err(|e| failed(format!("cannot create the command's cgroup: {e}")))?;
        let launch = Launch {
            program: &program,
            args: self.args_for(sandbox, meta, argv),
            stdin,
            timeout,
            output_cap: self.config.output_cap_bytes,
            limits: self.config.limits,
            drop_to: self.drop_to(meta),
            cgroup,
        };
        let started = Mutex::new(None);
        let hook = |pid: Option<u32>| match pid {
            Some(pid) => {
                if let Ok(mut s) = started.lock() {
                    *s = Some(pid);
                }
                self.track(sandbox, Some(pid), None);
            }
            None => {
                let pid = started.lock().ok().and_then(|s| *s);
                self.track(sandbox, None, pid);
            }
        };
        run(launch, &hook).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DriverError::Unavailable(format!(
                    "bubblewrap program `{}` not found; install it with `apt-get install \
                     bubblewrap` or set SANDLANE_BWRAP",
                    program.display()
                ))
            } else {
                failed(format!("cannot start bubblewrap `{}`: {e}", program.display()))
            }
        })
    }

    /// Chooses the host id of a workspace: the owner of an existing durable one, else
    /// derived from its identity and unused by other live sandboxes.
    fn host_id(&self, spec: &ProvisionSpec, workspace: &std::path::Path) -> Result<u32, DriverError> {
        match self.ids {
            IdMode::Own { uid, .. } => Ok(uid),
            IdMode::PerWorkspace(ids) => {
                let id = spec.sandbox_id();
                if spec.durability == Durability::Durable
                    && let Some(owner) = owner_of(workspace)
                    && owner >= ids.base
                    && owner - ids.base < ids.span
                {
                    // The workspace's files are the owner's: keep it even if shared.
                    self.layout.claim_host_id(owner, id).map_err(failed)?;
                    return Ok(owner);
                }
                let identity = workspace::workspace_identity(id, &spec.key, spec.durability);
                for candidate in workspace::host_id_candidates(ids, &identity) {
                    if self.layout.claim_host_id(candidate, id).map_err(failed)? {
                        return Ok(candidate);
                    }
                }
                Err(failed("no free host uid in the configured range".to_owned()))
            }
        }
    }

    async fn try_provision(&self, spec: &ProvisionSpec) -> Result<bool, DriverError> {
        let id = spec.sandbox_id();
        let workspace = self.layout.workspace(id, &spec.key, spec.durability).map_err(failed)?;
        let parent_mode = if matches!(self.ids, IdMode::PerWorkspace(_)) { 0o711 } else { 0o700 };
        // The state directory first: it is what makes this sandbox's uid claim live.
        let dir = self.layout.sandbox_dir(id);
        workspace::mkdir_all(&dir, parent_mode).map_err(failed)?;
        workspace::set_mode(&dir, parent_mode).map_err(failed)?;
        let host_id = self.host_id(spec, &workspace)?;
        let owner = self.drop_to_id(host_id);
        let (created, _) = ensure_workspace(&workspace, parent_mode, owner).map_err(failed)?;
        self.layout.write_token(id, spec.credential.expose().as_bytes(), owner).map_err(failed)?;
        let meta = SandboxMeta {
            environment: spec.environment.clone(),
            durability: spec.durability,
            org: spec.key.org().clone(),
            kind: spec.key.kind(),
            key: spec.key.key().to_owned(),
            workspace,
            host_id,
        };
        self.layout.write_meta(id, &meta).map_err(failed)?;
        Ok(created)
    }

    fn drop_to_id(&self, host_id: u32) -> Option<u32> {
        match self.ids {
            IdMode::PerWorkspace(_) => Some(host_id),
            IdMode::Own { .. } => None,
        }
    }

    async fn probe(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let meta = self.meta(sandbox)?;
        let out = self.run_in(sandbox, &meta, &["true".to_owned()], &[], self.config.probe_timeout).await?;
        if out.exit_code == 0 && !out.timed_out {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = if out.timed_out { "timed out".to_owned() } else { format!("exit {}", out.exit_code) };
        Err(failed(format!("sandbox readiness probe failed ({why}): {}", stderr.trim())))
    }

    /// Removes what a failed provision left: the record, and the workspace when it is
    /// ephemeral or was created by this attempt.
    async fn undo(&self, sandbox: &SandboxId, spec: &ProvisionSpec, created: bool) {
        self.kill_all(sandbox, None).await;
        if (spec.durability == Durability::Ephemeral || created)
            && let Ok(path) = self.layout.workspace(sandbox, &spec.key, spec.durability)
        {
            let _ = workspace::remove_dir_all_quiet(&path);
        }
        let _ = self.layout.remove_sandbox_dir(sandbox);
    }

    /// Kills every process of the sandbox: running `bwrap` processes it started, the
    /// sandbox's cgroups, and every process of its host uid when no other live sandbox
    /// shares it.
    async fn kill_all(&self, sandbox: &SandboxId, host_id: Option<u32>) {
        let pids: Vec<u32> = self
            .running
            .lock()
            .ok()
            .and_then(|mut r| r.remove(sandbox))
            .map(|s| s.into_iter().collect())
            .unwrap_or_default();
        let pids: Vec<i32> = pids.into_iter().filter_map(|p| i32::try_from(p).ok()).collect();
        // The commands first (each bubblewrap then reaps its child and exits), then
        // whatever bubblewrap is still there.
        for pid in &pids {
            for inner in limits::children_of(*pid) {
                sigkill(inner);
            }
        }
        for _ in 0..100 {
            if pids.iter().all(|p| !Path::new(&format!("/proc/{p}")).exists()) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for pid in pids {
            sigkill(pid);
            limits::sigkill_group(pid);
        }
        for dir in self.cgroups.sandbox_dirs(sandbox.as_str()) {
            kill_tree(&dir).await;
        }
        if let (IdMode::PerWorkspace(ids), Some(uid)) = (self.ids, host_id)
            && uid >= ids.base
            && uid - ids.base < ids.span
            && self.layout.host_id_holder(uid).is_none_or(|holder| &holder == sandbox)
        {
            kill_uid(uid).await;
        }
    }

    async fn version(&self, program: &std::path::Path) -> String {
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
}

#[async_trait]
impl SandboxDriver for BwrapDriver {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    async fn provision(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        self.program()?;
        let id = spec.sandbox_id();
        let existing = self.layout.read_meta(id).map_err(failed)?;
        if let Some(existing) = &existing
            && (!existing.is_for(&spec.key) || existing.durability != spec.durability)
        {
            return Err(failed(format!(
                "sandbox {id} is already provisioned for {}/{}/{} ({})",
                existing.org, existing.kind, existing.key, existing.durability
            )));
        }
        // A failed first provision leaves nothing behind; a failed repeat leaves the
        // live sandbox as it was (with the new credential, if that was written).
        let fresh = existing.is_none();
        let created = match self.try_provision(spec).await {
            Ok(created) => created,
            Err(e) => {
                if fresh {
                    self.undo(id, spec, false).await;
                }
                return Err(e);
            }
        };
        if let Err(e) = self.probe(id).await {
            if fresh {
                self.undo(id, spec, created).await;
            }
            return Err(e);
        }
        tracing::debug!(sandbox = %id, durability = %spec.durability, "bubblewrap sandbox ready");
        Ok(())
    }

    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
    ) -> Result<(), DriverError> {
        let meta = self.meta(sandbox)?;
        self.layout.write_token(sandbox, credential.expose().as_bytes(), self.drop_to(&meta)).map_err(failed)
    }

    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError> {
        let meta = self.meta(sandbox)?;
        let timeout = Duration::from_millis(request.timeout_ms());
        self.run_in(sandbox, &meta, request.argv(), request.stdin(), timeout).await
    }

    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        let meta = self.layout.read_meta(sandbox).map_err(failed)?;
        self.kill_all(sandbox, meta.as_ref().map(|m| m.host_id)).await;
        match &meta {
            Some(m) if m.durability == Durability::Ephemeral => {
                workspace::remove_dir_all_quiet(&m.workspace).map_err(failed)?;
            }
            Some(_) => {}
            None => {
                workspace::remove_dir_all_quiet(&self.layout.ephemeral_workspace(sandbox)).map_err(failed)?;
            }
        }
        self.layout.remove_sandbox_dir(sandbox).map_err(failed)?;
        if let Some(m) = &meta {
            self.layout.release_host_id(m.host_id, sandbox);
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<SandboxId>, DriverError> {
        self.layout.list().map_err(failed)
    }

    async fn health(&self) -> DriverHealth {
        match self.program() {
            Err(DriverError::Unavailable(why) | DriverError::Failed(why)) => {
                DriverHealth { usable: false, detail: why }
            }
            Err(e) => DriverHealth { usable: false, detail: e.to_string() },
            Ok(program) => {
                let version = self.version(&program).await;
                let ids = match self.ids {
                    IdMode::PerWorkspace(ids) => {
                        format!("per-workspace host uid from {}", ids.base)
                    }
                    IdMode::Own { uid, .. } => format!("server uid {uid}"),
                };
                DriverHealth {
                    usable: true,
                    detail: format!("{version}; limits: {}; ids: {ids}", self.cgroups),
                }
            }
        }
    }
}
