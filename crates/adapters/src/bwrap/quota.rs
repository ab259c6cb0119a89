//! The bubblewrap driver's workspace quota: a workspace with a quota is an ext4 image in
//! the data dir (root only), loop-mounted on the workspace directory the sandbox binds
//! (see [`crate::workspace_image`] for why this mechanism, and how the quota is made
//! exact). The image is bound to a loop device here and mounted by the sandbox's start in
//! a mount namespace of its own (`spawn::WorkspaceMount`), never in the host's: the
//! mount goes when the sandbox's processes are gone (suspend, deprovision), and the device
//! detaches with it. An ephemeral workspace's image is deleted with it, a durable one's
//! stays for the key's next sandbox.

use domain::Durability;
use ports::driver::{DriverError, ProvisionSpec};

use super::spawn::Device;
use super::workspace::{IdMode, SandboxMeta};
use super::{BwrapDriver, failed, failed_by};
use crate::workspace_image::loop_device::Attached;
use crate::workspace_image::{Prepared, WorkspaceImage, used_bytes};

impl BwrapDriver {
    /// The uid and gid a workspace's root belongs to.
    pub(super) fn workspace_owner(&self, meta: &SandboxMeta) -> (u32, u32) {
        self.owner_of(meta.host_id)
    }

    /// The uid and gid the workspace of a sandbox with host uid `host_id` belongs to.
    pub(super) fn owner_of(&self, host_id: u32) -> (u32, u32) {
        match self.ids {
            IdMode::PerWorkspace(_) => (host_id, host_id),
            IdMode::Own { uid, gid } => (uid, gid),
        }
    }

    /// Prepares the workspace's image for `spec.workspace_bytes` (creating or growing it),
    /// records it in the sandbox's record, and binds it to a loop device that the start
    /// mounts in the sandbox's own mount namespace (`spawn::WorkspaceMount`); the device
    /// detaches by itself once the returned handle is dropped and the sandbox's mount is
    /// gone. A workspace made before quotas (files and no image) keeps working without one
    /// (logged).
    ///
    /// `quota` is the policy's (or a fork's, [`BwrapDriver::fork_quota`]); a workspace that
    /// has an image keeps it when `quota` is `None` (its files are in it).
    pub(super) async fn prepare_workspace(
        &self,
        spec: &ProvisionSpec,
        quota: Option<u64>,
        mut meta: SandboxMeta,
    ) -> Result<(SandboxMeta, Option<(Attached, Device)>), DriverError> {
        let id = spec.sandbox_id();
        let image = self.layout.workspace_image(id, &spec.key, spec.durability).map_err(failed)?;
        let ws = WorkspaceImage::new(image.clone(), meta.workspace.clone(), self.layout.image_templates())
            .synced(spec.durability == Durability::Durable);
        let Some(quota) = quota.or_else(|| ws.quota().filter(|_| image.exists())) else {
            meta.workspace_image = None;
            return Ok((meta, None));
        };
        // A legacy workspace (files, no image) is not bound: `None`.
        let attached = tokio::task::spawn_blocking(move || match ws.prepare_image(quota)? {
            Prepared::Legacy => Ok::<_, String>(None),
            Prepared::Created | Prepared::Existing => ws.attach().map(Some),
        })
        .await
        .map_err(|e| failed_by("the workspace image task failed", e))?
        .map_err(|e| failed(format!("cannot set up the workspace quota: {e}")))?;
        let (uid, gid) = self.workspace_owner(&meta);
        let attached = match attached {
            Some(attached) => {
                meta.workspace_image = Some(image);
                let device = Device { number: attached.number(), uid, gid };
                Some((attached, device))
            }
            None => {
                tracing::warn!(
                    sandbox = %id,
                    workspace = %meta.workspace.display(),
                    "a workspace made before quotas: it keeps working, without a quota"
                );
                meta.workspace_image = None;
                None
            }
        };
        self.layout.rewrite_meta(id, &meta).map_err(failed)?;
        Ok((meta, attached))
    }

    /// Unmounts the workspace of `meta` (its files stay in the image); when `delete`, the
    /// image and the workspace directory go too.
    pub(super) async fn release_workspace(
        &self,
        meta: &SandboxMeta,
        delete: bool,
    ) -> Result<(), DriverError> {
        let Some(image) = meta.workspace_image.clone() else { return Ok(()) };
        let ws = WorkspaceImage::new(image, meta.workspace.clone(), self.layout.image_templates());
        tokio::task::spawn_blocking(move || if delete { ws.remove() } else { ws.unmount() })
            .await
            .map_err(|e| failed_by("the workspace unmount task failed", e))?
            .map_err(failed)
    }

    /// Removes the image an ephemeral sandbox without a record may have left.
    pub(super) async fn release_orphan_image(&self, sandbox: &domain::SandboxId) {
        let workspace = self.layout.ephemeral_workspace(sandbox);
        let key = domain::SandboxKey::Workflow {
            org: domain::OrgId::parse("orphan").unwrap_or_else(|_| unreachable!("a valid id")),
            execution_id: domain::ExecutionId::parse("orphan").unwrap_or_else(|_| unreachable!("a valid id")),
        };
        let Ok(image) = self.layout.workspace_image(sandbox, &key, Durability::Ephemeral) else { return };
        let ws = WorkspaceImage::new(image, workspace, self.layout.image_templates());
        let _ = tokio::task::spawn_blocking(move || ws.remove()).await;
    }

    /// The bytes the sandbox's workspace holds, when it has an image mounted: read through
    /// `/proc/<pid>/root` of the sandbox's outer bubblewrap process, whose mount namespace
    /// holds the mount (the host's does not; the sandbox's own processes see it at
    /// `/workspace`, which is not where `meta.workspace` points for them).
    pub(super) fn usage_of(&self, sandbox: &domain::SandboxId) -> Option<u64> {
        let meta = self.layout.read_meta(sandbox).ok().flatten()?;
        meta.workspace_image.as_ref()?;
        used_bytes(&self.mounted_workspace(sandbox, &meta)?)
    }

    /// Where the server reaches the workspace's filesystem as the sandbox mounted it: at
    /// `meta.workspace` under `/proc/<pid>/root` of one of its processes (see
    /// [`BwrapDriver::usage_of`]); `None` when none shows it mounted.
    pub(super) fn mounted_workspace(
        &self,
        sandbox: &domain::SandboxId,
        meta: &SandboxMeta,
    ) -> Option<std::path::PathBuf> {
        let inside = meta.workspace.strip_prefix("/").ok()?;
        self.cgroup_pids(sandbox)?
            .into_iter()
            .map(|pid| std::path::Path::new(&format!("/proc/{pid}/root")).join(inside))
            .find(|path| used_bytes(path).is_some())
    }
}
