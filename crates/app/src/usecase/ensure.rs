//! The two ensure bodies (session: non-critical; workflow: critical) and recovery.
//!
//! Both run one core: claim the key; reuse a ready sandbox (mint a fresh token for this
//! execution and caller, audit, refresh it in the driver); or provision a new one (mint,
//! provision with the environment, audit, mark ready). The caller is split exactly once,
//! by [`domain::split_caller`]: the id goes to the mint, the class to the environment.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use domain::execution::SandboxSubject;
use domain::sandbox::SandboxRecord;
use domain::{
    Actor, AgentExecution, AuditAction, AuditOutcome, CallerIdentity, Durability, Operation, OrgPolicy,
    SandboxCaller, SandboxId, SandboxKey, SandboxState, Snapshot, SnapshotId, Timestamp, WorkflowExecution,
    split_caller,
};
use ports::{
    Claim, ClaimOutcome, ClaimRequest, DriverError, MintedCredential, ProvisionSpec, RegistryError,
    ResumeRequest, TokenGrant, WarmMatch,
};
use tracing::{Instrument, Span, debug, error, info, info_span, warn};

use super::access::{AccessError, authorize_key, precheck};
use super::audit_event::EventContext;
use super::deprovision::retire_live;
use super::failure::{ProvisionError, ProvisionFailure, chain};
use super::policy::EffectivePolicy;
use super::{LaneDeps, SandboxView};

/// What a session ensure gives the launch: never a provisioning error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEnsureOutcome {
    /// The session's sandbox is ready (new or reused).
    Ready(SandboxView),
    /// Provisioning failed (or is still going on past the deadline); the launch goes on.
    /// [`ProvisionFailure::message`] starts with [`domain::SANDBOX_PROVISIONING_FAILED_PREFIX`].
    Failed(ProvisionFailure),
    /// The lane is off: nothing was done.
    Disabled,
}

/// What a successful workflow ensure gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkflowEnsureOutcome {
    /// The execution's sandbox is ready.
    Ready(SandboxView),
    /// The lane is off: nothing was done.
    Disabled,
}

/// Why a workflow ensure (critical) or a recovery failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnsureError {
    /// Provisioning failed; [`ProvisionFailure::message`] starts with the
    /// provisioning-failed prefix.
    #[error(transparent)]
    Provisioning(#[from] ProvisionFailure),
    /// The actor may not ensure or recover this key (nothing was provisioned).
    #[error(transparent)]
    Access(#[from] AccessError),
}

/// Ensures the session sandbox of an agent execution for `actor`, non-critically: a
/// provisioning failure is logged at error level, audited, and reported as
/// [`SessionEnsureOutcome::Failed`]. The lane being off touches nothing. The key's owner
/// is recorded by the first ensure; others must be allowed by [`domain::authorize`].
///
/// The work runs detached from the caller: if the caller goes away, or
/// [`LaneDeps::ensure_deadline`] passes (reported as `Failed` with the prefix), it still
/// runs to its end and writes its audit event.
///
/// # Errors
/// [`AccessError`] when the actor may not ensure this key (audited).
pub async fn ensure_session_sandbox_for_execution(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &AgentExecution,
) -> Result<SessionEnsureOutcome, AccessError> {
    ensure_session_sandbox_from(deps, actor, execution, None).await
}

/// [`ensure_session_sandbox_for_execution`], and when `from_snapshot` names a snapshot,
/// a fork: a new sandbox of the key starts with the snapshot's files (a live sandbox of
/// the key is reused as it is, and its view says the snapshot was ignored). Who may fork
/// is the snapshot's owner or a service caller of the org ([`Operation::UseSnapshot`]).
///
/// # Errors
/// As [`ensure_session_sandbox_for_execution`]; also [`AccessError::NoSnapshot`].
pub async fn ensure_session_sandbox_from(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &AgentExecution,
    from_snapshot: Option<SnapshotId>,
) -> Result<SessionEnsureOutcome, AccessError> {
    precheck(actor, Operation::Ensure, execution.org())?;
    // Everything that reads or writes runs detached, the owner's claim included.
    let work = {
        let (deps, actor, execution) = (deps.clone(), actor.clone(), execution.clone());
        async move {
            let key = execution.sandbox_key();
            if !deps.lane.enabled(key.org(), key.kind()).await {
                return Ok(SessionEnsureOutcome::Disabled);
            }
            let fork = fork_source(&deps, &actor, key.org(), from_snapshot.as_ref()).await?;
            let adoption = if fork.is_none() {
                owner_adoption(&deps, &actor, Operation::Ensure, &execution).await
            } else {
                None // a warm sandbox's workspace is empty: a fork provisions its own
            };
            let (caller, adopted) = match adoption {
                Some((caller, adopted)) => (caller, Some(adopted)),
                None => (authorize_key(&deps, &actor, Operation::Ensure, &key).await?, None),
            };
            Ok(session_body(&deps, &execution, &caller, adopted, fork.as_ref()).await)
        }
    };
    match detached(deps, work).await {
        Detached::Done(result) => result,
        Detached::Late(failure) => Ok(SessionEnsureOutcome::Failed(failure)),
    }
}

/// Ensures the sandbox of a workflow execution for `actor`, critically: a provisioning
/// failure is an [`EnsureError::Provisioning`] carrying the failure (its prefixed message also logged
/// and audited). Detached from the caller as [`ensure_session_sandbox_for_execution`].
///
/// # Errors
/// [`EnsureError::Access`] when the actor may not; [`EnsureError::Provisioning`] when the
/// sandbox could not be provisioned in time.
pub async fn ensure_workflow_sandbox_for_execution(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &WorkflowExecution,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    workflow_entry(deps, actor, execution, AuditAction::Ensure, None).await
}

/// [`ensure_workflow_sandbox_for_execution`], forking from `from_snapshot` when given (as
/// [`ensure_session_sandbox_from`]).
///
/// # Errors
/// As [`ensure_workflow_sandbox_for_execution`]; also [`AccessError::NoSnapshot`].
pub async fn ensure_workflow_sandbox_from(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &WorkflowExecution,
    from_snapshot: Option<SnapshotId>,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    workflow_entry(deps, actor, execution, AuditAction::Ensure, from_snapshot).await
}

/// The snapshot a fork starts from, once the actor is found allowed to use it.
async fn fork_source(
    deps: &LaneDeps,
    actor: &Actor,
    org: &domain::OrgId,
    id: Option<&SnapshotId>,
) -> Result<Option<Snapshot>, AccessError> {
    let Some(id) = id else { return Ok(None) };
    super::snapshots::usable_snapshot(deps, actor, org, id).await.map(Some)
}

/// Recovers a FAILED workflow execution's sandbox for `actor`: retires any live sandbox of
/// the key (its tokens revoked), then provisions a fresh one (a new sandbox id) before the
/// fresh workflow starts. Critical, and detached, like the workflow ensure.
///
/// # Errors
/// As [`ensure_workflow_sandbox_for_execution`]; also when the old sandbox could not be
/// retired.
pub async fn recover_workflow_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &WorkflowExecution,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    workflow_entry(deps, actor, execution, AuditAction::Recover, None).await
}

