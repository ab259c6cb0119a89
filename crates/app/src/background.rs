//! Background work the server runs as the in-process `internal` caller: refreshing
//! credentials before they expire (still minted FOR the caller who asked), reconciling
//! claims and driver state no live record owns, and the org policy's passes (idle
//! suspension, maximum lifetime, warm pools, activity and command-quota leases: `policy`).
//! (The audit sealer is the store's own `adapters::sql::spawn_sealer`.)

use std::collections::HashSet;
use std::time::Duration;

use domain::sandbox::SandboxRecord;
use domain::split::{RecordSubject, split_caller};
use domain::{AuditAction, AuditEvent, AuditOutcome, CallerIdentity, SandboxState};
use ports::{DriverError, RegistryError, TokenGrant};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

use crate::usecase::LaneDeps;

mod policy;

pub use policy::{
    ExpireReport, PolicyIntervals, PoolReport, SuspendReport, WARM_EXECUTION, expire_once,
    flush_activity_once, heartbeat_commands_once, refill_pools_once, spawn_policy_passes, suspend_idle_once,
    warm_key,
};

/// What one refresh pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RefreshReport {
    /// Credentials re-minted and delivered.
    pub refreshed: usize,
    /// Sandboxes whose refresh failed (logged).
    pub failed: usize,
    /// Sandboxes not refreshed because the caller their token is for was revoked.
    pub skipped_revoked: usize,
    /// Ready records whose sandbox the driver no longer held (it ended on its own),
    /// retired so their keys are provisioned again and their orgs' quotas freed.
    pub retired: usize,
}

/// What one reconcile pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Provisioning claims whose lease had expired, now failed.
    pub expired_claims: usize,
    /// Driver sandboxes no live record owns, now removed.
    pub orphans_removed: usize,
    /// Driver sandboxes left alone because their record could not be read.
    pub skipped_unreadable: usize,
}

fn internal_event(
    deps: &LaneDeps,
    record: &domain::sandbox::SandboxRecord,
    action: AuditAction,
    outcome: AuditOutcome,
    token_id: Option<&domain::TokenId>,
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
        token_id: token_id.cloned(),
        at: deps.clock.now(),
    }
}

/// How many sandboxes one refresh pass refreshes at once. A refresh can wait on the
/// sandbox (a container's supervisor is pinged) or on the Kubernetes API, each up to the
/// driver's own timeouts: one that stalls holds one place, never the whole pass.
pub const REFRESH_AT_ONCE: usize = 16;

/// The longest one sandbox's refresh may take before it counts as failed (and is tried
/// again at the next pass). A pass whose places are all held by sandboxes that never
/// answer still ends, and the next one reaches everyone else: at the defaults (a token
/// lives 15 minutes and is re-minted in its last 5, a pass a minute) a refresh has about
/// four passes to succeed.
pub const REFRESH_DEADLINE: Duration = Duration::from_secs(30);

/// Re-mints the credential of every ready sandbox whose token expires within `margin`,
/// FOR the caller its current token was minted for (the latest ensurer), with the same
/// execution, and delivers it to the driver. A sandbox whose token caller was revoked is
/// not refreshed: its token runs out (and no longer verifies anyway); the sandbox stays.
/// [`REFRESH_AT_ONCE`] sandboxes are refreshed at a time, each within
/// [`REFRESH_DEADLINE`].
pub async fn refresh_once(deps: &LaneDeps, margin: Duration) -> RefreshReport {
    let mut report = RefreshReport::default();
    let horizon = deps.clock.now().plus_millis(i64::try_from(margin.as_millis()).unwrap_or(i64::MAX));
    let due = match deps.registry.list_token_expiring(horizon).await {
        Ok(due) => due,
        Err(e) => {
            error!(error = %e, "refresher: cannot list the sandboxes whose token expires soon");
            return report;
        }
    };
    // The store's answer is checked again: a record is re-minted only when it is due.
    let is_due = |r: &SandboxRecord| {
        r.state == SandboxState::Ready && r.token_expires_at.is_none_or(|exp| exp <= horizon)
    };
    let mut due = due.into_iter().filter(is_due);
    // Dropped with the pass (at a stop past its grace), the set ends what still runs.
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < REFRESH_AT_ONCE
            && let Some(listed) = due.next()
        {
            let deps = deps.clone();
            running.spawn(async move {
                let refreshed =
                    tokio::time::timeout(REFRESH_DEADLINE, refresh_one(&deps, &listed)).await.unwrap_or_else(
                        |_| Refreshed::Failed(format!("no answer within {} s", REFRESH_DEADLINE.as_secs())),
                    );
                (listed, refreshed)
            });
        }
        let Some(joined) = running.join_next().await else { break };
        match joined {
            Ok((listed, refreshed)) => settle_refresh(deps, &listed, refreshed, &mut report).await,
            Err(e) => {
                report.failed += 1;
                error!(error = %e, "refresher: a refresh task ended abnormally");
            }
        }
    }
    report
}

