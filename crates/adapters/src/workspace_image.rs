//! Workspace quotas enforced by the kernel: each workspace with a quota is its own ext4
//! filesystem in a sparse image file, loop-mounted on the host where the driver binds the
//! workspace from. A write past the quota fails inside the sandbox with `ENOSPC`; the
//! host's data dir can only ever hold what the sandboxes' quotas add up to.
//!
//! # Why this, measured on this kind of machine (Debian 12, kernel 6.x, ext4 root, cgroup v1)
//! - **Project quotas** (ext4 `prjquota`, XFS) would bound a directory tree on the data
//!   dir's own filesystem, but need that filesystem mounted with project quotas (here the
//!   root filesystem is plain ext4 without the `quota` feature: not something a server
//!   may turn on) and, for XFS, `xfsprogs`. Not available.
//! - **A size-limited tmpfs** (`size=`) is exact and instant (0.1 ms), but holds the
//!   workspace in memory (charged to the writer's memory cgroup, and kept in RAM or swap
//!   while a sandbox is suspended), which defeats a durable workspace and an idle
//!   suspension that frees resources. `/tmp` stays such a tmpfs (256 MiB by default).
//! - **A loop-mounted filesystem image** works on any host with loop devices (root):
//!   `mkfs.ext4` of a sparse image takes ≈ 15 ms (once per quota: workspaces are copies
//!   of a template), attaching a loop device and `mount(2)` ≈ 0.5 ms (done directly, not
//!   by `mount -o loop`, whose search of every loop device grows with the sandboxes: see
//!   `loop_device`); the image costs disk only for what is written (plus ≈ 0.4 MiB of
//!   metadata), survives the sandbox (durable workspaces, suspension), and works the same
//!   under bubblewrap and under a local container engine (a bind of the mounted
//!   directory). It is the one chosen. The warm pool hides the copy of ephemeral
//!   workspaces; a durable workspace pays it once per key.
//!
//! # Exactly the quota
//! ext4 needs room of its own (journal, inode tables, the kernel's reserve), so the image
//! is made larger than the quota (by a sixteenth and 8 MiB, sparse), and the blocks beyond
//! the quota are then reserved for root (`tune2fs -r`): the sandbox's unprivileged uid can
//! allocate exactly `quota` bytes (`statfs` says so: `f_bavail * f_bsize == quota`), and
//! its next write fails with `ENOSPC`. Root writes (the container's supervisor) may use
//! the reserve, which is bounded by the image's size.
//!
//! A quota raised later grows a workspace's image (offline, before it is mounted); a
//! lowered one leaves an existing workspace as it is (shrinking could lose data).

use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Block size of the workspace filesystems.
const BLOCK: u64 = 4096;

/// The image size for a quota: the quota, a sixteenth more and 8 MiB, in whole blocks.
/// The filesystem takes about 4 % and 4 MiB of it (a 4 MiB journal, one 256-byte inode
/// per 16 KiB, the kernel's reserve of 2 % or at most 16 MiB); the rest beyond the quota
/// is reserved for root, which `tune2fs` allows up to half of the blocks.
fn image_size(quota: u64) -> u64 {
    let size = quota.saturating_add(quota / 16).saturating_add(8 << 20);
    size.div_ceil(BLOCK).saturating_mul(BLOCK)
}

