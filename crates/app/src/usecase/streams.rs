//! What an agent does inside its sandbox, shared by the operation use cases
//! ([`super::processes`], [`super::files`], and the streaming exec here): the caps they
//! hold a sandbox to, their error, and the one gate every operation passes (authorised
//! by [`super::access::authorize_sandbox`], and the sandbox ready).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use domain::{Actor, ExecRequest, Operation, OrgId, ProcessCaps, SandboxId, SandboxState};
use ports::{ByteSource, ByteStream, DriverError, OutputStream, SourceError};
use tracing::{Instrument, info_span};

use super::access::{AccessError, authorize_sandbox};
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
}

impl Default for StreamLimits {
    /// 512 MiB files and archives; the default [`ProcessCaps`].
    fn default() -> Self {
        Self { max_file_bytes: 512 << 20, max_archive_bytes: 512 << 20, processes: ProcessCaps::default() }
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
}

impl OperationError {
    fn of(e: DriverError) -> Self {
        match e {
            DriverError::NotFound(id) => Self::Gone(id),
            other => Self::Driver(other),
        }
    }
}

/// The gate of every operation: the actor may do `operation` in the sandbox, and the
/// sandbox is ready.
pub(super) async fn ready(
    deps: &LaneDeps,
    actor: &Actor,
    operation: Operation,
    org: &OrgId,
    sandbox_id: &SandboxId,
) -> Result<(), OperationError> {
    let record = authorize_sandbox(deps, actor, operation, org, sandbox_id).await?;
    if record.state != SandboxState::Ready {
        return Err(OperationError::NotReady { sandbox_id: sandbox_id.clone(), state: record.state });
    }
    Ok(())
}

/// Runs the driver call `call` behind the gate, in a span naming the operation.
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
    let span = info_span!("sandbox_operation", operation = what, sandbox_id = %sandbox_id, org = %org, outcome = tracing::field::Empty);
    async {
        ready(deps, actor, operation, org, sandbox_id).await?;
        let result = call.await;
        let outcome = match &result {
            Ok(_) => "ok",
            Err(OperationError::Driver(_) | OperationError::Gone(_)) => "driver_error",
            Err(_) => "refused",
        };
        tracing::Span::current().record("outcome", outcome);
        result
    }
    .instrument(span)
    .await
}

pub(super) fn driver<T>(result: Result<T, DriverError>) -> Result<T, OperationError> {
    result.map_err(OperationError::of)
}

/// Runs `request` inside the sandbox and hands its output over as it arrives, for the
/// same actors, with the same timeout and output cap, as [`super::exec_in_sandbox`]. The
/// command belongs to the stream: dropping it (a caller that goes away) ends the command.
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
    let span = info_span!("exec_stream", sandbox_id = %sandbox_id, org = %org);
    async {
        let record = authorize_sandbox(deps, actor, Operation::Exec, org, sandbox_id).await?;
        if record.state != SandboxState::Ready {
            return Err(ExecError::NotReady { sandbox_id: sandbox_id.clone(), state: record.state });
        }
        deps.driver.exec_stream(sandbox_id, request).await.map_err(|e| match e {
            DriverError::NotFound(id) => ExecError::Gone(id),
            other => ExecError::Driver(other),
        })
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
