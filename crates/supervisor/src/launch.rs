//! How the supervisor starts a command: `clone(CLONE_VM | CLONE_VFORK)` and `execve`, the
//! way `posix_spawn` does, instead of `fork`.
//!
//! A `fork` copies the supervisor's page tables and marks its writable pages
//! copy-on-write, only for the child to throw them away at its `exec`; the supervisor then
//! pays a page fault for each page it writes next. Measured on this kind of machine (a
//! virtual machine, where page-table work is dear) with a process of 1 MiB of anonymous
//! memory, as the supervisor has: `fork` + `exec` of `true` 0.94–1.07 ms, `posix_spawn`
//! 0.64–0.74 ms. `posix_spawn` itself cannot set resource limits or drop to a uid, and
//! Rust's `Command` falls back to `fork` whenever either is asked for; so the supervisor
//! does what `posix_spawn` does, with the steps it needs.
//!
//! # What the child may do
//! Until its `execve`, the child runs on a stack of its own but in the supervisor's memory,
//! while the supervisor's thread waits (`CLONE_VFORK`). So it allocates nothing, takes no
//! lock, touches nothing but what [`launch`] prepared, and makes only plain system calls:
//! the uid and gid changes go straight to the kernel (`syscall`), since the C library's
//! wrappers would try to change every thread of what they take for their process. All
//! signals are blocked across the `clone`; the child sets every handled signal back to its
//! default (its handler table is its own: no `CLONE_SIGHAND`), and `SIGPIPE` and `SIGXFSZ`
//! too (the supervisor ignores them; a command gets the defaults), then unblocks all and
//! runs the program. An error before or at `execve` is left in a slot the supervisor reads
//! once its thread resumes, and the child exits; the supervisor reaps it at once.

use std::ffi::{CStr, CString, c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use crate::vfork;

/// Where `execvp` looks when the environment has no `PATH` (glibc's default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// What to start.
pub(crate) struct Launch<'a> {
    /// The program (looked up in the environment's `PATH` unless it holds a `/`) and its
    /// arguments.
    pub argv: &'a [String],
    /// The whole environment.
    pub env: &'a [(String, String)],
    /// The working directory, entered after the drop to `user`.
    pub cwd: &'a str,
    /// Whether the command gets a pipe for standard input (else `/dev/null`).
    pub stdin: bool,
    /// A terminal's other end (see [`crate::pty`]): when given, the command gets it as its
    /// standard input, output and error, instead of pipes, and starts a new session whose
    /// controlling terminal it is (`setsid`, `TIOCSCTTY`), instead of a new process group.
    pub tty: Option<RawFd>,
    /// The uid and gid to run as (none: the supervisor's).
    pub user: Option<(u32, u32)>,
    /// Resource limits: resource, soft, hard.
    pub limits: &'a [(libc::__rlimit_resource_t, u64, u64)],
}

/// A started command: its pid (the leader of its own process group) and the supervisor's
/// ends of its pipes (none on a terminal).
#[derive(Debug)]
pub(crate) struct Spawned {
    pub pid: i32,
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Everything the child reads, prepared before the `clone`.
struct ChildPlan<'a> {
    stdin: RawFd,
    stdout: RawFd,
    stderr: RawFd,
    /// On a terminal: a new session with it as the controlling terminal.
    session: bool,
    cwd: &'a CStr,
    user: Option<(u32, u32)>,
    limits: &'a [(libc::__rlimit_resource_t, u64, u64)],
    /// The paths to try, in order (one when the program names a path).
    candidates: &'a [CString],
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    /// `/bin/sh`, a slot for the script's path, then the arguments after the program:
    /// for a file `execve` refuses as no known format (`ENOEXEC`), as `execvp` does.
    sh_argv: *mut *const libc::c_char,
    /// The error that stopped the child (0: none, the program runs).
    errno: AtomicI32,
}

fn cstring(what: &str, value: &str) -> io::Result<CString> {
    CString::new(value)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("the {what} holds a NUL byte")))
}

