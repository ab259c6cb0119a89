//! The container driver's workspace quota, and what it keeps of a suspended sandbox.
//!
//! A workspace with a quota is an ext4 image on the host (root only, under the state
//! dir), loop-mounted on a host directory that the container binds at `/workspace`, in
//! place of a named volume (see [`crate::workspace_image`] for why, and how the quota is
//! exact). The image and the mount are named after the workspace volume the sandbox would
//! otherwise have (by key for a durable workspace, by sandbox for an ephemeral one), so a
//! durable workspace comes back for its key. The engine must run on this host (as the
//! supervisor's binds already require) to see the mount.
//!
//! A suspended sandbox is a removed container with its host state kept: a `suspended`
//! marker (an exec is refused, not mistaken for a dead sandbox), `owner.json` (whose
//! workspace it is: a later provision under another key or org is refused), the token
//! directory, and the workspace (volume, or image unmounted).

use std::path::PathBuf;

use domain::{Durability, SandboxId};
use ports::driver::{DriverError, ProvisionSpec};
use serde::{Deserialize, Serialize};

use super::{ContainerDriver, failed, failed_by};
use crate::workspace_image::{WorkspaceImage, used_bytes};

/// Whose workspace a sandbox's host state holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Owner {
    pub org: String,
    pub key: String,
    pub durability: Durability,
    /// The workspace volume's name (also the name of its image and mount).
    pub volume: String,
}

impl Owner {
    fn of(spec: &ProvisionSpec, volume: &str) -> Self {
        Self {
            org: spec.key.org().to_string(),
            key: spec.key.to_string(),
            durability: spec.durability,
            volume: volume.to_owned(),
        }
    }

    /// Whether `spec` may (re)provision a sandbox of this owner: its own key; or, for a
    /// warm sandbox (provisioned under its org's pool key, then adopted by a claim), any key
    /// of its org.
    fn admits(&self, spec: &ProvisionSpec) -> bool {
        let other = Self::of(spec, &self.volume);
        let warm = domain::policy::warm_key(spec.key.org()).to_string();
        self.durability == other.durability && (self.key == other.key || self.key == warm)
    }
}

impl ContainerDriver {
    /// The image and mount of the workspace named `volume`.
    pub(super) fn workspace_image(&self, volume: &str) -> WorkspaceImage {
        let state = &self.config.state_dir;
        WorkspaceImage::new(
            state.join("images").join(format!("{volume}.img")),
            state.join("workspaces").join(volume),
            state.join("images/templates"),
        )
    }

    fn marker(&self, sandbox: &SandboxId) -> PathBuf {
        self.state(sandbox).join("suspended")
    }

    fn owner_file(&self, sandbox: &SandboxId) -> PathBuf {
        self.state(sandbox).join("owner.json")
    }

    /// Refuses a provision of a sandbox whose kept state belongs to another workspace
    /// owner; records the owner otherwise.
    pub(super) fn claim_state(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        if let Ok(bytes) = std::fs::read(self.owner_file(id)) {
            let owner: Owner = serde_json::from_slice(&bytes)
                .map_err(|e| failed_by(format!("corrupt owner of sandbox {id}"), e))?;
            if !owner.admits(spec) {
                return Err(failed(format!(
                    "sandbox {id} is already provisioned for {} ({})",
                    owner.key, owner.durability
                )));
            }
        }
        Ok(())
    }

    /// The recorded owner of a sandbox's host state.
    pub(super) fn owner(&self, sandbox: &SandboxId) -> Option<Owner> {
        serde_json::from_slice(&std::fs::read(self.owner_file(sandbox)).ok()?).ok()
    }

    /// Writes the owner (after the state dir exists) and clears a suspension.
    pub(super) fn record_state(&self, spec: &ProvisionSpec, volume: &str) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        let json = serde_json::to_vec(&Owner::of(spec, volume))
            .map_err(|e| failed_by("cannot encode the owner", e))?;
        std::fs::write(self.owner_file(id), json).map_err(|e| failed_by("cannot record the owner", e))?;
        match std::fs::remove_file(self.marker(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed_by(format!("cannot clear the suspension of {id}"), e)),
        }
    }

    /// Refuses an operation on a suspended sandbox (its processes are gone on purpose).
    pub(super) fn refuse_suspended(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        if self.is_suspended(sandbox) {
            return Err(failed(format!(
                "sandbox {sandbox} is suspended; provisioning it with a newer epoch resumes it"
            )));
        }
        Ok(())
    }

    /// Whether the sandbox is suspended.
    pub(super) fn is_suspended(&self, sandbox: &SandboxId) -> bool {
        self.marker(sandbox).exists()
    }

    /// Marks the sandbox suspended.
    pub(super) fn mark_suspended(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        std::fs::write(self.marker(sandbox), b"")
            .map_err(|e| failed_by(format!("cannot mark {sandbox} suspended"), e))
    }

    /// The sandboxes suspended on this host (their containers are gone).
    pub(super) fn suspended(&self) -> Vec<SandboxId> {
        let Ok(entries) = std::fs::read_dir(&self.config.state_dir) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| SandboxId::parse(e.file_name().to_string_lossy().into_owned()).ok())
            .filter(|id| self.is_suspended(id))
            .collect()
    }

    /// Mounts the workspace image of `volume` for `quota` (creating or growing it; synced to
    /// disk when `durable`); its mount directory, and whether the image was created.
    pub(super) async fn mount_image(
        &self,
        volume: &str,
        quota: u64,
        durable: bool,
    ) -> Result<(PathBuf, bool), DriverError> {
        let ws = self.workspace_image(volume).synced(durable);
        std::fs::create_dir_all(&ws.mountpoint)
            .map_err(|e| failed_by(format!("cannot create {}", ws.mountpoint.display()), e))?;
        let (uid, gid) = self.user_ids()?;
        let mountpoint = ws.mountpoint.clone();
        let prepared = tokio::task::spawn_blocking(move || ws.prepare(quota, (uid, gid)))
            .await
            .map_err(|e| failed_by("the workspace mount task failed", e))?
            .map_err(|e| failed(format!("cannot set up the workspace quota: {e}")))?;
        Ok((mountpoint, prepared == crate::workspace_image::Prepared::Created))
    }

    /// Unmounts the workspace image of `volume` (its files stay); when `delete`, the image
    /// and its mount directory go too. `Ok` when it has no image.
    pub(super) async fn release_image(&self, volume: &str, delete: bool) -> Result<(), DriverError> {
        let ws = self.workspace_image(volume);
        if !ws.image.exists() {
            return Ok(());
        }
        tokio::task::spawn_blocking(move || if delete { ws.remove() } else { ws.unmount() })
            .await
            .map_err(|e| failed_by("the workspace unmount task failed", e))?
            .map_err(failed)
    }

    /// The bytes the workspace image of `volume` holds, when it is mounted.
    pub(super) fn image_usage(&self, volume: &str) -> Option<u64> {
        used_bytes(&self.workspace_image(volume).mountpoint)
    }
}
