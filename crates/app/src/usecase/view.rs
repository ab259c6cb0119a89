//! The sandbox as callers see it (the `S` object of the HTTP API).

use domain::sandbox::SandboxRecord;
use domain::{
    Durability, OrgId, SandboxId, SandboxKind, SandboxState, Snapshot, SnapshotId, Timestamp, TokenId,
};

/// A sandbox as an ensure returns it: no credential, only the `jti` minted by this ensure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxView {
    /// The sandbox.
    pub id: SandboxId,
    /// Session or workflow.
    pub kind: SandboxKind,
    /// The session id or workflow execution id.
    pub key: String,
    /// The org.
    pub org: OrgId,
    /// Durable or ephemeral.
    pub durability: Durability,
    /// Its state.
    pub state: SandboxState,
    /// The driver.
    pub driver: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// The `jti` minted by this ensure (or the last one recorded, for a plain read).
    pub token_id: Option<TokenId>,
    /// The snapshot this ensure forked the sandbox from.
    pub forked_from: Option<SnapshotId>,
    /// The snapshot this ensure named and did not fork from: the key's sandbox was live
    /// already (an ensure is idempotent), so it was reused as it is.
    pub snapshot_ignored: Option<SnapshotId>,
}

impl SandboxView {
    /// The view of a record, with the token id of this ensure.
    pub fn of(record: &SandboxRecord, token_id: Option<TokenId>) -> Self {
        Self {
            id: record.id.clone(),
            kind: record.key.kind(),
            key: record.key.key().to_owned(),
            org: record.key.org().clone(),
            durability: record.durability,
            state: record.state,
            driver: record.driver.clone(),
            created_at: record.created_at,
            token_id: token_id.or_else(|| record.token_id.clone()),
            forked_from: None,
            snapshot_ignored: None,
        }
    }

    /// This view of a sandbox that was live already when an ensure named `fork`.
    #[must_use]
    pub fn ignoring(mut self, fork: Option<&Snapshot>) -> Self {
        self.snapshot_ignored = fork.map(|s| s.id.clone());
        self
    }
}
