//! Who may touch a sandbox, applied: every use case that names a key or a sandbox asks
//! here, with the facts read from the registry, and [`domain::authorize`] decides.
//!
//! - By key (ensure, recover, deprovision): ensure and recover record the caller as the
//!   key's owner when it has none ([`ports::SandboxRegistry::claim_owner`], atomic across
//!   replicas), so the first ensurer owns it; deprovision only reads the owner. An ensure
//!   that may adopt a warm sandbox first tries the owner's adoption, which records the
//!   owner and adopts only for it in one step
//!   ([`ports::SandboxRegistry::adopt_as_owner`]); when it adopts nothing, the check here
//!   decides as usual.
//! - By sandbox (read, exec, files, processes): the record names the key, the key names its
//!   owner (the two are read in one round trip, [`ports::SandboxRegistry::get_with_owner`]).
//!   A sandbox the actor may not read is reported as not found, so its existence is not
//!   revealed; other denials are `PermissionDenied`.

use domain::sandbox::SandboxRecord;
use domain::{
    Actor, AuditAction, AuditOutcome, Denial, Operation, OrgId, SandboxCaller, SandboxId, SandboxKey, Target,
};
use ports::RegistryError;
use tracing::warn;

use super::LaneDeps;
use super::audit_event::EventContext;

/// Why an actor could not act on a key or sandbox.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The rule refused it.
    #[error(transparent)]
    Denied(#[from] Denial),
    /// No such sandbox in the org (or one the actor may not see).
    #[error("no sandbox {sandbox_id} in org {org}")]
    NotFound {
        /// The sandbox named.
        sandbox_id: SandboxId,
        /// The org named.
        org: OrgId,
    },
    /// No such snapshot in the org (or one the actor may not use).
    #[error("no snapshot {snapshot} in org {org}")]
    NoSnapshot {
        /// The snapshot named.
        snapshot: domain::SnapshotId,
        /// The org named.
        org: OrgId,
    },
    /// The registry could not be read, so nothing was decided.
    #[error("cannot check who may touch the sandbox now")]
    Unavailable(#[source] RegistryError),
}

/// What can be refused without reading anything: a caller outside the org, a sandbox
/// token asking for what tokens may not do. (Whatever the key's owner, these are denied:
/// the most permissive owner, the actor itself, is tried.) Not audited: a caller of one
/// org must not be able to write into another org's audit log.
///
/// # Errors
/// [`AccessError::Denied`].
pub fn precheck(actor: &Actor, operation: Operation, org: &OrgId) -> Result<(), AccessError> {
    let itself = match actor {
        Actor::Caller(caller) => caller.identity_id(),
        Actor::SandboxToken { subject, .. } => subject,
    };
    domain::authorize(actor, operation, &Target { org, owner: Some(itself), sandbox_id: None })?;
    Ok(())
}

/// Authorises `actor` to perform `operation` on `key`: first [`precheck`], then the key's
/// owner decides. For an ensure or recovery by a caller, a key nobody owns becomes the
/// caller's. A denial by the owner rule of an audited operation (ensure, recover,
/// deprovision) is audited.
///
/// Returns the caller it checked, cut for the sandbox (the one the ensure mints for and
/// whose class the driver sees), so no use case cuts or invents another: a sandbox token
/// acts by key on nothing (the rule refuses it every operation by key).
///
/// # Errors
/// [`AccessError::Denied`] or [`AccessError::Unavailable`].
pub async fn authorize_key(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    key: &SandboxKey,
) -> Result<SandboxCaller, AccessError> {
    precheck(actor, operation, key.org())?;
    let caller = match actor {
        Actor::Caller(caller) => caller.sandbox_caller(),
        Actor::SandboxToken { .. } => return Err(AccessError::Denied(Denial::TokenOperation { operation })),
    };
    let owner = match actor {
        // (The precheck refused callers outside the org: they never claim a key.)
        Actor::Caller(_) if operation.claims_ownership() => {
            deps.registry.claim_owner(key, &caller, deps.clock.now()).await.map(Some)
        }
        _ => deps.registry.owner(key).await,
    }
    .map_err(AccessError::Unavailable)?;
    let target = Target { org: key.org(), owner: owner.as_ref().map(|o| &o.identity_id), sandbox_id: None };
    let Err(denial) = domain::authorize(actor, operation, &target) else {
        return Ok(caller);
    };
    warn!(key = %key, %denial, "refused");
    if let Some(action) = audited_action(operation) {
        let ctx = EventContext { action, key, caller: &caller, driver: deps.driver.name() };
        let event = ctx.event(AuditOutcome::Denied, None, None, None, denial.to_string(), deps.clock.now());
        if let Err(e) = deps.audit.append(&event).await {
            tracing::error!(error = %e, key = %key, "the refusal could not be audited");
        }
    }
    Err(AccessError::Denied(denial))
}

/// Authorises `actor` to perform `operation` on the sandbox `sandbox_id` of `org`, and
/// returns its record. A sandbox that does not exist in `org`, and one the actor may not
/// even read, are both [`AccessError::NotFound`].
///
/// # Errors
/// [`AccessError`].
pub async fn authorize_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    org: &OrgId,
    sandbox_id: &SandboxId,
) -> Result<SandboxRecord, AccessError> {
    let not_found = || AccessError::NotFound { sandbox_id: sandbox_id.clone(), org: org.clone() };
    // A sandbox token is decided by its claims alone: no registry read for another's.
    if let Actor::SandboxToken { .. } = actor {
        domain::authorize(actor, operation, &Target { org, owner: None, sandbox_id: Some(sandbox_id) })?;
    }
    match deps.registry.get_with_owner(sandbox_id).await.map_err(AccessError::Unavailable)? {
        Some((record, owner)) if record.key.org() == org => decide(actor, operation, record, owner.as_ref()),
        _ => Err(not_found()),
    }
}

