//! What an agent does inside its sandbox, shared by the operation use cases
//! ([`super::processes`], [`super::files`], and the streaming exec here): the caps they
//! hold a sandbox to, their error, and the one gate every operation passes
//! ([`super::sandbox::admit`], as exec: authorised, a suspended sandbox resumed, the
//! sandbox's activity noted and held while the operation runs).
//!
//! The org's command quotas (`max_commands`, `max_commands_per_sandbox`) count what runs a
//! program: an exec, buffered or streamed (its place held until the stream ends or is
//! dropped), and a background process (its place held until the process ends: see
//! [`super::processes::start_process`]). File and archive operations and the reads,
//! input and signals of a process run no program: they pass the gate without a place
//! (file operations take one of their sandbox's file places instead: [`super::places`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use domain::{Actor, ExecRequest, Operation, OrgId, OutputEvent, ProcessCaps, SandboxId, SandboxState};
use ports::{ByteSource, ByteStream, DriverError, OutputStream, RegistryError, SourceError};
use tracing::{Instrument, info_span};

use super::access::AccessError;
use super::commands::CommandRefusal;
use super::failure::ProvisionFailure;
use super::policy::PolicyReadError;
use super::sandbox::{Admission, admit};
use super::{ExecError, LaneDeps};

/// The caps of the streams, files and processes operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// The largest file written or read through the files API, in bytes.
    pub max_file_bytes: u64,
    /// The largest archive sent into or out of a sandbox, in bytes.
    pub max_archive_bytes: u64,
    /// The caps of a sandbox's background processes.
    pub processes: ProcessCaps,
    /// Most file operations (reads, listings, writes, deletes, archives) of one sandbox
    /// under way at once on this replica (see [`super::SandboxPlaces`]).
    pub max_file_ops_per_sandbox: u32,
    /// Most connections to one sandbox's ports through the preview host (plain requests
    /// being answered and upgraded connections) open at once on this replica (see
    /// [`super::SandboxPlaces`]).
    pub max_preview_connections_per_sandbox: u32,
}

impl Default for StreamLimits {
    /// 512 MiB files and archives; the default [`ProcessCaps`]; 4 file operations and 64
    /// preview connections at once.
    fn default() -> Self {
        Self {
            max_file_bytes: 512 << 20,
            max_archive_bytes: 512 << 20,
            processes: ProcessCaps::default(),
            max_file_ops_per_sandbox: 4,
            max_preview_connections_per_sandbox: 64,
        }
    }
}

