//! Starting a sandbox's bubblewrap, the way `posix_spawn` starts a program:
//! `clone(CLONE_VM | CLONE_VFORK)` and `execve`, not `fork`. In the child, before `exec`: a
//! session of its own (so nothing aimed at the server's process group reaches it), the
//! sandbox's cgroup (entered once, here), the sandbox's rlimits, the supervisor's listening
//! socket on descriptor 3 and every other descriptor closed, then the drop to the
//! sandbox's host ids.
//!
//! # Why not `fork`
//! A `fork` copies the server's page tables and marks its writable pages copy-on-write;
//! a prepared start ([`DropTo::Later`]) then lived on as that copy until a provision
//! released it, so every page the server wrote meanwhile was copied, with a TLB flush
//! across the server's threads. `perf` over a burst of new sandboxes at 16 clients put
//! that (the forks, the children's ends of the copies, the server's copy-on-write faults)
//! at about a tenth of all CPU. The child now runs in the server's memory on a stack of
//! its own while the calling thread waits (`CLONE_VFORK`; for a prepared start that is
//! the thread dedicated to it), so it allocates nothing, takes no lock, touches nothing
//! but what [`spawn`] prepared, and makes only plain system calls: the uid and gid
//! changes go straight to the kernel (`syscall`), since the C library's wrappers would
//! try to change every thread of what they take for their process. All signals are
//! blocked across the `clone`; the child sets every handled signal back to its default
//! (its handler table is its own: no `CLONE_SIGHAND`) before it unblocks them and runs
//! bubblewrap. An error before `execve` is left in a slot the calling thread reads once it
//! resumes. The server waits for the child through a pidfd ([`Started`]).

use std::ffi::{CString, c_int, c_void};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

use tokio::io::unix::AsyncFd;

use super::command::LISTEN_FD;
use super::limits::SandboxCgroup;
use supervisor::vfork;

/// How one sandbox is started.
pub(crate) struct Launch<'a> {
    /// The bubblewrap program (a path).
    pub program: &'a Path,
    /// Its arguments.
    pub args: Vec<std::ffi::OsString>,
    /// The supervisor's listening socket (`None`: the program listens by itself, as a
    /// pod's supervisor does in the Kubernetes driver's fake kubelet; then nothing is
    /// passed on descriptor 3 and a [`DropTo::Later`] start is refused).
    pub listener: Option<OwnedFd>,
    /// Where bubblewrap's and the supervisor's own messages go (standard output and
    /// error): a [`SupervisorLog`]'s writer.
    pub log: File,
    /// The sandbox's rlimits.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// The host uid/gid to drop to before `exec`.
    pub drop_to: DropTo,
    /// The sandbox's cgroup, if any.
    pub cgroup: Option<SandboxCgroup>,
    /// The workspace's filesystem, mounted by the child (see [`WorkspaceMount`]).
    pub workspace: Option<WorkspaceMount>,
}

/// The most bytes a sandbox's log holds.
pub(crate) const LOG_CAP: u64 = 64 << 10;

/// Where bubblewrap and the supervisor write their own messages (their standard output
/// and error; commands' output never goes there): a start that fails says why there.
///
/// # Bounded by the kernel, paid by the sandbox
/// The log is an anonymous memory file (`memfd`) of exactly [`LOG_CAP`] bytes, sealed
/// against growing and shrinking (`F_SEAL_GROW | F_SEAL_SHRINK`, then `F_SEAL_SEAL`): a
/// write past its end fails (`EPERM`), whoever writes (bubblewrap, the supervisor, or a
/// supervisor a sandbox took over, which can seek, reopen `/proc/self/fd/2`, truncate or
/// append and still never make it hold more), so a sandbox can neither fill the data
/// dir's disk (the log is not on it) nor make the server read more than the cap. It keeps
/// the first [`LOG_CAP`] bytes: the messages of a failed start come first (bubblewrap's,
/// or the supervisor's, which exits on its first error), and a supervisor that goes on
/// writing once the log is full loses those lines, never its sandbox (its diagnostics
/// ignore a failed write). Its pages are allocated by the writes, in the sandbox's
/// cgroup. The server reads it only after a failed start ([`SupervisorLog::read`]), and
/// keeps no copy of a started sandbox's: the log lives as long as the sandbox's processes
/// hold it (root reads a live one at `/proc/<supervisor's pid>/fd/2`).
///
/// (Not a file in the data dir held to the cap with `RLIMIT_FSIZE`: the supervisor writes
/// the sandbox's uploads with its own limit, so a limit small enough for the log would
/// refuse them. Not a pipe the server drains: sandboxes outlive the server, and a pipe
/// nobody reads blocks, or breaks, its writer.)
#[derive(Debug)]
pub(crate) struct SupervisorLog {
    file: File,
}

