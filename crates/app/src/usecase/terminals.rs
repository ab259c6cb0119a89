//! Terminals in a sandbox: a person's shell (or any command) on a pseudo-terminal of its
//! own, started, listed, attached, ended. Authorised as exec ([`Operation::Exec`], the
//! same rule through the same gate), and kept as background processes are: a terminal is
//! a background process on a terminal ([`super::processes`]), so it survives a detach
//! and a restart of the server, ends with its sandbox, counts against the sandbox's
//! process caps, and holds a place in the command quotas from its start until it ends.
//!
//! Attaching follows its output from the start of its buffer (its last
//! [`TERMINAL_REPLAY_BYTES`]) and opens an input to it; the sandbox counts as active while
//! a client is attached.
//!
//! **Tickets.** A browser cannot set headers on a WebSocket, so a caller may ask for a
//! ticket: a short-lived ([`TICKET_TTL_MS`]), single-use credential bound to the org, the
//! sandbox, the terminal and that caller. The store keeps only its SHA-256, so it is good
//! on every replica and shown by none; taking it deletes it. The caller it names is
//! authorised again, as exec, when it is used.

use domain::terminal::TERMINAL_REPLAY_BYTES;
use domain::{
    Actor, CallerIdentity, IdentityId, Operation, OrgId, ProcessCaps, SandboxId, Signal, TerminalId,
    TerminalInfo, TerminalRequest, Timestamp,
};
use ports::{DriverError, OutputStream, ProcessInput, TicketGrant, TicketStoreError};

use super::LaneDeps;
use super::processes::start_held;
use super::sandbox::Admission;
use super::streams::{Held, OperationError, driver, gated, gated_with};

/// How long a ticket is good for, in milliseconds.
pub const TICKET_TTL_MS: i64 = 60_000;

/// The prefix of every ticket (a caller key or sandbox token never starts so).
pub const TICKET_PREFIX: &str = "tkt_";

/// A terminal's output buffer: its replay, and room for the buffer's own bookkeeping of
/// the chunks it holds, so that at least [`TERMINAL_REPLAY_BYTES`] of output are kept.
const TERMINAL_BUFFER_BYTES: u64 = TERMINAL_REPLAY_BYTES + 4096;

/// An attached terminal: its output from the start of its buffer, then as it comes,
/// then its exit; and its input (none once it has ended).
pub struct Attached {
    /// The terminal.
    pub terminal: TerminalInfo,
    /// Its output; dropping it detaches.
    pub output: Box<dyn OutputStream>,
    /// Its input, while it runs.
    pub input: Option<Box<dyn ProcessInput>>,
}

/// A ticket, once: the ticket itself and when it stops being good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    /// The ticket (shown once, to its caller; never logged).
    pub ticket: String,
    /// When it expires.
    pub expires_at: Timestamp,
}

/// Why a ticket was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// Unknown, used, expired, for another terminal, or its caller was revoked.
    #[error("the ticket is not good here (unknown, used, expired, or for another terminal)")]
    Refused,
    /// The store could not be asked.
    #[error("cannot check the ticket now")]
    Store(#[source] TicketStoreError),
    /// The caller who asked for it could not be checked.
    #[error("cannot check the ticket's caller now")]
    Directory(#[source] ports::DirectoryError),
}

fn caps(deps: &LaneDeps) -> ProcessCaps {
    ProcessCaps { buffer_bytes: TERMINAL_BUFFER_BYTES, ..deps.streams.processes }
}

fn fresh_terminal_id(now: Timestamp) -> Result<TerminalId, OperationError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| OperationError::Invalid(format!("no entropy for a terminal id: {e}")))?;
    Ok(TerminalId::generate(u64::try_from(now.unix_millis()).unwrap_or(0), u128::from_le_bytes(bytes)))
}

/// Starts a terminal; it outlives the request (and the server), not the sandbox.
///
/// # Errors
/// [`OperationError`] as a background process start.
pub async fn create_terminal(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    request: &TerminalRequest,
) -> Result<TerminalInfo, OperationError> {
    let id = fresh_terminal_id(deps.clock.now())?;
    let call = |admission: Admission| async move {
        let process = request.process(id.clone());
        let info = start_held(deps, sandbox_id, process, caps(deps), admission).await?;
        Ok(TerminalInfo { id, process: info })
    };
    gated_with(deps, actor, Operation::Exec, "create_terminal", org, sandbox_id, true, call).await
}

