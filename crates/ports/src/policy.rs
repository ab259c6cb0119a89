//! Org policies in the store, and the leases that share a concurrency quota between
//! replicas.

use async_trait::async_trait;
use domain::{OrgId, PolicyPatch, Timestamp};

/// An org's stored changes: the fields `sandlane org set` named, over the defaults of the
/// config file (so a default changed later still applies to every field the org never
/// set), and the version of the latest change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyOverrides {
    /// The fields set, with their values.
    pub patch: PolicyPatch,
    /// 1 for the first change, one more for each change after.
    pub version: i64,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// Why a policy or lease call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyStoreError {
    /// The store failed or holds data the lane did not write.
    #[error("policy store: {0}")]
    Store(String),
}

/// The org policies: per org, the changes made to the defaults.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait PolicyStore: Send + Sync {
    /// The org's stored changes, `None` when it was never changed.
    ///
    /// # Errors
    /// [`PolicyStoreError::Store`].
    async fn overrides(&self, org: &OrgId) -> Result<Option<PolicyOverrides>, PolicyStoreError>;

    /// Replaces the org's stored changes with `overrides` (the whole set, merged by the
    /// caller) as version `expected_version + 1`, if the stored version is still
    /// `expected_version` (0: nothing stored yet). `Ok(None)` when another change came
    /// first: the caller reads again, merges again and retries, so no change is lost.
    ///
    /// # Errors
    /// [`PolicyStoreError::Store`].
    async fn replace(
        &self,
        org: &OrgId,
        overrides: &PolicyPatch,
        expected_version: i64,
        now: Timestamp,
    ) -> Result<Option<PolicyOverrides>, PolicyStoreError>;

    /// Every org with stored changes.
    ///
    /// # Errors
    /// [`PolicyStoreError::Store`].
    async fn list(&self) -> Result<Vec<(OrgId, PolicyOverrides)>, PolicyStoreError>;
}

/// Leases on a concurrency quota shared by replicas (say, an org's running commands): each
/// replica holds a lease of some slots of a scope and admits work against its own slots
/// only, so the cluster never runs more than the limit while no admission needs the store.
/// A lease lapses at its expiry unless renewed, so a dead replica's slots come back.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait QuotaLeases: Send + Sync {
    /// Sets `holder`'s lease of `scope` to as many slots as it can, up to `want`, such
    /// that every unexpired lease of `scope` together holds at most `limit`; it then
    /// expires at `now + ttl_ms`. Returns the slots granted (0 to `want`). Atomic across
    /// replicas. `want = 0` gives the slots back.
    ///
    /// # Errors
    /// [`PolicyStoreError::Store`].
    async fn lease(
        &self,
        scope: &str,
        holder: &str,
        want: u32,
        limit: u32,
        now: Timestamp,
        ttl_ms: i64,
    ) -> Result<u32, PolicyStoreError>;
}