impl SupervisorLog {
    /// A new, empty log of [`LOG_CAP`] bytes.
    ///
    /// # Errors
    /// The kernel's: no `memfd_create`, no sealing.
    pub(crate) fn new() -> io::Result<Self> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            "sandlane-supervisor-log",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, LOG_CAP)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL)?;
        Ok(Self { file: File::from(fd) })
    }

    /// The same log, through another descriptor.
    ///
    /// # Errors
    /// `dup`'s.
    pub(crate) fn try_clone(&self) -> io::Result<Self> {
        Ok(Self { file: self.file.try_clone()? })
    }

    /// A descriptor to write the log through (the standard output and error of a start).
    ///
    /// # Errors
    /// `dup`'s.
    pub(crate) fn writer(&self) -> io::Result<File> {
        self.file.try_clone()
    }

    /// What was written, at most [`LOG_CAP`] bytes read whatever was done to the file (its
    /// unwritten rest, zeros, left out), as text.
    pub(crate) fn read(&self) -> String {
        use std::os::unix::fs::FileExt;
        let mut bytes = vec![0u8; usize::try_from(LOG_CAP).unwrap_or(usize::MAX)];
        let mut got = 0;
        while got < bytes.len() {
            match self.file.read_at(&mut bytes[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        bytes.truncate(got);
        let end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
        String::from_utf8_lossy(&bytes[..end]).into_owned()
    }

    /// The end of what was written, as the server shows it in a failed start's error:
    /// its last `lines` lines, at most `bytes` bytes of them.
    pub(crate) fn tail(&self, lines: usize, bytes: usize) -> String {
        let text = self.read();
        let text = text.trim();
        let start = text.char_indices().rev().filter(|(_, c)| *c == '\n').nth(lines.saturating_sub(1));
        let mut tail = start.map_or(text, |(i, _)| &text[i + 1..]);
        if tail.len() > bytes {
            let mut cut = tail.len() - bytes;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail = &tail[cut..];
        }
        tail.to_owned()
    }
}

/// A workspace image the child mounts before `exec`, in a mount namespace of its own: the
/// mount lives with the sandbox (bubblewrap copies it into the sandbox's namespace) and
/// goes with it, and the host's mount table never holds it. (Every bubblewrap start copies
/// and reads the whole mount table of the namespace it starts in, once per bind: with a
/// workspace mount per live sandbox on the host, a start cost 12.7 ms at 242 mounts
/// against 4.8 ms at 20 here, and grew with every sandbox.)
pub(crate) struct WorkspaceMount {
    /// The mountpoint, as the child resolves it (the path bubblewrap binds from).
    pub target: std::ffi::CString,
    /// The loop device and the owner of the filesystem's root, when known at the spawn;
    /// a [`DropTo::Later`] start reads them from its pipe ([`Release`]).
    pub device: Option<Device>,
}

/// A loop device to mount, and who owns the workspace's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Device {
    /// `/dev/loopN`.
    pub number: u32,
    /// The root's owner.
    pub uid: u32,
    /// The root's group.
    pub gid: u32,
}

/// What a provision writes to a prepared start's pipe: the host uid to drop to, and the
/// workspace's loop device if it has one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Release {
    /// The host uid ([`NO_DROP`]: stay as the server).
    pub uid: u32,
    /// The device to mount on the start's workspace target.
    pub device: Option<Device>,
}

impl Release {
    /// The message's size.
    pub const LEN: usize = 16;

