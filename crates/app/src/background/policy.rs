//! The org policy's background passes, run as the server's `internal` caller on every
//! replica (each step is a conditional write in the store, so two replicas running the
//! same pass do each thing once):
//!
//! - [`flush_activity_once`]: reports this replica's sandbox activity (one write per
//!   sandbox touched since the last flush; see `usecase::ActivityTracker`);
//! - [`suspend_idle_once`]: suspends the ready sandboxes idle past their org's timeout
//!   (the record moves only if its recorded activity is still that old; then the driver
//!   ends the processes through the cgroup and keeps the workspace), audited;
//! - [`expire_once`]: deprovisions the sandboxes older than their org's maximum lifetime,
//!   audited with the reason;
//! - [`refill_pools_once`]: keeps each org's pool of warm ephemeral sandboxes at its size
//!   (and removes the warm sandboxes the policy no longer wants), standing aside while an
//!   org adopts from a pool that is not empty;
//! - [`heartbeat_commands_once`]: renews and gives back this replica's command-quota leases.

use std::collections::BTreeSet;
use std::time::Duration;

use domain::policy::{format_duration_ms, format_size};
use domain::sandbox::SandboxRecord;
use domain::split::{RecordSubject, split_caller};
use domain::{
    AuditAction, AuditEvent, AuditOutcome, CallerIdentity, Durability, OrgId, OrgPolicy, SandboxKey,
    SandboxState, SandboxToken, Timestamp,
};
use ports::{DriverError, PolicyStoreError, ProvisionSpec, WarmSandbox, WarmSlotRequest};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use super::every;
use crate::usecase::LaneDeps;

pub use domain::policy::{WARM_EXECUTION_ID as WARM_EXECUTION, warm_key};

fn internal_event(
    deps: &LaneDeps,
    record: &SandboxRecord,
    action: AuditAction,
    outcome: AuditOutcome,
    message: String,
) -> AuditEvent {
    let internal = CallerIdentity::internal();
    AuditEvent {
        action,
        key: record.key.clone(),
        sandbox_id: Some(record.id.clone()),
        caller_id: internal.identity_id().clone(),
        caller_class: internal.class(),
        durability: Some(record.durability),
        driver: record.driver.clone(),
        outcome,
        message,
        token_id: None,
        at: deps.clock.now(),
    }
}

async fn audit(deps: &LaneDeps, event: &AuditEvent) {
    if let Err(e) = deps.audit.append(event).await {
        error!(error = %e, sandbox_id = ?event.sandbox_id, outcome = %event.outcome, "audit append failed");
    }
}

/// Reports this replica's activity to the store.
pub async fn flush_activity_once(deps: &LaneDeps) {
    if let Err(e) = deps.activity.flush(deps.registry.as_ref(), deps.clock.now()).await {
        warn!(error = %e, "cannot record sandbox activity; kept for the next flush");
    }
}

/// The shortest value of `limit` in any org's effective policy: the defaults (every org
/// with no stored change has them) and each org's stored changes laid over them. `None`
/// when no org has the limit. The idle and lifetime passes read only the records older
/// than this (their candidates), not every live sandbox, and nothing at all when no org
/// has the limit; each candidate is then checked against its own org's policy. (An org
/// whose stored changes no longer apply is skipped: its sandboxes are skipped anyway.)
async fn shortest(
    deps: &LaneDeps,
    limit: fn(&OrgPolicy) -> Option<u64>,
) -> Result<Option<u64>, PolicyStoreError> {
    let stored = deps.policies.store().list().await?;
    let changed = stored.iter().filter_map(|(org, o)| deps.policies.effective(org, Some(o)).ok());
    Ok(std::iter::once(limit(deps.policies.defaults()))
        .chain(changed.map(|e| limit(&e.policy)))
        .flatten()
        .min())
}

/// The records a pass over `limit` looks at: `list` of the cut-off `now` less the shortest
/// `limit` (see [`shortest`]). `None` when no org has the limit, or when the policies or
/// the records cannot be read (logged; the next pass tries again).
async fn candidates<F, Fut>(
    deps: &LaneDeps,
    pass: &str,
    now: Timestamp,
    limit: fn(&OrgPolicy) -> Option<u64>,
    list: F,
) -> Option<Vec<SandboxRecord>>
where
    F: FnOnce(Timestamp) -> Fut,
    Fut: Future<Output = Result<Vec<SandboxRecord>, ports::RegistryError>>,
{
    let shortest = match shortest(deps, limit).await {
        Ok(shortest) => shortest?,
        Err(e) => {
            error!(error = %e, "{pass} pass: cannot list the orgs' policies");
            return None;
        }
    };
    match list(before(now, shortest)).await {
        Ok(records) => Some(records),
        Err(e) => {
            error!(error = %e, "{pass} pass: cannot list its candidates");
            None
        }
    }
}