/// Counts, audits and logs what the refresh of `listed` came to.
async fn settle_refresh(
    deps: &LaneDeps,
    listed: &SandboxRecord,
    refreshed: Refreshed,
    report: &mut RefreshReport,
) {
    match refreshed {
        Refreshed::Done { record, token_id } => {
            report.refreshed += 1;
            let event = internal_event(
                deps,
                &record,
                AuditAction::Refresh,
                AuditOutcome::Refreshed,
                Some(&token_id),
                format!("credential re-minted for {}", record.token_caller.identity_id()),
            );
            if let Err(e) = deps.audit.append(&event).await {
                error!(error = %e, sandbox_id = %record.id, "refresher: audit append failed");
            }
            debug!(sandbox_id = %record.id, "credential refreshed");
        }
        Refreshed::Revoked => report.skipped_revoked += 1,
        Refreshed::Gone(record) => match retire_lost(deps, &record).await {
            Ok(()) => report.retired += 1,
            Err(e) => {
                report.failed += 1;
                warn!(error = %e, sandbox_id = %record.id, "refresher: cannot retire a sandbox the driver lost");
            }
        },
        // Re-minted since it was listed (an ensure, another replica), or no longer
        // ready: nothing is due.
        Refreshed::Moved => {}
        Refreshed::Failed(e) => {
            report.failed += 1;
            warn!(error = %e, sandbox_id = %listed.id, "refresher: could not refresh the credential");
        }
    }
}

/// What the refresh of one sandbox came to.
enum Refreshed {
    /// Re-minted and recorded (for the record as it was then).
    Done { record: Box<SandboxRecord>, token_id: domain::TokenId },
    /// Its token's caller is revoked: not re-minted.
    Revoked,
    /// Not due any more, or not ready.
    Moved,
    /// The driver no longer holds it (its init ended on its own, the host lost it).
    Gone(Box<SandboxRecord>),
    /// It failed (the message says where).
    Failed(String),
}

/// How many times one sandbox's refresh is tried when a newer token is recorded under it.
const REFRESH_TRIES: usize = 3;

