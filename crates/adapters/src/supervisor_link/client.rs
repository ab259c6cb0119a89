//! The server's side of the protocol: connect to a sandbox's supervisor, say hello, run
//! an operation. Everything the supervisor sends is treated as hostile: frames are
//! bounded, output is capped again here, a file's bytes are held to the size it
//! announced, listings are bounded, and every wait but a follow has a deadline. Over a
//! unix socket ([`UnixChannel`]) a descriptor is received only with the one reply that
//! names it (`take`: exactly one, checked), refused everywhere else, and never
//! closed on the calling thread ([`super::closer`]): a sandbox's socket set to linger
//! would make that close wait.
//!
//! The streams here are the driver port's ([`ports::OutputStream`],
//! [`ports::ByteStream`]): each holds its one connection and reads one frame per `next()`,
//! so nothing is buffered beyond a frame, and dropping it closes the connection (which
//! ends an exec's command, and abandons an upload). [`driver_error`] maps the
//! supervisor's answers onto [`DriverError`], so every driver that runs the supervisor
//! reports the same failures the same way.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use domain::{DirEntry, EntryKind, ExecOutput, ExitStatus, OutputEvent, SandboxId};
use ports::Cause;
use ports::driver::{ByteSource, ByteStream, DriverError, EntryStream, OutputStream, SourceError};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::channel::{Descriptors, UnixChannel};
use super::closer::SandboxFd;
use super::taken::TakenTcp;
use supervisor::protocol::{
    EgressCounts, ExecSpec, Frame, FrameType, ProcessStart, ProcessStatus, Protections, ProtocolError, Reply,
    Request, VERSION, WireEntry, read_frame, write_data, write_frame,
};

/// What the supervisor said about itself in its hello.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// The operations it serves.
    pub features: Vec<String>,
    /// What it runs under.
    pub protections: Protections,
}

/// Why an operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Nobody listens: the supervisor is gone (its socket is missing or refuses).
    #[error("the sandbox's supervisor is gone: {0}")]
    Gone(io::Error),
    /// The exchange broke the protocol, timed out or the connection failed.
    #[error("supervisor connection: {0}")]
    Protocol(#[from] ProtocolError),
    /// The supervisor refused the request.
    #[error("the supervisor refused ({code}): {message}")]
    Refused {
        /// Its error code.
        code: String,
        /// Its message.
        message: String,
    },
    /// The bytes of an upload could not be had; the upload was abandoned.
    #[error("the upload failed: {0}")]
    Source(#[source] SourceError),
}

/// The port's error for a failed operation on `sandbox` (`pid`: the background process it
/// named, if any). A supervisor that is gone is [`DriverError::NotFound`]; a driver that
/// cleans up after one does so before calling this.
pub fn driver_error(error: ClientError, sandbox: &SandboxId, pid: Option<u32>) -> DriverError {
    match error {
        ClientError::Gone(_) => DriverError::NotFound(sandbox.clone()),
        ClientError::Source(e) => DriverError::Source(e),
        ClientError::Refused { code, message } => match code.as_str() {
            "not_found" => DriverError::NoSuchPath(message),
            "no_such_process" => match pid {
                Some(pid) => DriverError::NoSuchProcess { sandbox: sandbox.clone(), pid },
                None => DriverError::Failed(Cause::msg(message)),
            },
            "invalid" | "bad_request" | "spawn" => DriverError::Invalid(message),
            "conflict" => DriverError::Conflict(message),
            "too_large" => DriverError::TooLarge(message),
            "resource_exhausted" => DriverError::ResourceExhausted(message),
            "busy" => DriverError::Conflict(format!("sandbox {sandbox}: {message}")),
            "unsupported" => DriverError::Unsupported(format!(
                "the supervisor of sandbox {sandbox} predates this operation ({message}); a sandbox provisioned \
                 afresh serves it"
            )),
            _ => DriverError::Failed(Cause::msg(format!(
                "sandbox {sandbox}: the supervisor failed ({code}): {message}"
            ))),
        },
        e @ ClientError::Protocol(_) => DriverError::Failed(Cause::context(format!("sandbox {sandbox}"), e)),
    }
}

/// The size of an upload's data frames (the protocol's largest).
const UPLOAD_FRAME: usize = supervisor::protocol::MAX_FRAME;
/// How long a quick operation (a listing, a status, a signal, a delete) may take.
pub const OP_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a file or archive transfer may sit without a frame either way.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
/// The most background processes a listing is read for (the supervisor keeps far fewer).
const MAX_LISTED: usize = 10_000;
/// The most bytes of names a directory listing is read for: what a misbehaving
/// supervisor can send through the server (which relays it a frame at a time).
const MAX_LISTING_BYTES: usize = 64 << 20;
/// The most memory a process listing may take in the server, counted as it is held (a
/// status, each argument's `String` and its bytes, the terminal id): an empty argument is
/// 3 bytes on the wire but a `String` in memory, so the wire's size would not bound it.
const MAX_PROCESS_LISTING_BYTES: usize = 16 << 20;

/// What `status` holds in the server's memory (at least).
fn held_by(status: &ProcessStatus) -> usize {
    std::mem::size_of::<ProcessStatus>()
        + status.argv.iter().map(|a| std::mem::size_of::<String>() + a.len()).sum::<usize>()
        + status.terminal.as_ref().map_or(0, String::len)
}
/// The most entries a directory listing is read for.
pub const MAX_LISTING: usize = supervisor::fs::MAX_ENTRIES;

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The next reply, within `limit` (none: no deadline); an `error` reply is
/// [`ClientError::Refused`], the connection's end [`ProtocolError::Truncated`].
async fn next_reply(rx: &mut Rx, limit: Option<Duration>) -> Result<Reply, ClientError> {
    let frame = match limit {
        Some(d) => {
            tokio::time::timeout(d, read_frame(rx)).await.map_err(|_| ProtocolError::Timeout(millis(d)))??
        }
        None => read_frame(rx).await?,
    };
    refused(frame.ok_or(ProtocolError::Truncated)?.parse::<Reply>()?)
}

fn refused(reply: Reply) -> Result<Reply, ClientError> {
    match reply {
        Reply::Error { code, message } => Err(ClientError::Refused { code, message }),
        other => Ok(other),
    }
}

fn unexpected(what: &str, reply: &Reply) -> ClientError {
    ProtocolError::Unexpected(format!("{reply:?} {what}")).into()
}

/// The reading half of one connection to a supervisor, whatever carries it.
pub type Rx = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of one connection to a supervisor, whatever carries it.
pub type Tx = Box<dyn AsyncWrite + Send + Unpin>;

/// Where a supervisor is reached: one new byte stream per operation. A unix socket's path
/// ([`Path`], [`PathBuf`]: bubblewrap, containers) is one; the Kubernetes driver's
/// port-forward through the API server is another. Every operation of this module runs
/// over any of them unchanged.
pub trait Connect: Send + Sync {
    /// The stream of one connection.
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;

    /// Opens a new connection, ready for the hello.
    ///
    /// # Errors
    /// [`ClientError::Gone`] when nobody listens; a protocol error otherwise.
    fn open(&self) -> impl Future<Output = Result<Self::Stream, ClientError>> + Send;

    /// Bytes a connection sends before the hello (the Kubernetes channel key), in the same
    /// write as the hello and the request: one small write, never two, so no peer's delayed
    /// acknowledgement holds the request back.
    fn preamble(&self) -> &[u8] {
        &[]
    }

    /// Splits a connection into its halves (by default through [`tokio::io::split`]).
    fn halves(stream: Self::Stream) -> (Rx, Tx) {
        let (rx, tx) = tokio::io::split(stream);
        (Box::new(rx), Box::new(tx))
    }

    /// The unix socket's path when the channel is one, so descriptors can be passed over
    /// it (egress's `take`); none for a channel that cannot carry them (a port-forward).
    fn unix_path(&self) -> Option<&Path> {
        None
    }
}

impl Connect for Path {
    type Stream = UnixChannel;

    fn open(&self) -> impl Future<Output = Result<UnixChannel, ClientError>> + Send {
        UnixChannel::connect(self, Descriptors::Refused)
    }

    fn halves(stream: UnixChannel) -> (Rx, Tx) {
        let (rx, tx) = stream.into_halves();
        (Box::new(rx), Box::new(tx))
    }

    fn unix_path(&self) -> Option<&Path> {
        Some(self)
    }
}

impl Connect for PathBuf {
    type Stream = UnixChannel;

    fn open(&self) -> impl Future<Output = Result<UnixChannel, ClientError>> + Send {
        self.as_path().open()
    }

    fn halves(stream: UnixChannel) -> (Rx, Tx) {
        Path::halves(stream)
    }

    fn unix_path(&self) -> Option<&Path> {
        Some(self.as_path())
    }
}

/// Connects and exchanges hellos within `timeout`.
///
/// # Errors
/// [`ClientError::Gone`] when nobody listens at `socket`; otherwise as the exchange fails.
pub async fn connect<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
) -> Result<(C::Stream, Hello), ClientError> {
    connect_with(socket, timeout, None).await
}

