//! Audit events and their canonical form.
//!
//! Every ensure and deprovision writes one event. The canonical encoding is a version tag
//! followed by each field, in a fixed order, as a 4-byte big-endian length and its bytes
//! (absent optional fields as a length of `u32::MAX`). The encoding is injective, so
//! distinct events have distinct encodings and, barring SHA-256 collisions, distinct
//! hashes: the tamper-evident log chains these hashes.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::caller::CallerClass;
use crate::durability::Durability;
use crate::id::{IdentityId, OrgId, SandboxId, TokenId};
use crate::key::SandboxKey;
use crate::time::Timestamp;

/// The version tag that starts every canonical encoding.
pub const CANONICAL_TAG: &[u8] = b"sandlane.audit.v1";

/// What was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditAction {
    /// An ensure (session or workflow).
    Ensure,
    /// A recovery's fresh provision.
    Recover,
    /// A deprovision.
    Deprovision,
    /// A background credential refresh.
    Refresh,
    /// A background reconciliation.
    Reconcile,
    /// A sandbox idle past its org's timeout was suspended (its processes ended).
    Suspend,
    /// A suspended sandbox was started again for an exec.
    Resume,
    /// A destination a sandbox asked the egress proxy for (its message: `KIND HOST:PORT`
    /// and the reason).
    Egress,
    /// Egress decisions counted rather than written one by one (its message: how many, of
    /// which destination, since when).
    EgressSummary,
    /// A brokered secret was set (its message: the name and binding, never the value; its
    /// key: the session `sandlane:secrets` of the org, [`SECRETS_KEY`]).
    SecretSet,
    /// A brokered secret was deleted (key as for [`AuditAction::SecretSet`]).
    SecretDelete,
    /// A request of a sandbox carried a brokered secret, or was refused by its binding (its
    /// message: `SECRET METHOD HOST PATH`; its caller: the one the sandbox acted for).
    SecretUse,
    /// A snapshot of a sandbox's workspace was taken (its message: the snapshot's
    /// lineage, [`crate::Snapshot::lineage`]).
    Snapshot,
    /// A sandbox was provisioned from a snapshot (its message: the snapshot's lineage).
    Fork,
    /// A sandbox's workspace was replaced by a snapshot's (its message: the lineage).
    Restore,
    /// A snapshot was deleted (its key and sandbox: the snapshot's source).
    SnapshotDelete,
    /// A preview link of a sandbox's port was made (its caller: the link's creator; its
    /// message: the link's id, port and expiry).
    PreviewLinkCreate,
    /// A preview link was opened: its token traded for a cookie, once per cookie (its
    /// caller: the link's creator; its message: the link's id and port).
    PreviewLinkOpen,
    /// A preview link was revoked (its caller: the link's creator; its message: the link's
    /// id, port, and who revoked it).
    PreviewLinkRevoke,
}

/// The session id the audit events of an org's secrets (set, delete) are filed under (an
/// audit event always names a key); their actions, written for nothing else, tell them
/// apart from the events of a sandbox that a session of that id might have.
pub const SECRETS_KEY: &str = "sandlane:secrets";

impl AuditAction {
    /// Every action.
    pub const ALL: [Self; 19] = [
        Self::Ensure,
        Self::Recover,
        Self::Deprovision,
        Self::Refresh,
        Self::Reconcile,
        Self::Suspend,
        Self::Resume,
        Self::Egress,
        Self::EgressSummary,
        Self::SecretSet,
        Self::SecretDelete,
        Self::SecretUse,
        Self::Snapshot,
        Self::Fork,
        Self::Restore,
        Self::SnapshotDelete,
        Self::PreviewLinkCreate,
        Self::PreviewLinkOpen,
        Self::PreviewLinkRevoke,
    ];

    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ensure => "ensure",
            Self::Recover => "recover",
            Self::Deprovision => "deprovision",
            Self::Refresh => "refresh",
            Self::Reconcile => "reconcile",
            Self::Suspend => "suspend",
            Self::Resume => "resume",
            Self::Egress => "egress",
            Self::EgressSummary => "egress_summary",
            Self::SecretSet => "secret_set",
            Self::SecretDelete => "secret_delete",
            Self::SecretUse => "secret_use",
            Self::Snapshot => "snapshot",
            Self::Fork => "fork",
            Self::Restore => "restore",
            Self::SnapshotDelete => "snapshot_delete",
            Self::PreviewLinkCreate => "preview_link_create",
            Self::PreviewLinkOpen => "preview_link_open",
            Self::PreviewLinkRevoke => "preview_link_revoke",
        }
    }

    /// Parses a stored action name.
    ///
    /// # Errors
    /// [`UnknownAuditValue`] naming the input.
    pub fn parse(input: &str) -> Result<Self, UnknownAuditValue> {
        Self::ALL.into_iter().find(|a| a.as_str() == input).ok_or_else(|| UnknownAuditValue(input.to_owned()))
    }
}