    /// Native-order words: uid, device number ([`NO_DEVICE`]: none), owner uid, owner gid.
    pub fn encode(self) -> [u8; Self::LEN] {
        let device = self.device.unwrap_or(Device { number: NO_DEVICE, uid: 0, gid: 0 });
        let mut out = [0u8; Self::LEN];
        for (i, word) in [self.uid, device.number, device.uid, device.gid].into_iter().enumerate() {
            out[i * 4..i * 4 + 4].copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// The inverse of [`Release::encode`] (allocation-free, for the forked child).
    pub fn decode(bytes: &[u8; Self::LEN]) -> Self {
        let word = |i: usize| {
            u32::from_ne_bytes([bytes[i * 4], bytes[i * 4 + 1], bytes[i * 4 + 2], bytes[i * 4 + 3]])
        };
        let device = (word(1) != NO_DEVICE).then(|| Device { number: word(1), uid: word(2), gid: word(3) });
        Self { uid: word(0), device }
    }
}

/// The device number a [`Release`] carries for "no workspace image".
const NO_DEVICE: u32 = u32::MAX;

/// Writes `n` in decimal at the start of `out` (which holds at least 10 bytes); returns
/// how many bytes. Allocation-free, for the forked child.
fn decimal(n: u32, out: &mut [u8]) -> usize {
    let mut digits = [0u8; 10];
    let (mut n, mut len) = (n, 0);
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        out[i] = digits[len - 1 - i];
    }
    len
}

/// `/dev/loopN` as a NUL-terminated string, written into `buf` without allocating.
pub(super) fn loop_path(number: u32, buf: &mut [u8; 24]) -> *const libc::c_char {
    const PREFIX: &[u8] = b"/dev/loop";
    buf[..PREFIX.len()].copy_from_slice(PREFIX);
    let len = decimal(number, &mut buf[PREFIX.len()..]);
    buf[PREFIX.len() + len] = 0;
    buf.as_ptr().cast()
}

/// In the forked child, when the workspace did not mount: one line to the sandbox's log
/// (the child's stderr), then the end of the child, so the start fails with that line.
/// (An error returned instead could not reach the server from a prepared start, whose
/// descriptors, the spawn's own error pipe among them, are closed while it waits.)
#[allow(unsafe_code)]
fn mount_failed(errno: i32) -> ! {
    const PREFIX: &[u8] = b"sandlane: cannot mount the sandbox's workspace image (errno ";
    let mut line = [0u8; 96];
    line[..PREFIX.len()].copy_from_slice(PREFIX);
    let mut len = PREFIX.len() + decimal(errno.unsigned_abs(), &mut line[PREFIX.len()..]);
    line[len..len + 2].copy_from_slice(b")\n");
    len += 2;
    // SAFETY: write and _exit are async-signal-safe; the buffer outlives the call.
    unsafe {
        libc::write(2, line.as_ptr().cast(), len);
        libc::_exit(125)
    }
}

/// In the forked child: a mount namespace of its own whose mounts reach nobody else, the
/// device's ext4 filesystem on `target` (`nosuid,nodev,noatime`), its root given to the
/// device's owner. Async-signal-safe system calls only.
#[allow(unsafe_code)]
unsafe fn mount_workspace(target: *const libc::c_char, device: Device) -> io::Result<()> {
    let mut path = [0u8; 24];
    let source = loop_path(device.number, &mut path);
    // SAFETY: every pointer is a valid NUL-terminated string for the calls' duration.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0
            || libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            || libc::mount(
                source,
                target,
                c"ext4".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME,
                std::ptr::null(),
            ) != 0
            || libc::chown(target, device.uid, device.gid) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Which host ids the sandbox's first process drops to.
#[derive(Debug)]
pub(crate) enum DropTo {
    /// Known now (`None`: stay as the server).
    Now(Option<u32>),
    /// Read from this pipe in the child once it is in its cgroup: a prepared start waits
    /// there until a provision names the uid and the workspace's device ([`Release`]).
    /// The pipe closing ends the child, which first moves itself into the
    /// `cgroup.procs` files given (the parents'), so its own cgroups can be removed.
    /// The child closes every descriptor it does not need while it waits (the copies
    /// of other pipes' ends above all), so the server closing its end is seen.
    Later(OwnedFd, Vec<File>),
}

/// The uid a [`Release`] carries for "no drop".
pub(crate) const NO_DROP: u32 = u32::MAX;

/// A started bubblewrap: the server's child until it is reaped. Waited for through a
/// pidfd; dropped unreaped, it is reaped in the background.
#[derive(Debug)]
pub(crate) struct Started {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
    status: Option<ExitStatus>,
}

impl Started {
    /// Its pid (`None` once it was reaped, as a tokio `Child` says).
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    pub fn id(&self) -> Option<u32> {
        if self.status.is_some() { None } else { u32::try_from(self.pid).ok() }
    }

    /// Its exit status if it has exited (reaped then), else `None`.
    ///
    /// # Errors
    /// The `waitpid` error.
    #[allow(unsafe_code)]
    pub fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if let Some(status) = self.status {
            return Ok(Some(status));
        }
        let mut raw = 0;
        // SAFETY: waitpid writes only into `raw`; `pid` is this process's unreaped child.
        let got = unsafe { libc::waitpid(self.pid, &raw mut raw, libc::WNOHANG) };
        match got {
            0 => Ok(None),
            p if p == self.pid => {
                let status = ExitStatus::from_raw(raw);
                self.status = Some(status);
                self.pidfd = None;
                Ok(Some(status))
            }
            _ => Err(io::Error::last_os_error()),
        }
    }

    /// Waits for its end.
    ///
    /// # Errors
    /// The `waitpid` error, or no runtime to wait on.
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(status) = self.try_wait()? {
                return Ok(status);
            }
            match &self.pidfd {
                // A pidfd is readable once its process has exited.
                Some(fd) => fd.readable().await?.clear_ready(),
                // (No pidfd: a kernel before 5.3, or no reactor to register it with.)
                None => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
            }
        }
    }
}

