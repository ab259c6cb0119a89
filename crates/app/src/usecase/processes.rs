//! Background processes in a sandbox: start, list, read one, its output (replayed and
//! followed), its input, signals. For service callers of the org, the user who owns the
//! sandbox's key, and the sandbox's own token ([`domain::Operation::Processes`]), so an
//! agent can start a helper process of its own. The caps come from
//! [`super::StreamLimits::processes`]; the supervisor enforces them per sandbox.

use domain::{Actor, Operation, OrgId, ProcessInfo, ProcessRequest, SandboxId, Signal};
use ports::OutputStream;

use super::LaneDeps;
use super::streams::{OperationError, driver, gated};

/// Starts a background process; it outlives the request (and the server), not the
/// sandbox.
///
/// # Errors
/// [`OperationError`]; [`ports::DriverError::ResourceExhausted`] inside when the sandbox's
/// caps leave no room, [`ports::DriverError::Invalid`] when the program cannot start.
pub async fn start_process(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    request: &ProcessRequest,
) -> Result<ProcessInfo, OperationError> {
    let call =
        async { driver(deps.driver.start_process(sandbox_id, request, &deps.streams.processes).await) };
    gated(deps, actor, Operation::Processes, "start_process", org, sandbox_id, call).await
}

/// The sandbox's background processes (running, and ended ones while kept).
///
/// # Errors
/// [`OperationError`].
pub async fn list_processes(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
) -> Result<Vec<ProcessInfo>, OperationError> {
    let call = async { driver(deps.driver.list_processes(sandbox_id).await) };
    gated(deps, actor, Operation::Processes, "list_processes", org, sandbox_id, call).await
}

/// One background process.
///
/// # Errors
/// [`OperationError`]; [`ports::DriverError::NoSuchProcess`] inside.
pub async fn get_process(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    pid: u32,
) -> Result<ProcessInfo, OperationError> {
    let call = async { driver(deps.driver.process(sandbox_id, pid).await) };
    gated(deps, actor, Operation::Processes, "get_process", org, sandbox_id, call).await
}

/// A background process's output from the start of its buffer; with `follow`, then as it
/// arrives until the process ends. Dropping the stream stops reading, never the process.
///
/// # Errors
/// [`OperationError`].
pub async fn process_output(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    pid: u32,
    follow: bool,
) -> Result<Box<dyn OutputStream>, OperationError> {
    let call = async { driver(deps.driver.process_output(sandbox_id, pid, follow).await) };
    gated(deps, actor, Operation::Processes, "process_output", org, sandbox_id, call).await
}

/// Writes `bytes` to a running background process's input (then closes it, when
/// `close`).
///
/// # Errors
/// [`OperationError`]; [`ports::DriverError::Conflict`] inside when it ended or its input
/// is closed.
pub async fn write_process_stdin(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    pid: u32,
    bytes: &[u8],
    close: bool,
) -> Result<(), OperationError> {
    let call = async { driver(deps.driver.write_stdin(sandbox_id, pid, bytes, close).await) };
    gated(deps, actor, Operation::Processes, "process_stdin", org, sandbox_id, call).await
}

/// Sends `signal` to a running background process (its whole process group).
///
/// # Errors
/// [`OperationError`]; [`ports::DriverError::Conflict`] inside when it has ended.
pub async fn signal_process(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    pid: u32,
    signal: Signal,
) -> Result<(), OperationError> {
    let call = async { driver(deps.driver.signal_process(sandbox_id, pid, signal).await) };
    gated(deps, actor, Operation::Processes, "signal_process", org, sandbox_id, call).await
}
