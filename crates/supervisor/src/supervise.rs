//! The supervisor itself: the process that runs as PID 1 inside a sandbox
//! (`sandlane-supervisor`), serving the server over [`crate::protocol`].
//!
//! One thread, one current-thread tokio runtime. It makes itself non-dumpable (so a
//! process of the same uid can neither ptrace it nor open its `/proc/1/mem` or fds),
//! installs the seccomp filter before it serves anything, then accepts connections on its
//! listening socket, refusing peers inside its own pid namespace (`SO_PEERCRED` reports
//! pid 0 only for a peer outside). Each command is its child in a process group of its
//! own, with exactly the environment the request gives; `SIGCHLD` reaps every child,
//! orphans included (it is the namespace's init). A command's timeout, or the server
//! closing the connection, kills the command's process group.
//!
//! Background processes ([`crate::processes`]) are children too, kept past their
//! connection. File and archive operations ([`crate::fs`]) run on a thread each, so a
//! slow disk never stalls the event loop; in a container, where the supervisor runs as
//! root, it takes the sandbox user's filesystem ids at start, so they act as that user.
//! `SIGXFSZ` is ignored (a write past the file size limit fails with `EFBIG`, which the
//! files API reports) and restored to its default in every command.
//!
//! Every command and background process starts with `oom_score_adj` 1000, the supervisor
//! keeping its own (`OomShield`): when the sandbox runs out of memory the kernel ends a
//! command, never the supervisor (whose mapped binary can outweigh a command that is still
//! growing), so the sandbox keeps serving.

use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use domain::SandboxPath;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use crate::fs::{self, FsError, Piece, ReadPart};
use crate::processes::{self, Input, Proc, Table};
use crate::protocol::{
    DATA_CHUNK, ExecSpec, Frame, FrameType, ProcessStart, Protections, ProtocolError, Reply, Request, Rlimit,
    VERSION, read_frame, write_data, write_frame,
};

/// How long a new connection may take to say hello and make its request.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// How the supervisor is started.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SuperviseOptions {
    /// A listening unix socket inherited from the server (bubblewrap).
    pub listen_fd: Option<RawFd>,
    /// A path to bind the listening socket at (containers).
    pub socket: Option<PathBuf>,
    /// A loopback TCP address to listen on behind the channel key (Kubernetes pods;
    /// see [`crate::gate`]).
    pub tcp: Option<(std::net::SocketAddr, crate::gate::ChannelKey)>,
    /// `uid:gid` commands run as (the supervisor must then hold `CAP_SETUID`/`CAP_SETGID`).
    pub user: Option<(u32, u32)>,
    /// Whether to install the seccomp filter.
    pub seccomp: bool,
    /// The loopback port to serve the egress proxy on (none: no egress).
    pub egress_port: Option<u16>,
    /// `RLIMIT_FSIZE` the supervisor sets on itself at start, so what the files API
    /// writes is held to the sandbox's file size limit where nothing set it on the
    /// supervisor from outside (a Kubernetes pod has no rlimits of its own; bubblewrap and
    /// containers set it before the supervisor starts).
    pub file_size_limit: Option<u64>,
}

/// The operations every supervisor serves (its hello's `features`); `egress`,
/// and `egress_take` are added when it serves the egress proxy.
pub const FEATURES: &[&str] =
    &["exec", "ping", "shutdown", "processes", "files", "archive", "freeze", "terminals", "connect"];

/// The most standard input one `process_start` or `process_stdin` carries.
const MAX_STDIN: usize = 16 << 20;

/// Who waits for a child's exit status.
enum Waiter {
    /// An exec's connection.
    Command(oneshot::Sender<i32>),
    /// A background process (marked reaped as it is reaped) and its output pump.
    Process(Arc<Proc>, oneshot::Sender<i32>),
}

struct State {
    /// Children waiting for their exit status, by pid.
    waiting: Mutex<HashMap<i32, Waiter>>,
    running: AtomicU32,
    protections: Protections,
    user: Option<(u32, u32)>,
    /// The background processes.
    table: Table,
    /// The egress proxy's held connections, when it serves egress.
    egress: Option<Arc<crate::egress::Held>>,
    /// The ports the lane serves on the sandbox's loopback (the gate, the egress port):
    /// never open to a preview's `connect`.
    lane_ports: Vec<u16>,
    /// Raises the supervisor's OOM score while it forks a command (none: `/proc` could not
    /// be opened at start; commands then share the supervisor's score).
    oom: Option<OomShield>,
}

/// The OOM score a command starts with: the largest, so a sandbox out of memory ends one
/// of its commands, never the supervisor.
const COMMAND_OOM_SCORE_ADJ: &[u8] = b"1000";

/// The supervisor's own `/proc/self/oom_score_adj`, opened at start while the supervisor
/// is still dumpable (once it is not, the file belongs to root and a supervisor without
/// privileges could no longer open it), with the value it started with.
///
/// A child inherits its parent's score at fork, and a process may raise its score but not
/// lower it below the minimum its host set (a forked child, not dumpable either, could
/// not open the file before its `exec`). So the supervisor raises its own score to
/// [`COMMAND_OOM_SCORE_ADJ`] around each fork and then returns to the value it started
/// with, which is never below that minimum. Only during a fork (a fraction of a
/// millisecond; one at a time, on the supervisor's one thread) is the supervisor itself
/// the first choice of the OOM killer.
struct OomShield {
    file: std::fs::File,
    own: Vec<u8>,
}

impl OomShield {
    fn open() -> Option<Self> {
        let path = "/proc/self/oom_score_adj";
        let own = std::fs::read(path).ok()?;
        let own = own.trim_ascii().to_vec();
        let file = std::fs::OpenOptions::new().write(true).open(path).ok()?;
        Some(Self { file, own })
    }

    /// Runs `fork` with the supervisor's score raised, so what it forks starts raised.
    fn around<T>(&self, fork: impl FnOnce() -> T) -> T {
        use std::os::unix::fs::FileExt;
        let raised = self.file.write_all_at(COMMAND_OOM_SCORE_ADJ, 0).is_ok();
        let forked = fork();
        if raised {
            // Back to the start value (allowed: it is at or above the host's minimum).
            let _ = self.file.write_all_at(&self.own, 0);
        }
        forked
    }
}