fn run(program: &str, args: &[&OsStr]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .map_err(|e| {
            if e.kind() == io::ErrorKind::NotFound {
                format!("`{program}` is missing: install e2fsprogs and util-linux (apt-get install e2fsprogs mount)")
            } else {
                format!("cannot run {program}: {e}")
            }
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!("{program} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// A workspace's image and where it is mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceImage {
    /// The image file (root only).
    pub image: PathBuf,
    /// The directory it is mounted on: the workspace the driver binds.
    pub mountpoint: PathBuf,
    /// Where the host's template images live (one per quota).
    pub templates: PathBuf,
    /// Whether a new image is synced to disk before use (a durable workspace's must
    /// survive a host crash; an ephemeral one ends with its sandbox, and the host's).
    pub synced: bool,
}

/// What [`WorkspaceImage::prepare`] found or did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prepared {
    /// The image was created (an empty workspace).
    Created,
    /// The image existed (a durable or suspended workspace); it is mounted.
    Existing,
    /// The mountpoint holds files of a workspace made before quotas (no image): it is used
    /// as it is, without a quota.
    Legacy,
}

impl WorkspaceImage {
    /// An image at `image` mounted on `mountpoint`, made from the templates in `templates`.
    pub fn new(
        image: impl Into<PathBuf>,
        mountpoint: impl Into<PathBuf>,
        templates: impl Into<PathBuf>,
    ) -> Self {
        Self { image: image.into(), mountpoint: mountpoint.into(), templates: templates.into(), synced: true }
    }

    /// The same image, synced to disk when created only if `synced`.
    #[must_use]
    pub fn synced(mut self, synced: bool) -> Self {
        self.synced = synced;
        self
    }

    /// Makes the workspace ready: creates the image for `quota` bytes when missing (its root
    /// owned by `owner`), grows it when it is smaller than `quota` needs, and mounts it
    /// (`nosuid,nodev,noatime`) on the mountpoint, which must exist. Idempotent: a mounted
    /// workspace is left as it is. Blocking (runs `mkfs.ext4` for a new template, copies,
    /// mounts): call it off the async runtime's threads.
    ///
    /// # Errors
    /// A message naming the step that failed (a missing tool says how to install it).
    pub fn prepare(&self, quota: u64, owner: (u32, u32)) -> Result<Prepared, String> {
        if is_mounted(&self.mountpoint)? {
            return Ok(Prepared::Existing);
        }
        let prepared = self.prepare_image(quota)?;
        if prepared == Prepared::Legacy {
            return Ok(prepared);
        }
        let created = prepared == Prepared::Created;
        self.mount()?;
        if created {
            // The template's root is root's: the workspace's is its uid's (written into the
            // image, so it stays).
            std::os::unix::fs::chown(&self.mountpoint, Some(owner.0), Some(owner.1))
                .map_err(|e| format!("cannot give {} to its uid: {e}", self.mountpoint.display()))?;
        }
        Ok(if created { Prepared::Created } else { Prepared::Existing })
    }

    /// The image for `quota`, not mounted: created when missing (an empty workspace, its
    /// root root's until mounted and given to its uid), grown when smaller than `quota`
    /// needs; [`Prepared::Legacy`] (nothing done) when the mountpoint holds files and there
    /// is no image. Blocking.
    ///
    /// # Errors
    /// A message naming the step that failed.
    pub fn prepare_image(&self, quota: u64) -> Result<Prepared, String> {
        if self.image.exists() {
            // Never grown or bound while a filesystem of an earlier mount still uses it.
            loop_device::wait_unused(&self.image)?;
            self.grow(quota)?;
            return Ok(Prepared::Existing);
        }
        let has_files = fs::read_dir(&self.mountpoint)
            .map_err(|e| format!("cannot read {}: {e}", self.mountpoint.display()))?
            .next()
            .is_some();
        if has_files {
            return Ok(Prepared::Legacy);
        }
        self.create(quota)?;
        Ok(Prepared::Created)
    }

    /// The image bound to a free loop device (detaching by itself once unused), for a
    /// mount elsewhere than on the host (the bubblewrap driver mounts it in the sandbox's
    /// own mount namespace).
    ///
    /// # Errors
    /// A message naming the step that failed.
    pub(crate) fn attach(&self) -> Result<loop_device::Attached, String> {
        loop_device::attach(&self.image)
    }

    /// A new image for `quota`: a sparse copy of the host's template for that quota (made
    /// once), so a workspace costs a copy of the filesystem's few hundred KiB of metadata, not
    /// a `mkfs`.
    fn create(&self, quota: u64) -> Result<(), String> {
        if let Some(dir) = self.image.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let template = self.template(quota)?;
        let tmp = self.image.with_file_name(format!(
            ".{}.new",
            self.image.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
        ));
        let _ = fs::remove_file(&tmp);
        if let Err(e) = sparse_copy(&template, &tmp, self.synced) {
            let _ = fs::remove_file(&tmp);
            return Err(format!("cannot copy the workspace template {}: {e}", template.display()));
        }
        self.record_quota(quota)?;
        fs::rename(&tmp, &self.image).map_err(|e| format!("cannot place {}: {e}", self.image.display()))
    }

    /// A new image that is a copy of a snapshot's `source` (made for `quota`), sharing its
    /// blocks where the filesystem can ([`crate::snapshot_files::clone_or_copy`]); an
    /// image already there is replaced (a restore: the workspace must not be mounted).
    /// Its files still belong to whoever owned them in the source: [`Self::with_mounted`]
    /// and [`crate::snapshot_files::rechown`] give them to the new owner.
    ///
    /// # Errors
    /// A message naming the step that failed; the image there before stays.
    pub fn copy_from(&self, source: &Path, quota: u64) -> Result<(), String> {
        if let Some(dir) = self.image.parent() {
            fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        if self.image.exists() {
            loop_device::wait_unused(&self.image)?;
        }
        let tmp = self.image.with_file_name(format!(
            ".{}.snapshot",
            self.image.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
        ));
        let _ = fs::remove_file(&tmp);
        crate::snapshot_files::clone_or_copy(source, &tmp)
            .map_err(|e| format!("cannot copy the snapshot image {}: {e}", source.display()))?;
        if self.synced
            && let Err(e) = fs::File::open(&tmp).and_then(|f| f.sync_all())
        {
            let _ = fs::remove_file(&tmp);
            return Err(format!("cannot sync {}: {e}", tmp.display()));
        }
        self.record_quota(quota)?;
        fs::rename(&tmp, &self.image).map_err(|e| format!("cannot place {}: {e}", self.image.display()))
    }

    /// Runs `work` on the image's filesystem mounted on the host for the while (on a
    /// directory beside the image, root's alone), then unmounts it. For work on an image
    /// no sandbox uses (a fork's or a restore's files given to their owner).
    ///
    /// # Errors
    /// A message naming the step that failed, `work`'s own included.
    pub fn with_mounted<T>(&self, work: impl FnOnce(&Path) -> Result<T, String>) -> Result<T, String> {
        loop_device::wait_unused(&self.image)?;
        let at = self.image.with_file_name(format!(
            ".{}.mnt",
            self.image.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()
        ));
        let _ = unmount(&at);
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&at)
            .map_err(|e| format!("cannot create {}: {e}", at.display()))?;
        loop_device::mount_image(&self.image, &at)?;
        let done = work(&at);
        let unmounted = unmount(&at);
        let _ = fs::remove_dir(&at);
        let out = done?;
        unmounted?;
        // The device detaches as the mount goes; the next mount waits for that.
        Ok(out)
    }

    /// The template image for `quota` (root's, mode 0700, no lost+found, the reserve set),
    /// made the first time it is needed; concurrent makers each rename a whole one into
    /// place.
    fn template(&self, quota: u64) -> Result<PathBuf, String> {
        let path = self.templates.join(format!("{quota}.img"));
        if path.exists() {
            return Ok(path);
        }
        fs::create_dir_all(&self.templates)
            .map_err(|e| format!("cannot create {}: {e}", self.templates.display()))?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self.templates.join(format!(".{quota}.{}.{n}.new", std::process::id()));
        let made = (|| {
            let file = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| format!("cannot create {}: {e}", tmp.display()))?;
            file.set_len(image_size(quota)).map_err(|e| format!("cannot size {}: {e}", tmp.display()))?;
            drop(file);
            run(
                "mkfs.ext4",
                &[
                    "-q".as_ref(),
                    "-F".as_ref(),
                    "-b".as_ref(),
                    "4096".as_ref(),
                    "-i".as_ref(),
                    "16384".as_ref(),
                    "-J".as_ref(),
                    "size=4".as_ref(),
                    "-m".as_ref(),
                    "0".as_ref(),
                    "-E".as_ref(),
                    "lazy_itable_init=1,lazy_journal_init=1,nodiscard".as_ref(),
                    tmp.as_os_str(),
                ],
            )?;
            // mkfs makes lost+found in the root: not the sandbox's (it should see an
            // empty workspace), and its blocks are counted before the reserve is set.
            run("debugfs", &["-w".as_ref(), "-R".as_ref(), "rmdir lost+found".as_ref(), tmp.as_os_str()])?;
            // The workspace's root is private (0700); its owner is set at first mount.
            run("debugfs", &["-w".as_ref(), "-R".as_ref(), "sif <2> mode 040700".as_ref(), tmp.as_os_str()])?;
            reserve_beyond(&tmp, quota)
        })();
        if let Err(e) = made {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &path).map_err(|e| format!("cannot place {}: {e}", path.display()))?;
        Ok(path)
    }

    /// Moves the image and the files kept beside it (its quota, its last loop device) to
    /// `to` (a sandbox started ahead taking its sandbox's name): an image moved without
    /// them would lose its quota.
    ///
    /// # Errors
    /// The first file that could not be moved.
    pub fn move_to(&self, to: &Path) -> Result<(), String> {
        let moved = Self { image: to.to_path_buf(), ..self.clone() };
        let pairs = [
            (self.image.clone(), moved.image.clone()),
            (self.quota_file(), moved.quota_file()),
            (loop_device::device_file(&self.image), loop_device::device_file(&moved.image)),
        ];
        for (i, (from, to)) in pairs.into_iter().enumerate() {
            match fs::rename(&from, &to) {
                Ok(()) => {}
                // Only the image must be there.
                Err(e) if i > 0 && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot move {} to {}: {e}", from.display(), to.display())),
            }
        }
        Ok(())
    }

    /// The quota the image was made (or last grown) for; `None` without an image.
    pub fn quota(&self) -> Option<u64> {
        self.recorded_quota()
    }

    /// The quota the image was made (or last grown) for, from its side file.
    fn recorded_quota(&self) -> Option<u64> {
        fs::read_to_string(self.quota_file()).ok()?.trim().parse().ok()
    }

    fn quota_file(&self) -> PathBuf {
        let mut name = self.image.as_os_str().to_owned();
        name.push(".quota");
        PathBuf::from(name)
    }

    fn record_quota(&self, quota: u64) -> Result<(), String> {
        fs::write(self.quota_file(), quota.to_string())
            .map_err(|e| format!("cannot record the quota of {}: {e}", self.image.display()))
    }

    /// Grows an unmounted image to a larger `quota`: the sandbox's headroom grows by the
    /// difference, whatever it already holds. A smaller quota changes nothing.
    fn grow(&self, quota: u64) -> Result<(), String> {
        let Some(recorded) = self.recorded_quota() else { return Ok(()) };
        if quota <= recorded {
            return Ok(());
        }
        let before = superblock(&self.image)?;
        let headroom =
            before.free.saturating_sub(kernel_reserve(before.blocks)).saturating_sub(before.reserved);
        let len = fs::metadata(&self.image)
            .map_err(|e| format!("cannot read {}: {e}", self.image.display()))?
            .len();
        if len < image_size(quota) {
            // resize2fs wants a checked filesystem.
            let _ = run("e2fsck", &["-f".as_ref(), "-p".as_ref(), self.image.as_os_str()]);
            let file = fs::OpenOptions::new()
                .write(true)
                .open(&self.image)
                .map_err(|e| format!("cannot open {}: {e}", self.image.display()))?;
            file.set_len(image_size(quota))
                .map_err(|e| format!("cannot grow {}: {e}", self.image.display()))?;
            drop(file);
            run("resize2fs", &[self.image.as_os_str()])?;
        }
        let after = superblock(&self.image)?;
        let want = headroom + (quota - recorded) / BLOCK;
        let usable = after.free.saturating_sub(kernel_reserve(after.blocks));
        if usable < want {
            return Err(format!("the workspace image {} cannot grow to {quota} bytes", self.image.display()));
        }
        let reserve = (usable - want).to_string();
        run("tune2fs", &["-r".as_ref(), reserve.as_ref(), self.image.as_os_str()])?;
        self.record_quota(quota)
    }

    fn mount(&self) -> Result<(), String> {
        loop_device::mount_image(&self.image, &self.mountpoint)
    }

    /// Unmounts the workspace (its files stay in the image). `Ok` when it is not mounted.
    /// Call it once the sandbox's processes are gone; a mount still busy on the host is
    /// detached lazily.
    ///
    /// # Errors
    /// When `umount` fails both ways.
    pub fn unmount(&self) -> Result<(), String> {
        unmount(&self.mountpoint)
    }

    /// The image's path.
    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Unmounts and deletes the image and its side files (its quota, its loop device),
    /// keeping the mountpoint. Nothing to delete is no error.
    ///
    /// # Errors
    /// When it cannot be unmounted or deleted.
    pub fn remove_image(&self) -> Result<(), String> {
        self.unmount()?;
        for file in [self.image.clone(), self.quota_file(), loop_device::device_file(&self.image)] {
            match fs::remove_file(&file) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(format!("cannot remove {}: {e}", file.display())),
            }
        }
        Ok(())
    }

    /// Unmounts and deletes the image and the mountpoint (an ephemeral workspace's end).
    ///
    /// # Errors
    /// When it cannot be unmounted or deleted.
    pub fn remove(&self) -> Result<(), String> {
        self.remove_image()?;
        match fs::remove_dir_all(&self.mountpoint) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(format!("cannot remove {}: {e}", self.mountpoint.display())),
        }
    }
}

