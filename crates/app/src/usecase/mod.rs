//! The lane's use cases: the two ensure bodies, deprovision, recovery, phase moves, and the
//! operations on one sandbox (read, exec, streaming exec, background processes, files and
//! archives).
//!
//! Each is a function over the ports in [`LaneDeps`], with a tracing span carrying the
//! sandbox key, org, caller class and outcome (never a token). Every public use case takes
//! the acting [`domain::Actor`] and asks [`authorize_key`] or [`authorize_sandbox`] whether it may act, before it touches
//! anything; the ensure and deprovision bodies inside receive only the cut
//! [`domain::SandboxCaller`].

mod access;
mod activity;
mod audit_event;
mod commands;
mod deprovision;
pub mod egress;
mod ensure;
mod failure;
mod files;
mod lifecycle;
mod places;
mod policy;
mod pool_demand;
pub mod preview;
mod processes;
mod sandbox;
mod secrets;
mod snapshots;
pub mod standing;
mod streams;
mod terminals;
mod view;
pub mod webhooks;

#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;

use std::time::Duration;

use domain::DurabilityPolicy;
use ports::{
    AuditLog, CallerDirectory, Clock, CredentialMinter, SandboxDriver, SandboxLane, SandboxRegistry,
    SecretStore,
};

pub use access::{AccessError, authorize_key, authorize_sandbox, precheck};
pub use activity::{ActivityTracker, Running};
pub use commands::{CommandGate, CommandPermit, CommandRefusal, HEARTBEAT as COMMAND_HEARTBEAT};
pub use deprovision::{DeprovisionError, DeprovisionOutcome, deprovision_sandbox};
pub use ensure::{
    EnsureError, ResumeError, SessionEnsureOutcome, WorkflowEnsureOutcome,
    ensure_session_sandbox_for_execution, ensure_session_sandbox_from, ensure_workflow_sandbox_for_execution,
    ensure_workflow_sandbox_from, recover_workflow_sandbox,
};
pub(crate) use ensure::{retire_gone, with_renewal};
pub use failure::{ProvisionError, ProvisionFailure, chain};
pub use files::{archive_in, archive_out, delete_path, read_path, write_file};
pub use lifecycle::{PhaseMoveError, apply_phase_move};
pub use places::{Place, Places, SandboxPlaces};
pub use policy::{
    EffectivePolicy, GetPolicyError, POLICY_TTL, Policies, PolicyLane, PolicyReadError, SetPolicyError,
    get_org_policy, set_org_policy, show_org_policy,
};
pub use pool_demand::{ADOPTING_MS, PoolDemand};
pub use processes::{
    get_process, list_processes, process_output, signal_process, start_process, write_process_stdin,
};
pub use sandbox::{ExecError, exec_in_sandbox, get_sandbox};
pub use secrets::{
    MAX_SECRETS_PER_IDENTITY, MAX_SECRETS_PER_ORG, SecretError, SecretPorts, SecretRequest, delete_secret,
    list_secrets, set_secret,
};
pub use snapshots::{
    SnapshotError, delete_snapshot, list_snapshots, restore_sandbox, take_snapshot, usable_snapshot,
};
pub use streams::{OperationError, StreamLimits, exec_stream_in_sandbox};
pub use terminals::{
    Attached, TICKET_PREFIX, TICKET_TTL_MS, Ticket, TicketError, attach_terminal, create_terminal,
    delete_terminal, get_terminal, issue_ticket, list_terminals, redeem_ticket,
};
pub use view::SandboxView;

/// A new time-ordered sandbox id (the clock's milliseconds and 80 random bits).
///
/// # Errors
/// When the system has no entropy.
/// What a span says of who acts: the caller's class (`user`, `service`, `internal`) or
/// `sandbox_token`; never an id, a key or a token.
pub fn actor_class(actor: &domain::Actor) -> &'static str {
    match actor {
        domain::Actor::Caller(identity) => identity.class().as_str(),
        domain::Actor::SandboxToken { .. } => "sandbox_token",
    }
}

/// A new sandbox id.
pub fn fresh_id(now: domain::Timestamp) -> Result<domain::SandboxId, getrandom::Error> {
    ensure::fresh_sandbox_id(now)
}

/// Everything the use cases need: the ports, the durability policy, and this replica's
/// identity for provisioning leases.
#[derive(Clone)]
pub struct LaneDeps {
    /// Whether the lane is on.
    pub lane: Arc<dyn SandboxLane>,
    /// Mints credentials for callers.
    pub minter: Arc<dyn CredentialMinter>,
    /// Provisions sandboxes.
    pub driver: Arc<dyn SandboxDriver>,
    /// Records sandboxes.
    pub registry: Arc<dyn SandboxRegistry>,
    /// Records decisions.
    pub audit: Arc<dyn AuditLog>,
    /// Tells the time.
    pub clock: Arc<dyn Clock>,
    /// Caller class → durability.
    pub policy: DurabilityPolicy,
    /// This replica's id, the holder of the leases it takes.
    pub replica_id: String,
    /// How long a provisioning lease lasts, in milliseconds.
    pub lease_ms: i64,
    /// How often a waiter re-reads a claim another holder is provisioning, in ms.
    pub wait_poll_ms: u64,
    /// How long a caller waits for an ensure or recovery before it is told (with the
    /// posture's failure) that provisioning goes on in the background.
    pub ensure_deadline: Duration,
    /// The callers (the refresher never re-mints for a revoked one).
    pub directory: Arc<dyn CallerDirectory>,
    /// The org policies (lane, quotas, timeouts, pools), cached per org.
    pub policies: Arc<Policies>,
    /// Which sandboxes are active (for the idle timeout).
    pub activity: Arc<ActivityTracker>,
    /// The concurrent-command quotas.
    pub commands: Arc<CommandGate>,
    /// Which orgs are adopting warm sandboxes here (the pool pass stands aside).
    pub pool_demand: Arc<PoolDemand>,
    /// The caps of the operations inside a sandbox (files, archives, processes).
    pub streams: StreamLimits,
    /// The file operations under way on this replica, per sandbox.
    pub file_ops: Arc<SandboxPlaces>,
    /// The connections to each sandbox's ports through the preview host open on this
    /// replica.
    pub previews: Arc<SandboxPlaces>,
    /// The org's brokered secrets.
    pub secrets: Arc<dyn SecretStore>,
    /// The snapshot records.
    pub snapshots: Arc<dyn ports::SnapshotStore>,
    /// The terminal tickets (single-use credentials for attaching a terminal).
    pub tickets: Arc<dyn ports::TerminalTickets>,
    /// The preview links.
    pub preview_links: Arc<dyn ports::PreviewLinkStore>,
}
