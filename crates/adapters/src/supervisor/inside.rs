//! The supervisor itself: the process that runs as PID 1 inside a sandbox (`sandlane
//! supervise`), serving the server over [`super::protocol`].
//!
//! One thread, one current-thread tokio runtime. It makes itself non-dumpable (so a
//! process of the same uid can neither ptrace it nor open its `/proc/1/mem` or fds),
//! installs the seccomp filter before it serves anything, then accepts connections on its
//! listening socket, refusing peers inside its own pid namespace (`SO_PEERCRED` reports
//! pid 0 only for a peer outside). Each command is its child in a process group of its
//! own, with exactly the environment the request gives; `SIGCHLD` reaps every child,
//! orphans included (it is the namespace's init). A command's timeout, or the server
//! closing the connection, kills the command's process group.

use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::oneshot;

use super::protocol::{
    ExecSpec, Frame, FrameType, Protections, ProtocolError, Reply, Request, Rlimit, VERSION, read_frame,
    write_frame,
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
    /// see [`super::gate`]).
    pub tcp: Option<(std::net::SocketAddr, super::gate::ChannelKey)>,
    /// `uid:gid` commands run as (the supervisor must then hold `CAP_SETUID`/`CAP_SETGID`).
    pub user: Option<(u32, u32)>,
    /// Whether to install the seccomp filter.
    pub seccomp: bool,
}

/// The operations this supervisor serves (its hello's `features`).
pub const FEATURES: &[&str] = &["exec", "ping", "shutdown"];

struct State {
    /// Commands waiting for their exit status, by pid.
    waiting: Mutex<HashMap<i32, oneshot::Sender<i32>>>,
    running: AtomicU32,
    protections: Protections,
    user: Option<(u32, u32)>,
}

/// Runs the supervisor until it is killed (or, in a container, sent `SIGTERM`). Returns
/// the process exit code when it cannot start.
pub fn supervise(options: &SuperviseOptions) -> i32 {
    match start(options) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("sandlane supervise: {e}");
            70
        }
    }
}

#[allow(unsafe_code)]
fn start(options: &SuperviseOptions) -> Result<(), String> {
    // SAFETY: prctl with integer arguments only changes this process's flags.
    let non_dumpable = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } == 0;
    let seccomp = if options.seccomp {
        super::seccomp::install()?;
        true
    } else {
        false
    };
    let protections = Protections { seccomp, pid_namespace: std::process::id() == 1, non_dumpable };
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
            Some((addr, key)) => Some((super::gate::bind(*addr)?, key.clone())),
            None => None,
        };
        let state = Arc::new(State {
            waiting: Mutex::new(HashMap::new()),
            running: AtomicU32::new(0),
            protections,
            user: options.user,
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
    gate: Option<&(tokio::net::TcpListener, super::gate::ChannelKey)>,
) -> io::Result<tokio::net::TcpStream> {
    match gate {
        Some((l, _)) => l.accept().await.map(|(s, _)| s),
        None => std::future::pending().await,
    }
}

async fn serve(
    listener: Option<UnixListener>,
    gate: Option<(tokio::net::TcpListener, super::gate::ChannelKey)>,
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
                            && let Some(stream) = super::gate::admit(tcp, &key).await
                        {
                            connection(stream, state).await;
                        }
                    });
                }
                Err(e) => {
                    eprintln!("sandlane supervise: accept: {e}");
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
                    eprintln!("sandlane supervise: accept: {e}");
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
        if let Some(tx) = state.waiting.lock().ok().and_then(|mut w| w.remove(&pid)) {
            let _ = tx.send(code);
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
            features: FEATURES.iter().map(|f| (*f).to_owned()).collect(),
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
            let _ = send(&mut stream, &Reply::Pong { running }).await;
        }
        Request::Exec(spec) => exec(stream, spec, &state).await,
        Request::Shutdown => std::process::exit(0),
        Request::Hello { .. } => {
            let _ = send(&mut stream, &error("bad_request", "hello twice")).await;
        }
        Request::Unknown => {
            let _ =
                send(&mut stream, &error("unsupported", "this supervisor does not serve that request")).await;
        }
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

#[allow(unsafe_code)]
fn spawn(spec: &ExecSpec, user: Option<(u32, u32)>) -> io::Result<std::process::Child> {
    let (program, args) = spec.argv.split_first().ok_or_else(|| io::Error::other("empty argv"))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(&spec.cwd)
        .stdin(if spec.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some((uid, gid)) = user {
        // Before the chdir (std's order), so the workspace is entered as its owner.
        cmd.gid(gid).uid(uid);
    }
    let limits: Vec<(libc::__rlimit_resource_t, u64, u64)> = spec
        .rlimits
        .iter()
        .map(|(r, v)| {
            let hard = if *r == Rlimit::CpuSecs { v.saturating_add(1) } else { *v };
            (resource(*r), *v, hard)
        })
        .collect();
    // SAFETY: runs in the forked child before exec: only setrlimit on values prepared
    // before the fork; nothing is allocated.
    unsafe {
        cmd.pre_exec(move || {
            for (resource, soft, hard) in &limits {
                let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                if libc::setrlimit(*resource, &raw const limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    cmd.spawn()
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
    let mut child = match spawn(&spec, state.user) {
        Ok(child) => child,
        Err(e) => {
            let program = spec.argv.first().cloned().unwrap_or_default();
            let _ = send(&mut tx, &error("spawn", format!("cannot run {program:?}: {e}"))).await;
            return;
        }
    };
    let pid = i32::try_from(child.id()).unwrap_or(0);
    // Registered before anything awaits, so the reaper cannot miss it.
    let (exit_tx, mut exited) = oneshot::channel();
    if let Ok(mut waiting) = state.waiting.lock() {
        waiting.insert(pid, exit_tx);
    }
    state.running.fetch_add(1, Ordering::Relaxed);
    let as_pipe = |fd: Option<OwnedFd>| fd.and_then(|fd| pipe::Receiver::from_owned_fd(fd).ok());
    let stdout = as_pipe(child.stdout.take().map(OwnedFd::from));
    let stderr = as_pipe(child.stderr.take().map(OwnedFd::from));
    let stdin = child.stdin.take().and_then(|s| pipe::Sender::from_owned_fd(OwnedFd::from(s)).ok());
    drop(child);

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
                super::protocol::write_data(tx, kind, &kept).await.ok()?;
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