/// `now` less `ms` (the cut-off of a limit of `ms`).
fn before(now: Timestamp, ms: u64) -> Timestamp {
    now.plus_millis(-i64::try_from(ms).unwrap_or(i64::MAX))
}

/// What one idle pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SuspendReport {
    /// Sandboxes suspended.
    pub suspended: usize,
    /// Sandboxes whose processes could not be ended (logged and audited as failed).
    pub failed: usize,
}

/// Suspends every ready sandbox idle past its org's timeout (see the module docs).
pub async fn suspend_idle_once(deps: &LaneDeps) -> SuspendReport {
    let mut report = SuspendReport::default();
    flush_activity_once(deps).await;
    let now = deps.clock.now();
    let Some(live) =
        candidates(deps, "idle", now, OrgPolicy::idle_timeout_ms, |cutoff| deps.registry.list_idle(cutoff))
            .await
    else {
        return report;
    };
    for record in live.iter().filter(|r| r.state == SandboxState::Ready) {
        let Ok(policy) = deps.policies.of(record.key.org()).await else { continue };
        let Some(timeout) = policy.policy.idle_timeout_ms() else { continue };
        if !policy.policy.is_idle(record.last_active_at, now) || deps.activity.is_busy(&record.id) {
            continue;
        }
        let idle_since = before(now, timeout);
        match deps.registry.suspend(&record.id, idle_since, now).await {
            Ok(true) => {}
            Ok(false) => continue, // active meanwhile, or moved on
            Err(e) => {
                warn!(error = %e, sandbox_id = %record.id, "idle pass: cannot suspend");
                continue;
            }
        }
        let idle = format_duration_ms(timeout);
        let (outcome, message) = match deps.driver.suspend(&record.id).await {
            Ok(()) | Err(DriverError::NotFound(_)) => {
                report.suspended += 1;
                info!(sandbox_id = %record.id, idle = %idle, "sandbox suspended");
                (AuditOutcome::Suspended, format!("idle for {idle}, the org's idle timeout"))
            }
            Err(e) => {
                // The record says suspended: the next ensure or exec starts it again with
                // a newer epoch, which replaces whatever still runs.
                report.failed += 1;
                error!(error = %e, sandbox_id = %record.id, "idle pass: the driver could not end the sandbox's processes");
                (AuditOutcome::Failed, format!("idle for {idle}; ending its processes failed: {e}"))
            }
        };
        audit(deps, &internal_event(deps, record, AuditAction::Suspend, outcome, message)).await;
    }
    report
}

/// What one lifetime pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ExpireReport {
    /// Sandboxes deprovisioned for their age.
    pub expired: usize,
    /// Sandboxes whose removal failed (retried by the next pass or the reconciler).
    pub failed: usize,
}

/// Deprovisions every ready or suspended sandbox older than its org's maximum lifetime:
/// its tokens are revoked first, then the driver removes it (a durable workspace stays
/// for the key's next ensure). Audited as `deprovision`/`expired` with the reason.
pub async fn expire_once(deps: &LaneDeps) -> ExpireReport {
    let mut report = ExpireReport::default();
    let now = deps.clock.now();
    let Some(live) = candidates(deps, "lifetime", now, OrgPolicy::max_lifetime_ms, |cutoff| {
        deps.registry.list_created_before(cutoff)
    })
    .await
    else {
        return report;
    };
    for record in live.iter().filter(|r| matches!(r.state, SandboxState::Ready | SandboxState::Suspended)) {
        let Ok(policy) = deps.policies.of(record.key.org()).await else { continue };
        let Some(lifetime) = policy.policy.max_lifetime_ms() else { continue };
        if !policy.policy.outlived(record.created_at, now) {
            continue;
        }
        match deps.registry.mark_deprovisioned(&record.id, now).await {
            Ok(Some(before)) if before.state.is_live() => {}
            Ok(_) => continue, // retired meanwhile
            Err(e) => {
                warn!(error = %e, sandbox_id = %record.id, "lifetime pass: cannot retire");
                continue;
            }
        }
        let steps = async {
            deps.minter.revoke(&record.id).await.map_err(|e| e.to_string())?;
            deps.driver.deprovision(&record.id).await.map_err(|e| e.to_string())
        }
        .await;
        let reason = format!(
            "reached the org's maximum lifetime of {} (created {})",
            format_duration_ms(lifetime),
            record.created_at
        );
        let (outcome, message) = match steps {
            Ok(()) => {
                report.expired += 1;
                info!(sandbox_id = %record.id, "sandbox expired");
                (AuditOutcome::Expired, reason)
            }
            Err(e) => {
                report.failed += 1;
                error!(error = %e, sandbox_id = %record.id, "lifetime pass: removal failed");
                (AuditOutcome::Failed, format!("{reason}; removal failed: {e}"))
            }
        };
        audit(deps, &internal_event(deps, record, AuditAction::Deprovision, outcome, message)).await;
    }
    report
}

