//! Snapshot files on the host, shared by the bubblewrap and container drivers.
//!
//! ```text
//! <root>/<org>/<snapshot_id>/workspace.img     a workspace with a quota: its ext4 image
//! <root>/<org>/<snapshot_id>/quota             the quota that image was made for
//! <root>/<org>/<snapshot_id>/owner             `UID:GID` its files belong to, when known
//! <root>/<org>/<snapshot_id>/tree/             a workspace without a quota: its files
//! <root>/<org>/.<snapshot_id>.partial/         one being taken (renamed whole into place)
//! ```
//!
//! # Cost in proportion to what the workspace uses
//! An image is copied with `FICLONE` where the filesystem shares blocks (XFS with reflink,
//! btrfs): one call, whatever the image holds, and the copy costs no space until one side
//! writes. Elsewhere (ext4) only its data extents are copied (`SEEK_DATA`/`SEEK_HOLE`,
//! `copy_file_range`), so a sparse 1 GiB image that holds 10 MiB costs a copy of about
//! 10 MiB and the filesystem's few MiB of metadata, never the quota. A tree is copied by
//! `cp -a --reflink=auto --sparse=always` (shared blocks where the filesystem can).
//!
//! Nothing here reads what a snapshot holds: a tree is copied without following a link,
//! from a sandbox whose processes are frozen, and an image is only ever mounted by the
//! kernel as the filesystem of a workspace.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use ports::{DriverError, SnapshotRef};

const IMAGE: &str = "workspace.img";
const QUOTA: &str = "quota";
const OWNER: &str = "owner";
const TREE: &str = "tree";

/// Where the snapshots of one driver live.
#[derive(Debug, Clone)]
pub struct SnapshotFiles {
    root: PathBuf,
}

/// What a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    /// A workspace image, made for `quota` bytes.
    Image {
        /// The image file.
        image: PathBuf,
        /// Its quota.
        quota: u64,
        /// The uid and gid its files belong to, when recorded.
        owner: Option<(u32, u32)>,
    },
    /// The files of a workspace without a quota.
    Tree(PathBuf),
}

impl SnapshotFiles {
    /// Snapshots under `root` (created when the first is taken; root only).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn dir(&self, snapshot: &SnapshotRef) -> PathBuf {
        self.root.join(snapshot.org.as_str()).join(snapshot.id.as_str())
    }

    fn partial(&self, snapshot: &SnapshotRef) -> PathBuf {
        self.root.join(snapshot.org.as_str()).join(format!(".{}.partial", snapshot.id))
    }

    /// What the snapshot holds; `Ok(None)` when it has no files here.
    ///
    /// # Errors
    /// When its files cannot be read.
    pub fn stored(&self, snapshot: &SnapshotRef) -> Result<Option<Stored>, String> {
        let dir = self.dir(snapshot);
        let image = dir.join(IMAGE);
        if image.is_file() {
            let quota = fs::read_to_string(dir.join(QUOTA))
                .map_err(|e| format!("cannot read the quota of snapshot {}: {e}", snapshot.id))?;
            let quota = quota
                .trim()
                .parse()
                .map_err(|e| format!("corrupt quota of snapshot {}: {e}", snapshot.id))?;
            let owner = fs::read_to_string(dir.join(OWNER)).ok().and_then(|text| {
                let (uid, gid) = text.trim().split_once(':')?;
                Some((uid.parse().ok()?, gid.parse().ok()?))
            });
            return Ok(Some(Stored::Image { image, quota, owner }));
        }
        let tree = dir.join(TREE);
        Ok(tree.is_dir().then_some(Stored::Tree(tree)))
    }

    /// Takes a snapshot of a workspace image made for `quota` whose files belong to
    /// `owner` (nothing may write to the image meanwhile: the sandbox is frozen and its
    /// filesystem synced, or unmounted). Returns the bytes it holds.
    ///
    /// # Errors
    /// A message naming the step that failed; nothing of the snapshot is left.
    pub fn take_image(
        &self,
        snapshot: &SnapshotRef,
        image: &Path,
        quota: u64,
        owner: Option<(u32, u32)>,
    ) -> Result<u64, String> {
        self.take(snapshot, |partial| {
            // Everything on disk before the snapshot is recorded: a host that crashes after
            // the answer keeps it whole (the image, and the two records a fork reads: an
            // unsynced new file can come back empty).
            if let Some((uid, gid)) = owner {
                write_synced(&partial.join(OWNER), &format!("{uid}:{gid}"))
                    .map_err(|e| format!("cannot record the owner: {e}"))?;
            }
            write_synced(&partial.join(QUOTA), &quota.to_string())
                .map_err(|e| format!("cannot record the quota: {e}"))?;
            clone_or_copy(image, &partial.join(IMAGE))
                .map_err(|e| format!("cannot copy the workspace image {}: {e}", image.display()))?;
            fs::File::open(partial.join(IMAGE))
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("cannot sync the snapshot's image: {e}"))
        })
    }

    /// Takes a snapshot of a workspace directory (the sandbox is frozen or stopped).
    /// Returns the bytes it holds.
    ///
    /// # Errors
    /// A message naming the step that failed; nothing of the snapshot is left.
    pub fn take_tree(&self, snapshot: &SnapshotRef, workspace: &Path) -> Result<u64, String> {
        self.take(snapshot, |partial| {
            copy_tree(workspace, &partial.join(TREE))?;
            sync_fs(partial)
        })
    }

    fn take(
        &self,
        snapshot: &SnapshotRef,
        fill: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<u64, String> {
        let org = self.root.join(snapshot.org.as_str());
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&org)
            .map_err(|e| format!("cannot create {}: {e}", org.display()))?;
        let partial = self.partial(snapshot);
        let _ = fs::remove_dir_all(&partial);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        let done = fill(&partial).and_then(|()| {
            fs::rename(&partial, self.dir(snapshot))
                .map_err(|e| format!("cannot place snapshot {}: {e}", snapshot.id))
        });
        // The rename itself on disk too.
        let done = done.and_then(|()| {
            fs::File::open(&org)
                .and_then(|d| d.sync_all())
                .map_err(|e| format!("cannot sync {}: {e}", org.display()))
        });
        if let Err(e) = done {
            // Wherever it got to: a snapshot that is not recorded leaves no files.
            let _ = fs::remove_dir_all(&partial);
            let _ = fs::remove_dir_all(self.dir(snapshot));
            return Err(e);
        }
        Ok(allocated_bytes(&self.dir(snapshot)))
    }

    /// Deletes the snapshot's files; `Ok` when there are none.
    ///
    /// # Errors
    /// When they cannot be removed.
    pub fn delete(&self, snapshot: &SnapshotRef) -> Result<(), String> {
        for dir in [self.dir(snapshot), self.partial(snapshot)] {
            match fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot delete {}: {e}", dir.display())),
            }
        }
        Ok(())
    }
}

