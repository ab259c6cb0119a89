//! Closing what a sandbox handed over, where nobody waits for it.
//!
//! A descriptor that came from a sandbox ([`SandboxFd`]: a taken connection, the proxy's
//! listening socket, one refused with a reply) may be a TCP socket the sandbox set to
//! linger (`SO_LINGER` with `l_onoff = 1`, `l_linger = N`) with unsent data queued: the
//! close that releases it then waits, on the thread that closes it, until the peer has
//! acknowledged everything or N seconds passed. The peer is the sandbox's own (it never
//! reads, or keeps the window shut and answers the zero-window probes forever), and N is
//! its choice. On a runtime thread, a few of those stall every tenant's requests.
//!
//! Resetting `SO_LINGER` to off on our descriptor is done (below, and where a descriptor
//! is taken), but it is not relied on: the option belongs to the socket, which the sandbox
//! may still hold, set again between our reset and our close, then close its own copy so
//! that ours is the last. So every descriptor of a sandbox is closed here instead, by one
//! thread (`sandbox-closer`) that takes whatever is queued as one batch and has it
//! released by a thread that exits: a short-lived helper unshares its descriptor table
//! (`unshare(CLONE_FILES)`: a private copy, holding every descriptor once more), the
//! closer then closes its own copies (never the last reference: nothing is released
//! there), and the helper exits. The kernel releases the last references as the helper
//! exits, and TCP never lingers for an exiting thread (`inet_release` gives `tcp_close` no
//! linger timeout under `PF_EXITING`): the socket is finished by the kernel in the
//! background (an orphan, under `tcp_max_orphans` and the orphan retries), whatever the
//! sandbox set and whenever it set it.
//!
//! Why this and not the simpler choices:
//! - a closer thread that only resets `SO_LINGER` before each close: one lost race holds
//!   that thread for as long as the sandbox likes, and every later close queues behind it
//!   until the server runs out of descriptors;
//! - `tokio::task::spawn_blocking`: each lost race would hold a thread of the blocking
//!   pool that file I/O and name resolution share, up to its 512 threads;
//! - a thread per close: threads without a bound.
//!
//! Bounded: the queue holds descriptors the server already holds, so never more than the
//! process's descriptor limit, and it empties as fast as one thread starts per batch,
//! since nothing in it waits on a sandbox. A producer takes a mutex for one push; it never
//! waits for a close. The cost of a batch is one thread start and a copy of the server's
//! descriptor table (0.2 ms, and 0.7 ms with 10,000 descriptors open, measured here),
//! paid only when descriptors a sandbox handed over are closed (a taken connection ends,
//! a sandbox's listener is given back, a descriptor is refused), in batches: never per
//! exec or file operation.
//!
//! The helper's exit also closes its copies of every other descriptor the server held at
//! that instant: each a reference dropped, except one the server closed meanwhile, whose
//! release the helper's exit makes (a few microseconds later than it would have been;
//! POSIX record locks are not touched: they belong to the server's table, not the
//! helper's; a file system that flushes on every close, NFS, would flush on the helper).
//! Should the helper not start or not unshare (out of memory), the batch is closed on the
//! closer thread after the reset: only then could a lost race hold it.

use std::mem::ManuallyDrop;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

/// The helper's stack: it unshares, waits on a channel, and exits.
const HELPER_STACK: usize = 64 * 1024;
/// The closer's stack.
const CLOSER_STACK: usize = 128 * 1024;

/// A descriptor received from a sandbox: dropped, it is closed by the closer thread (see
/// the module's documentation), never on the dropping thread.
#[derive(Debug)]
pub struct SandboxFd(ManuallyDrop<OwnedFd>);

impl SandboxFd {
    /// Takes `fd`, received from a sandbox, in charge.
    pub(crate) fn new(fd: OwnedFd) -> Self {
        Self(ManuallyDrop::new(fd))
    }

    /// A second descriptor of the same socket, for a wrapper that closes its own (the
    /// runtime's `TcpStream`): this one, dropped after it, makes the last close.
    ///
    /// # Errors
    /// As `fcntl(F_DUPFD_CLOEXEC)` (out of descriptors).
    pub(crate) fn duplicate(&self) -> std::io::Result<OwnedFd> {
        self.0.try_clone()
    }
}

impl AsFd for SandboxFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

impl Drop for SandboxFd {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and `self.0` is not used after being taken here.
        let fd = unsafe { ManuallyDrop::take(&mut self.0) };
        close_off_thread(fd);
    }
}