/// Unmounts `mountpoint` if something is mounted on it (lazily when busy). The loop device
/// under a workspace detaches by itself once the mount is gone.
///
/// # Errors
/// When `umount2` fails both ways.
pub fn unmount(mountpoint: &Path) -> Result<(), String> {
    if !is_mounted(mountpoint)? {
        return Ok(());
    }
    rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty())
        .or_else(|_| rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH))
        .map_err(|e| format!("cannot unmount {}: {e}", mountpoint.display()))
}

/// The bytes in use on the filesystem mounted at `mountpoint` (for metrics), `None` when
/// nothing is mounted there. Cheap (two `stat`s and a `statfs`): a mountpoint is mounted
/// when its device differs from its parent's.
pub fn used_bytes(mountpoint: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    let here = fs::metadata(mountpoint).ok()?.dev();
    let parent = fs::metadata(mountpoint.parent()?).ok()?.dev();
    if here == parent {
        return None;
    }
    let stat = statfs(mountpoint).ok()?;
    Some(stat.blocks.saturating_sub(stat.free).saturating_mul(stat.block_size))
}

/// What `statfs` says of a filesystem, in blocks of `block_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FsStat {
    /// Block size.
    pub block_size: u64,
    /// Blocks.
    pub blocks: u64,
    /// Free blocks.
    pub free: u64,
    /// Blocks an unprivileged process may still allocate.
    pub available: u64,
}