/// Connects, sends the hello and (when given) the request in one write, so the request
/// costs no round trip of its own, and reads the supervisor's hello within `timeout`.
async fn connect_with<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
    request: Option<&Request>,
) -> Result<(C::Stream, Hello), ClientError> {
    let mut stream = tokio::time::timeout(timeout, socket.open())
        .await
        .map_err(|_| ProtocolError::Timeout(millis(timeout)))??;
    let exchange = async {
        let mut bytes = socket.preamble().to_vec();
        bytes.extend_from_slice(&Frame::control(&Request::Hello { version: VERSION })?.encode());
        if let Some(request) = request {
            bytes.extend_from_slice(&Frame::control(request)?.encode());
        }
        stream.write_all(&bytes).await.map_err(|e| ProtocolError::Io(e.to_string()))?;
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        match frame.parse::<Reply>()? {
            Reply::Hello { version, features, protections } if version == VERSION => {
                Ok(Hello { features, protections })
            }
            Reply::Hello { version, .. } => {
                Err(ProtocolError::Version { ours: VERSION, theirs: version }.into())
            }
            Reply::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ProtocolError::Unexpected(format!("{other:?} instead of hello")).into()),
        }
    };
    let hello = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ProtocolError::Timeout(millis(timeout)))??;
    Ok((stream, hello))
}

/// Asks whether the supervisor is alive; returns its hello and how many commands run.
/// The ping goes in the hello's write: one round trip.
///
/// # Errors
/// As [`connect`].
pub async fn ping<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<(Hello, u32), ClientError> {
    let (mut stream, hello) = connect_with(socket, timeout, Some(&Request::Ping)).await?;
    let exchange = async {
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        match frame.parse::<Reply>()? {
            Reply::Pong { running, .. } => Ok(running),
            Reply::Error { code, message } => Err(ClientError::Refused { code, message }),
            other => Err(ProtocolError::Unexpected(format!("{other:?} instead of pong")).into()),
        }
    };
    let running = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| ProtocolError::Timeout(millis(timeout)))??;
    Ok((hello, running))
}

/// The sandbox's other processes, stopped by its supervisor ([`freeze`]) for as long as
/// this is held: dropping it closes the connection, and the supervisor continues them.
pub struct Frozen {
    _rx: Rx,
    _tx: Tx,
}

/// Asks the supervisor to stop every other process of the sandbox until the returned
/// [`Frozen`] is dropped (or the supervisor's own limit passes).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `unsupported` from a supervisor that is not
/// its pid namespace's init, or an older one.
pub async fn freeze<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<Frozen, ClientError> {
    let (mut rx, tx) = request_with(socket, timeout, &Request::Freeze).await?;
    let answer = async {
        let frame = read_frame(&mut rx).await?.ok_or(ProtocolError::Truncated)?;
        match refused(frame.parse::<Reply>()?)? {
            Reply::Done => Ok(()),
            other => Err(unexpected("instead of done", &other)),
        }
    };
    tokio::time::timeout(timeout, answer).await.map_err(|_| ProtocolError::Timeout(millis(timeout)))??;
    Ok(Frozen { _rx: rx, _tx: tx })
}

