//! What a sandbox belongs to: a session or a workflow execution, within an org.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::id::{ExecutionId, OrgId, SessionId};

/// The two kinds of sandbox key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxKind {
    /// Shared by every agent execution of one session.
    Session,
    /// Owned by one workflow execution.
    Workflow,
}

impl SandboxKind {
    /// `session` or `workflow`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Session => "session",
            Self::Workflow => "workflow",
        }
    }

    /// Parses `session` or `workflow`.
    ///
    /// # Errors
    /// [`UnknownKind`] naming the input.
    pub fn parse(input: &str) -> Result<Self, UnknownKind> {
        match input {
            "session" => Ok(Self::Session),
            "workflow" => Ok(Self::Workflow),
            other => Err(UnknownKind(other.to_owned())),
        }
    }
}

impl fmt::Display for SandboxKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A string that is not a sandbox kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sandbox kind {0:?}; expected \"session\" or \"workflow\"")]
pub struct UnknownKind(pub String);

/// What a sandbox belongs to. Unique within an org: at most one live sandbox per key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SandboxKey {
    /// All agent executions of a session share this sandbox.
    Session {
        /// The org.
        org: OrgId,
        /// The session.
        session_id: SessionId,
    },
    /// One workflow execution's sandbox.
    Workflow {
        /// The org.
        org: OrgId,
        /// The workflow execution.
        execution_id: ExecutionId,
    },
}

impl SandboxKey {
    /// The org the key lives in.
    pub fn org(&self) -> &OrgId {
        match self {
            Self::Session { org, .. } | Self::Workflow { org, .. } => org,
        }
    }

    /// Session or workflow.
    pub fn kind(&self) -> SandboxKind {
        match self {
            Self::Session { .. } => SandboxKind::Session,
            Self::Workflow { .. } => SandboxKind::Workflow,
        }
    }

    /// The key within its org and kind: the session id or the execution id.
    pub fn key(&self) -> &str {
        match self {
            Self::Session { session_id, .. } => session_id.as_str(),
            Self::Workflow { execution_id, .. } => execution_id.as_str(),
        }
    }

    /// Rebuilds a key from its stored parts.
    ///
    /// # Errors
    /// [`crate::IdError`] when `key` is not a valid id.
    pub fn from_parts(org: OrgId, kind: SandboxKind, key: &str) -> Result<Self, crate::IdError> {
        Ok(match kind {
            SandboxKind::Session => Self::Session { org, session_id: SessionId::parse(key)? },
            SandboxKind::Workflow => Self::Workflow { org, execution_id: ExecutionId::parse(key)? },
        })
    }
}

impl fmt::Display for SandboxKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.org(), self.kind(), self.key())
    }
}
