//! The chain steps a host server plugs into its create chain.
//!
//! A step takes the chain's context (the new execution state and the whole
//! [`CallerIdentity`]), has the use case authorise it (who may touch the key) and hands the
//! ensure body only the [`domain::SandboxCaller`] cut from it. The chain always has a
//! caller: the in-process transport mints `internal` ([`CallerIdentity::internal`]) for the
//! server's own calls.

use std::sync::Arc;

use async_trait::async_trait;
use domain::{Actor, AgentExecution, CallerIdentity, WorkflowExecution};

use crate::usecase::{
    AccessError, EnsureError, LaneDeps, SessionEnsureOutcome, ensure_session_sandbox_for_execution,
    ensure_workflow_sandbox_for_execution,
};

/// What a create chain carries from step to step.
#[derive(Debug, Clone)]
pub struct CreateContext<S> {
    /// The execution being created.
    pub new_state: S,
    /// Who asked.
    pub caller_identity: CallerIdentity,
    /// Non-critical failures the host should surface (e.g. on the execution's status).
    pub warnings: Vec<String>,
}

impl<S> CreateContext<S> {
    /// A context for `new_state` requested by `caller_identity`.
    pub fn new(new_state: S, caller_identity: CallerIdentity) -> Self {
        Self { new_state, caller_identity, warnings: Vec::new() }
    }
}

/// Why a step stopped the chain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    /// A critical dependency is unavailable (the host maps this to Unavailable). The
    /// message is the posture's: it starts with the provisioning-failed prefix.
    #[error("{0}")]
    Unavailable(String),
    /// The caller may not touch this sandbox key (the host maps this to PermissionDenied).
    #[error(transparent)]
    Access(#[from] AccessError),
}

impl From<EnsureError> for StepError {
    fn from(e: EnsureError) -> Self {
        match e {
            EnsureError::Provisioning(failure) => Self::Unavailable(failure.message()),
            EnsureError::Access(e) => Self::Access(e),
        }
    }
}

/// One step of a host's create chain over execution state `S`.
#[async_trait]
pub trait CreateStep<S: Send + Sync>: Send + Sync {
    /// The step's name, for the host's logs.
    fn name(&self) -> &'static str;
    /// Runs the step.
    ///
    /// # Errors
    /// [`StepError`] stops the chain.
    async fn run(&self, ctx: &mut CreateContext<S>) -> Result<(), StepError>;
}

/// Ensures the session sandbox of a new agent execution. Non-critical: never fails the
/// launch; a failure is added to the context's warnings (already logged and audited).
pub struct EnsureSessionSandboxStep {
    deps: Arc<LaneDeps>,
}

impl EnsureSessionSandboxStep {
    /// The step over the lane's dependencies.
    pub fn new(deps: Arc<LaneDeps>) -> Self {
        Self { deps }
    }
}

#[async_trait]
impl CreateStep<AgentExecution> for EnsureSessionSandboxStep {
    fn name(&self) -> &'static str {
        "ensure_session_sandbox"
    }

    async fn run(&self, ctx: &mut CreateContext<AgentExecution>) -> Result<(), StepError> {
        let actor = Actor::Caller(ctx.caller_identity.clone());
        if let SessionEnsureOutcome::Failed(failure) =
            ensure_session_sandbox_for_execution(&self.deps, &actor, &ctx.new_state).await?
        {
            ctx.warnings.push(failure.message());
        }
        Ok(())
    }
}

/// Ensures the sandbox of a new workflow execution. Critical: a failure stops the chain
/// with [`StepError::Unavailable`] carrying the prefixed message.
pub struct EnsureWorkflowSandboxStep {
    deps: Arc<LaneDeps>,
}

impl EnsureWorkflowSandboxStep {
    /// The step over the lane's dependencies.
    pub fn new(deps: Arc<LaneDeps>) -> Self {
        Self { deps }
    }
}

#[async_trait]
impl CreateStep<WorkflowExecution> for EnsureWorkflowSandboxStep {
    fn name(&self) -> &'static str {
        "ensure_workflow_sandbox"
    }

    async fn run(&self, ctx: &mut CreateContext<WorkflowExecution>) -> Result<(), StepError> {
        let actor = Actor::Caller(ctx.caller_identity.clone());
        ensure_workflow_sandbox_for_execution(&self.deps, &actor, &ctx.new_state).await?;
        Ok(())
    }
}
