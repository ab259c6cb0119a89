//! The bubblewrap driver's workspace quota: a workspace with a quota is an ext4 image in
//! the data dir (root only), loop-mounted on the workspace directory the sandbox binds
//! (see [`crate::workspace_image`] for why this mechanism, and how the quota is made
//! exact). Mounted before the sandbox starts, unmounted once its processes are gone
//! (suspend, deprovision); an ephemeral workspace's image is deleted with it, a durable
//! one's stays for the key's next sandbox.

use domain::Durability;
use ports::driver::{DriverError, ProvisionSpec};

use super::workspace::{IdMode, SandboxMeta};
use super::{BwrapDriver, failed};
use crate::workspace_image::{Prepared, WorkspaceImage, used_bytes};

impl BwrapDriver {
    /// The uid and gid a workspace's root belongs to.
    fn workspace_owner(&self, meta: &SandboxMeta) -> (u32, u32) {
        match self.ids {
            IdMode::PerWorkspace(_) => (meta.host_id, meta.host_id),
            IdMode::Own { uid, gid } => (uid, gid),
        }
    }

    /// Mounts the workspace's image for `spec.workspace_bytes` (creating or growing it),
    /// and records it in the sandbox's record. A workspace made before quotas (files and
    /// no image) keeps working without one (logged).
    pub(super) async fn mount_workspace(
        &self,
        spec: &ProvisionSpec,
        mut meta: SandboxMeta,
    ) -> Result<SandboxMeta, DriverError> {
        let Some(quota) = spec.workspace_bytes else {
            meta.workspace_image = None;
            return Ok(meta);
        };
        let id = spec.sandbox_id();
        let image = self.layout.workspace_image(id, &spec.key, spec.durability).map_err(failed)?;
        let ws = WorkspaceImage::new(image.clone(), meta.workspace.clone(), self.layout.image_templates())
            .synced(spec.durability == Durability::Durable);
        let owner = self.workspace_owner(&meta);
        let prepared = tokio::task::spawn_blocking(move || ws.prepare(quota, owner))
            .await
            .map_err(|e| failed(format!("the workspace mount task failed: {e}")))?
            .map_err(|e| failed(format!("cannot set up the workspace quota: {e}")))?;
        meta.workspace_image = match prepared {
            Prepared::Created | Prepared::Existing => Some(image),
            Prepared::Legacy => {
                tracing::warn!(
                    sandbox = %id,
                    workspace = %meta.workspace.display(),
                    "a workspace made before quotas: it keeps working, without a quota"
                );
                None
            }
        };
        self.layout.rewrite_meta(id, &meta).map_err(failed)?;
        Ok(meta)
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
            .map_err(|e| failed(format!("the workspace unmount task failed: {e}")))?
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

    /// The bytes the sandbox's workspace holds, when it has an image mounted.
    pub(super) fn usage_of(&self, sandbox: &domain::SandboxId) -> Option<u64> {
        let meta = self.layout.read_meta(sandbox).ok().flatten()?;
        meta.workspace_image.as_ref()?;
        used_bytes(&meta.workspace)
    }
}