/// Asks the supervisor to end the sandbox (best effort: `Ok` once the request is sent).
///
/// # Errors
/// As [`connect`].
pub async fn shutdown<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<(), ClientError> {
    let (mut stream, _hello) = connect(socket, timeout).await?;
    write_frame(&mut stream, &Frame::control(&Request::Shutdown)?).await?;
    // Its end closes the connection.
    let _ = tokio::time::timeout(timeout, read_frame(&mut stream)).await;
    Ok(())
}

/// Runs one command to its end and collects its output (at most `spec.output_cap` bytes
/// per stream). Dropping the future closes the connection, which ends the command.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] when it could not start; a protocol error
/// when the supervisor misbehaves or does not answer within the command's timeout plus
/// `grace`.
pub async fn exec<C: Connect + ?Sized>(
    socket: &C,
    spec: &ExecSpec,
    stdin: &[u8],
    connect_timeout: Duration,
    grace: Duration,
) -> Result<ExecOutput, ClientError> {
    let mut stream = exec_stream(socket, spec, stdin.to_vec(), connect_timeout, grace).await?;
    let mut out = ExecOutput::default();
    loop {
        match stream.next_frame().await? {
            Some(OutputEvent::Stdout(bytes)) => out.stdout.extend_from_slice(&bytes),
            Some(OutputEvent::Stderr(bytes)) => out.stderr.extend_from_slice(&bytes),
            Some(OutputEvent::Exit(exit)) => {
                out.exit_code = exit.exit_code;
                out.timed_out = exit.timed_out;
                out.truncated = exit.truncated;
                return Ok(out);
            }
            None => return Err(ProtocolError::Truncated.into()),
        }
    }
}

/// A command's output as it arrives (see [`exec_stream`]).
pub struct ExecStream {
    rx: Rx,
    /// Feeds the command's input, then holds the write half open until the stream goes.
    _feeder: AbortOnDrop,
    deadline: Instant,
    limit: Duration,
    cap: u64,
    sent: [u64; 2],
    truncated: bool,
    done: bool,
    sandbox: Option<SandboxId>,
}

/// A task aborted when dropped, with what it holds (a dropped `JoinHandle` alone would
/// leave it running): an exec's feeder, which writes the command's input and then holds
/// the connection's write half open, so a caller that goes away at any point (before the
/// `started` reply too) closes both halves and ends the command; a tunnel's frame reader.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ExecStream {
    /// Names the sandbox for the port's errors.
    #[must_use]
    pub fn for_sandbox(mut self, sandbox: &SandboxId) -> Self {
        self.sandbox = Some(sandbox.clone());
        self
    }

    /// The next event; `Ok(None)` once the exit was returned.
    ///
    /// # Errors
    /// A protocol error, a timeout past the command's own plus the grace, or the
    /// supervisor's error.
    pub async fn next_frame(&mut self) -> Result<Option<OutputEvent>, ClientError> {
        loop {
            if self.done {
                return Ok(None);
            }
            let frame = tokio::time::timeout_at(self.deadline, read_frame(&mut self.rx))
                .await
                .map_err(|_| ProtocolError::Timeout(millis(self.limit)))??
                .ok_or(ProtocolError::Truncated)?;
            match frame.kind {
                FrameType::Stdout | FrameType::Stderr => {
                    let i = usize::from(frame.kind == FrameType::Stderr);
                    let room = self.cap.saturating_sub(self.sent[i]);
                    let keep = usize::try_from(room).unwrap_or(usize::MAX).min(frame.payload.len());
                    if keep < frame.payload.len() {
                        self.truncated = true;
                    }
                    if keep == 0 {
                        continue;
                    }
                    self.sent[i] += keep as u64;
                    let mut bytes = frame.payload;
                    bytes.truncate(keep);
                    return Ok(Some(if i == 0 {
                        OutputEvent::Stdout(bytes)
                    } else {
                        OutputEvent::Stderr(bytes)
                    }));
                }
                FrameType::Control => match refused(frame.parse::<Reply>()?)? {
                    Reply::Exit { code, timed_out, truncated } => {
                        self.done = true;
                        return Ok(Some(OutputEvent::Exit(ExitStatus {
                            exit_code: code,
                            timed_out,
                            truncated: truncated || self.truncated,
                        })));
                    }
                    other => return Err(unexpected("during exec", &other)),
                },
                other => {
                    return Err(ProtocolError::Unexpected(format!("a {other:?} frame during exec")).into());
                }
            }
        }
    }
}

#[async_trait]
impl OutputStream for ExecStream {
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError> {
        let sandbox = self.sandbox.clone();
        self.next_frame().await.map_err(|e| match &sandbox {
            Some(id) => driver_error(e, id, None),
            None => DriverError::Failed(Cause::new(e)),
        })
    }
}

/// Starts one command and hands its output over as it arrives (each stream capped at
/// `spec.output_cap` bytes; the rest is dropped and the exit says `truncated`). Standard
/// input is fed beside the reading, so a command that writes before it reads cannot
/// deadlock against the feed. The whole exchange has the command's timeout plus `grace`.
/// Dropping the stream closes the connection, which ends the command.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] with code `spawn` when the program could not
/// start.
pub async fn exec_stream<C: Connect + ?Sized>(
    socket: &C,
    spec: &ExecSpec,
    stdin: Vec<u8>,
    connect_timeout: Duration,
    grace: Duration,
) -> Result<ExecStream, ClientError> {
    let (stream, _hello) = connect_with(socket, connect_timeout, Some(&Request::Exec(spec.clone()))).await?;
    let (mut rx, mut tx) = C::halves(stream);
    let feeds = spec.stdin;
    let feeder = AbortOnDrop(tokio::spawn(async move {
        // A command that does not read its input may exit first: not an error.
        if feeds && write_data(&mut tx, FrameType::Stdin, &stdin).await.is_ok() {
            let _ = write_frame(&mut tx, &Frame { kind: FrameType::Stdin, payload: Vec::new() }).await;
        }
        // Keep the write half open until the stream goes: closing it cancels the command.
        std::future::pending::<()>().await;
        drop(tx);
    }));
    let limit = Duration::from_millis(spec.timeout_ms).saturating_add(grace);
    let deadline = Instant::now() + limit;
    let started = tokio::time::timeout_at(deadline, next_reply(&mut rx, None)).await;
    let started = match started {
        Ok(reply) => reply,
        Err(_) => Err(ProtocolError::Timeout(millis(limit)).into()),
    };
    match started {
        Ok(Reply::Started { .. }) => Ok(ExecStream {
            rx,
            _feeder: feeder,
            deadline,
            limit,
            cap: spec.output_cap,
            sent: [0, 0],
            truncated: false,
            done: false,
            sandbox: None,
        }),
        Ok(other) => Err(unexpected("instead of started", &other)),
        Err(e) => Err(e),
    }
}

