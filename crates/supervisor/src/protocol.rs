//! The wire protocol between the server and a sandbox's supervisor.
//!
//! # Frames
//! Every message is one frame: a 4-byte big-endian payload length, one frame-type byte,
//! then the payload. A length above [`MAX_FRAME`] fails the connection before anything is
//! allocated. Control frames carry one JSON object ([`Request`] from the server,
//! [`Reply`] from the supervisor); data frames carry raw bytes (standard input, output,
//! file or archive contents), so binary data costs nothing to encode.
//!
//! # A connection
//! One connection is one operation. The server speaks first: `hello` with its
//! [`VERSION`]; the supervisor answers `hello` with its own, its features and the
//! protections it runs under, or an `error` with code `version` and closes. Then the server
//! sends one request and the two sides exchange frames until the operation ends; either
//! side closing the connection ends it (for an exec: the command's process group is
//! killed). So a client that goes away ends its command.
//!
//! # Operations
//! - `exec`: runs a command; the server may send [`FrameType::Stdin`] frames (an empty one
//!   closes the command's input); the supervisor sends `started`, [`FrameType::Stdout`] and
//!   [`FrameType::Stderr`] frames as output arrives, then `exit`. The same exchange serves
//!   buffered and streaming exec: the server collects the frames or relays them.
//! - `ping`: answered by `pong` (health, and how many commands run).
//! - `shutdown`: the supervisor exits; as the sandbox's init it takes every process of
//!   the sandbox with it.
//! - Background processes (feature `processes`), kept by the supervisor (so they outlive
//!   the server's connections and the server itself, and end with the sandbox):
//!   - `process_start` ([`ProcessStart`]), then the process's first standard input as
//!     [`FrameType::Stdin`] frames ended by an empty one: answered `process` (its
//!     [`ProcessStatus`]), or `error` `resource_exhausted` when the caps leave no room,
//!     `spawn` when the program cannot start.
//!   - `process_list`: one `process` per kept process, then `end`.
//!   - `process_status`: one `process`.
//!   - `process_output`: `replay` (how many bytes of output are no longer buffered),
//!     then the buffered output as [`FrameType::Stdout`]/[`FrameType::Stderr`] frames;
//!     with `follow`, then the output as it arrives; then `exit` once the process has
//!     ended, or `end` (not following, still running). Closing the connection stops
//!     the reading, never the process.
//!   - `process_stdin`, then [`FrameType::Stdin`] frames ended by an empty one:
//!     written, then (with `close`) the input closed; answered `done`.
//!   - `process_signal`: `TERM`, `INT` or `KILL` to the process's group; `done`.
//! - Terminals (feature `terminals`): a background process started on a pseudo-terminal
//!   of its own. `process_start` with a [`ProcessStart::terminal`] (an id the server
//!   chose, and the terminal's size): the supervisor opens a new pseudo-terminal, sets its
//!   size, and starts the process as the leader of a new session whose controlling
//!   terminal it is, with the terminal on its standard input, output and error. Its output
//!   (one stream: [`FrameType::Stdout`]) goes to the process's buffer as any background
//!   process's, read until the terminal's last other end closes. Its
//!   [`ProcessStatus::terminal`] names the id. `process_stdin` writes to the terminal (a
//!   `close` only stops further writes: a terminal's input ends when its process does).
//!   - `process_resize` ([`Request::ProcessResize`]): the terminal's new size (the kernel
//!     signals `SIGWINCH` to its foreground process group); `done`. `conflict` for a
//!     process without a terminal, or one that has ended.
//!   - `process_input` ([`Request::ProcessInput`]): a long-lived input stream for an
//!     attached terminal (or any background process): answered `done` at once; then
//!     each [`FrameType::Stdin`] frame the server sends is written as it arrives (an empty
//!     one ends the stream), and each control frame `process_resize` naming the same pid
//!     resizes the terminal, with no answer per frame. The supervisor closes the stream
//!     when the process has ended. Closing it never touches the process.
//! - Files (feature `files`), every path resolved by the supervisor inside the sandbox,
//!   beneath `/workspace` or `/tmp` (see [`crate::fs`]), with the sandbox user's
//!   permissions and ownership:
//!   - `file_read`: `file` (its size), that many bytes as [`FrameType::Data`] frames,
//!     then `end`; or, for a directory, `directory`, `entries` frames, then `end`.
//!   - `file_write`, then [`FrameType::Data`] frames ended by an empty one (the commit):
//!     `written`. Until the commit nothing is visible; a connection closed before it
//!     leaves nothing behind.
//!   - `file_delete`: `done`.
//! - Archives (feature `archive`): `archive_read` streams a tar of a directory as
//!   [`FrameType::Data`] frames, then `end`; `archive_write`, then [`FrameType::Data`]
//!   frames of a tar ended by an empty one, unpacks it into a directory: `unpacked`.
//!
//! - Egress (feature `egress`): the supervisor listens on a loopback port inside the
//!   sandbox (the proxy every command's `HTTP_PROXY`/`HTTPS_PROXY` names) and holds each
//!   connection a process makes there until the server takes it:
//!   - `events`: a long-lived stream. The supervisor answers `client` (an id) for each
//!     connection held, those already waiting first, then each new one as it comes. One
//!     stream at a time: while one is open, another `events` is answered `busy`. The
//!     server sends nothing more; its closing the connection ends the stream.
//!   - `tunnel` (an id from `client`): `tunnel`, then the connection's bytes both ways as
//!     [`FrameType::Data`] frames; an empty one ends that direction. Either side closing
//!     ends the tunnel; `not_found` when no connection with that id is held (taken
//!     already, or given up: a held connection waits at most a few seconds).
//!   - `take` (an id from `client`; feature `egress_take`, served only over a unix
//!     socket): the reply `taken` is sent with the held connection's descriptor attached
//!     (`SCM_RIGHTS`, exactly one), and the connection ends; the server then reads and
//!     writes the client's TCP connection itself, with no frames and no supervisor in
//!     between. `not_found` as for `tunnel`. A channel that cannot carry a descriptor (a
//!     port-forward) uses `tunnel`.
//!
//!   Where the server can reach the sandbox's network namespace (bubblewrap and
//!   containers, run as root), the supervisor is started without an egress port: the
//!   server opens the proxy's listening socket in the namespace itself, and the
//!   supervisor serves no egress at all (no feature `egress`).
//!
//!   Earlier supervisors also served `listen` (feature `egress_listen`: the proxy's
//!   listening socket handed over with `SCM_RIGHTS`, the reply `listening`, and a
//!   `egress_listened` count in `pong`). No server asks for it any more (a socket the
//!   sandbox also holds could only be accepted on a thread per sandbox); this supervisor
//!   answers it `unsupported`, and a `pong`'s `egress_listened` from an earlier one is
//!   ignored.
//!
//! - Preview ports (feature `connect`): `connect` (a port, and whether the descriptor may
//!   be handed over): the supervisor connects to `127.0.0.1:port` inside the sandbox, and
//!   to nothing else, within [`CONNECT_TIMEOUT_MS`]. With `hand_over` (asked only over a
//!   unix socket, which can carry a descriptor) the reply `connected` is sent with the
//!   connected socket's descriptor attached (`SCM_RIGHTS`, exactly one) and the connection
//!   ends; the server then reads and writes the sandbox's TCP connection itself. Without
//!   (a port-forward), the reply is `tunnel` and the bytes go both ways as
//!   [`FrameType::Data`] frames, exactly as for egress's `tunnel`. Refused `invalid`: port
//!   0, and the ports the lane itself serves inside the sandbox (the egress proxy's,
//!   [`domain::egress::PROXY_PORT`], and the supervisor's own TCP gate): a visitor of a
//!   preview must never reach the sandbox's egress, nor its brokered secrets. `unreachable`
//!   when nothing accepts the connection (refused, or no answer in time).
//!
//! Failures are `error` replies whose `code` says which: `version`, `unsupported`,
//! `bad_request`, `spawn`, `busy`, `not_found` (a path), `no_such_process`, `invalid` (a
//! path that leads out of its root, a file where a directory is needed, a malformed
//! archive, a port the lane serves), `conflict`, `too_large`, `resource_exhausted`, `io`,
//! `unreachable` (a port nothing accepts on). The connection ends
//! after one.
//!
//! Requests the supervisor does not know are answered with an `error` of code
//! `unsupported` (the connection stays usable for nothing else; it closes), so a newer
//! server can ask an older supervisor without a protocol break: egress came as new
//! request and reply types on the same frames (`events`, `tunnel`, `take`; `client`,
//! `tunnel`, `taken`), and preview ports after it (`connect`; `connected`),
//! and the hello's `features` list says which ones a supervisor serves.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The protocol version both sides announce in their hello. A mismatch fails the
/// connection with a clear error.
pub const VERSION: u32 = 1;

