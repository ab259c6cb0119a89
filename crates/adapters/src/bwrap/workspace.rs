//! On-disk layout of the driver: workspaces, per-sandbox state (`meta.json`, the
//! supervisor's socket, the token directory), and the unprivileged host ids workspaces
//! are owned by.
//!
//! ```text
//! <data_dir>/sandboxes/<sandbox_id>/meta.json         what exec and refresh read (0600)
//! <data_dir>/sandboxes/<sandbox_id>/control/          the supervisor's socket `sock` and
//!                                                     its `log`
//! <data_dir>/warm/<slot>/                              a prepared start's socket and log
//! <data_dir>/snapshots/<org>/<snapshot_id>/            a snapshot's files (see
//!                                                     `crate::snapshot_files`)
//!
//! <host_dir>/uids/<uid>                                which workspace of which data dir
//!                                                     owns a host uid (0600; root only)
//!
//! <sandbox_root>/workspaces/durable/<org>/<kind>/<key>/  durable workspace (0700, host uid)
//! <sandbox_root>/workspaces/ephemeral/<sandbox_id>/      ephemeral workspace (0700, host uid)
//! <sandbox_root>/warm/<slot>/{ws,run}                  a prepared start's binds, linked at
//!                                                     provision
//!
//! <token_root>/<sandbox_id>/token                      the credential (dir 0500, file 0400,
//!                                                     host uid), bound at /run/sandlane
//! <token_root>/env/<sandbox_id>.json                   the environment of the latest ensure,
//!                                                     when it differs from meta.json's (0600)
//! ```
//!
//! The token root is on a tmpfs where the host has one, else `<sandbox_root>/run`
//! ([`super::token_root`]). What an adoption or a re-ensure writes lives there: the token,
//! and the environment, which overrides the one `meta.json` recorded at provision (a full
//! write of `meta.json` at a provision, a resume or a suspension takes the effective
//! environment and removes the override).
//!
//! The data dir is private (0700 throughout): no sandbox uid can search it. What a
//! sandbox's uid must reach to start lives under the sandbox root, whose directories are
//! searchable (0711) but not listable when the sandboxes run as another uid: bubblewrap,
//! already running as that uid, resolves the paths it binds.
//!
//! A host uid belongs to a workspace, not to a sandbox, and is the host's, not the data
//! dir's: `<host_dir>/uids/<uid>` names the data dir and the workspace
//! (`durable/<org>/<kind>/<key>` or `ephemeral/<sandbox_id>`), claimed with an exclusive
//! create under the host's lock ([`super::host`]), so choosing one costs a few file
//! operations however many sandboxes exist, and two data dirs on one host never share
//! one. A durable workspace keeps its uid for as long as it exists, across deprovisions;
//! an ephemeral one gives it back when it is removed. A claim is stale (and may be taken)
//! only when its workspace is gone: its data dir, a durable workspace directory that does
//! not exist, or an ephemeral sandbox without state; whatever still runs as its uid is
//! ended before the uid is taken. (Servers before this kept claims in `<data_dir>/uids/`:
//! a driver moves them to the host's at its start.)

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use domain::{DriverEnvironment, Durability, OrgId, SandboxId, SandboxKey, SandboxKind};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::config::HostIds;
use super::host::{self, Claim, HostDir};

/// What the driver remembers about one sandbox, outside any workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SandboxMeta {
    /// The environment processes inside see.
    pub environment: DriverEnvironment,
    /// Whether the workspace survives deprovision.
    pub durability: Durability,
    /// The key's org.
    pub org: OrgId,
    /// The key's kind.
    pub kind: SandboxKind,
    /// The key within its org and kind.
    pub key: String,
    /// The workspace directory on the host.
    pub workspace: PathBuf,
    /// The host uid (and gid) the sandbox's processes run as.
    pub host_id: u32,
    /// The fencing epoch of the provision that built the running tree.
    #[serde(default)]
    pub epoch: i64,
    /// The workspace's filesystem image, when it has a quota (mounted on `workspace`
    /// while the sandbox runs).
    #[serde(default)]
    pub workspace_image: Option<PathBuf>,
    /// Whether the sandbox is suspended: no processes, the workspace unmounted, until a
    /// provision with a newer epoch starts it again.
    #[serde(default)]
    pub suspended: bool,
}