/// Writes one line of the supervisor's own diagnostics to its standard error, which the
/// drivers point at a log of a fixed size (under bubblewrap, 64 KiB sealed against
/// growing): a write that fails there (the log is full) is ignored, where `eprintln!`
/// would panic and end the sandbox with its init.
pub fn diagnose(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(io::stderr(), "{}: {line}", crate::PROGRAM);
}

/// Runs the supervisor until it is killed (or, in a container, sent `SIGTERM`). Returns
/// the process exit code when it cannot start.
pub fn supervise(options: &SuperviseOptions) -> i32 {
    match start(options) {
        Ok(()) => 0,
        Err(e) => {
            diagnose(format_args!("{e}"));
            70
        }
    }
}

#[allow(unsafe_code)]
fn start(options: &SuperviseOptions) -> Result<(), String> {
    // Before the supervisor stops being dumpable (see `OomShield`).
    let oom = OomShield::open();
    // SAFETY: prctl with integer arguments only changes this process's flags.
    let non_dumpable = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == 0;
    let seccomp = if options.seccomp {
        crate::seccomp::install()?;
        true
    } else {
        false
    };
    let protections = Protections { seccomp, pid_namespace: std::process::id() == 1, non_dumpable };
    // SAFETY: setting a signal's disposition to "ignore" touches no memory.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if let Some(bytes) = options.file_size_limit {
        let limit = libc::rlimit { rlim_cur: bytes, rlim_max: bytes };
        // SAFETY: setrlimit reads the struct it is given and changes this process's limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &raw const limit) } != 0 {
            return Err(format!("cannot set the file size limit: {}", io::Error::last_os_error()));
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    runtime.block_on(async move {
        let listener = if options.tcp.is_some() && options.listen_fd.is_none() && options.socket.is_none() {
            None
        } else {
            Some(listener(options)?)
        };
        let gate = match &options.tcp {
            Some((addr, key)) => Some((crate::gate::bind(*addr)?, key.clone())),
            None => None,
        };
        let egress = match options.egress_port {
            Some(port) => {
                let held = crate::egress::serve(port).await.map_err(|e| {
                    format!("cannot listen on the sandbox's loopback port {port} for egress: {e}")
                })?;
                Some(held)
            }
            None => None,
        };
        if let Some((uid, gid)) = options.user {
            // Files are read and written as the sandbox user (see the module's doc).
            fs::drop_fs_identity(uid, gid)
                .map_err(|e| format!("cannot take the sandbox user's file ids: {e}"))?;
        }
        let state = Arc::new(State {
            waiting: Mutex::new(HashMap::new()),
            running: AtomicU32::new(0),
            protections,
            user: options.user,
            table: Table::default(),
            egress,
            lane_ports: options.tcp.iter().map(|(addr, _)| addr.port()).chain(options.egress_port).collect(),
            oom,
        });
        serve(listener, gate, state).await
    })
}

#[allow(unsafe_code)]
fn listener(options: &SuperviseOptions) -> Result<UnixListener, String> {
    let std_listener = if let Some(fd) = options.listen_fd {
        // SAFETY: the server hands this descriptor over at exec; nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: F_SETFD on a descriptor this process owns; commands must not inherit it.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        std::os::unix::net::UnixListener::from(owned)
    } else if let Some(path) = &options.socket {
        let _ = std::fs::remove_file(path);
        let l = std::os::unix::net::UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
        l
    } else {
        return Err("no listening socket: pass --listen-fd, --socket or --tcp".to_owned());
    };
    std_listener.set_nonblocking(true).map_err(|e| format!("listening socket: {e}"))?;
    UnixListener::from_std(std_listener).map_err(|e| format!("listening socket: {e}"))
}