/// The largest frame payload either side accepts, in bytes (a control message or one
/// chunk of data).
pub const MAX_FRAME: usize = 256 * 1024;

/// The largest chunk of data a sender puts in one data frame.
pub const DATA_CHUNK: usize = 64 * 1024;

/// The bytes before a frame's payload: the length (u32, big-endian) and the type.
pub const HEADER_LEN: usize = 5;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// One JSON control message.
    Control = 1,
    /// Bytes for the command's standard input (server → supervisor); empty: end of input.
    Stdin = 2,
    /// Bytes the command wrote to standard output (supervisor → server).
    Stdout = 3,
    /// Bytes the command wrote to standard error (supervisor → server).
    Stderr = 4,
    /// Bytes of a file or an archive (either way); an empty one from the server commits
    /// an upload.
    Data = 5,
}

impl FrameType {
    /// The type named by a frame's type byte.
    ///
    /// # Errors
    /// [`ProtocolError::UnknownFrameType`].
    pub fn from_byte(byte: u8) -> Result<Self, ProtocolError> {
        Ok(match byte {
            1 => Self::Control,
            2 => Self::Stdin,
            3 => Self::Stdout,
            4 => Self::Stderr,
            5 => Self::Data,
            other => return Err(ProtocolError::UnknownFrameType(other)),
        })
    }
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: FrameType,
    /// The payload (at most [`MAX_FRAME`] bytes).
    pub payload: Vec<u8>,
}