/// The terminal `id` of the sandbox, as the driver reports it.
async fn find(
    deps: &LaneDeps,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<TerminalInfo, OperationError> {
    let processes = driver(deps.driver.list_processes(sandbox_id).await)?;
    processes.into_iter().filter_map(TerminalInfo::of).find(|t| &t.id == id).ok_or_else(|| {
        OperationError::NoSuchTerminal { sandbox_id: sandbox_id.clone(), terminal: id.clone() }
    })
}

/// The sandbox's terminals (running, and ended ones while kept).
///
/// # Errors
/// [`OperationError`].
pub async fn list_terminals(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
) -> Result<Vec<TerminalInfo>, OperationError> {
    let call = async {
        let processes = driver(deps.driver.list_processes(sandbox_id).await)?;
        Ok(processes.into_iter().filter_map(TerminalInfo::of).collect())
    };
    gated(deps, actor, Operation::Exec, "list_terminals", org, sandbox_id, call).await
}

/// One terminal.
///
/// # Errors
/// [`OperationError`]; [`OperationError::NoSuchTerminal`].
pub async fn get_terminal(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<TerminalInfo, OperationError> {
    gated(deps, actor, Operation::Exec, "get_terminal", org, sandbox_id, find(deps, sandbox_id, id)).await
}

/// Ends a terminal: its process group is killed (a terminal already ended stays so).
///
/// # Errors
/// [`OperationError`]; [`OperationError::NoSuchTerminal`].
pub async fn delete_terminal(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<(), OperationError> {
    let call = async {
        let terminal = find(deps, sandbox_id, id).await?;
        if !terminal.process.running {
            return Ok(());
        }
        match deps.driver.signal_process(sandbox_id, terminal.process.pid, Signal::Kill).await {
            Ok(()) | Err(DriverError::Conflict(_)) => Ok(()),
            Err(e) => driver(Err(e)),
        }
    };
    gated(deps, actor, Operation::Exec, "delete_terminal", org, sandbox_id, call).await
}

/// Attaches to a terminal: its output (replayed from the start of its buffer, then as it
/// comes, then its exit) and its input. The sandbox counts as active until the output
/// is dropped or ends.
///
/// # Errors
/// [`OperationError`]; [`OperationError::NoSuchTerminal`].
pub async fn attach_terminal(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<Attached, OperationError> {
    let call = |admission| async move {
        let terminal = find(deps, sandbox_id, id).await?;
        let pid = terminal.process.pid;
        let inner = driver(deps.driver.process_output(sandbox_id, pid, true).await)?;
        let input = if terminal.process.running {
            match deps.driver.process_input(sandbox_id, pid).await {
                Ok(input) => Some(input),
                // It ended in between: its output says how.
                Err(DriverError::Conflict(_) | DriverError::NoSuchProcess { .. }) => None,
                Err(e) => return driver(Err(e)),
            }
        } else {
            None
        };
        let output = Box::new(Held { inner, admission: Some(admission) }) as Box<dyn OutputStream>;
        Ok(Attached { terminal, output, input })
    };
    gated_with(deps, actor, Operation::Exec, "attach_terminal", org, sandbox_id, false, call).await
}

/// Issues a ticket for `caller` to attach terminal `id` once, within [`TICKET_TTL_MS`].
///
/// # Errors
/// [`OperationError`] as for attaching (the caller must be one who may attach);
/// [`OperationError::Tickets`] when the store fails.
pub async fn issue_ticket(
    deps: &LaneDeps,
    caller: &CallerIdentity,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<Ticket, OperationError> {
    let actor = Actor::Caller(caller.clone());
    let call = async {
        find(deps, sandbox_id, id).await?;
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes)
            .map_err(|e| OperationError::Invalid(format!("no entropy for a ticket: {e}")))?;
        let ticket = format!("{TICKET_PREFIX}{}", hex(&bytes));
        let now = deps.clock.now();
        let expires_at = now.plus_millis(TICKET_TTL_MS);
        let grant = TicketGrant {
            org: org.clone(),
            sandbox: sandbox_id.clone(),
            terminal: id.clone(),
            identity: caller.identity_id().clone(),
            class: caller.class(),
            expires_at,
        };
        deps.tickets
            .insert(domain::terminal::ticket_digest(&ticket), &grant, now)
            .await
            .map_err(OperationError::Tickets)?;
        Ok(Ticket { ticket, expires_at })
    };
    gated(deps, &actor, Operation::Exec, "terminal_ticket", org, sandbox_id, call).await
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// Takes `ticket` for terminal `id` of `sandbox_id` in `org`: the caller it was issued to,
/// if it is good here (whatever the answer, it is used up). The caller is then authorised
/// as any other, as exec.
///
/// # Errors
/// [`TicketError`].
pub async fn redeem_ticket(
    deps: &LaneDeps,
    ticket: &str,
    org: &OrgId,
    sandbox_id: &SandboxId,
    id: &TerminalId,
) -> Result<Actor, TicketError> {
    let now = deps.clock.now();
    let grant = deps
        .tickets
        .take(domain::terminal::ticket_digest(ticket), now)
        .await
        .map_err(TicketError::Store)?
        .ok_or(TicketError::Refused)?;
    if &grant.org != org || &grant.sandbox != sandbox_id || &grant.terminal != id {
        return Err(TicketError::Refused);
    }
    let identity: IdentityId = grant.identity;
    if deps.directory.is_revoked(&identity).await.map_err(TicketError::Directory)? {
        return Err(TicketError::Refused);
    }
    let caller = CallerIdentity::from_wire(identity, grant.class, vec![grant.org], None)
        .map_err(|_| TicketError::Refused)?;
    Ok(Actor::Caller(caller))
}

#[cfg(test)]
mod tests;
