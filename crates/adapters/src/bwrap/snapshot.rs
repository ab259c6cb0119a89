//! Snapshots, forks and restores of bubblewrap workspaces (the files: see
//! [`crate::snapshot_files`]).
//!
//! A snapshot freezes the sandbox's cgroup, syncs its workspace's filesystem (mounted in
//! the sandbox's own mount namespace, reached through `/proc/<pid>/root`), copies the
//! image (or, without a quota, the directory), and thaws it: the sandbox's processes stop
//! for the copy only, and see nothing else of it. A fork's workspace is a copy of the
//! snapshot's files given to the fork's own host uid (mounted on the host for the while);
//! a restore does the same to a suspended sandbox's workspace, which the resume then
//! starts on.

use std::path::{Path, PathBuf};

use domain::SandboxId;
use ports::driver::{DriverError, ProvisionSpec, SnapshotRef};

use super::workspace::{SandboxMeta, remove_dir_all_quiet};
use super::{BwrapDriver, failed, failed_by};
use crate::snapshot_files::{self, SnapshotFiles, Stored};
use crate::workspace_image::WorkspaceImage;

impl BwrapDriver {
    pub(super) fn snapshot_files(&self) -> SnapshotFiles {
        SnapshotFiles::new(self.layout.snapshots())
    }

    /// The snapshot's files, or `NoSuchPath`.
    fn stored(&self, snapshot: &SnapshotRef) -> Result<Stored, DriverError> {
        self.snapshot_files().stored(snapshot).map_err(failed)?.ok_or_else(|| {
            DriverError::NoSuchPath(format!("snapshot {} has no files on this host", snapshot.id))
        })
    }

    /// Takes the snapshot (the sandbox's lock held by the caller).
    pub(super) async fn snapshot_locked(
        &self,
        sandbox: &SandboxId,
        target: &SnapshotRef,
        quota_left: Option<u64>,
    ) -> Result<u64, DriverError> {
        let meta = self.meta(sandbox)?;
        let running = !meta.suspended;
        let frozen = if running {
            self.cgroups
                .freeze(sandbox.as_str())
                .await
                .map_err(|e| failed_by("cannot freeze the sandbox", e))?
        } else {
            false
        };
        // Thawed when this is dropped: also when the caller's future is dropped mid-copy.
        let _thaw = frozen.then(|| Thaw { cgroups: &self.cgroups, sandbox });
        if running && !frozen && meta.workspace_image.is_none() {
            // A directory is copied as root, path by path: a process running beside the
            // copy could swap a directory for a link to the host's files between a check
            // and its use. Only a sandbox whose processes are stopped is copied.
            return Err(DriverError::Conflict(format!(
                "sandbox {sandbox} runs on a host without a cgroup freezer, so its workspace cannot \
                 be copied while it runs; take the snapshot once it is suspended"
            )));
        }
        self.copy_workspace(sandbox, &meta, target, running, quota_left).await
    }

    async fn copy_workspace(
        &self,
        sandbox: &SandboxId,
        meta: &SandboxMeta,
        target: &SnapshotRef,
        running: bool,
        quota_left: Option<u64>,
    ) -> Result<u64, DriverError> {
        let files = self.snapshot_files();
        let target = target.clone();
        match meta.workspace_image.clone() {
            Some(image) => {
                let quota =
                    WorkspaceImage::new(image.clone(), meta.workspace.clone(), self.layout.image_templates())
                        .quota()
                        .ok_or_else(|| {
                            failed(format!("the workspace image of {sandbox} has no recorded quota"))
                        })?;
                snapshot_files::fits(&image, quota_left)?;
                let owner = self.workspace_owner(meta);
                // The workspace's filesystem is mounted in the sandbox's namespace, reached
                // here through one of its processes: frozen (its writes on the device,
                // its journal clean) while the image is copied.
                let mounted = if running {
                    Some(self.mounted_workspace(sandbox, meta).ok_or_else(|| not_mounted(sandbox))?)
                } else {
                    None
                };
                tokio::task::spawn_blocking(move || {
                    let _frozen = mounted.as_deref().map(snapshot_files::freeze_fs).transpose()?;
                    files.take_image(&target, &image, quota, Some(owner))
                })
                .await
                .map_err(|e| failed_by("the snapshot task failed", e))?
                .map_err(failed)
            }
            None => {
                let workspace = meta.workspace.clone();
                // Measured once the sandbox is stopped, like the copy (a directory swapped
                // for a link meanwhile would lead the walk out).
                tokio::task::spawn_blocking(move || {
                    snapshot_files::fits(&workspace, quota_left)?;
                    files.take_tree(&target, &workspace).map_err(failed)
                })
                .await
                .map_err(|e| failed_by("the snapshot task failed", e))?
            }
        }
    }