impl Frame {
    /// A control frame holding `message` as JSON.
    ///
    /// # Errors
    /// [`ProtocolError::Json`] when it cannot be encoded; [`ProtocolError::TooLarge`].
    pub fn control<T: Serialize>(message: &T) -> Result<Self, ProtocolError> {
        let payload = serde_json::to_vec(message).map_err(|e| ProtocolError::Json(e.to_string()))?;
        if payload.len() > MAX_FRAME {
            return Err(ProtocolError::TooLarge(payload.len()));
        }
        Ok(Self { kind: FrameType::Control, payload })
    }

    /// The control message in this frame.
    ///
    /// # Errors
    /// [`ProtocolError::Unexpected`] for a data frame; [`ProtocolError::Json`].
    pub fn parse<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ProtocolError> {
        if self.kind != FrameType::Control {
            return Err(ProtocolError::Unexpected(format!(
                "a {:?} frame where a message was due",
                self.kind
            )));
        }
        serde_json::from_slice(&self.payload).map_err(|e| ProtocolError::Json(e.to_string()))
    }

    /// The frame as bytes on the wire.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        let len = u32::try_from(self.payload.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.payload);
        out
    }
}

/// Why a connection failed. Every error ends that one connection, nothing else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A frame longer than [`MAX_FRAME`].
    #[error("frame of {0} bytes exceeds the limit of {MAX_FRAME}")]
    TooLarge(usize),
    /// A type byte no frame has.
    #[error("unknown frame type {0}")]
    UnknownFrameType(u8),
    /// A control message that is not the JSON expected.
    #[error("malformed message: {0}")]
    Json(String),
    /// A message out of turn.
    #[error("protocol violation: {0}")]
    Unexpected(String),
    /// The peer speaks another version.
    #[error("protocol version mismatch: this side speaks {ours}, the peer {theirs}")]
    Version {
        /// This side's version.
        ours: u32,
        /// The peer's.
        theirs: u32,
    },
    /// The connection ended in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// An I/O error on the connection.
    #[error("connection error: {0}")]
    Io(String),
    /// No answer in time.
    #[error("no answer within {0} ms")]
    Timeout(u64),
}