async fn workflow_entry(
    deps: &LaneDeps,
    actor: &Actor,
    execution: &WorkflowExecution,
    action: AuditAction,
    from_snapshot: Option<SnapshotId>,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    let operation = if action == AuditAction::Recover { Operation::Recover } else { Operation::Ensure };
    precheck(actor, operation, &execution.org)?;
    // Everything that reads or writes runs detached, the owner's claim included.
    let work = {
        let (deps, actor, execution) = (deps.clone(), actor.clone(), execution.clone());
        async move {
            let key = execution.sandbox_key();
            if !deps.lane.enabled(key.org(), key.kind()).await {
                return Ok(WorkflowEnsureOutcome::Disabled);
            }
            let fork = fork_source(&deps, &actor, key.org(), from_snapshot.as_ref()).await?;
            let adoption = if fork.is_none() {
                owner_adoption(&deps, &actor, operation, &execution).await
            } else {
                None
            };
            let (caller, adopted) = match adoption {
                Some((caller, adopted)) => (caller, Some(adopted)),
                None => (authorize_key(&deps, &actor, operation, &key).await?, None),
            };
            if action == AuditAction::Recover {
                recover_body(&deps, &execution, &caller).await
            } else {
                workflow_body(&deps, &execution, &caller, adopted, fork.as_ref()).await
            }
        }
    };
    match detached(deps, work).await {
        Detached::Done(result) => result,
        Detached::Late(failure) => Err(EnsureError::Provisioning(failure)),
    }
}

/// A warm sandbox adopted for the key's owner in the same step as its ownership was
/// decided ([`ports::SandboxRegistry::adopt_as_owner`]), with the policy it was claimed
/// under. The ensure binds it and marks it ready; no second claim.
pub(crate) struct OwnerAdopted {
    record: SandboxRecord,
    policy: Arc<EffectivePolicy>,
}

/// The owner's fast path of an ensure by a caller: one registry step records the caller
/// as the key's owner when it has none and, when the caller is the owner, adopts a warm
/// sandbox of the org's pool. The owner is always allowed ([`domain::authorize`] after
/// [`precheck`]), so that adoption needs no separate decision.
///
/// The caller (cut for the sandbox) and what it adopted; `None` when nothing was adopted
/// (a sandbox token, a recovery, another owner, no pool, a live record for the key, the
/// quota, an empty pool, or any error): the caller then decides with [`authorize_key`]
/// and claims as usual, which reports whatever went wrong.
async fn owner_adoption(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    execution: &impl SandboxSubject,
) -> Option<(SandboxCaller, OwnerAdopted)> {
    let Actor::Caller(identity) = actor else {
        return None;
    };
    if operation != Operation::Ensure {
        return None;
    }
    let caller = identity.sandbox_caller();
    let key = execution.sandbox_key();
    let policy = deps.policies.of(key.org()).await.ok()?;
    let request = claim_request(deps, execution, &caller, &key, &policy.policy).ok()?;
    request.warm?;
    match deps.registry.adopt_as_owner(&request).await {
        Ok(Some(record)) => Some((caller, OwnerAdopted { record, policy })),
        Ok(None) => None,
        Err(e) => {
            // The usual path reads and claims again, and reports what still fails.
            debug!(error = %chain(&e), key = %key, "the owner's adoption could not be tried");
            None
        }
    }
}

/// How a detached piece of work ended for the caller waiting on it.
pub(crate) enum Detached<T> {
    /// It finished within the deadline.
    Done(T),
    /// It did not (or it panicked): the failure for the caller. It goes on.
    Late(ProvisionFailure),
}

/// Runs `work` as its own task, so it runs to its end whatever happens to the caller, and
/// waits for it until [`LaneDeps::ensure_deadline`].
pub(crate) async fn detached<T: Send + 'static>(
    deps: &LaneDeps,
    work: impl Future<Output = T> + Send + 'static,
) -> Detached<T> {
    let task = tokio::spawn(work.in_current_span());
    match tokio::time::timeout(deps.ensure_deadline, task).await {
        Ok(Ok(done)) => Detached::Done(done),
        Ok(Err(join)) => {
            let failure = ProvisionFailure::new(ProvisionError::Task);
            error!(error = %join, message = %failure.message(), "sandbox provisioning task panicked");
            Detached::Late(failure)
        }
        Err(_) => {
            let failure = ProvisionFailure::new(ProvisionError::Deadline(deps.ensure_deadline.as_millis()));
            error!(message = %failure.message(), "sandbox provisioning passed its deadline");
            Detached::Late(failure)
        }
    }
}

/// The session body (the seed's), once the entry found the lane on: the core. Never an
/// error.
pub(crate) async fn session_body(
    deps: &LaneDeps,
    execution: &AgentExecution,
    caller: &SandboxCaller,
    adopted: Option<OwnerAdopted>,
    fork: Option<&Snapshot>,
) -> SessionEnsureOutcome {
    let span = ensure_span("ensure_session_sandbox", execution, caller);
    async {
        let outcome = match ensure_core(deps, execution, caller, AuditAction::Ensure, adopted, fork).await {
            Ok(view) => SessionEnsureOutcome::Ready(view),
            Err(failure) => SessionEnsureOutcome::Failed(failure),
        };
        Span::current().record("outcome", outcome_name_session(&outcome));
        outcome
    }
    .instrument(span)
    .await
}