impl Started {
    /// Lets the process watch reap it when it exits ([`crate::watch::reap`]): its pidfd is
    /// closed now, so a running sandbox holds no descriptor of the server for it.
    pub fn reap_in_background(mut self) {
        if matches!(self.try_wait(), Ok(None)) {
            crate::watch::reap(self.pid);
        }
        // The pidfd closes here; the drop (a thread waiting for it) is skipped: reaped
        // now, or the watch's. Nothing else of it needs dropping (a pid and a status).
        self.pidfd = None;
        std::mem::forget(self);
    }
}

impl Drop for Started {
    /// An unreaped child is reaped by a thread of its own (rare: the driver waits for
    /// its children; this covers one dropped on an error path).
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if self.status.is_some() || matches!(self.try_wait(), Ok(Some(_)) | Err(_)) {
            return;
        }
        let pid = self.pid;
        let _ = std::thread::Builder::new().name("sandlane-reap".to_owned()).spawn(move || {
            let mut raw = 0;
            // SAFETY: waitpid writes only into `raw`; `pid` is this process's child.
            unsafe { libc::waitpid(pid, &raw mut raw, 0) };
        });
    }
}

/// Everything the child reads, prepared before the `clone`.
struct ChildPlan<'a> {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    procs: &'a [RawFd],
    listen: RawFd,
    later: Option<RawFd>,
    leave: [RawFd; 8],
    leaving: usize,
    now: Option<u32>,
    rlimits: &'a [(libc::__rlimit_resource_t, u64, u64)],
    mount_target: Option<&'a CString>,
    mount_device: Option<Device>,
    program: &'a CString,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// The error that stopped the child (0: none, bubblewrap runs).
    errno: AtomicI32,
}

/// What the child leaves in [`ChildPlan::errno`] when a prepared start was let go.
const LET_GO: i32 = -1;