/// `statfs(2)` of the filesystem holding `path`.
///
/// # Errors
/// The system's error.
#[allow(unsafe_code)]
pub fn statfs(path: &Path) -> io::Result<FsStat> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is a valid C string.
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above; both pointers are valid for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &raw mut buf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(FsStat { block_size: buf.f_frsize, blocks: buf.f_blocks, free: buf.f_bfree, available: buf.f_bavail })
}

/// Whether something is mounted exactly at `path` (from `/proc/self/mountinfo`).
///
/// # Errors
/// When the mount table cannot be read.
pub fn is_mounted(path: &Path) -> Result<bool, String> {
    let table = fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| format!("cannot read the mount table: {e}"))?;
    let want = path.to_string_lossy();
    Ok(table
        .lines()
        .any(|line| line.split(' ').nth(4).is_some_and(|mount| unescape_mountinfo(mount) == want)))
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..=i + 3].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let v = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Copies `from` to a new `to` (0600) keeping its holes: only the data extents are copied
/// (`SEEK_DATA`/`SEEK_HOLE`), so a sparse 1 GiB image costs what it holds. Each extent is
/// copied by the kernel (`copy_file_range`), page cache to page cache: a copy through a
/// buffer of the server's took a fresh zeroed megabyte per copy (page faults, and the
/// TLB flushes of unmapping it in a threaded process) and the copies in and out, 8 % of
/// the CPU of a burst of new sandboxes (`perf`, 16 clients). Where the kernel cannot
/// (`EXDEV`, `ENOSYS`, `EOPNOTSUPP`, `EINVAL`), through a buffer.
#[allow(unsafe_code)]
pub(crate) fn sparse_copy(from: &Path, to: &Path, synced: bool) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let src = fs::File::open(from)?;
    let len = src.metadata()?.len();
    let dst = fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(to)?;
    dst.set_len(len)?;
    let fd = src.as_raw_fd();
    let mut offset: i64 = 0;
    let end = i64::try_from(len).map_err(|_| io::Error::other("image too large"))?;
    while offset < end {
        // SAFETY: lseek on a descriptor this function owns; no memory is passed.
        let data = unsafe { libc::lseek(fd, offset, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole is left
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        copy_extent(&src, &dst, data, hole)?;
        offset = hole;
    }
    if synced { dst.sync_all() } else { Ok(()) }
}

/// Copies bytes `[start, stop)` of `src` to the same place in `dst`.
#[allow(unsafe_code)]
fn copy_extent(src: &fs::File, dst: &fs::File, start: i64, stop: i64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let (mut from, mut to) = (start, start);
    while from < stop {
        let want = usize::try_from(stop - from).unwrap_or(usize::MAX).min(1 << 30);
        // SAFETY: both descriptors are open files this function borrows; the offsets are
        // locals the kernel updates.
        let n = unsafe {
            libc::copy_file_range(src.as_raw_fd(), &raw mut from, dst.as_raw_fd(), &raw mut to, want, 0)
        };
        if n > 0 {
            continue;
        }
        if n == 0 {
            return Ok(()); // the source ended early (it shrank): nothing more to copy
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL) => break,
            _ => return Err(e),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    let (mut at, stop) = (
        u64::try_from(from).map_err(|_| io::Error::other("negative offset"))?,
        u64::try_from(stop).map_err(|_| io::Error::other("negative offset"))?,
    );
    while at < stop {
        let want = usize::try_from((stop - at).min(buf.len() as u64)).unwrap_or(buf.len());
        let got = src.read_at(&mut buf[..want], at)?;
        if got == 0 {
            break;
        }
        dst.write_all_at(&buf[..got], at)?;
        at += got as u64;
    }
    Ok(())
}

/// Numbers of an ext4 superblock, in blocks.
#[derive(Debug, Clone, Copy)]
struct Superblock {
    blocks: u64,
    free: u64,
    reserved: u64,
}

/// Reads the superblock's counts (`dumpe2fs -h`).
fn superblock(image: &Path) -> Result<Superblock, String> {
    let text = run("dumpe2fs", &["-h".as_ref(), image.as_os_str()])?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().parse::<u64>()))
            .and_then(Result::ok)
            .ok_or_else(|| format!("dumpe2fs of {} shows no {name}", image.display()))
    };
    Ok(Superblock {
        blocks: field("Block count:")?,
        free: field("Free blocks:")?,
        reserved: field("Reserved block count:")?,
    })
}