/// Connects and sends `request` (in the same write as the hello).
async fn request_with<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
    request: &Request,
) -> Result<(Rx, Tx), ClientError> {
    let (stream, _hello) = connect_with(socket, timeout, Some(request)).await?;
    Ok(C::halves(stream))
}

/// The supervisor's egress `events` stream: the id of each connection a process made to
/// the proxy's loopback port.
pub struct Events {
    rx: Rx,
    _tx: Tx,
    hello: Hello,
}

impl Events {
    /// Whether the supervisor's hello lists `feature`.
    #[must_use]
    pub fn serves(&self, feature: &str) -> bool {
        self.hello.features.iter().any(|f| f == feature)
    }

    /// The next held connection's id; `None` when the supervisor closed the stream (the
    /// sandbox ended, or a newer stream replaced this one). No deadline: connections
    /// come when they come.
    ///
    /// # Errors
    /// A protocol error, or [`ClientError::Refused`].
    pub async fn next(&mut self) -> Result<Option<u64>, ClientError> {
        let Some(frame) = read_frame(&mut self.rx).await? else { return Ok(None) };
        match refused(frame.parse::<Reply>()?)? {
            Reply::Client { id } => Ok(Some(id)),
            other => Err(unexpected("on the events stream", &other)),
        }
    }
}

/// How many held egress connections the supervisor has handed over (`take`) and relayed
/// in frames (`tunnel`) so far: which path a driver's egress takes.
///
/// # Errors
/// As [`ping`].
pub async fn egress_counts<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
) -> Result<EgressCounts, ClientError> {
    let (mut rx, _tx) = request_with(socket, timeout, &Request::Ping).await?;
    match next_reply(&mut rx, Some(timeout)).await? {
        Reply::Pong { egress_taken, egress_tunnelled, .. } => {
            Ok(EgressCounts { taken: egress_taken, tunnelled: egress_tunnelled })
        }
        other => Err(unexpected("instead of pong", &other)),
    }
}

/// Opens the egress `events` stream.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `unsupported` when the supervisor serves no
/// egress.
pub async fn events<C: Connect + ?Sized>(socket: &C, timeout: Duration) -> Result<Events, ClientError> {
    let (stream, hello) = connect_with(socket, timeout, Some(&Request::Events)).await?;
    let (rx, tx) = C::halves(stream);
    Ok(Events { rx, _tx: tx, hello })
}

/// Takes held connection `id` over the unix socket at `socket`: the supervisor's `taken`
/// reply carries the client's TCP connection (`SCM_RIGHTS`). The descriptor is treated as
/// hostile: exactly one, of a connected-stream socket in `AF_INET`/`AF_INET6`, or the
/// request fails (and every descriptor received is closed, off this thread:
/// [`super::closer`]); it is never trusted to stay non-blocking, and its close never
/// waits here ([`TakenTcp`]).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `not_found` when the connection is no longer
/// held; [`ProtocolError::Unexpected`] for a reply without exactly one such descriptor.
pub async fn take(socket: &Path, id: u64, timeout: Duration) -> Result<TakenTcp, ClientError> {
    let (_stream, fd) = one_descriptor(socket, &Request::Take { id }, "taken", timeout).await?;
    TakenTcp::new(fd).map_err(|why| ProtocolError::Unexpected(format!("taken: {why}")).into())
}

/// A unix socket whose connection's one reply may name descriptors (`take`):
/// everything else on it refuses them as any connection does ([`super::channel`]).
struct Naming<'a>(&'a Path);

impl Connect for Naming<'_> {
    type Stream = UnixChannel;

    fn open(&self) -> impl Future<Output = Result<UnixChannel, ClientError>> + Send {
        UnixChannel::connect(self.0, Descriptors::Named)
    }
}

/// Sends `request` and reads its reply, which must be `expected` (by its wire name) with
/// exactly one descriptor: the connection, kept open, and the descriptor. A descriptor
/// with the hello is refused as with any reply that names none.
async fn one_descriptor(
    socket: &Path,
    request: &Request,
    expected: &str,
    timeout: Duration,
) -> Result<(UnixChannel, SandboxFd), ClientError> {
    let (stream, _hello) = connect_with(&Naming(socket), timeout, Some(request)).await?;
    let (frame, fds) = tokio::time::timeout(timeout, stream.recv_named())
        .await
        .map_err(|_| ProtocolError::Timeout(millis(timeout)))??;
    match refused(frame.parse::<Reply>()?)? {
        Reply::Taken if expected == "taken" => {}
        Reply::Connected if expected == "connected" => {}
        other => return Err(unexpected(&format!("instead of {expected}"), &other)),
    }
    let mut fds = fds.into_iter();
    let (Some(fd), None) = (fds.next(), fds.next()) else {
        return Err(
            ProtocolError::Unexpected(format!("{expected} came without exactly one descriptor")).into()
        );
    };
    Ok((stream, fd))
}

/// A connection to a port of the sandbox ([`connect_port`]).
pub enum PortConnection {
    /// The connected socket itself, handed over (a unix channel).
    Taken(TakenTcp),
    /// The connection's bytes as data frames on the supervisor's connection (a
    /// port-forward): the halves, once the supervisor answered `tunnel`.
    Framed(Rx, Tx),
}