/// The paths `execvp` would try for `program` in the environment `env`.
fn candidates(program: &str, env: &[(String, String)]) -> io::Result<Vec<CString>> {
    if program.is_empty() {
        return Err(io::Error::new(io::ErrorKind::NotFound, "empty program name"));
    }
    if program.contains('/') {
        return Ok(vec![cstring("program", program)?]);
    }
    let path = env.iter().rev().find(|(k, _)| k == "PATH").map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    path.split(':')
        .map(|dir| {
            let dir = if dir.is_empty() { "." } else { dir };
            cstring("PATH", &format!("{dir}/{program}"))
        })
        .collect()
}

/// A pipe, both ends close-on-exec: (read, write).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = io::pipe()?;
    Ok((read.into(), write.into()))
}

/// Starts `launch` (see the module's documentation).
///
/// # Errors
/// A NUL byte in an argument, the environment or the directory (`InvalidInput`); no pipe
/// or stack; or what stopped the child before its program ran (the `chdir`, a limit, the
/// `execve`: `NotFound` for no such program, `PermissionDenied`, …).
#[allow(unsafe_code)]
pub(crate) fn launch(launch: &Launch<'_>) -> io::Result<Spawned> {
    let (program, rest) =
        launch.argv.split_first().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "empty argv"))?;
    let candidates = candidates(program, launch.env)?;
    let argv: Vec<CString> = launch.argv.iter().map(|a| cstring("argument", a)).collect::<io::Result<_>>()?;
    let envp: Vec<CString> = launch
        .env
        .iter()
        .map(|(k, v)| cstring("environment", &format!("{k}={v}")))
        .collect::<io::Result<_>>()?;
    let cwd = cstring("working directory", launch.cwd)?;
    let mut argv_ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argv_ptrs.push(std::ptr::null());
    let mut envp_ptrs: Vec<*const libc::c_char> = envp.iter().map(|e| e.as_ptr()).collect();
    envp_ptrs.push(std::ptr::null());
    let rest: Vec<CString> = rest.iter().map(|a| cstring("argument", a)).collect::<io::Result<_>>()?;
    let mut sh_argv: Vec<*const libc::c_char> = vec![c"/bin/sh".as_ptr(), std::ptr::null()];
    sh_argv.extend(rest.iter().map(|a| a.as_ptr()));
    sh_argv.push(std::ptr::null());

    if let Some(tty) = launch.tty {
        // SAFETY: `tty` stays open for this call (the caller holds it).
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(tty) };
        // Numbered 3 or more, as `vfork::stdio` needs.
        let copy = rustix::io::fcntl_dupfd_cloexec(borrowed, 3)?;
        let plan = ChildPlan {
            stdin: copy.as_raw_fd(),
            stdout: copy.as_raw_fd(),
            stderr: copy.as_raw_fd(),
            session: true,
            cwd: &cwd,
            user: launch.user,
            limits: launch.limits,
            candidates: &candidates,
            argv: argv_ptrs.as_ptr(),
            envp: envp_ptrs.as_ptr(),
            sh_argv: sh_argv.as_mut_ptr(),
            errno: AtomicI32::new(0),
        };
        // SAFETY: as below.
        let pid = unsafe { vfork::clone_vfork(child_main, (&raw const plan).cast_mut().cast::<c_void>())? };
        let errno = plan.errno.load(Ordering::Acquire);
        if errno != 0 {
            vfork::reap_exited(pid);
            return Err(io::Error::from_raw_os_error(errno));
        }
        drop(copy);
        return Ok(Spawned { pid, stdin: None, stdout: None, stderr: None });
    }
    let (stdin_child, stdin_ours) = if launch.stdin {
        let (read, write) = pipe()?;
        (read, Some(write))
    } else {
        let null = rustix::fs::open(
            c"/dev/null",
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        (null, None)
    };
    let (stdout_ours, stdout_child) = pipe()?;
    let (stderr_ours, stderr_child) = pipe()?;
    let (stdin_child, stdout_child, stderr_child) = (
        vfork::above_stdio(stdin_child)?,
        vfork::above_stdio(stdout_child)?,
        vfork::above_stdio(stderr_child)?,
    );

    let plan = ChildPlan {
        stdin: stdin_child.as_raw_fd(),
        stdout: stdout_child.as_raw_fd(),
        stderr: stderr_child.as_raw_fd(),
        session: false,
        cwd: &cwd,
        user: launch.user,
        limits: launch.limits,
        candidates: &candidates,
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        sh_argv: sh_argv.as_mut_ptr(),
        errno: AtomicI32::new(0),
    };
    // SAFETY: `plan` and the strings and arrays it points into outlive the child's use of
    // them (`clone_vfork` returns once the child has called `execve` or exited); the
    // child (`child_main`) keeps to what the module's documentation says.
    let pid = unsafe { vfork::clone_vfork(child_main, (&raw const plan).cast_mut().cast::<c_void>())? };
    let errno = plan.errno.load(Ordering::Acquire);
    if errno != 0 {
        vfork::reap_exited(pid);
        return Err(io::Error::from_raw_os_error(errno));
    }
    drop((stdin_child, stdout_child, stderr_child));
    Ok(Spawned { pid, stdin: stdin_ours, stdout: Some(stdout_ours), stderr: Some(stderr_ours) })
}

