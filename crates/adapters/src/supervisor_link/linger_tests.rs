//! A supervisor that answers with descriptors the server must not close on its runtime:
//! TCP sockets set to linger 30 s with unsent data their peer never reads. A close of one
//! waits on the thread that makes it, so the server would stall every tenant's requests
//! if it closed one on a runtime thread. The fake answers `take` (with the one descriptor
//! named, with three, with one on the hello too), `ping` (descriptors on the hello and the
//! pong: replies that name none), many at once, while `/healthz` of an HTTP server on the same
//! runtime (two workers, so a blocked worker shows) must keep answering within 100 ms.
//! Every descriptor handed over must still be closed (its peer reads to the end).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use supervisor::protocol::{Frame, Protections, Reply, Request, VERSION};

use super::{channel, client};

/// How long the sockets linger.
const LINGER: Duration = Duration::from_secs(30);
/// The longest `/healthz` may take, throughout.
const HEALTHY: Duration = Duration::from_millis(100);
/// `take` requests (a third each: one descriptor, three, one with the hello too).
const TAKES: u64 = 24;
/// `ping` requests (two descriptors with the hello, two with the pong).
const PINGS: usize = 8;

/// Bytes queued on `stream` and not yet sent (`SIOCOUTQNSD`).
#[allow(unsafe_code)]
fn unsent(stream: &impl AsFd) -> i32 {
    let mut unsent: libc::c_int = 0;
    // SAFETY: `SIOCOUTQNSD` writes one `c_int` to the pointer given, which points at
    // `unsent`; the descriptor is open for the call.
    let done = unsafe {
        libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(&stream.as_fd()), libc::SIOCOUTQNSD, &raw mut unsent)
    };
    if done == 0 { unsent } else { 0 }
}

/// Writes on non-blocking `stream` until data waits unsent (its peer's window is shut).
fn fill(stream: &TcpStream) {
    stream.set_nonblocking(true).unwrap();
    let chunk = [7u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        match (&*stream).write(&chunk) {
            Ok(_) => {}
            Err(_) if unsent(stream) > 0 => return,
            Err(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    panic!("the peer's window never shut");
}

/// A loopback TCP connection whose near end has unsent data its peer does not read, set
/// to linger `linger`: (near end, peer).
pub(super) fn lingering(linger: Duration) -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let near = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (peer, _) = listener.accept().unwrap();
    // A small send buffer: little to fill.
    rustix::net::sockopt::set_socket_send_buffer_size(&near, 4096).unwrap();
    fill(&near);
    rustix::net::sockopt::set_socket_linger(&near, Some(linger)).unwrap();
    (near, peer)
}

/// Whether `peer` reads to the end of its stream (its other end was closed) within 10 s.
pub(super) fn ends(peer: &mut TcpStream) -> bool {
    peer.set_nonblocking(false).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = Vec::new();
    peer.read_to_end(&mut sink).is_ok()
}

/// The fake supervisor's state, shared with the test.
#[derive(Default)]
struct Seen {
    /// The peers of every socket handed over to the server (which must close them).
    peers: Mutex<Vec<TcpStream>>,
    /// Descriptors the kernel refused to send (`SO_PASSRIGHTS` off on the server's side).
    refused_by_kernel: AtomicUsize,
}

/// Starts the fake on a fresh socket: a thread per connection.
fn fake() -> (tempfile::TempDir, PathBuf, Arc<Seen>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sock");
    let listener = UnixListener::bind(&path).unwrap();
    let seen = Arc::new(Seen::default());
    let shared = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(conn) = conn else { return };
            let seen = shared.clone();
            std::thread::spawn(move || answer(conn, &seen));
        }
    });
    (dir, path, seen)
}

/// The next frame on `conn` (`buf` keeps what was read past it).
fn next_frame(conn: &mut UnixStream, buf: &mut Vec<u8>) -> Option<Frame> {
    loop {
        if let Ok(Some((frame, used))) = supervisor::protocol::decode(buf) {
            buf.drain(..used);
            return Some(frame);
        }
        let mut more = [0u8; 4096];
        match conn.read(&mut more) {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&more[..n]),
        }
    }
}