/// The workflow body (the seed's): critical.
pub(crate) async fn workflow_body(
    deps: &LaneDeps,
    execution: &WorkflowExecution,
    caller: &SandboxCaller,
    adopted: Option<OwnerAdopted>,
    fork: Option<&Snapshot>,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    let span = ensure_span("ensure_workflow_sandbox", execution, caller);
    workflow_ensure(deps, execution, caller, AuditAction::Ensure, adopted, fork).instrument(span).await
}

/// The recovery body: retire what is live, then provision fresh.
pub(crate) async fn recover_body(
    deps: &LaneDeps,
    execution: &WorkflowExecution,
    caller: &SandboxCaller,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    let span = ensure_span("recover_workflow_sandbox", execution, caller);
    async {
        let key = execution.sandbox_key();
        if let Err(e) = retire_live(deps, &key, caller, AuditAction::Recover).await {
            let failure = ProvisionFailure::new(ProvisionError::RetirePrevious(e));
            error!(message = %failure.message(), "sandbox recovery failed");
            Span::current().record("outcome", "failed");
            return Err(EnsureError::Provisioning(failure));
        }
        workflow_ensure(deps, execution, caller, AuditAction::Recover, None, None).await
    }
    .instrument(span)
    .await
}

async fn workflow_ensure(
    deps: &LaneDeps,
    execution: &WorkflowExecution,
    caller: &SandboxCaller,
    action: AuditAction,
    adopted: Option<OwnerAdopted>,
    fork: Option<&Snapshot>,
) -> Result<WorkflowEnsureOutcome, EnsureError> {
    let result = match ensure_core(deps, execution, caller, action, adopted, fork).await {
        Ok(view) => Ok(WorkflowEnsureOutcome::Ready(view)),
        Err(failure) => Err(EnsureError::Provisioning(failure)),
    };
    Span::current().record(
        "outcome",
        match &result {
            Ok(WorkflowEnsureOutcome::Ready(_)) => "ready",
            Ok(WorkflowEnsureOutcome::Disabled) => "disabled",
            Err(_) => "failed",
        },
    );
    result
}

fn ensure_span(name: &'static str, execution: &impl SandboxSubject, caller: &SandboxCaller) -> Span {
    let key = execution.sandbox_key();
    info_span!(
        "lane",
        use_case = name,
        otel.name = name,
        key = %key,
        key_kind = %key.kind(),
        org = %key.org(),
        caller_class = %caller.class(),
        outcome = tracing::field::Empty,
    )
}

fn outcome_name_session(outcome: &SessionEnsureOutcome) -> &'static str {
    match outcome {
        SessionEnsureOutcome::Ready(_) => "ready",
        SessionEnsureOutcome::Failed { .. } => "failed",
        SessionEnsureOutcome::Disabled => "disabled",
    }
}

/// The shared body, once the entry found the lane on (it is decided once per request).
/// `Err`: the failure, already logged at error level with its prefixed message and
/// audited (when the audit log could take it): a quota refusal as `quota_exceeded`,
/// anything else as `failed`. `adopted`: the warm sandbox the owner's fast path already
/// claimed for this ensure.
async fn ensure_core(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    action: AuditAction,
    adopted: Option<OwnerAdopted>,
    fork: Option<&Snapshot>,
) -> Result<SandboxView, ProvisionFailure> {
    let key = execution.sandbox_key();
    let (policy, adopted) = match adopted {
        Some(OwnerAdopted { record, policy }) => (Ok(policy), Some(record)),
        None => (deps.policies.of(key.org()).await, None),
    };
    let ctx = EventContext { action, key: &key, caller, driver: deps.driver.name() };
    let settled = match policy {
        Ok(policy) => claim_and_settle(deps, execution, caller, &ctx, &policy.policy, adopted, fork).await,
        Err(e) => Err(Failure::new(ProvisionError::Policy(e), None)),
    };
    match settled {
        Ok(view) => Ok(view),
        Err(Failure { failure, durability }) => {
            let message = failure.message();
            let outcome = if matches!(failure.error, ProvisionError::Quota { .. }) {
                AuditOutcome::QuotaExceeded
            } else {
                AuditOutcome::Failed
            };
            error!(%message, sandbox_id = ?failure.sandbox_id, %outcome, "sandbox provisioning failed");
            let event =
                ctx.event(outcome, failure.sandbox_id.as_ref(), durability, None, &message, deps.clock.now());
            if let Err(e) = deps.audit.append(&event).await {
                error!(error = %e, "the failed ensure could not be audited either");
            }
            Err(failure)
        }
    }
}

/// A failure inside the core, with the durability of its record for the audit event.
struct Failure {
    failure: ProvisionFailure,
    durability: Option<domain::Durability>,
}

impl Failure {
    fn new(error: ProvisionError, record: Option<&SandboxRecord>) -> Self {
        Self {
            failure: ProvisionFailure { sandbox_id: record.map(|r| r.id.clone()), error },
            durability: record.map(|r| r.durability),
        }
    }
}

/// How many times one ensure re-claims after losing a race (a failed or fenced claim).
const MAX_CLAIM_ROUNDS: usize = 4;

