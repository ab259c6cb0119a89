//! Snapshots, forks and restores of container workspaces. A workspace with a quota is an
//! image mounted on the host ([`super::quota`]): a snapshot pauses the container (the
//! engine freezes its cgroup), syncs the mounted filesystem, copies the image
//! ([`crate::snapshot_files`]) and unpauses it. A workspace without a quota is an engine
//! volume the driver does not copy: snapshots need a quota on this driver (the default
//! policy has one).

use domain::SandboxId;
use ports::driver::{DriverError, ProvisionSpec, SnapshotRef};

use super::{ContainerDriver, failed, failed_by};
use crate::snapshot_files::{self, SnapshotFiles, Stored};
use crate::workspace_image::WorkspaceImage;

impl ContainerDriver {
    fn snapshot_files(&self) -> SnapshotFiles {
        SnapshotFiles::new(self.config.state_dir.join("snapshots"))
    }

    /// The snapshot's image and the quota it was made for, or why it has none.
    fn snapshot_image(&self, snapshot: &SnapshotRef) -> Result<(std::path::PathBuf, u64), DriverError> {
        match self.snapshot_files().stored(snapshot).map_err(failed)? {
            Some(Stored::Image { image, quota, .. }) => Ok((image, quota)),
            Some(Stored::Tree(_)) => Err(DriverError::Conflict(format!(
                "snapshot {} holds a workspace without a quota, which the container driver cannot start from",
                snapshot.id
            ))),
            None => {
                Err(DriverError::NoSuchPath(format!("snapshot {} has no files on this host", snapshot.id)))
            }
        }
    }

    /// The workspace image of a sandbox that has one.
    fn image_of(&self, sandbox: &SandboxId) -> Result<WorkspaceImage, DriverError> {
        let volume = self.owner(sandbox).ok_or_else(|| DriverError::NotFound(sandbox.clone()))?.volume;
        let ws = self.workspace_image(&volume);
        if ws.image.exists() {
            Ok(ws)
        } else {
            Err(DriverError::Unsupported(format!(
                "sandbox {sandbox} has a workspace without a quota (an engine volume): the container driver snapshots \
                 workspaces with a quota only"
            )))
        }
    }

    pub(super) async fn snapshot_locked(
        &self,
        sandbox: &SandboxId,
        target: &SnapshotRef,
        quota_left: Option<u64>,
    ) -> Result<u64, DriverError> {
        if !self.state(sandbox).is_dir() {
            return Err(DriverError::NotFound(sandbox.clone()));
        }
        let ws = self.image_of(sandbox)?;
        let quota = ws
            .quota()
            .ok_or_else(|| failed(format!("the workspace image of {sandbox} has no recorded quota")))?;
        snapshot_files::fits(&ws.image, quota_left)?;
        let running = !self.is_suspended(sandbox);
        let name = self.name(sandbox);
        if running {
            self.docker()
                .await?
                .pause_container(&name)
                .await
                .map_err(|e| self.engine("cannot pause the sandbox's container", e))?;
        }
        let files = self.snapshot_files();
        let (target, mounted) = (target.clone(), ws.mountpoint.clone());
        let taken = tokio::task::spawn_blocking(move || {
            // Frozen (its writes on the device, its journal clean) while it is copied.
            let _frozen = if running { Some(snapshot_files::freeze_fs(&mounted)?) } else { None };
            files.take_image(&target, &ws.image, quota, None)
        })
        .await
        .map_err(|e| failed_by("the snapshot task failed", e));
        if running && let Err(e) = self.docker().await?.unpause_container(&name).await {
            tracing::error!(sandbox = %sandbox, error = %e, "could not unpause the sandbox after its snapshot");
        }
        taken?.map_err(failed)
    }

    /// Puts a fork's snapshot image in place of the new workspace's (before it is
    /// mounted: [`ContainerDriver::give_to_owner`] gives its files to the container's user
    /// once it is); returns the quota the workspace then has.
    pub(super) async fn seed_fork(
        &self,
        spec: &ProvisionSpec,
        volume: &str,
    ) -> Result<Option<u64>, DriverError> {
        let Some(snapshot) = &spec.from_snapshot else { return Ok(spec.workspace_bytes) };
        let (source, made_for) = self.snapshot_image(snapshot)?;
        let ws = self.workspace_image(volume).synced(spec.durability == domain::Durability::Durable);
        if ws.image.exists() {
            return Err(DriverError::Conflict(format!(
                "{} already has a workspace; a fork starts a new one (restore replaces an existing one)",
                spec.key
            )));
        }
        tokio::task::spawn_blocking(move || ws.copy_from(&source, made_for))
            .await
            .map_err(|e| failed_by("the fork task failed", e))?
            .map_err(failed)?;
        Ok(Some(spec.workspace_bytes.map_or(made_for, |q| q.max(made_for))))
    }

    /// Gives a fork's files, mounted on the host at `mountpoint`, to the container's user
    /// (nothing when the snapshot's were that user's already: one `lstat`).
    pub(super) async fn give_to_owner(&self, mountpoint: std::path::PathBuf) -> Result<(), DriverError> {
        let owner = self.user_ids()?;
        tokio::task::spawn_blocking(move || snapshot_files::rechown(&mountpoint, owner))
            .await
            .map_err(|e| failed_by("the fork task failed", e))?
            .map_err(|e| failed(format!("cannot give the fork's files to its user: {e}")))
    }

    pub(super) async fn restore_locked(
        &self,
        sandbox: &SandboxId,
        snapshot: &SnapshotRef,
    ) -> Result<(), DriverError> {
        if !self.state(sandbox).is_dir() {
            return Err(DriverError::NotFound(sandbox.clone()));
        }
        if !self.is_suspended(sandbox) {
            return Err(DriverError::Conflict(format!(
                "sandbox {sandbox} is running; it is suspended before a restore"
            )));
        }
        let ws = self.image_of(sandbox)?;
        let (source, made_for) = self.snapshot_image(snapshot)?;
        let quota = ws.quota().unwrap_or(made_for).max(made_for);
        let owner = self.user_ids()?;
        tokio::task::spawn_blocking(move || {
            ws.copy_from(&source, made_for)?;
            ws.with_mounted(|root| snapshot_files::rechown(root, owner))?;
            ws.prepare_image(quota).map(|_| ())
        })
        .await
        .map_err(|e| failed_by("the restore task failed", e))?
        .map_err(failed)
    }

    pub(super) async fn delete_snapshot_files(&self, snapshot: &SnapshotRef) -> Result<(), DriverError> {
        let (files, snapshot) = (self.snapshot_files(), snapshot.clone());
        tokio::task::spawn_blocking(move || files.delete(&snapshot))
            .await
            .map_err(|e| failed_by("the delete task failed", e))?
            .map_err(failed)
    }
}
