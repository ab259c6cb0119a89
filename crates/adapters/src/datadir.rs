//! The data dir: where keys, the SQLite database and the drivers' state live. It is made
//! absolute at start-up (bubblewrap and the drivers get absolute paths whatever the working
//! directory), and private: the process creates everything with no group or other bits
//! (umask 077), and refuses to start when a file the server owns there is readable by
//! anyone but its owner.

use std::fs;
use std::io;
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

/// Walks `path`: the first file or directory with a group or other read bit is refused. A
/// file or directory gone since its directory was listed is skipped: a server running
/// beside this process (a CLI command while `serve` runs) renames and removes its
/// temporary files, and what is gone exposes nothing.
fn check_private(path: &Path, descend_sandbox_owned: bool) -> Result<(), DataDirError> {
    let io = |source| DataDirError::Io { path: path.to_owned(), source };
    let Some(meta) = present(fs::symlink_metadata(path)).map_err(io)? else {
        return Ok(());
    };
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
        let Some(entries) = present(fs::read_dir(path)).map_err(io)? else {
            return Ok(());
        };
        for entry in entries {
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
    let found = present(fs::symlink_metadata(path));
    let Some(meta) = found.map_err(|source| DataDirError::Io { path: path.to_owned(), source })? else {
        return Ok(());
    };
    let mode = meta.permissions().mode() & 0o7777;
    if meta.uid() == current_uid() && mode & 0o044 != 0 {
        return Err(DataDirError::Exposed { path: path.to_owned(), mode });
    }
    Ok(())
}

/// `None` for a path that is not there (any more).
fn present<T>(result: io::Result<T>) -> io::Result<Option<T>> {
    match result {
        Ok(found) => Ok(Some(found)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
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

    /// A CLI command prepares the data dir while `serve` creates, renames and removes
    /// temporary files in it: one gone between the listing and its check is skipped.
    #[test]
    fn files_that_vanish_during_the_walk_are_skipped() {
        let base = tempfile::tempdir().unwrap();
        let data = prepare(&base.path().join("data")).unwrap();
        assert!(check_private(&data.join("images/ephemeral/.sbx_x.img.new"), false).is_ok());
        assert!(check_top_only(&data.join("workspaces")).is_ok());

        let images = data.join("images");
        fs::DirBuilder::new().mode(0o700).create(&images).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let churn = {
            let (images, stop) = (images.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let tmp = images.join(format!(".sbx_{n}.img.new"));
                    // Created private, as the server (umask 077) creates its files.
                    std::os::unix::fs::OpenOptionsExt::mode(
                        fs::OpenOptions::new().write(true).create_new(true),
                        0o600,
                    )
                    .open(&tmp)
                    .unwrap();
                    fs::rename(&tmp, images.join(format!("sbx_{n}.img"))).unwrap();
                    fs::remove_file(images.join(format!("sbx_{n}.img"))).unwrap();
                    n += 1;
                }
            })
        };
        for _ in 0..2_000 {
            prepare(&data).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        churn.join().unwrap();
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
