//! Starting a sandbox's bubblewrap: in the forked child, before `exec`, a session of its
//! own (so nothing aimed at the server's process group reaches it), the sandbox's cgroup
//! (entered once, here), the sandbox's rlimits, the supervisor's listening socket on
//! descriptor 3 and every other descriptor closed, then the drop to the sandbox's host
//! ids.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;

use tokio::process::{Child, Command};

use super::command::LISTEN_FD;
use super::limits::SandboxCgroup;

/// How one sandbox is started.
pub(crate) struct Launch<'a> {
    /// The bubblewrap program.
    pub program: &'a Path,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The supervisor's listening socket (`None`: the program listens by itself, as a
    /// pod's supervisor does in the Kubernetes driver's fake kubelet; then nothing is
    /// passed on descriptor 3 and a [`DropTo::Later`] start is refused).
    pub listener: Option<OwnedFd>,
    /// Where bubblewrap's and the supervisor's own messages go.
    pub log: File,
    /// The sandbox's rlimits.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// The host uid/gid to drop to before `exec`.
    pub drop_to: DropTo,
    /// The sandbox's cgroup, if any.
    pub cgroup: Option<SandboxCgroup>,
}

/// Which host ids the sandbox's first process drops to.
#[derive(Debug)]
pub(crate) enum DropTo {
    /// Known now (`None`: stay as the server).
    Now(Option<u32>),
    /// Read from this pipe in the child once it is in its cgroup: a prepared start waits
    /// there until a provision names the uid (4 bytes, native order; [`NO_DROP`]: no
    /// drop). The pipe closing ends the child, which first moves itself into the
    /// `cgroup.procs` files given (the parents'), so its own cgroups can be removed.
    /// The child closes every descriptor it does not need while it waits (the copies
    /// of other pipes' ends above all), so the server closing its end is seen.
    Later(OwnedFd, Vec<File>),
}

/// The `u32` a [`DropTo::Later`] pipe carries for "no drop".
pub(crate) const NO_DROP: u32 = u32::MAX;

/// Starts bubblewrap. The returned child is the server's until it is reaped; the
/// sandbox does not depend on it (no `--die-with-parent`).
///
/// # Errors
/// The spawn error (program missing, a child-side step failed).
#[allow(unsafe_code)]
pub(crate) fn spawn(launch: Launch) -> io::Result<Child> {
    let mut cmd = Command::new(launch.program);
    let err = launch.log.try_clone()?;
    cmd.args(&launch.args)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::from(launch.log))
        .stderr(Stdio::from(err))
        .kill_on_drop(false);
    let procs_fds: Vec<i32> = launch
        .cgroup
        .as_ref()
        .map(|g| g.procs_files().iter().map(AsRawFd::as_raw_fd).collect())
        .unwrap_or_default();
    let listen = launch.listener.as_ref().map_or(-1, AsRawFd::as_raw_fd);
    let rlimits = launch.rlimits;
    let (now, later) = match &launch.drop_to {
        DropTo::Now(id) => (*id, None),
        DropTo::Later(fd, _) => (None, Some(fd.as_raw_fd())),
    };
    // The parents' cgroup.procs, in a fixed array (nothing is allocated after the fork).
    let mut leave = [-1i32; 8];
    let mut leaving = 0usize;
    if let DropTo::Later(_, files) = &launch.drop_to {
        for (slot, file) in leave.iter_mut().zip(files) {
            *slot = file.as_raw_fd();
            leaving += 1;
        }
    }
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // async-signal-safe system calls (setsid, write, setrlimit, dup2, fcntl, close_range,
    // setgroups, setgid, setuid) on values prepared before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            let me = b"0";
            for fd in &procs_fds {
                if libc::write(*fd, me.as_ptr().cast(), me.len()) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            let mut drop_to = now;
            let mut listen = listen;
            if later.is_some() && listen < 0 {
                return Err(io::Error::from_raw_os_error(libc::EINVAL));
            }
            if let Some(read_fd) = later {
                // Keep only what is needed while waiting: the listener on 3, the pipe on 4,
                // the parents' cgroup.procs from 5. Everything else inherited from the
                // fork (other prepared starts' pipe ends above all) is closed, so the
                // server closing its end of the pipe is seen here.
                let high = |fd: i32| libc::fcntl(fd, libc::F_DUPFD, 1000);
                let (hl, hr) = (high(listen), high(read_fd));
                let mut hi_leave = [-1i32; 8];
                for i in 0..leaving {
                    hi_leave[i] = high(leave[i]);
                }
                if hl < 0 || hr < 0 || libc::dup2(hl, LISTEN_FD) < 0 || libc::dup2(hr, LISTEN_FD + 1) < 0 {
                    return Err(io::Error::last_os_error());
                }
                for i in 0..leaving {
                    let at = LISTEN_FD + 2 + i as i32;
                    if hi_leave[i] < 0 || libc::dup2(hi_leave[i], at) < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    leave[i] = at;
                }
                let first_free = (LISTEN_FD + 2 + leaving as i32) as libc::c_uint;
                libc::close_range(first_free, libc::c_uint::MAX, 0);
                listen = LISTEN_FD;
                let fd = LISTEN_FD + 1;
                // The rlimits come after the descriptors moved (their open-files limit
                // may be below the numbers used on the way).
                for (resource, soft, hard) in &rlimits {
                    let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                    if libc::setrlimit(*resource, &raw const limit) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }

                let mut id = [0u8; 4];
                let mut got = 0;
                while got < 4 {
                    let n = libc::read(fd, id[got..].as_mut_ptr().cast(), 4 - got);
                    if n <= 0 {
                        if n < 0 && *libc::__errno_location() == libc::EINTR {
                            continue;
                        }
                        // Never used: the server let the prepared start go.
                        for fd in &leave[..leaving] {
                            libc::write(*fd, me.as_ptr().cast(), me.len());
                        }
                        libc::_exit(0);
                    }
                    got += n.unsigned_abs();
                }
                let id = u32::from_ne_bytes(id);
                drop_to = (id != NO_DROP).then_some(id);
            }
            if later.is_none() {
                for (resource, soft, hard) in &rlimits {
                    let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                    if libc::setrlimit(*resource, &raw const limit) != 0 {
                        return Err(io::Error::last_os_error());
                    }
                }
            }
            let first_closed = if listen < 0 {
                LISTEN_FD
            } else {
                if listen == LISTEN_FD {
                    libc::fcntl(LISTEN_FD, libc::F_SETFD, 0);
                } else if libc::dup2(listen, LISTEN_FD) < 0 {
                    return Err(io::Error::last_os_error());
                }
                LISTEN_FD + 1
            };
            if libc::close_range(
                first_closed as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            ) != 0
            {
                for fd in first_closed..65_536 {
                    libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
                }
            }
            if let Some(id) = drop_to
                && (libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(id) != 0
                    || libc::setuid(id) != 0)
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn();
    drop(launch.listener);
    drop(launch.cgroup);
    drop(launch.drop_to);
    child
}
