//! The registry of sandboxes: idempotent claims of a key, state moves fenced by lease
//! epochs, and the revocation state of tokens.

use async_trait::async_trait;

use crate::Cause;
use domain::sandbox::SandboxRecord;
use domain::{
    CallerClass, Durability, ExecutionId, IdentityId, SandboxCaller, SandboxId, SandboxKey, Timestamp,
    TokenId,
};

/// A request to claim a key for provisioning.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The key to claim.
    pub key: SandboxKey,
    /// The id the sandbox gets if this call creates it.
    pub candidate_id: SandboxId,
    /// The durability it gets if this call creates it.
    pub durability: Durability,
    /// The driver that will provision it.
    pub driver: String,
    /// Who asked (recorded as the creating caller and, until a token is minted, as the
    /// token's caller).
    pub caller: SandboxCaller,
    /// The execution asking.
    pub execution_id: ExecutionId,
    /// This replica's id, the lease holder if this call creates or takes over the claim.
    pub holder: String,
    /// How long the lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// The current time.
    pub now: Timestamp,
}

/// What a claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No live record held the key: this call created one (state provisioning, epoch 1,
    /// lease held by the caller of `claim`).
    Created,
    /// A live record holds the key (ready, or provisioning under an unexpired lease):
    /// returned unchanged.
    Existing,
    /// A provisioning record's lease had expired: this call took it over (epoch + 1,
    /// lease now held by the caller of `claim`).
    TakenOver,
}

/// The result of a claim: the live record for the key and what the call did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The live record.
    pub record: SandboxRecord,
    /// Created, existing or taken over.
    pub outcome: ClaimOutcome,
}

/// A token minted for a sandbox, as the registry records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    /// The token's `jti`.
    pub token_id: TokenId,
    /// Its expiry.
    pub expires_at: Timestamp,
    /// The execution it was minted for.
    pub execution_id: ExecutionId,
    /// The caller it was minted for: recorded as the sandbox's token caller, whom the
    /// refresher re-mints for.
    pub caller: SandboxCaller,
}

/// The owner of a sandbox key: the identity whose ensure first created it. Kept across
/// deprovision and recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    /// The owner.
    pub identity_id: IdentityId,
    /// Its class when it took the key.
    pub class: CallerClass,
    /// When it took the key.
    pub since: Timestamp,
}

/// Why a registry call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A write presented an epoch older than the record's (or the record is no longer
    /// provisioning): another holder took the claim over.
    #[error("sandbox {sandbox_id}: lease epoch {epoch} is stale; another holder took the claim over")]
    Fenced {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The epoch presented.
        epoch: i64,
    },
    /// No record with this id.
    #[error("sandbox {0} not found")]
    NotFound(SandboxId),
    /// The move is not allowed from the record's state (e.g. ready after deprovisioned).
    #[error("sandbox {sandbox_id} is {state}; cannot {action}")]
    InvalidState {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its current state.
        state: String,
        /// What was attempted.
        action: &'static str,
    },
    /// The store failed or holds data the lane did not write.
    #[error("registry store: {0}")]
    Store(#[source] Cause),
}

/// The registry of sandboxes. The database holds the invariant: at most one live
/// (provisioning or ready) record per key.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait SandboxRegistry: Send + Sync {
    /// Claims `request.key`, atomically: MUST return the one live record for the key,
    /// creating it, returning it unchanged, or taking over an expired provisioning lease
    /// (see [`ClaimOutcome`]). Under any concurrency, across replicas, exactly one call
    /// per fresh key reports `Created` and all calls return the same sandbox id.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn claim(&self, request: &ClaimRequest) -> Result<Claim, RegistryError>;

    /// Provisioning → ready, recording the token (its caller becomes the record's token
    /// caller), if `epoch` is the record's current epoch. Returns the updated record.
    ///
    /// # Errors
    /// [`RegistryError::Fenced`] when `epoch` is stale or the record is no longer
    /// provisioning; [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn mark_ready(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        grant: &TokenGrant,
        now: Timestamp,
    ) -> Result<SandboxRecord, RegistryError>;

    /// Provisioning → failed (the key is free again), if `epoch` is current.
    ///
    /// # Errors
    /// As [`SandboxRegistry::mark_ready`].
    async fn mark_failed(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        message: &str,
        now: Timestamp,
    ) -> Result<(), RegistryError>;

    /// Records a token minted for a ready sandbox (reuse or refresh): its id, expiry,
    /// execution and caller become the record's current token.
    ///
    /// # Errors
    /// [`RegistryError::InvalidState`] when the record is not live;
    /// [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn record_token(
        &self,
        sandbox: &SandboxId,
        grant: &TokenGrant,
        now: Timestamp,
    ) -> Result<(), RegistryError>;

    /// Any state → deprovisioned, revoking its tokens. Idempotent: returns the record
    /// as it was before this call, or `None` when no such record exists.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn mark_deprovisioned(
        &self,
        sandbox: &SandboxId,
        now: Timestamp,
    ) -> Result<Option<SandboxRecord>, RegistryError>;

    /// Revokes the sandbox's tokens (sets `tokens_revoked_at` if unset). Idempotent.
    ///
    /// # Errors
    /// [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn revoke_tokens(&self, sandbox: &SandboxId, now: Timestamp) -> Result<(), RegistryError>;

    /// The record with this id, in any state.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn get(&self, sandbox: &SandboxId) -> Result<Option<SandboxRecord>, RegistryError>;

    /// The live record holding `key`, if any.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn get_live(&self, key: &SandboxKey) -> Result<Option<SandboxRecord>, RegistryError>;

    /// Every live record (for the refresher and the reconciler), oldest first.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_live(&self) -> Result<Vec<SandboxRecord>, RegistryError>;

    /// Extends a provisioning record's lease to `until`, if `epoch` is still the record's
    /// epoch (a provision slower than its lease keeps it this way).
    ///
    /// # Errors
    /// [`RegistryError::Fenced`] when `epoch` is stale or the record is no longer
    /// provisioning; [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn renew_lease(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), RegistryError>;

    /// The owner of `key`, recording `caller` as its owner when it has none. Atomic: under
    /// any concurrency, across replicas, every call for a key returns the same owner.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn claim_owner(
        &self,
        key: &SandboxKey,
        caller: &SandboxCaller,
        now: Timestamp,
    ) -> Result<KeyOwner, RegistryError>;

    /// The owner of `key`, if anyone ever ensured it.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn owner(&self, key: &SandboxKey) -> Result<Option<KeyOwner>, RegistryError>;
}