/// The child, until its program runs. Plain system calls on prepared values only.
#[allow(unsafe_code)]
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `ChildPlan` that `launch` keeps alive until this thread has
    // called `execve` or exited (CLONE_VFORK).
    let plan = unsafe { &*arg.cast::<ChildPlan<'_>>() };
    // SAFETY: every call below is a plain system call on values prepared by `launch`;
    // nothing is allocated and no lock is taken (see the module's documentation).
    unsafe {
        let errno = || *libc::__errno_location();
        let fail = |e: c_int| -> c_int { vfork::fail(&plan.errno, e) };
        if let Err(e) = vfork::stdio(plan.stdin, plan.stdout, plan.stderr) {
            return fail(e);
        }
        if plan.session {
            // A new session (and so a new process group led by the child), whose
            // controlling terminal is the one now on its standard input.
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return fail(errno());
            }
        } else if libc::setpgid(0, 0) != 0 {
            return fail(errno());
        }
        if let Some((uid, gid)) = plan.user {
            if libc::getuid() == 0
                && libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
            {
                return fail(errno());
            }
            if libc::syscall(libc::SYS_setgid, gid) != 0 || libc::syscall(libc::SYS_setuid, uid) != 0 {
                return fail(errno());
            }
        }
        if libc::chdir(plan.cwd.as_ptr()) != 0 {
            return fail(errno());
        }
        for &(resource, soft, hard) in plan.limits {
            let limit = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            if libc::setrlimit(resource, &raw const limit) != 0 {
                return fail(errno());
            }
        }
        // Every handled signal back to its default, and the two the supervisor ignores.
        vfork::default_signals(&[libc::SIGPIPE, libc::SIGXFSZ]);
        vfork::unblock_signals();

        // As execvp: each candidate in turn; a missing one is passed over, a forbidden one
        // remembered; a file of no known format is run by /bin/sh.
        let mut error = libc::ENOENT;
        for candidate in plan.candidates {
            libc::execve(candidate.as_ptr(), plan.argv, plan.envp);
            match errno() {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                libc::EACCES => error = libc::EACCES,
                libc::ENOEXEC => {
                    *plan.sh_argv.add(1) = candidate.as_ptr();
                    libc::execve(c"/bin/sh".as_ptr(), plan.sh_argv.cast_const(), plan.envp);
                    return fail(errno());
                }
                other => return fail(other),
            }
        }
        fail(error)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::io::Read;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// Runs `argv` to its end: exit status, standard output, standard error.
    #[allow(unsafe_code)]
    fn run(
        argv: &[&str],
        env: &[(String, String)],
        cwd: &str,
        limits: &[(libc::__rlimit_resource_t, u64, u64)],
    ) -> (i32, String, String) {
        let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
        let spawned = launch(&Launch { argv: &argv, env, cwd, stdin: false, tty: None, user: None, limits })
            .expect("launch");
        let mut out = String::new();
        let mut err = String::new();
        std::fs::File::from(spawned.stdout.unwrap()).read_to_string(&mut out).unwrap();
        std::fs::File::from(spawned.stderr.unwrap()).read_to_string(&mut err).unwrap();
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        assert_eq!(unsafe { libc::waitpid(spawned.pid, &raw mut status, 0) }, spawned.pid);
        (libc::WEXITSTATUS(status), out, err)
    }

    #[test]
    fn a_command_gets_its_argv_environment_directory_and_limits() {
        let env = env(&[("PATH", "/usr/bin:/bin"), ("GREETING", "hi there")]);
        let limits = [(libc::RLIMIT_NOFILE, 77, 77)];
        let (code, out, err) = run(
            &["sh", "-c", "echo \"$GREETING|$1\"; pwd; ulimit -n; exit 4", "sh", "one two"],
            &env,
            "/tmp",
            &limits,
        );
        assert_eq!((code, out.as_str(), err.as_str()), (4, "hi there|one two\n/tmp\n77\n", ""));
    }

    #[test]
    fn what_stops_a_command_before_it_runs_is_an_error_of_the_right_kind() {
        let env = env(&[("PATH", "/usr/bin:/bin")]);
        let start = |argv: &[&str], cwd: &str| {
            let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
            launch(&Launch { argv: &argv, env: &env, cwd, stdin: false, tty: None, user: None, limits: &[] })
                .map(|s| s.pid)
        };
        assert_eq!(start(&["no-such-program-anywhere"], "/").unwrap_err().kind(), io::ErrorKind::NotFound);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::write(&data, b"not a program").unwrap();
        let data = data.to_str().unwrap();
        assert_eq!(start(&[data], "/").unwrap_err().kind(), io::ErrorKind::PermissionDenied);
        assert_eq!(start(&["true"], "/no/such/dir").unwrap_err().kind(), io::ErrorKind::NotFound);
        assert_eq!(start(&["echo", "a\0b"], "/").unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(start(&[], "/").unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    /// On a terminal: one stream, the terminal's size seen, and the command leads a new
    /// session whose controlling terminal it is.
    #[test]
    #[allow(unsafe_code)]
    fn a_command_on_a_terminal_leads_its_session_and_sees_its_size() {
        let pty = crate::pty::open(77, 21, None).unwrap();
        let env = env(&[("PATH", "/usr/bin:/bin")]);
        let argv: Vec<String> =
            ["sh", "-c", "stty size; ps -o sid= -o tpgid= -p $$ 2>/dev/null || true; exit 5"]
                .iter()
                .map(|a| (*a).to_owned())
                .collect();
        let tty = Some(pty.slave.as_raw_fd());
        let spawned =
            launch(&Launch { argv: &argv, env: &env, cwd: "/", stdin: false, tty, user: None, limits: &[] })
                .unwrap();
        assert!(spawned.stdout.is_none() && spawned.stdin.is_none());
        drop(pty.slave);
        let mut out = Vec::new();
        let mut buf = [0u8; 256];
        // Blocking reads of the master until the kernel's EIO (every other end closed).
        rustix::fs::fcntl_setfl(&pty.master, rustix::fs::OFlags::RDWR).unwrap();
        while let Ok(n) = rustix::io::read(&pty.master, &mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let mut status = 0;
        // SAFETY: waitpid writes only into `status`.
        assert_eq!(unsafe { libc::waitpid(spawned.pid, &raw mut status, 0) }, spawned.pid);
        assert_eq!(libc::WEXITSTATUS(status), 5);
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with("21 77\r\n"), "{out:?}");
        // Its session is its own pid, and its terminal's foreground group is its own.
        if let Some(line) = out.lines().nth(1).filter(|l| !l.trim().is_empty()) {
            let ids: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(ids, [spawned.pid.to_string(), spawned.pid.to_string()], "{out:?}");
        }
    }
}