/// Decodes one frame from the front of `buf`: `Ok(None)` when more bytes are needed,
/// else the frame and how many bytes it took. Never panics, never allocates more than
/// the frame's payload (at most [`MAX_FRAME`]).
///
/// # Errors
/// [`ProtocolError::TooLarge`], [`ProtocolError::UnknownFrameType`].
pub fn decode(buf: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let Some(header) = buf.get(..HEADER_LEN) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let kind = FrameType::from_byte(header[4])?;
    let Some(payload) = buf.get(HEADER_LEN..HEADER_LEN + len) else {
        return Ok(None);
    };
    Ok(Some((Frame { kind, payload: payload.to_vec() }, HEADER_LEN + len)))
}

/// Reads one frame; `Ok(None)` at a clean end of the connection (between frames).
///
/// # Errors
/// As [`decode`]; [`ProtocolError::Truncated`] or [`ProtocolError::Io`].
pub async fn read_frame<R: AsyncRead + Unpin>(reader: &mut R) -> Result<Option<Frame>, ProtocolError> {
    let mut header = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match reader.read(&mut header[got..]).await {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ProtocolError::Truncated),
            Ok(n) => got += n,
            Err(e) => return Err(ProtocolError::Io(e.to_string())),
        }
    }
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len > MAX_FRAME {
        return Err(ProtocolError::TooLarge(len));
    }
    let kind = FrameType::from_byte(header[4])?;
    let mut payload = vec![0u8; len];
    reader.read_exact(&mut payload).await.map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            ProtocolError::Truncated
        } else {
            ProtocolError::Io(e.to_string())
        }
    })?;
    Ok(Some(Frame { kind, payload }))
}

/// Writes one frame.
///
/// # Errors
/// [`ProtocolError::Io`].
pub async fn write_frame<W: AsyncWrite + Unpin>(writer: &mut W, frame: &Frame) -> Result<(), ProtocolError> {
    let io = |e: std::io::Error| ProtocolError::Io(e.to_string());
    if frame.payload.len() < 16 * 1024 {
        // One write: a small frame costs less copied than written twice.
        return writer.write_all(&frame.encode()).await.map_err(io);
    }
    // A large one is not copied: its header, then its payload.
    let len = u32::try_from(frame.payload.len()).unwrap_or(u32::MAX).to_be_bytes();
    let header = [len[0], len[1], len[2], len[3], frame.kind as u8];
    writer.write_all(&header).await.map_err(io)?;
    writer.write_all(&frame.payload).await.map_err(io)
}

/// Writes `bytes` (at most [`MAX_FRAME`]) as one frame of `kind` without copying them: the
/// header, then the bytes (in one write when small).
///
/// # Errors
/// [`ProtocolError::Io`]; [`ProtocolError::TooLarge`].
pub async fn write_slice<W: AsyncWrite + Unpin>(
    writer: &mut W,
    kind: FrameType,
    bytes: &[u8],
) -> Result<(), ProtocolError> {
    if bytes.len() > MAX_FRAME {
        return Err(ProtocolError::TooLarge(bytes.len()));
    }
    let io = |e: std::io::Error| ProtocolError::Io(e.to_string());
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX).to_be_bytes();
    let header = [len[0], len[1], len[2], len[3], kind as u8];
    if bytes.len() < 16 * 1024 {
        let mut small = Vec::with_capacity(HEADER_LEN + bytes.len());
        small.extend_from_slice(&header);
        small.extend_from_slice(bytes);
        return writer.write_all(&small).await.map_err(io);
    }
    writer.write_all(&header).await.map_err(io)?;
    writer.write_all(bytes).await.map_err(io)
}

