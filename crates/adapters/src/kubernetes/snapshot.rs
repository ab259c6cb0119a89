//! Snapshots, forks and restores on Kubernetes, copied through the supervisor: a cluster's
//! `VolumeSnapshot` would need a CSI driver with snapshot support and the snapshot
//! controller, which many clusters lack, and cannot be restored into an ephemeral volume;
//! the supervisor's channel works on every cluster. A snapshot stops the pod's other
//! processes (the supervisor, its pid namespace's init, sends them `SIGSTOP` and, when the
//! server's freeze connection ends, `SIGCONT`), streams `/workspace` out as a tar archive
//! into `<snapshot_dir>/<org>/<id>/workspace.tar` on the server, and lets them go on. A
//! fork unpacks that archive into its new pod's workspace once the pod is ready; a restore
//! deletes the pod (its processes end), records the snapshot as pending, and the next
//! provision (the resume) empties the workspace and unpacks the archive before it is used.
//! Cost: a copy of the bytes the workspace holds, both ways. An archive is counted as it
//! is written and refused once it passes what the org's snapshot quota leaves or what the
//! workspace can hold (its apparent size: holes and hard links are copied whole). With
//! several replicas the snapshot directory must be shared (a `ReadWriteMany` volume).

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use domain::{SandboxId, SandboxPath};
use ports::driver::{
    ByteSource, DriverError, ProvisionSpec, ReadOutcome, SnapshotBudget, SnapshotRef, SourceError,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{CONNECT_TIMEOUT, KubeDriver, failed, failed_by};
use crate::supervisor_link::client;
use crate::supervisor_link::ops::{self, Host};

const ARCHIVE: &str = "workspace.tar";
/// Where restores wait for the sandbox's next pod.
const PENDING: &str = ".pending";

/// The longest a copy may take: a little less than the supervisor holds a freeze.
pub(super) const FREEZE_HELD: std::time::Duration =
    std::time::Duration::from_millis(supervisor::protocol::MAX_FREEZE_MS.saturating_sub(5_000));

/// One tar header (512 bytes, and up to 511 of padding) per inode, at ext4's default of
/// one inode per 16 KiB: an eighth of the workspace's size.
const HEADERS_PER_WORKSPACE_BYTE: u64 = 8;

/// The bound an archive is held to, and which one it is.
#[derive(Debug, Clone, Copy)]
struct ArchiveCap {
    bytes: u64,
    /// The org's snapshot quota is the lower bound (else the workspace's size).
    by_quota: bool,
}

impl ArchiveCap {
    fn passed(self) -> DriverError {
        if self.by_quota {
            DriverError::ResourceExhausted(format!(
                "the workspace's archive passed {} bytes, what the org's snapshot quota leaves",
                self.bytes
            ))
        } else {
            DriverError::TooLarge(format!(
                "the workspace's archive passed {} bytes, more than its workspace can hold (on Kubernetes a \
                 snapshot copies each file's apparent size: a sparse file's holes and each hard link whole)",
                self.bytes
            ))
        }
    }
}

fn workspace() -> SandboxPath {
    SandboxPath::parse(domain::split::WORKSPACE_PATH)
        .unwrap_or_else(|_| unreachable!("the workspace is a path"))
}

/// A file read in chunks, as the bytes of an upload.
struct FileSource {
    file: tokio::fs::File,
}

#[async_trait]
impl ByteSource for FileSource {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        let mut buf = vec![0u8; 256 << 10];
        let n = self
            .file
            .read(&mut buf)
            .await
            .map_err(|e| SourceError(format!("cannot read the snapshot: {e}")))?;
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n);
        Ok(Some(buf))
    }
}

impl KubeDriver {
    fn snapshot_root(&self) -> Result<&Path, DriverError> {
        self.config.snapshot_dir.as_deref().ok_or_else(|| {
            DriverError::Unsupported("this Kubernetes driver has no snapshot directory".to_owned())
        })
    }