/// Why an operation inside a sandbox (files, processes) did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperationError {
    /// The actor may not act here, or the sandbox does not exist for it.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// The sandbox is not ready (provisioning, failed or deprovisioned).
    #[error("sandbox {sandbox_id} is {state}, not ready")]
    NotReady {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Its state.
        state: SandboxState,
    },
    /// The driver no longer holds the sandbox; the next ensure provisions it again.
    #[error("sandbox {0} is not present on the driver; ensure it again")]
    Gone(SandboxId),
    /// The request cannot be done as asked (an archive with no bytes at all).
    #[error("{0}")]
    Invalid(String),
    /// More bytes than the cap allows; nothing of them was kept.
    #[error("{what} is over the cap of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: String,
        /// The cap.
        limit: u64,
    },
    /// The driver refused or failed (its error says which: a missing path or process, a
    /// path that leads out, a conflict, a cap of the sandbox, …).
    #[error("the sandbox could not do it")]
    Driver(#[source] DriverError),
    /// A command quota (the org's or the sandbox's) is used up (starting a background
    /// process).
    #[error(transparent)]
    Busy(CommandRefusal),
    /// The sandbox has as many file operations under way on this replica as it may
    /// (`streams.max_file_ops_per_sandbox`).
    #[error(
        "sandbox {sandbox_id} already has {limit} file operations under way, its cap \
         (streams.max_file_ops_per_sandbox); retry once one has ended"
    )]
    FilesBusy {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The cap.
        limit: u32,
    },
    /// The sandbox was suspended and resuming it would take its org past its quota of
    /// running sandboxes.
    #[error("sandbox {sandbox_id} is suspended and cannot be resumed now")]
    OverQuota {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The refusal (its message has the provisioning-failed prefix).
        #[source]
        failure: Box<ProvisionFailure>,
    },
    /// The sandbox was suspended and could not be resumed.
    #[error("sandbox {sandbox_id} was suspended and could not be resumed")]
    Resume {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// Why.
        #[source]
        failure: Box<ProvisionFailure>,
    },
    /// The org's policy could not be read, so its quotas could not be applied.
    #[error(transparent)]
    Policy(PolicyReadError),
    /// The sandbox's activity could not be recorded (it could be suspended under the
    /// operation), so the operation did not start.
    #[error("cannot record the sandbox's activity now")]
    Activity(#[source] RegistryError),
    /// The sandbox has no such terminal.
    #[error("sandbox {sandbox_id} has no terminal {terminal}")]
    NoSuchTerminal {
        /// The sandbox.
        sandbox_id: SandboxId,
        /// The terminal named.
        terminal: domain::TerminalId,
    },
    /// The terminal tickets could not be stored.
    #[error("cannot store the terminal ticket now")]
    Tickets(#[source] ports::TicketStoreError),
}

impl From<ExecError> for OperationError {
    fn from(e: ExecError) -> Self {
        match e {
            ExecError::Access(e) => Self::Access(e),
            ExecError::NotReady { sandbox_id, state } => Self::NotReady { sandbox_id, state },
            ExecError::Gone(id) => Self::Gone(id),
            ExecError::Driver(e) => Self::Driver(e),
            ExecError::Busy(refusal) => Self::Busy(refusal),
            ExecError::OverQuota { sandbox_id, failure } => {
                Self::OverQuota { sandbox_id, failure: Box::new(failure) }
            }
            ExecError::Resume { sandbox_id, failure } => {
                Self::Resume { sandbox_id, failure: Box::new(failure) }
            }
            ExecError::Policy(e) => Self::Policy(e),
            ExecError::Activity(e) => Self::Activity(e),
        }
    }
}

impl OperationError {
    /// The quota that refused, when one did (for metrics): `max_commands`,
    /// `max_commands_per_sandbox` or `max_sandboxes`.
    #[must_use]
    pub fn quota(&self) -> Option<&'static str> {
        match self {
            Self::Busy(CommandRefusal::Org { .. }) => Some("max_commands"),
            Self::Busy(CommandRefusal::Sandbox { .. }) => Some("max_commands_per_sandbox"),
            Self::OverQuota { .. } => Some("max_sandboxes"),
            _ => None,
        }
    }

    fn of(e: DriverError) -> Self {
        match e {
            DriverError::NotFound(id) => Self::Gone(id),
            other => Self::Driver(other),
        }
    }
}

/// Runs the driver call `call` behind the gate ([`admit`]), in a span naming the
/// operation; the sandbox counts as active until the call is done.
pub(super) async fn gated<T, F>(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    what: &'static str,
    org: &OrgId,
    sandbox_id: &SandboxId,
    call: F,
) -> Result<T, OperationError>
where
    F: Future<Output = Result<T, OperationError>>,
{
    gated_with(deps, actor, operation, what, org, sandbox_id, false, |admission| async move {
        let result = call.await;
        drop(admission);
        result
    })
    .await
}

/// As [`gated`], handing the [`Admission`] to `call` (which holds it as long as its
/// work goes on: a stream, a background process); a `command` takes a place in the
/// command quotas.
#[allow(clippy::too_many_arguments)]
pub(super) async fn gated_with<T, C, F>(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    what: &'static str,
    org: &OrgId,
    sandbox_id: &SandboxId,
    command: bool,
    call: C,
) -> Result<T, OperationError>
where
    C: FnOnce(Admission) -> F,
    F: Future<Output = Result<T, OperationError>>,
{
    let span = info_span!(
        "sandbox_operation",
        otel.name = what,
        operation = what,
        sandbox_id = %sandbox_id,
        org = %org,
        caller_class = super::actor_class(actor),
        outcome = tracing::field::Empty,
    );
    async {
        let result = match admit(deps, actor, operation, org, sandbox_id, command).await {
            Ok(admission) => call(admission).await,
            Err(e) => Err(e.into()),
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(
                OperationError::Driver(_)
                | OperationError::Gone(_)
                | OperationError::Resume { .. }
                | OperationError::Policy(_)
                | OperationError::Activity(_)
                | OperationError::Tickets(_)
                | OperationError::Busy(CommandRefusal::Store(_)),
            ) => "driver_error",
            Err(_) => "refused",
        };
        tracing::Span::current().record("outcome", outcome);
        result
    }
    .instrument(span)
    .await
}

