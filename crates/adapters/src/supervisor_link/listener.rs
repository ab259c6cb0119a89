//! The egress proxy's listening socket, opened by the server itself inside a sandbox's
//! network namespace (bubblewrap and containers): no process inside holds it, so it is
//! accepted on the runtime like any other socket, with no thread per sandbox.
//!
//! The namespace is found through the kernel, never through anything the sandbox sends:
//! the driver names the host pid of the sandbox's init (the supervisor; bubblewrap's only
//! child as the driver started it, or the pid the container engine reports). A pidfd is
//! opened on it first ([`Init::open`]), then `/proc/<pid>/ns/net`, then the pidfd is asked
//! whether that process still runs: if it does, the pid was not reused in between, so
//! the namespace is the sandbox's. The server's own network namespace is refused (a
//! listener there would be on the host's loopback). A short-lived thread of its own
//! enters the namespace (`setns(CLONE_NEWNET)`, which the kernel refuses for anything but
//! a network namespace), creates the socket, binds the sandbox's loopback at the proxy's
//! port, listens, and ends: no runtime thread ever changes namespace.
//!
//! The socket is the server's alone: it closes with the server's process, and a restarted
//! server opens a new one in the same namespace (`SO_REUSEADDR`, so the old server's
//! connections lingering in `TIME_WAIT` do not hold the port). While no server runs, a
//! process inside could bind the port itself; the server's bind then fails and that
//! sandbox's egress is tried again later (it only ever costs that sandbox its own
//! egress).
//!
//! The sandbox's end is the init's exit ([`Init::exited`]): once the socket is open, the
//! pidfd is let go and the server's process watch ([`crate::watch`]) sees the exit,
//! so a served sandbox costs the server this one socket and no other descriptor.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::path::Path;

use tokio::io::unix::AsyncFd;

/// The most clients waiting to be accepted on a proxy's listener.
const BACKLOG: i32 = 1024;

/// The init of a sandbox (its supervisor): held by a pidfd while the proxy's socket is
/// opened (which process it is cannot change under it), then by the process watch
/// ([`crate::watch::Exit`]: its pid and network namespace, no descriptor) once the socket
/// is open ([`open_in_namespace`]).
#[derive(Debug)]
pub struct Init {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    watched: Option<std::sync::Arc<crate::watch::Exit>>,
}

impl Init {
    /// A pidfd on host pid `pid` (registered with the current runtime).
    ///
    /// # Errors
    /// No such process, a kernel without pidfds (before 5.3), or no runtime.
    #[allow(unsafe_code)]
    pub fn open(pid: i32) -> io::Result<Self> {
        if pid <= 1 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{pid} is no sandbox's init")));
        }
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| io::Error::other("pidfd_open returned no descriptor"))?;
        // SAFETY: the descriptor was just returned by the kernel and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: the `OwnedFd` keeps the descriptor open, and the same, for as long as the
        // `AsyncFd` holds it.
        let pidfd = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }?;
        Ok(Self { pid, pidfd: Some(pidfd), watched: None })
    }

    /// Its host pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Whether it has exited.
    pub fn has_exited(&self) -> bool {
        use rustix::event::{PollFd, PollFlags, Timespec};
        match (&self.pidfd, &self.watched) {
            (Some(pidfd), _) => {
                let mut fds = [PollFd::new(pidfd.get_ref(), PollFlags::IN)];
                let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
                matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(1..))
            }
            (None, Some(watched)) => watched.has_exited(),
            (None, None) => true,
        }
    }

    /// Resolves once it has exited (seen by the watch within its interval, once the
    /// pidfd was let go).
    pub async fn exited(&self) {
        match (&self.pidfd, &self.watched) {
            // A pidfd stays readable once its process exited: nothing to clear.
            (Some(pidfd), _) => {
                while pidfd.readable().await.is_err() {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
            (None, Some(watched)) => watched.exited().await,
            (None, None) => {}
        }
    }

    /// Lets the pidfd go, once the init was proved to be the one in `namespace`: the
    /// watch follows it from then on.
    fn release(&mut self, namespace: (u64, u64)) {
        self.watched = Some(crate::watch::Exit::watch(self.pid, namespace));
        self.pidfd = None;
    }
}

/// The proxy's listening socket in a sandbox's network namespace, with the sandbox's init.
#[derive(Debug)]
pub struct ProxyListener {
    /// The listening socket (the server's alone).
    pub listener: tokio::net::TcpListener,
    /// The sandbox's init: its exit ends the sandbox.
    pub init: Init,
}

/// Opens the proxy's listening socket at `127.0.0.1:port` inside the network namespace
/// of `init` (see the module's documentation).
///
/// # Errors
/// The namespace cannot be opened or entered (no privilege over it, the init exited, or
/// it is the server's own); [`io::ErrorKind::AddrInUse`] when something inside holds the
/// port already.
pub async fn open_in_namespace(mut init: Init, port: u16) -> io::Result<ProxyListener> {
    let context = |what: &str, e: io::Error| io::Error::new(e.kind(), format!("{what}: {e}"));
    let ns_path = format!("/proc/{}/ns/net", init.pid);
    let ns = std::fs::File::open(&ns_path).map_err(|e| context(&format!("cannot open {ns_path}"), e))?;
    let namespace = rustix::fs::fstat(&ns).map(|s| (s.st_dev, s.st_ino)).map_err(io::Error::from)?;
    if init.has_exited() {
        return Err(io::Error::new(io::ErrorKind::NotFound, format!("process {} has exited", init.pid)));
    }
    if same_file(&ns, Path::new("/proc/self/ns/net"))? {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("process {} is in the server's own network namespace", init.pid),
        ));
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("egress-netns".to_owned())
        .stack_size(64 * 1024)
        .spawn(move || {
            // The thread ends right after: its namespace goes with it.
            let _ = tx.send(bind_in(&ns, port));
        })
        .map_err(|e| context("cannot start a thread to enter the namespace", e))?;
    let fd = rx.await.map_err(|_| io::Error::other("the namespace thread ended without an answer"))??;
    let std_listener = std::net::TcpListener::from(fd);
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    init.release(namespace);
    Ok(ProxyListener { listener, init })
}