impl SandboxMeta {
    /// The record of a running sandbox provisioned for `spec`.
    pub fn of(
        spec: &ports::driver::ProvisionSpec,
        workspace: PathBuf,
        host_id: u32,
        workspace_image: Option<PathBuf>,
    ) -> Self {
        Self {
            environment: spec.environment.clone(),
            durability: spec.durability,
            org: spec.key.org().clone(),
            kind: spec.key.kind(),
            key: spec.key.key().to_owned(),
            workspace,
            host_id,
            epoch: spec.epoch,
            workspace_image,
            suspended: false,
        }
    }

    /// Whether this record belongs to `key`.
    pub fn is_for(&self, key: &SandboxKey) -> bool {
        &self.org == key.org() && self.kind == key.kind() && self.key == key.key()
    }
}

/// Who owns sandbox files and runs sandbox processes on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdMode {
    /// The server is root: each workspace gets its own unprivileged host id.
    PerWorkspace(HostIds),
    /// The server is not root: sandboxes run as the server's own uid and gid.
    Own {
        /// The server's uid.
        uid: u32,
        /// The server's gid.
        gid: u32,
    },
}

/// The server's effective uid and gid.
#[allow(unsafe_code)]
pub(crate) fn effective_ids() -> (u32, u32) {
    // SAFETY: geteuid and getegid take no arguments, cannot fail and touch no memory.
    unsafe { (libc::geteuid(), libc::getegid()) }
}

/// The paths of the driver under its data dir, its sandbox root and the host dir.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    data_dir: PathBuf,
    sandbox_root: PathBuf,
    token_root: PathBuf,
    host: HostDir,
}

fn io_context(what: &str, path: &Path, e: &io::Error) -> String {
    format!("{what} {}: {e}", path.display())
}

/// A path component from an id: refuses `.` and `..` (valid id characters, but not
/// names of a directory of their own).
fn component(value: &str) -> Result<&str, String> {
    if value.is_empty() || value == "." || value == ".." || value.contains('/') {
        Err(format!("{value:?} cannot name a workspace directory"))
    } else {
        Ok(value)
    }
}

impl Layout {
    /// The layout of `data_dir` and `sandbox_root`, host uids claimed in `host_dir`,
    /// tokens under `<sandbox_root>/run` until [`Layout::with_token_root`] says otherwise.
    pub fn new(data_dir: PathBuf, sandbox_root: PathBuf, host_dir: PathBuf) -> Self {
        let token_root = sandbox_root.join("run");
        Self { data_dir, sandbox_root, token_root, host: HostDir::new(host_dir) }
    }

    /// The host dir.
    pub fn host(&self) -> &HostDir {
        &self.host
    }

    /// The same layout with the token directories and environments under `token_root`.
    pub fn with_token_root(self, token_root: PathBuf) -> Self {
        Self { token_root, ..self }
    }

    pub fn sandboxes(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }

    pub fn sandbox_dir(&self, id: &SandboxId) -> PathBuf {
        self.sandboxes().join(id.as_str())
    }