    /// The quota a fork of `spec` gets: the policy's, or the snapshot's when larger (a
    /// snapshot's files must fit) or when the policy sets none (an image stays an image).
    pub(super) fn fork_quota(&self, spec: &ProvisionSpec) -> Result<Option<u64>, DriverError> {
        match &spec.from_snapshot {
            Some(snapshot) => self.fork_quota_of(spec.workspace_bytes, snapshot),
            None => Ok(spec.workspace_bytes),
        }
    }

    /// The quota a fork of `snapshot` gets when the policy's is `bytes`.
    pub(super) fn fork_quota_of(
        &self,
        bytes: Option<u64>,
        snapshot: &SnapshotRef,
    ) -> Result<Option<u64>, DriverError> {
        Ok(match self.stored(snapshot)? {
            Stored::Image { quota, .. } => Some(bytes.map_or(quota, |q| q.max(quota))),
            Stored::Tree(_) => bytes,
        })
    }

    /// Fills the new workspace of a fork started ahead (its `workspace` directory, or its
    /// `image` for `quota`) with `snapshot`'s files, given to `owner` here, on the host.
    pub(super) async fn seed_ahead(
        &self,
        snapshot: &SnapshotRef,
        workspace: PathBuf,
        image: Option<PathBuf>,
        quota: Option<u64>,
        owner: (u32, u32),
    ) -> Result<(), DriverError> {
        let stored = self.stored(snapshot)?;
        let templates = self.layout.image_templates();
        let how = Fill { owner, image_here: true, synced: false };
        tokio::task::spawn_blocking(move || fill(stored, image, &workspace, &templates, quota, how))
            .await
            .map_err(|e| failed_by("the fork task failed", e))?
            .map_err(failed)
    }

    /// Fills a fork's new workspace with the snapshot's files, given to `owner`, before
    /// the workspace is prepared: an image copied into place (the preparation then finds
    /// it and grows it to the quota), or a tree copied into the workspace directory (or
    /// into a new image, for a quota). Refuses a workspace that already holds files (a
    /// durable workspace of the key: a fork never replaces data; a restore does).
    ///
    /// Returns the source's uid and gid when the image's files are still theirs, to be
    /// given to `owner` once the sandbox has mounted it ([`BwrapDriver::give_to_owner`]):
    /// with cgroups the server reaches the sandbox's own mount, which spares a mount and an
    /// unmount of the image on the host (most of a fork's time on XFS).
    pub(super) async fn seed_fork(
        &self,
        spec: &ProvisionSpec,
        meta: &SandboxMeta,
        quota: Option<u64>,
        owner: (u32, u32),
    ) -> Result<Option<(u32, u32)>, DriverError> {
        let Some(snapshot) = &spec.from_snapshot else { return Ok(None) };
        let stored = self.stored(snapshot)?;
        let image = match quota {
            Some(_) => Some(
                self.layout.workspace_image(spec.sandbox_id(), &spec.key, spec.durability).map_err(failed)?,
            ),
            None => None,
        };
        let occupied = image.as_ref().is_some_and(|i| i.exists())
            || std::fs::read_dir(&meta.workspace).map(|mut d| d.next().is_some()).unwrap_or(false);
        if occupied {
            return Err(DriverError::Conflict(format!(
                "{} already has a workspace; a fork starts a new one (restore replaces an existing one)",
                spec.key
            )));
        }
        let templates = self.layout.image_templates();
        let workspace = meta.workspace.clone();
        let synced = spec.durability == domain::Durability::Durable;
        let later = match &stored {
            Stored::Image { owner: Some(from), .. }
                if !self.cgroups.sandbox_dirs(spec.sandbox_id().as_str()).is_empty() =>
            {
                Some(*from)
            }
            _ => None,
        };
        let how = Fill { owner, image_here: later.is_none(), synced };
        tokio::task::spawn_blocking(move || fill(stored, image, &workspace, &templates, quota, how))
            .await
            .map_err(|e| failed_by("the fork task failed", e))?
            .map_err(failed)?;
        Ok(later)
    }