/// Accepts on the unix listener when there is one; pends forever otherwise.
async fn accept_unix(
    listener: Option<&UnixListener>,
) -> io::Result<(UnixStream, tokio::net::unix::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Accepts on the TCP gate when there is one; pends forever otherwise.
async fn accept_tcp(
    gate: Option<&(tokio::net::TcpListener, crate::gate::ChannelKey)>,
) -> io::Result<tokio::net::TcpStream> {
    match gate {
        Some((l, _)) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn serve(
    listener: Option<UnixListener>,
    gate: Option<(tokio::net::TcpListener, crate::gate::ChannelKey)>,
    state: Arc<State>,
) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut children = signal(SignalKind::child()).map_err(|e| format!("SIGCHLD: {e}"))?;
    let mut terminate = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM: {e}"))?;
    loop {
        tokio::select! {
            accepted = accept_tcp(gate.as_ref()) => match accepted {
                Ok(tcp) => {
                    // Admitted by the channel key instead of the peer's pid namespace.
                    let key = gate.as_ref().map(|(_, k)| k.clone());
                    let state = state.clone();
                    tokio::spawn(async move {
                        if let Some(key) = key
                            && let Some(stream) = crate::gate::admit(tcp, &key).await
                        {
                            connection(stream, state).await;
                        }
                    });
                }
                Err(e) => {
                    diagnose(format_args!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            accepted = accept_unix(listener.as_ref()) => match accepted {
                Ok((stream, _)) => {
                    // Only a peer outside this pid namespace (the server) reports pid 0.
                    let outside = stream.peer_cred().is_ok_and(|c| c.pid() == Some(0));
                    if state.protections.pid_namespace && !outside {
                        continue;
                    }
                    let state = state.clone();
                    tokio::spawn(async move { connection(stream, state).await });
                }
                Err(e) => {
                    diagnose(format_args!("accept: {e}"));
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            _ = children.recv() => reap(&state),
            _ = terminate.recv() => return Ok(()),
        }
    }
}

/// Reaps every child that has exited: commands get their status, orphans just go.
#[allow(unsafe_code)]
fn reap(state: &State) {
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        let pid = unsafe { libc::waitpid(-1, &raw mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else if libc::WIFSIGNALED(status) {
            128 + libc::WTERMSIG(status)
        } else {
            continue;
        };
        match state.waiting.lock().ok().and_then(|mut w| w.remove(&pid)) {
            Some(Waiter::Command(tx)) => {
                let _ = tx.send(code);
            }
            Some(Waiter::Process(proc, tx)) => {
                proc.set_reaped();
                let _ = tx.send(code);
            }
            None => {}
        }
    }
}

async fn send(stream: &mut (impl AsyncWriteExt + Unpin), reply: &Reply) -> Result<(), ProtocolError> {
    write_frame(stream, &Frame::control(reply)?).await
}

fn error(code: &str, message: impl Into<String>) -> Reply {
    Reply::Error { code: code.to_owned(), message: message.into() }
}

async fn connection(mut stream: UnixStream, state: Arc<State>) {
    let handshake = async {
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        match frame.parse::<Request>()? {
            Request::Hello { version } if version == VERSION => {}
            Request::Hello { version } => {
                let theirs = ProtocolError::Version { ours: VERSION, theirs: version };
                let _ = send(&mut stream, &error("version", theirs.to_string())).await;
                return Err(theirs);
            }
            _ => return Err(ProtocolError::Unexpected("the first message must be hello".to_owned())),
        }
        let hello = Reply::Hello {
            version: VERSION,
            features: FEATURES
                .iter()
                .copied()
                .chain(state.egress.iter().flat_map(|_| ["egress", "egress_take"]))
                .map(str::to_owned)
                .collect(),
            protections: state.protections.clone(),
        };
        send(&mut stream, &hello).await?;
        let frame = read_frame(&mut stream).await?.ok_or(ProtocolError::Truncated)?;
        frame.parse::<Request>()
    };
    let request = match tokio::time::timeout(HANDSHAKE, handshake).await {
        Ok(Ok(request)) => request,
        Ok(Err(e)) => {
            let _ = send(&mut stream, &error("bad_request", e.to_string())).await;
            return;
        }
        Err(_) => return,
    };
    match request {
        Request::Ping => {
            let running = state.running.load(Ordering::Relaxed);
            let counts = state.egress.as_ref().map(|held| crate::egress::counts(held)).unwrap_or_default();
            let reply =
                Reply::Pong { running, egress_taken: counts.taken, egress_tunnelled: counts.tunnelled };
            let _ = send(&mut stream, &reply).await;
        }
        Request::Exec(spec) => exec(stream, spec, &state).await,
        Request::Shutdown => std::process::exit(0),
        Request::ProcessStart(start) => process_start(stream, start, &state).await,
        Request::ProcessList => {
            for proc in state.table.all() {
                if send(&mut stream, &Reply::Process(proc.status())).await.is_err() {
                    return;
                }
            }
            let _ = send(&mut stream, &Reply::End).await;
        }
        Request::ProcessStatus { pid } => match state.table.get(pid) {
            Some(proc) => {
                let _ = send(&mut stream, &Reply::Process(proc.status())).await;
            }
            None => {
                let _ = send(&mut stream, &no_such_process(pid)).await;
            }
        },
        Request::ProcessOutput { pid, follow } => process_output(stream, pid, follow, &state).await,
        Request::ProcessStdin { pid, close } => process_stdin(stream, pid, close, &state).await,
        Request::ProcessSignal { pid, signal } => {
            let reply = process_signal(pid, &signal, &state);
            let _ = send(&mut stream, &reply).await;
        }
        Request::ProcessResize { pid, cols, rows } => {
            let reply = process_resize(pid, cols, rows, &state);
            let _ = send(&mut stream, &reply).await;
        }
        Request::ProcessInput { pid } => process_input(stream, pid, &state).await,
        Request::Freeze => freeze(stream).await,
        Request::FileRead { path } => file_read(stream, &path).await,
        Request::FileWrite { path } => upload(stream, &path, Upload::File).await,
        Request::FileDelete { path, recursive } => file_delete(stream, &path, recursive).await,
        Request::ArchiveRead { path } => archive_read(stream, &path).await,
        Request::ArchiveWrite { path } => upload(stream, &path, Upload::Archive).await,
        Request::Events | Request::Tunnel { .. } | Request::Take { .. } if state.egress.is_none() => {
            let _ =
                send(&mut stream, &error("unsupported", "this sandbox's supervisor serves no egress")).await;
        }
        Request::Events => {
            if let Some(held) = &state.egress {
                crate::egress::events(stream, held).await;
            }
        }
        Request::Tunnel { id } => {
            if let Some(held) = &state.egress {
                crate::egress::tunnel(stream, id, held).await;
            }
        }
        Request::Take { id } => {
            if let Some(held) = &state.egress {
                crate::egress::take(stream, id, held).await;
            }
        }
        Request::Connect { port, hand_over } => {
            crate::preview::connect(stream, port, hand_over, &state.lane_ports).await;
        }
        Request::Hello { .. } => {
            let _ = send(&mut stream, &error("bad_request", "hello twice")).await;
        }
        Request::Unknown => {
            let _ =
                send(&mut stream, &error("unsupported", "this supervisor does not serve that request")).await;
        }
    }
}

/// Stops every other process of the pid namespace until the connection ends (or
/// [`crate::protocol::MAX_FREEZE_MS`] passes), then continues them.
async fn freeze(mut stream: UnixStream) {
    // `kill(-1)` from a namespace's init reaches every process of the namespace but
    // itself; from anywhere else it would reach far more than the sandbox.
    if std::process::id() != 1 {
        let _ =
            send(&mut stream, &error("unsupported", "this supervisor is not its pid namespace's init")).await;
        return;
    }
    signal_all(libc::SIGSTOP);
    if send(&mut stream, &Reply::Done).await.is_ok() {
        let held = Duration::from_millis(crate::protocol::MAX_FREEZE_MS);
        // Any frame, the end of the connection or an error ends the freeze.
        let _ = tokio::time::timeout(held, read_frame(&mut stream)).await;
    }
    signal_all(libc::SIGCONT);
}

/// `kill(-1, signal)`: every process this one may signal but itself.
#[allow(unsafe_code)]
fn signal_all(signal: libc::c_int) {
    // SAFETY: kill has no memory effects; ESRCH (nothing else runs) is fine.
    unsafe {
        libc::kill(-1, signal);
    }
}

fn resource(limit: Rlimit) -> libc::__rlimit_resource_t {
    match limit {
        Rlimit::OpenFiles => libc::RLIMIT_NOFILE,
        Rlimit::AddressSpace => libc::RLIMIT_AS,
        Rlimit::FileSize => libc::RLIMIT_FSIZE,
        Rlimit::CpuSecs => libc::RLIMIT_CPU,
        Rlimit::Processes => libc::RLIMIT_NPROC,
        Rlimit::Core => libc::RLIMIT_CORE,
    }
}

/// Starts a command of `spec` ([`crate::launch`]) with the supervisor's OOM score raised,
/// so it starts with [`COMMAND_OOM_SCORE_ADJ`].
fn spawn(
    spec: &ExecSpec,
    state: &State,
    stdin: bool,
    tty: Option<std::os::fd::RawFd>,
) -> io::Result<crate::launch::Spawned> {
    let limits: Vec<(libc::__rlimit_resource_t, u64, u64)> = spec
        .rlimits
        .iter()
        .map(|(r, v)| {
            let hard = if *r == Rlimit::CpuSecs { v.saturating_add(1) } else { *v };
            (resource(*r), *v, hard)
        })
        .collect();
    let launch = crate::launch::Launch {
        argv: &spec.argv,
        env: &spec.env,
        cwd: &spec.cwd,
        stdin,
        tty,
        user: state.user,
        limits: &limits,
    };
    match &state.oom {
        Some(shield) => shield.around(|| crate::launch::launch(&launch)),
        None => crate::launch::launch(&launch),
    }
}

#[allow(unsafe_code)]
fn kill_group(pgid: i32) {
    if pgid > 1 {
        // SAFETY: kill has no memory effects; the group is a command's of this sandbox.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
}

/// Reads what a pipe holds now, without waiting (after the command exited, a background
/// process may keep the pipe open: what it writes later is not this command's output).
fn drain_now(pipe: &pipe::Receiver, sink: &mut Vec<u8>) {
    let mut buf = [0u8; 16 * 1024];
    for _ in 0..256 {
        match pipe.try_read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => sink.extend_from_slice(&buf[..n]),
        }
    }
}

struct Output {
    cap: u64,
    sent: [u64; 2],
    truncated: bool,
}

impl Output {
    /// The part of `bytes` of stream `i` that fits under the cap.
    fn keep<'a>(&mut self, i: usize, bytes: &'a [u8]) -> &'a [u8] {
        let room = self.cap.saturating_sub(self.sent[i]);
        let n = usize::try_from(room).unwrap_or(usize::MAX).min(bytes.len());
        if n < bytes.len() {
            self.truncated = true;
        }
        self.sent[i] += n as u64;
        &bytes[..n]
    }
}

async fn exec(stream: UnixStream, spec: ExecSpec, state: &State) {
    let (mut rx, mut tx) = stream.into_split();
    let child = match spawn(&spec, state, spec.stdin, None) {
        Ok(child) => child,
        Err(e) => {
            let program = spec.argv.first().cloned().unwrap_or_default();
            let _ = send(&mut tx, &error("spawn", format!("cannot run {program:?}: {e}"))).await;
            return;
        }
    };
    let pid = child.pid;
    // Registered before anything awaits, so the reaper cannot miss it.
    let (exit_tx, mut exited) = oneshot::channel();
    if let Ok(mut waiting) = state.waiting.lock() {
        waiting.insert(pid, Waiter::Command(exit_tx));
    }
    state.running.fetch_add(1, Ordering::Relaxed);
    let stdout = child.stdout.and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let stderr = child.stderr.and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let stdin = child.stdin.and_then(|s| pipe::Sender::from_owned_fd(s).ok());

    let code = run_exec(&mut rx, &mut tx, &spec, pid, &mut exited, stdout, stderr, stdin).await;
    if code.is_none() {
        // The server went away: the command goes too, and its status is still reaped.
        kill_group(pid);
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut exited).await;
    }
    if let Ok(mut waiting) = state.waiting.lock() {
        waiting.remove(&pid);
    }
    state.running.fetch_sub(1, Ordering::Relaxed);
}

/// Runs the exchange of one command; `None` when the server went away.
#[allow(clippy::too_many_arguments)]
async fn run_exec(
    rx: &mut tokio::net::unix::OwnedReadHalf,
    tx: &mut tokio::net::unix::OwnedWriteHalf,
    spec: &ExecSpec,
    pid: i32,
    exited: &mut oneshot::Receiver<i32>,
    mut stdout: Option<pipe::Receiver>,
    mut stderr: Option<pipe::Receiver>,
    stdin: Option<pipe::Sender>,
) -> Option<()> {
    send(tx, &Reply::Started { pid }).await.ok()?;
    let mut output = Output { cap: spec.output_cap, sent: [0, 0], truncated: false };
    // Standard input flows on its own, so a command that writes before it reads cannot
    // deadlock against us; it ends (returning) only when the server goes away.
    let pump = async {
        let mut stdin = stdin;
        loop {
            match read_frame(rx).await {
                Ok(Some(frame)) if frame.kind == FrameType::Stdin => {
                    if frame.payload.is_empty() {
                        stdin = None;
                    } else if let Some(pipe) = &mut stdin
                        && pipe.write_all(&frame.payload).await.is_err()
                    {
                        stdin = None;
                    }
                }
                // Anything else from the server mid-command is a violation: end it.
                Ok(Some(_) | None) | Err(_) => return,
            }
        }
    };
    tokio::pin!(pump);
    let deadline = tokio::time::sleep(Duration::from_millis(spec.timeout_ms));
    tokio::pin!(deadline);
    let mut timed_out = false;
    let mut out_buf = vec![0u8; 32 * 1024];
    let mut err_buf = vec![0u8; 32 * 1024];
    let code = loop {
        tokio::select! {
            code = &mut *exited => break code.unwrap_or(-1),
            () = &mut pump => return None,
            () = &mut deadline, if !timed_out => {
                timed_out = true;
                kill_group(pid);
            }
            read = read_some(&mut stdout, &mut out_buf) => {
                match read {
                    Some(n) => {
                        let kept = output.keep(0, &out_buf[..n]);
                        if !kept.is_empty() {
                            let frame = Frame { kind: FrameType::Stdout, payload: kept.to_vec() };
                            write_frame(tx, &frame).await.ok()?;
                        }
                    }
                    None => stdout = None,
                }
            }
            read = read_some(&mut stderr, &mut err_buf) => {
                match read {
                    Some(n) => {
                        let kept = output.keep(1, &err_buf[..n]);
                        if !kept.is_empty() {
                            let frame = Frame { kind: FrameType::Stderr, payload: kept.to_vec() };
                            write_frame(tx, &frame).await.ok()?;
                        }
                    }
                    None => stderr = None,
                }
            }
        }
    };
    for (i, (pipe, kind)) in
        [(&stdout, FrameType::Stdout), (&stderr, FrameType::Stderr)].into_iter().enumerate()
    {
        if let Some(pipe) = pipe {
            let mut rest = Vec::new();
            drain_now(pipe, &mut rest);
            let kept = output.keep(i, &rest).to_vec();
            if !kept.is_empty() {
                crate::protocol::write_data(tx, kind, &kept).await.ok()?;
            }
        }
    }
    let exit = Reply::Exit { code, timed_out, truncated: output.truncated };
    send(tx, &exit).await.ok()?;
    let _ = tx.shutdown().await;
    Some(())
}

/// Reads from a pipe that is still open; pends forever once it is closed (`None` input).
async fn read_some(pipe: &mut Option<pipe::Receiver>, buf: &mut [u8]) -> Option<usize> {
    match pipe {
        Some(p) => match p.read(buf).await {
            Ok(0) | Err(_) => None,
            Ok(n) => Some(n),
        },
        None => std::future::pending().await,
    }
}

fn no_such_process(pid: u32) -> Reply {
    error("no_such_process", format!("no background process {pid}"))
}

/// Reads the [`FrameType::Stdin`] frames that follow a request, up to the empty one.
/// `None` when the server went away or broke the protocol, or sent more than
/// [`MAX_STDIN`] (then an error is sent).
async fn read_stdin(stream: &mut UnixStream) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    loop {
        match read_frame(stream).await {
            Ok(Some(frame)) if frame.kind == FrameType::Stdin && frame.payload.is_empty() => {
                return Some(bytes);
            }
            Ok(Some(frame)) if frame.kind == FrameType::Stdin => {
                if bytes.len() + frame.payload.len() > MAX_STDIN {
                    let _ =
                        send(stream, &error("too_large", format!("more than {MAX_STDIN} bytes of input")))
                            .await;
                    return None;
                }
                bytes.extend_from_slice(&frame.payload);
            }
            _ => return None,
        }
    }
}

/// Starts a background process, keeps it, and answers its status.
async fn process_start(mut stream: UnixStream, start: ProcessStart, state: &State) {
    let Some(input) = read_stdin(&mut stream).await else { return };
    let caps = processes::Caps {
        max_processes: start.max_processes,
        buffer_bytes: start.buffer_bytes,
        max_buffered_bytes: start.max_buffered_bytes,
    };
    if let Err(why) = state.table.make_room(caps) {
        let _ = send(&mut stream, &error("resource_exhausted", why)).await;
        return;
    }
    let spec = start.spec;
    let pty = match &start.terminal {
        Some(t) => match crate::pty::open(t.cols, t.rows, state.user)
            .and_then(|pty| Ok((crate::pty::Master::new(pty.master)?, pty.slave)))
        {
            Ok((master, slave)) => Some((t.id.clone(), Arc::new(master), slave)),
            Err(e) => {
                let _ = send(&mut stream, &error("spawn", format!("cannot open a terminal: {e}"))).await;
                return;
            }
        },
        None => None,
    };
    let tty = pty.as_ref().map(|(_, _, slave)| std::os::fd::AsRawFd::as_raw_fd(slave));
    let child = match spawn(&spec, state, pty.is_none(), tty) {
        Ok(child) => child,
        Err(e) => {
            let program = spec.argv.first().cloned().unwrap_or_default();
            // No such program is a path that names nothing; one that cannot be run, a
            // conflict with what is there.
            let code = match e.kind() {
                io::ErrorKind::NotFound => "not_found",
                io::ErrorKind::PermissionDenied => "conflict",
                _ => "spawn",
            };
            let _ = send(&mut stream, &error(code, format!("cannot run {program:?}: {e}"))).await;
            return;
        }
    };
    let pid = u32::try_from(child.pid).unwrap_or(0);
    let stdout = child.stdout.and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let stderr = child.stderr.and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let (stdin, terminal) = match pty {
        Some((id, master, slave)) => {
            // Only the process holds its terminal's other end now: once it (and whatever
            // it started there) has closed it, the master reads its end.
            drop(slave);
            (Some(Input::Terminal(master.clone())), Some(processes::Terminal { id, master }))
        }
        None => (child.stdin.and_then(|s| pipe::Sender::from_owned_fd(s).ok()).map(Input::Pipe), None),
    };
    let master = terminal.as_ref().map(|t| t.master.clone());
    let proc = state.table.insert(pid, spec.argv.clone(), start.buffer_bytes, stdin, terminal);
    // Registered before anything awaits, so the reaper cannot miss it.
    let (exit_tx, exited) = oneshot::channel();
    if let Ok(mut waiting) = state.waiting.lock() {
        waiting.insert(i32::try_from(pid).unwrap_or(0), Waiter::Process(proc.clone(), exit_tx));
    }
    if !input.is_empty() {
        let proc = proc.clone();
        tokio::spawn(async move {
            let mut stdin = proc.stdin.lock().await;
            if let Some(pipe) = stdin.as_mut()
                && pipe.write_all(&input).await.is_err()
            {
                *stdin = None;
            }
        });
    }
    match master {
        Some(master) => tokio::spawn(pump_terminal(proc.clone(), master, exited, spec.timeout_ms)),
        None => tokio::spawn(pump(proc.clone(), stdout, stderr, exited, spec.timeout_ms)),
    };
    let _ = send(&mut stream, &Reply::Process(proc.status())).await;
}

/// Reads a background process's output into its buffer until it ends (or its timeout
/// kills it), then records how it ended.
async fn pump(
    proc: Arc<Proc>,
    mut stdout: Option<pipe::Receiver>,
    mut stderr: Option<pipe::Receiver>,
    mut exited: oneshot::Receiver<i32>,
    timeout_ms: u64,
) {
    let pgid = i32::try_from(proc.pid).unwrap_or(0);
    let deadline = async {
        if timeout_ms == 0 {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(timeout_ms)).await;
    };
    tokio::pin!(deadline);
    let mut timed_out = false;
    let mut out_buf = vec![0u8; 32 * 1024];
    let mut err_buf = vec![0u8; 32 * 1024];
    let code = loop {
        tokio::select! {
            code = &mut exited => break code.unwrap_or(-1),
            () = &mut deadline, if !timed_out => {
                timed_out = true;
                if !proc.reaped() {
                    kill_group(pgid);
                }
            }
            read = read_some(&mut stdout, &mut out_buf) => match read {
                Some(n) => proc.push(FrameType::Stdout, &out_buf[..n]),
                None => stdout = None,
            },
            read = read_some(&mut stderr, &mut err_buf) => match read {
                Some(n) => proc.push(FrameType::Stderr, &err_buf[..n]),
                None => stderr = None,
            },
        }
    };
    for (pipe, kind) in [(&stdout, FrameType::Stdout), (&stderr, FrameType::Stderr)] {
        if let Some(pipe) = pipe {
            let mut rest = Vec::new();
            drain_now(pipe, &mut rest);
            proc.push(kind, &rest);
        }
    }
    proc.finish(code, timed_out);
}

/// How long a terminal's output is still read after its process exited, while something
/// it started keeps the terminal open (the kernel hands the master what was written before
/// the last close; this only bounds the wait for a terminal that stays open).
const TERMINAL_DRAIN: Duration = Duration::from_millis(200);

/// As [`pump`], for a process on a terminal: its one output stream is the master's.
async fn pump_terminal(
    proc: Arc<Proc>,
    master: Arc<crate::pty::Master>,
    mut exited: oneshot::Receiver<i32>,
    timeout_ms: u64,
) {
    let pgid = i32::try_from(proc.pid).unwrap_or(0);
    let deadline = async {
        if timeout_ms == 0 {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(Duration::from_millis(timeout_ms)).await;
    };
    tokio::pin!(deadline);
    let mut timed_out = false;
    let mut open = true;
    let mut buf = vec![0u8; 32 * 1024];
    let code = loop {
        tokio::select! {
            code = &mut exited => break code.unwrap_or(-1),
            () = &mut deadline, if !timed_out => {
                timed_out = true;
                if !proc.reaped() {
                    kill_group(pgid);
                }
            }
            read = master.read(&mut buf), if open => match read {
                Ok(n) if n > 0 => proc.push(FrameType::Stdout, &buf[..n]),
                _ => open = false,
            },
        }
    };
    // What it wrote before it ended, up to the terminal's end (or a bounded wait for one
    // something else keeps open).
    let drained = async {
        while open {
            match master.read(&mut buf).await {
                Ok(n) if n > 0 => proc.push(FrameType::Stdout, &buf[..n]),
                _ => open = false,
            }
        }
    };
    let _ = tokio::time::timeout(TERMINAL_DRAIN, drained).await;
    while let Some(n) = master.try_read(&mut buf).filter(|n| *n > 0) {
        proc.push(FrameType::Stdout, &buf[..n]);
    }
    proc.finish(code, timed_out);
}

/// Replays a background process's buffered output, then (with `follow`) its output as it
/// comes, until it ends or the server goes away.
async fn process_output(stream: UnixStream, pid: u32, follow: bool, state: &State) {
    let (mut rx, mut tx) = stream.into_split();
    let Some(proc) = state.table.get(pid) else {
        let _ = send(&mut tx, &no_such_process(pid)).await;
        return;
    };
    // The server sends nothing more: whatever it does (closing above all) ends this.
    let gone = async { read_frame(&mut rx).await.ok() };
    tokio::pin!(gone);
    let mut changes = proc.watch();
    let (mut offset, mut dropped) = (0u64, 0u64);
    changes.borrow_and_update();
    let mut read = proc.read(&mut offset, &mut dropped, 4 * DATA_CHUNK);
    if send(&mut tx, &Reply::Replay { dropped }).await.is_err() {
        return;
    }
    loop {
        for (kind, bytes) in &read.frames {
            if write_data(&mut tx, *kind, bytes).await.is_err() {
                return;
            }
        }
        if let Some((code, timed_out)) = read.exit {
            let _ = send(&mut tx, &Reply::Exit { code, timed_out, truncated: dropped > 0 }).await;
            return;
        }
        if read.frames.is_empty() {
            if !follow {
                let _ = send(&mut tx, &Reply::End).await;
                return;
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = &mut gone => return,
            }
        }
        changes.borrow_and_update();
        read = proc.read(&mut offset, &mut dropped, 4 * DATA_CHUNK);
    }
}

/// Writes to a background process's standard input (then closes it, when asked).
async fn process_stdin(mut stream: UnixStream, pid: u32, close: bool, state: &State) {
    let Some(proc) = state.table.get(pid) else {
        let _ = send(&mut stream, &no_such_process(pid)).await;
        return;
    };
    let Some(bytes) = read_stdin(&mut stream).await else { return };
    let (mut rx, mut tx) = stream.into_split();
    let gone = async { read_frame(&mut rx).await.ok() };
    tokio::pin!(gone);
    let written = async {
        let mut stdin = proc.stdin.lock().await;
        if proc.ended() {
            return Err(format!("process {pid} has ended"));
        }
        let Some(input) = stdin.as_mut() else {
            return Err(format!("the input of process {pid} is closed"));
        };
        if !bytes.is_empty() && input.write_all(&bytes).await.is_err() {
            *stdin = None;
            return Err(format!("process {pid} closed its input"));
        }
        if close {
            *stdin = None;
        }
        Ok(())
    };
    let reply = tokio::select! {
        written = written => match written {
            Ok(()) => Reply::Done,
            Err(why) => error("conflict", why),
        },
        _ = &mut gone => return,
    };
    let _ = send(&mut tx, &reply).await;
}

/// Sets the size of a background process's terminal.
fn process_resize(pid: u32, cols: u16, rows: u16, state: &State) -> Reply {
    let Some(proc) = state.table.get(pid) else { return no_such_process(pid) };
    let Some(terminal) = &proc.terminal else {
        return error("conflict", format!("process {pid} has no terminal"));
    };
    if proc.ended() {
        return error("conflict", format!("process {pid} has ended"));
    }
    if cols == 0 || rows == 0 {
        return error("bad_request", format!("a terminal of {cols} columns and {rows} rows"));
    }
    match terminal.master.resize(cols, rows) {
        Ok(()) => Reply::Done,
        Err(e) => error("io", format!("cannot resize the terminal of process {pid}: {e}")),
    }
}

/// A long-lived input stream to a background process (see the protocol's doc): each
/// input frame written as it comes, each `process_resize` of the same pid applied, until
/// the server ends it or the process ends.
async fn process_input(stream: UnixStream, pid: u32, state: &State) {
    let (mut rx, mut tx) = stream.into_split();
    let Some(proc) = state.table.get(pid) else {
        let _ = send(&mut tx, &no_such_process(pid)).await;
        return;
    };
    if proc.ended() {
        let _ = send(&mut tx, &error("conflict", format!("process {pid} has ended"))).await;
        return;
    }
    if send(&mut tx, &Reply::Done).await.is_err() {
        return;
    }
    let mut changes = proc.watch();
    let ended = async {
        while !proc.ended() {
            if changes.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::pin!(ended);
    loop {
        let frame = tokio::select! {
            frame = read_frame(&mut rx) => frame,
            () = &mut ended => return,
        };
        match frame {
            Ok(Some(frame)) if frame.kind == FrameType::Stdin && frame.payload.is_empty() => return,
            Ok(Some(frame)) if frame.kind == FrameType::Stdin => {
                let written = async {
                    let mut stdin = proc.stdin.lock().await;
                    match stdin.as_mut() {
                        Some(input) => input.write_all(&frame.payload).await.is_ok(),
                        None => false,
                    }
                };
                let ok = tokio::select! {
                    ok = written => ok,
                    () = &mut ended => return,
                };
                if !ok {
                    return;
                }
            }
            Ok(Some(frame)) if frame.kind == FrameType::Control => match frame.parse::<Request>() {
                Ok(Request::ProcessResize { pid: p, cols, rows }) if p == pid => {
                    // A failed resize (the process just ended) ends nothing: the stream
                    // ends with the process.
                    let _ = process_resize(pid, cols, rows, state);
                }
                _ => return,
            },
            _ => return,
        }
    }
}

#[allow(unsafe_code)]
fn process_signal(pid: u32, signal: &str, state: &State) -> Reply {
    let Some(proc) = state.table.get(pid) else { return no_such_process(pid) };
    let number = match signal {
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "KILL" => libc::SIGKILL,
        other => return error("bad_request", format!("signal {other:?} is not one of TERM, INT, KILL")),
    };
    // Only while unreaped is the pid (and the group's id) this process's; see
    // `processes`. Reaping happens on this same thread, so nothing changes in between.
    if proc.reaped() || proc.ended() {
        return error("conflict", format!("process {pid} has ended"));
    }
    let pgid = i32::try_from(pid).unwrap_or(0);
    if pgid > 1 {
        // SAFETY: kill has no memory effects; the group is an unreaped child's.
        unsafe { libc::kill(-pgid, number) };
    }
    Reply::Done
}

/// Starts `job` on a thread of its own.
fn worker(name: &str, job: impl FnOnce() + Send + 'static) -> Result<(), Reply> {
    std::thread::Builder::new().name(format!("sandlane-{name}")).spawn(job).map(drop).map_err(|e| {
        error(
            "resource_exhausted",
            format!("cannot start a thread for the {name}: {e} (the sandbox's process limit?)"),
        )
    })
}

fn fs_error(e: FsError) -> Reply {
    error(e.code, e.message)
}

fn parse_path(path: &str) -> Result<SandboxPath, Reply> {
    SandboxPath::parse(path).map_err(|e| error("bad_request", e.to_string()))
}

/// What a read's thread sends to the connection.
enum Out {
    Part(ReadPart),
    Done,
    Failed(FsError),
}

/// Relays what a read's thread sends; answers an error if the thread ends without a word.
async fn relay(stream: &mut UnixStream, mut parts: mpsc::Receiver<Out>) {
    while let Some(out) = parts.recv().await {
        let sent = match out {
            Out::Part(ReadPart::File(size)) => send(stream, &Reply::File { size }).await,
            Out::Part(ReadPart::Data(bytes)) => write_data(stream, FrameType::Data, &bytes).await,
            Out::Part(ReadPart::Directory) => send(stream, &Reply::Directory).await,
            Out::Part(ReadPart::Entries(entries)) => send(stream, &Reply::Entries { entries }).await,
            Out::Done => {
                let _ = send(stream, &Reply::End).await;
                return;
            }
            Out::Failed(e) => {
                let _ = send(stream, &fs_error(e)).await;
                return;
            }
        };
        // The server went away: dropping the receiver stops the thread.
        if sent.is_err() {
            return;
        }
    }
    let _ = send(stream, &error("io", "the operation's thread ended unexpectedly")).await;
}

async fn file_read(mut stream: UnixStream, path: &str) {
    let path = match parse_path(path) {
        Ok(p) => p,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
            return;
        }
    };
    let (tx, rx) = mpsc::channel(4);
    let started = worker("file read", move || {
        let result = fs::read(&path, &mut |part| {
            tx.blocking_send(Out::Part(part)).map_err(|_| io::Error::other("the server went away"))
        });
        let _ = tx.blocking_send(match result {
            Ok(()) => Out::Done,
            Err(e) => Out::Failed(e),
        });
    });
    match started {
        Ok(()) => relay(&mut stream, rx).await,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
        }
    }
}

async fn archive_read(mut stream: UnixStream, path: &str) {
    let path = match parse_path(path) {
        Ok(p) => p,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
            return;
        }
    };
    let (tx, rx) = mpsc::channel(4);
    let started = worker("archive read", move || {
        let writer = ChunkWriter { tx: tx.clone(), buf: Vec::with_capacity(DATA_CHUNK) };
        let result = fs::archive_out(&path, writer);
        let _ = tx.blocking_send(match result {
            Ok(()) => Out::Done,
            Err(e) => Out::Failed(e),
        });
    });
    match started {
        Ok(()) => relay(&mut stream, rx).await,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
        }
    }
}

/// Hands what a thread writes to the connection in chunks of [`DATA_CHUNK`].
struct ChunkWriter {
    tx: mpsc::Sender<Out>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(DATA_CHUNK));
        self.tx
            .blocking_send(Out::Part(ReadPart::Data(chunk)))
            .map_err(|_| io::Error::other("the server went away"))
    }
}

impl io::Write for ChunkWriter {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = bytes.len().min(DATA_CHUNK - self.buf.len());
        self.buf.extend_from_slice(&bytes[..n]);
        if self.buf.len() >= DATA_CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Reads what the connection hands a thread: an upload's bytes, its end, or its
/// abandonment (an error, so nothing of it is kept).
struct ChunkReader {
    rx: mpsc::Receiver<Piece>,
    current: Vec<u8>,
    at: usize,
    ended: bool,
}

impl ChunkReader {
    /// Reads to the upload's end, so its whole is accounted for.
    fn finish(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 8192];
        while io::Read::read(self, &mut sink)? > 0 {}
        Ok(())
    }
}

impl io::Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at >= self.current.len() {
            if self.ended {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Piece::Bytes(bytes)) => {
                    self.current = bytes;
                    self.at = 0;
                }
                Some(Piece::End) => self.ended = true,
                Some(Piece::Abandoned) | None => {
                    return Err(io::Error::new(io::ErrorKind::ConnectionAborted, "the upload was abandoned"));
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

#[derive(Clone, Copy)]
enum Upload {
    File,
    Archive,
}

/// A file or an archive coming in: the frames go to a thread that writes or unpacks; its
/// answer is sent once the upload is committed (the empty frame), or as soon as it fails.
/// A connection that ends before the commit abandons the upload.
async fn upload(mut stream: UnixStream, path: &str, kind: Upload) {
    let path = match parse_path(path) {
        Ok(p) => p,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
            return;
        }
    };
    let (in_tx, mut in_rx) = mpsc::channel::<Piece>(4);
    let (done_tx, mut done) = oneshot::channel::<Result<Reply, FsError>>();
    let started = worker(
        match kind {
            Upload::File => "file write",
            Upload::Archive => "archive unpack",
        },
        move || {
            let result = match kind {
                Upload::File => fs::write(&path, &mut || in_rx.blocking_recv().unwrap_or(Piece::Abandoned))
                    .map(|bytes| Reply::Written { bytes }),
                Upload::Archive => {
                    let mut reader = ChunkReader { rx: in_rx, current: Vec::new(), at: 0, ended: false };
                    fs::archive_in(&path, &mut reader).and_then(|(entries, bytes)| {
                        reader
                            .finish()
                            .map(|()| Reply::Unpacked { entries, bytes })
                            .map_err(|e| FsError { code: "abandoned", message: e.to_string() })
                    })
                }
            };
            let _ = done_tx.send(result);
        },
    );
    if let Err(reply) = started {
        let _ = send(&mut stream, &reply).await;
        return;
    }
    let (mut rx, mut tx) = stream.into_split();
    let feed = async move {
        loop {
            match read_frame(&mut rx).await {
                Ok(Some(frame)) if frame.kind == FrameType::Data && frame.payload.is_empty() => {
                    let _ = in_tx.send(Piece::End).await;
                    return true;
                }
                Ok(Some(frame)) if frame.kind == FrameType::Data => {
                    // The thread stopped taking bytes: it failed, and its answer says why.
                    if in_tx.send(Piece::Bytes(frame.payload)).await.is_err() {
                        return true;
                    }
                }
                // The server went away (or broke the protocol): abandon the upload.
                _ => return false,
            }
        }
    };
    enum First {
        Fed(bool),
        Done(Result<Result<Reply, FsError>, oneshot::error::RecvError>),
    }
    let first = tokio::select! {
        fed = feed => First::Fed(fed),
        done = &mut done => First::Done(done),
    };
    let result = match first {
        First::Fed(false) => return,
        First::Fed(true) => done.await,
        First::Done(result) => result,
    };
    let reply = match result {
        Ok(Ok(reply)) => reply,
        Ok(Err(e)) if e.code == "abandoned" => return,
        Ok(Err(e)) => fs_error(e),
        Err(_) => error("io", "the operation's thread ended unexpectedly"),
    };
    let _ = send(&mut tx, &reply).await;
}

async fn file_delete(mut stream: UnixStream, path: &str, recursive: bool) {
    let path = match parse_path(path) {
        Ok(p) => p,
        Err(reply) => {
            let _ = send(&mut stream, &reply).await;
            return;
        }
    };
    let (done_tx, done) = oneshot::channel();
    let started = worker("delete", move || {
        let _ = done_tx.send(fs::delete(&path, recursive));
    });
    let reply = match started {
        Err(reply) => reply,
        Ok(()) => match done.await {
            Ok(Ok(())) => Reply::Done,
            Ok(Err(e)) => fs_error(e),
            Err(_) => error("io", "the operation's thread ended unexpectedly"),
        },
    };
    let _ = send(&mut stream, &reply).await;
}
