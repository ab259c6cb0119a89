//! The bubblewrap argument vector of a sandbox: namespaces, ids, capabilities, the
//! read-only system binds, the workspace and token binds, and the supervisor as init.

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};

use domain::split::{TOKEN_FILE_PATH, WORKSPACE_PATH};

use super::config::BwrapConfig;

/// Runs the command with `PWD` removed from the environment bubblewrap hands it.
pub(crate) const ENV_WRAPPER: [&str; 4] = ["/usr/bin/env", "-u", "PWD", "--"];

/// A system path as it appears inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SystemBind {
    /// Bound read-only from the host at the same place.
    ReadOnly(PathBuf),
    /// A host symlink (e.g. `/bin -> usr/bin` on a merged-/usr system), recreated.
    Symlink {
        /// Where the link points.
        target: PathBuf,
        /// Where the link is.
        at: PathBuf,
    },
}

/// Resolves the configured system paths: missing ones are skipped, symlinks kept as
/// symlinks, relative paths refused.
pub(crate) fn resolve_binds(paths: &[PathBuf]) -> Vec<SystemBind> {
    paths
        .iter()
        .filter(|p| p.is_absolute())
        .filter_map(|p| {
            let meta = fs::symlink_metadata(p).ok()?;
            if meta.file_type().is_symlink() {
                let target = fs::read_link(p).ok()?;
                Some(SystemBind::Symlink { target, at: p.clone() })
            } else {
                Some(SystemBind::ReadOnly(p.clone()))
            }
        })
        .collect()
}

/// Where the supervisor's program is bound inside (read-only).
pub(crate) const SUPERVISOR_PATH: &str = "/.sandlane/supervisor";

/// The descriptor the supervisor inherits its listening socket on.
pub(crate) const LISTEN_FD: i32 = 3;

/// What differs between sandboxes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SandboxSpec<'a> {
    /// The workspace on the host, bound read-write at `/workspace`.
    pub workspace: &'a Path,
    /// The token directory on the host, bound read-only at `/run/sandlane`.
    pub run_dir: &'a Path,
}

/// The isolation every sandbox gets: namespaces, ids, capabilities, the system binds,
/// private `/proc`, `/dev` and `/tmp`, the workspace and token binds.
fn isolation(config: &BwrapConfig, binds: &[SystemBind], spec: SandboxSpec<'_>, args: &mut Vec<OsString>) {
    let mut push = |items: &[&str]| args.extend(items.iter().map(OsString::from));
    let inner = config.inner_id.to_string();
    push(&[
        "--unshare-all",
        "--unshare-user",
        "--uid",
        &inner,
        "--gid",
        &inner,
        "--cap-drop",
        "ALL",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]);
    if config.disable_nested_userns {
        push(&["--disable-userns"]);
    }
    for bind in binds {
        match bind {
            SystemBind::ReadOnly(path) => {
                args.push("--ro-bind".into());
                args.push(path.into());
                args.push(path.into());
            }
            SystemBind::Symlink { target, at } => {
                args.push("--symlink".into());
                args.push(target.into());
                args.push(at.into());
            }
        }
    }
    args.extend(["--proc", "/proc", "--dev", "/dev"].map(OsString::from));
    if let Some(size) = config.tmp_size_bytes {
        args.extend(["--size".into(), size.to_string().into()]);
    }
    args.extend(["--tmpfs", "/tmp", "--bind"].map(OsString::from));
    args.push(spec.workspace.into());
    args.push(WORKSPACE_PATH.into());
    args.push("--ro-bind".into());
    args.push(spec.run_dir.into());
    args.push(token_dir().into());
}

/// The directory of the token file inside (`/run/sandlane`).
pub(crate) fn token_dir() -> &'static str {
    TOKEN_FILE_PATH.rsplit_once('/').map_or("/", |(dir, _)| dir)
}

/// The arguments (after the program name) of the sandbox's one bubblewrap: the
/// supervisor as the pid namespace's init, with its listening socket on [`LISTEN_FD`];
/// with `egress_port`, the supervisor listens on the egress proxy's port itself (where
/// the server cannot open that socket in the sandbox's namespace).
/// No `--die-with-parent`: the sandbox outlives a server restart.
pub(crate) fn supervisor_args(
    config: &BwrapConfig,
    binds: &[SystemBind],
    spec: SandboxSpec<'_>,
    seccomp: bool,
    egress_port: bool,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::with_capacity(80);
    isolation(config, binds, spec, &mut args);
    args.push("--ro-bind".into());
    args.push(config.supervisor.as_os_str().into());
    args.push(SUPERVISOR_PATH.into());
    args.extend(
        ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKSPACE_PATH, "--"].map(OsString::from),
    );
    args.extend([SUPERVISOR_PATH, "--listen-fd", &LISTEN_FD.to_string()].map(OsString::from));
    if seccomp {
        args.push("--seccomp".into());
    }
    // The egress proxy on the sandbox's own loopback (its network namespace has nothing else).
    if egress_port {
        args.extend(["--egress-port".into(), domain::egress::PROXY_PORT.to_string().into()]);
    }
    args
}

/// The arguments of a one-off bubblewrap that runs `argv` in the same isolation (the
/// environment set with `--setenv`), as every command ran before sandboxes were
/// resident: what the benchmarks compare an exec with.
pub(crate) fn one_off_args(
    config: &BwrapConfig,
    binds: &[SystemBind],
    spec: SandboxSpec<'_>,
    env: &[(&'static str, String)],
    argv: &[String],
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::with_capacity(80 + argv.len());
    isolation(config, binds, spec, &mut args);
    args.push("--die-with-parent".into());
    for (name, value) in env {
        args.extend(["--setenv".into(), OsString::from(name), OsString::from(value)]);
    }
    args.extend(
        ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKSPACE_PATH, "--"].map(OsString::from),
    );
    // bubblewrap always exports PWD after its chdir; `env` takes it out again.
    args.extend(ENV_WRAPPER.iter().map(OsString::from));
    args.extend(argv.iter().map(OsString::from));
    args
}

/// The bubblewrap program: `program` itself when it holds a `/`, else the first
/// executable of that name on `PATH`.
///
/// # Errors
/// A message saying the program is missing and how to install it.
pub(crate) fn resolve_program(program: &Path) -> Result<PathBuf, String> {
    let missing = || {
        format!(
            "bubblewrap program `{}` not found; install it with `apt-get install bubblewrap` \
             or set SANDLANE_BWRAP",
            program.display()
        )
    };
    let is_exec = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.as_os_str().is_empty() {
        return Err(missing());
    }
    if program.components().count() > 1 || program.is_absolute() {
        return if is_exec(program) { Ok(program.to_path_buf()) } else { Err(missing()) };
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_exec(candidate))
        .ok_or_else(missing)
}
