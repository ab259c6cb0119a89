//! The two execution kinds a sandbox serves and their phases.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{ExecutionId, OrgId, SessionId};
use crate::key::SandboxKey;

/// The phase of an agent or workflow execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Created, not yet running.
    Pending,
    /// Running.
    InProgress,
    /// Finished successfully (terminal).
    Completed,
    /// Finished with a failure (terminal, but a workflow execution may be recovered).
    Failed,
    /// Stopped on request (terminal).
    Cancelled,
}

impl Phase {
    /// Every phase, for exhaustive checks.
    pub const ALL: [Phase; 5] =
        [Self::Pending, Self::InProgress, Self::Completed, Self::Failed, Self::Cancelled];

    /// The snake_case name.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::InProgress => "in_progress",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An agent execution: it runs inside a session, whose sandbox it shares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentExecution {
    /// The org.
    pub org: OrgId,
    /// The session the execution belongs to.
    pub session_id: SessionId,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its phase.
    pub phase: Phase,
}

/// A workflow execution: it has no session and owns its own sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowExecution {
    /// The org.
    pub org: OrgId,
    /// The execution.
    pub execution_id: ExecutionId,
    /// Its phase.
    pub phase: Phase,
}

/// What the caller split needs to know about an execution: its sandbox key, its session
/// (none for a workflow) and its id. Implemented by the two execution kinds only.
pub trait SandboxSubject {
    /// The key of the sandbox this execution runs in.
    fn sandbox_key(&self) -> SandboxKey;
    /// The session, for an agent execution; `None` for a workflow execution.
    fn session_id(&self) -> Option<&SessionId>;
    /// The execution id.
    fn execution_id(&self) -> &ExecutionId;
    /// The org.
    fn org(&self) -> &OrgId;
}

impl SandboxSubject for AgentExecution {
    fn sandbox_key(&self) -> SandboxKey {
        SandboxKey::Session { org: self.org.clone(), session_id: self.session_id.clone() }
    }
    fn session_id(&self) -> Option<&SessionId> {
        Some(&self.session_id)
    }
    fn execution_id(&self) -> &ExecutionId {
        &self.execution_id
    }
    fn org(&self) -> &OrgId {
        &self.org
    }
}

impl SandboxSubject for WorkflowExecution {
    fn sandbox_key(&self) -> SandboxKey {
        SandboxKey::Workflow { org: self.org.clone(), execution_id: self.execution_id.clone() }
    }
    fn session_id(&self) -> Option<&SessionId> {
        None
    }
    fn execution_id(&self) -> &ExecutionId {
        &self.execution_id
    }
    fn org(&self) -> &OrgId {
        &self.org
    }
}