async fn claim_and_settle(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    ctx: &EventContext<'_>,
    policy: &OrgPolicy,
    mut adopted: Option<SandboxRecord>,
    fork: Option<&Snapshot>,
) -> Result<SandboxView, Failure> {
    for _ in 0..MAX_CLAIM_ROUNDS {
        let claim = match adopted.take() {
            Some(record) => Claim { record, outcome: ClaimOutcome::Adopted },
            None => {
                let mut request = claim_request(deps, execution, caller, ctx.key, policy)
                    .map_err(|e| Failure::new(ProvisionError::Entropy(e), None))?;
                if fork.is_some() {
                    request.warm = None; // a fork's workspace is the snapshot's, not a warm one
                }
                let span = info_span!(
                    "claim",
                    org = %ctx.key.org(),
                    key_kind = %ctx.key.kind(),
                    caller_class = %caller.class(),
                    outcome = tracing::field::Empty,
                );
                let claimed = deps.registry.claim(&request).instrument(span.clone()).await;
                span.record(
                    "outcome",
                    match &claimed {
                        Ok(_) => "claimed",
                        Err(RegistryError::OverQuota { .. }) => "quota_exceeded",
                        Err(_) => "failed",
                    },
                );
                claimed.map_err(|source| match source {
                    RegistryError::OverQuota { .. } => {
                        Failure::new(ProvisionError::Quota { key: ctx.key.clone(), source }, None)
                    }
                    source => Failure::new(ProvisionError::Claim { key: ctx.key.clone(), source }, None),
                })?
            }
        };
        match claim.outcome {
            ClaimOutcome::Created | ClaimOutcome::TakenOver => {
                if claim.outcome == ClaimOutcome::TakenOver {
                    warn!(sandbox_id = %claim.record.id, "took over a provisioning claim whose lease expired");
                }
                match provision(deps, execution, caller, ctx, &claim.record, policy, Start::New { fork })
                    .await?
                {
                    Some(view) => return Ok(view),
                    None => continue, // fenced: another holder took over; re-claim
                }
            }
            ClaimOutcome::Adopted => match adopt(deps, execution, caller, ctx, &claim.record).await? {
                Some(view) => return Ok(view.ignoring(fork)),
                None => continue, // the warm sandbox was gone: re-claim (a new one, or another)
            },
            ClaimOutcome::Existing => match wait_until_settled(deps, &claim.record).await? {
                Settled::Ready(ready) => match reuse(deps, execution, caller, ctx, &ready, policy).await? {
                    Some(view) => return Ok(view.ignoring(fork)),
                    None => continue, // the sandbox was gone and its record retired: re-claim
                },
                Settled::Suspended(suspended) => {
                    match resume_claim(deps, &suspended, policy).await? {
                        Some(record) => {
                            match provision(deps, execution, caller, ctx, &record, policy, Start::Resume)
                                .await?
                            {
                                Some(view) => return Ok(view.ignoring(fork)),
                                None => continue,
                            }
                        }
                        None => continue, // another replica resumes it: wait for it
                    }
                }
                Settled::Gone => continue, // the other holder failed or its lease lapsed: re-claim
            },
        }
    }
    Err(Failure::new(ProvisionError::Contended { key: ctx.key.clone(), rounds: MAX_CLAIM_ROUNDS }, None))
}

/// The claim of `key` by `caller` for this ensure, with a fresh candidate id: the
/// durability the caller's class decides, the org's quota, and (for an ephemeral
/// workspace, when the org keeps a pool) adoption of a warm sandbox.
///
/// # Errors
/// When the system cannot give entropy for the candidate id.
fn claim_request(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    key: &SandboxKey,
    policy: &OrgPolicy,
) -> Result<ClaimRequest, getrandom::Error> {
    let durability = deps.policy.decide(caller.class());
    let now = deps.clock.now();
    Ok(ClaimRequest {
        key: key.clone(),
        candidate_id: fresh_sandbox_id(now)?,
        durability,
        driver: deps.driver.name().to_owned(),
        caller: caller.clone(),
        execution_id: execution.execution_id().clone(),
        holder: deps.replica_id.clone(),
        lease_ms: deps.lease_ms,
        now,
        max_running: policy.max_sandboxes(),
        // Only ephemeral workspaces come from the pool: a durable one is the key's own.
        warm: (durability == Durability::Ephemeral && policy.warm_pool() > 0)
            .then_some(WarmMatch { workspace_bytes: policy.workspace_bytes() }),
    })
}

/// How a provisioning starts its sandbox: new (or taken over), from a snapshot or empty,
/// or again after a suspend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start<'a> {
    /// A new sandbox (or a taken-over claim of one); a fork's workspace starts as `fork`.
    New {
        /// The snapshot a fork starts from.
        fork: Option<&'a Snapshot>,
    },
    /// A suspended sandbox, started again on its workspace.
    Resume,
}

impl<'a> Start<'a> {
    fn outcome(self) -> AuditOutcome {
        match self {
            Self::New { .. } => AuditOutcome::Provisioned,
            Self::Resume => AuditOutcome::Resumed,
        }
    }

    fn fork(self) -> Option<&'a Snapshot> {
        match self {
            Self::New { fork } => fork,
            Self::Resume => None,
        }
    }
}

/// Takes a suspended record back to provisioning under the org's quota. `Ok(None)` when
/// another replica resumed it first (the caller claims again and waits for that one).
async fn resume_claim(
    deps: &LaneDeps,
    record: &SandboxRecord,
    policy: &OrgPolicy,
) -> Result<Option<SandboxRecord>, Failure> {
    let request = ResumeRequest {
        sandbox: record.id.clone(),
        holder: deps.replica_id.clone(),
        lease_ms: deps.lease_ms,
        max_running: policy.max_sandboxes(),
        now: deps.clock.now(),
    };
    match deps.registry.resume(&request).await {
        Ok(resumed) => Ok(Some(resumed)),
        Err(RegistryError::InvalidState { .. }) => Ok(None),
        Err(source @ RegistryError::OverQuota { .. }) => {
            Err(Failure::new(ProvisionError::Quota { key: record.key.clone(), source }, Some(record)))
        }
        Err(e) => Err(Failure::new(ProvisionError::Resume(e), Some(record))),
    }
}

/// Makes a sandbox ready for a command: a ready one as it is; a suspended one resumed
/// (same id, same workspace, a fresh credential minted, as the refresher does, for the
/// caller of its latest ensure), audited as `resume` by the server; one being provisioned
/// or resumed elsewhere waited for. The work runs detached from the caller, as an ensure.
///
/// # Errors
/// [`ResumeError::NotReady`] for a sandbox that failed or was deprovisioned;
/// [`ResumeError::Failed`] when the resume failed (audited, with the posture's message);
/// [`ResumeError::Quota`] when resuming it would take the org past its quota.
pub(crate) async fn ready_for_use(
    deps: &LaneDeps,
    record: SandboxRecord,
    policy: &OrgPolicy,
) -> Result<SandboxRecord, ResumeError> {
    if record.state == SandboxState::Ready {
        return Ok(record);
    }
    resume_detached(deps, record, policy, false).await
}

