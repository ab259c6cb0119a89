//! Where the driver keeps what changes at every ensure: each sandbox's token directory
//! (bound read-only at `/run/sandlane`) and the environment of its latest ensure.
//!
//! # In memory, never on disk
//! Both live on a tmpfs when the host has one at `/dev/shm`: under
//! `/dev/shm/sandlane-<hash of the sandbox root>/`. A credential then never reaches a disk,
//! and the writes of an adoption or a re-ensure cost no filesystem journal. That cost is
//! not small on ext4: replacing a file by `rename` makes ext4 write the new file's data
//! at once (its `auto_da_alloc` heuristic), so every token written on the data dir's disk
//! was a disk write on the ensure's path, queued beside the database's commits on the same
//! disk. Measured with the policy bench on this machine (durable Postgres on the same
//! disk; docs/benchmarks/2026-12-03.md, the run of 16:52): adoption of a warm sandbox p50
//! 2.8–3.8 ms in eight runs with tokens in memory, against 4.8 and 5.6 ms on disk.
//!
//! The directory outlives a server restart (sandboxes do too, still bound to it) and ends
//! with the host (as the sandboxes do). Its name is derived from the sandbox root, so a
//! restarted server, or another replica on the same host and data dir, finds it again.
//!
//! # When it stays on disk
//! `<sandbox_root>/run` (as before) when `/dev/shm` is not a tmpfs, when the directory
//! there exists but is not this server's own (a symlink, another owner, writable by
//! others: `/dev/shm` is world-writable, so a name there is only trusted once checked),
//! or when `<sandbox_root>/run` still holds token directories: sandboxes started by an
//! earlier version are bound to those, so their tokens must keep being written there
//! until they are gone. [`TokenRoot::detail`] says which, in the driver's health.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Where `/dev/shm`'s tmpfs is expected.
const SHM: &str = "/dev/shm";

/// `statfs`'s magic number of a tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// The chosen place and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TokenRoot {
    /// The directory holding one token directory per sandbox and `env/`.
    pub path: PathBuf,
    /// Whether it is on a tmpfs.
    pub in_memory: bool,
    /// Why it is on disk, when it is.
    pub why_disk: Option<String>,
}

impl TokenRoot {
    /// Chooses the place for the sandbox root `sandbox_root` (see the module's doc), with
    /// `mode` for the directory (searchable by the sandboxes' uids, or private).
    pub fn choose(sandbox_root: &Path, mode: u32) -> Self {
        Self::choose_under(Path::new(SHM), sandbox_root, mode)
    }

    pub(crate) fn choose_under(shm: &Path, sandbox_root: &Path, mode: u32) -> Self {
        let disk = sandbox_root.join("run");
        let on_disk = |why: String| Self { path: disk.clone(), in_memory: false, why_disk: Some(why) };
        if holds_entries(&disk) {
            return on_disk(format!(
                "{} holds the token directories of sandboxes started before tokens moved to memory",
                disk.display()
            ));
        }
        if !is_tmpfs(shm) {
            return on_disk(format!("{} is not a tmpfs", shm.display()));
        }
        let path = in_memory_under(shm, sandbox_root);
        match own_dir(&path, mode) {
            Ok(()) => Self { path, in_memory: true, why_disk: None },
            Err(why) => on_disk(why),
        }
    }

    /// For the driver's health: where tokens are kept.
    pub fn detail(&self) -> String {
        match &self.why_disk {
            None => format!("tokens: in memory ({})", self.path.display()),
            Some(why) => format!("tokens: on disk ({why})"),
        }
    }
}

/// Where the tokens of `sandbox_root` are kept when they are in memory (whether they are
/// is the driver's choice at its start: see its health).
pub fn in_memory(sandbox_root: &Path) -> PathBuf {
    in_memory_under(Path::new(SHM), sandbox_root)
}

fn in_memory_under(shm: &Path, sandbox_root: &Path) -> PathBuf {
    shm.join(format!("sandlane-{}", name_of(sandbox_root)))
}

/// A stable name for `sandbox_root`: the first 8 bytes of the SHA-256 of its canonical
/// path, in hex.
fn name_of(sandbox_root: &Path) -> String {
    let canonical = std::fs::canonicalize(sandbox_root).unwrap_or_else(|_| sandbox_root.to_path_buf());
    let digest = Sha256::digest(canonical.as_os_str().as_encoded_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `dir` holds a sandbox's token directory (anything but `env/`, which holds
/// environments only while token directories are there too).
fn holds_entries(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| entries.flatten().any(|e| e.file_name() != "env"))
}

#[allow(unsafe_code)]
fn is_tmpfs(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs writes into the zeroed struct it is given; the path is NUL-terminated.
    let mut stat: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statfs(c_path.as_ptr(), &raw mut stat) } != 0 {
        return false;
    }
    // `f_type`'s integer type differs between platforms (`i64` here).
    #[allow(clippy::unnecessary_cast)]
    let magic = stat.f_type as i64;
    magic == TMPFS_MAGIC
}

