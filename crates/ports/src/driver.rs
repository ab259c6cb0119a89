//! The sandbox driver: provisions, runs commands in, and removes real sandboxes; and
//! what an agent does inside one: streaming exec, background processes, files and
//! archives.
//!
//! Streams are boxed trait objects with an async `next()` ([`OutputStream`],
//! [`ByteStream`] out of a sandbox, [`ByteSource`] into one), so this crate needs no
//! runtime: whoever holds a stream pulls from it at its own pace (a slow reader slows the
//! sandbox's side, nothing is buffered without bound), and dropping it ends the operation.

use async_trait::async_trait;

use crate::Cause;
use domain::{
    DirEntry, DriverEnvironment, Durability, ExecOutput, ExecRequest, OrgId, OutputEvent, ProcessCaps,
    ProcessInfo, ProcessRequest, SandboxId, SandboxKey, SandboxPath, SandboxToken, Signal, SnapshotId,
    TerminalInput,
};

/// A snapshot's files as the driver keeps them: by org and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SnapshotRef {
    /// The org the snapshot belongs to.
    pub org: OrgId,
    /// The snapshot.
    pub id: SnapshotId,
}

/// How many bytes a snapshot may hold: what the org's snapshot quota leaves, and the
/// sandbox's workspace quota (a copy whose size the driver learns only while it makes it,
/// an archive streamed from the sandbox, is bounded by both).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SnapshotBudget {
    /// The bytes the org's snapshot quota leaves (`None`: the org has no byte quota).
    pub quota_left: Option<u64>,
    /// The sandbox's workspace quota (`None`: the driver's own default).
    pub workspace_bytes: Option<u64>,
}

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
    /// A fork: the workspace, which must not exist yet, starts as this snapshot's files
    /// (owned by the new workspace's user). Ignored when the sandbox already runs (the
    /// same attempt again) or its workspace exists (a resume).
    pub from_snapshot: Option<SnapshotRef>,
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
    /// cause says what is missing and how to install it, over the adapter's own error
    /// when there is one.
    #[error("driver unavailable: {0}")]
    Unavailable(#[source] Cause),
    /// The driver holds no sandbox with this id.
    #[error("sandbox {0} is not provisioned on this driver")]
    NotFound(SandboxId),
    /// The readiness probe or another step failed: the cause says which, over the
    /// adapter's own error (the kernel's, the engine's, the API server's) when there is one.
    #[error("{0}")]
    Failed(#[source] Cause),
    /// The sandbox has no background process with this pid.
    #[error("sandbox {sandbox} has no background process {pid}")]
    NoSuchProcess {
        /// The sandbox.
        sandbox: SandboxId,
        /// The pid asked for.
        pid: u32,
    },
    /// The path names nothing.
    #[error("{0}")]
    NoSuchPath(String),
    /// The request cannot be done as asked: a path that leads out of its root (through a
    /// symlink or a mount), a name the kernel refuses, a malformed archive or one with an
    /// entry that leads out. The message says which.
    #[error("{0}")]
    Invalid(String),
    /// The target is not in a state that allows this: a process that has ended, a
    /// directory that is not empty, a file where a directory is needed (or the reverse),
    /// a root, a program that cannot be executed, a mode that forbids the sandbox's user.
    #[error("{0}")]
    Conflict(String),
    /// A size cap was passed (a file or archive larger than the sandbox accepts).
    #[error("{0}")]
    TooLarge(String),
    /// A per-sandbox cap is used up (processes, buffered output, disk space), or a
    /// snapshot would pass what the org's snapshot quota leaves.
    #[error("{0}")]
    ResourceExhausted(String),
    /// The sandbox's side does not serve this operation (a supervisor older than the
    /// server); a sandbox provisioned afresh does.
    #[error("{0}")]
    Unsupported(String),
    /// Bytes sent into the sandbox ([`ByteSource`]) failed, so the operation was
    /// abandoned and nothing of it kept.
    #[error("the upload failed: {0}")]
    Source(#[source] SourceError),
}

/// Why a [`ByteSource`] could not give its next bytes (the caller went away, or its
/// bytes passed a cap). The operation that reads it is abandoned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(pub String);

/// A command's or a background process's output as it arrives.
#[async_trait]
pub trait OutputStream: Send {
    /// The next event: `Stdout`/`Stderr` bytes in the order the sandbox saw them, then
    /// exactly one [`OutputEvent::Exit`], then `Ok(None)`. A stream that ends without an
    /// exit (`Ok(None)` first) is a process still running whose output was read without
    /// following. An implementation MUST return each event as soon as it has it (no
    /// batching across a wait), MUST NOT hold more than one frame of output in memory,
    /// and MUST end what it reads from when dropped (for an exec, the command).
    ///
    /// # Errors
    /// [`DriverError`] when the sandbox's side breaks off; the stream ends there.
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError>;
}

/// An attached client's input to a background process (a terminal's keystrokes and
/// resizes), kept open across many sends.
#[async_trait]
pub trait ProcessInput: Send {
    /// Sends `input` (written, or the terminal resized) before returning; input is sent
    /// in the order given. An implementation MUST NOT buffer more than one input.
    ///
    /// # Errors
    /// [`DriverError`] when the sandbox's side breaks off (the process ended, the
    /// supervisor went away); the input is closed.
    async fn send(&mut self, input: TerminalInput) -> Result<(), DriverError>;
}

/// Bytes coming out of a sandbox (a file's contents, an archive).
#[async_trait]
pub trait ByteStream: Send {
    /// The next chunk (never empty), `Ok(None)` at the end. Dropping the stream
    /// abandons the read.
    ///
    /// # Errors
    /// [`DriverError`] when the sandbox's side breaks off (the bytes so far are not the
    /// whole): the consumer MUST NOT present them as complete.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, DriverError>;
}

/// A directory's entries coming out of a sandbox, some at a time.
#[async_trait]
pub trait EntryStream: Send {
    /// The next entries (never an empty batch), in name order across batches; `Ok(None)`
    /// at the end. An implementation MUST NOT hold more than one batch (one frame of the
    /// sandbox's answer) in memory, and MUST end the listing when dropped.
    ///
    /// # Errors
    /// [`DriverError`] when the sandbox's side breaks off (the entries so far are not the
    /// whole listing): the consumer MUST NOT present them as complete.
    async fn next(&mut self) -> Result<Option<Vec<DirEntry>>, DriverError>;
}

/// Bytes going into a sandbox (a file's new contents, an archive), pulled by the driver.
#[async_trait]
pub trait ByteSource: Send {
    /// The next chunk, `Ok(None)` at the end.
    ///
    /// # Errors
    /// [`SourceError`] when the bytes cannot be had; the driver abandons the operation.
    async fn next(&mut self) -> Result<Option<Vec<u8>>, SourceError>;
}

/// What a read of a path found.
pub enum ReadOutcome {
    /// A regular file: its size when opened, and exactly that many bytes.
    File {
        /// Its size in bytes.
        size: u64,
        /// Its contents.
        contents: Box<dyn ByteStream>,
    },
    /// A directory: its entries (not `.` and `..`), sorted by name, streamed as they come
    /// (a listing of many entries is never held whole).
    Directory(Box<dyn EntryStream>),
}

impl std::fmt::Debug for ReadOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File { size, .. } => f.debug_struct("File").field("size", size).finish_non_exhaustive(),
            Self::Directory(_) => f.debug_tuple("Directory").finish_non_exhaustive(),
        }
    }
}

