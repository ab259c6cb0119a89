//! Deprovision at the terminal FAILED phase (and retiring a sandbox being replaced).
//!
//! Order matters: the record leaves the live state first (its tokens stop verifying at
//! once, on every replica), the minter's revocation is recorded, then the driver kills
//! every process and removes what is ephemeral.

use domain::{Actor, AuditAction, AuditOutcome, Operation, SandboxCaller, SandboxId, SandboxKey};
use tracing::{Instrument, Span, error, info, info_span};

use ports::{AuditError, DriverError, MintError, RegistryError};

use super::LaneDeps;
use super::access::{AccessError, authorize_key};
use super::audit_event::EventContext;
use super::failure::chain;

/// What a deprovision did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeprovisionOutcome {
    /// The live sandbox was deprovisioned.
    Deprovisioned(SandboxId),
    /// No live sandbox held the key (idempotent repeat).
    Absent,
}

/// Why a deprovision failed. Its tokens may already be revoked; a retry or the
/// reconciler finishes the removal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeprovisionError {
    /// The registry could not be read or written.
    #[error("the registry could not be read or written")]
    Registry(#[source] RegistryError),
    /// The credential revocation could not be recorded.
    #[error("the revocation could not be recorded")]
    Revocation(#[source] MintError),
    /// The driver could not remove the sandbox.
    #[error("the driver could not remove the sandbox")]
    Driver(#[source] DriverError),
    /// The audit event could not be written.
    #[error("the audit event could not be written")]
    Audit(#[source] AuditError),
    /// The actor may not deprovision this key (nothing was touched).
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The deprovision task failed unexpectedly (see the server log).
    #[error("the deprovision task failed; see the server log")]
    Task,
}

/// Deprovisions the live sandbox of `key` for `actor` (the execution reached FAILED).
/// Idempotent. Writes one audit event with its outcome. Once authorised, it runs detached
/// from the caller: a caller that goes away does not stop it half-way.
///
/// # Errors
/// [`DeprovisionError::Access`] when the actor may not (audited); otherwise the step that
/// failed.
pub async fn deprovision_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    key: &SandboxKey,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    // Everything that reads or writes runs detached, the owner's check included.
    let work = {
        let (deps, actor, key) = (deps.clone(), actor.clone(), key.clone());
        async move {
            let caller = authorize_key(&deps, &actor, Operation::Deprovision, &key).await?;
            deprovision_body(&deps, &key, &caller).await
        }
    };
    tokio::spawn(work.in_current_span()).await.unwrap_or_else(|e| {
        error!(error = %e, "the deprovision task panicked");
        Err(DeprovisionError::Task)
    })
}

/// The deprovision body: retire what is live, audited.
pub(crate) async fn deprovision_body(
    deps: &LaneDeps,
    key: &SandboxKey,
    caller: &SandboxCaller,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    let span = info_span!(
        "lane",
        use_case = "deprovision_sandbox",
        key = %key,
        org = %key.org(),
        caller_class = %caller.class(),
        outcome = tracing::field::Empty,
    );
    async {
        let result = retire_live(deps, key, caller, AuditAction::Deprovision).await;
        Span::current().record(
            "outcome",
            match &result {
                Ok(DeprovisionOutcome::Deprovisioned(_)) => "deprovisioned",
                Ok(DeprovisionOutcome::Absent) => "absent",
                Err(_) => "failed",
            },
        );
        result
    }
    .instrument(span)
    .await
}

/// Retires the live sandbox of `key`, auditing under `action`.
pub(crate) async fn retire_live(
    deps: &LaneDeps,
    key: &SandboxKey,
    caller: &SandboxCaller,
    action: AuditAction,
) -> Result<DeprovisionOutcome, DeprovisionError> {
    let ctx = EventContext { action, key, caller, driver: deps.driver.name() };
    let live = deps.registry.get_live(key).await.map_err(DeprovisionError::Registry)?;
    let Some(record) = live else {
        if action == AuditAction::Deprovision {
            let event = ctx.event(AuditOutcome::Absent, None, None, None, "", deps.clock.now());
            deps.audit.append(&event).await.map_err(DeprovisionError::Audit)?;
        }
        return Ok(DeprovisionOutcome::Absent);
    };
    let id = record.id.clone();
    let steps = async {
        deps.registry.mark_deprovisioned(&id, deps.clock.now()).await.map_err(DeprovisionError::Registry)?;
        deps.minter.revoke(&id).await.map_err(DeprovisionError::Revocation)?;
        deps.driver.deprovision(&id).await.map_err(DeprovisionError::Driver)
    }
    .await;
    let (outcome, message) = match &steps {
        Ok(()) => (AuditOutcome::Deprovisioned, String::new()),
        Err(e) => (AuditOutcome::Failed, chain(e)),
    };
    let event = ctx.event(outcome, Some(&id), Some(record.durability), None, &message, deps.clock.now());
    let audited = deps.audit.append(&event).await;
    match (steps, audited) {
        (Ok(()), Ok(_)) => {
            info!(sandbox_id = %id, "sandbox deprovisioned");
            Ok(DeprovisionOutcome::Deprovisioned(id))
        }
        (Err(e), audited) => {
            error!(error = %e, sandbox_id = %id, "deprovision failed");
            if let Err(a) = audited {
                error!(error = %a, "the failed deprovision could not be audited either");
            }
            Err(e)
        }
        (Ok(()), Err(a)) => {
            error!(error = %a, sandbox_id = %id, "deprovisioned, but the audit event could not be written");
            Err(DeprovisionError::Audit(a))
        }
    }
}