    pub fn meta_path(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id).join("meta.json")
    }

    /// Where prepared sandbox starts keep their socket and log (one directory per start).
    pub fn warm_dir(&self) -> PathBuf {
        self.data_dir.join("warm")
    }

    /// Where prepared sandbox starts find their binds (one directory per start).
    pub fn warm_binds_dir(&self) -> PathBuf {
        self.sandbox_root.join("warm")
    }

    /// The directory bound read-only at `/run/sandlane` inside.
    pub fn run_dir(&self, id: &SandboxId) -> PathBuf {
        self.token_root.join(id.as_str())
    }

    /// The environment of the sandbox's latest ensure, when it differs from `meta.json`'s.
    fn env_path(&self, id: &SandboxId) -> PathBuf {
        self.token_root.join("env").join(format!("{id}.json"))
    }

    pub fn token_path(&self, id: &SandboxId) -> PathBuf {
        self.run_dir(id).join("token")
    }

    /// The root-only directory of the supervisor's socket and log.
    pub fn control_dir(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_dir(id).join("control")
    }

    /// The supervisor's listening socket.
    pub fn socket_path(&self, id: &SandboxId) -> PathBuf {
        self.control_dir(id).join("sock")
    }

    pub fn ephemeral_workspace(&self, id: &SandboxId) -> PathBuf {
        self.sandbox_root.join("workspaces/ephemeral").join(id.as_str())
    }

    /// The filesystem image of a workspace with a quota (root only, in the data dir): by
    /// key for a durable workspace, by sandbox for an ephemeral one. `.img` is appended to
    /// the last component, so distinct keys have distinct images.
    pub fn workspace_image(
        &self,
        id: &SandboxId,
        key: &SandboxKey,
        durability: Durability,
    ) -> Result<PathBuf, String> {
        Ok(match durability {
            Durability::Ephemeral => self.ephemeral_image(id),
            Durability::Durable => self
                .data_dir
                .join("images/durable")
                .join(component(key.org().as_str())?)
                .join(component(key.kind().as_str())?)
                .join(format!("{}.img", component(key.key())?)),
        })
    }

    /// The filesystem image of an ephemeral sandbox's workspace.
    pub fn ephemeral_image(&self, id: &SandboxId) -> PathBuf {
        self.data_dir.join("images/ephemeral").join(format!("{id}.img"))
    }

    /// Where snapshots of workspaces live (root only: [`crate::snapshot_files`]).
    pub fn snapshots(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// Where the template images of workspace quotas live (root only).
    pub fn image_templates(&self) -> PathBuf {
        self.data_dir.join("images/templates")
    }

    /// Where the workspace of a sandbox of `key` and `durability` lives.
    pub fn workspace(
        &self,
        id: &SandboxId,
        key: &SandboxKey,
        durability: Durability,
    ) -> Result<PathBuf, String> {
        Ok(match durability {
            Durability::Ephemeral => self.ephemeral_workspace(id),
            Durability::Durable => self
                .sandbox_root
                .join("workspaces/durable")
                .join(component(key.org().as_str())?)
                .join(component(key.kind().as_str())?)
                .join(component(key.key())?),
        })
    }

    /// Creates the fixed directories: the data dir's private (0700), the sandbox root's
    /// searchable (0711) when the sandboxes run as another uid, else private too.
    pub fn prepare(&self, searchable: bool) -> Result<(), String> {
        for sub in ["", "sandboxes", "warm"] {
            let path = self.data_dir.join(sub);
            mkdir_all(&path, 0o700)?;
        }
        let mode = if searchable { 0o711 } else { 0o700 };
        for sub in ["", "workspaces", "workspaces/durable", "workspaces/ephemeral", "run", "warm"] {
            let path = self.sandbox_root.join(sub);
            mkdir_all(&path, mode)?;
            set_mode(&path, mode)?;
        }
        Ok(())
    }

    /// Creates the token root's private `env/` (the root itself is made by
    /// [`Layout::prepare`] on disk, or by [`super::token_root::TokenRoot::choose`] in memory).
    pub fn prepare_tokens(&self) -> Result<(), String> {
        mkdir_all(&self.token_root.join("env"), 0o700)
    }

    /// Reads a sandbox's record, with the environment of its latest ensure; `Ok(None)`
    /// when there is none.
    pub fn read_meta(&self, id: &SandboxId) -> Result<Option<SandboxMeta>, String> {
        let path = self.meta_path(id);
        let mut meta: SandboxMeta = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("corrupt sandbox record {}: {e}", path.display()))?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_context("cannot read", &path, &e)),
        };
        let env = self.env_path(id);
        match fs::read(&env) {
            Ok(bytes) => {
                meta.environment = serde_json::from_slice(&bytes)
                    .map_err(|e| format!("corrupt sandbox environment {}: {e}", env.display()))?;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_context("cannot read", &env, &e)),
        }
        Ok(Some(meta))
    }

    /// Writes a sandbox's record atomically (0600, server-owned), its environment
    /// included: an earlier override of the environment goes.
    pub fn write_meta(&self, id: &SandboxId, meta: &SandboxMeta) -> Result<(), String> {
        let bytes =
            serde_json::to_vec_pretty(meta).map_err(|e| format!("cannot encode sandbox record: {e}"))?;
        write_atomic(&self.meta_path(id), &bytes, 0o600, None)?;
        self.forget_environment(id)
    }

    /// Rewrites a sandbox's record atomically without waiting for the disk (`fsync` takes
    /// milliseconds here): for changes a host crash makes moot (the workspace image of a
    /// running sandbox: the sandbox's processes and mounts end with the host too, and the
    /// next ensure rebuilds them). `meta` must carry the effective environment (as
    /// [`Layout::read_meta`] gives it); an override of it stays.
    pub fn rewrite_meta(&self, id: &SandboxId, meta: &SandboxMeta) -> Result<(), String> {
        let bytes =
            serde_json::to_vec_pretty(meta).map_err(|e| format!("cannot encode sandbox record: {e}"))?;
        write_file_atomic(&self.meta_path(id), &bytes, 0o600, None, false)
    }

    /// Records the environment of the sandbox's latest ensure beside its token (atomically,
    /// 0600, not synced: it matters only while the sandbox's processes live, which a host
    /// crash ends).
    pub fn write_environment(&self, id: &SandboxId, environment: &DriverEnvironment) -> Result<(), String> {
        let bytes = serde_json::to_vec(environment)
            .map_err(|e| format!("cannot encode the sandbox environment: {e}"))?;
        write_file_atomic(&self.env_path(id), &bytes, 0o600, None, false)
    }

    fn forget_environment(&self, id: &SandboxId) -> Result<(), String> {
        let env = self.env_path(id);
        match fs::remove_file(&env) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_context("cannot remove", &env, &e)),
        }
    }

    /// Writes the token file atomically (a new file renamed over `token`, so a process
    /// inside reads the old or the new one, never a mix): mode 0400, owned by `owner`
    /// when given. Not synced: a token is short-lived and re-minted after a crash.
    pub fn write_token(&self, id: &SandboxId, token: &[u8], owner: Option<u32>) -> Result<(), String> {
        write_file_atomic(&self.token_path(id), token, 0o400, owner, false)
    }

    /// The ids of every sandbox with a record.
    pub fn list(&self) -> Result<Vec<SandboxId>, String> {
        let dir = self.sandboxes();
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_context("cannot list", &dir, &e)),
        };
        let mut ids = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io_context("cannot list", &dir, &e))?;
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if let Ok(id) = SandboxId::parse(name)
                && entry.path().join("meta.json").is_file()
            {
                ids.push(id);
            }
        }
        ids.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        Ok(ids)
    }

    /// This data dir's claim for the workspace `identity`.
    fn claim(&self, identity: &str) -> Claim {
        Claim {
            data_dir: self.data_dir.clone(),
            sandbox_root: self.sandbox_root.clone(),
            identity: identity.to_owned(),
        }
    }

    /// The workspace of this data dir owning host `uid`, if its claim is not stale.
    #[cfg(test)]
    pub fn host_id_owner(&self, uid: u32) -> Option<String> {
        let claim = host::read_claim(&self.host.claim_path(uid)).ok()??;
        (claim.data_dir == self.data_dir && claim.why_stale().is_none()).then_some(claim.identity)
    }

    /// Claims host `uid` for the workspace `identity`: `true` when it was free, already
    /// that workspace's, or held by a workspace that is gone (of any data dir: `end` first
    /// ends whatever still runs as the uid, see [`super::host::end_uid`]); `false` when
    /// another workspace owns it, or `end` could not end its processes. The caller holds
    /// the host's lock ([`HostDir::lock`]).
    ///
    /// # Errors
    /// When the claim cannot be written.
    pub fn claim_host_id(
        &self,
        uid: u32,
        identity: &str,
        end: &dyn Fn(u32) -> Result<usize, String>,
    ) -> Result<bool, String> {
        let path = self.host.claim_path(uid);
        let mine = self.claim(identity);
        match host::write_claim(&path, &mine, true) {
            Ok(()) => return Ok(true),
            Err(_) if path.exists() => {}
            Err(e) => return Err(e),
        }
        let why = match host::read_claim(&path) {
            Ok(Some(holder)) if holder == mine => return Ok(true),
            Ok(Some(holder)) => match holder.why_stale() {
                None => return Ok(false),
                Some(why) => why.to_owned(),
            },
            Ok(None) => "it was released meanwhile".to_owned(),
            Err(why) => why,
        };
        if let Err(e) = end(uid) {
            tracing::warn!(uid, error = %e, "a stale host uid claim's processes could not be ended; the uid is left");
            return Ok(false);
        }
        tracing::debug!(uid, reason = %why, "host uid taken over from a stale claim");
        host::write_claim(&path, &mine, false).map(|()| true)
    }

    /// Releases host `uid` if this data dir's workspace `identity` holds it (an ephemeral
    /// workspace that was removed). The caller holds the host's lock.
    pub fn release_host_id(&self, uid: u32, identity: &str) {
        let path = self.host.claim_path(uid);
        if host::read_claim(&path).is_ok_and(|holder| holder == Some(self.claim(identity))) {
            let _ = fs::remove_file(&path);
        }
    }

    /// Moves host `uid`'s claim from workspace `from` to workspace `to` (renamed), if
    /// `from` holds it; the caller holds the host's lock.
    ///
    /// # Errors
    /// A message when `from` does not hold it or the claim cannot be written.
    pub fn move_host_id(&self, uid: u32, from: &str, to: &str) -> Result<(), String> {
        let path = self.host.claim_path(uid);
        if host::read_claim(&path)? != Some(self.claim(from)) {
            return Err(format!("host uid {uid} is not held by {from}"));
        }
        host::write_claim(&path, &self.claim(to), false)
    }

    /// Moves the claims an earlier server kept in `<data_dir>/uids/` (one file per uid,
    /// naming the workspace) to the host's, for the workspaces that still exist; returns
    /// what could not be moved (a uid another data dir's workspace holds). The caller holds
    /// the host's lock.
    pub fn adopt_data_dir_claims(&self) -> Vec<String> {
        let dir = self.data_dir.join("uids");
        let Ok(entries) = fs::read_dir(&dir) else { return Vec::new() };
        let mut problems = Vec::new();
        for entry in entries.flatten() {
            let uid = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok());
            let identity = fs::read_to_string(entry.path()).unwrap_or_default();
            let identity = identity.trim();
            if let Some(uid) = uid
                && !identity.is_empty()
                && workspace_exists(&self.data_dir, &self.sandbox_root, identity)
            {
                // Its processes are this data dir's own running sandbox: never ended here.
                match self.claim_host_id(uid, identity, &|_| Ok(0)) {
                    Ok(true) => {}
                    Ok(false) => problems.push(format!(
                        "host uid {uid} of workspace {identity} is claimed by another data dir's workspace"
                    )),
                    Err(e) => {
                        problems.push(e);
                        continue;
                    }
                }
            }
            let _ = fs::remove_file(entry.path());
        }
        let _ = fs::remove_dir(&dir);
        problems
    }

    /// Removes a sandbox's state and token directories; `Ok` when they are already gone.
    pub fn remove_sandbox_dir(&self, id: &SandboxId) -> Result<(), String> {
        remove_dir_all_quiet(&self.run_dir(id))?;
        self.forget_environment(id)?;
        remove_dir_all_quiet(&self.sandbox_dir(id))
    }
}