/// Sends `reply` with `fds` (their peers: `peers`); when the kernel refuses them, sends
/// it without and lets the sockets go (their linger off first: the fake's own close must
/// not wait either).
fn send(conn: &UnixStream, reply: &Reply, fds: Vec<OwnedFd>, peers: Vec<TcpStream>, seen: &Seen) {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
    let bytes = Frame::control(reply).unwrap().encode();
    let borrowed: Vec<_> = fds.iter().map(AsFd::as_fd).collect();
    let mut space = vec![std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() {
        assert!(control.push(SendAncillaryMessage::ScmRights(&borrowed)));
    }
    let sent =
        rustix::net::sendmsg(conn, &[std::io::IoSlice::new(&bytes)], &mut control, SendFlags::NOSIGNAL);
    match sent {
        Ok(n) => {
            assert_eq!(n, bytes.len());
            // The server's copies are now the only ones.
            drop(fds);
            seen.peers.lock().unwrap().extend(peers);
        }
        Err(e) => {
            if e == rustix::io::Errno::PERM && !fds.is_empty() {
                seen.refused_by_kernel.fetch_add(fds.len(), Ordering::SeqCst);
                let _ = rustix::net::send(conn, &bytes, SendFlags::NOSIGNAL);
            }
            // Else the server went away first (it refused an earlier frame).
            for fd in &fds {
                let _ = rustix::net::sockopt::set_socket_linger(fd, None);
            }
        }
    }
}

/// `n` lingering sockets to send, and their peers.
fn lingering_ones(n: usize) -> (Vec<OwnedFd>, Vec<TcpStream>) {
    (0..n).map(|_| lingering(LINGER)).map(|(near, peer)| (OwnedFd::from(near), peer)).unzip()
}

/// Answers one connection as a hostile supervisor would, then holds it until the server
/// closes it.
fn answer(mut conn: UnixStream, seen: &Seen) {
    let mut buf = Vec::new();
    let (Some(_hello), Some(request)) = (next_frame(&mut conn, &mut buf), next_frame(&mut conn, &mut buf))
    else {
        return;
    };
    let hello = Reply::Hello { version: VERSION, features: vec![], protections: Protections::default() };
    match request.parse::<Request>().unwrap() {
        Request::Take { id } => {
            let (with_hello, with_taken) = match id % 3 {
                0 => (0, 1),
                1 => (0, 3),
                _ => (1, 1),
            };
            // Both made first, so both replies are sent at once: a connection the server
            // drops for its hello still has the second waiting in it.
            let ((fds, peers), (more, their_peers)) =
                (lingering_ones(with_hello), lingering_ones(with_taken));
            send(&conn, &hello, fds, peers, seen);
            send(&conn, &Reply::Taken, more, their_peers, seen);
        }
        Request::Ping => {
            let ((fds, peers), (more, their_peers)) = (lingering_ones(2), lingering_ones(2));
            send(&conn, &hello, fds, peers, seen);
            let pong = Reply::Pong { running: 0, egress_taken: 0, egress_tunnelled: 0 };
            send(&conn, &pong, more, their_peers, seen);
        }
        other => panic!("the fake does not answer {other:?}"),
    }
    // Hold the connection until the server closes it.
    let mut sink = [0u8; 1024];
    while matches!(conn.read(&mut sink), Ok(n) if n > 0) {}
}

/// What the server's side saw.
#[derive(Debug, Default)]
struct Outcome {
    taken: usize,
    take_refused: usize,
    pinged: usize,
    ping_refused: usize,
}

/// Plays the server's side on a runtime of two workers: `/healthz` on it (its address
/// sent to `address`), and every request to the fake at once, each result dropped there.
/// The runtime is handed back still serving `/healthz`.
fn server_side(
    path: PathBuf,
    kernel_refusal: bool,
    address: std::sync::mpsc::Sender<std::net::SocketAddr>,
) -> (Outcome, tokio::runtime::Runtime) {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.worker_threads(2).enable_all();
    if !kernel_refusal {
        runtime.on_thread_start(channel::without_kernel_refusal);
        channel::without_kernel_refusal();
    }
    let runtime = runtime.build().unwrap();
    let outcome = runtime.block_on(async move {
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        address.send(http.local_addr().unwrap()).unwrap();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        tokio::spawn(async move { axum::serve(http, app).await.unwrap() });

        let t = Duration::from_secs(20);
        let path = Arc::new(path);
        let takes: Vec<_> = (0..TAKES)
            .map(|id| {
                let path = path.clone();
                tokio::spawn(async move { client::take(&path, id, t).await.map(drop).is_ok() })
            })
            .collect();
        let pings: Vec<_> = (0..PINGS)
            .map(|_| {
                let path = path.clone();
                tokio::spawn(async move { client::ping(path.as_path(), t).await.is_ok() })
            })
            .collect();
        let mut outcome = Outcome::default();
        for take in takes {
            if take.await.unwrap() {
                outcome.taken += 1;
            } else {
                outcome.take_refused += 1;
            }
        }
        for ping in pings {
            if ping.await.unwrap() {
                outcome.pinged += 1;
            } else {
                outcome.ping_refused += 1;
            }
        }
        outcome
    });
    (outcome, runtime)
}

/// How long `GET /healthz` at `address` takes, on a new connection; why not when it does
/// not answer `200` within a second.
fn probe(address: std::net::SocketAddr) -> Result<Duration, String> {
    let started = Instant::now();
    let mut stream =
        TcpStream::connect_timeout(&address, Duration::from_secs(1)).map_err(|e| e.to_string())?;
    stream.set_read_timeout(Some(Duration::from_secs(1))).map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: sandlane\r\nconnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| e.to_string())?;
    if !answer.starts_with(b"HTTP/1.1 200") {
        return Err(format!("answered {:?}", String::from_utf8_lossy(&answer)));
    }
    Ok(started.elapsed())
}

