//! Background processes in a sandbox: start, list, read one, its output (replayed and
//! followed), its input, signals. For service callers of the org, the user who owns the
//! sandbox's key, and the sandbox's own token ([`domain::Operation::Processes`]), so an
//! agent can start a helper process of its own. The caps come from
//! [`super::StreamLimits::processes`]; the supervisor enforces them per sandbox.
//!
//! Under the org's policy (the gate of [`super::streams`]): every operation resumes a
//! suspended sandbox and counts as the sandbox's activity (a followed output for as long
//! as it is followed). A background process is a command: starting one takes a place in
//! the org's and the sandbox's command quotas, held until the process ends, however it
//! ends (exit, signal, timeout, its sandbox suspended or deprovisioned). A process that
//! merely runs does not keep its sandbox awake: when nothing is done with the sandbox for
//! the idle timeout it is suspended, which ends its processes (and so gives their places
//! back); a sandbox whose processes must run on is kept active by using it.

use std::sync::Arc;
use std::time::Duration;

use domain::{
    Actor, Operation, OrgId, OutputEvent, ProcessCaps, ProcessInfo, ProcessRequest, SandboxId, Signal,
};
use ports::{DriverError, OutputStream, SandboxDriver};
use tracing::debug;

use super::LaneDeps;
use super::commands::CommandPermit;
use super::sandbox::Admission;
use super::streams::{Held, OperationError, driver, gated, gated_with};

/// How long the watch of a background process waits before following it again after the
/// supervisor's connection broke while the process still ran.
const WATCH_RETRY: Duration = Duration::from_secs(1);

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
    let call = |admission: Admission| async move {
        start_held(deps, sandbox_id, request.clone(), deps.streams.processes, admission).await
    };
    gated_with(deps, actor, Operation::Processes, "start_process", org, sandbox_id, true, call).await
}

/// Starts `request` as a background process whose places in the command quotas (the
/// admission's permit) go with the process, until it ends. The start and that hand-off
/// run on a task of their own: a caller that goes away while the supervisor starts the
/// program (it starts whether or not the server still waits) leaves no process running
/// outside the quotas. The sandbox's activity ends with the request.
pub(super) async fn start_held(
    deps: &LaneDeps,
    sandbox_id: &SandboxId,
    request: ProcessRequest,
    caps: ProcessCaps,
    admission: Admission,
) -> Result<ProcessInfo, OperationError> {
    let Admission { permit, _running: running } = admission;
    let (sandboxes, sandbox) = (deps.driver.clone(), sandbox_id.clone());
    let started = tokio::spawn(async move {
        let info = sandboxes.start_process(&sandbox, &request, &caps).await?;
        if let Some(permit) = permit {
            tokio::spawn(hold_until_it_ends(sandboxes, sandbox, info.pid, permit));
        }
        Ok::<_, DriverError>(info)
    });
    let info = match started.await {
        Ok(started) => driver(started)?,
        Err(e) => driver(Err(DriverError::Unavailable(ports::Cause::msg(format!("the start failed: {e}")))))?,
    };
    drop(running);
    Ok(info)
}

/// Holds `permit` (the process's places in the command quotas) until the background
/// process `pid` has ended: it follows the process's output (the supervisor says when it
/// exits) and drops what it reads. It ends, giving the places back, when the process
/// exits or is gone, when its sandbox is (suspended, deprovisioned: its processes ended
/// with it), or when the server stops (the leases it held lapse within
/// [`super::commands::LEASE_TTL_MS`]; a process that outlives its server is then no
/// longer counted, the price of not writing a lease per process). A broken connection to
/// a process that still runs is followed again.
pub(super) async fn hold_until_it_ends(
    driver: Arc<dyn SandboxDriver>,
    sandbox: SandboxId,
    pid: u32,
    permit: CommandPermit,
) {
    loop {
        match driver.process_output(&sandbox, pid, true).await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Ok(Some(OutputEvent::Exit(_)) | None) => {
                        drop(permit);
                        return;
                    }
                    Ok(Some(_)) => {}
                    Err(e) => {
                        debug!(sandbox_id = %sandbox, pid, error = %e, "the watch of a background process broke");
                        break;
                    }
                }
            },
            Err(e) => {
                debug!(sandbox_id = %sandbox, pid, error = %e, "a background process is no longer watched");
                drop(permit);
                return;
            }
        }
        match driver.process(&sandbox, pid).await {
            Ok(info) if info.running => tokio::time::sleep(WATCH_RETRY).await,
            Ok(_)
            | Err(DriverError::NoSuchProcess { .. } | DriverError::NotFound(_) | DriverError::Failed(_)) => {
                drop(permit);
                return;
            }
            Err(_) => tokio::time::sleep(WATCH_RETRY).await,
        }
    }
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
    // The sandbox stays active while the output is read (followed).
    let call = |admission| async move {
        let inner = driver(deps.driver.process_output(sandbox_id, pid, follow).await)?;
        Ok(Box::new(Held { inner, admission: Some(admission) }) as Box<dyn OutputStream>)
    };
    gated_with(deps, actor, Operation::Processes, "process_output", org, sandbox_id, false, call).await
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