/// Refreshes the sandbox `listed`, read again first: the list may be seconds old by the
/// time it is reached, and an ensure meanwhile made another caller the one its token acts
/// for. The new token is recorded only over the token read (see
/// [`ports::SandboxRegistry::record_token`]). When another was recorded meanwhile, this
/// refresh's delivery may have replaced that newer token in the sandbox, so it is done
/// again for the record as it is now (its caller).
async fn refresh_one(deps: &LaneDeps, listed: &SandboxRecord) -> Refreshed {
    for attempt in 0..REFRESH_TRIES {
        let record = match deps.registry.get(&listed.id).await {
            Ok(Some(r)) if r.state == SandboxState::Ready => r,
            Ok(_) => return Refreshed::Moved,
            Err(e) => return Refreshed::Failed(e.to_string()),
        };
        if attempt == 0 && record.token_id != listed.token_id {
            return Refreshed::Moved;
        }
        let for_caller = record.token_caller.identity_id();
        match deps.directory.is_revoked(for_caller).await {
            Ok(false) => {}
            Ok(true) => {
                debug!(sandbox_id = %record.id, caller = %for_caller, "refresher: caller revoked; not re-minting");
                return Refreshed::Revoked;
            }
            Err(e) => return Refreshed::Failed(format!("cannot check the caller: {e}")),
        }
        // Cut as the latest ensure was: minted FOR its caller, its class in the commands'
        // environment (the record's creator may have been another caller).
        let subject = RecordSubject::new(&record.key, &record.execution_id);
        let (request, environment) = split_caller(&subject, &record.token_caller, &record.id);
        let minted = match deps.minter.mint(&request).await {
            Ok(minted) => minted,
            Err(e) => return Refreshed::Failed(e.to_string()),
        };
        match deps.driver.refresh_credential(&record.id, &minted.token, &environment).await {
            Ok(()) => {}
            Err(DriverError::NotFound(_)) => return Refreshed::Gone(Box::new(record)),
            Err(e) => return Refreshed::Failed(e.to_string()),
        }
        let grant = TokenGrant {
            token_id: minted.token_id.clone(),
            expires_at: minted.expires_at,
            execution_id: record.execution_id.clone(),
            caller: record.token_caller.clone(),
        };
        match deps.registry.record_token(&record.id, record.token_id.as_ref(), &grant, deps.clock.now()).await
        {
            Ok(()) => return Refreshed::Done { record: Box::new(record), token_id: minted.token_id },
            Err(RegistryError::Superseded(_)) => {
                debug!(sandbox_id = %record.id, "refresher: a newer token was recorded meanwhile; delivering for it");
            }
            Err(e) => return Refreshed::Failed(e.to_string()),
        }
    }
    Refreshed::Failed(format!("a newer token was recorded under each of {REFRESH_TRIES} tries"))
}

/// Retires `record`, whose sandbox the driver no longer holds, if it is still live (a
/// deprovision or another replica may have retired it meanwhile), and audits it as an
/// ensure that finds one does: without it, the record would hold its org's quota and be
/// re-minted for at every pass, forever.
async fn retire_lost(deps: &LaneDeps, record: &SandboxRecord) -> Result<(), String> {
    match deps.registry.get(&record.id).await {
        Ok(Some(now)) if now.state.is_live() => {}
        Ok(_) => return Ok(()),
        Err(e) => return Err(e.to_string()),
    }
    crate::usecase::retire_gone(deps, &record.id).await.map_err(|e| e.to_string())?;
    let message =
        format!("sandbox {} was gone from the driver; retired so the key is provisioned again", record.id);
    let event = internal_event(deps, record, AuditAction::Refresh, AuditOutcome::Repaired, None, message);
    deps.audit.append(&event).await.map_err(|e| format!("retired, but not audited: {e}"))?;
    Ok(())
}