/// The scenario of the module's documentation; `kernel_refusal` off plays a kernel
/// without `SO_PASSRIGHTS`, where the descriptors with replies that name none arrive.
fn lingering_descriptors_never_stall_the_runtime(kernel_refusal: bool) {
    let (_dir, path, seen) = fake();
    let (address_tx, address) = std::sync::mpsc::channel();
    let (done_tx, done) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (outcome, runtime) = server_side(path, kernel_refusal, address_tx);
        let _ = done_tx.send(outcome);
        // Serving on until the probing ends.
        let _ = stopped.recv();
        drop(runtime);
    });
    let address = address.recv_timeout(Duration::from_secs(10)).expect("the HTTP server started");

    // Probe throughout, and for half a second after the server's side is done.
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    let mut outcome = None;
    let mut until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        let took = probe(address);
        probes += 1;
        let took = took.unwrap_or_else(|why| {
            panic!(
                "/healthz did not answer within a second (probe {probes}: {why}): a runtime thread is blocked"
            )
        });
        slowest = slowest.max(took);
        assert!(took < HEALTHY, "/healthz took {took:?} (probe {probes}): a runtime thread was blocked");
        if outcome.is_none()
            && let Ok(got) = done.try_recv()
        {
            outcome = Some(got);
            until = Instant::now() + Duration::from_millis(500);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(stop);
    let outcome = outcome.expect("the server's side finished within a minute");
    eprintln!("{probes} probes, the slowest {slowest:?}; {outcome:?}; {seen:?}");

    let per_kind = usize::try_from(TAKES / 3).unwrap();
    assert_eq!(outcome.taken, per_kind, "each take with exactly one descriptor works");
    assert_eq!(outcome.take_refused, 2 * per_kind, "the others are refused");
    let refused_by_kernel = seen.refused_by_kernel.load(Ordering::SeqCst);
    if kernel_refusal && channel::kernel_refuses() {
        assert_eq!(refused_by_kernel, PINGS * 4, "the kernel refused every descriptor sent with a ping");
        assert_eq!(outcome.pinged, PINGS, "so each ping was answered");
    } else {
        assert_eq!(refused_by_kernel, 0);
        assert_eq!(outcome.ping_refused, PINGS, "a ping with descriptors fails");
    }
    // Every descriptor handed over was closed (none kept, none stuck in a close).
    let mut peers = std::mem::take(&mut *seen.peers.lock().unwrap());
    // (The second reply of a connection refused for its hello may find it closed.)
    let expected = per_kind * (1 + 3 + 1) + if refused_by_kernel > 0 { 0 } else { PINGS * 2 };
    assert!(peers.len() >= expected, "{} peers, {expected} expected at least", peers.len());
    let open = peers.iter_mut().map(ends).filter(|closed| !closed).count();
    assert_eq!(open, 0, "{open} of {} sockets handed over were never closed", peers.len());
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seen")
            .field("peers", &self.peers.lock().map(|p| p.len()).unwrap_or(0))
            .field("refused_by_kernel", &self.refused_by_kernel.load(Ordering::SeqCst))
            .finish()
    }
}

#[test]
fn lingering_descriptors_never_stall_the_runtime_with_the_kernel_refusing() {
    lingering_descriptors_never_stall_the_runtime(true);
}

#[test]
fn lingering_descriptors_never_stall_the_runtime_where_they_arrive() {
    lingering_descriptors_never_stall_the_runtime(false);
}
