//! The lane's record of one sandbox: its key, state, owner, lease and current token.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::caller::{CallerClass, SandboxCaller};
use crate::durability::Durability;
use crate::id::{ExecutionId, IdentityId, SandboxId, TokenId};
use crate::key::SandboxKey;
use crate::time::Timestamp;

/// Where a sandbox is in its life: provisioning → ready | failed → deprovisioned; a ready
/// sandbox idle past its org's timeout is suspended (its processes end, its workspace
/// stays), and the next ensure or exec takes it back through provisioning to ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxState {
    /// Claimed; a holder with a lease is provisioning it.
    Provisioning,
    /// Provisioned and usable.
    Ready,
    /// Idle past its org's timeout: no processes, the workspace kept; it still holds its
    /// key, and the next ensure or exec resumes it under the same id.
    Suspended,
    /// Provisioning failed; the key is free again.
    Failed,
    /// Deprovisioned (terminal FAILED, or replaced by recovery).
    Deprovisioned,
}

impl SandboxState {
    /// `provisioning`, `ready`, `suspended`, `failed` or `deprovisioned`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Provisioning => "provisioning",
            Self::Ready => "ready",
            Self::Suspended => "suspended",
            Self::Failed => "failed",
            Self::Deprovisioned => "deprovisioned",
        }
    }

    /// Parses a stored state name.
    ///
    /// # Errors
    /// [`UnknownState`] naming the input.
    pub fn parse(input: &str) -> Result<Self, UnknownState> {
        match input {
            "provisioning" => Ok(Self::Provisioning),
            "ready" => Ok(Self::Ready),
            "suspended" => Ok(Self::Suspended),
            "failed" => Ok(Self::Failed),
            "deprovisioned" => Ok(Self::Deprovisioned),
            other => Err(UnknownState(other.to_owned())),
        }
    }

    /// Whether the record holds its key: at most one live record per key.
    pub const fn is_live(self) -> bool {
        matches!(self, Self::Provisioning | Self::Ready | Self::Suspended)
    }

    /// Whether the sandbox counts against its org's quota of running sandboxes: it has
    /// (or is getting) processes. A suspended sandbox holds its key but runs nothing.
    pub const fn is_running(self) -> bool {
        matches!(self, Self::Provisioning | Self::Ready)
    }
}

impl fmt::Display for SandboxState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a sandbox state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sandbox state {0:?}")]
pub struct UnknownState(pub String);

/// A provisioning claim's lease: who holds it, until when, and its fencing epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The holder (a replica's id).
    pub holder: String,
    /// When the lease lapses if not finished.
    pub expires_at: Timestamp,
    /// The fencing number: each take-over increments it; writes must present it.
    pub epoch: i64,
}

impl SandboxRecord {
    /// Whether a token minted for this sandbox may still verify: the record is live and
    /// its tokens were not revoked.
    pub fn tokens_active(&self) -> bool {
        self.state.is_live() && self.tokens_revoked_at.is_none()
    }
}

/// The lane's record of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    /// The sandbox.
    pub id: SandboxId,
    /// What it belongs to.
    pub key: SandboxKey,
    /// Durable or ephemeral, decided at creation from the creating caller's class.
    pub durability: Durability,
    /// Where it is in its life.
    pub state: SandboxState,
    /// The driver that provisions it (`bubblewrap`, `container`, …).
    pub driver: String,
    /// The caller whose claim created this record (the key's owner is kept apart, per
    /// key, since it outlives records).
    pub caller_id: IdentityId,
    /// That caller's class.
    pub caller_class: CallerClass,
    /// The caller the current token was minted FOR: the caller of the latest ensure. The
    /// refresher re-mints for this caller, and the sandbox's per-command environment
    /// carries its class.
    pub token_caller: SandboxCaller,
    /// The execution whose ensure last minted a token.
    pub execution_id: ExecutionId,
    /// The `jti` of the last token minted for it.
    pub token_id: Option<TokenId>,
    /// When that token expires.
    pub token_expires_at: Option<Timestamp>,
    /// The provisioning lease.
    pub lease: Lease,
    /// When its tokens were revoked (deprovision or replacement); none verify after.
    pub tokens_revoked_at: Option<Timestamp>,
    /// Why provisioning failed, when it did.
    pub message: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// When a command, an ensure or a file or process operation last touched it, as far
    /// as the replicas have told the store (they report at most every few hundred ms).
    pub last_active_at: Timestamp,
}