/// What the kernel keeps back of every ext4 filesystem on its own (2 % of the blocks, at
/// most 4096), in blocks.
fn kernel_reserve(blocks: u64) -> u64 {
    (blocks / 50).min(4096)
}

/// Reserves for root every block of a fresh filesystem beyond `quota`, so unprivileged
/// writers get exactly the quota (rounded down to whole blocks).
fn reserve_beyond(image: &Path, quota: u64) -> Result<(), String> {
    let sb = superblock(image)?;
    let usable = sb.free.saturating_sub(kernel_reserve(sb.blocks));
    let want = quota / BLOCK;
    if usable < want {
        return Err(format!(
            "the workspace image {} gives {} bytes, less than its quota of {quota}",
            image.display(),
            usable * BLOCK
        ));
    }
    let reserve = (usable - want).to_string();
    run("tune2fs", &["-r".as_ref(), reserve.as_ref(), image.as_os_str()]).map(|_| ())
}

pub(crate) mod loop_device;

/// The loop devices backed by `image` now (from sysfs; an image deleted while attached
/// included).
#[cfg(test)]
pub(crate) fn loop_devices_backed_by(image: &Path) -> Vec<String> {
    fs::read_dir("/sys/block")
        .map(|dir| {
            dir.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|name| name.starts_with("loop") && loop_device::backs(name, image))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (up to 10 s) until no loop device backs `image`; returns those that still do. The
/// kernel runs an autoclear device down after its last release asynchronously.
#[cfg(test)]
pub(crate) fn wait_detached(image: &Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !loop_devices_backed_by(image).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    loop_devices_backed_by(image)
}

#[cfg(test)]
mod tests;
