//! Starting a program the way `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)`, then
//! `execve` in the child, instead of `fork`. Shared by the supervisor (a sandbox's
//! commands, `supervisor::launch`) and the server (a sandbox's bubblewrap,
//! `bwrap::spawn`); each says why `fork` costs it.
//!
//! Until its `execve`, the child runs on a stack of its own but in the caller's memory,
//! while the calling thread waits. So the child allocates nothing, takes no lock, touches
//! nothing but what its caller prepared, and makes only plain system calls (uid and gid
//! changes straight to the kernel with `syscall`: the C library's wrappers would try to
//! change every thread of what they take for their process). All signals are blocked on
//! the calling thread across the `clone`, and so in the child, which sets every handled
//! signal back to its default ([`default_signals`]; its handler table is its own, no
//! `CLONE_SIGHAND`) before it unblocks them ([`unblock_signals`]) and runs its program.

use std::ffi::{c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// The child's stack: the children call a handful of system calls, nothing recursive.
const STACK_BYTES: usize = 64 * 1024;

/// Runs `child(arg)` in a new process that shares this one's memory, and returns its pid
/// once it has called `execve` (its memory is then its own) or exited.
///
/// # Safety
/// `arg` and everything `child` reads through it stay valid until this returns, and
/// `child` keeps to what the module's documentation says.
///
/// # Errors
/// The `clone` error.
#[allow(unsafe_code)]
pub unsafe fn clone_vfork(child: extern "C" fn(*mut c_void) -> c_int, arg: *mut c_void) -> io::Result<i32> {
    let mut stack = vec![0u8; STACK_BYTES];
    // The stack grows down from its end, aligned as the ABI wants.
    let top = (stack.as_mut_ptr() as usize + STACK_BYTES) & !15;
    // SAFETY: the stack outlives the child's use of it (CLONE_VFORK: this thread resumes
    // once the child has called `execve` or exited); the caller vouches for `arg` and
    // `child`. Signals stay blocked on this thread across the call, so no handler of ours
    // runs in the child.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&raw mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const all, &raw mut old);
        let pid =
            libc::clone(child, top as *mut c_void, libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD, arg);
        let cloned = if pid < 0 { Err(io::Error::last_os_error()) } else { Ok(pid) };
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const old, std::ptr::null_mut());
        cloned
    };
    drop(stack);
    pid
}

/// In the child: leaves the error `e` (or `EINVAL` for none) in `slot` for the calling
/// thread, and ends the child.
///
/// # Safety
/// Only in a child of [`clone_vfork`].
#[allow(unsafe_code)]
pub unsafe fn fail(slot: &std::sync::atomic::AtomicI32, e: c_int) -> ! {
    slot.store(if e == 0 { libc::EINVAL } else { e }, std::sync::atomic::Ordering::Release);
    // SAFETY: `_exit` ends this process at once, running nothing of the caller's.
    unsafe { libc::_exit(127) }
}

/// In the child: `stdin`, `stdout` and `stderr` (each numbered 3 or more, see
/// [`above_stdio`]) onto 0, 1 and 2; the `errno` of a failure.
///
/// # Safety
/// Only in a child of [`clone_vfork`].
#[allow(unsafe_code)]
pub unsafe fn stdio(stdin: c_int, stdout: c_int, stderr: c_int) -> Result<(), c_int> {
    // SAFETY: dup2 on descriptors; plain system calls.
    unsafe {
        if libc::dup2(stdin, 0) < 0 || libc::dup2(stdout, 1) < 0 || libc::dup2(stderr, 2) < 0 {
            return Err(*libc::__errno_location());
        }
    }
    Ok(())
}

/// Reaps a child that exited before its program ran (returns at once).
#[allow(unsafe_code)]
pub fn reap_exited(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid writes only into `status`.
    unsafe { libc::waitpid(pid, &raw mut status, 0) };
}

/// In the child: every handled signal back to its default, and the ignored ones in
/// `also` too (a program gets the defaults the caller chose to ignore).
///
/// # Safety
/// Only in a child of [`clone_vfork`], before it unblocks signals.
#[allow(unsafe_code)]
pub unsafe fn default_signals(also: &[c_int]) {
    // SAFETY: sigaction on a zeroed struct and valid pointers; plain system calls.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        for signal in 1..=64 {
            if signal == libc::SIGKILL || signal == libc::SIGSTOP {
                continue;
            }
            let mut current: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(signal, std::ptr::null(), &raw mut current) == 0
                && (current.sa_sigaction != libc::SIG_IGN || also.contains(&signal))
                && current.sa_sigaction != libc::SIG_DFL
            {
                libc::sigaction(signal, &raw const default, std::ptr::null_mut());
            }
        }
    }
}

/// In the child, just before `execve`: no signal blocked.
///
/// # Safety
/// Only in a child of [`clone_vfork`], after [`default_signals`].
#[allow(unsafe_code)]
pub unsafe fn unblock_signals() {
    // SAFETY: a zeroed, then emptied, set; a plain system call.
    unsafe {
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&raw mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &raw const none, std::ptr::null_mut());
    }
}

/// `fd`, or a copy of it numbered 3 or more: the child's `dup2` onto 0, 1 and 2 would
/// keep the close-on-exec flag of a descriptor already there (a process started with a
/// standard descriptor closed), and the program would lose it at `exec`.
pub fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    rustix::io::fcntl_dupfd_cloexec(&fd, 3).map_err(io::Error::from)
}