/// Asks the supervisor to connect to `port` on the sandbox's own loopback: over a unix
/// socket the connected socket is handed over (`connected` with its descriptor, checked as
/// `take`'s is: [`TakenTcp`]), else its bytes are relayed in frames (`tunnel`).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `invalid` (a port the lane serves),
/// `unreachable` (nothing accepts on it), `unsupported` (a supervisor without `connect`).
pub async fn connect_port<C: Connect + ?Sized>(
    socket: &C,
    port: u16,
    timeout: Duration,
) -> Result<PortConnection, ClientError> {
    // The supervisor's own wait for the port comes on top of the channel's.
    let timeout = timeout + Duration::from_millis(supervisor::protocol::CONNECT_TIMEOUT_MS);
    if let Some(path) = socket.unix_path() {
        let request = Request::Connect { port, hand_over: true };
        let (_stream, fd) = one_descriptor(path, &request, "connected", timeout).await?;
        let tcp = TakenTcp::new(fd).map_err(|why| ProtocolError::Unexpected(format!("connected: {why}")))?;
        return Ok(PortConnection::Taken(tcp));
    }
    let (mut rx, tx) = request_with(socket, timeout, &Request::Connect { port, hand_over: false }).await?;
    match next_reply(&mut rx, Some(timeout)).await? {
        Reply::Tunnel => Ok(PortConnection::Framed(rx, tx)),
        other => Err(unexpected("instead of a tunnel", &other)),
    }
}

/// Opens the tunnel of held connection `id`: once the supervisor answers `tunnel`, the
/// halves carry its bytes as data frames (an empty one ends a direction).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `not_found` when the connection is no longer
/// held.
pub async fn tunnel<C: Connect + ?Sized>(
    socket: &C,
    id: u64,
    timeout: Duration,
) -> Result<(Rx, Tx), ClientError> {
    let (mut rx, tx) = request_with(socket, timeout, &Request::Tunnel { id }).await?;
    match next_reply(&mut rx, Some(timeout)).await? {
        Reply::Tunnel => Ok((rx, tx)),
        other => Err(unexpected("instead of a tunnel", &other)),
    }
}

/// Starts a background process with `stdin` as its first input; its status.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] (`resource_exhausted`, `spawn`).
pub async fn process_start<C: Connect + ?Sized>(
    socket: &C,
    start: &ProcessStart,
    stdin: &[u8],
    timeout: Duration,
) -> Result<ProcessStatus, ClientError> {
    let request = Request::ProcessStart(start.clone());
    let (mut rx, mut tx) = if start.terminal.is_some() {
        // An earlier supervisor would start it on pipes, taking the terminal for a field it
        // does not know: asked only once its hello says it makes terminals.
        let (stream, hello) = connect_with(socket, timeout, None).await?;
        if !hello.features.iter().any(|f| f == "terminals") {
            return Err(ClientError::Refused {
                code: "unsupported".into(),
                message: "this supervisor makes no terminals".into(),
            });
        }
        let (rx, mut tx) = C::halves(stream);
        write_frame(&mut tx, &Frame::control(&request)?).await?;
        (rx, tx)
    } else {
        request_with(socket, timeout, &request).await?
    };
    // Within the operation's deadline: a supervisor that reads the request and never its
    // stdin holds no start (and its command's place) for the sandbox's life.
    let send = async {
        write_data(&mut tx, FrameType::Stdin, stdin).await?;
        write_frame(&mut tx, &Frame { kind: FrameType::Stdin, payload: Vec::new() }).await
    };
    tokio::time::timeout(OP_TIMEOUT, send)
        .await
        .map_err(|_| ProtocolError::Timeout(millis(OP_TIMEOUT)))??;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Process(status) => Ok(status),
        other => Err(unexpected("instead of a process", &other)),
    }
}

/// The kept background processes.
///
/// # Errors
/// As [`connect`].
pub async fn process_list<C: Connect + ?Sized>(
    socket: &C,
    timeout: Duration,
) -> Result<Vec<ProcessStatus>, ClientError> {
    let (mut rx, _tx) = request_with(socket, timeout, &Request::ProcessList).await?;
    let mut out = Vec::new();
    let mut held = 0usize;
    let deadline = Instant::now() + OP_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match next_reply(&mut rx, Some(left)).await? {
            Reply::Process(status) if out.len() < MAX_LISTED => {
                held += held_by(&status);
                if held > MAX_PROCESS_LISTING_BYTES {
                    return Err(ProtocolError::Unexpected("a process listing past its bound".into()).into());
                }
                out.push(status);
            }
            Reply::End => return Ok(out),
            other => return Err(unexpected("in a process listing", &other)),
        }
    }
}

/// One background process.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `no_such_process`.
pub async fn process_status<C: Connect + ?Sized>(
    socket: &C,
    pid: u32,
    timeout: Duration,
) -> Result<ProcessStatus, ClientError> {
    let (mut rx, _tx) = request_with(socket, timeout, &Request::ProcessStatus { pid }).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Process(status) => Ok(status),
        other => Err(unexpected("instead of a process", &other)),
    }
}

/// Writes to a background process's input (then closes it, when `close`).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `no_such_process`, `conflict`.
pub async fn process_stdin<C: Connect + ?Sized>(
    socket: &C,
    pid: u32,
    bytes: &[u8],
    close: bool,
    timeout: Duration,
) -> Result<(), ClientError> {
    let (mut rx, mut tx) = request_with(socket, timeout, &Request::ProcessStdin { pid, close }).await?;
    // An unknown pid is answered before the bytes are read: the answer tells.
    let fed = async {
        write_data(&mut tx, FrameType::Stdin, bytes).await?;
        write_frame(&mut tx, &Frame { kind: FrameType::Stdin, payload: Vec::new() }).await
    };
    let _ = fed.await;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Done => Ok(()),
        other => Err(unexpected("instead of done", &other)),
    }
}

