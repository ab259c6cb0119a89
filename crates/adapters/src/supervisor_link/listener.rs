//! The egress proxy's listening socket, handed over by a supervisor (`listen`,
//! `SCM_RIGHTS`): the server accepts the sandbox's proxy clients on it itself, with no
//! announcement and no hand-over per connection.
//!
//! The descriptor comes from inside a sandbox and is treated as hostile. Checked on
//! arrival: a socket, of type `SOCK_STREAM`, in `AF_INET` or `AF_INET6`, listening
//! (`SO_ACCEPTCONN`); anything else is closed and refused. A listener in the sandbox's
//! network namespace only ever yields connections made inside that sandbox.
//!
//! Then, in use: the supervisor keeps its copy, and a descriptor's file status flags
//! belong to the open file both copies share, so the sandbox could clear `O_NONBLOCK` and
//! accept a waiting client first: an `accept` on the server's side would then block until
//! the next client comes. No flag makes one `accept` non-blocking by itself, so the
//! server never accepts on a runtime thread: each listener gets a thread of its own
//! ([`Listener::accept_on_thread`]), which waits with `poll` (on the socket and on an
//! `eventfd` that tells it to stop; no periodic wake-up) and accepts only what it has
//! room for. A sandbox that blocks that thread blocks its own egress and nothing else,
//! and only until the sandbox ends ([`Accepting::close`]).
//!
//! The connections accepted are the server's alone (the sandbox holds no copy), so they
//! are plain runtime sockets, but they inherit the listener's options, which the sandbox
//! sets: one with `SO_LINGER` on would make its close wait on a runtime thread while the
//! sandbox's client leaves data unread. The thread turns linger off on each before handing
//! it over (reliable: nobody else holds it); one where that fails is closed, by the
//! closer thread. The listener itself is the sandbox's as much as the server's: a
//! listening socket's close does not linger (and one that listened could not be connected
//! again on Linux 6.18, even after a `shutdown`), but its last close goes to the closer
//! thread anyway, as every descriptor of a sandbox's does ([`super::closer`]).

use std::future::Future;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::channel::UnixChannel;
use super::closer::SandboxFd;

/// The thread's stack: it only polls, accepts and hands over.
const STACK: usize = 128 * 1024;

/// A listening socket received from a sandbox's supervisor, with the connection that
/// keeps the supervisor from accepting on it (closed with it).
#[derive(Debug)]
pub struct Listener {
    fd: SandboxFd,
    conn: UnixChannel,
}

impl Listener {
    /// Checks `fd` (see the module's documentation); `conn` is the `listen` connection.
    ///
    /// # Errors
    /// The reason `fd` is not a listening IPv4 or IPv6 stream socket; `fd` is closed (by
    /// the closer thread).
    pub(crate) fn new(fd: SandboxFd, conn: UnixChannel) -> Result<Self, String> {
        use rustix::net::sockopt;
        super::taken::inet_stream(fd.as_fd())?;
        if !sockopt::socket_acceptconn(&fd).map_err(|e| format!("cannot read whether it listens: {e}"))? {
            return Err("the socket does not listen".to_owned());
        }
        // Not relied on (see above): it only spares the thread a blocking `accept` while
        // nobody clears it.
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(|e| format!("cannot make the socket non-blocking: {e}"))?;
        Ok(Self { fd, conn })
    }

    /// Accepts on a thread of its own until the returned [`Accepting`] is dropped or
    /// closed: for each client, a permit of `clients` first (so no more connections are
    /// taken from the sandbox than are served), then the connection, given to `serve` on
    /// `runtime` with the permit held until `serve`'s future ends.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub fn accept_on_thread<F, Fut>(
        self,
        clients: Arc<Semaphore>,
        runtime: tokio::runtime::Handle,
        serve: F,
    ) -> io::Result<Accepting>
    where
        F: Fn(std::net::TcpStream) -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        use rustix::event::EventfdFlags;
        let fd = Arc::new(self.fd);
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let ended = Arc::new(AtomicBool::new(false));
        let thread = {
            let (fd, stop, wake, clients, ended) =
                (fd.clone(), stop.clone(), wake.clone(), clients.clone(), ended.clone());
            move || {
                // Set however the loop ends.
                let _ended = Ended(ended);
                while let Some(permit) = permit(&runtime, &clients, &stop) {
                    let Some(stream) = accept(&fd, &wake, &stop) else { return };
                    let served = serve(stream);
                    runtime.spawn(async move {
                        served.await;
                        drop(permit);
                    });
                }
            }
        };
        std::thread::Builder::new().name("egress-accept".to_owned()).stack_size(STACK).spawn(thread)?;
        Ok(Accepting { fd, stop, wake, clients, ended, _conn: self.conn })
    }
}