    fn archive(root: &Path, snapshot: &SnapshotRef) -> PathBuf {
        root.join(snapshot.org.as_str()).join(snapshot.id.as_str()).join(ARCHIVE)
    }

    fn pending(root: &Path, sandbox: &SandboxId) -> PathBuf {
        root.join(PENDING).join(sandbox.as_str())
    }

    /// The most bytes a snapshot's archive may hold: what the org's quota leaves, and no
    /// more than the workspace can hold with a tar header for each of its inodes. The
    /// archive comes from inside the sandbox (a supervisor there may be hostile) and holds
    /// each file's apparent size (a sparse file's holes, a hard link's data again), so it
    /// is counted as it is written, never trusted to be what the workspace uses.
    fn archive_cap(&self, budget: SnapshotBudget) -> ArchiveCap {
        let workspace = budget.workspace_bytes.unwrap_or(self.config.workspace_size_bytes);
        let own = workspace.saturating_add(workspace / HEADERS_PER_WORKSPACE_BYTE).saturating_add(1 << 20);
        match budget.quota_left {
            Some(left) if left < own => ArchiveCap { bytes: left, by_quota: true },
            _ => ArchiveCap { bytes: own, by_quota: false },
        }
    }

    /// Takes a snapshot (the sandbox's lock held by the caller).
    pub(super) async fn snapshot_locked(
        &self,
        sandbox: &SandboxId,
        target: &SnapshotRef,
        budget: SnapshotBudget,
    ) -> Result<u64, DriverError> {
        let cap = self.archive_cap(budget);
        let root = self.snapshot_root()?.to_path_buf();
        let socket = Host::socket(self, sandbox).await?;
        let frozen = match client::freeze(&socket, CONNECT_TIMEOUT).await {
            Ok(frozen) => frozen,
            Err(e) => return Err(self.failure(sandbox, None, e).await),
        };
        let dir = root.join(target.org.as_str());
        let partial = dir.join(format!(".{}.partial", target.id));
        let done = async {
            tokio::fs::create_dir_all(&partial)
                .await
                .map_err(|e| failed_by("cannot create the snapshot's directory", e))?;
            let mut out = tokio::fs::File::create(partial.join(ARCHIVE))
                .await
                .map_err(|e| failed_by("cannot create the snapshot's archive", e))?;
            let mut stream = ops::archive_out(self, sandbox, &workspace()).await?;
            let mut written = 0u64;
            while let Some(chunk) = stream.next().await? {
                written = written.saturating_add(u64::try_from(chunk.len()).unwrap_or(u64::MAX));
                if written > cap.bytes {
                    return Err(cap.passed());
                }
                out.write_all(&chunk)
                    .await
                    .map_err(|e| failed_by("cannot write the snapshot's archive", e))?;
            }
            out.flush().await.map_err(|e| failed_by("cannot write the snapshot's archive", e))?;
            Ok::<_, DriverError>(())
        };
        // The supervisor lets the processes go on after `MAX_FREEZE_MS` whatever the
        // connection: a copy that takes longer would not be of one instant. Also what
        // bounds a supervisor that sends its archive slowly.
        let limit = self.config.snapshot_copy_timeout.min(FREEZE_HELD);
        let done = tokio::time::timeout(limit, done).await.unwrap_or_else(|_| {
            Err(failed(format!(
                "the workspace could not be copied within the {} ms its processes may be stopped; \
                 take the snapshot with fewer files in the workspace",
                limit.as_millis()
            )))
        });
        drop(frozen);
        let placed = done.and_then(|()| {
            std::fs::rename(&partial, dir.join(target.id.as_str()))
                .map_err(|e| failed_by(format!("cannot place snapshot {}", target.id), e))
        });
        if let Err(e) = placed {
            let _ = tokio::fs::remove_dir_all(&partial).await;
            return Err(e);
        }
        Ok(crate::snapshot_files::allocated_bytes(&dir.join(target.id.as_str())))
    }

