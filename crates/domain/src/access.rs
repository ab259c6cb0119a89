//! Who may touch a sandbox: the ownership rule, as one pure function.
//!
//! A sandbox key (a session, a workflow execution) belongs to the identity whose ensure
//! first created it, and keeps that owner across deprovision and recovery. The rule:
//!
//! | actor | may |
//! |---|---|
//! | `internal` (the server's own calls) | everything, in every org |
//! | a `service` caller of the org | everything on every key of the org (it acts for the platform) |
//! | a `user` caller of the org | everything on keys it owns; ensure and recover of a key nobody owns yet (it becomes the owner); deprovision of a key nobody owns (a no-op) |
//! | a sandbox token | exec, files, processes, snapshot and restore in its own sandbox only |
//! | anyone else | nothing |
//!
//! The use cases gather the facts (the key's owner from the registry) and ask
//! [`authorize`]; they never decide on their own.

use std::fmt;

use crate::caller::{CallerClass, CallerIdentity};
use crate::id::{IdentityId, OrgId, SandboxId};

/// What an actor wants to do to a sandbox or its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// Ensure the key's sandbox (session or workflow).
    Ensure,
    /// Recover a workflow execution's sandbox (a fresh one).
    Recover,
    /// Deprovision the key's sandbox.
    Deprovision,
    /// Read the sandbox record.
    Read,
    /// Run a command inside.
    Exec,
    /// Read or write files inside.
    Files,
    /// Start, list, signal or read background processes inside.
    Processes,
    /// Take a snapshot of the sandbox's workspace, or restore it from one (as exec).
    Snapshot,
    /// Fork from, read or delete a snapshot: the target's owner is the snapshot's (the
    /// owner of its source key).
    UseSnapshot,
}

impl Operation {
    /// Every operation, for tests and tables.
    pub const ALL: [Self; 9] = [
        Self::Ensure,
        Self::Recover,
        Self::Deprovision,
        Self::Read,
        Self::Exec,
        Self::Files,
        Self::Processes,
        Self::Snapshot,
        Self::UseSnapshot,
    ];

    /// The operations a sandbox token may perform in its own sandbox.
    pub const fn open_to_sandbox_tokens(self) -> bool {
        matches!(self, Self::Exec | Self::Files | Self::Processes | Self::Snapshot)
    }

    /// The operations that create the key's owner when nobody owns it yet.
    pub const fn claims_ownership(self) -> bool {
        matches!(self, Self::Ensure | Self::Recover)
    }

    /// A lowercase name for messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ensure => "ensure",
            Self::Recover => "recover",
            Self::Deprovision => "deprovision",
            Self::Read => "read",
            Self::Exec => "exec in",
            Self::Files => "use the files of",
            Self::Processes => "use the processes of",
            Self::Snapshot => "snapshot or restore",
            Self::UseSnapshot => "use the snapshots of",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is acting: an authenticated caller, or a verified sandbox token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Actor {
    /// A caller key's identity (`user` or `service`), or the server's `internal` caller.
    Caller(CallerIdentity),
    /// A sandbox token (its claims verified and its sandbox's tokens not revoked).
    SandboxToken {
        /// The org the token was minted in.
        org: OrgId,
        /// The sandbox the token belongs to.
        sandbox_id: SandboxId,
        /// The caller the token was minted for.
        subject: IdentityId,
    },
}

/// The facts about the thing acted on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    /// The org of the key.
    pub org: &'a OrgId,
    /// The key's owner, when it has one.
    pub owner: Option<&'a IdentityId>,
    /// The sandbox, when the operation names one (exec, read, files, processes).
    pub sandbox_id: Option<&'a SandboxId>,
}

/// Why an actor may not do what it asked. Messages name the actor and the target, never a
/// credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denial {
    /// The caller is not a member of the target's org.
    #[error("caller {caller} may not act in org {org}")]
    NotInOrg {
        /// The caller.
        caller: IdentityId,
        /// The org.
        org: OrgId,
    },
    /// A user caller asked to touch a key another identity owns (or, for a sandbox it
    /// names, a key with no recorded owner).
    #[error(
        "user {caller} does not own this sandbox; only its owner and the org's service callers may {operation} it"
    )]
    NotOwner {
        /// The caller.
        caller: IdentityId,
        /// What it asked.
        operation: Operation,
    },
    /// A sandbox token asked for something other than exec, files, processes, snapshot
    /// or restore.
    #[error("a sandbox token may not {operation} a sandbox; use a caller key")]
    TokenOperation {
        /// What it asked.
        operation: Operation,
    },
    /// A sandbox token named a sandbox other than its own.
    #[error("a sandbox token may act only in its own sandbox")]
    TokenOutsideItsSandbox,
    /// A sandbox token asked for an org-wide record (the policy, the audit log).
    #[error("a sandbox token may not read the org's records; use a caller key")]
    TokenOrgRead,
    /// A user caller asked for what only the org's service callers may read.
    #[error("only service callers of org {org} may read its {what}")]
    ServiceOnly {
        /// The org.
        org: OrgId,
        /// What was asked for (`policy`).
        what: &'static str,
    },
}

/// Whether `actor` may read org-wide records of `org` (its policy): the org's service
/// callers and the server itself; no user, no sandbox token, no caller of another org.
///
/// # Errors
/// The [`Denial`] saying why not.
pub fn authorize_org_read(actor: &Actor, org: &OrgId, what: &'static str) -> Result<(), Denial> {
    match actor {
        Actor::SandboxToken { .. } => Err(Denial::TokenOrgRead),
        Actor::Caller(caller) if !caller.may_act_in(org) => {
            Err(Denial::NotInOrg { caller: caller.identity_id().clone(), org: org.clone() })
        }
        Actor::Caller(caller) => match caller.class() {
            CallerClass::Service | CallerClass::Internal => Ok(()),
            CallerClass::User => Err(Denial::ServiceOnly { org: org.clone(), what }),
        },
    }
}

/// Whether `actor` may perform `operation` on `target`.
///
/// # Errors
/// The [`Denial`] saying why not.
pub fn authorize(actor: &Actor, operation: Operation, target: &Target<'_>) -> Result<(), Denial> {
    match actor {
        Actor::SandboxToken { org, sandbox_id, .. } => {
            if !operation.open_to_sandbox_tokens() {
                return Err(Denial::TokenOperation { operation });
            }
            if org == target.org && target.sandbox_id == Some(sandbox_id) {
                Ok(())
            } else {
                Err(Denial::TokenOutsideItsSandbox)
            }
        }
        Actor::Caller(caller) => {
            if !caller.may_act_in(target.org) {
                return Err(Denial::NotInOrg {
                    caller: caller.identity_id().clone(),
                    org: target.org.clone(),
                });
            }
            match caller.class() {
                CallerClass::Internal | CallerClass::Service => Ok(()),
                CallerClass::User => {
                    let allowed = match target.owner {
                        Some(owner) => owner == caller.identity_id(),
                        // Nobody owns the key: an ensure or recovery makes this caller
                        // its owner; a deprovision has nothing to remove. A named
                        // sandbox always has an owner, so its absence denies.
                        None => {
                            target.sandbox_id.is_none()
                                && (operation.claims_ownership() || operation == Operation::Deprovision)
                        }
                    };
                    if allowed {
                        Ok(())
                    } else {
                        Err(Denial::NotOwner { caller: caller.identity_id().clone(), operation })
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