/// Sends `signal` (`TERM`, `INT`, `KILL`) to a background process's group.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `no_such_process`, `conflict`.
pub async fn process_signal<C: Connect + ?Sized>(
    socket: &C,
    pid: u32,
    signal: &str,
    timeout: Duration,
) -> Result<(), ClientError> {
    let request = Request::ProcessSignal { pid, signal: signal.to_owned() };
    let (mut rx, _tx) = request_with(socket, timeout, &request).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Done => Ok(()),
        other => Err(unexpected("instead of done", &other)),
    }
}

/// An input stream to a background process (see [`process_input`]).
pub struct Input {
    _rx: Rx,
    tx: Tx,
    sandbox: SandboxId,
    pid: u32,
}

#[async_trait]
impl ports::ProcessInput for Input {
    async fn send(&mut self, input: domain::TerminalInput) -> Result<(), DriverError> {
        let sent = match input {
            domain::TerminalInput::Bytes(bytes) if bytes.is_empty() => Ok(()),
            domain::TerminalInput::Bytes(bytes) => write_data(&mut self.tx, FrameType::Stdin, &bytes).await,
            domain::TerminalInput::Resize(size) => {
                let resize = Request::ProcessResize { pid: self.pid, cols: size.cols(), rows: size.rows() };
                match Frame::control(&resize) {
                    Ok(frame) => write_frame(&mut self.tx, &frame).await,
                    Err(e) => Err(e),
                }
            }
        };
        // The supervisor closes the stream when the process ends.
        sent.map_err(|_| {
            DriverError::Conflict(format!(
                "sandbox {}: the input of process {} is closed",
                self.sandbox, self.pid
            ))
        })
    }
}

/// Opens an input stream to a background process: keystrokes written as they come,
/// resizes applied (see the protocol's `process_input`).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `no_such_process`, `conflict`, `unsupported`.
pub async fn process_input<C: Connect + ?Sized>(
    socket: &C,
    sandbox: &SandboxId,
    pid: u32,
    timeout: Duration,
) -> Result<Input, ClientError> {
    let (mut rx, tx) = request_with(socket, timeout, &Request::ProcessInput { pid }).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Done => Ok(Input { _rx: rx, tx, sandbox: sandbox.clone(), pid }),
        other => Err(unexpected("instead of done", &other)),
    }
}

/// A background process's output (see [`process_output`]).
pub struct ProcessOutput {
    rx: Rx,
    _tx: Tx,
    follow: bool,
    /// Without `follow`, when the replay must have ended ([`OP_TIMEOUT`] after it began):
    /// a supervisor that streams on and never sends its end holds no reader longer.
    deadline: tokio::time::Instant,
    done: bool,
    sandbox: SandboxId,
    pid: u32,
}

#[async_trait]
impl OutputStream for ProcessOutput {
    async fn next(&mut self) -> Result<Option<OutputEvent>, DriverError> {
        if self.done {
            return Ok(None);
        }
        let read = async {
            let frame = if self.follow {
                read_frame(&mut self.rx).await?
            } else {
                tokio::time::timeout_at(self.deadline, read_frame(&mut self.rx))
                    .await
                    .map_err(|_| ProtocolError::Timeout(millis(OP_TIMEOUT)))??
            };
            let frame = frame.ok_or(ProtocolError::Truncated)?;
            Ok::<_, ClientError>(match frame.kind {
                FrameType::Stdout => Some(OutputEvent::Stdout(frame.payload)),
                FrameType::Stderr => Some(OutputEvent::Stderr(frame.payload)),
                FrameType::Control => match refused(frame.parse::<Reply>()?)? {
                    Reply::Exit { code, timed_out, truncated } => {
                        Some(OutputEvent::Exit(ExitStatus { exit_code: code, timed_out, truncated }))
                    }
                    Reply::End => None,
                    other => return Err(unexpected("in a process's output", &other)),
                },
                other => {
                    return Err(ProtocolError::Unexpected(format!(
                        "a {other:?} frame in a process's output"
                    ))
                    .into());
                }
            })
        };
        let event = read.await.map_err(|e| driver_error(e, &self.sandbox, Some(self.pid)))?;
        if matches!(event, None | Some(OutputEvent::Exit(_))) {
            self.done = true;
        }
        Ok(event)
    }
}

/// A background process's output from the start of its buffer, then (with `follow`) as
/// it arrives.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] `no_such_process`.
pub async fn process_output<C: Connect + ?Sized>(
    socket: &C,
    sandbox: &SandboxId,
    pid: u32,
    follow: bool,
    timeout: Duration,
) -> Result<ProcessOutput, ClientError> {
    let (mut rx, tx) = request_with(socket, timeout, &Request::ProcessOutput { pid, follow }).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Replay { .. } => {
            let deadline = tokio::time::Instant::now() + OP_TIMEOUT;
            Ok(ProcessOutput { rx, _tx: tx, follow, deadline, done: false, sandbox: sandbox.clone(), pid })
        }
        other => Err(unexpected("instead of a replay", &other)),
    }
}

/// Bytes out of a sandbox (see [`file_read`], [`archive_read`]).
pub struct DataStream {
    rx: Rx,
    _tx: Tx,
    /// The exact size announced, for a file.
    size: Option<u64>,
    got: u64,
    done: bool,
    /// A chunk read ahead (an archive's first, read to tell an error up front).
    first: Option<Vec<u8>>,
    sandbox: SandboxId,
}