    /// Unpacks `snapshot`'s archive into the workspace of the ready sandbox, emptied first
    /// when `empty_first` (a restore).
    async fn unpack(
        &self,
        sandbox: &SandboxId,
        snapshot: &SnapshotRef,
        empty_first: bool,
    ) -> Result<(), DriverError> {
        let root = self.snapshot_root()?;
        let archive = Self::archive(root, snapshot);
        let file = tokio::fs::File::open(&archive).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                DriverError::NoSuchPath(format!("snapshot {} has no files on this server", snapshot.id))
            } else {
                failed_by("cannot open the snapshot's archive", e)
            }
        })?;
        if empty_first {
            let ws = workspace();
            if let ReadOutcome::Directory(mut entries) = ops::read_path(self, sandbox, &ws).await? {
                let mut names = Vec::new();
                while let Some(batch) = entries.next().await? {
                    names.extend(batch.into_iter().map(|e| e.name));
                }
                for name in names {
                    let path = SandboxPath::parse(&format!("{}/{name}", domain::split::WORKSPACE_PATH))
                        .map_err(|e| failed(format!("a workspace entry {name:?}: {e}")))?;
                    ops::delete_path(self, sandbox, &path, true).await?;
                }
            }
        }
        ops::archive_in(self, sandbox, &workspace(), Box::new(FileSource { file })).await?;
        Ok(())
    }

    /// After a provision's pod is ready: a fork's snapshot, or a pending restore, unpacked.
    pub(super) async fn seed(&self, spec: &ProvisionSpec) -> Result<(), DriverError> {
        let id = spec.sandbox_id();
        if let Some(snapshot) = &spec.from_snapshot {
            return self.unpack(id, snapshot, false).await;
        }
        let Some(root) = self.config.snapshot_dir.as_deref() else { return Ok(()) };
        let pending = Self::pending(root, id);
        let Ok(text) = tokio::fs::read_to_string(&pending).await else { return Ok(()) };
        let snapshot = text
            .trim()
            .split_once('/')
            .and_then(|(org, snp)| {
                Some(SnapshotRef {
                    org: domain::OrgId::parse(org).ok()?,
                    id: domain::SnapshotId::parse(snp).ok()?,
                })
            })
            .ok_or_else(|| failed(format!("a corrupt pending restore of {id}")))?;
        self.unpack(id, &snapshot, true).await?;
        let _ = tokio::fs::remove_file(&pending).await;
        Ok(())
    }

    /// A restore: records the snapshot for the sandbox's next pod and ends this one (the
    /// sandbox's lock held by the caller).
    pub(super) async fn restore_locked(
        &self,
        sandbox: &SandboxId,
        snapshot: &SnapshotRef,
    ) -> Result<(), DriverError> {
        let root = self.snapshot_root()?;
        if !Self::archive(root, snapshot).is_file() {
            return Err(DriverError::NoSuchPath(format!(
                "snapshot {} has no files on this server",
                snapshot.id
            )));
        }
        let pending = Self::pending(root, sandbox);
        if let Some(dir) = pending.parent() {
            tokio::fs::create_dir_all(dir).await.map_err(|e| failed_by("cannot record the restore", e))?;
        }
        tokio::fs::write(&pending, format!("{}/{}", snapshot.org, snapshot.id))
            .await
            .map_err(|e| failed_by("cannot record the restore", e))?;
        self.forget(sandbox);
        self.delete_pod(&self.name(sandbox)).await
    }

    pub(super) async fn delete_snapshot_files(&self, snapshot: &SnapshotRef) -> Result<(), DriverError> {
        let Some(root) = self.config.snapshot_dir.as_deref() else { return Ok(()) };
        let dir = root.join(snapshot.org.as_str()).join(snapshot.id.as_str());
        match tokio::fs::remove_dir_all(&dir).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed_by(format!("cannot delete {}", dir.display()), e)),
        }
    }
}
