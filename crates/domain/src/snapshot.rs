//! Snapshots of a sandbox's workspace: what one records, and the org's quota on them.
//!
//! A snapshot is the workspace's files at one instant, never the credential or anything
//! else of the sandbox's own. It belongs to the owner of its source sandbox's key: that
//! owner (and the org's service callers) may fork from it, read and delete it
//! ([`crate::Operation::UseSnapshot`]); whoever may exec in a sandbox may snapshot or
//! restore it ([`crate::Operation::Snapshot`]).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{IdentityId, OrgId, SandboxId, SnapshotId};
use crate::key::SandboxKey;
use crate::policy::OrgPolicy;
use crate::time::Timestamp;

/// The longest snapshot name, in characters.
pub const MAX_SNAPSHOT_NAME_LEN: usize = 64;

/// A caller's label for a snapshot (`before-refactor`): 1–64 characters of
/// `A-Z a-z 0-9 . _ -`. Not unique; the id names the snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
pub struct SnapshotName(String);

/// Why a snapshot name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("snapshot name {input:?} must be 1 to {MAX_SNAPSHOT_NAME_LEN} characters of A-Z a-z 0-9 . _ -")]
pub struct SnapshotNameError {
    /// The refused input (its first 80 characters).
    pub input: String,
}

impl SnapshotName {
    /// Parses a name.
    ///
    /// # Errors
    /// [`SnapshotNameError`] when it is empty, too long or holds another character.
    pub fn parse(input: impl Into<String>) -> Result<Self, SnapshotNameError> {
        let input = input.into();
        let ok = !input.is_empty()
            && input.chars().count() <= MAX_SNAPSHOT_NAME_LEN
            && input.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if ok { Ok(Self(input)) } else { Err(SnapshotNameError { input: input.chars().take(80).collect() }) }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SnapshotName {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// One snapshot, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The snapshot.
    pub id: SnapshotId,
    /// The org it belongs to (its source's).
    pub org: OrgId,
    /// The sandbox it was taken of.
    pub source: SandboxId,
    /// That sandbox's key.
    pub source_key: SandboxKey,
    /// The owner of that key when it was taken: who (besides the org's service callers)
    /// may fork from it, read and delete it.
    pub owner: IdentityId,
    /// Who took it.
    pub created_by: IdentityId,
    /// The caller's label, if any.
    pub name: Option<SnapshotName>,
    /// When it was taken.
    pub created_at: Timestamp,
    /// The bytes its files hold (what counts against the org's snapshot bytes).
    pub bytes: u64,
}

impl Snapshot {
    /// Where it came from, for audit messages: `snp_… of sbx_… (session/KEY)`.
    pub fn lineage(&self) -> String {
        format!("{} of {} ({}/{})", self.id, self.source, self.source_key.kind(), self.source_key.key())
    }
}

/// A snapshot the org's quota does not allow.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotQuotaError {
    /// The org holds `max_snapshots` already.
    #[error("the org holds {held} snapshots, its quota (max_snapshots) is {limit}")]
    Count {
        /// Snapshots held.
        held: u64,
        /// The quota.
        limit: u32,
    },
    /// Its snapshots would hold more than `snapshot_bytes`.
    #[error("the org's snapshots would hold {would} bytes, its quota (snapshot_bytes) is {limit}")]
    Bytes {
        /// Bytes held with the new one (or without it, before it is taken).
        would: u64,
        /// The quota.
        limit: u64,
    },
}

/// Whether the org may hold one more snapshot of `adding` bytes besides `held` snapshots
/// holding `held_bytes` (before a snapshot is taken, `adding` is 0: the bytes already
/// held must leave room).
///
/// # Errors
/// [`SnapshotQuotaError`] naming the quota that refuses it.
pub fn admit(policy: &OrgPolicy, held: u64, held_bytes: u64, adding: u64) -> Result<(), SnapshotQuotaError> {
    if let Some(limit) = policy.max_snapshots()
        && held >= u64::from(limit)
    {
        return Err(SnapshotQuotaError::Count { held, limit });
    }
    if let Some(limit) = policy.snapshot_bytes() {
        let would = held_bytes.saturating_add(adding);
        if would > limit || (adding == 0 && would >= limit) {
            return Err(SnapshotQuotaError::Bytes { would, limit });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
