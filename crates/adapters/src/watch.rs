//! Processes watched without holding a descriptor each: one thread for the whole server
//! looks, once a second, at every sandbox init whose exit something waits for
//! ([`Exit`]) and reaps every bubblewrap the server started and no one waits for any
//! more ([`reap`]).
//!
//! Why not a pidfd each: the server's open-files limit is a host setting it may not raise
//! (this machine's hard limit is 20,000 and the server lacks `CAP_SYS_RESOURCE`), and two
//! pidfds per idle sandbox made 10,000 of them need 30,000 descriptors. A sandbox now costs
//! the server one: its egress proxy's listening socket. What it costs instead: one
//! `waitpid` and one `kill(pid, 0)` per sandbox per second on one thread (about 10 ms a
//! second at 10,000 sandboxes), and an exit seen up to a second late. Ends the server
//! causes itself (a deprovision, a suspension) are seen at once: the driver waits for its
//! own processes, and the background passes stop serving a sandbox whose record moved on.
//!
//! Pid reuse: a bubblewrap is the server's child, so its pid cannot be reused before the
//! server reaps it. An init is not; between two looks its pid could in principle be freed
//! and given to another process, so an init is known by its pid *and* its network
//! namespace (device and inode of `/proc/<pid>/ns/net`, taken while a pidfd proved the
//! process was the init): every tenth look compares them. A reused pid is another
//! process, which is never in that namespace (the init's exit ended every process of its
//! sandbox, and the namespace is kept only by the server's own socket).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::Duration;

/// How often the watch looks.
pub const INTERVAL: Duration = Duration::from_secs(1);

/// Every how many looks an init's network namespace is compared too.
const NAMESPACE_EVERY: u64 = 10;

/// A sandbox init's exit, as the watch sees it.
#[derive(Debug)]
pub struct Exit {
    pid: i32,
    namespace: (u64, u64),
    exited: AtomicBool,
    notify: tokio::sync::Notify,
}

impl Exit {
    /// Watches process `pid` whose network namespace is `namespace` (device, inode).
    pub fn watch(pid: i32, namespace: (u64, u64)) -> Arc<Self> {
        let exit = Arc::new(Self {
            pid,
            namespace,
            exited: AtomicBool::new(false),
            notify: tokio::sync::Notify::new(),
        });
        let watch = Watch::get();
        watch.inits.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(&exit));
        exit
    }

    /// Whether it has exited (as of the latest look, or now when it is plainly gone).
    pub fn has_exited(&self) -> bool {
        if self.exited.load(Ordering::Acquire) {
            return true;
        }
        if !alive(self.pid) {
            self.set_exited();
            return true;
        }
        false
    }

    /// Resolves once the watch has seen it exit.
    pub async fn exited(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.exited.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }

    fn set_exited(&self) {
        self.exited.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }

    /// One look: `deep` compares the namespace too.
    fn look(&self, deep: bool) -> bool {
        let gone = !alive(self.pid) || (deep && namespace_of(self.pid) != Some(self.namespace));
        if gone {
            self.set_exited();
        }
        gone
    }
}

/// Reaps child `pid` (a bubblewrap this process started) once it exits, on the watch's
/// thread: no descriptor, no task.
pub fn reap(pid: i32) {
    if pid > 0 {
        Watch::get().children.lock().unwrap_or_else(PoisonError::into_inner).push(pid);
    }
}

/// The network namespace of process `pid`: device and inode of `/proc/<pid>/ns/net`.
pub fn namespace_of(pid: i32) -> Option<(u64, u64)> {
    let stat = rustix::fs::stat(format!("/proc/{pid}/ns/net")).ok()?;
    Some((stat.st_dev, stat.st_ino))
}