/// What an archive unpacked into a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unpacked {
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
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

    /// Serves the egress proxy of `sandbox` until the sandbox ends (or its supervisor
    /// goes away): each connection a process inside makes to the proxy's loopback port is
    /// taken, parsed, put to `gate`, and connected only as the gate's grant says. Returns
    /// `Ok` when the sandbox ended; dropping the future stops serving (connections
    /// already open run on to their end).
    ///
    /// # Errors
    /// [`DriverError::NotFound`]; [`DriverError::Unsupported`] when the driver (the
    /// default) or the sandbox's supervisor serves no egress.
    async fn serve_egress(
        &self,
        sandbox: &SandboxId,
        gate: std::sync::Arc<dyn crate::egress::EgressGate>,
    ) -> Result<(), DriverError> {
        let _ = gate;
        Err(DriverError::Unsupported(format!(
            "the {} driver serves no egress proxy for {sandbox}",
            self.name()
        )))
    }

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
        Err(DriverError::Unavailable(Cause::msg(format!(
            "the {} driver cannot suspend sandbox {sandbox}",
            self.name()
        ))))
    }

    /// Takes a snapshot of the sandbox's workspace into `target`: its files at one instant
    /// (the sandbox's processes are frozen while it is taken, then go on), never its
    /// credential or anything else of the sandbox's own. Cost in proportion to the bytes
    /// the workspace uses (shared blocks where the filesystem can share them), never to
    /// its quota. Returns the bytes the snapshot holds. Nothing is left of a snapshot that
    /// failed. A copy that would hold more than `budget.quota_left` is refused (before it
    /// is made where the driver can tell its size, else as soon as it passes), and so is
    /// an archive streamed from the sandbox that passes what its workspace can hold.
    ///
    /// # Errors
    /// [`DriverError::NotFound`]; [`DriverError::ResourceExhausted`] past what the quota
    /// leaves; [`DriverError::TooLarge`] past what the workspace can hold;
    /// [`DriverError::Unsupported`] when the driver keeps no snapshots (the default);
    /// [`DriverError::Failed`] otherwise.
    async fn snapshot(
        &self,
        sandbox: &SandboxId,
        target: &SnapshotRef,
        budget: SnapshotBudget,
    ) -> Result<u64, DriverError> {
        let _ = (target, budget);
        Err(DriverError::Unsupported(format!("the {} driver takes no snapshots (of {sandbox})", self.name())))
    }

    /// Deletes a snapshot's files. Idempotent: `Ok` for one it does not hold. Forks made
    /// from it keep their files.
    ///
    /// # Errors
    /// [`DriverError::Failed`] when something could not be removed.
    async fn delete_snapshot(&self, snapshot: &SnapshotRef) -> Result<(), DriverError> {
        let _ = snapshot;
        Ok(())
    }

    /// Replaces the workspace of a suspended sandbox with `snapshot`'s files (owned by
    /// the sandbox's user); the next provision with a newer epoch starts it on them.
    ///
    /// # Errors
    /// [`DriverError::NotFound`]; [`DriverError::Conflict`] when the sandbox is not
    /// suspended; [`DriverError::NoSuchPath`] when the snapshot's files are gone;
    /// [`DriverError::Unsupported`] (the default); [`DriverError::Failed`].
    async fn restore(&self, sandbox: &SandboxId, snapshot: &SnapshotRef) -> Result<(), DriverError> {
        let _ = snapshot;
        Err(DriverError::Unsupported(format!(
            "the {} driver cannot restore {sandbox} from a snapshot",
            self.name()
        )))
    }

    /// The bytes the sandbox's workspace holds now, when the driver can tell cheaply
    /// (for metrics); `None` otherwise (the default).
    async fn workspace_usage(&self, sandbox: &SandboxId) -> Option<u64> {
        let _ = sandbox;
        None
    }

    /// The server stops: ends what the driver runs for no sandbox (the bubblewrap driver's
    /// sandboxes started ahead). Sandboxes stay: they outlive the server. Nothing by
    /// default.
    async fn stand_down(&self) {}

    /// The sandboxes the driver currently holds (for the reconciler).
    ///
    /// # Errors
    /// [`DriverError::Failed`] when they cannot be listed.
    async fn list(&self) -> Result<Vec<SandboxId>, DriverError>;

    /// Whether the driver is usable now, and how it enforces limits.
    async fn health(&self) -> DriverHealth;

    /// Runs one command as [`SandboxDriver::exec`] does (same environment, limits,
    /// timeout and output cap) but hands its output over as it arrives. The stream ends
    /// with the exit. Dropping the stream ends the command.
    ///
    /// # Errors
    /// As [`SandboxDriver::exec`]; a program that cannot start is an `Ok` stream whose
    /// only output is the reason on standard error and exit code 127, as for exec.
    async fn exec_stream(
        &self,
        sandbox: &SandboxId,
        request: &ExecRequest,
    ) -> Result<Box<dyn OutputStream>, DriverError>;

    /// Starts a background process with the sandbox's environment and limits. It MUST
    /// outlive the request (and a restart of the server) and MUST end with the sandbox.
    /// Its output is kept in a buffer of `caps.buffer_bytes` (the oldest dropped beyond),
    /// and its standard input stays open for [`SandboxDriver::write_stdin`]. A request
    /// with a terminal ([`ProcessRequest::terminal`]) starts it on a new pseudo-terminal of
    /// that size, as the leader of a session whose controlling terminal it is, with
    /// `TERM=xterm-256color`: its one output stream (standard output) is the terminal's,
    /// and [`ProcessInfo::terminal`] names it.
    ///
    /// # Errors
    /// [`DriverError::ResourceExhausted`] when `caps` leave no room (every kept process
    /// runs); [`DriverError::NoSuchPath`] when the program is not found,
    /// [`DriverError::Conflict`] when it cannot be executed;
    /// [`DriverError::Unsupported`] for a terminal the sandbox's supervisor cannot make (it
    /// predates terminals); as [`SandboxDriver::exec`] otherwise.
    async fn start_process(
        &self,
        sandbox: &SandboxId,
        request: &ProcessRequest,
        caps: &ProcessCaps,
    ) -> Result<ProcessInfo, DriverError>;

    /// The sandbox's background processes, running and ended (while kept), by pid.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for an unknown sandbox; [`DriverError::Failed`].
    async fn list_processes(&self, sandbox: &SandboxId) -> Result<Vec<ProcessInfo>, DriverError>;

    /// One background process.
    ///
    /// # Errors
    /// [`DriverError::NoSuchProcess`]; as [`SandboxDriver::list_processes`].
    async fn process(&self, sandbox: &SandboxId, pid: u32) -> Result<ProcessInfo, DriverError>;

    /// A background process's output from the start of its buffer; with `follow`, then
    /// as it arrives until the process ends (the stream ends with its exit). Without
    /// `follow` the stream ends after what is buffered (with the exit when it has ended).
    /// The exit's `truncated` says whether output was dropped from the buffer before
    /// this reader got it. Dropping the stream stops reading, never the process.
    ///
    /// # Errors
    /// [`DriverError::NoSuchProcess`]; as [`SandboxDriver::list_processes`].
    async fn process_output(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        follow: bool,
    ) -> Result<Box<dyn OutputStream>, DriverError>;

    /// Writes `bytes` to a running background process's standard input, then closes
    /// it when `close`.
    ///
    /// # Errors
    /// [`DriverError::NoSuchProcess`]; [`DriverError::Conflict`] when the process has
    /// ended or its input is closed.
    async fn write_stdin(
        &self,
        sandbox: &SandboxId,
        pid: u32,
        bytes: &[u8],
        close: bool,
    ) -> Result<(), DriverError>;

    /// Sends `signal` to a running background process's process group.
    ///
    /// # Errors
    /// [`DriverError::NoSuchProcess`]; [`DriverError::Conflict`] when it has ended.
    async fn signal_process(&self, sandbox: &SandboxId, pid: u32, signal: Signal) -> Result<(), DriverError>;

    /// Opens an input to a running background process: bytes for its input (a terminal's
    /// keystrokes) and, for one started on a terminal ([`ProcessRequest::terminal`]), its
    /// new sizes. Dropping it closes the input, never the process (nor the process's own
    /// input).
    ///
    /// # Errors
    /// [`DriverError::NoSuchProcess`]; [`DriverError::Conflict`] when it has ended;
    /// [`DriverError::Unsupported`] when the sandbox's supervisor predates terminals.
    async fn process_input(
        &self,
        sandbox: &SandboxId,
        pid: u32,
    ) -> Result<Box<dyn ProcessInput>, DriverError>;

    /// Reads a file or lists a directory. The path MUST be resolved inside the sandbox
    /// beneath its root: a symlink, `..` or mount that leads out of the root is
    /// [`DriverError::Invalid`], never followed. Reads happen with the sandbox user's
    /// permissions.
    ///
    /// # Errors
    /// [`DriverError::NoSuchPath`]; [`DriverError::Invalid`] when the path leads out of
    /// its root; [`DriverError::Conflict`] when it is not a file or directory, a parent is
    /// a file, or the sandbox user may not read it; [`DriverError::TooLarge`] for a
    /// directory with more entries than one listing holds; as
    /// [`SandboxDriver::list_processes`].
    async fn read_path(&self, sandbox: &SandboxId, path: &SandboxPath) -> Result<ReadOutcome, DriverError>;

    /// Writes a file from `contents`, creating missing parent directories, owned by the
    /// sandbox's user; an existing file is replaced whole, keeping its mode. Resolved as
    /// [`SandboxDriver::read_path`]. The new contents MUST appear at once and whole, and
    /// only after `contents` ended: when it fails or the caller goes away, nothing of it
    /// is left (not even a partial file). Returns the bytes written.
    ///
    /// # Errors
    /// [`DriverError::Source`] when `contents` failed; [`DriverError::Conflict`] when the
    /// path is a directory; [`DriverError::TooLarge`] past the sandbox's file size
    /// limit; [`DriverError::ResourceExhausted`] when its disk is full; as
    /// [`SandboxDriver::read_path`].
    async fn write_file(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        contents: Box<dyn ByteSource>,
    ) -> Result<u64, DriverError>;

    /// Deletes a file, a symlink (not what it points to) or an empty directory; with
    /// `recursive`, a directory and everything in it. A root (`/workspace`, `/tmp`) is
    /// never deleted.
    ///
    /// # Errors
    /// [`DriverError::NoSuchPath`]; [`DriverError::Conflict`] for a directory that is not
    /// empty without `recursive`, and for a root; as [`SandboxDriver::read_path`].
    async fn delete_path(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        recursive: bool,
    ) -> Result<(), DriverError>;

    /// A tar archive of a directory (files, directories and symlinks as links, never
    /// followed), streamed as it is made.
    ///
    /// # Errors
    /// As [`SandboxDriver::read_path`]; [`DriverError::Conflict`] for a path that is not a
    /// directory.
    async fn archive_out(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
    ) -> Result<Box<dyn ByteStream>, DriverError>;

    /// Unpacks a tar archive from `archive` into a directory (created when missing),
    /// owned by the sandbox's user, every entry resolved beneath it (an entry that would
    /// land outside, through `..`, an absolute name or a link, is refused). Each file
    /// appears whole or not at all; entries unpacked before a failure stay.
    ///
    /// # Errors
    /// [`DriverError::Invalid`] for a malformed archive or an entry that leads out;
    /// otherwise as [`SandboxDriver::write_file`].
    async fn archive_in(
        &self,
        sandbox: &SandboxId,
        path: &SandboxPath,
        archive: Box<dyn ByteSource>,
    ) -> Result<Unpacked, DriverError>;

    /// A new TCP connection to `port` on the sandbox's own loopback (`127.0.0.1` inside
    /// it, and nothing else), made through the sandbox's supervisor: a preview port. The
    /// caller has checked the port ([`domain::preview::port_open`]); the supervisor
    /// refuses the ports the lane serves inside the sandbox again. Dropping the stream
    /// closes the connection.
    ///
    /// # Errors
    /// [`DriverError::NotFound`] for a sandbox the driver does not hold (or whose
    /// supervisor is gone); [`DriverError::Invalid`] for a port the lane serves;
    /// [`DriverError::Failed`] when nothing accepts on the port (refused, or no answer in
    /// time); [`DriverError::Unsupported`] for a driver or a supervisor without preview
    /// ports (the default).
    async fn open_port(&self, sandbox: &SandboxId, port: u16) -> Result<Box<dyn PortStream>, DriverError> {
        let _ = port;
        Err(DriverError::Unsupported(format!("the {} driver opens no ports of {sandbox}", self.name())))
    }
}

/// A byte stream both ways: a connection to a port inside a sandbox
/// ([`SandboxDriver::open_port`]). Poll-based, as a runtime's I/O traits are, with `std`
/// types only, so this crate needs no runtime: the server wraps it in its runtime's traits
/// without a copy or a task in between. Each method has the contract of the same method
/// of `tokio::io::AsyncRead` / `AsyncWrite` (`Ok(0)` from a read: the end of the stream).
pub trait PortStream: Send + Unpin {
    /// Reads into `buf`: how many bytes were read.
    ///
    /// # Errors
    /// The connection's I/O error.
    fn poll_read(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>>;

    /// Writes from `buf`: how many bytes were written.
    ///
    /// # Errors
    /// The connection's I/O error.
    fn poll_write(
        &mut self,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>>;

    /// Flushes what was written.
    ///
    /// # Errors
    /// The connection's I/O error.
    fn poll_flush(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>>;

    /// Ends the writing direction (the peer reads the end).
    ///
    /// # Errors
    /// The connection's I/O error.
    fn poll_shutdown(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>>;
}