/// On a thread of its own: enters network namespace `ns` and listens at `127.0.0.1:port`.
fn bind_in(ns: &std::fs::File, port: u16) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketFlags, SocketType};
    use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};
    let context = |what: &str, e: rustix::io::Errno| {
        let e = io::Error::from(e);
        io::Error::new(e.kind(), format!("{what}: {e}"))
    };
    move_into_link_name_space(ns.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| context("cannot enter the sandbox's network namespace", e))?;
    let socket = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )
    .map_err(|e| context("cannot create a socket", e))?;
    rustix::net::sockopt::set_socket_reuseaddr(&socket, true).map_err(|e| context("SO_REUSEADDR", e))?;
    rustix::net::bind(&socket, &SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
        .map_err(|e| context(&format!("cannot bind the sandbox's 127.0.0.1:{port}"), e))?;
    rustix::net::listen(&socket, BACKLOG).map_err(|e| context("cannot listen", e))?;
    Ok(socket)
}

/// Whether `file` and the file at `path` are the same (device and inode).
fn same_file(file: &std::fs::File, path: &Path) -> io::Result<bool> {
    let a = rustix::fs::fstat(file).map_err(io::Error::from)?;
    let b = rustix::fs::stat(path).map_err(io::Error::from)?;
    Ok(a.st_dev == b.st_dev && a.st_ino == b.st_ino)
}

/// Proxy listeners opened as their sandboxes started (so the port is the server's before
/// the sandbox's first command), kept until their egress is served: by their init's pid.
/// Bounded by the live sandboxes: those whose init exited are dropped at each park.
#[derive(Debug, Default)]
pub struct Parked(std::sync::Mutex<std::collections::HashMap<i32, ProxyListener>>);

impl Parked {
    /// Keeps `proxy` until [`Parked::take`] (and drops those whose sandbox ended).
    pub fn park(&self, proxy: ProxyListener) {
        let mut parked = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        parked.retain(|_, p| !p.init.has_exited());
        parked.insert(proxy.init.pid, proxy);
    }

    /// The listener parked for the init with host pid `pid`, if its init still runs.
    pub fn take(&self, pid: i32) -> Option<ProxyListener> {
        let mut parked = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        parked.remove(&pid).filter(|p| !p.init.has_exited())
    }

    /// How many are kept.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The host pid of the only child of process `parent` (`/proc/<parent>/task/<parent>/children`):
/// the sandbox's init when `parent` is the bubblewrap the driver started (its child runs
/// the supervisor as the pid namespace's init, `--as-pid-1`).
///
/// # Errors
/// When the file cannot be read or lists no child or more than one.
pub fn only_child(parent: u32) -> io::Result<i32> {
    let path = format!("/proc/{parent}/task/{parent}/children");
    let text =
        std::fs::read_to_string(&path).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))?;
    let mut pids = text.split_whitespace().map(str::parse::<i32>);
    match (pids.next(), pids.next()) {
        (Some(Ok(pid)), None) => Ok(pid),
        _ => Err(io::Error::other(format!("process {parent} has not exactly one child ({})", text.trim()))),
    }
}

/// When process `pid` started (`/proc/<pid>/stat`'s `starttime`, clock ticks since boot):
/// with the pid, it names one process across pid reuse.
///
/// # Errors
/// When the process is gone or the file does not parse.
pub fn start_time(pid: i32) -> io::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may hold spaces and parentheses: fields after its last `)`.
    let rest = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    // `rest` starts at field 3 (state); starttime is field 22.
    rest.split_whitespace()
        .nth(19)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat does not parse")))
}

#[cfg(test)]
mod tests;