/// Writes data as frames of `kind`, in chunks of at most [`DATA_CHUNK`] bytes.
///
/// # Errors
/// [`ProtocolError::Io`].
pub async fn write_data<W: AsyncWrite + Unpin>(
    writer: &mut W,
    kind: FrameType,
    bytes: &[u8],
) -> Result<(), ProtocolError> {
    for chunk in bytes.chunks(DATA_CHUNK) {
        write_frame(writer, &Frame { kind, payload: chunk.to_vec() }).await?;
    }
    Ok(())
}

/// A resource limit set in a command before it starts (`setrlimit`, soft = hard).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Rlimit {
    /// `RLIMIT_NOFILE`.
    OpenFiles,
    /// `RLIMIT_AS`, bytes.
    AddressSpace,
    /// `RLIMIT_FSIZE`, bytes.
    FileSize,
    /// `RLIMIT_CPU`, seconds (the hard limit one second above: SIGXCPU, then SIGKILL).
    CpuSecs,
    /// `RLIMIT_NPROC`.
    Processes,
    /// `RLIMIT_CORE`, bytes.
    Core,
}

/// One command to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    /// The program and its arguments (looked up on the command's `PATH`).
    pub argv: Vec<String>,
    /// Exactly the command's environment.
    pub env: Vec<(String, String)>,
    /// The working directory.
    pub cwd: String,
    /// Wall-clock limit in milliseconds: then the command's process group is killed.
    pub timeout_ms: u64,
    /// Most bytes kept per output stream; the rest is read and dropped (`truncated`).
    pub output_cap: u64,
    /// Whether the server sends standard input (else the command reads `/dev/null`).
    pub stdin: bool,
    /// Limits set in the command before it starts.
    #[serde(default)]
    pub rlimits: Vec<(Rlimit, u64)>,
}