/// A stream that holds what its work needs (an [`Admission`]: the command's places in
/// the quotas, the sandbox's activity) until it ends or is dropped.
pub(super) struct Held<S: ?Sized> {
    pub(super) inner: Box<S>,
    pub(super) admission: Option<Admission>,
}

#[async_trait]
impl OutputStream for Held<dyn OutputStream> {
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError> {
        let next = self.inner.next().await;
        if matches!(next, Ok(None) | Err(_)) {
            self.admission = None;
        }
        next
    }
}

#[async_trait]
impl ByteStream for Held<dyn ByteStream> {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        let next = self.inner.next().await;
        if matches!(next, Ok(None) | Err(_)) {
            self.admission = None;
        }
        next
    }
}

pub(super) fn driver<T>(result: Result<T, DriverError>) -> Result<T, OperationError> {
    result.map_err(OperationError::of)
}

/// Runs `request` inside the sandbox and hands its output over as it arrives, for the
/// same actors, with the same timeout and output cap, and under the same policy as
/// [`super::exec_in_sandbox`] (a suspended sandbox resumed, a place in the command quotas
/// and the sandbox's activity held until the stream ends or is dropped). The command
/// belongs to the stream: dropping it (a caller that goes away) ends the command.
///
/// # Errors
/// [`ExecError`].
pub async fn exec_stream_in_sandbox(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    request: &ExecRequest,
) -> Result<Box<dyn OutputStream>, ExecError> {
    let span = info_span!(
        "exec_stream",
        sandbox_id = %sandbox_id,
        org = %org,
        caller_class = super::actor_class(actor),
    );
    async {
        let admission = admit(deps, actor, Operation::Exec, org, sandbox_id, true).await?;
        let inner = deps.driver.exec_stream(sandbox_id, request).await.map_err(|e| match e {
            DriverError::NotFound(id) => ExecError::Gone(id),
            other => ExecError::Driver(other),
        })?;
        let held: Box<dyn OutputStream> = Box::new(Held { inner, admission: Some(admission) });
        Ok(held)
    }
    .instrument(span)
    .await
}

/// An upload held to a cap: past `limit` bytes it fails (and says so in `over`), so the
/// driver abandons the upload and keeps nothing.
pub(super) struct Capped {
    inner: Box<dyn ByteSource>,
    left: u64,
    limit: u64,
    over: Arc<AtomicBool>,
}

impl Capped {
    /// The capped source, whether it passed the cap, and how many bytes it let through
    /// (`limit - left`, read once the driver is done).
    pub(super) fn new(inner: Box<dyn ByteSource>, limit: u64) -> (Self, Arc<AtomicBool>) {
        let over = Arc::new(AtomicBool::new(false));
        (Self { inner, left: limit, limit, over: over.clone() }, over)
    }
}

/// A source that says whether it gave any byte at all.
pub(super) struct Counted {
    pub(super) inner: Box<dyn ByteSource>,
    pub(super) any: Arc<AtomicBool>,
}

#[async_trait]
impl ByteSource for Counted {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        let next = self.inner.next().await?;
        if next.as_ref().is_some_and(|b| !b.is_empty()) {
            self.any.store(true, Ordering::SeqCst);
        }
        Ok(next)
    }
}

#[async_trait]
impl ByteSource for Capped {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError> {
        match self.inner.next().await? {
            Some(bytes) if bytes.len() as u64 > self.left => {
                self.over.store(true, Ordering::SeqCst);
                Err(SourceError(format!("more than the cap of {} bytes", self.limit)))
            }
            Some(bytes) => {
                self.left -= bytes.len() as u64;
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }
}

/// A download held to a cap: past `limit` bytes it fails with
/// [`DriverError::TooLarge`] (the consumer MUST NOT present what came as whole).
pub(super) struct CappedStream {
    pub(super) inner: Box<dyn ByteStream>,
    pub(super) left: u64,
    pub(super) limit: u64,
}

#[async_trait]
impl ByteStream for CappedStream {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        match self.inner.next().await? {
            Some(bytes) if bytes.len() as u64 > self.left => {
                Err(DriverError::TooLarge(format!("the archive is over the cap of {} bytes", self.limit)))
            }
            Some(bytes) => {
                self.left -= bytes.len() as u64;
                Ok(Some(bytes))
            }
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests;