/// The first directory above `path` that users other than its owner cannot search
/// (no `o+x`): the sandboxes' uid could not reach anything below it.
pub(crate) fn unsearchable_ancestor(path: &Path) -> Option<PathBuf> {
    let canonical = fs::canonicalize(path).ok()?;
    canonical
        .ancestors()
        .skip(1)
        .find(|dir| !fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
        .map(Path::to_path_buf)
}

/// Whether the workspace named by `identity` (see [`workspace_identity`]) of the data dir
/// `data_dir` with the sandbox root `sandbox_root` exists: a durable workspace's
/// directory, an ephemeral sandbox's state directory.
pub(crate) fn workspace_exists(data_dir: &Path, sandbox_root: &Path, identity: &str) -> bool {
    if let Some(rest) = identity.strip_prefix("durable/") {
        let parts: Vec<&str> = rest.splitn(3, '/').collect();
        if let [org, kind, key] = parts[..] {
            let path = sandbox_root.join("workspaces/durable").join(org).join(kind).join(key);
            return path.is_dir();
        }
        return false;
    }
    identity
        .strip_prefix("ephemeral/")
        .and_then(|id| SandboxId::parse(id).ok())
        .is_some_and(|id| data_dir.join("sandboxes").join(id.as_str()).is_dir())
}

/// The host ids to try for a workspace identity, in order: the one derived from its hash,
/// then the next ones in the range (at most 4096).
pub(crate) fn host_id_candidates(ids: HostIds, identity: &str) -> impl Iterator<Item = u32> {
    let digest = Sha256::digest(identity.as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    let span = u64::from(ids.span.max(1));
    let start = u64::from_be_bytes(first) % span;
    (0..span.min(4096)).map(move |step| {
        let offset = (start + step) % span;
        ids.base.saturating_add(u32::try_from(offset).unwrap_or(0))
    })
}

/// Chooses, claims and returns the host uid of the workspace `identity` at `workspace`,
/// and creates the workspace (owned by that uid) when missing; also says whether it was
/// created. A durable workspace that exists keeps the uid that owns it. `end` ends what
/// runs as a stale claim's uid before it is taken (see [`Layout::claim_host_id`]). The
/// caller holds the host's lock (one allocation at a time on the host), across both the
/// claim and the workspace's creation: until the workspace exists, its claim looks stale.
///
/// # Errors
/// A message when no uid of the range is free, or an existing workspace's uid is
/// claimed by another workspace.
pub(crate) fn allocate_host_id(
    layout: &Layout,
    ids: HostIds,
    identity: &str,
    workspace: &Path,
    parent_mode: u32,
    end: &dyn Fn(u32) -> Result<usize, String>,
) -> Result<(u32, bool), String> {
    let in_range = |uid: u32| uid >= ids.base && uid - ids.base < ids.span;
    if let Some(owner) = owner_of(workspace).filter(|o| in_range(*o)) {
        if !layout.claim_host_id(owner, identity, end)? {
            return Err(format!(
                "host uid {owner} owning workspace {} is claimed by another workspace",
                workspace.display()
            ));
        }
        let (created, _) = ensure_workspace(workspace, parent_mode, Some(owner))?;
        return Ok((owner, created));
    }
    for candidate in host_id_candidates(ids, identity) {
        if layout.claim_host_id(candidate, identity, end)? {
            let (created, _) = ensure_workspace(workspace, parent_mode, Some(candidate))?;
            return Ok((candidate, created));
        }
    }
    Err("no free host uid in the configured range".to_owned())
}

/// The identity a workspace's host id is derived from.
pub(crate) fn workspace_identity(id: &SandboxId, key: &SandboxKey, durability: Durability) -> String {
    match durability {
        Durability::Durable => format!("durable/{key}"),
        Durability::Ephemeral => format!("ephemeral/{id}"),
    }
}

/// Creates `path` and its missing parents with `mode`. The mode is set explicitly on each
/// directory created: the server runs with umask 077, which would mask it.
pub(crate) fn mkdir_all(path: &Path, mode: u32) -> Result<(), String> {
    let missing: Vec<&Path> =
        path.ancestors().take_while(|p| !p.as_os_str().is_empty() && !p.exists()).collect();
    for dir in missing.into_iter().rev() {
        match DirBuilder::new().mode(mode).create(dir) {
            Ok(()) => set_mode(dir, mode)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_context("cannot create", dir, &e)),
        }
    }
    Ok(())
}

pub(crate) fn set_mode(path: &Path, mode: u32) -> Result<(), String> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| io_context("cannot set the mode of", path, &e))
}