/// Hands `fd` to the closer thread (started on first use).
pub(crate) fn close_off_thread(fd: OwnedFd) {
    let closer = closer();
    let mut state = closer.state.lock().unwrap_or_else(PoisonError::into_inner);
    state.pending.push(fd);
    if !state.running {
        // A thread that cannot start now leaves the batch queued: the next hand-over tries
        // again (nothing is closed on this thread meanwhile).
        let started = std::thread::Builder::new()
            .name("sandbox-closer".to_owned())
            .stack_size(CLOSER_STACK)
            .spawn(move || run(closer));
        state.running = started.is_ok();
    }
    closer.wake.notify_one();
}

struct Closer {
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    pending: Vec<OwnedFd>,
    running: bool,
}

fn closer() -> &'static Closer {
    static CLOSER: OnceLock<Closer> = OnceLock::new();
    CLOSER.get_or_init(|| Closer {
        state: Mutex::new(State { pending: Vec::new(), running: false }),
        wake: Condvar::new(),
    })
}

fn run(closer: &'static Closer) {
    loop {
        let batch = {
            let mut state = closer.state.lock().unwrap_or_else(PoisonError::into_inner);
            while state.pending.is_empty() {
                state = closer.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
            }
            std::mem::take(&mut state.pending)
        };
        release(batch);
    }
}

/// Closes `batch` so that no close waits on a peer: the last references are dropped by an
/// exiting thread (see the module's documentation). Returns once they are.
fn release(batch: Vec<OwnedFd>) {
    for fd in &batch {
        // Not relied on (the sandbox may set it again); spares the fallback a wait.
        let _ = rustix::net::sockopt::set_socket_linger(fd, None);
    }
    release_by_exiting_thread(batch);
}

/// Drops `batch`'s last references on a helper thread as it exits.
fn release_by_exiting_thread(batch: Vec<OwnedFd>) {
    let (unshared_tx, unshared) = std::sync::mpsc::sync_channel::<bool>(1);
    let (exit, exit_rx) = std::sync::mpsc::sync_channel::<()>(0);
    let helper = std::thread::Builder::new()
        .name("sandbox-release".to_owned())
        .stack_size(HELPER_STACK)
        .spawn(move || {
            let private = unshare_files();
            let _ = unshared_tx.send(private);
            if private {
                // Hold the copies until the closer has closed its own, then exit with them.
                let _ = exit_rx.recv();
            }
        });
    match helper {
        Ok(helper) => {
            // Whether or not the helper holds copies, the batch is closed here: with
            // them, none of these closes is the last; without, as the module says.
            let _private = unshared.recv().unwrap_or(false);
            drop(batch);
            drop(exit);
            let _ = helper.join();
        }
        Err(_) => drop(batch),
    }
}

/// Gives the calling thread a private copy of the process's descriptor table.
#[allow(unsafe_code)]
fn unshare_files() -> bool {
    // SAFETY: `unshare_unsafe` is unsafe because a thread with its own table may see
    // descriptors that mean something else there. The helper that calls this uses no
    // descriptor after it (it sends on, and waits on, in-memory channels) and then exits,
    // so nothing ever uses a descriptor number from the private table.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::FILES) }.is_ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::{Duration, Instant};

    use super::super::linger_tests::{ends, lingering};
    use super::*;

    /// The guarantee itself, without the reset (as if the sandbox had set the option again
    /// after it): a lingering socket is released at once, and its peer still gets every
    /// byte and the end.
    #[test]
    fn an_exiting_thread_releases_a_lingering_socket_at_once() {
        let (near, mut peer) = lingering(Duration::from_secs(30));
        let started = Instant::now();
        release_by_exiting_thread(vec![OwnedFd::from(near)]);
        let took = started.elapsed();
        assert!(took < Duration::from_secs(2), "the release waited {took:?}");
        assert!(ends(&mut peer), "the socket was closed (its peer reads the end)");
    }

    /// Positive control of the hazard: the same socket closed the ordinary way waits.
    /// (Up to three tries: a release helper of a test running beside this one holds a
    /// copy of every descriptor for its short life, and a close while it does is not the
    /// last.)
    #[test]
    fn an_ordinary_close_of_a_lingering_socket_waits() {
        let waited = (0..3).any(|_| {
            let (near, _peer) = lingering(Duration::from_secs(1));
            let started = Instant::now();
            drop(near);
            started.elapsed() >= Duration::from_millis(800)
        });
        assert!(waited, "a close of a lingering socket with unsent data returned at once");
    }

    #[test]
    fn handed_over_descriptors_are_closed_off_the_calling_thread() {
        let pairs: Vec<_> = (0..8).map(|_| lingering(Duration::from_secs(30))).collect();
        let started = Instant::now();
        let mut peers = Vec::new();
        for (near, peer) in pairs {
            drop(SandboxFd::new(OwnedFd::from(near)));
            peers.push(peer);
        }
        assert!(started.elapsed() < Duration::from_millis(100), "{:?}", started.elapsed());
        assert!(peers.iter_mut().all(ends), "every descriptor was closed");
    }
}
