//! The registry of sandboxes: idempotent claims of a key, state moves fenced by lease
//! epochs, and the revocation state of tokens.

use async_trait::async_trait;

use crate::Cause;
use domain::sandbox::SandboxRecord;
use domain::{
    CallerClass, Durability, ExecutionId, IdentityId, OrgId, SandboxCaller, SandboxId, SandboxKey,
    SandboxState, Timestamp, TokenId,
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
    /// The org's quota of running sandboxes (provisioning or ready). A claim that would
    /// make one more (create a record, or adopt a warm sandbox) when the org already runs
    /// this many fails with [`RegistryError::OverQuota`]; the count and the insert are one
    /// atomic step across replicas. `None`: no quota.
    pub max_running: Option<u32>,
    /// When set, a claim that creates the key's record first adopts a ready warm sandbox
    /// of the org provisioned with this workspace quota, if there is one
    /// ([`ClaimOutcome::Adopted`]).
    pub warm: Option<WarmMatch>,
}

/// Which warm sandboxes a claim may adopt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmMatch {
    /// The workspace quota the warm sandbox must have been provisioned with.
    pub workspace_bytes: Option<u64>,
}

/// What a claim did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// No live record held the key: this call created one (state provisioning, epoch 1,
    /// lease held by the caller of `claim`).
    Created,
    /// A live record holds the key (ready, suspended, or provisioning under an unexpired
    /// lease): returned unchanged.
    Existing,
    /// A provisioning record's lease had expired: this call took it over (epoch + 1,
    /// lease now held by the caller of `claim`).
    TakenOver,
    /// No live record held the key, and a ready warm sandbox of the org became its record
    /// (same sandbox id; state provisioning with the warm sandbox's epoch, lease held by
    /// the caller of `claim`): it is already running, so the caller only binds it
    /// (credential and environment) and marks it ready.
    Adopted,
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
    /// The org already runs as many sandboxes as its quota allows.
    #[error("org {org} already runs {limit} sandboxes, its quota (max_sandboxes)")]
    OverQuota {
        /// The org.
        org: OrgId,
        /// Its quota.
        limit: u32,
    },
    /// Another token was recorded for the sandbox since the caller read the one it
    /// expected (a newer ensure, or another refresh): nothing was written.
    #[error("sandbox {0}: another token was recorded meanwhile")]
    Superseded(SandboxId),
    /// The store failed or holds data the lane did not write.
    #[error("registry store: {0}")]
    Store(#[source] Cause),
}

/// A request to take a suspended sandbox back to provisioning, to start it again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResumeRequest {
    /// The sandbox.
    pub sandbox: SandboxId,
    /// This replica's id, the lease holder.
    pub holder: String,
    /// How long the lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// The org's quota of running sandboxes, checked as for a claim.
    pub max_running: Option<u32>,
    /// The current time.
    pub now: Timestamp,
}

/// A request for one more warm sandbox of an org, if its pool is short.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSlotRequest {
    /// The org.
    pub org: OrgId,
    /// The id the warm sandbox gets.
    pub candidate_id: SandboxId,
    /// The workspace quota it is provisioned with.
    pub workspace_bytes: Option<u64>,
    /// The org's pool size: no slot is given when the org has this many warm sandboxes
    /// with this workspace quota (ready, or provisioning under an unexpired lease).
    pub target: u32,
    /// The driver that provisions it.
    pub driver: String,
    /// This replica's id, the lease holder.
    pub holder: String,
    /// How long the lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// The current time.
    pub now: Timestamp,
}

/// A warm sandbox: provisioned ahead for an org, bound to no key, visible to no caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmSandbox {
    /// The sandbox.
    pub id: SandboxId,
    /// The org it may be adopted in (and only there).
    pub org: OrgId,
    /// The workspace quota it was provisioned with.
    pub workspace_bytes: Option<u64>,
    /// The driver.
    pub driver: String,
    /// Whether it is ready to be adopted (else its holder is provisioning it).
    pub ready: bool,
    /// The provisioning lease.
    pub lease: domain::sandbox::Lease,
    /// When it was created.
    pub created_at: Timestamp,
}

/// A live sandbox's id, org and state: what the reconciler and the metrics need of every
/// live sandbox, without the rest of its record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveId {
    /// The sandbox.
    pub id: SandboxId,
    /// Its org.
    pub org: OrgId,
    /// Its state (provisioning, ready or suspended).
    pub state: SandboxState,
}

