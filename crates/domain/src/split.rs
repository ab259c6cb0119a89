//! The caller split: one function that cuts a sandbox ensure's facts into what the
//! credential mint sees and what the driver's environment sees.
//!
//! The identity id rides into the mint (the token is minted FOR the caller); the class
//! rides onto the environment (the one request fact a driver may decide durability by).
//! The two output types have no field for the other's fact, and only [`split_caller`]
//! builds them from a caller, so no call site can cross them.

use serde::{Deserialize, Serialize};

use crate::caller::{CallerClass, SandboxCaller};
use crate::execution::SandboxSubject;
use crate::id::{ExecutionId, IdentityId, OrgId, SandboxId, SessionId};
use crate::key::SandboxKey;

/// Where the credential file appears inside a sandbox.
pub const TOKEN_FILE_PATH: &str = "/run/sandlane/token";
/// The sandbox's working directory and only writable bind.
pub const WORKSPACE_PATH: &str = "/workspace";
/// `PATH` inside a sandbox.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// What the credential minter needs: everything the token's claims say, and the caller's
/// identity id as the subject. It carries no caller class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintRequest {
    subject: IdentityId,
    org: OrgId,
    session_id: Option<SessionId>,
    execution_id: ExecutionId,
    sandbox_id: SandboxId,
}

impl MintRequest {
    /// The caller the token is minted for (`sub`).
    pub fn subject(&self) -> &IdentityId {
        &self.subject
    }
    /// The org (`org_id`).
    pub fn org(&self) -> &OrgId {
        &self.org
    }
    /// The session, `None` for a workflow sandbox (`session_id` is then empty).
    pub fn session_id(&self) -> Option<&SessionId> {
        self.session_id.as_ref()
    }
    /// The session id as the token carries it: empty for a workflow sandbox.
    pub fn session_claim(&self) -> &str {
        self.session_id.as_ref().map_or("", SessionId::as_str)
    }
    /// The execution (`execution_id`).
    pub fn execution_id(&self) -> &ExecutionId {
        &self.execution_id
    }
    /// The sandbox (`sandbox_id`).
    pub fn sandbox_id(&self) -> &SandboxId {
        &self.sandbox_id
    }
}

/// What the driver's environment carries: the caller's class and the sandbox's facts.
/// It carries no identity id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverEnvironment {
    caller_class: CallerClass,
    sandbox_id: SandboxId,
    org: OrgId,
    session_id: Option<SessionId>,
    execution_id: ExecutionId,
}

impl DriverEnvironment {
    /// The class of the caller who asked (the one fact durability may be decided by).
    pub fn caller_class(&self) -> CallerClass {
        self.caller_class
    }
    /// The sandbox.
    pub fn sandbox_id(&self) -> &SandboxId {
        &self.sandbox_id
    }
    /// The org.
    pub fn org(&self) -> &OrgId {
        &self.org
    }
    /// The session, `None` for a workflow sandbox.
    pub fn session_id(&self) -> Option<&SessionId> {
        self.session_id.as_ref()
    }
    /// The execution.
    pub fn execution_id(&self) -> &ExecutionId {
        &self.execution_id
    }

    /// Exactly the variables a process inside the sandbox sees (`docs/sandbox.md`,
    /// "Environment"), `SANDLANE_TOKEN_FILE` naming the token file. Nothing else.
    pub fn vars(&self) -> Vec<(&'static str, String)> {
        let mut vars = vec![
            ("SANDLANE_CALLER_CLASS", self.caller_class.as_str().to_owned()),
            ("SANDLANE_SANDBOX_ID", self.sandbox_id.to_string()),
            ("SANDLANE_ORG", self.org.to_string()),
            ("SANDLANE_SESSION_ID", self.session_id.as_ref().map(ToString::to_string).unwrap_or_default()),
            ("SANDLANE_EXECUTION_ID", self.execution_id.to_string()),
            ("SANDLANE_TOKEN_FILE", TOKEN_FILE_PATH.to_owned()),
            ("HOME", WORKSPACE_PATH.to_owned()),
            ("PATH", SANDBOX_PATH.to_owned()),
        ];
        vars.extend(crate::egress::proxy_vars());
        vars.extend(crate::egress::ca_vars());
        vars
    }
}

/// The one function that splits a caller two ways: from an execution, the sandbox caller
/// and the sandbox id, the mint request (identity id, no class) and the driver
/// environment (class, no identity id), plus the key the sandbox belongs to.
pub fn split_caller(
    execution: &impl SandboxSubject,
    caller: &SandboxCaller,
    sandbox_id: &SandboxId,
) -> (MintRequest, DriverEnvironment) {
    let mint = MintRequest {
        subject: caller.identity_id().clone(),
        org: execution.org().clone(),
        session_id: execution.session_id().cloned(),
        execution_id: execution.execution_id().clone(),
        sandbox_id: sandbox_id.clone(),
    };
    let env = DriverEnvironment {
        caller_class: caller.class(),
        sandbox_id: sandbox_id.clone(),
        org: execution.org().clone(),
        session_id: execution.session_id().cloned(),
        execution_id: execution.execution_id().clone(),
    };
    (mint, env)
}

/// The execution a live sandbox's record names (its key and the execution of its latest
/// ensure), as a [`SandboxSubject`], so that what is rebuilt from a record (a refreshed
/// credential, a warm sandbox's environment) is cut by [`split_caller`] like an ensure.
#[derive(Debug, Clone, Copy)]
pub struct RecordSubject<'a> {
    key: &'a SandboxKey,
    execution_id: &'a ExecutionId,
}

impl<'a> RecordSubject<'a> {
    /// The subject of the sandbox of `key` whose latest ensure was for `execution_id`.
    pub fn new(key: &'a SandboxKey, execution_id: &'a ExecutionId) -> Self {
        Self { key, execution_id }
    }
}

impl SandboxSubject for RecordSubject<'_> {
    fn sandbox_key(&self) -> SandboxKey {
        self.key.clone()
    }
    fn session_id(&self) -> Option<&SessionId> {
        match self.key {
            SandboxKey::Session { session_id, .. } => Some(session_id),
            SandboxKey::Workflow { .. } => None,
        }
    }
    fn execution_id(&self) -> &ExecutionId {
        self.execution_id
    }
    fn org(&self) -> &OrgId {
        self.key.org()
    }
}

#[cfg(test)]
mod tests;
