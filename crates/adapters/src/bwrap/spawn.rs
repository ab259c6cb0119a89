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
    /// The supervisor's listening socket.
    pub listener: OwnedFd,
    /// Where bubblewrap's and the supervisor's own messages go.
    pub log: File,
    /// The sandbox's rlimits.
    pub rlimits: Vec<(libc::__rlimit_resource_t, u64, u64)>,
    /// Host uid/gid to drop to before `exec` (`None`: stay as the server).
    pub drop_to: Option<u32>,
    /// The sandbox's cgroup, if any.
    pub cgroup: Option<SandboxCgroup>,
}

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
    let listen = launch.listener.as_raw_fd();
    let rlimits = launch.rlimits;
    let drop_to = launch.drop_to;
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
            for (resource, soft, hard) in &rlimits {
                let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                if libc::setrlimit(*resource, &raw const limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if listen == LISTEN_FD {
                libc::fcntl(LISTEN_FD, libc::F_SETFD, 0);
            } else if libc::dup2(listen, LISTEN_FD) < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::close_range(
                (LISTEN_FD + 1) as libc::c_uint,
                libc::c_uint::MAX,
                libc::CLOSE_RANGE_CLOEXEC as libc::c_int,
            ) != 0
            {
                for fd in LISTEN_FD + 1..65_536 {
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
    child
}
