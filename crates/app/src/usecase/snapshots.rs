//! Snapshots of a sandbox's workspace, restores, and the snapshots' records (forks are
//! ensures: [`super::ensure::ensure_session_sandbox_from`]).
//!
//! Who may: snapshot or restore a sandbox, whoever may exec in it
//! ([`Operation::Snapshot`]); read, delete or fork from a snapshot, the owner of its
//! source key and the org's service callers ([`Operation::UseSnapshot`]); a sandbox token
//! restores its own sandbox from its own sandbox's snapshots only. Every snapshot,
//! restore and deletion is an audit event naming the snapshot's lineage.

use domain::sandbox::SandboxRecord;
use domain::snapshot::{SnapshotQuotaError, admit};
use domain::{
    Actor, AuditAction, AuditOutcome, CallerIdentity, Denial, IdentityId, Operation, OrgId, SandboxCaller,
    SandboxId, SandboxState, Snapshot, SnapshotId, SnapshotName, Target, Timestamp,
};
use ports::{DriverError, SnapshotBudget, SnapshotLimits, SnapshotRef, SnapshotStoreError};
use tracing::{error, info, warn};

use super::access::{AccessError, authorize_sandbox, precheck};
use super::audit_event::EventContext;
use super::ensure::{self, ResumeError};
use super::policy::PolicyReadError;
use super::{LaneDeps, SandboxView};

