//! The operations on one named sandbox: read it, run a command inside. Each asks
//! [`super::access::authorize_sandbox`] first, so the ownership rule holds here exactly as
//! for ensure and deprovision. Everything done inside a sandbox passes [`admit`] (exec
//! here; the streamed exec, background processes and files in [`super::streams`]): a
//! suspended sandbox is resumed first; a command takes a place in its org's and its
//! sandbox's command quotas; the work counts as the sandbox's activity.

use domain::{Actor, ExecOutput, ExecRequest, Operation, OrgId, SandboxId, SandboxState};
use ports::{DriverError, RegistryError};
use tracing::{Instrument, Span, info_span};

use super::access::{AccessError, authorize_sandbox};
use super::activity::Running;
use super::commands::{CommandPermit, CommandRefusal};
use super::ensure::{ResumeError, ready_for_use};
use super::failure::ProvisionFailure;
use super::policy::PolicyReadError;
use super::{LaneDeps, SandboxView};

/// Why a command did not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExecError {
    /// The actor may not exec here, or the sandbox does not exist for it.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The sandbox is not ready (provisioning, failed or deprovisioned).
    #[error("sandbox {sandbox_id} is {state}, not ready")]
    NotReady {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its state.
        state: SandboxState,
    },
    /// The driver no longer holds the sandbox; the next ensure provisions it again.
    #[error("sandbox {0} is not present on the driver; ensure it again")]
    Gone(SandboxId),
    /// The driver could not start the command.
    #[error("the driver could not run the command")]
    Driver(#[source] DriverError),
    /// A command quota (the org's or the sandbox's) is used up.
    #[error(transparent)]
    Busy(CommandRefusal),
    /// The sandbox was suspended and resuming it would take its org past its quota of
    /// running sandboxes.
    #[error("sandbox {sandbox_id} is suspended and cannot be resumed now")]
    OverQuota {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The refusal (its message has the provisioning-failed prefix).
        #[source]
        failure: ProvisionFailure,
    },
    /// The sandbox was suspended and could not be resumed.
    #[error("sandbox {sandbox_id} was suspended and could not be resumed")]
    Resume {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Why.
        #[source]
        failure: ProvisionFailure,
    },
    /// The org's policy could not be read, so the quotas could not be applied.
    #[error(transparent)]
    Policy(PolicyReadError),
    /// The sandbox's activity could not be recorded (it could be suspended under the
    /// command), so the command did not start.
    #[error("cannot record the sandbox's activity now")]
    Activity(#[source] RegistryError),
}

/// The sandbox `sandbox_id` of `org`, as `actor` may read it. A sandbox the actor may not
/// read is [`AccessError::NotFound`], like one that does not exist.
///
/// # Errors
/// [`AccessError`].
pub async fn get_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
) -> Result<SandboxView, AccessError> {
    let record = authorize_sandbox(deps, actor, Operation::Read, org, sandbox_id).await?;
    Ok(SandboxView::of(&record, None))
}

/// What a command or operation holds while it runs: its places in the command quotas (a
/// command's; none for an operation that is not one), and the sandbox's activity.
pub(crate) struct Admission {
    /// The command's places in the org's and the sandbox's command quotas.
    pub(crate) permit: Option<CommandPermit>,
    /// The sandbox counts as active while this is held (read by its drop).
    pub(crate) _running: Running,
}

/// The gate of everything done inside a sandbox (exec, streamed exec, background
/// processes, files): `actor` may do `operation` in it; a suspended sandbox is resumed
/// first (same id, same workspace, a fresh token file), transparently; a `command` takes a
/// place in the org's and the sandbox's command quotas (refused when one is used up); and
/// the sandbox's activity is noted (written at once when it looked idle) and held until
/// the [`Admission`] is dropped, so the idle pass never suspends it under the work.
///
/// # Errors
/// [`ExecError`].
pub(crate) async fn admit(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    org: &OrgId,
    sandbox_id: &SandboxId,
    command: bool,
) -> Result<Admission, ExecError> {
    let record = authorize_sandbox(deps, actor, operation, org, sandbox_id).await?;
    admit_record(deps, record, command).await
}

