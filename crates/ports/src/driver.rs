//! The sandbox driver: provisions, runs commands in, and removes real sandboxes.

use async_trait::async_trait;
use domain::{DriverEnvironment, Durability, ExecOutput, ExecRequest, SandboxId, SandboxKey, SandboxToken};

/// Everything a driver needs to provision one sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionSpec {
    /// What the sandbox belongs to (durable workspaces are found again by key).
    pub key: SandboxKey,
    /// The environment processes inside see: the caller's class and the sandbox facts.
    /// Its sandbox id is the sandbox being provisioned.
    pub environment: DriverEnvironment,
    /// Whether the workspace survives deprovision.
    pub durability: Durability,
    /// The credential, delivered as a read-only file (never in the environment).
    pub credential: SandboxToken,
    /// The provisioning claim's fencing epoch. The driver records it: a provision of the
    /// same sandbox id with an older epoch than the one it holds fails; one with a newer
    /// epoch replaces whatever the older attempt built. So a taken-over provision never
    /// runs twice on one id.
    pub epoch: i64,
    /// The most bytes the sandbox's processes may write into the workspace, enforced by
    /// the kernel (a write beyond it fails inside with `ENOSPC` or `EDQUOT`); `None`: no
    /// quota. A workspace keeps the quota it was created with (a durable one grows to a
    /// larger quota when provisioned again).
    pub workspace_bytes: Option<u64>,
}

impl ProvisionSpec {
    /// The sandbox being provisioned.
    pub fn sandbox_id(&self) -> &SandboxId {
        self.environment.sandbox_id()
    }
}

/// How usable the driver is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverHealth {
    /// Whether it can provision and exec right now.
    pub usable: bool,
    /// A human-readable line: the program and version, how limits are enforced
    /// (`rlimits`, `rlimits+cgroup-v1`, …), or why it is not usable.
    pub detail: String,
}

/// Why a driver call failed. Messages never contain a credential.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DriverError {
    /// The driver cannot work at all (program or engine missing, broken setup). The
    /// message says what is missing and how to install it.
    #[error("driver unavailable: {0}")]
    Unavailable(String),
    /// The driver holds no sandbox with this id.
    #[error("sandbox {0} is not provisioned on this driver")]
    NotFound(SandboxId),
    /// The readiness probe or another step failed.
    #[error("{0}")]
    Failed(String),
}

/// Provisions and runs isolated sandboxes.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait SandboxDriver: Send + Sync {
    /// The driver's name as recorded on sandboxes (`bubblewrap`, `container`).
    fn name(&self) -> &'static str;

    /// Creates the workspace (reusing a durable one of the same key), writes the
    /// credential file, and starts the sandbox (its supervisor answers before this
    /// returns). MUST NOT return `Ok` unless a command can run in the sandbox. Idempotent
    /// for the same sandbox id and epoch; see [`ProvisionSpec::epoch`] for others.
    ///
    /// # Errors
    /// [`DriverError::Unavailable`] when the driver cannot work or the host lacks a
    /// required protection; [`DriverError::Failed`] when a step failed (nothing is left
    /// behind) or the epoch is older than the one the driver holds.
    async fn provision(&self, spec: &ProvisionSpec) -> Result<(), DriverError>;

    /// Replaces the sandbox's credential file with `credential` atomically (a running
    /// command reads the new one), and makes `environment` (that of the latest ensure)
    /// the environment of the commands started from now on.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for an unknown sandbox, or one whose processes are gone
    /// (what was left is cleaned up); [`DriverError::Failed`] otherwise.
    async fn refresh_credential(
        &self,
        sandbox: &SandboxId,
        credential: &SandboxToken,
        environment: &DriverEnvironment,
    ) -> Result<(), DriverError>;

    /// Runs one command inside with the sandbox's environment, limits and timeout.
    /// A non-zero exit or a timeout is an `Ok` output, not an error. Dropping the future
    /// ends the command.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for an unknown sandbox, or one whose processes are gone
    /// (the driver cleans up what is left; the caller provisions afresh);
    /// [`DriverError::Unavailable`] or [`DriverError::Failed`] when the command could not
    /// be started.
    async fn exec(&self, sandbox: &SandboxId, request: &ExecRequest) -> Result<ExecOutput, DriverError>;

    /// Ends the sandbox's whole process tree (through its cgroup or an equivalent kernel
    /// handle, never remembered pids) and removes what is ephemeral (a durable workspace
    /// stays). Idempotent: `Ok` for a sandbox it does not hold.
    ///
    /// # Errors
    /// [`DriverError::Failed`] when something could not be removed.
    async fn deprovision(&self, sandbox: &SandboxId) -> Result<(), DriverError>;

    /// Ends the sandbox's processes (as [`SandboxDriver::deprovision`] does, through its
    /// cgroup or an equivalent handle) and keeps its workspace and state: a later
    /// [`SandboxDriver::provision`] of the same id with a newer epoch starts it again on
    /// the same workspace. Idempotent.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for a sandbox it does not hold; [`DriverError::Unavailable`]
    /// when this driver cannot suspend (the default); [`DriverError::Failed`] otherwise.
    async fn suspend(&self, sandbox: &SandboxId) -> Result<(), DriverError> {
        Err(DriverError::Unavailable(format!("the {} driver cannot suspend sandbox {sandbox}", self.name())))
    }

    /// The bytes the sandbox's workspace holds now, when the driver can tell cheaply
    /// (for metrics); `None` otherwise (the default).
    async fn workspace_usage(&self, sandbox: &SandboxId) -> Option<u64> {
        let _ = sandbox;
        None
    }

    /// The sandboxes the driver currently holds (for the reconciler).
    ///
    /// # Errors
    /// [`DriverError::Failed`] when they cannot be listed.
    async fn list(&self) -> Result<Vec<SandboxId>, DriverError>;

    /// Whether the driver is usable now, and how it enforces limits.
    async fn health(&self) -> DriverHealth;
}