/// Creates `path` (and parents, mode `parent_mode`) unless it exists; the leaf gets
/// mode 0700 and, when given, the owner `owner`. Returns whether it was created, and
/// the uid owning it.
pub(crate) fn ensure_workspace(
    path: &Path,
    parent_mode: u32,
    owner: Option<u32>,
) -> Result<(bool, u32), String> {
    if let Some(parent) = path.parent() {
        mkdir_all(parent, parent_mode)?;
        // Parents created earlier keep their mode; only those below workspaces/ matter.
    }
    let created = match DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => true,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(io_context("cannot create", path, &e)),
    };
    let meta = fs::symlink_metadata(path).map_err(|e| io_context("cannot read", path, &e))?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", path.display()));
    }
    if let Some(uid) = owner
        && (created || meta.uid() != uid)
    {
        std::os::unix::fs::lchown(path, Some(uid), Some(uid))
            .map_err(|e| io_context("cannot change the owner of", path, &e))?;
    }
    let uid = fs::symlink_metadata(path).map_err(|e| io_context("cannot read", path, &e))?.uid();
    Ok((created, uid))
}

/// The uid owning an existing directory, if it exists.
pub(crate) fn owner_of(path: &Path) -> Option<u32> {
    fs::symlink_metadata(path).ok().filter(fs::Metadata::is_dir).map(|m| m.uid())
}