/// [`admit`] for a sandbox whose record was read and authorised otherwise (a preview
/// link, which opens its one port without an actor).
///
/// # Errors
/// [`ExecError`].
pub(crate) async fn admit_record(
    deps: &LaneDeps,
    record: domain::sandbox::SandboxRecord,
    command: bool,
) -> Result<Admission, ExecError> {
    let org = &record.key.org().clone();
    let sandbox_id = &record.id.clone();
    let policy = deps.policies.of(org).await.map_err(ExecError::Policy)?;
    let policy = &policy.policy;
    let record = ready_for_use(deps, record, policy).await.map_err(|e| match e {
        ResumeError::NotReady { sandbox_id, state } => ExecError::NotReady { sandbox_id, state },
        ResumeError::Quota(failure) => ExecError::OverQuota { sandbox_id: sandbox_id.clone(), failure },
        ResumeError::Failed(failure) => ExecError::Resume { sandbox_id: sandbox_id.clone(), failure },
    })?;
    if record.state != SandboxState::Ready {
        return Err(ExecError::NotReady { sandbox_id: sandbox_id.clone(), state: record.state });
    }
    let permit = if command {
        Some(
            deps.commands
                .admit(org, sandbox_id, policy.max_commands(), policy.max_commands_per_sandbox())
                .await
                .map_err(ExecError::Busy)?,
        )
    } else {
        None
    };
    deps.activity
        .note_before_use(deps.registry.as_ref(), &record, policy.idle_timeout_ms(), deps.clock.now())
        .await
        .map_err(ExecError::Activity)?;
    let running = if command {
        deps.activity.begin(sandbox_id, org, deps.clock.clone())
    } else {
        deps.activity.begin_operation(sandbox_id, org, deps.clock.clone())
    };
    Ok(Admission { permit, _running: running })
}

/// Runs `request` inside the sandbox `sandbox_id` of `org` for `actor`: a service caller of
/// the org, the user who owns the sandbox's key, or the sandbox's own token. A non-zero
/// exit or a timeout is an `Ok` output. The command belongs to the request: a caller that
/// goes away ends it. A suspended sandbox is resumed first (same id, same workspace, a
/// fresh token file), transparently; the command then takes a place in the org's and the
/// sandbox's command quotas (refused when one is used up).
///
/// # Errors
/// [`ExecError`].
pub async fn exec_in_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    request: &ExecRequest,
) -> Result<ExecOutput, ExecError> {
    let span = info_span!(
        "exec",
        sandbox_id = %sandbox_id,
        org = %org,
        caller_class = super::actor_class(actor),
        outcome = tracing::field::Empty,
    );
    async {
        let result = async {
            let _admission = admit(deps, actor, Operation::Exec, org, sandbox_id, true).await?;
            deps.driver.exec(sandbox_id, request).await.map_err(|e| match e {
                DriverError::NotFound(id) => ExecError::Gone(id),
                other => ExecError::Driver(other),
            })
        }
        .await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(ExecError::Driver(_) | ExecError::Gone(_)) => "driver_error",
            Err(_) => "refused",
        };
        Span::current().record("outcome", outcome);
        result
    }
    .instrument(span)
    .await
}

impl ExecError {
    /// The quota that refused, when one did (for metrics): `max_commands`,
    /// `max_commands_per_sandbox` or `max_sandboxes`.
    #[must_use]
    pub fn quota(&self) -> Option<&'static str> {
        match self {
            Self::Busy(CommandRefusal::Org { .. }) => Some("max_commands"),
            Self::Busy(CommandRefusal::Sandbox { .. }) => Some("max_commands_per_sandbox"),
            Self::OverQuota { .. } => Some("max_sandboxes"),
            _ => None,
        }
    }
}