/// Writes `text` to a new file at `path` and syncs it.
fn write_synced(path: &Path, text: &str) -> io::Result<()> {
    let mut f = fs::File::create(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// `syncfs` of the filesystem holding `path`.
///
/// # Errors
/// The system's error.
#[allow(unsafe_code)]
pub fn sync_fs(path: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let f = fs::File::open(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: syncfs takes an open descriptor this function owns.
    if unsafe { libc::syncfs(f.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(format!("cannot sync {}: {}", path.display(), io::Error::last_os_error()))
    }
}

/// `FIFREEZE` and `FITHAW` from `<linux/fs.h>`: `_IOWR('X', 119, int)`, `_IOWR('X', 120, int)`.
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// A filesystem frozen by [`freeze_fs`]: every write to it waits (the kernel's own too:
/// the journal, lazy inode-table initialisation) until this is dropped, which thaws it.
#[derive(Debug)]
pub struct FrozenFs {
    dir: fs::File,
}

impl Drop for FrozenFs {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        use std::os::fd::AsRawFd;
        // SAFETY: FITHAW takes no pointer; the descriptor is this guard's.
        unsafe {
            libc::ioctl(self.dir.as_raw_fd(), FITHAW, 0);
        }
    }
}

/// Freezes the filesystem mounted at `dir` (which must be a directory, not a link): its
/// dirty data and metadata reach the device first and its journal is clean, so a copy of
/// the device's image is a consistent filesystem. Held for the copy only.
///
/// # Errors
/// The system's error (a filesystem frozen already is `EBUSY`).
#[allow(unsafe_code)]
pub fn freeze_fs(dir: &Path) -> Result<FrozenFs, String> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)
        .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    // SAFETY: FIFREEZE takes no pointer; the descriptor is open and ours.
    if unsafe { libc::ioctl(dir.as_raw_fd(), FIFREEZE, 0) } == 0 {
        Ok(FrozenFs { dir })
    } else {
        Err(format!("cannot freeze the workspace's filesystem: {}", io::Error::last_os_error()))
    }
}

/// Thaws the filesystem mounted at `dir` if it is frozen (a server that stopped during a
/// snapshot); nothing otherwise.
pub fn thaw_fs(dir: &Path) {
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(dir) =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW).open(dir)
    {
        drop(FrozenFs { dir });
    }
}