/// Why a snapshot operation did nothing (or, for a restore, left the sandbox suspended
/// on its own files).
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The actor may not, or the sandbox or snapshot does not exist for it.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The sandbox is not live (failed, deprovisioned, being provisioned).
    #[error(
        "sandbox {sandbox_id} is {state}; only a ready or suspended sandbox can be snapshotted or restored"
    )]
    NotLive {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its state.
        state: SandboxState,
    },
    /// The org's snapshot quota is used up.
    #[error(transparent)]
    Quota(#[from] SnapshotQuotaError),
    /// A sandbox token asked for a snapshot of its sandbox, which holds
    /// `MAX_SNAPSHOTS_BY_TOKEN` (10) already.
    #[error(
        "sandbox {sandbox_id} holds {MAX_SNAPSHOTS_BY_TOKEN} snapshots; its own token may take no more (a caller key may)"
    )]
    TokenCap {
        /// The sandbox.
        sandbox_id: SandboxId,
    },
    /// The driver keeps no snapshots, or cannot for this sandbox.
    #[error("{0}")]
    Unsupported(String),
    /// The sandbox changed meanwhile (resumed while a restore waited): try again.
    #[error("{0}")]
    Conflict(String),
    /// The driver failed.
    #[error("the driver could not do it")]
    Driver(#[source] DriverError),
    /// The records could not be read or written.
    #[error("the snapshot records are unavailable")]
    Store(#[source] SnapshotStoreError),
    /// The org's policy could not be read.
    #[error(transparent)]
    Policy(PolicyReadError),
    /// The audit log could not take the event, so the snapshot was undone.
    #[error("the audit log is unavailable")]
    Audit(#[source] ports::AuditError),
    /// Starting the restored sandbox failed: as after any failed resume, its record is
    /// marked failed and its tokens revoked (audited as a failed `resume`).
    #[error("the restored sandbox could not be started again: {0}")]
    Resume(Box<ResumeError>),
    /// The suspended sandbox could not be claimed for the restore (starting it again
    /// would pass the org's quota of running sandboxes, or the registry failed); nothing
    /// changed but its suspension (its processes ended, its workspace kept: the next
    /// ensure or exec resumes it). Audited as a failed `restore`.
    #[error("the sandbox could not be claimed for the restore: {0}")]
    Claim(Box<ResumeError>),
    /// No entropy for the snapshot's id.
    #[error("no entropy for a snapshot id")]
    Entropy(#[source] getrandom::Error),
    /// The work's task ended without an answer (it panicked).
    #[error("the snapshot task failed")]
    Task,
}

/// The most snapshots of a sandbox its own token may have taken and kept at once: what a
/// process inside (a compromised one too) can make the org's disk hold is bounded by the
/// sandbox, whatever the org's quotas (unlimited by default).
pub const MAX_SNAPSHOTS_BY_TOKEN: usize = 10;

/// Runs `work` as its own task and waits for it: a caller that goes away (a closed
/// connection drops the request's future) never leaves a sandbox frozen, suspended
/// half-way or a copy unrecorded; the work runs to its end.
async fn detached<T: Send + 'static>(
    work: impl std::future::Future<Output = Result<T, SnapshotError>> + Send + 'static,
) -> Result<T, SnapshotError> {
    use tracing::Instrument as _;
    tokio::spawn(work.in_current_span()).await.unwrap_or_else(|join| {
        error!(error = %join, "a snapshot task panicked");
        Err(SnapshotError::Task)
    })
}

fn driver(e: DriverError) -> SnapshotError {
    match e {
        DriverError::Unsupported(m) => SnapshotError::Unsupported(m),
        DriverError::Conflict(m) => SnapshotError::Conflict(m),
        e => SnapshotError::Driver(e),
    }
}

/// The caller an event of `actor` names: the caller itself, or for a sandbox token the
/// caller it acts for.
fn acting_caller(actor: &Actor, record: &SandboxRecord) -> SandboxCaller {
    match actor {
        Actor::Caller(c) => c.sandbox_caller(),
        Actor::SandboxToken { .. } => record.token_caller.clone(),
    }
}

fn not_live(record: &SandboxRecord) -> Option<SnapshotError> {
    (!matches!(record.state, SandboxState::Ready | SandboxState::Suspended))
        .then(|| SnapshotError::NotLive { sandbox_id: record.id.clone(), state: record.state })
}

fn snapshot_ref(s: &Snapshot) -> SnapshotRef {
    SnapshotRef { org: s.org.clone(), id: s.id.clone() }
}

/// A new time-ordered snapshot id.
fn fresh_snapshot_id(now: Timestamp) -> Result<SnapshotId, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(SnapshotId::generate(u64::try_from(now.unix_millis()).unwrap_or(0), u128::from_le_bytes(bytes)))
}

/// Takes a snapshot of the workspace of sandbox `sandbox_id` of `org` for `actor`.
///
/// # Errors
/// [`SnapshotError`]; on any error after the copy, the copy is removed.
pub async fn take_snapshot(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    name: Option<SnapshotName>,
) -> Result<Snapshot, SnapshotError> {
    let (deps, actor, org, sandbox_id) = (deps.clone(), actor.clone(), org.clone(), sandbox_id.clone());
    detached(async move { take(&deps, &actor, &org, &sandbox_id, name).await }).await
}

async fn take(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    name: Option<SnapshotName>,
) -> Result<Snapshot, SnapshotError> {
    let record = authorize_sandbox(deps, actor, Operation::Snapshot, org, sandbox_id).await?;
    if let Some(e) = not_live(&record) {
        return Err(e);
    }
    if let Actor::SandboxToken { .. } = actor {
        let held = deps.snapshots.list(org, None).await.map_err(SnapshotError::Store)?;
        if held.iter().filter(|s| s.source == record.id).count() >= MAX_SNAPSHOTS_BY_TOKEN {
            return Err(SnapshotError::TokenCap { sandbox_id: record.id.clone() });
        }
    }
    let policy = deps.policies.of(org).await.map_err(SnapshotError::Policy)?;
    let usage = deps.snapshots.usage(org).await.map_err(SnapshotError::Store)?;
    admit(&policy.policy, usage.count, usage.bytes, 0)?;
    let owner = deps
        .registry
        .owner(&record.key)
        .await
        .map_err(|e| SnapshotError::Access(AccessError::Unavailable(e)))?
        .map_or_else(|| record.token_caller.identity_id().clone(), |o| o.identity_id);
    let now = deps.clock.now();
    let id = fresh_snapshot_id(now).map_err(SnapshotError::Entropy)?;
    let target = SnapshotRef { org: org.clone(), id: id.clone() };
    let budget = SnapshotBudget {
        quota_left: policy.policy.snapshot_bytes().map(|limit| limit.saturating_sub(usage.bytes)),
        workspace_bytes: policy.policy.workspace_bytes(),
    };
    // Past what the quota leaves, the driver's `ResourceExhausted` (429, as the quota's
    // own check after the copy); past what the workspace can hold, `TooLarge` (413).
    let bytes = deps.driver.snapshot(&record.id, &target, budget).await.map_err(driver)?;
    let caller = acting_caller(actor, &record);
    let snapshot = Snapshot {
        id,
        org: org.clone(),
        source: record.id.clone(),
        source_key: record.key.clone(),
        owner,
        created_by: caller.identity_id().clone(),
        name,
        created_at: now,
        bytes,
    };
    let limits = SnapshotLimits {
        max_count: policy.policy.max_snapshots(),
        max_bytes: policy.policy.snapshot_bytes(),
        // Checked again where it is written: a token's snapshots taken at once all pass
        // the count read above.
        max_from_source: matches!(actor, Actor::SandboxToken { .. })
            .then(|| u32::try_from(MAX_SNAPSHOTS_BY_TOKEN).unwrap_or(u32::MAX)),
    };
    let undo = |why: &str| {
        let (driver, target) = (deps.driver.clone(), target.clone());
        let why = why.to_owned();
        async move {
            if let Err(e) = driver.delete_snapshot(&target).await {
                error!(snapshot = %target.id, error = %e, "could not remove the files of a snapshot that was {why}");
            }
        }
    };
    match deps.snapshots.insert(&snapshot, limits).await {
        Ok(()) => {}
        Err(SnapshotStoreError::SourceCap) => {
            undo("over the token's count").await;
            return Err(SnapshotError::TokenCap { sandbox_id: record.id.clone() });
        }
        Err(SnapshotStoreError::OverQuota(held)) => {
            undo("over the quota").await;
            admit(&policy.policy, held.count, held.bytes, bytes)?;
            // Within the quota by the numbers read now: another snapshot raced it.
            return Err(SnapshotError::Quota(SnapshotQuotaError::Count {
                held: held.count,
                limit: policy.policy.max_snapshots().unwrap_or(0),
            }));
        }
        Err(e) => {
            undo("not recorded").await;
            return Err(SnapshotError::Store(e));
        }
    }
    let ctx = EventContext {
        action: AuditAction::Snapshot,
        key: &record.key,
        caller: &caller,
        driver: deps.driver.name(),
    };
    let message = format!("snapshot {} ({bytes} bytes)", snapshot.lineage());
    let event = ctx.event(
        AuditOutcome::Taken,
        Some(&record.id),
        Some(record.durability),
        None,
        message,
        deps.clock.now(),
    );
    if let Err(e) = deps.audit.append(&event).await {
        // A snapshot that is not in the audit log does not exist.
        let _ = deps.snapshots.delete(org, &snapshot.id).await;
        undo("not audited").await;
        return Err(SnapshotError::Audit(e));
    }
    info!(snapshot = %snapshot.id, sandbox_id = %record.id, bytes, "snapshot taken");
    Ok(snapshot)
}

/// The snapshot `id` of `org` if `actor` may use it (fork from it, read it, delete it);
/// one it may not is reported as not found, like one that does not exist.
///
/// # Errors
/// [`AccessError::NoSnapshot`], [`AccessError::Denied`] (a sandbox token, a caller of
/// another org), [`AccessError::Unavailable`].
pub async fn usable_snapshot(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    id: &SnapshotId,
) -> Result<Snapshot, AccessError> {
    precheck(actor, Operation::UseSnapshot, org)?;
    let missing = || AccessError::NoSnapshot { snapshot: id.clone(), org: org.clone() };
    let snapshot = deps
        .snapshots
        .get(org, id)
        .await
        .map_err(|e| AccessError::Unavailable(ports::RegistryError::Store(ports::Cause::new(e))))?
        .ok_or_else(missing)?;
    let target = Target { org, owner: Some(&snapshot.owner), sandbox_id: None };
    match domain::authorize(actor, Operation::UseSnapshot, &target) {
        Ok(()) => Ok(snapshot),
        Err(Denial::NotOwner { .. }) => Err(missing()),
        Err(d) => Err(AccessError::Denied(d)),
    }
}

/// The snapshots of `org` that `actor` may use: all of them for the org's service
/// callers, a user's own otherwise.
///
/// # Errors
/// [`SnapshotError::Access`] (a sandbox token, a caller of another org);
/// [`SnapshotError::Store`].
pub async fn list_snapshots(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
) -> Result<Vec<Snapshot>, SnapshotError> {
    precheck(actor, Operation::UseSnapshot, org)?;
    let owner: Option<IdentityId> = match actor {
        Actor::Caller(c) if c.class() == domain::CallerClass::User => Some(c.identity_id().clone()),
        _ => None,
    };
    deps.snapshots.list(org, owner).await.map_err(SnapshotError::Store)
}

/// Deletes a snapshot (its files, then its record). Forks made from it keep theirs.
///
/// # Errors
/// [`SnapshotError`].
pub async fn delete_snapshot(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    id: &SnapshotId,
) -> Result<(), SnapshotError> {
    let (deps, actor, org, id) = (deps.clone(), actor.clone(), org.clone(), id.clone());
    detached(async move { delete(&deps, &actor, &org, &id).await }).await
}

async fn delete(deps: &LaneDeps, actor: &Actor, org: &OrgId, id: &SnapshotId) -> Result<(), SnapshotError> {
    let snapshot = usable_snapshot(deps, actor, org, id).await?;
    deps.driver.delete_snapshot(&snapshot_ref(&snapshot)).await.map_err(driver)?;
    deps.snapshots.delete(org, id).await.map_err(SnapshotError::Store)?;
    let caller = match actor {
        Actor::Caller(c) => c.sandbox_caller(),
        Actor::SandboxToken { .. } => CallerIdentity::internal().sandbox_caller(),
    };
    let ctx = EventContext {
        action: AuditAction::SnapshotDelete,
        key: &snapshot.source_key,
        caller: &caller,
        driver: deps.driver.name(),
    };
    let event = ctx.event(
        AuditOutcome::Deleted,
        Some(&snapshot.source),
        None,
        None,
        format!("snapshot {}", snapshot.lineage()),
        deps.clock.now(),
    );
    if let Err(e) = deps.audit.append(&event).await {
        error!(snapshot = %id, error = %e, "the snapshot's deletion could not be audited");
    }
    Ok(())
}

/// Restores sandbox `sandbox_id` of `org` from snapshot `id`: its processes end (it is
/// suspended), its workspace becomes the snapshot's files, and it starts again under the
/// same id with a fresh token minted for the caller of its latest ensure. From its
/// suspension to its start it is claimed (provisioning, under this replica's lease), so no
/// ensure or exec resumes it while its workspace is replaced.
///
/// # Errors
/// [`SnapshotError`]: a restore the driver refused leaves the sandbox started again on its
/// own files (or suspended, when that start fails too).
pub async fn restore_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &SnapshotId,
) -> Result<SandboxView, SnapshotError> {
    let (deps, actor, org, sandbox_id, id) =
        (deps.clone(), actor.clone(), org.clone(), sandbox_id.clone(), id.clone());
    detached(async move { restore(&deps, &actor, &org, &sandbox_id, &id).await }).await
}