/// What one pool pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolReport {
    /// Warm sandboxes provisioned.
    pub provisioned: usize,
    /// Warm sandboxes removed (pool shrunk, quota changed, lapsed).
    pub removed: usize,
    /// Warm provisions that failed.
    pub failed: usize,
    /// Orgs whose refill waits because they are adopting (their pool not empty).
    pub deferred: usize,
}

/// Keeps every org's pool at its size: the orgs with a stored policy or a live sandbox
/// (orgs the lane has seen), each with its effective policy. Removes warm sandboxes the
/// pool no longer wants (size lowered, another workspace quota, another driver, or a
/// provision whose lease lapsed), then provisions what is missing.
pub async fn refill_pools_once(deps: &LaneDeps) -> PoolReport {
    let mut report = PoolReport::default();
    let warm = match deps.registry.list_warm().await {
        Ok(w) => w,
        Err(e) => {
            error!(error = %e, "pool pass: cannot list warm sandboxes");
            return report;
        }
    };
    let mut orgs: BTreeSet<OrgId> = warm.iter().map(|w| w.org.clone()).collect();
    match deps.policies.store().list().await {
        Ok(stored) => orgs.extend(stored.into_iter().map(|(org, _)| org)),
        Err(e) => warn!(error = %e, "pool pass: cannot list the stored policies"),
    }
    match deps.registry.live_counts().await {
        Ok(counts) => orgs.extend(counts.into_iter().map(|c| c.org)),
        Err(e) => warn!(error = %e, "pool pass: cannot count live sandboxes"),
    }
    let now = deps.clock.now();
    let driver = deps.driver.name();
    for org in orgs {
        let policy = match deps.policies.of(&org).await {
            Ok(p) => p,
            Err(e) => {
                warn!(org = %org, error = %crate::usecase::chain(&e), "pool pass: no policy; pool left as it is");
                continue;
            }
        };
        let target = policy.policy.warm_pool() as usize;
        let bytes = policy.policy.workspace_bytes();
        let (mut kept, mut ready) = (0, 0);
        for w in warm.iter().filter(|w| w.org == org) {
            let wanted = w.driver == driver
                && w.workspace_bytes == bytes
                && (w.ready || w.lease.expires_at > now)
                && kept < target;
            if wanted {
                kept += 1;
                ready += usize::from(w.ready);
            } else if (w.ready || w.lease.expires_at <= now) && remove_warm(deps, w).await {
                report.removed += 1;
            }
        }
        // An org adopting here, with warm sandboxes left, is refilled once it is quiet
        // (see `usecase::PoolDemand`).
        if kept < target && ready > 0 && deps.pool_demand.adopting(&org, now) {
            report.deferred += 1;
            continue;
        }
        while kept < target {
            let Ok(candidate) = crate::usecase::fresh_id(now) else { break };
            let request = WarmSlotRequest {
                org: org.clone(),
                candidate_id: candidate,
                workspace_bytes: bytes,
                target: policy.policy.warm_pool(),
                driver: driver.to_owned(),
                holder: deps.replica_id.clone(),
                lease_ms: deps.lease_ms,
                now: deps.clock.now(),
            };
            let slot = match deps.registry.claim_warm_slot(&request).await {
                Ok(Some(slot)) => slot,
                Ok(None) => break, // full (another replica filled it)
                Err(e) => {
                    warn!(org = %org, error = %e, "pool pass: cannot claim a warm slot");
                    break;
                }
            };
            if provision_warm(deps, &slot).await {
                report.provisioned += 1;
                kept += 1;
            } else {
                report.failed += 1;
                break; // try again next pass
            }
        }
    }
    report
}

/// Takes `w` out of the pool and removes it from the driver; whether it did.
async fn remove_warm(deps: &LaneDeps, w: &WarmSandbox) -> bool {
    match deps.registry.remove_warm(&w.id).await {
        Ok(true) => {
            if let Err(e) = deps.driver.deprovision(&w.id).await {
                warn!(error = %e, sandbox_id = %w.id, "pool pass: cannot remove a warm sandbox (the reconciler retries)");
            }
            true
        }
        Ok(false) => false, // adopted meanwhile
        Err(e) => {
            warn!(error = %e, sandbox_id = %w.id, "pool pass: cannot take a warm sandbox out of the pool");
            false
        }
    }
}