/// Whether process `pid` exists (a zombie counts as gone for an init: it is not reaped
/// by us, and it has ended its sandbox).
#[allow(unsafe_code)]
fn alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists; no memory effects.
    let ok = unsafe { libc::kill(pid, 0) } == 0;
    // SAFETY: reading errno right after the call.
    ok || unsafe { *libc::__errno_location() } == libc::EPERM
}

/// Whether child `pid` has exited, reaping it if so.
#[allow(unsafe_code)]
fn reaped(pid: i32) -> bool {
    let mut status = 0;
    // SAFETY: waitpid writes only into `status`; `pid` is this process's child (or was:
    // ECHILD then, and it is dropped from the list).
    let got = unsafe { libc::waitpid(pid, &raw mut status, libc::WNOHANG) };
    got != 0
}

/// The process-wide watch: what it looks at, and its thread (started on first use).
struct Watch {
    inits: Mutex<Vec<Weak<Exit>>>,
    children: Mutex<Vec<i32>>,
}

impl Watch {
    fn get() -> &'static Self {
        static WATCH: OnceLock<Watch> = OnceLock::new();
        WATCH.get_or_init(|| {
            let started = std::thread::Builder::new().name("sandlane-watch".to_owned()).stack_size(128 * 1024).spawn(
                || {
                    let mut looks: u64 = 0;
                    loop {
                        std::thread::sleep(INTERVAL);
                        looks = looks.wrapping_add(1);
                        Self::get().look(looks.is_multiple_of(NAMESPACE_EVERY));
                    }
                },
            );
            if let Err(e) = started {
                tracing::error!(error = %e, "cannot start the process watch: sandbox exits are seen only when served again");
            }
            Self { inits: Mutex::new(Vec::new()), children: Mutex::new(Vec::new()) }
        })
    }

    fn look(&self, deep: bool) {
        // Copied out first: no lock is held across the system calls.
        let inits: Vec<Arc<Exit>> = {
            let mut inits = self.inits.lock().unwrap_or_else(PoisonError::into_inner);
            inits.retain(|w| w.upgrade().is_some_and(|e| !e.exited.load(Ordering::Acquire)));
            inits.iter().filter_map(Weak::upgrade).collect()
        };
        for exit in &inits {
            exit.look(deep);
        }
        let children: Vec<i32> = self.children.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let gone: Vec<i32> = children.into_iter().filter(|pid| reaped(*pid)).collect();
        if !gone.is_empty() {
            self.children.lock().unwrap_or_else(PoisonError::into_inner).retain(|pid| !gone.contains(pid));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    #[tokio::test]
    async fn an_exit_is_seen_and_a_child_reaped_without_a_descriptor() {
        let mut child = Command::new("sleep").arg("30").spawn().unwrap();
        let pid = i32::try_from(child.id()).unwrap();
        let namespace = namespace_of(pid).unwrap();
        let fds_before = std::fs::read_dir("/proc/self/fd").unwrap().count();
        let exit = Exit::watch(pid, namespace);
        assert_eq!(std::fs::read_dir("/proc/self/fd").unwrap().count(), fds_before, "no descriptor held");
        assert!(!exit.has_exited());
        child.kill().unwrap();
        // Not reaped yet: a zombie still answers kill(pid, 0); the watch reaps it.
        reap(pid);
        std::mem::forget(child);
        tokio::time::timeout(INTERVAL * 5, exit.exited()).await.expect("the exit is seen within a few looks");
        assert!(exit.has_exited());
        let deadline = std::time::Instant::now() + INTERVAL * 5;
        while std::fs::metadata(format!("/proc/{pid}")).is_ok() {
            assert!(std::time::Instant::now() < deadline, "the child was not reaped");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn another_namespace_is_another_process() {
        let me = i32::try_from(std::process::id()).unwrap();
        let exit = Exit::watch(me, (0, 0));
        assert!(!exit.has_exited(), "alive by pid");
        assert!(exit.look(true), "but not in the namespace it was known by: gone");
        assert!(exit.has_exited());
    }
}
