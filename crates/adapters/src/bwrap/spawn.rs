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
    /// The workspace's filesystem, mounted by the child (see [`WorkspaceMount`]).
    pub workspace: Option<WorkspaceMount>,
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
    let (mount_target, mut mount_device) = match &launch.workspace {
        Some(w) => (Some(w.target.clone()), w.device),
        None => (None, None),
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
    // unshare, mount, chown, setgroups, setgid, setuid) on values prepared before the
    // fork, and allocates nothing.
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

                let mut message = [0u8; Release::LEN];
                let mut got = 0;
                while got < Release::LEN {
                    let n = libc::read(fd, message[got..].as_mut_ptr().cast(), Release::LEN - got);
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
                let release = Release::decode(&message);
                drop_to = (release.uid != NO_DROP).then_some(release.uid);
                mount_device = release.device;
            }
            // As root still: the workspace, before the drop to the sandbox's ids.
            match (&mount_target, mount_device) {
                (Some(target), Some(device)) => {
                    if let Err(e) = mount_workspace(target.as_ptr(), device) {
                        mount_failed(e.raw_os_error().unwrap_or(0));
                    }
                }
                (None, Some(_)) => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
                _ => {}
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
    drop(launch.workspace);
    child
}