fn write_atomic(path: &Path, bytes: &[u8], mode: u32, owner: Option<u32>) -> Result<(), String> {
    write_file_atomic(path, bytes, mode, owner, true)
}

/// Creates `path` anew (`O_EXCL`, never following a symlink). A leftover of an earlier
/// process with this pid (a crash between create and rename) is removed and the name
/// taken again: no removal up front on the common path.
fn create_replacing(path: &Path, mode: u32) -> io::Result<fs::File> {
    let create = || {
        OpenOptions::new().write(true).create_new(true).mode(mode).custom_flags(libc::O_NOFOLLOW).open(path)
    };
    match create() {
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            fs::remove_file(path)?;
            create()
        }
        other => other,
    }
}

fn write_file_atomic(
    path: &Path,
    bytes: &[u8],
    mode: u32,
    owner: Option<u32>,
    sync: bool,
) -> Result<(), String> {
    // A name of its own per writer: concurrent refreshes of one sandbox's token must not
    // share (and rename away) each other's temporary file.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // Hidden, so a listing of the token directory inside shows `token` alone.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.new.{}.{n}", std::process::id()));
    let mut file = create_replacing(&tmp, mode).map_err(|e| io_context("cannot create", &tmp, &e))?;
    file.write_all(bytes).map_err(|e| io_context("cannot write", &tmp, &e))?;
    if sync {
        file.sync_all().map_err(|e| io_context("cannot sync", &tmp, &e))?;
    }
    if let Some(uid) = owner {
        std::os::unix::fs::fchown(&file, Some(uid), Some(uid))
            .map_err(|e| io_context("cannot change the owner of", &tmp, &e))?;
    }
    drop(file);
    fs::rename(&tmp, path).map_err(|e| io_context("cannot replace", path, &e))
}