async fn restore(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &SnapshotId,
) -> Result<SandboxView, SnapshotError> {
    let record = authorize_sandbox(deps, actor, Operation::Snapshot, org, sandbox_id).await?;
    let snapshot = match actor {
        // A sandbox token: only a snapshot of its own sandbox.
        Actor::SandboxToken { .. } => deps
            .snapshots
            .get(org, id)
            .await
            .map_err(SnapshotError::Store)?
            .filter(|s| &s.source == sandbox_id)
            .ok_or_else(|| AccessError::NoSnapshot { snapshot: id.clone(), org: org.clone() })?,
        Actor::Caller(_) => usable_snapshot(deps, actor, org, id).await?,
    };
    if let Some(e) = not_live(&record) {
        return Err(e);
    }
    let policy = deps.policies.of(org).await.map_err(SnapshotError::Policy)?;
    let now = deps.clock.now();
    let caller = acting_caller(actor, &record);
    let ctx = EventContext {
        action: AuditAction::Restore,
        key: &record.key,
        caller: &caller,
        driver: deps.driver.name(),
    };
    let audit = |outcome, message: String| {
        let event =
            ctx.event(outcome, Some(&record.id), Some(record.durability), None, message, deps.clock.now());
        async move {
            if let Err(e) = deps.audit.append(&event).await {
                error!(sandbox_id = ?event.sandbox_id, error = %e, "the restore could not be audited");
            }
        }
    };
    // Ready → suspended (whatever its activity: the far future is "idle since").
    if record.state == SandboxState::Ready {
        let moved = deps
            .registry
            .suspend(&record.id, Timestamp::from_unix_millis(i64::MAX), now)
            .await
            .map_err(|e| SnapshotError::Access(AccessError::Unavailable(e)))?;
        if !moved {
            return Err(SnapshotError::Conflict(format!(
                "sandbox {sandbox_id} changed state meanwhile; try again"
            )));
        }
        // Its processes end now, as an idle suspension's do: should the claim below be
        // refused (the org's quota lowered meanwhile, the store down), the record would
        // otherwise say suspended while they ran on, outside the org's quota.
        end_processes(deps, &record.id).await;
    }
    let suspended = deps
        .registry
        .get(&record.id)
        .await
        .map_err(|e| SnapshotError::Access(AccessError::Unavailable(e)))?
        .filter(|r| r.state == SandboxState::Suspended)
        .ok_or_else(|| {
            SnapshotError::Conflict(format!("sandbox {sandbox_id} changed state meanwhile; try again"))
        })?;
    // Claimed until it starts again: a resume meanwhile would start it on a workspace
    // being replaced, or see its processes ended under it.
    let claimed = match ensure::claim_suspended(deps, &suspended, &policy.policy).await {
        Ok(Some(claimed)) => claimed,
        Ok(None) => {
            return Err(SnapshotError::Conflict(format!(
                "sandbox {sandbox_id} is being resumed meanwhile; try again"
            )));
        }
        Err(e) => {
            // What the org may read: the reason's kind, never the store's own words.
            let why = match &e {
                ResumeError::Quota(_) => "starting it again would pass the org's quota of running sandboxes",
                _ => "it could not be claimed",
            };
            let message = format!(
                "from snapshot {}: not restored, the sandbox stays suspended: {why}",
                snapshot.lineage()
            );
            audit(AuditOutcome::Failed, message).await;
            return Err(SnapshotError::Claim(Box::new(e)));
        }
    };
    // Under the claim's lease, renewed while the driver works: a restore that copies a
    // large workspace for longer than a lease is not taken for a dead claim.
    let restored = ensure::with_lease_renewed(deps, &claimed, async {
        // A sandbox that was suspended already: its processes ended then (this ends any
        // a failed start left).
        end_processes(deps, &record.id).await;
        deps.driver.restore(&record.id, &snapshot_ref(&snapshot)).await
    })
    .await;
    if let Err(e) = restored {
        warn!(sandbox_id = %record.id, error = %e, "the driver refused a restore");
        let message = format!(
            "from snapshot {}: the driver refused the restore; the sandbox starts again on its own files",
            snapshot.lineage()
        );
        audit(AuditOutcome::Failed, message).await;
        // The claim is this restore's to end: the sandbox starts again on its own files.
        if let Err(resume) = ensure::resume_claimed(deps, claimed, &policy.policy).await {
            warn!(sandbox_id = %record.id, error = %resume, "the sandbox could not start again after a failed restore");
        }
        return Err(driver(e));
    }
    audit(AuditOutcome::Restored, format!("from snapshot {}", snapshot.lineage())).await;
    let ready = ensure::resume_claimed(deps, claimed, &policy.policy)
        .await
        .map_err(|e| SnapshotError::Resume(Box::new(e)))?;
    info!(sandbox_id = %ready.id, snapshot = %snapshot.id, "sandbox restored");
    Ok(SandboxView::of(&ready, None))
}

/// Ends sandbox `id`'s processes for a restore (its workspace stays); a failure is logged,
/// the restore goes on (the driver's restore refuses a sandbox still running).
async fn end_processes(deps: &LaneDeps, id: &SandboxId) {
    match deps.driver.suspend(id).await {
        Ok(()) | Err(DriverError::NotFound(_)) => {}
        Err(e) => warn!(sandbox_id = %id, error = %e, "ending the sandbox's processes for a restore failed"),
    }
}

#[cfg(test)]
mod tests;