/// A message from the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    /// The first message of every connection.
    Hello {
        /// The server's [`VERSION`].
        version: u32,
    },
    /// Run a command (see [`ExecSpec`]).
    Exec(ExecSpec),
    /// Are you alive?
    Ping,
    /// End the sandbox: the supervisor exits, and as its pid namespace's init it takes
    /// every process of the sandbox with it (the kernel kills them). No reply.
    Shutdown,
    /// Start a background process (see [`ProcessStart`]).
    ProcessStart(ProcessStart),
    /// List the kept background processes.
    ProcessList,
    /// One background process.
    ProcessStatus {
        /// Its pid.
        pid: u32,
    },
    /// A background process's output, from the start of its buffer.
    ProcessOutput {
        /// Its pid.
        pid: u32,
        /// Whether to go on with the output as it arrives until the process ends.
        follow: bool,
    },
    /// Write to a background process's standard input (the bytes follow as
    /// [`FrameType::Stdin`] frames, ended by an empty one).
    ProcessStdin {
        /// Its pid.
        pid: u32,
        /// Whether to close its input after the bytes.
        close: bool,
    },
    /// Set a terminal's size (feature `terminals`).
    ProcessResize {
        /// The pid of a process started on a terminal.
        pid: u32,
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
    /// Open a long-lived input stream to a background process (feature `terminals`; see
    /// the module's doc).
    ProcessInput {
        /// Its pid.
        pid: u32,
    },
    /// Signal a background process's group.
    ProcessSignal {
        /// Its pid.
        pid: u32,
        /// `TERM`, `INT` or `KILL`.
        signal: String,
    },
    /// Read a file or list a directory.
    FileRead {
        /// The path (`/workspace/…`, `/tmp/…`).
        path: String,
    },
    /// Write a file (its bytes follow as [`FrameType::Data`] frames; an empty one commits).
    FileWrite {
        /// The path.
        path: String,
    },
    /// Delete a file, a link or a directory.
    FileDelete {
        /// The path.
        path: String,
        /// Whether a directory goes with everything in it.
        recursive: bool,
    },
    /// Stream a tar archive of a directory.
    ArchiveRead {
        /// The directory.
        path: String,
    },
    /// Unpack a tar archive into a directory (its bytes follow as [`FrameType::Data`]
    /// frames; an empty one ends them).
    ArchiveWrite {
        /// The directory (created when missing).
        path: String,
    },
    /// Stop every other process of the sandbox (`SIGSTOP` to all of its pid namespace)
    /// until this connection ends, then continue them (`SIGCONT`): a snapshot's one
    /// instant where no cgroup freezer is at the server's hand (Kubernetes). Answered
    /// [`Reply::Done`] once they are stopped; refused `unsupported` by a supervisor that is
    /// not its pid namespace's init. At most [`MAX_FREEZE_MS`] whatever the connection.
    Freeze,
    /// Announce each egress-proxy connection as it is held (see the module's doc).
    Events,
    /// Relay one held egress-proxy connection.
    Tunnel {
        /// Its id, from a `client` reply.
        id: u64,
    },
    /// Hand one held egress-proxy connection's descriptor over (feature `egress_take`;
    /// see the module's doc).
    Take {
        /// Its id, from a `client` reply.
        id: u64,
    },
    /// Connect to a port of the sandbox's own loopback (feature `connect`; see the
    /// module's doc).
    Connect {
        /// The port on `127.0.0.1` inside the sandbox.
        port: u16,
        /// Whether the connected socket's descriptor is to be handed over (`connected`,
        /// over a unix socket), else relayed in frames (`tunnel`).
        hand_over: bool,
    },
    /// A request this side does not know (a newer peer's): answered `unsupported`.
    #[serde(other)]
    Unknown,
}

/// How long the supervisor waits for a sandbox's port to accept a `connect`, in ms.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;

/// A background process to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStart {
    /// The command (its `timeout_ms` 0: none; its `output_cap` and `stdin` are not used:
    /// the output goes to the process's buffer, its input stays open).
    pub spec: ExecSpec,
    /// The size of the process's output buffer in bytes.
    pub buffer_bytes: u64,
    /// Most processes the supervisor keeps (ended ones are forgotten, oldest first, to
    /// make room).
    pub max_processes: u32,
    /// Most buffer bytes of all kept processes together.
    pub max_buffered_bytes: u64,
    /// Start it on a new pseudo-terminal (feature `terminals`); none: on pipes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<TerminalStart>,
}

/// The pseudo-terminal a background process starts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalStart {
    /// The id the server knows the terminal by (kept, and reported in its status).
    pub id: String,
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A background process as the supervisor reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessStatus {
    /// Its pid inside the sandbox (its process group's id too).
    pub pid: u32,
    /// The program and its arguments (shortened when they would not fit in a frame).
    pub argv: Vec<String>,
    /// Whether it still runs.
    pub running: bool,
    /// Its exit status once ended (`128 + signal` when a signal ended it).
    pub exit_code: Option<i32>,
    /// Whether its timeout killed it.
    pub timed_out: bool,
    /// The id of its terminal, when it was started on one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal: Option<String>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireEntry {
    /// The entry's name (invalid UTF-8 replaced).
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: String,
    /// Its size in bytes.
    pub size: u64,
}

/// What the supervisor enforces on itself and its commands, as it reports in its hello.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Protections {
    /// Whether the seccomp filter is installed (on the supervisor, so on every command).
    pub seccomp: bool,
    /// Whether the supervisor runs as PID 1 of its own pid namespace.
    pub pid_namespace: bool,
    /// Whether the supervisor is non-dumpable (no ptrace, no `/proc/1/mem` for its uid).
    pub non_dumpable: bool,
}

