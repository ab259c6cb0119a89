//! The operations on one named sandbox: read it, run a command inside. Each asks
//! [`super::access::authorize_sandbox`] first, so the ownership rule holds here exactly as
//! for ensure and deprovision.

use domain::{Actor, ExecOutput, ExecRequest, Operation, OrgId, SandboxId, SandboxState};
use ports::DriverError;
use tracing::{Instrument, info_span};

use super::access::{AccessError, authorize_sandbox};
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

/// Runs `request` inside the sandbox `sandbox_id` of `org` for `actor`: a service caller of
/// the org, the user who owns the sandbox's key, or the sandbox's own token. A non-zero
/// exit or a timeout is an `Ok` output. The command belongs to the request: a caller that
/// goes away ends it.
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
    let span = info_span!("exec", sandbox_id = %sandbox_id, org = %org);
    async {
        let record = authorize_sandbox(deps, actor, Operation::Exec, org, sandbox_id).await?;
        if record.state != SandboxState::Ready {
            return Err(ExecError::NotReady { sandbox_id: sandbox_id.clone(), state: record.state });
        }
        deps.driver.exec(sandbox_id, request).await.map_err(|e| match e {
            DriverError::NotFound(id) => ExecError::Gone(id),
            other => ExecError::Driver(other),
        })
    }
    .instrument(span)
    .await
}