/// Which page of an org's sandboxes to read ([`SandboxRegistry::list_org`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrgListing {
    /// The org.
    pub org: OrgId,
    /// Only sandboxes whose id sorts after this one (the last id of the previous page).
    pub after: Option<SandboxId>,
    /// At most this many.
    pub limit: u32,
    /// Whether failed and deprovisioned records are listed too (else only the live ones:
    /// provisioning, ready, suspended).
    pub ended: bool,
}

/// How many sandboxes an org has in one state (for metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateCount {
    /// The org.
    pub org: OrgId,
    /// The state.
    pub state: SandboxState,
    /// How many.
    pub count: u64,
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

    /// The owner's adoption, in one atomic step: records `request.caller` as the key's
    /// owner when it has none (as [`SandboxRegistry::claim_owner`]), and then, only when
    /// the key's owner is that caller, adopts a warm sandbox as [`SandboxRegistry::claim`]
    /// would ([`ClaimOutcome::Adopted`], under the same quota). Returns the adopted record.
    ///
    /// `None` when nothing was adopted: another identity owns the key, `request.warm` is
    /// `None`, the key has a live record, the org is at its quota, or no warm sandbox
    /// matches. Nothing but the owner row may have changed then; the caller decides who
    /// may claim (from [`SandboxRegistry::claim_owner`]) and claims as usual.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn adopt_as_owner(&self, request: &ClaimRequest) -> Result<Option<SandboxRecord>, RegistryError>;

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

    /// As [`SandboxRegistry::mark_ready`], and appends `event` (the ensure's audit event)
    /// to the audit log in the same transaction: both or neither, with one commit (one
    /// disk flush) for the two. The event is stored exactly as
    /// [`crate::AuditLog::append`] stores it (hashed, sealed later, paged in order).
    ///
    /// # Errors
    /// As [`SandboxRegistry::mark_ready`] (nothing is written then).
    async fn mark_ready_audited(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        grant: &TokenGrant,
        event: &domain::AuditEvent,
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
    /// execution and caller become the record's current token; with `expected`, only if
    /// its current token is still that one (the one a refresh read before minting): a
    /// stale refresh never replaces a newer ensure's caller. An ensure records without it
    /// (it is the newest: concurrent ensures of one key each record theirs).
    ///
    /// # Errors
    /// [`RegistryError::Superseded`] when another token was recorded since;
    /// [`RegistryError::InvalidState`] when the record is not live;
    /// [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn record_token<'a>(
        &self,
        sandbox: &SandboxId,
        expected: Option<&'a TokenId>,
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

    /// The record with this id, in any state, and its key's owner (if anyone ever
    /// ensured it), read together: what the ownership rule needs for every operation on a
    /// named sandbox, in one round trip to the store.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn get_with_owner(
        &self,
        sandbox: &SandboxId,
    ) -> Result<Option<(SandboxRecord, Option<KeyOwner>)>, RegistryError>;

    /// A page of the org's records in id order (ids start with their creation time, so
    /// oldest first), each with its key's owner: what the console's list shows. Reads one
    /// index range of `limit` rows, whatever the org holds.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_org(
        &self,
        listing: &OrgListing,
    ) -> Result<Vec<(SandboxRecord, Option<KeyOwner>)>, RegistryError>;

    /// The live record holding `key`, if any.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn get_live(&self, key: &SandboxKey) -> Result<Option<SandboxRecord>, RegistryError>;

    /// The id, org and state of every live record (provisioning, ready or suspended), oldest
    /// first: the reconciler's and the metrics' view, read without the records themselves
    /// (tens of thousands of them at density).
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn live_ids(&self) -> Result<Vec<LiveId>, RegistryError>;

    /// The ready records whose token expires at or before `horizon`, or that hold no expiry,
    /// soonest first: the refresher's candidates, read without listing every live sandbox.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_token_expiring(&self, horizon: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError>;

    /// The provisioning records whose lease expired at or before `now`, oldest lease first:
    /// the reconciler's expired claims.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_lease_expired(&self, now: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError>;

    /// The ready records last active at or before `active_before`, least recently active
    /// first: the idle pass's candidates (it checks each against its org's timeout), read
    /// without listing every live sandbox.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_idle(&self, active_before: Timestamp) -> Result<Vec<SandboxRecord>, RegistryError>;

    /// The ready and suspended records created at or before `created_before`, oldest
    /// first: the lifetime pass's candidates.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_created_before(
        &self,
        created_before: Timestamp,
    ) -> Result<Vec<SandboxRecord>, RegistryError>;

    /// The ids of the ready sandboxes (for the egress scan, which serves each one's proxy:
    /// the ids alone, not every live record, several times a second).
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn ready_ids(&self) -> Result<Vec<SandboxId>, RegistryError>;

    /// The ids of the ready sandboxes whose record changed at or after `since` (made ready,
    /// resumed, adopted from a pool, its token re-minted): what the egress scan looks at
    /// between its full listings, so that a pass costs what changed, not what is live.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn ready_ids_since(&self, since: Timestamp) -> Result<Vec<SandboxId>, RegistryError>;

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

    /// Suspended → provisioning (epoch + 1, the lease held by `request.holder`), under the
    /// org's quota of running sandboxes (checked atomically, as in
    /// [`SandboxRegistry::claim`]). Returns the updated record. Under any concurrency,
    /// across replicas, one call wins; the others get `InvalidState`.
    ///
    /// # Errors
    /// [`RegistryError::InvalidState`] when the record is not suspended;
    /// [`RegistryError::OverQuota`]; [`RegistryError::NotFound`]; [`RegistryError::Store`].
    async fn resume(&self, request: &ResumeRequest) -> Result<SandboxRecord, RegistryError>;

    /// Ready → suspended, if the record's `last_active_at` is at or before `idle_since`
    /// (checked in the same statement, so an activity recorded meanwhile keeps it ready).
    /// Returns whether it moved.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn suspend(
        &self,
        sandbox: &SandboxId,
        idle_since: Timestamp,
        now: Timestamp,
    ) -> Result<bool, RegistryError>;

    /// Records activity: each sandbox's `last_active_at` becomes the later of its own and
    /// the given time (records that are not live are left alone).
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn touch(&self, activity: &[(SandboxId, Timestamp)]) -> Result<(), RegistryError>;

    /// How many records each org has in each live state (provisioning, ready, suspended).
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn live_counts(&self) -> Result<Vec<StateCount>, RegistryError>;

    /// One more warm sandbox for `request.org`, if its pool of sandboxes with this
    /// workspace quota is short of `request.target`: a provisioning warm record under a
    /// lease held by `request.holder` (epoch 1). Atomic across replicas: the pool is never
    /// filled past its target by concurrent callers.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn claim_warm_slot(&self, request: &WarmSlotRequest) -> Result<Option<WarmSandbox>, RegistryError>;

    /// Extends a provisioning warm sandbox's lease to `until`, if `epoch` is still its
    /// epoch: a warm provision slower than its lease (a pod's image pulled for minutes)
    /// keeps it this way, so no pool pass takes the slot for a lapsed one, fills the pool
    /// past its size, and removes the sandbox from under its provision.
    ///
    /// # Errors
    /// [`RegistryError::Fenced`] when it is gone from the pool, ready, or its epoch moved
    /// on; [`RegistryError::Store`].
    async fn renew_warm_lease(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        until: Timestamp,
        now: Timestamp,
    ) -> Result<(), RegistryError>;

    /// A provisioned warm sandbox becomes ready to adopt, if `epoch` is still its epoch.
    ///
    /// # Errors
    /// [`RegistryError::Fenced`] when it is gone from the pool or its epoch moved on;
    /// [`RegistryError::Store`].
    async fn mark_warm_ready(
        &self,
        sandbox: &SandboxId,
        epoch: i64,
        now: Timestamp,
    ) -> Result<(), RegistryError>;

    /// Takes a warm sandbox out of the pool (not adopted by anyone after this). Returns
    /// whether it was still there (`false`: a claim adopted it, or it was removed).
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn remove_warm(&self, sandbox: &SandboxId) -> Result<bool, RegistryError>;

    /// Every warm sandbox, oldest first.
    ///
    /// # Errors
    /// [`RegistryError::Store`].
    async fn list_warm(&self) -> Result<Vec<WarmSandbox>, RegistryError>;
}
