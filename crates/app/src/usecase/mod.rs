//! The lane's use cases: the two ensure bodies, deprovision, recovery and phase moves.
//!
//! Each is a function over the ports in [`LaneDeps`], with a tracing span carrying the
//! sandbox key, org, caller class and outcome (never a token).

mod audit_event;
mod deprovision;
mod ensure;
mod lifecycle;
mod view;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use domain::DurabilityPolicy;
use ports::{AuditLog, Clock, CredentialMinter, SandboxDriver, SandboxLane, SandboxRegistry};

pub use deprovision::{DeprovisionError, DeprovisionOutcome, deprovision_sandbox};
pub use ensure::{
    EnsureError, SessionEnsureOutcome, WorkflowEnsureOutcome, ensure_session_sandbox_for_execution,
    ensure_workflow_sandbox_for_execution, recover_workflow_sandbox,
};
pub use lifecycle::{PhaseMoveError, apply_phase_move};
pub use view::SandboxView;

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
}