    /// Gives a started fork's files to its uid, through the sandbox's own mount of its
    /// workspace (`/proc/<pid>/root`): nothing of the sandbox runs yet but its supervisor
    /// (no command starts before the provision returns), and no link is followed.
    pub(super) async fn give_to_owner(
        &self,
        sandbox: &SandboxId,
        meta: &SandboxMeta,
        from: (u32, u32),
    ) -> Result<(), DriverError> {
        let owner = self.workspace_owner(meta);
        let root = self.mounted_workspace(sandbox, meta).ok_or_else(|| not_mounted(sandbox))?;
        tokio::task::spawn_blocking(move || snapshot_files::rechown_from(&root, from, owner))
            .await
            .map_err(|e| failed_by("the fork task failed", e))?
            .map_err(|e| failed(format!("cannot give the fork's files to its user: {e}")))
    }

    /// Replaces a suspended sandbox's workspace with the snapshot's files (the sandbox's
    /// lock held by the caller).
    pub(super) async fn restore_locked(
        &self,
        sandbox: &SandboxId,
        snapshot: &SnapshotRef,
    ) -> Result<(), DriverError> {
        let meta = self.meta(sandbox)?;
        if !meta.suspended {
            return Err(DriverError::Conflict(format!(
                "sandbox {sandbox} is running; it is suspended before a restore"
            )));
        }
        let stored = self.stored(snapshot)?;
        let owner = self.workspace_owner(&meta);
        let templates = self.layout.image_templates();
        let workspace = meta.workspace.clone();
        let image = meta.workspace_image.clone();
        let synced = meta.durability == domain::Durability::Durable;
        tokio::task::spawn_blocking(move || {
            let quota = match &image {
                Some(image) => {
                    let ws = WorkspaceImage::new(image.clone(), workspace.clone(), templates.clone());
                    let quota = ws.quota().ok_or_else(|| format!("the image {} has no recorded quota", image.display()))?;
                    match &stored {
                        Stored::Image { quota: snap, .. } => Some(quota.max(*snap)),
                        Stored::Tree(_) => Some(quota),
                    }
                }
                None => {
                    if matches!(stored, Stored::Image { .. }) {
                        return Err("the snapshot holds a workspace with a quota; this sandbox's has none: fork it instead".to_owned());
                    }
                    None
                }
            };
            let how = Fill { owner, image_here: true, synced };
            match (image, &stored) {
                (Some(image), _) => {
                    // The snapshot (a tree, or an image cloned, given to this sandbox's uid
                    // and grown to its quota) goes into a new image made beside the
                    // workspace's, which it replaces once filled: a restore that fails at
                    // any step leaves the workspace as it was.
                    let fresh = WorkspaceImage::new(restoring(&image), workspace.clone(), templates.clone());
                    fresh.remove_image()?;
                    if let Err(e) = fill(stored, Some(fresh.image().to_path_buf()), &workspace, &templates, quota, how)
                    {
                        let _ = fresh.remove_image();
                        return Err(e);
                    }
                    WorkspaceImage::new(image.clone(), workspace.clone(), templates.clone()).remove_image()?;
                    fresh.move_to(&image)
                }
                (None, Stored::Tree(_)) => {
                    // Filled beside the workspace and exchanged with it in one rename: a
                    // restore that fails leaves the workspace as it was.
                    let fresh = restoring(&workspace);
                    remove_dir_all_quiet(&fresh)?;
                    let swapped = fill(stored, None, &fresh, &templates, None, how)
                        .and_then(|()| exchange(&fresh, &workspace));
                    // It holds the workspace's former files now, or what a failed restore
                    // filled.
                    let removed = remove_dir_all_quiet(&fresh);
                    swapped.and(removed)
                }
                (image, _) => fill(stored, image, &workspace, &templates, quota, how),
            }
        })
        .await
        .map_err(|e| failed_by("the restore task failed", e))?
        .map_err(failed)
    }