/// A permit of `clients`, or `None` once the accepting stops.
fn permit(
    runtime: &tokio::runtime::Handle,
    clients: &Arc<Semaphore>,
    stop: &AtomicBool,
) -> Option<OwnedSemaphorePermit> {
    if stop.load(Ordering::Acquire) {
        return None;
    }
    runtime.block_on(clients.clone().acquire_owned()).ok()
}

/// The next client, or `None` once the accepting stops (or the socket no longer listens).
/// Waits for the socket, or for `wake` (then `stop` is set).
fn accept(fd: &SandboxFd, wake: &OwnedFd, stop: &AtomicBool) -> Option<std::net::TcpStream> {
    use rustix::event::{PollFd, PollFlags};
    use rustix::net::SocketFlags;
    loop {
        if stop.load(Ordering::Acquire) {
            return None;
        }
        match rustix::net::accept_with(fd, SocketFlags::NONBLOCK | SocketFlags::CLOEXEC) {
            Ok(stream) => {
                if stop.load(Ordering::Acquire) {
                    return None;
                }
                // Inherited from the listener, which the sandbox sets: off, so the close of
                // this connection (on the runtime) never waits.
                if rustix::net::sockopt::set_socket_linger(&stream, None).is_err() {
                    drop(SandboxFd::new(stream));
                    continue;
                }
                let stream = std::net::TcpStream::from(stream);
                let _ = stream.set_nodelay(true);
                return Some(stream);
            }
            Err(rustix::io::Errno::AGAIN | rustix::io::Errno::INTR | rustix::io::Errno::CONNABORTED) => {
                let mut fds = [PollFd::new(fd, PollFlags::IN), PollFd::new(wake, PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, None);
            }
            // Out of descriptors or memory: wait rather than spin.
            Err(
                rustix::io::Errno::MFILE
                | rustix::io::Errno::NFILE
                | rustix::io::Errno::NOBUFS
                | rustix::io::Errno::NOMEM,
            ) => std::thread::sleep(Duration::from_millis(50)),
            // Shut down (`EINVAL`), or not a socket any more: done.
            Err(_) => return None,
        }
    }
}

/// A listener being accepted on (see [`Listener::accept_on_thread`]). Dropped, its thread
/// stops at once (one in an `accept` the sandbox made block, at the sandbox's next client)
/// and leaves the socket to the supervisor, which accepts on it again.
#[derive(Debug)]
pub struct Accepting {
    fd: Arc<SandboxFd>,
    stop: Arc<AtomicBool>,
    /// Wakes the thread out of its `poll`.
    wake: Arc<OwnedFd>,
    clients: Arc<Semaphore>,
    /// Set when the thread has ended.
    ended: Arc<AtomicBool>,
    _conn: UnixChannel,
}

/// Marks the thread ended when dropped.
struct Ended(Arc<AtomicBool>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

impl Accepting {
    /// Stops for good, for a sandbox that ended: the socket is shut down too, which ends
    /// an `accept` the sandbox made block, so the thread always ends.
    pub fn close(&self) {
        self.stop();
        let _ = rustix::net::shutdown(&*self.fd, rustix::net::Shutdown::Read);
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
    }

    /// Whether the thread has ended.
    pub fn is_finished(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// The flag the thread sets when it ends, to watch it past the drop.
    #[cfg(test)]
    fn ended(&self) -> Arc<AtomicBool> {
        self.ended.clone()
    }
}

impl Drop for Accepting {
    fn drop(&mut self) {
        self.stop();
        // A thread waiting for a permit ends too.
        self.clients.close();
    }
}

#[cfg(test)]
mod tests;