/// Makes `path` a directory of this process's user with `mode`, or checks that the one
/// there is: a real directory (not a symlink), owned by this user, writable by no one
/// else. Anything else is refused (someone else could read or replace what is written).
fn own_dir(path: &Path, mode: u32) -> Result<(), String> {
    match std::fs::DirBuilder::new().mode(mode).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
    }
    let meta =
        std::fs::symlink_metadata(path).map_err(|e| format!("cannot check {}: {e}", path.display()))?;
    let (euid, _) = super::workspace::effective_ids();
    if !meta.file_type().is_dir() || meta.uid() != euid || meta.mode() & 0o022 != 0 {
        return Err(format!("{} exists and is not this server's own private directory", path.display()));
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shm_or_skip() -> Option<PathBuf> {
        // A private directory on the host's tmpfs stands in for `/dev/shm` itself.
        if !is_tmpfs(Path::new(SHM)) {
            eprintln!("skipped: {SHM} is not a tmpfs here");
            return None;
        }
        Some(tempfile::Builder::new().prefix("sandlane-test-shm-").tempdir_in(SHM).ok()?.keep())
    }

    #[test]
    fn a_tmpfs_is_chosen_and_found_again_under_the_same_name() {
        let Some(shm) = shm_or_skip() else { return };
        let root = tempfile::tempdir().unwrap();
        let first = TokenRoot::choose_under(&shm, root.path(), 0o711);
        assert!(first.in_memory, "{first:?}");
        assert!(first.path.starts_with(&shm));
        assert_eq!(std::fs::metadata(&first.path).unwrap().mode() & 0o777, 0o711);
        // A restarted server (or another replica) of the same sandbox root: the same place.
        assert_eq!(TokenRoot::choose_under(&shm, root.path(), 0o711), first);
        // Another sandbox root: another place.
        let other = tempfile::tempdir().unwrap();
        assert_ne!(TokenRoot::choose_under(&shm, other.path(), 0o711).path, first.path);
        std::fs::remove_dir_all(&shm).unwrap();
    }

    #[test]
    fn tokens_stay_on_disk_while_sandboxes_of_before_are_bound_there() {
        let Some(shm) = shm_or_skip() else { return };
        let root = tempfile::tempdir().unwrap();
        // An empty `env/` alone does not keep them there.
        std::fs::create_dir_all(root.path().join("run/env")).unwrap();
        assert!(TokenRoot::choose_under(&shm, root.path(), 0o711).in_memory);
        std::fs::create_dir_all(root.path().join("run/sbx_old")).unwrap();
        let chosen = TokenRoot::choose_under(&shm, root.path(), 0o711);
        assert_eq!(chosen.path, root.path().join("run"));
        assert!(!chosen.in_memory);
        assert!(chosen.detail().contains("started before"), "{}", chosen.detail());
        std::fs::remove_dir_all(&shm).unwrap();
    }

    #[test]
    fn a_name_taken_by_a_symlink_or_an_open_directory_is_refused() {
        let Some(shm) = shm_or_skip() else { return };
        let root = tempfile::tempdir().unwrap();
        let name = shm.join(format!("sandlane-{}", name_of(root.path())));
        // Someone points the name at a directory of their choosing.
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &name).unwrap();
        let chosen = TokenRoot::choose_under(&shm, root.path(), 0o711);
        assert!(!chosen.in_memory, "a symlink was trusted: {chosen:?}");
        assert_eq!(chosen.path, root.path().join("run"));
        // A directory others may write to.
        std::fs::remove_file(&name).unwrap();
        std::fs::create_dir(&name).unwrap();
        std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(!TokenRoot::choose_under(&shm, root.path(), 0o711).in_memory);
        // Positive control: once it is private, it is used.
        std::fs::set_permissions(&name, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(TokenRoot::choose_under(&shm, root.path(), 0o711).in_memory);
        std::fs::remove_dir_all(&shm).unwrap();
    }

    #[test]
    fn without_a_tmpfs_tokens_stay_on_disk() {
        let root = tempfile::tempdir().unwrap();
        let not_tmpfs = tempfile::tempdir().unwrap();
        if is_tmpfs(not_tmpfs.path()) {
            eprintln!("skipped: the temp dir is a tmpfs here");
            return;
        }
        let chosen = TokenRoot::choose_under(not_tmpfs.path(), root.path(), 0o711);
        assert!(!chosen.in_memory);
        assert!(chosen.detail().contains("not a tmpfs"), "{}", chosen.detail());
    }
}