/// The longest a [`Request::Freeze`] holds, in milliseconds: a server that went away
/// cannot leave a sandbox stopped.
pub const MAX_FREEZE_MS: u64 = 120_000;

/// A message from the supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    /// The answer to the server's hello.
    Hello {
        /// The supervisor's [`VERSION`].
        version: u32,
        /// The operations it serves (`exec`, `ping`, …).
        features: Vec<String>,
        /// What it runs under.
        protections: Protections,
    },
    /// The command started.
    Started {
        /// Its pid inside the sandbox (its process group id too).
        pid: i32,
    },
    /// The command ended (or was killed at its timeout).
    Exit {
        /// The exit status, or 128 + the signal that ended it.
        code: i32,
        /// Whether the timeout killed it.
        timed_out: bool,
        /// Whether output beyond the cap was dropped.
        truncated: bool,
    },
    /// The answer to `ping`.
    Pong {
        /// How many commands run now.
        running: u32,
        /// How many held egress connections were handed over (`take`) so far.
        #[serde(default)]
        egress_taken: u64,
        /// How many held egress connections were relayed in frames (`tunnel`) so far.
        #[serde(default)]
        egress_tunnelled: u64,
    },
    /// A background process (started, asked for, or one of a listing).
    Process(ProcessStatus),
    /// The end of a listing, an output replay that does not follow, a file or an archive.
    End,
    /// The operation succeeded (stdin written, signal sent, path deleted).
    Done,
    /// The start of a process's output replay.
    Replay {
        /// How many bytes of its output came before the buffer's start and are gone.
        dropped: u64,
    },
    /// A file's contents follow.
    File {
        /// Its size in bytes: exactly that many bytes follow.
        size: u64,
    },
    /// A directory's entries follow.
    Directory,
    /// Some of a directory's entries.
    Entries {
        /// The entries.
        entries: Vec<WireEntry>,
    },
    /// A file was written.
    Written {
        /// Its size in bytes.
        bytes: u64,
    },
    /// An archive was unpacked.
    Unpacked {
        /// Entries written.
        entries: u64,
        /// Bytes of file contents written.
        bytes: u64,
    },
    /// The request failed; the connection ends.
    Error {
        /// See the module's list of codes.
        code: String,
        /// What happened.
        message: String,
    },
    /// A process connected to the egress proxy; `tunnel` with this id relays it.
    Client {
        /// The held connection's id.
        id: u64,
    },
    /// The tunnel is open: its bytes follow as data frames both ways (an empty one ends a
    /// direction); an `error` frame `gone` from the supervisor says the client went away
    /// (the tunnel ends).
    Tunnel,
    /// The held connection's descriptor rides with this reply (`SCM_RIGHTS`); the
    /// supervisor no longer holds it.
    Taken,
    /// The connection to the sandbox's port (`connect` with `hand_over`): its descriptor
    /// rides with this reply (`SCM_RIGHTS`); the supervisor no longer holds it.
    Connected,
    /// A reply this side does not know (a newer peer's).
    #[serde(other)]
    Unknown,
}