/// [`authorize_sandbox`] for a sandbox named by its id alone, in whichever org it is (a
/// preview host names no org): one read, then the same rule against the sandbox's own
/// org. `Ok(None)` when no such sandbox exists.
///
/// # Errors
/// [`AccessError`].
pub async fn authorize_sandbox_by_id(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    sandbox_id: &SandboxId,
) -> Result<Option<SandboxRecord>, AccessError> {
    match deps.registry.get_with_owner(sandbox_id).await.map_err(AccessError::Unavailable)? {
        Some((record, owner)) => decide(actor, operation, record, owner.as_ref()).map(Some),
        None => Ok(None),
    }
}

/// The rule on a sandbox's record and its key's owner.
fn decide(
    actor: &Actor,
    operation: Operation,
    record: SandboxRecord,
    owner: Option<&ports::KeyOwner>,
) -> Result<SandboxRecord, AccessError> {
    let (org, sandbox_id) = (record.key.org(), &record.id);
    let target = Target { org, owner: owner.map(|o| &o.identity_id), sandbox_id: Some(sandbox_id) };
    match domain::authorize(actor, operation, &target) {
        Ok(()) => Ok(record),
        // Whoever may not read it does not learn that it exists.
        Err(_) if operation == Operation::Read => {
            Err(AccessError::NotFound { sandbox_id: sandbox_id.clone(), org: org.clone() })
        }
        Err(denial) => {
            warn!(sandbox_id = %sandbox_id, %denial, "refused");
            Err(AccessError::Denied(denial))
        }
    }
}

/// The audit action of an operation that writes one event per call.
fn audited_action(operation: Operation) -> Option<AuditAction> {
    match operation {
        Operation::Ensure => Some(AuditAction::Ensure),
        Operation::Recover => Some(AuditAction::Recover),
        Operation::Deprovision => Some(AuditAction::Deprovision),
        Operation::Read
        | Operation::Exec
        | Operation::Files
        | Operation::Processes
        | Operation::Snapshot
        | Operation::UseSnapshot => None,
    }
}

#[cfg(test)]
mod tests;