/// Starts bubblewrap. The returned child is the server's until it is reaped; the
/// sandbox does not depend on it (no `--die-with-parent`). A [`DropTo::Later`] start
/// returns once a provision released it (or, let go, with an error).
///
/// # Errors
/// The spawn error (program missing, a child-side step failed).
#[allow(unsafe_code)]
pub(crate) fn spawn(launch: Launch) -> io::Result<Started> {
    let program = if launch.program.as_os_str().as_bytes().contains(&b'/') {
        launch.program.to_path_buf()
    } else {
        super::command::resolve_program(launch.program)
            .map_err(|e| io::Error::new(io::ErrorKind::NotFound, e))?
    };
    let program = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "the program holds a NUL byte"))?;
    let args: Vec<CString> = launch
        .args
        .iter()
        .map(|a| CString::new(a.as_bytes()))
        .collect::<Result<_, _>>()
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "an argument holds a NUL byte"))?;
    let mut argv: Vec<*const libc::c_char> = vec![program.as_ptr()];
    argv.extend(args.iter().map(|a| a.as_ptr()));
    argv.push(std::ptr::null());
    let envp: [*const libc::c_char; 1] = [std::ptr::null()];
    let null = vfork::above_stdio(rustix::fs::open(
        c"/dev/null",
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?)?;
    let err = vfork::above_stdio(launch.log.try_clone()?.into())?;
    let out = vfork::above_stdio(launch.log.into())?;
    let procs: Vec<RawFd> = launch
        .cgroup
        .as_ref()
        .map(|g| g.procs_files().iter().map(AsRawFd::as_raw_fd).collect())
        .unwrap_or_default();
    let (now, later) = match &launch.drop_to {
        DropTo::Now(id) => (*id, None),
        DropTo::Later(fd, _) => (None, Some(fd.as_raw_fd())),
    };
    let listen = launch.listener.as_ref().map_or(-1, AsRawFd::as_raw_fd);
    if later.is_some() && listen < 0 {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // The parents' cgroup.procs, in a fixed array.
    let mut leave = [-1i32; 8];
    let mut leaving = 0usize;
    if let DropTo::Later(_, files) = &launch.drop_to {
        for (slot, file) in leave.iter_mut().zip(files) {
            *slot = file.as_raw_fd();
            leaving += 1;
        }
    }
    let plan = ChildPlan {
        stdin: null.as_raw_fd(),
        stdout: out.as_raw_fd(),
        stderr: err.as_raw_fd(),
        procs: &procs,
        listen,
        later,
        leave,
        leaving,
        now,
        rlimits: &launch.rlimits,
        mount_target: launch.workspace.as_ref().map(|w| &w.target),
        mount_device: launch.workspace.as_ref().and_then(|w| w.device),
        program: &program,
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        errno: AtomicI32::new(0),
    };
    if plan.mount_target.is_none() && plan.later.is_none() && launch.workspace.is_some() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: `plan` and what it points into outlive the child's use of them
    // (`clone_vfork` returns once the child has called `execve` or exited); the child
    // (`child_main`) keeps to what the module's documentation says.
    let pid = unsafe { vfork::clone_vfork(child_main, (&raw const plan).cast_mut().cast::<c_void>())? };
    let errno = plan.errno.load(Ordering::Acquire);
    if errno != 0 {
        vfork::reap_exited(pid);
        return Err(if errno == LET_GO {
            io::Error::new(io::ErrorKind::Interrupted, "the prepared start was let go")
        } else {
            io::Error::from_raw_os_error(errno)
        });
    }
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor; `pid` is this
    // process's unreaped child, so it names that process.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = if fd >= 0 {
        // SAFETY: the descriptor was just returned to us and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).unwrap_or(-1)) };
        // SAFETY: the `OwnedFd` keeps the descriptor open, and the same, for as long as
        // the `AsyncFd` holds it. Registering needs a runtime: without one, no pidfd.
        tokio::runtime::Handle::try_current()
            .ok()
            .and_then(|_| unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok())
    } else {
        None
    };
    drop((null, out, err));
    drop(launch.listener);
    drop(launch.cgroup);
    drop(launch.drop_to);
    drop(launch.workspace);
    Ok(Started { pid, pidfd, status: None })
}