#[async_trait]
impl ByteStream for DataStream {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        if self.done {
            return Ok(None);
        }
        let sandbox = self.sandbox.clone();
        let fail = |e: ClientError| driver_error(e, &sandbox, None);
        let frame = tokio::time::timeout(IDLE_TIMEOUT, read_frame(&mut self.rx))
            .await
            .map_err(|_| fail(ProtocolError::Timeout(millis(IDLE_TIMEOUT)).into()))?
            .map_err(|e| fail(e.into()))?
            .ok_or_else(|| fail(ProtocolError::Truncated.into()))?;
        match frame.kind {
            FrameType::Data if !frame.payload.is_empty() => {
                self.got += frame.payload.len() as u64;
                if self.size.is_some_and(|size| self.got > size) {
                    return Err(fail(
                        ProtocolError::Unexpected("more bytes than the file's size".into()).into(),
                    ));
                }
                Ok(Some(frame.payload))
            }
            FrameType::Control => {
                match refused(frame.parse::<Reply>().map_err(|e| fail(e.into()))?).map_err(fail)? {
                    Reply::End if self.size.is_none_or(|size| self.got == size) => {
                        self.done = true;
                        Ok(None)
                    }
                    Reply::End => {
                        Err(fail(ProtocolError::Unexpected("fewer bytes than the file's size".into()).into()))
                    }
                    other => Err(fail(unexpected("in a transfer", &other))),
                }
            }
            other => Err(fail(ProtocolError::Unexpected(format!("a {other:?} frame in a transfer")).into())),
        }
    }
}

/// What [`file_read`] found.
pub enum FileRead {
    /// A regular file: its size, then its bytes.
    File(u64, DataStream),
    /// A directory: its entries, as they come.
    Directory(Listing),
}

/// A directory's entries as the supervisor sends them (see [`file_read`]): one `entries`
/// frame read per [`EntryStream::next`], so the server holds one frame of a listing, never
/// the listing; at most [`MAX_LISTING`] entries and 64 MiB of names in all
/// (past either, the stream fails: an honest supervisor refuses such a directory before
/// its first entry). Dropping it closes the connection, which ends the listing.
pub struct Listing {
    rx: Rx,
    _tx: Tx,
    /// The first entries, read ahead to tell an error up front.
    first: Option<Vec<WireEntry>>,
    entries: usize,
    bytes: usize,
    done: bool,
    sandbox: SandboxId,
    path: String,
}

impl Listing {
    /// Counts `batch` against the listing's bounds.
    fn count(&mut self, batch: &[WireEntry]) -> Result<(), ClientError> {
        self.entries += batch.len();
        self.bytes += batch.iter().map(|e| 64 + e.name.len() + e.kind.len()).sum::<usize>();
        if self.entries > MAX_LISTING || self.bytes > MAX_LISTING_BYTES {
            return Err(ClientError::Refused {
                code: "too_large".into(),
                message: format!("{} has more than {MAX_LISTING} entries", self.path),
            });
        }
        Ok(())
    }

    /// The next non-empty batch of the supervisor's entries; `None` at its `end`.
    async fn next_batch(&mut self) -> Result<Option<Vec<WireEntry>>, ClientError> {
        if let Some(first) = self.first.take() {
            return Ok(Some(first));
        }
        while !self.done {
            match next_reply(&mut self.rx, Some(IDLE_TIMEOUT)).await? {
                // An honest supervisor sends no empty batch: one that does could keep a
                // listing open for ever, a frame at a time within the idle deadline.
                Reply::Entries { entries } if entries.is_empty() => {
                    return Err(
                        ProtocolError::Unexpected("an empty batch in a directory listing".into()).into()
                    );
                }
                Reply::Entries { entries } => {
                    self.count(&entries)?;
                    return Ok(Some(entries));
                }
                Reply::End => self.done = true,
                other => return Err(unexpected("in a directory listing", &other)),
            }
        }
        Ok(None)
    }
}

#[async_trait]
impl EntryStream for Listing {
    async fn next(&mut self) -> Result<Option<Vec<DirEntry>>, DriverError> {
        match self.next_batch().await {
            Ok(batch) => Ok(batch.map(|batch| {
                batch
                    .into_iter()
                    .map(|e| DirEntry {
                        kind: EntryKind::parse(&e.kind).unwrap_or(EntryKind::Other),
                        name: e.name,
                        size: e.size,
                    })
                    .collect()
            })),
            Err(e) => {
                self.done = true;
                Err(driver_error(e, &self.sandbox, None))
            }
        }
    }
}

/// Reads a file, or lists a directory, at `path` inside the sandbox. A directory's first
/// entries are read before this returns (so a failure up front is told as such), the rest
/// as the [`Listing`] is read.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] (`not_found`, `invalid`, `too_large`).
pub async fn file_read<C: Connect + ?Sized>(
    socket: &C,
    sandbox: &SandboxId,
    path: &str,
    timeout: Duration,
) -> Result<FileRead, ClientError> {
    let (mut rx, tx) = request_with(socket, timeout, &Request::FileRead { path: path.to_owned() }).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::File { size } => Ok(FileRead::File(
            size,
            DataStream {
                rx,
                _tx: tx,
                size: Some(size),
                got: 0,
                done: false,
                first: None,
                sandbox: sandbox.clone(),
            },
        )),
        Reply::Directory => {
            let mut listing = Listing {
                rx,
                _tx: tx,
                first: None,
                entries: 0,
                bytes: 0,
                done: false,
                sandbox: sandbox.clone(),
                path: path.to_owned(),
            };
            listing.first = listing.next_batch().await?;
            Ok(FileRead::Directory(listing))
        }
        other => Err(unexpected("instead of a file or directory", &other)),
    }
}

/// A tar archive of the directory `path`, streamed.
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] (`not_found`, `invalid`).
pub async fn archive_read<C: Connect + ?Sized>(
    socket: &C,
    sandbox: &SandboxId,
    path: &str,
    timeout: Duration,
) -> Result<DataStream, ClientError> {
    let (rx, tx) = request_with(socket, timeout, &Request::ArchiveRead { path: path.to_owned() }).await?;
    // The first frame is data or an error: hand both to the stream (an error up front
    // is better told now).
    let mut stream =
        DataStream { rx, _tx: tx, size: None, got: 0, done: false, first: None, sandbox: sandbox.clone() };
    let first = tokio::time::timeout(IDLE_TIMEOUT, read_frame(&mut stream.rx))
        .await
        .map_err(|_| ProtocolError::Timeout(millis(IDLE_TIMEOUT)))??
        .ok_or(ProtocolError::Truncated)?;
    match first.kind {
        FrameType::Data if !first.payload.is_empty() => {
            stream.got = first.payload.len() as u64;
            stream.first = Some(first.payload);
            Ok(stream)
        }
        FrameType::Control => match refused(first.parse::<Reply>()?)? {
            Reply::End => {
                stream.done = true;
                Ok(stream)
            }
            other => Err(unexpected("instead of an archive", &other)),
        },
        other => Err(ProtocolError::Unexpected(format!("a {other:?} frame instead of an archive")).into()),
    }
}