/// Provisions a warm sandbox: the org's workspace quota, an ephemeral workspace, the
/// internal class in its environment and no credential (nothing runs in it, and nobody is
/// there to act for, until a claim adopts it and binds both).
async fn provision_warm(deps: &LaneDeps, slot: &WarmSandbox) -> bool {
    let key = warm_key(&slot.org);
    let SandboxKey::Workflow { execution_id, .. } = &key else { return false };
    let spec = ProvisionSpec {
        environment: split_caller(
            &RecordSubject::new(&key, execution_id),
            &CallerIdentity::internal().sandbox_caller(),
            &slot.id,
        )
        .1,
        key: key.clone(),
        durability: Durability::Ephemeral,
        credential: SandboxToken::new(""),
        epoch: slot.lease.epoch,
        workspace_bytes: slot.workspace_bytes,
        from_snapshot: None,
    };
    // Under its lease, renewed while the driver provisions (a pod may take minutes).
    let renew = |until, now| deps.registry.renew_warm_lease(&slot.id, slot.lease.epoch, until, now);
    let provisioned = crate::usecase::with_renewal(deps, &slot.id, renew, deps.driver.provision(&spec)).await;
    if let Err(e) = provisioned {
        warn!(org = %slot.org, error = %e, "pool pass: a warm provision failed");
        let _ = deps.registry.remove_warm(&slot.id).await;
        let _ = deps.driver.deprovision(&slot.id).await;
        return false;
    }
    match deps.registry.mark_warm_ready(&slot.id, slot.lease.epoch, deps.clock.now()).await {
        Ok(()) => {
            debug!(org = %slot.org, sandbox_id = %slot.id, bytes = ?slot.workspace_bytes.map(format_size), "warm sandbox ready");
            true
        }
        Err(e) => {
            warn!(org = %slot.org, error = %e, "pool pass: the warm slot was taken away; removing its sandbox");
            let _ = deps.driver.deprovision(&slot.id).await;
            false
        }
    }
}

/// Renews and gives back this replica's command-quota leases.
pub async fn heartbeat_commands_once(deps: &LaneDeps) {
    deps.commands.heartbeat().await;
}

/// How often each policy pass runs.
#[derive(Debug, Clone, Copy)]
pub struct PolicyIntervals {
    /// Idle suspension, maximum lifetime and pool refill.
    pub policy: Duration,
    /// Activity reports.
    pub activity: Duration,
    /// Whether the idle pass runs: only when the driver can end a sandbox's processes and
    /// keep its workspace (bubblewrap, containers). The Kubernetes driver cannot (an
    /// ephemeral workspace lives and dies with its pod), so with it no sandbox is ever
    /// marked suspended and org idle timeouts are not applied (the server says so at start).
    pub idle_suspension: bool,
}

/// Starts the policy passes on the runtime; they stop when `shutdown` flips.
pub fn spawn_policy_passes(
    deps: std::sync::Arc<LaneDeps>,
    intervals: PolicyIntervals,
    shutdown: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    #[derive(Clone, Copy)]
    enum Pass {
        Activity,
        Commands,
        Idle,
        Lifetime,
        Pool,
    }
    let pass = |interval: Duration, which: Pass| {
        let deps = deps.clone();
        let stop = shutdown.clone();
        tokio::spawn(every(interval, stop, move || {
            let deps = deps.clone();
            async move {
                match which {
                    Pass::Activity => flush_activity_once(&deps).await,
                    Pass::Commands => heartbeat_commands_once(&deps).await,
                    Pass::Idle => {
                        let r = suspend_idle_once(&deps).await;
                        if r.suspended + r.failed > 0 {
                            info!(suspended = r.suspended, failed = r.failed, "idle pass");
                        }
                    }
                    Pass::Lifetime => {
                        let r = expire_once(&deps).await;
                        if r.expired + r.failed > 0 {
                            info!(expired = r.expired, failed = r.failed, "lifetime pass");
                        }
                    }
                    Pass::Pool => {
                        let r = refill_pools_once(&deps).await;
                        if r.provisioned + r.removed + r.failed > 0 {
                            info!(
                                provisioned = r.provisioned,
                                removed = r.removed,
                                failed = r.failed,
                                "pool pass"
                            );
                        }
                    }
                }
            }
        }))
    };
    let mut passes = vec![
        pass(intervals.activity, Pass::Activity),
        pass(crate::usecase::COMMAND_HEARTBEAT, Pass::Commands),
        pass(intervals.policy, Pass::Lifetime),
        pass(intervals.policy, Pass::Pool),
    ];
    if intervals.idle_suspension {
        passes.push(pass(intervals.policy, Pass::Idle));
    }
    passes
}