/// Fails provisioning claims whose lease expired (their holder is presumed dead; a late
/// holder is fenced by the epoch) and removes driver sandboxes no live record owns. It
/// never destroys on doubt: when the registry cannot be read, the pass (or that sandbox)
/// is skipped.
pub async fn reconcile_once(deps: &LaneDeps) -> ReconcileReport {
    let mut report = ReconcileReport::default();
    let now = deps.clock.now();
    let expired = match deps.registry.list_lease_expired(now).await {
        Ok(expired) => expired,
        Err(e) => {
            error!(error = %e, "reconciler: cannot list expired provisioning claims");
            return report;
        }
    };
    for record in
        expired.iter().filter(|r| r.state == SandboxState::Provisioning && r.lease.expires_at <= now)
    {
        let message =
            format!("provisioning lease of {} expired at {}", record.lease.holder, record.lease.expires_at);
        if let Err(e) = deps.registry.mark_failed(&record.id, record.lease.epoch, &message, now).await {
            debug!(error = %e, sandbox_id = %record.id, "reconciler: claim moved on meanwhile");
            continue;
        }
        if let Err(e) = deps.minter.revoke(&record.id).await {
            error!(error = %e, sandbox_id = %record.id, "reconciler: revocation failed");
        }
        if let Err(e) = deps.driver.deprovision(&record.id).await {
            warn!(error = %e, sandbox_id = %record.id, "reconciler: driver cleanup failed");
        }
        let event = internal_event(deps, record, AuditAction::Reconcile, AuditOutcome::Failed, None, message);
        if let Err(e) = deps.audit.append(&event).await {
            error!(error = %e, sandbox_id = %record.id, "reconciler: audit append failed");
        }
        report.expired_claims += 1;
    }
    // What the driver holds is listed FIRST: a sandbox is claimed (its record, or its warm
    // slot) before the driver makes it, so whatever the driver held then is in the
    // registry's listings below. Listed after them, a warm slot claimed in between (its
    // record is in the warm table, which the re-read below does not see) would be taken for
    // an orphan and removed from under its provision.
    let held = match deps.driver.list().await {
        Ok(held) => held,
        Err(e) => {
            warn!(error = %e, "reconciler: cannot list the driver's sandboxes");
            return report;
        }
    };
    let mut owned: HashSet<_> = match deps.registry.live_ids().await {
        Ok(live) => live.into_iter().map(|l| l.id).collect(),
        Err(e) => {
            error!(error = %e, "reconciler: cannot list live sandboxes; leaving driver sandboxes alone");
            return report;
        }
    };
    // Warm sandboxes belong to their org's pool, not to a record: never orphans here (the
    // pool pass removes the ones the pool no longer wants). Not knowing them is a doubt.
    match deps.registry.list_warm().await {
        Ok(warm) => owned.extend(warm.into_iter().map(|w| w.id)),
        Err(e) => {
            error!(error = %e, "reconciler: cannot list warm sandboxes; leaving driver sandboxes alone");
            return report;
        }
    }
    for id in held.into_iter().filter(|id| !owned.contains(id)) {
        // Re-read: a warm sandbox adopted between the two listings above is in neither. A
        // record that cannot be read is a doubt, and a doubt never destroys: skip it.
        match deps.registry.get(&id).await {
            Ok(Some(r)) if r.state.is_live() => continue,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, sandbox_id = %id, "reconciler: cannot read the record; leaving it");
                report.skipped_unreadable += 1;
                continue;
            }
        }
        match deps.driver.deprovision(&id).await {
            Ok(()) => {
                info!(sandbox_id = %id, "reconciler: removed a sandbox no live record owns");
                report.orphans_removed += 1;
            }
            Err(e) => warn!(error = %e, sandbox_id = %id, "reconciler: could not remove an orphan"),
        }
    }
    report
}

/// How long a pass under way when the server stops may go on before it is dropped (every
/// pass can be cut anywhere: what it claimed lapses, and the next start goes on).
pub const PASS_STOP_GRACE: Duration = Duration::from_secs(5);

/// Runs `pass` every `interval` (and once at start) until `shutdown` flips; a pass under
/// way then has [`PASS_STOP_GRACE`] to end, so a slow one never holds the server's stop
/// (and the flushes after it) past a supervisor's kill deadline.
pub async fn every<F, Fut>(interval: Duration, mut shutdown: watch::Receiver<bool>, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let run = pass();
                tokio::pin!(run);
                tokio::select! {
                    () = &mut run => {}
                    _ = shutdown.changed() => {
                        if tokio::time::timeout(PASS_STOP_GRACE, run).await.is_err() {
                            warn!("a background pass still under way at the stop was dropped");
                        }
                        break;
                    }
                }
            }
            _ = shutdown.changed() => break,
        }
    }
}

#[cfg(test)]
mod tests;