/// Removes a directory tree without following symlinks in it; `Ok` when it is gone.
pub(crate) fn remove_dir_all_quiet(path: &Path) -> Result<(), String> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_context("cannot remove", path, &e)),
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    /// The environment of the latest ensure overrides the record's until a full write of
    /// the record (a provision, resume or suspension) takes it in; removal takes it too.
    #[test]
    fn an_ensure_environment_overrides_the_record_until_the_record_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path().join("data"), dir.path().join("root"), dir.path().join("host"))
            .with_token_root(dir.path().join("tokens"));
        layout.prepare(false).unwrap();
        fs::create_dir(dir.path().join("tokens")).unwrap();
        layout.prepare_tokens().unwrap();
        let id = SandboxId::parse("sbx_01J0000000000000000000000A").unwrap();
        fs::create_dir_all(layout.sandbox_dir(&id)).unwrap();
        let key = SandboxKey::Workflow {
            org: OrgId::parse("acme").unwrap(),
            execution_id: domain::ExecutionId::parse("e1").unwrap(),
        };
        let env = |execution: &str| {
            let execution = domain::ExecutionId::parse(execution).unwrap();
            let service = domain::SandboxCaller::from_record(
                domain::IdentityId::parse("svc").unwrap(),
                domain::CallerClass::Service,
            );
            domain::split_caller(&domain::split::RecordSubject::new(&key, &execution), &service, &id).1
        };
        let meta = SandboxMeta {
            environment: env("e1"),
            durability: Durability::Ephemeral,
            org: OrgId::parse("acme").unwrap(),
            kind: SandboxKind::Workflow,
            key: "e1".into(),
            workspace: dir.path().join("ws"),
            host_id: 5,
            epoch: 1,
            workspace_image: None,
            suspended: false,
        };
        layout.write_meta(&id, &meta).unwrap();
        assert_eq!(layout.read_meta(&id).unwrap().unwrap().environment, env("e1"));
        layout.write_environment(&id, &env("e2")).unwrap();
        let read = layout.read_meta(&id).unwrap().unwrap();
        assert_eq!(read.environment, env("e2"), "the latest ensure's environment");
        // A partial rewrite (a workspace image) keeps it.
        layout.rewrite_meta(&id, &SandboxMeta { epoch: 2, ..read.clone() }).unwrap();
        assert_eq!(layout.read_meta(&id).unwrap().unwrap().environment, env("e2"));
        // A full write (a suspension) takes it in: the override is gone, the record has it.
        layout.write_meta(&id, &SandboxMeta { suspended: true, ..read }).unwrap();
        assert!(!layout.env_path(&id).exists());
        assert_eq!(layout.read_meta(&id).unwrap().unwrap().environment, env("e2"));
        // A corrupt override is an error, not a silent fallback to an older environment.
        fs::write(layout.env_path(&id), b"{").unwrap();
        assert!(layout.read_meta(&id).unwrap_err().contains("corrupt sandbox environment"));
        layout.write_environment(&id, &env("e3")).unwrap();
        layout.remove_sandbox_dir(&id).unwrap();
        assert!(!layout.env_path(&id).exists());
        assert_eq!(layout.read_meta(&id).unwrap(), None);
    }

    /// A leftover temporary file under the name a write takes (a crash of an earlier
    /// process with this pid) is replaced; a symlink there is never followed.
    #[test]
    fn a_leftover_temporary_file_is_replaced_and_a_symlink_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".token.new.1.0");
        fs::write(&tmp, b"stale and longer").unwrap();
        create_replacing(&tmp, 0o400).unwrap().write_all(b"new").unwrap();
        assert_eq!(fs::read(&tmp).unwrap(), b"new");
        assert_eq!(fs::metadata(&tmp).unwrap().permissions().mode() & 0o777, 0o400);

        let target = dir.path().join("elsewhere");
        fs::write(&target, b"kept").unwrap();
        let link = dir.path().join(".token.new.1.1");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        create_replacing(&link, 0o400).unwrap().write_all(b"new").unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"kept", "the symlink's target is untouched");
        assert!(!fs::symlink_metadata(&link).unwrap().file_type().is_symlink());

        write_file_atomic(&dir.path().join("token"), b"tok", 0o400, None, false).unwrap();
        assert_eq!(fs::read(dir.path().join("token")).unwrap(), b"tok");
    }
}