/// Which paths a sandbox's egress took so far, as its supervisor counts them (and
/// answers `ping` with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EgressCounts {
    /// Held connections handed over (`take`).
    pub taken: u64,
    /// Held connections relayed in frames (`tunnel`).
    pub tunnelled: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_round_trip() {
        let frame = Frame::control(&Request::Ping).unwrap();
        let bytes = frame.encode();
        assert_eq!(&bytes[..5], &[0, 0, 0, 15, 1]);
        let (back, used) = decode(&bytes).unwrap().unwrap();
        assert_eq!((back, used), (frame, bytes.len()));
        assert_eq!(decode(&bytes[..4]).unwrap(), None);
        assert_eq!(decode(&bytes[..bytes.len() - 1]).unwrap(), None);
    }

    #[test]
    fn limits_and_types_are_checked_before_allocating() {
        let mut huge = (u32::MAX).to_be_bytes().to_vec();
        huge.push(1);
        assert_eq!(decode(&huge), Err(ProtocolError::TooLarge(u32::MAX as usize)));
        let mut over = u32::try_from(MAX_FRAME + 1).unwrap().to_be_bytes().to_vec();
        over.push(3);
        assert!(matches!(decode(&over), Err(ProtocolError::TooLarge(_))));
        assert_eq!(decode(&[0, 0, 0, 0, 9]), Err(ProtocolError::UnknownFrameType(9)));
    }

    #[test]
    fn unknown_requests_and_replies_are_not_errors() {
        let f = Frame { kind: FrameType::Control, payload: br#"{"type":"port_open","port":3}"#.to_vec() };
        assert_eq!(f.parse::<Request>().unwrap(), Request::Unknown);
        let f = Frame { kind: FrameType::Control, payload: br#"{"type":"port_opened","port":3}"#.to_vec() };
        assert_eq!(f.parse::<Reply>().unwrap(), Reply::Unknown);
        let f = Frame { kind: FrameType::Control, payload: b"{\"type\":7}".to_vec() };
        assert!(f.parse::<Request>().is_err());
        let data = Frame { kind: FrameType::Stdout, payload: b"{}".to_vec() };
        assert!(matches!(data.parse::<Reply>(), Err(ProtocolError::Unexpected(_))));
    }

    #[tokio::test]
    async fn read_frame_fails_on_truncation_and_ends_cleanly_between_frames() {
        let frame = Frame { kind: FrameType::Stdin, payload: b"abc".to_vec() };
        let bytes = frame.encode();
        let mut whole = &bytes[..];
        assert_eq!(read_frame(&mut whole).await.unwrap(), Some(frame));
        assert_eq!(read_frame(&mut whole).await.unwrap(), None);
        let mut cut = &bytes[..6];
        assert_eq!(read_frame(&mut cut).await, Err(ProtocolError::Truncated));
        let mut cut = &bytes[..2];
        assert_eq!(read_frame(&mut cut).await, Err(ProtocolError::Truncated));
    }

    proptest! {
        /// Arbitrary bytes never panic the decoder, and whatever it accepts is a frame
        /// within the limit that encodes back to exactly the bytes it took.
        #[test]
        fn decoder_survives_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            if let Ok(Some((frame, used))) = decode(&bytes) {
                prop_assert!(frame.payload.len() <= MAX_FRAME);
                prop_assert_eq!(frame.encode(), bytes[..used].to_vec());
            }
            // A control frame of arbitrary bytes parses or errors, never panics.
            let frame = Frame { kind: FrameType::Control, payload: bytes.clone() };
            let _ = frame.parse::<Request>();
            let _ = frame.parse::<Reply>();
        }

        /// A stream of arbitrary bytes read frame by frame ends with a frame, a clean end
        /// or an error, and never reads past a bound.
        #[test]
        fn reader_survives_arbitrary_streams(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let mut input = &bytes[..];
                for _ in 0..4096 {
                    match read_frame(&mut input).await {
                        Ok(Some(frame)) => assert!(frame.payload.len() <= MAX_FRAME),
                        Ok(None) | Err(_) => break,
                    }
                }
            });
        }

        /// Every request and reply round-trips through a frame.
        #[test]
        fn messages_round_trip(argv in proptest::collection::vec(".{0,12}", 1..4), timeout in any::<u64>(), cap in any::<u64>()) {
            let spec = ExecSpec {
                argv,
                env: vec![("A".into(), "b".into())],
                cwd: "/workspace".into(),
                timeout_ms: timeout,
                output_cap: cap,
                stdin: true,
                rlimits: vec![(Rlimit::CpuSecs, 3)],
            };
            let request = Request::Exec(spec);
            let frame = Frame::control(&request).unwrap();
            let (back, _) = decode(&frame.encode()).unwrap().unwrap();
            prop_assert_eq!(back.parse::<Request>().unwrap(), request);
        }
    }
}