    /// Deletes a snapshot's files.
    pub(super) async fn delete_snapshot_files(&self, snapshot: &SnapshotRef) -> Result<(), DriverError> {
        self.forget_forks_of(snapshot).await;
        let files = self.snapshot_files();
        let snapshot = snapshot.clone();
        tokio::task::spawn_blocking(move || files.delete(&snapshot))
            .await
            .map_err(|e| failed_by("the delete task failed", e))?
            .map_err(failed)
    }
}

fn not_mounted(sandbox: &SandboxId) -> DriverError {
    failed(format!("no process of sandbox {sandbox} shows its workspace mounted"))
}

/// Thaws a frozen sandbox when dropped.
struct Thaw<'a> {
    cgroups: &'a super::limits::CgroupMode,
    sandbox: &'a SandboxId,
}

impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.cgroups.thaw(self.sandbox.as_str()) {
            tracing::error!(sandbox = %self.sandbox, error = %e, "could not thaw the sandbox after its snapshot");
        }
    }
}

/// How a filled workspace's files reach their owner.
#[derive(Debug, Clone, Copy)]
struct Fill {
    /// The workspace's uid and gid.
    owner: (u32, u32),
    /// Whether an image's files are given here (on the host, mounted for the while), or
    /// left for [`BwrapDriver::give_to_owner`] once the sandbox has mounted it.
    image_here: bool,
    /// Whether a new image is synced to disk.
    synced: bool,
}

/// Puts `stored` in place as a workspace: into `image` (for `quota`) when given, else
/// into the directory `workspace`; every file of the source's owner given to the owner.
fn fill(
    stored: Stored,
    image: Option<PathBuf>,
    workspace: &Path,
    templates: &Path,
    quota: Option<u64>,
    how: Fill,
) -> Result<(), String> {
    let Fill { owner, image_here, synced } = how;
    match (stored, image, quota) {
        (Stored::Image { image: source, quota: made_for, .. }, Some(image), Some(quota)) => {
            let ws =
                WorkspaceImage::new(image, workspace.to_path_buf(), templates.to_path_buf()).synced(synced);
            ws.copy_from(&source, made_for)?;
            if image_here {
                ws.with_mounted(|root| snapshot_files::rechown(root, owner))?;
            }
            // Grown to the quota now, not at the start (which would wait for nothing).
            ws.prepare_image(quota).map(|_| ())
        }
        (Stored::Tree(tree), Some(image), Some(quota)) => {
            let ws =
                WorkspaceImage::new(image, workspace.to_path_buf(), templates.to_path_buf()).synced(synced);
            ws.prepare_image(quota)?;
            ws.with_mounted(|root| {
                std::os::unix::fs::chown(root, Some(owner.0), Some(owner.1))
                    .map_err(|e| format!("cannot give {} to its uid: {e}", root.display()))?;
                copy_into(&tree, root)?;
                snapshot_files::rechown(root, owner)
            })
        }
        (Stored::Tree(tree), None, None) => {
            copy_into(&tree, workspace)?;
            snapshot_files::rechown(workspace, owner)
        }
        (Stored::Image { .. }, _, _) | (_, None, Some(_)) | (_, Some(_), None) => {
            Err("the snapshot's files do not fit this workspace".to_owned())
        }
    }
}

/// Copies the contents of `tree` into the directory `dir`, made when missing (the
/// directory keeps its own owner until [`snapshot_files::rechown`]: `cp -a` sets the tree's).
fn copy_into(tree: &Path, dir: &Path) -> Result<(), String> {
    snapshot_files::copy_tree(tree, dir)
}

/// Where a restore fills what replaces `path` once it is whole: beside it.
fn restoring(path: &Path) -> PathBuf {
    let mut beside = path.as_os_str().to_owned();
    beside.push(".restoring");
    PathBuf::from(beside)
}

/// Swaps two directories in one step (`renameat2(RENAME_EXCHANGE)`).
fn exchange(a: &Path, b: &Path) -> Result<(), String> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE)
        .map_err(|e| format!("cannot put {} in place of {}: {e}", a.display(), b.display()))
}