/// Runs an upload: `request`, then the source's bytes as [`FrameType::Data`] frames and
/// the empty commit frame; the supervisor's answer. An answer before the commit is its
/// failure (the rest is not sent). A source that fails abandons the upload (the
/// connection is dropped before the commit, so nothing of it is kept).
async fn upload<C: Connect + ?Sized>(
    socket: &C,
    request: &Request,
    mut source: Box<dyn ByteSource>,
    timeout: Duration,
) -> Result<Reply, ClientError> {
    let (mut rx, mut tx) = request_with(socket, timeout, request).await?;
    let answer = read_frame(&mut rx);
    tokio::pin!(answer);
    let early = |got: Result<Option<Frame>, ProtocolError>| -> ClientError {
        match got {
            Ok(Some(frame)) => match frame.parse::<Reply>() {
                Ok(Reply::Error { code, message }) => ClientError::Refused { code, message },
                Ok(other) => unexpected("before the upload ended", &other),
                Err(e) => e.into(),
            },
            Ok(None) => ProtocolError::Truncated.into(),
            Err(e) => e.into(),
        }
    };
    // The source's chunks are gathered into frames of UPLOAD_FRAME bytes: fewer frames,
    // fewer system calls and wake-ups on both sides (an upload is not interactive; the
    // commit waits for the end anyway).
    let mut pending: Vec<u8> = Vec::with_capacity(UPLOAD_FRAME);
    loop {
        tokio::select! {
            biased;
            got = &mut answer => return Err(early(got)),
            next = tokio::time::timeout(IDLE_TIMEOUT, source.next()) => {
                let last = match next {
                    Ok(Ok(Some(bytes))) => {
                        pending.extend_from_slice(&bytes);
                        false
                    }
                    Ok(Ok(None)) => true,
                    Ok(Err(e)) => return Err(ClientError::Source(e)),
                    Err(_) => {
                        return Err(ClientError::Source(SourceError(format!(
                            "no bytes came for {} s",
                            IDLE_TIMEOUT.as_secs()
                        ))));
                    }
                };
                let written = async {
                    while pending.len() >= UPLOAD_FRAME || (last && !pending.is_empty()) {
                        let n = pending.len().min(UPLOAD_FRAME);
                        let rest = pending.split_off(n);
                        let frame = Frame { kind: FrameType::Data, payload: std::mem::replace(&mut pending, rest) };
                        write_frame(&mut tx, &frame).await?;
                    }
                    if last {
                        // The commit: an empty data frame.
                        write_frame(&mut tx, &Frame { kind: FrameType::Data, payload: Vec::new() }).await?;
                    }
                    Ok::<(), ProtocolError>(())
                };
                // A supervisor that stops reading but keeps the connection open would hold
                // the upload (and its file-operation place) forever: each write has the
                // idle deadline too.
                let written = match tokio::time::timeout(IDLE_TIMEOUT, written).await {
                    Ok(written) => written,
                    Err(_) => Err(ProtocolError::Unexpected(format!(
                        "the supervisor took no upload bytes for {} s",
                        IDLE_TIMEOUT.as_secs()
                    ))),
                };
                if let Err(e) = written {
                    // It stopped reading (it failed, and answered why, or it is gone).
                    return Err(match tokio::time::timeout(Duration::from_secs(5), &mut answer).await {
                        Ok(got) => early(got),
                        Err(_) => e.into(),
                    });
                }
                if last {
                    break;
                }
            }
        }
    }
    let frame = tokio::time::timeout(OP_TIMEOUT, &mut answer)
        .await
        .map_err(|_| ProtocolError::Timeout(millis(OP_TIMEOUT)))??
        .ok_or(ProtocolError::Truncated)?;
    refused(frame.parse::<Reply>()?)
}

/// Writes the file at `path` from `source`; its size.
///
/// # Errors
/// As [`connect`]; [`ClientError::Source`]; [`ClientError::Refused`] (`invalid`,
/// `conflict`, `too_large`, `resource_exhausted`).
pub async fn file_write<C: Connect + ?Sized>(
    socket: &C,
    path: &str,
    source: Box<dyn ByteSource>,
    timeout: Duration,
) -> Result<u64, ClientError> {
    match upload(socket, &Request::FileWrite { path: path.to_owned() }, source, timeout).await? {
        Reply::Written { bytes } => Ok(bytes),
        other => Err(unexpected("instead of written", &other)),
    }
}

/// Unpacks the tar archive `source` into the directory `path`; (entries, bytes).
///
/// # Errors
/// As [`file_write`].
pub async fn archive_write<C: Connect + ?Sized>(
    socket: &C,
    path: &str,
    source: Box<dyn ByteSource>,
    timeout: Duration,
) -> Result<(u64, u64), ClientError> {
    match upload(socket, &Request::ArchiveWrite { path: path.to_owned() }, source, timeout).await? {
        Reply::Unpacked { entries, bytes } => Ok((entries, bytes)),
        other => Err(unexpected("instead of unpacked", &other)),
    }
}

/// Deletes `path` (with `recursive`, a directory and everything in it).
///
/// # Errors
/// As [`connect`]; [`ClientError::Refused`] (`not_found`, `conflict`, `invalid`).
pub async fn file_delete<C: Connect + ?Sized>(
    socket: &C,
    path: &str,
    recursive: bool,
    timeout: Duration,
) -> Result<(), ClientError> {
    let request = Request::FileDelete { path: path.to_owned(), recursive };
    let (mut rx, _tx) = request_with(socket, timeout, &request).await?;
    match next_reply(&mut rx, Some(OP_TIMEOUT)).await? {
        Reply::Done => Ok(()),
        other => Err(unexpected("instead of done", &other)),
    }
}

#[cfg(test)]
mod tests;