/// How it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditOutcome {
    /// A new sandbox was provisioned.
    Provisioned,
    /// A ready sandbox was reused (a fresh token minted).
    Reused,
    /// Provisioning or deprovisioning failed.
    Failed,
    /// The sandbox was deprovisioned.
    Deprovisioned,
    /// There was no live sandbox to deprovision.
    Absent,
    /// A credential was refreshed.
    Refreshed,
    /// The caller was not allowed to do this (nothing was touched).
    Denied,
    /// A live record whose sandbox was gone from the driver was retired so the key can be
    /// provisioned again.
    Repaired,
    /// Refused: the org's quota of running sandboxes was used up (nothing was provisioned).
    QuotaExceeded,
    /// The sandbox was suspended (idle past its org's timeout).
    Suspended,
    /// A suspended sandbox was started again, same id and workspace.
    Resumed,
    /// A warm sandbox of the org's pool became the key's sandbox.
    Adopted,
    /// The sandbox was deprovisioned for reaching its org's maximum lifetime.
    Expired,
    /// An egress destination was let through.
    Allowed,
    /// An egress destination was refused.
    Refused,
    /// A secret was stored (made or replaced).
    Stored,
    /// A secret was deleted.
    Deleted,
    /// A snapshot was taken.
    Taken,
    /// A workspace was restored from a snapshot.
    Restored,
}

impl AuditOutcome {
    /// Every outcome.
    pub const ALL: [Self; 19] = [
        Self::Provisioned,
        Self::Reused,
        Self::Failed,
        Self::Deprovisioned,
        Self::Absent,
        Self::Refreshed,
        Self::Denied,
        Self::Repaired,
        Self::QuotaExceeded,
        Self::Suspended,
        Self::Resumed,
        Self::Adopted,
        Self::Expired,
        Self::Allowed,
        Self::Refused,
        Self::Stored,
        Self::Deleted,
        Self::Taken,
        Self::Restored,
    ];

    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Provisioned => "provisioned",
            Self::Reused => "reused",
            Self::Failed => "failed",
            Self::Deprovisioned => "deprovisioned",
            Self::Absent => "absent",
            Self::Refreshed => "refreshed",
            Self::Denied => "denied",
            Self::Repaired => "repaired",
            Self::QuotaExceeded => "quota_exceeded",
            Self::Suspended => "suspended",
            Self::Resumed => "resumed",
            Self::Adopted => "adopted",
            Self::Expired => "expired",
            Self::Allowed => "allowed",
            Self::Refused => "refused",
            Self::Stored => "stored",
            Self::Deleted => "deleted",
            Self::Taken => "taken",
            Self::Restored => "restored",
        }
    }

    /// Parses a stored outcome name.
    ///
    /// # Errors
    /// [`UnknownAuditValue`] naming the input.
    pub fn parse(input: &str) -> Result<Self, UnknownAuditValue> {
        Self::ALL.into_iter().find(|a| a.as_str() == input).ok_or_else(|| UnknownAuditValue(input.to_owned()))
    }
}

impl fmt::Display for AuditAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for AuditOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored string that is not an audit action or outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown audit value {0:?}")]
pub struct UnknownAuditValue(pub String);

/// One audited decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditEvent {
    /// What was done.
    pub action: AuditAction,
    /// The sandbox key it concerned (its org is the event's org).
    pub key: SandboxKey,
    /// The sandbox, when one was claimed.
    pub sandbox_id: Option<SandboxId>,
    /// Who asked.
    pub caller_id: IdentityId,
    /// Their class.
    pub caller_class: CallerClass,
    /// The durability decided, when one was.
    pub durability: Option<Durability>,
    /// The driver's name.
    pub driver: String,
    /// How it ended.
    pub outcome: AuditOutcome,
    /// A human-readable message (the failure message, for failures). Never a secret.
    pub message: String,
    /// The `jti` minted, when one was.
    pub token_id: Option<TokenId>,
    /// When it happened.
    pub at: Timestamp,
}

impl AuditEvent {
    /// The org of the event.
    pub fn org(&self) -> &OrgId {
        self.key.org()
    }

    /// The canonical byte encoding (see the module documentation).
    pub fn canonical_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(CANONICAL_TAG);
        let mut field = |bytes: Option<&[u8]>| match bytes {
            Some(b) => {
                let len = u32::try_from(b.len()).unwrap_or(u32::MAX - 1);
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&b[..len as usize]);
            }
            None => out.extend_from_slice(&u32::MAX.to_be_bytes()),
        };
        field(Some(self.action.as_str().as_bytes()));
        field(Some(self.key.org().as_str().as_bytes()));
        field(Some(self.key.kind().as_str().as_bytes()));
        field(Some(self.key.key().as_bytes()));
        field(self.sandbox_id.as_ref().map(|s| s.as_str().as_bytes()));
        field(Some(self.caller_id.as_str().as_bytes()));
        field(Some(self.caller_class.as_str().as_bytes()));
        field(self.durability.map(|d| d.as_str().as_bytes()));
        field(Some(self.driver.as_bytes()));
        field(Some(self.outcome.as_str().as_bytes()));
        field(Some(self.message.as_bytes()));
        field(self.token_id.as_ref().map(|t| t.as_str().as_bytes()));
        field(Some(&self.at.unix_millis().to_be_bytes()));
        out
    }

    /// SHA-256 of the canonical encoding.
    pub fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.canonical_bytes()).into()
    }
}

#[cfg(test)]
mod tests;
