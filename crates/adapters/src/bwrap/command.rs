//! The bubblewrap argument vector of one command: namespaces, ids, capabilities, the
//! read-only system binds, the workspace and token binds, and exactly the sandbox's
//! environment.

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

/// What differs between sandboxes and commands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CommandSpec<'a> {
    /// The workspace on the host, bound read-write at `/workspace`.
    pub workspace: &'a Path,
    /// The token file on the host, bound read-only at [`TOKEN_FILE_PATH`].
    pub token: &'a Path,
    /// Exactly the environment inside (`DriverEnvironment::vars`).
    pub env: &'a [(&'static str, String)],
    /// The command.
    pub argv: &'a [String],
}

/// The arguments after the program name.
pub(crate) fn bwrap_args(config: &BwrapConfig, binds: &[SystemBind], spec: CommandSpec<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::with_capacity(64 + spec.argv.len());
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
        "--die-with-parent",
        "--new-session",
        "--as-pid-1",
        "--hostname",
        "sandbox",
        "--clearenv",
    ]);
    if config.disable_nested_userns {
        push(&["--disable-userns"]);
    }
    for (name, value) in spec.env {
        push(&["--setenv", name, value]);
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
    args.push(spec.token.into());
    args.push(TOKEN_FILE_PATH.into());
    args.extend(
        ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", WORKSPACE_PATH, "--"].map(OsString::from),
    );
    // bubblewrap always exports PWD after its chdir; `env` takes it out again, so the
    // command sees exactly the contract's variables.
    args.extend(ENV_WRAPPER.iter().map(OsString::from));
    args.extend(spec.argv.iter().map(OsString::from));
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
