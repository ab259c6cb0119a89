//! Snapshots in the store: the records (who may use one, where it came from, its size);
//! the files are the driver's ([`crate::SandboxDriver::snapshot`]).

use async_trait::async_trait;
use domain::{IdentityId, OrgId, Snapshot, SnapshotId};

use crate::Cause;

/// What the org's snapshots hold now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotUsage {
    /// How many.
    pub count: u64,
    /// Their bytes together.
    pub bytes: u64,
}

/// Why a snapshot store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotStoreError {
    /// Adding it would pass the org's quota: nothing was written. The usage is what the
    /// org held without it.
    #[error("over the org's snapshot quota")]
    OverQuota(SnapshotUsage),
    /// Adding it would pass [`SnapshotLimits::max_from_source`]: nothing was written.
    #[error("the source sandbox holds the most snapshots it may")]
    SourceCap,
    /// The store failed.
    #[error("snapshot store: {0}")]
    Store(#[source] Cause),
}

/// The org's quota as the store checks it when it records a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotLimits {
    /// The most snapshots (`None`: no limit).
    pub max_count: Option<u32>,
    /// The most bytes together (`None`: no limit).
    pub max_bytes: Option<u64>,
    /// The most snapshots of the new one's source sandbox (`None`: no limit): what a
    /// sandbox's own token may take.
    pub max_from_source: Option<u32>,
}

/// The snapshots of every org.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait SnapshotStore: Send + Sync {
    /// Records `snapshot` if the org's snapshots, with it, stay within `limits` (checked
    /// and written in one step: two snapshots taken at once cannot both slip past it).
    ///
    /// # Errors
    /// [`SnapshotStoreError::OverQuota`] (nothing written); [`SnapshotStoreError::Store`].
    async fn insert(&self, snapshot: &Snapshot, limits: SnapshotLimits) -> Result<(), SnapshotStoreError>;

    /// One snapshot of `org`.
    ///
    /// # Errors
    /// [`SnapshotStoreError::Store`].
    async fn get(&self, org: &OrgId, id: &SnapshotId) -> Result<Option<Snapshot>, SnapshotStoreError>;

    /// The org's snapshots, oldest first; only those `owner` owns when given.
    ///
    /// # Errors
    /// [`SnapshotStoreError::Store`].
    async fn list(&self, org: &OrgId, owner: Option<IdentityId>)
    -> Result<Vec<Snapshot>, SnapshotStoreError>;

    /// Removes the record; `false` when there was none.
    ///
    /// # Errors
    /// [`SnapshotStoreError::Store`].
    async fn delete(&self, org: &OrgId, id: &SnapshotId) -> Result<bool, SnapshotStoreError>;

    /// What the org's snapshots hold.
    ///
    /// # Errors
    /// [`SnapshotStoreError::Store`].
    async fn usage(&self, org: &OrgId) -> Result<SnapshotUsage, SnapshotStoreError>;
}