/// Claims suspended sandbox `record` for work on its workspace while it is down (a
/// restore): it moves to provisioning under this replica's lease, so no resume (an
/// ensure's, an exec's, another replica's) starts it before [`resume_claimed`] does.
/// `Ok(None)` when it is no longer suspended.
///
/// # Errors
/// [`ResumeError::Quota`] when starting it again would take the org past its quota of
/// running sandboxes; [`ResumeError::Failed`] when the registry failed.
pub(crate) async fn claim_suspended(
    deps: &LaneDeps,
    record: &SandboxRecord,
    policy: &OrgPolicy,
) -> Result<Option<SandboxRecord>, ResumeError> {
    resume_claim(deps, record, policy).await.map_err(|f| {
        if matches!(f.failure.error, ProvisionError::Quota { .. }) {
            ResumeError::Quota(f.failure)
        } else {
            ResumeError::Failed(f.failure)
        }
    })
}

/// Starts sandbox `claimed`, claimed by [`claim_suspended`], again on its workspace: as
/// [`ready_for_use`] resumes a suspended one, without claiming it first.
///
/// # Errors
/// As [`ready_for_use`].
pub(crate) async fn resume_claimed(
    deps: &LaneDeps,
    claimed: SandboxRecord,
    policy: &OrgPolicy,
) -> Result<SandboxRecord, ResumeError> {
    resume_detached(deps, claimed, policy, true).await
}

/// [`resume_body`] as its own task; `claimed`: `record` is this replica's resume claim.
async fn resume_detached(
    deps: &LaneDeps,
    record: SandboxRecord,
    policy: &OrgPolicy,
    claimed: bool,
) -> Result<SandboxRecord, ResumeError> {
    let work = {
        let (deps, record, policy) = (deps.clone(), record.clone(), policy.clone());
        async move {
            match &record.key {
                SandboxKey::Session { org, session_id } => {
                    let subject = AgentExecution {
                        org: org.clone(),
                        session_id: session_id.clone(),
                        execution_id: record.execution_id.clone(),
                        phase: domain::Phase::InProgress,
                    };
                    resume_body(&deps, &subject, &record, &policy, claimed).await
                }
                SandboxKey::Workflow { org, execution_id } => {
                    let subject = WorkflowExecution {
                        org: org.clone(),
                        execution_id: execution_id.clone(),
                        phase: domain::Phase::InProgress,
                    };
                    resume_body(&deps, &subject, &record, &policy, claimed).await
                }
            }
        }
    };
    match detached(deps, work).await {
        Detached::Done(result) => result,
        Detached::Late(failure) => Err(ResumeError::Failed(failure)),
    }
}

/// Why a sandbox could not be made ready for a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeError {
    /// It is not live (failed, deprovisioned, or its provisioning lapsed).
    #[error("sandbox {sandbox_id} is {state}, not ready")]
    NotReady {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its state.
        state: SandboxState,
    },
    /// Resuming it would take its org past its quota of running sandboxes.
    #[error(transparent)]
    Quota(ProvisionFailure),
    /// Resuming it failed.
    #[error(transparent)]
    Failed(ProvisionFailure),
}

async fn resume_body(
    deps: &LaneDeps,
    subject: &impl SandboxSubject,
    record: &SandboxRecord,
    policy: &OrgPolicy,
    claimed: bool,
) -> Result<SandboxRecord, ResumeError> {
    let internal = CallerIdentity::internal().sandbox_caller();
    let ctx = EventContext {
        action: AuditAction::Resume,
        key: &record.key,
        caller: &internal,
        driver: deps.driver.name(),
    };
    let not_ready = |r: &SandboxRecord| ResumeError::NotReady { sandbox_id: r.id.clone(), state: r.state };
    let mut current = record.clone();
    // A claim made by the caller is provisioned first, not claimed again.
    let mut claimed = claimed.then(|| record.clone());
    for _ in 0..MAX_CLAIM_ROUNDS {
        let resumed = match claimed.take() {
            Some(resumed) => resumed,
            None => {
                let settled = match current.state {
                    SandboxState::Ready => return Ok(current),
                    SandboxState::Suspended => Settled::Suspended(current.clone()),
                    SandboxState::Provisioning => wait_until_settled(deps, &current)
                        .await
                        .map_err(|f| ResumeError::Failed(f.failure))?,
                    SandboxState::Failed | SandboxState::Deprovisioned => return Err(not_ready(&current)),
                };
                let suspended = match settled {
                    Settled::Ready(ready) => return Ok(ready),
                    Settled::Gone => return Err(not_ready(&current)),
                    Settled::Suspended(suspended) => suspended,
                };
                match resume_claim(deps, &suspended, policy).await {
                    Ok(Some(resumed)) => resumed,
                    Ok(None) => {
                        // Another replica resumes it: wait for that one.
                        current = match deps.registry.get(&suspended.id).await {
                            Ok(Some(r)) => r,
                            Ok(None) => return Err(not_ready(&suspended)),
                            Err(e) => {
                                return Err(ResumeError::Failed(
                                    Failure::new(ProvisionError::Wait(e), Some(&suspended)).failure,
                                ));
                            }
                        };
                        continue;
                    }
                    Err(f) => return Err(audit_resume_failure(deps, &ctx, f).await),
                }
            }
        };
        let caller = resumed.token_caller.clone();
        match provision(deps, subject, &caller, &ctx, &resumed, policy, Start::Resume).await {
            Ok(Some(_)) => {
                return deps
                    .registry
                    .get(&resumed.id)
                    .await
                    .ok()
                    .flatten()
                    .ok_or_else(|| not_ready(&resumed));
            }
            Ok(None) => {
                current =
                    deps.registry.get(&resumed.id).await.ok().flatten().ok_or_else(|| not_ready(&resumed))?;
            }
            Err(f) => return Err(audit_resume_failure(deps, &ctx, f).await),
        }
    }
    Err(ResumeError::Failed(ProvisionFailure::new(ProvisionError::Contended {
        key: record.key.clone(),
        rounds: MAX_CLAIM_ROUNDS,
    })))
}

