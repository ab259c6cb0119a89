//! The data dir: where keys, the SQLite database and the drivers' state live. It is made
//! absolute at start-up (bubblewrap and the drivers get absolute paths whatever the working
//! directory), and private: the process creates everything with no group or other bits
//! (umask 077), and refuses to start when a file the server owns there is readable by
//! anyone but its owner.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Sub-directories whose contents belong to the sandboxes (their users own them and may
/// share them among their own processes as they like): not checked below their top.
const SANDBOX_OWNED: &[&str] = &["workspaces"];

/// Why the data dir cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    /// It could not be created or resolved.
    #[error("cannot prepare the data dir {path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file under it is readable by others than its owner.
    #[error(
        "{path} is readable by others than its owner (mode {mode:04o}); the data dir holds keys and \
         credentials: `chmod go-rwx` it (and everything under it) and start again"
    )]
    Exposed {
        /// The file.
        path: PathBuf,
        /// Its mode bits.
        mode: u32,
    },
}

/// Sets the process umask to 077, so every file and directory the server creates from
/// now on has no group or other bits unless it sets them explicitly. Call it first thing.
#[allow(unsafe_code)]
pub fn restrict_umask() {
    // SAFETY: umask(2) only swaps the process's file mode creation mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}

/// Creates `dir` (mode 0700) when missing, returns its absolute, symlink-free path, and
/// checks that nothing the server keeps under it is readable by others.
///
/// # Errors
/// [`DataDirError::Io`] when it cannot be created or read; [`DataDirError::Exposed`]
/// naming the first exposed file.
pub fn prepare(dir: &Path) -> Result<PathBuf, DataDirError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| DataDirError::Io { path, source }
    };
    if !dir.exists() {
        fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io(dir))?;
    }
    let absolute = fs::canonicalize(dir).map_err(io(dir))?;
    check_private(&absolute, true)?;
    Ok(absolute)
}

/// Walks `path`: the first file or directory with a group or other read bit is refused.
fn check_private(path: &Path, descend_sandbox_owned: bool) -> Result<(), DataDirError> {
    let io = |source| DataDirError::Io { path: path.to_owned(), source };
    let meta = fs::symlink_metadata(path).map_err(io)?;
    if meta.file_type().is_symlink() {
        return Ok(());
    }
    let mode = meta.permissions().mode() & 0o7777;
    // Sandbox-owned files (a token file owned by a sandbox's uid) are the sandbox's; the
    // server's own files are owned by the server's uid.
    if meta.uid() == current_uid() && mode & 0o044 != 0 {
        return Err(DataDirError::Exposed { path: path.to_owned(), mode });
    }
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(io)? {
            let entry = entry.map_err(io)?;
            let child = entry.path();
            let sandbox_owned = descend_sandbox_owned
                && SANDBOX_OWNED.iter().any(|name| entry.file_name() == std::ffi::OsStr::new(name));
            if sandbox_owned {
                check_top_only(&child)?;
            } else {
                check_private(&child, false)?;
            }
        }
    }
    Ok(())
}

/// The directories leading to the sandboxes' workspaces, not the workspaces' contents.
fn check_top_only(path: &Path) -> Result<(), DataDirError> {
    let meta =
        fs::symlink_metadata(path).map_err(|source| DataDirError::Io { path: path.to_owned(), source })?;
    let mode = meta.permissions().mode() & 0o7777;
    if meta.uid() == current_uid() && mode & 0o044 != 0 {
        return Err(DataDirError::Exposed { path: path.to_owned(), mode });
    }
    Ok(())
}

#[allow(unsafe_code)]
fn current_uid() -> u32 {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_dir_is_made_absolute_and_created_private() {
        let base = tempfile::tempdir().unwrap();
        let relative = base.path().join("a/../data");
        let got = prepare(&relative).unwrap();
        assert!(got.is_absolute());
        assert_eq!(got, fs::canonicalize(base.path()).unwrap().join("data"));
        assert_eq!(fs::metadata(&got).unwrap().permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn an_exposed_file_is_refused_by_name() {
        let base = tempfile::tempdir().unwrap();
        let data = prepare(&base.path().join("data")).unwrap();
        let key = data.join("signing-keys.json");
        fs::write(&key, "{}").unwrap();
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        prepare(&data).unwrap();
        for exposed in [0o644, 0o640, 0o604] {
            fs::set_permissions(&key, fs::Permissions::from_mode(exposed)).unwrap();
            let err = prepare(&data).unwrap_err();
            assert!(matches!(&err, DataDirError::Exposed { path, .. } if *path == key), "{err}");
            assert!(err.to_string().contains("signing-keys.json"), "{err}");
        }
        // Deep under the server's own state too.
        fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).unwrap();
        let state = data.join("sandboxes/sbx_x");
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&state).unwrap();
        fs::set_permissions(data.join("sandboxes"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::write(state.join("meta.json"), "{}").unwrap();
        fs::set_permissions(state.join("meta.json"), fs::Permissions::from_mode(0o644)).unwrap();
        let err = prepare(&data).unwrap_err();
        assert!(err.to_string().contains("meta.json"), "{err}");
    }

    #[test]
    fn inside_a_workspace_is_the_sandboxes_business() {
        let base = tempfile::tempdir().unwrap();
        let data = prepare(&base.path().join("data")).unwrap();
        let ws = data.join("workspaces/ephemeral/sbx_y");
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&ws).unwrap();
        fs::write(ws.join("shared.txt"), "hello").unwrap();
        fs::set_permissions(ws.join("shared.txt"), fs::Permissions::from_mode(0o644)).unwrap();
        prepare(&data).unwrap();
        fs::set_permissions(data.join("workspaces"), fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(prepare(&data), Err(DataDirError::Exposed { .. })));
    }
}
