//! Applying an execution's phase move to its sandbox, by the domain's lifecycle rules.

use domain::execution::SandboxSubject;
use domain::lifecycle::{LifecycleError, SandboxEffect, transition};
use domain::{Actor, Phase, WorkflowExecution};

use super::{DeprovisionError, EnsureError, LaneDeps, deprovision_sandbox, recover_workflow_sandbox};

/// Why a phase move could not be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhaseMoveError {
    /// The move is impossible.
    #[error(transparent)]
    Impossible(#[from] LifecycleError),
    /// The FAILED move's deprovision failed.
    #[error("deprovision failed: {0}")]
    Deprovision(#[from] DeprovisionError),
    /// The recovery's fresh provision failed.
    #[error(transparent)]
    Recover(#[from] EnsureError),
}

/// Applies, for `actor`, the sandbox effect of moving `execution` (currently in `execution.phase`
/// for a workflow, or `from` in general) to `to`: FAILED deprovisions; recovering a
/// FAILED workflow execution provisions a fresh sandbox; other moves do nothing.
///
/// # Errors
/// [`PhaseMoveError`]: an impossible move touches nothing.
pub async fn apply_phase_move(
    deps: &LaneDeps,
    execution: &impl SandboxSubject,
    from: Phase,
    to: Phase,
    actor: &Actor,
) -> Result<SandboxEffect, PhaseMoveError> {
    let key = execution.sandbox_key();
    let effect = transition(key.kind(), from, to)?;
    match effect {
        SandboxEffect::None => {}
        SandboxEffect::Deprovision => {
            deprovision_sandbox(deps, actor, &key).await?;
        }
        SandboxEffect::Reprovision => {
            let recovered = WorkflowExecution {
                org: execution.org().clone(),
                execution_id: execution.execution_id().clone(),
                phase: to,
            };
            recover_workflow_sandbox(deps, actor, &recovered).await?;
        }
    }
    Ok(effect)
}