/// The child, until bubblewrap runs. Plain system calls on prepared values only.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildPlan` that `spawn` keeps alive until this thread has
    // called `execve` or exited (CLONE_VFORK).
    let plan = unsafe { &*arg.cast::<ChildPlan<'_>>() };
    // SAFETY: every call below is a plain system call on values prepared by `spawn`;
    // nothing is allocated and no lock is taken (see the module's documentation).
    unsafe {
        let errno = || *libc::__errno_location();
        let fail = |e: c_int| -> c_int { vfork::fail(&plan.errno, e) };
        if let Err(e) = vfork::stdio(plan.stdin, plan.stdout, plan.stderr) {
            return fail(e);
        }
        if libc::chdir(c"/".as_ptr()) != 0 {
            return fail(errno());
        }
        // Every handled signal back to its default, and the ignored SIGPIPE (as Rust's
        // `Command` does).
        vfork::default_signals(&[libc::SIGPIPE]);
        if libc::setsid() < 0 {
            return fail(errno());
        }
        let me = b"0";
        for fd in plan.procs {
            if libc::write(*fd, me.as_ptr().cast(), me.len()) != 1 {
                return fail(errno());
            }
        }
        let mut drop_to = plan.now;
        let mut listen = plan.listen;
        let mut mount_device = plan.mount_device;
        let mut leave = plan.leave;
        let leaving = plan.leaving;
        if let Some(read_fd) = plan.later {
            // Keep only what is needed while waiting: the listener on 3, the pipe on 4,
            // the parents' cgroup.procs from 5. Everything else (other prepared starts'
            // pipe ends above all) is closed, so the server closing its end is seen here.
            let high = |fd: i32| libc::fcntl(fd, libc::F_DUPFD, 1000);
            let (hl, hr) = (high(listen), high(read_fd));
            let mut hi_leave = [-1i32; 8];
            for i in 0..leaving {
                hi_leave[i] = high(leave[i]);
            }
            if hl < 0 || hr < 0 || libc::dup2(hl, LISTEN_FD) < 0 || libc::dup2(hr, LISTEN_FD + 1) < 0 {
                return fail(errno());
            }
            for i in 0..leaving {
                let at = LISTEN_FD + 2 + i as i32;
                if hi_leave[i] < 0 || libc::dup2(hi_leave[i], at) < 0 {
                    return fail(errno());
                }
                leave[i] = at;
            }
            let first_free = (LISTEN_FD + 2 + leaving as i32) as libc::c_uint;
            libc::close_range(first_free, libc::c_uint::MAX, 0);
            listen = LISTEN_FD;
            let fd = LISTEN_FD + 1;
            // The rlimits come after the descriptors moved (their open-files limit may be
            // below the numbers used on the way).
            for (resource, soft, hard) in plan.rlimits {
                let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                if libc::setrlimit(*resource, &raw const limit) != 0 {
                    return fail(errno());
                }
            }
            let mut message = [0u8; Release::LEN];
            let mut got = 0;
            while got < Release::LEN {
                let n = libc::read(fd, message[got..].as_mut_ptr().cast(), Release::LEN - got);
                if n <= 0 {
                    if n < 0 && errno() == libc::EINTR {
                        continue;
                    }
                    // Never used: the server let the prepared start go.
                    for fd in &leave[..leaving] {
                        libc::write(*fd, me.as_ptr().cast(), me.len());
                    }
                    plan.errno.store(LET_GO, Ordering::Release);
                    libc::_exit(0);
                }
                got += n.unsigned_abs();
            }
            let release = Release::decode(&message);
            drop_to = (release.uid != NO_DROP).then_some(release.uid);
            mount_device = release.device;
        }
        // As root still: the workspace, before the drop to the sandbox's ids.
        match (plan.mount_target, mount_device) {
            (Some(target), Some(device)) => {
                if let Err(e) = mount_workspace(target.as_ptr(), device) {
                    mount_failed(e.raw_os_error().unwrap_or(0));
                }
            }
            (None, Some(_)) => return fail(libc::EINVAL),
            _ => {}
        }
        if plan.later.is_none() {
            for (resource, soft, hard) in plan.rlimits {
                let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                if libc::setrlimit(*resource, &raw const limit) != 0 {
                    return fail(errno());
                }
            }
        }
        let first_closed = if listen < 0 {
            LISTEN_FD
        } else {
            if listen == LISTEN_FD {
                libc::fcntl(LISTEN_FD, libc::F_SETFD, 0);
            } else if libc::dup2(listen, LISTEN_FD) < 0 {
                return fail(errno());
            }
            LISTEN_FD + 1
        };
        if libc::close_range(
            first_closed as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as c_int,
        ) != 0
        {
            for fd in first_closed..65_536 {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
        if let Some(id) = drop_to
            && (libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, id) != 0
                || libc::syscall(libc::SYS_setuid, id) != 0)
        {
            return fail(errno());
        }
        vfork::unblock_signals();
        libc::execve(plan.program.as_ptr(), plan.argv, plan.envp);
        fail(errno())
    }
}

#[cfg(test)]
mod tests;