/// `FICLONE` from `<linux/fs.h>`: `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// Copies `from` to a new file `to` (0600): a clone sharing every block where the
/// filesystem can (one call), else only its data extents (`SEEK_DATA`/`SEEK_HOLE`, then
/// `copy_file_range`).
///
/// # Errors
/// The system's error; a partial `to` is removed.
#[allow(unsafe_code)]
pub fn clone_or_copy(from: &Path, to: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    {
        let src = fs::File::open(from)?;
        let dst = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
        // SAFETY: FICLONE takes the source descriptor as its argument; both are open
        // files this block owns.
        let cloned = unsafe { libc::ioctl(dst.as_raw_fd(), FICLONE, src.as_raw_fd()) } == 0;
        if cloned {
            return Ok(());
        }
    }
    fs::remove_file(to)?;
    let copied = crate::workspace_image::sparse_copy(from, to, false);
    if copied.is_err() {
        let _ = fs::remove_file(to);
    }
    copied
}

/// Copies the directory `from` (its contents, owners, modes, times, links as links,
/// holes) into a new directory `to`, sharing blocks where the filesystem can.
///
/// # Errors
/// A message with `cp`'s own; a partial `to` is removed.
pub fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    let mut source = from.as_os_str().to_owned();
    source.push("/.");
    let out = Command::new("cp")
        .args(["-a", "--reflink=auto", "--sparse=always", "--no-target-directory"])
        .arg(&source)
        .arg(to)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .map_err(|e| format!("cannot run cp: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        let _ = fs::remove_dir_all(to);
        Err(format!(
            "cp of {} failed ({}): {}",
            from.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Gives every entry under `dir` (itself included) that belongs to the uid (gid) of
/// `dir` to `owner`'s uid (gid), without following a link: a fork's or a restore's files
/// become its own user's. Nothing is done when `dir` already belongs to `owner`. Cost:
/// one `lstat` per entry (and one `lchown` per entry owned by the source).
///
/// # Errors
/// The first entry that could not be read or changed.
pub fn rechown(dir: &Path, owner: (u32, u32)) -> Result<(), String> {
    let top = fs::symlink_metadata(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    rechown_from(dir, (top.uid(), top.gid()), owner)
}

/// [`rechown`] of the entries that belong to `from`, `dir` itself given to `owner`
/// whatever its owner.
///
/// # Errors
/// The first entry that could not be read or changed.
pub fn rechown_from(dir: &Path, from: (u32, u32), owner: (u32, u32)) -> Result<(), String> {
    std::os::unix::fs::lchown(dir, Some(owner.0), Some(owner.1))
        .map_err(|e| format!("cannot give {} to its new owner: {e}", dir.display()))?;
    if from == owner {
        return Ok(());
    }
    let mut pending = vec![dir.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let uid = (meta.uid() == from.0).then_some(owner.0);
        let gid = (meta.gid() == from.1).then_some(owner.1);
        if uid.is_some() || gid.is_some() {
            std::os::unix::fs::lchown(&path, uid, gid)
                .map_err(|e| format!("cannot give {} to its new owner: {e}", path.display()))?;
        }
        if meta.is_dir() {
            for entry in fs::read_dir(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))? {
                pending.push(entry.map_err(|e| format!("cannot read {}: {e}", path.display()))?.path());
            }
        }
    }
    Ok(())
}

/// Refuses a snapshot of `source` (an image or a workspace directory) before it is
/// copied when the copy would hold more than `quota_left` (the org's snapshot bytes left):
/// a copy costs what its source holds on disk, which is read here without copying.
///
/// # Errors
/// [`DriverError::ResourceExhausted`] naming both numbers.
pub fn fits(source: &Path, quota_left: Option<u64>) -> Result<(), DriverError> {
    let Some(left) = quota_left else { return Ok(()) };
    let holds = allocated_bytes(source);
    if holds > left {
        return Err(DriverError::ResourceExhausted(format!(
            "the workspace holds {holds} bytes on disk and the org's snapshot quota leaves {left}"
        )));
    }
    Ok(())
}

/// The bytes the files under `path` take on disk (allocated blocks, each hard link once).
pub fn allocated_bytes(path: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0u64;
    let mut pending = vec![path.to_path_buf()];
    while let Some(p) = pending.pop() {
        let Ok(meta) = fs::symlink_metadata(&p) else { continue };
        if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
            continue;
        }
        total = total.saturating_add(meta.blocks().saturating_mul(512));
        if meta.is_dir()
            && let Ok(entries) = fs::read_dir(&p)
        {
            pending.extend(entries.flatten().map(|e| e.path()));
        }
    }
    total
}

#[cfg(test)]
mod tests;