/// Logs and audits a failed resume; a quota refusal as `quota_exceeded`.
async fn audit_resume_failure(deps: &LaneDeps, ctx: &EventContext<'_>, f: Failure) -> ResumeError {
    let Failure { failure, durability } = f;
    let message = failure.message();
    let quota = matches!(failure.error, ProvisionError::Quota { .. });
    let outcome = if quota { AuditOutcome::QuotaExceeded } else { AuditOutcome::Failed };
    error!(%message, sandbox_id = ?failure.sandbox_id, %outcome, "resuming the sandbox failed");
    let event = ctx.event(outcome, failure.sandbox_id.as_ref(), durability, None, &message, deps.clock.now());
    if let Err(e) = deps.audit.append(&event).await {
        error!(error = %e, "the failed resume could not be audited either");
    }
    if quota { ResumeError::Quota(failure) } else { ResumeError::Failed(failure) }
}

/// What a waiter found once another holder was done.
enum Settled {
    /// Ready: reuse it.
    Ready(SandboxRecord),
    /// Suspended: resume it.
    Suspended(SandboxRecord),
    /// Failed, deprovisioned, or the holder's lease lapsed: claim again.
    Gone,
}

/// Waits while another holder provisions (or resumes) `record`.
async fn wait_until_settled(deps: &LaneDeps, record: &SandboxRecord) -> Result<Settled, Failure> {
    let mut current = record.clone();
    loop {
        match current.state {
            SandboxState::Ready => return Ok(Settled::Ready(current)),
            SandboxState::Suspended => return Ok(Settled::Suspended(current)),
            SandboxState::Failed | SandboxState::Deprovisioned => return Ok(Settled::Gone),
            SandboxState::Provisioning => {
                if deps.clock.now() >= current.lease.expires_at {
                    return Ok(Settled::Gone);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(deps.wait_poll_ms)).await;
        current = match deps.registry.get(&record.id).await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(Settled::Gone),
            Err(e) => return Err(Failure::new(ProvisionError::Wait(e), Some(record))),
        };
    }
}

/// Mints for this execution and caller. The caller split happens here, once.
async fn mint_for(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    record: &SandboxRecord,
) -> Result<(MintedCredential, domain::DriverEnvironment), Failure> {
    let (mint_request, environment) = split_caller(execution, caller, &record.id);
    let span = info_span!(
        "mint",
        org = %record.key.org(),
        key_kind = %record.key.kind(),
        caller_class = %caller.class(),
        outcome = tracing::field::Empty,
    );
    let minted = deps.minter.mint(&mint_request).instrument(span.clone()).await;
    span.record("outcome", if minted.is_ok() { "minted" } else { "failed" });
    let minted = minted.map_err(|e| Failure::new(ProvisionError::Mint(e), Some(record)))?;
    Ok((minted, environment))
}

fn grant(minted: &MintedCredential, execution: &impl SandboxSubject, caller: &SandboxCaller) -> TokenGrant {
    TokenGrant {
        token_id: minted.token_id.clone(),
        expires_at: minted.expires_at,
        execution_id: execution.execution_id().clone(),
        caller: caller.clone(),
    }
}

/// A new (or taken-over) claim: mint, provision, audit, mark ready. `Ok(None)` when
/// fenced by another holder. Any failure marks the claim failed and revokes the token.
async fn provision(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    ctx: &EventContext<'_>,
    record: &SandboxRecord,
    policy: &OrgPolicy,
    start: Start<'_>,
) -> Result<Option<SandboxView>, Failure> {
    let fork = start.fork();
    let epoch = record.lease.epoch;
    let work = async {
        let (minted, environment) = mint_for(deps, execution, caller, record).await?;
        let spec = ProvisionSpec {
            key: record.key.clone(),
            environment,
            durability: record.durability,
            credential: minted.token.clone(),
            epoch,
            workspace_bytes: policy.workspace_bytes(),
            from_snapshot: fork.map(|s| ports::SnapshotRef { org: s.org.clone(), id: s.id.clone() }),
        };
        let span = info_span!(
            "provision",
            org = %record.key.org(),
            key_kind = %record.key.kind(),
            caller_class = %caller.class(),
            sandbox_id = %record.id,
            durability = ?record.durability,
            outcome = tracing::field::Empty,
        );
        let provisioned = deps.driver.provision(&spec).instrument(span.clone()).await;
        span.record("outcome", if provisioned.is_ok() { "provisioned" } else { "failed" });
        provisioned.map_err(|e| Failure::new(ProvisionError::Driver(e), Some(record)))?;
        let mut event = ctx.event(
            start.outcome(),
            Some(&record.id),
            Some(record.durability),
            Some(&minted.token_id),
            "",
            deps.clock.now(),
        );
        if let Some(snapshot) = fork {
            // The lineage: a fork names the snapshot it started from, and its source.
            event.action = AuditAction::Fork;
            event.message = format!("from snapshot {}", snapshot.lineage());
        }
        if let Err(e) = deps.audit.append(&event).await {
            // A sandbox whose audit event cannot be written is not provisioned.
            if let Err(d) = deps.driver.deprovision(&record.id).await {
                error!(error = %d, sandbox_id = %record.id, "rollback after an audit failure left driver state");
            }
            return Err(Failure::new(ProvisionError::Audit(e), Some(record)));
        }
        Ok(minted)
    };
    let result = with_lease_renewed(deps, record, work).await;

    let minted = match result {
        Ok(m) => m,
        Err(failure) => {
            abandon(deps, record, epoch, &chain(&failure.failure.error)).await;
            return Err(failure);
        }
    };
    match deps
        .registry
        .mark_ready(&record.id, epoch, &grant(&minted, execution, caller), deps.clock.now())
        .await
    {
        Ok(ready) => {
            let what = if start == Start::Resume { "sandbox resumed" } else { "sandbox provisioned" };
            info!(sandbox_id = %ready.id, durability = %ready.durability, "{what}");
            deps.activity.touch(&ready.id, deps.clock.now());
            let mut view = SandboxView::of(&ready, Some(minted.token_id));
            view.forked_from = fork.map(|s| s.id.clone());
            Ok(Some(view))
        }
        Err(RegistryError::Fenced { .. }) => {
            warn!(sandbox_id = %record.id, epoch, "fenced: another holder took the claim over");
            Ok(None)
        }
        Err(e) => {
            let failure = Failure::new(ProvisionError::MarkReady(e), Some(record));
            abandon(deps, record, epoch, &chain(&failure.failure.error)).await;
            Err(failure)
        }
    }
}

/// Frees a claim whose provisioning failed: the record is marked failed (if this holder
/// still holds it) and every token minted for it revoked.
async fn abandon(deps: &LaneDeps, record: &SandboxRecord, epoch: i64, cause: &str) {
    if let Err(e) = deps.registry.mark_failed(&record.id, epoch, cause, deps.clock.now()).await {
        warn!(error = %e, sandbox_id = %record.id, "could not mark the claim failed");
    }
    if let Err(e) = deps.minter.revoke(&record.id).await {
        error!(error = %e, sandbox_id = %record.id, "could not revoke the failed sandbox's tokens");
    }
}

/// A ready sandbox: mint a fresh token for this execution and caller, audit, deliver it
/// to the driver, record it. No second provision. `Ok(None)` when the driver no longer
/// holds the sandbox: its record was retired (audited as repaired) and the caller claims
/// the key again, which provisions a fresh sandbox under a new id.
async fn reuse(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    ctx: &EventContext<'_>,
    record: &SandboxRecord,
    policy: &OrgPolicy,
) -> Result<Option<SandboxView>, Failure> {
    // An ensure is activity: a sandbox about to be used is not suspended under it.
    deps.activity
        .note_before_use(deps.registry.as_ref(), record, policy.idle_timeout_ms(), deps.clock.now())
        .await
        .map_err(|e| Failure::new(ProvisionError::Record(e), Some(record)))?;
    let (minted, environment) = mint_for(deps, execution, caller, record).await?;
    let event = ctx.event(
        AuditOutcome::Reused,
        Some(&record.id),
        Some(record.durability),
        Some(&minted.token_id),
        "",
        deps.clock.now(),
    );
    deps.audit.append(&event).await.map_err(|e| Failure::new(ProvisionError::Audit(e), Some(record)))?;
    if !deliver(deps, ctx, record, &minted.token, &environment).await? {
        return Ok(None);
    }
    // Recorded over the token this ensure read. Another token recorded since (a refresh, or
    // another ensure, that may have delivered after this one did) leaves the sandbox
    // holding a token the record may not name: this ensure reads the one recorded, delivers
    // its own again and records over that one, a few times; then over whatever is there.
    let grant = grant(&minted, execution, caller);
    let mut read = record.token_id.clone();
    let mut tries = 0;
    let recorded = loop {
        let expected = if tries < REDELIVERIES { read.as_ref() } else { None };
        match deps.registry.record_token(&record.id, expected, &grant, deps.clock.now()).await {
            Err(RegistryError::Superseded(_)) if tries < REDELIVERIES => {}
            other => break other,
        }
        tries += 1;
        debug!(sandbox_id = %record.id, tries, "another token was recorded during this ensure; delivering this one again");
        read = match deps.registry.get(&record.id).await {
            Ok(Some(now)) => now.token_id,
            Ok(None) => break Err(RegistryError::NotFound(record.id.clone())),
            Err(e) => break Err(e),
        };
        if !deliver(deps, ctx, record, &minted.token, &environment).await? {
            return Ok(None);
        }
    };
    match recorded {
        Ok(()) => Ok(Some(SandboxView::of(record, Some(minted.token_id)))),
        // Retired between the claim and now (a concurrent deprovision or recovery): the
        // key is free again, so this ensure claims it afresh.
        Err(RegistryError::InvalidState { .. } | RegistryError::NotFound(_)) => {
            info!(sandbox_id = %record.id, "the reused sandbox was retired meanwhile; claiming the key again");
            Ok(None)
        }
        Err(e) => Err(Failure::new(ProvisionError::Record(e), Some(record))),
    }
}

/// How many times a reuse delivers its token again when another was recorded meanwhile,
/// before it records over whatever is there.
const REDELIVERIES: usize = 3;

/// Delivers `token` to a ready sandbox: `Ok(false)` when the driver no longer holds it
/// (its record retired, audited as repaired, if it was still live: the caller claims the
/// key again).
async fn deliver(
    deps: &LaneDeps,
    ctx: &EventContext<'_>,
    record: &SandboxRecord,
    token: &domain::SandboxToken,
    environment: &domain::DriverEnvironment,
) -> Result<bool, Failure> {
    match deps.driver.refresh_credential(&record.id, token, environment).await {
        Ok(()) => Ok(true),
        Err(DriverError::NotFound(_)) => {
            // Deprovisioned meanwhile (a concurrent deprovision won), or gone on its own.
            if still_live(deps, record).await? {
                repair(deps, ctx, record).await?;
            }
            Ok(false)
        }
        Err(e) => Err(Failure::new(ProvisionError::Deliver(e), Some(record))),
    }
}

/// An adopted warm sandbox (already running, bound to no key): mint for this execution
/// and caller, deliver the credential and the environment (which binds it), then mark it
/// ready and write its audit event in one transaction (both or neither). Database work
/// and one token file; no provisioning. `Ok(None)` when the warm sandbox was gone from the
/// driver (its claim is failed; the caller claims again).
async fn adopt(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    ctx: &EventContext<'_>,
    record: &SandboxRecord,
) -> Result<Option<SandboxView>, Failure> {
    let epoch = record.lease.epoch;
    let bound = async {
        let (minted, environment) = mint_for(deps, execution, caller, record).await?;
        deps.driver
            .refresh_credential(&record.id, &minted.token, &environment)
            .await
            .map_err(|e| Failure::new(ProvisionError::Adopt(e), Some(record)))?;
        Ok::<_, Failure>(minted)
    }
    .await;
    let failed = |failure: Failure| async move {
        abandon(deps, record, epoch, &chain(&failure.failure.error)).await;
        // A warm sandbox that could not be bound is not left running for nobody.
        if let Err(e) = deps.driver.deprovision(&record.id).await {
            warn!(error = %e, sandbox_id = %record.id, "could not remove a warm sandbox that failed to bind");
        }
        failure
    };
    let minted = match bound {
        Ok(minted) => minted,
        Err(failure) => {
            let gone = matches!(failure.failure.error, ProvisionError::Adopt(DriverError::NotFound(_)));
            let failure = failed(failure).await;
            if gone {
                warn!(sandbox_id = %record.id, "the adopted warm sandbox was gone; claiming again");
                return Ok(None);
            }
            return Err(failure);
        }
    };
    let event = ctx.event(
        AuditOutcome::Adopted,
        Some(&record.id),
        Some(record.durability),
        Some(&minted.token_id),
        "a warm sandbox of the org's pool",
        deps.clock.now(),
    );
    let grant = grant(&minted, execution, caller);
    match deps.registry.mark_ready_audited(&record.id, epoch, &grant, &event, deps.clock.now()).await {
        Ok(ready) => {
            info!(sandbox_id = %ready.id, "warm sandbox adopted");
            deps.pool_demand.adopted(ready.key.org(), deps.clock.now());
            deps.activity.touch(&ready.id, deps.clock.now());
            Ok(Some(SandboxView::of(&ready, Some(minted.token_id))))
        }
        Err(RegistryError::Fenced { .. }) => Ok(None),
        Err(e) => Err(failed(Failure::new(ProvisionError::MarkReady(e), Some(record))).await),
    }
}

/// Whether `record` is still live in the registry.
async fn still_live(deps: &LaneDeps, record: &SandboxRecord) -> Result<bool, Failure> {
    match deps.registry.get(&record.id).await {
        Ok(now) => Ok(now.is_some_and(|r| r.state.is_live())),
        Err(e) => Err(Failure::new(ProvisionError::Wait(e), Some(record))),
    }
}

/// The record of sandbox `id`, which the driver no longer holds, retired: it leaves the
/// live state (its tokens stop verifying, its org's quota is freed), and what the driver
/// still has of it is removed. The caller audits it.
///
/// # Errors
/// The record could not be written (nothing else was done).
pub(crate) async fn retire_gone(deps: &LaneDeps, id: &SandboxId) -> Result<(), RegistryError> {
    warn!(sandbox_id = %id, "the driver no longer holds this ready sandbox; retiring its record");
    deps.registry.mark_deprovisioned(id, deps.clock.now()).await?;
    if let Err(e) = deps.minter.revoke(id).await {
        error!(error = %e, sandbox_id = %id, "could not revoke the gone sandbox's tokens");
    }
    if let Err(e) = deps.driver.deprovision(id).await {
        warn!(error = %e, sandbox_id = %id, "could not clean up what is left of the gone sandbox");
    }
    Ok(())
}

/// Retires a live record whose sandbox the driver no longer holds (a crashed supervisor,
/// a wiped host) with [`retire_gone`], and audits the repair. The key is then free to be
/// provisioned again.
async fn repair(deps: &LaneDeps, ctx: &EventContext<'_>, record: &SandboxRecord) -> Result<(), Failure> {
    let id = &record.id;
    retire_gone(deps, id).await.map_err(|e| Failure::new(ProvisionError::Retire(e), Some(record)))?;
    let message = format!("sandbox {id} was gone from the driver; retired so the key is provisioned again");
    let event =
        ctx.event(AuditOutcome::Repaired, Some(id), Some(record.durability), None, message, deps.clock.now());
    deps.audit.append(&event).await.map_err(|e| Failure::new(ProvisionError::Audit(e), Some(record)))?;
    Ok(())
}

/// Runs `work` (a provision under `record`'s lease) while renewing the lease every third
/// of its length, so a provision slower than its lease is not taken over. A renewal that
/// is fenced (another holder took the claim) stops renewing; the work's own writes are
/// fenced then too.
pub(crate) async fn with_lease_renewed<T>(
    deps: &LaneDeps,
    record: &SandboxRecord,
    work: impl Future<Output = T>,
) -> T {
    let epoch = record.lease.epoch;
    let renew = |until, now| deps.registry.renew_lease(&record.id, epoch, until, now);
    with_renewal(deps, &record.id, renew, work).await
}

/// Runs `work` while renewing a lease (of sandbox `id`) every third of
/// [`LaneDeps::lease_ms`] through `renew(until, now)`, until the work ends or a renewal
/// is fenced (the lease is someone else's: the work's own writes are fenced then too).
/// Any other failure to renew is retried at the next third.
pub(crate) async fn with_renewal<T, F, R>(
    deps: &LaneDeps,
    id: &SandboxId,
    renew: F,
    work: impl Future<Output = T>,
) -> T
where
    F: Fn(Timestamp, Timestamp) -> R,
    R: Future<Output = Result<(), RegistryError>>,
{
    let every = Duration::from_millis(u64::try_from(deps.lease_ms / 3).unwrap_or(1).max(1));
    tokio::pin!(work);
    let mut renewing = true;
    loop {
        tokio::select! {
            out = &mut work => return out,
            () = tokio::time::sleep(every), if renewing => {
                let now = deps.clock.now();
                match renew(now.plus_millis(deps.lease_ms), now).await {
                    Ok(()) => {}
                    Err(e @ (RegistryError::Fenced { .. } | RegistryError::NotFound(_))) => {
                        warn!(error = %e, sandbox_id = %id, "lease lost while provisioning");
                        renewing = false;
                    }
                    Err(e) => warn!(error = %e, sandbox_id = %id, "could not renew the lease; retrying"),
                }
            }
        }
    }
}

/// A new time-ordered sandbox id: the clock's milliseconds and 80 random bits.
pub(crate) fn fresh_sandbox_id(now: Timestamp) -> Result<SandboxId, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    let millis = u64::try_from(now.unix_millis()).unwrap_or(0);
    Ok(SandboxId::generate(millis, u128::from_le_bytes(bytes)))
}