/// Serves the egress proxy of every ready sandbox: each `interval`, the ready sandboxes'
/// ids are listed (the ids alone: the gate reads a sandbox's record when its connections
/// need it, see `EgressService`; all of them every [`EGRESS_RETRY`], and in between only
/// those whose record changed since the last pass, less [`CLOCK_SKEW`] for the other
/// replicas' clocks), and every ready sandbox whose proxy is not served yet
/// gets a task running the driver's `serve_egress` with the
/// gate (a sandbox whose serving failed is tried again after [`EGRESS_RETRY`]); a task
/// that ends (its sandbox ended) is forgotten and its open audit summaries written; the
/// summaries whose windows ended are written. Until `stop`, then every task is stopped
/// and every open summary written.
pub async fn serve_egress(
    deps: std::sync::Arc<LaneDeps>,
    gate: std::sync::Arc<crate::usecase::egress::EgressService>,
    interval: Duration,
    mut stop: watch::Receiver<bool>,
) {
    use std::collections::HashMap;
    use tokio::time::Instant;
    let mut serving: HashMap<domain::SandboxId, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut retry_after: HashMap<domain::SandboxId, Instant> = HashMap::new();
    // When the last full listing was, and the registry's time of the last pass.
    let mut full_at: Option<Instant> = None;
    let mut since: Option<domain::Timestamp> = None;
    loop {
        let ended: Vec<domain::SandboxId> =
            serving.iter().filter(|(_, task)| task.is_finished()).map(|(id, _)| id.clone()).collect();
        for id in ended {
            serving.remove(&id);
            gate.forget(&id).await;
        }
        let pass_at = deps.clock.now();
        let full = full_at.is_none_or(|at| at.elapsed() >= EGRESS_RETRY);
        let listed = match since {
            Some(since) if !full => {
                let skew = i64::try_from(CLOCK_SKEW.as_millis()).unwrap_or(i64::MAX);
                deps.registry.ready_ids_since(since.plus_millis(-skew)).await
            }
            _ => deps.registry.ready_ids().await,
        };
        match listed {
            Ok(ready) => {
                let now = Instant::now();
                if full {
                    full_at = Some(now);
                }
                since = Some(pass_at);
                retry_after.retain(|_, at| *at > now);
                for id in ready {
                    if serving.contains_key(&id) || retry_after.contains_key(&id) {
                        continue;
                    }
                    let (driver, gate_port, registry) =
                        (deps.driver.clone(), gate.clone(), deps.registry.clone());
                    retry_after.insert(id.clone(), now + EGRESS_RETRY);
                    serving.insert(
                        id.clone(),
                        tokio::spawn(async move {
                            let gate: std::sync::Arc<dyn ports::EgressGate> = gate_port;
                            match driver.serve_egress(&id, gate).await {
                                Ok(()) => debug!(sandbox = %id, "egress: the sandbox ended"),
                                // Another server (a replica) serves it: tried again later.
                                Err(e @ ports::DriverError::Conflict(_)) => {
                                    debug!(sandbox = %id, error = %e, "egress: served elsewhere");
                                }
                                // Listed ready, then deprovisioned or suspended before its proxy
                                // was reached (the driver ends a sandbox before its record says
                                // so): nothing to serve.
                                Err(e) if !still_ready(registry.as_ref(), &id).await => {
                                    debug!(sandbox = %id, error = %e, "egress: the sandbox ended before its proxy was served");
                                }
                                Err(e) => warn!(sandbox = %id, error = %e, "egress: cannot serve the sandbox's proxy"),
                            }
                        }),
                    );
                }
            }
            Err(e) => error!(error = %e, "egress: cannot list the ready sandboxes"),
        }
        gate.flush_summaries().await;
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = stop.changed() => break,
        }
    }
    for (id, task) in serving {
        task.abort();
        gate.forget(&id).await;
    }
}

/// Whether the record of `id` still says ready (a record that cannot be read: yes, so
/// the failure is reported).
async fn still_ready(registry: &dyn ports::SandboxRegistry, id: &domain::SandboxId) -> bool {
    match registry.get(id).await {
        Ok(Some(record)) => record.state == SandboxState::Ready,
        Ok(None) => false,
        Err(_) => true,
    }
}

/// How long after a failed attempt the proxy of a sandbox is served again; also how often
/// the egress scan lists every ready sandbox (in between, only the changed ones).
pub const EGRESS_RETRY: Duration = Duration::from_secs(30);

/// How far the other replicas' clocks may be behind this one's: the egress scan's
/// listings of what changed reach back this much further.
pub const CLOCK_SKEW: Duration = Duration::from_secs(5);
