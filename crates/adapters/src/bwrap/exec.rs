//! Running one bubblewrap process: joining the command's cgroup, setting rlimits,
//! closing inherited descriptors and dropping to the sandbox's host ids in the child
//! before `exec`, then feeding stdin, capping output and enforcing the wall-clock
//! timeout by killing the whole process tree.

use std::ffi::OsString;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use domain::ExecOutput;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::config::Limits;
use super::limits::{ExecCgroup, children_of, rlimits, sigkill, sigkill_group};

/// How one process is started.
pub(crate) struct Launch<'a> {
    /// The bubblewrap program.
    pub program: &'a Path,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Bytes for standard input.
    pub stdin: &'a [u8],
    /// The wall-clock limit.
    pub timeout: Duration,
    /// Captured bytes per stream.
    pub output_cap: usize,
    /// The rlimits.
    pub limits: Limits,
    /// Host uid/gid to drop to before `exec` (`None`: stay as the server).
    pub drop_to: Option<u32>,
    /// The command's cgroup, if any.
    pub cgroup: Option<ExecCgroup>,
}

/// Called with the pid of the started process, and again with `None` when it is gone.
pub(crate) type PidHook<'a> = &'a (dyn Fn(Option<u32>) + Send + Sync);

/// Installs the child-side setup: join the cgroup, rlimits, close-on-exec for every
/// inherited descriptor above stdio, and the drop to unprivileged host ids.
#[allow(unsafe_code)]
fn install_pre_exec(cmd: &mut Command, procs_fds: Vec<i32>, limits: &Limits, drop_to: Option<u32>) {
    let rlimits = rlimits(limits);
    // SAFETY: the closure runs in the forked child before exec. It only makes
    // async-signal-safe system calls (write, setrlimit, close_range, fcntl, setgroups,
    // setgid, setuid) on values prepared before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let me = b"0";
            for fd in &procs_fds {
                if libc::write(*fd, me.as_ptr().cast(), me.len()) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (resource, soft, hard) in &rlimits {
                let limit = libc::rlimit { rlim_cur: *soft, rlim_max: *hard };
                if libc::setrlimit(*resource, &limit) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            if libc::close_range(3, libc::c_uint::MAX, libc::CLOSE_RANGE_CLOEXEC as libc::c_int) != 0 {
                for fd in 3..65_536 {
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
}

async fn read_capped<R: AsyncRead + Unpin>(mut stream: R, cap: usize) -> (Vec<u8>, bool) {
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                if n > room {
                    truncated = true;
                }
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
    (kept, truncated)
}

/// Runs one process to completion or timeout.
///
/// # Errors
/// The spawn error (program missing, a child-side setup step failed).
pub(crate) async fn run(launch: Launch<'_>, on_pid: PidHook<'_>) -> io::Result<ExecOutput> {
    let mut cmd = Command::new(launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .current_dir("/")
        .stdin(if launch.stdin.is_empty() { Stdio::null() } else { Stdio::piped() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let procs_fds: Vec<i32> = launch
        .cgroup
        .as_ref()
        .map(|g| g.procs_files().iter().map(File::as_raw_fd).collect())
        .unwrap_or_default();
    install_pre_exec(&mut cmd, procs_fds, &launch.limits, launch.drop_to);

    let spawned = cmd.spawn();
    let mut child = match spawned {
        Ok(child) => child,
        Err(e) => {
            if let Some(group) = launch.cgroup {
                group.kill_and_remove().await;
            }
            return Err(e);
        }
    };
    let pid = child.id();
    on_pid(pid);
    let pid = pid.and_then(|p| i32::try_from(p).ok()).unwrap_or(0);

    let stdin = child.stdin.take();
    let input = launch.stdin.to_vec();
    let feed = tokio::spawn(async move {
        if let Some(mut stdin) = stdin {
            // A command that does not read its input closes the pipe: not an error.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }
    });
    let cap = launch.output_cap;
    let out = child.stdout.take().map(|s| tokio::spawn(read_capped(s, cap)));
    let err = child.stderr.take().map(|s| tokio::spawn(read_capped(s, cap)));

    let (status, timed_out) = match tokio::time::timeout(launch.timeout, child.wait()).await {
        Ok(status) => (status, false),
        Err(_) => {
            // The command is bubblewrap's only child and the pid namespace's init: killing
            // it ends the namespace and every process in it, and bubblewrap reaps it and
            // exits. Killing bubblewrap first would orphan the init as a zombie.
            for inner in children_of(pid) {
                sigkill(inner);
            }
            match tokio::time::timeout(Duration::from_secs(1), child.wait()).await {
                Ok(status) => (status, true),
                Err(_) => {
                    sigkill(pid);
                    sigkill_group(pid);
                    (child.wait().await, true)
                }
            }
        }
    };
    // Whatever is left (a process that escaped the tree) goes with the cgroup.
    if let Some(group) = launch.cgroup {
        group.kill_and_remove().await;
    }
    sigkill_group(pid);
    on_pid(None);
    feed.abort();

    let collect = |handle: Option<tokio::task::JoinHandle<(Vec<u8>, bool)>>| async move {
        match handle {
            Some(h) => tokio::time::timeout(Duration::from_secs(5), h)
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default(),
            None => (Vec::new(), false),
        }
    };
    let (stdout, out_cut) = collect(out).await;
    let (stderr, err_cut) = collect(err).await;
    let status = status?;
    let exit_code = status
        .code()
        .or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            status.signal().map(|s| 128 + s)
        })
        .unwrap_or(-1);
    Ok(ExecOutput { exit_code, stdout, stderr, timed_out, truncated: out_cut || err_cut })
}
