//! The supervisor's file operations, inside the sandbox: read, write, delete, list, and
//! tar archives out of and into a directory. Blocking code: each operation runs on a
//! thread of its own, never on the supervisor's event loop.
//!
//! # Paths stay inside
//! A path names a root (`/workspace` or `/tmp`) and names beneath it
//! ([`domain::SandboxPath`], which has already refused `..`). Every lookup starts from the
//! root's descriptor and goes through `openat2(2)` with `RESOLVE_BENEATH |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV`: the kernel resolves the whole path in one
//! call and fails it (`EXDEV`) the moment a symlink or `..` would leave the root, an
//! absolute symlink is met, a `/proc` magic link is crossed, or a mount is crossed (so
//! no bind leads out either). A symlink that stays beneath the root is followed; one
//! that leads out is refused, never resolved elsewhere. The walk the kernel does is
//! atomic against a process inside renaming directories under it (it answers `EAGAIN`,
//! and the lookup is retried), which a userspace walk with `O_NOFOLLOW` per component
//! could only approximate with one `openat` per name and still has to special-case `..`;
//! so `openat2` (Linux 5.6) is required, and an older kernel gets a clear error rather
//! than a weaker walk. Entries of a directory being listed, archived or deleted are opened
//! one name at a time with `RESOLVE_NO_SYMLINKS` as well: a walk never follows a link.
//!
//! # Whose files
//! The supervisor does these operations with the sandbox user's filesystem identity (under
//! bubblewrap it is that user; in a container it runs as root and switches its filesystem
//! ids to the user at start, [`drop_fs_identity`]), so the kernel applies the user's
//! permissions and new files are the user's.
//!
//! # Nothing partial
//! A file is written into an unnamed temporary file in its directory (`O_TMPFILE`; a
//! hidden named one where the filesystem lacks it), linked in and renamed over the target
//! only once its last byte is written: a reader sees the old file or the new one, and an
//! upload that fails or is abandoned leaves nothing.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use domain::{EntryKind, Root, SandboxPath};
use rustix::fs::{AtFlags, CWD, FileType, Mode, OFlags, ResolveFlags, Timestamps};
use rustix::io::Errno;

use crate::protocol::{DATA_CHUNK, WireEntry};

/// How every path beneath a root is resolved.
const BENEATH: ResolveFlags =
    ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS).union(ResolveFlags::NO_XDEV);
/// How one name of a directory being walked is opened: never through a link.
const ONE_NAME: ResolveFlags = BENEATH.union(ResolveFlags::NO_SYMLINKS);
/// The most entries one directory listing holds.
pub const MAX_ENTRIES: usize = 100_000;
/// The most entries one `entries` frame of a listing holds: 100 names of at most 255
/// bytes, each at most 6 bytes of JSON per byte (a control character escaped), stay well
/// within a frame ([`crate::protocol::MAX_FRAME`]).
pub const ENTRIES_PER_PART: usize = 100;
/// The deepest directory tree a delete or an archive walks.
pub const MAX_DEPTH: usize = 256;

/// Why a file operation failed: an error `code` of the protocol and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsError {
    /// `not_found`, `invalid`, `conflict`, `too_large`, `resource_exhausted`, `io`.
    pub code: &'static str,
    /// What happened, naming the path.
    pub message: String,
}

impl FsError {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }

    /// The error of a failed system call on `path`.
    fn of(errno: Errno, path: &dyn std::fmt::Display) -> Self {
        let code = match errno {
            Errno::NOENT => "not_found",
            Errno::XDEV | Errno::LOOP => {
                return Self::new(
                    "invalid",
                    format!(
                        "{path} leads outside its root (/workspace or /tmp) through a symlink or a mount, \
                         or through too many links; it is not followed"
                    ),
                );
            }
            Errno::NOTDIR => {
                return Self::new("conflict", format!("{path}: a part of the path is not a directory"));
            }
            Errno::ISDIR => return Self::new("conflict", format!("{path} is a directory")),
            Errno::NOTEMPTY => {
                return Self::new("conflict", format!("{path} is a directory that is not empty"));
            }
            Errno::EXIST => "conflict",
            Errno::ACCESS | Errno::PERM | Errno::ROFS => {
                return Self::new("conflict", format!("{path}: the sandbox's user may not do this there"));
            }
            Errno::FBIG => {
                return Self::new("too_large", format!("{path}: larger than the sandbox's file size limit"));
            }
            Errno::NOSPC | Errno::DQUOT => {
                return Self::new("resource_exhausted", format!("{path}: the sandbox's disk is full"));
            }
            Errno::NAMETOOLONG => "invalid",
            Errno::NOSYS => {
                return Self::new(
                    "io",
                    "this kernel lacks openat2 (Linux 5.6 or later), which the files API needs to keep \
                     paths inside the sandbox",
                );
            }
            _ => "io",
        };
        Self::new(code, format!("{path}: {}", io::Error::from(errno)))
    }

    fn io(error: &io::Error, path: &dyn std::fmt::Display) -> Self {
        match error.raw_os_error() {
            Some(raw) => Self::of(Errno::from_raw_os_error(raw), path),
            None => Self::new("io", format!("{path}: {error}")),
        }
    }
}

type FsResult<T> = Result<T, FsError>;

/// Gives the calling process the sandbox user's filesystem identity (no supplementary
/// groups, then fsgid, then fsuid), for a supervisor that runs as root (containers).
/// Threads started afterwards inherit it.
///
/// # Errors
/// A message when the kernel refused or the ids did not take.
#[allow(unsafe_code)]
pub fn drop_fs_identity(uid: u32, gid: u32) -> Result<(), String> {
    // SAFETY: setgroups with an empty list reads no memory; setfsgid and setfsuid take
    // integers. glibc applies setgroups to every thread; there is one thread here.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0 {
            return Err(format!("setgroups: {}", io::Error::last_os_error()));
        }
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        // An invalid id changes nothing and returns the current one.
        let (now_gid, now_uid) = (libc::setfsgid(u32::MAX) as u32, libc::setfsuid(u32::MAX) as u32);
        if (now_uid, now_gid) != (uid, gid) {
            return Err(format!("the filesystem ids are {now_uid}:{now_gid}, not {uid}:{gid}"));
        }
    }
    Ok(())
}

fn retry<T>(mut call: impl FnMut() -> rustix::io::Result<T>) -> rustix::io::Result<T> {
    let mut again = 0;
    loop {
        match call() {
            // openat2 answers EAGAIN when a rename raced with the lookup.
            Err(Errno::AGAIN) if again < 64 => again += 1,
            Err(Errno::INTR) => {}
            other => return other,
        }
    }
}

/// The descriptor of a root.
fn open_root(root: Root) -> FsResult<OwnedFd> {
    rustix::fs::open(root.as_str(), OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|e| FsError::of(e, &root.as_str()))
}

/// Opens `rel` (names joined by `/`; empty: the root itself) beneath `root`.
fn open_beneath(root: &OwnedFd, rel: &str, flags: OFlags, mode: Mode) -> rustix::io::Result<OwnedFd> {
    let rel = if rel.is_empty() { "." } else { rel };
    retry(|| rustix::fs::openat2(root, rel, flags | OFlags::CLOEXEC, mode, BENEATH))
}

/// Opens one name of directory `dir`, never through a link.
fn open_name(dir: &impl AsFd, name: &OsStr, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    retry(|| rustix::fs::openat2(dir, name, flags | OFlags::CLOEXEC, Mode::empty(), ONE_NAME))
}

/// `(parent, name)` of a path that is not a root.
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// Opens the directory `rel` beneath `root`, creating it and every missing parent
/// (mode 0755). Returns an `O_PATH` descriptor.
fn make_dirs(root: &OwnedFd, rel: &str, shown: &dyn std::fmt::Display) -> FsResult<OwnedFd> {
    let mut dir = open_beneath(root, "", OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| FsError::of(e, shown))?;
    let mut prefix = String::new();
    for name in rel.split('/').filter(|n| !n.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(name);
        dir = match open_beneath(root, &prefix, OFlags::PATH | OFlags::DIRECTORY, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) => {
                        // mkdir's mode is cut by the umask: set it.
                        let made =
                            open_beneath(root, &prefix, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
                                .map_err(|e| FsError::of(e, shown))?;
                        rustix::fs::fchmod(&made, Mode::from_raw_mode(0o755))
                            .map_err(|e| FsError::of(e, shown))?;
                    }
                    // Made by someone else meanwhile, or a dangling link (refused below).
                    Err(Errno::EXIST) => {}
                    Err(e) => return Err(FsError::of(e, shown)),
                }
                open_beneath(root, &prefix, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
                    .map_err(|e| FsError::of(e, shown))?
            }
            Err(e) => return Err(FsError::of(e, shown)),
        };
    }
    Ok(dir)
}

fn kind_of(file_type: FileType) -> EntryKind {
    match file_type {
        FileType::RegularFile => EntryKind::File,
        FileType::Directory => EntryKind::Directory,
        FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// What [`read`] hands over, in order.
#[derive(Debug)]
pub enum ReadPart {
    /// A regular file of this size: its bytes follow.
    File(u64),
    /// Bytes of the file (at most [`DATA_CHUNK`]).
    Data(Vec<u8>),
    /// A directory: its entries follow.
    Directory,
    /// Some entries (sorted by name across the parts).
    Entries(Vec<WireEntry>),
}

/// Reads a file or lists a directory, handing the parts to `sink` (which fails when the
/// reader went away). A file is handed over as exactly the size it had when opened; a
/// directory's entries in name order, at most [`ENTRIES_PER_PART`] a part, each part
/// looked at as it is handed over (so the listing's memory is its names and one part).
///
/// # Errors
/// [`FsError`] naming the path.
pub fn read(path: &SandboxPath, sink: &mut dyn FnMut(ReadPart) -> io::Result<()>) -> FsResult<()> {
    let root = open_root(path.root())?;
    let fd = open_beneath(
        &root,
        path.relative(),
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    )
    .map_err(|e| FsError::of(e, path))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| FsError::of(e, path))?;
    let gone = |e: io::Error| FsError::new("io", format!("{path}: the reader went away: {e}"));
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::RegularFile => {
            let size = u64::try_from(stat.st_size).unwrap_or(0);
            sink(ReadPart::File(size)).map_err(gone)?;
            let mut file = File::from(fd);
            let mut left = size;
            let mut buf = vec![0u8; DATA_CHUNK];
            while left > 0 {
                let want = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                let n = match file.read(&mut buf[..want]) {
                    Ok(0) => {
                        return Err(FsError::new(
                            "io",
                            format!("{path} shrank while it was read; read it again"),
                        ));
                    }
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(FsError::io(&e, path)),
                };
                left -= n as u64;
                sink(ReadPart::Data(buf[..n].to_vec())).map_err(gone)?;
            }
            Ok(())
        }
        FileType::Directory => {
            let names = names(&fd, path)?;
            if names.len() > MAX_ENTRIES {
                return Err(FsError::new(
                    "too_large",
                    format!(
                        "{path} has {} entries; a listing holds at most {MAX_ENTRIES} (download its archive instead)",
                        names.len()
                    ),
                ));
            }
            // The entries are looked at one batch at a time as they are sent, so a listing
            // holds its names and one batch, never every entry. The first batch is looked
            // at before the listing is announced: a directory its user may read but not
            // search fails up front, with its error, not after the listing began.
            let mut batches = names.chunks(ENTRIES_PER_PART);
            let first = batches.next().map(|batch| entries(&fd, batch, path)).transpose()?;
            sink(ReadPart::Directory).map_err(gone)?;
            for part in first.into_iter().map(Ok).chain(batches.map(|batch| entries(&fd, batch, path))) {
                let part = part?;
                if !part.is_empty() {
                    sink(ReadPart::Entries(part)).map_err(gone)?;
                }
            }
            Ok(())
        }
        other => Err(FsError::new(
            "conflict",
            format!("{path} is not a regular file or a directory ({})", kind_name(other)),
        )),
    }
}

fn kind_name(file_type: FileType) -> &'static str {
    match file_type {
        FileType::Fifo => "a FIFO",
        FileType::Socket => "a socket",
        FileType::CharacterDevice => "a character device",
        FileType::BlockDevice => "a block device",
        FileType::Symlink => "a symlink",
        _ => "of an unknown kind",
    }
}

/// The names of a directory (not `.` and `..`), sorted.
fn names(dir: &OwnedFd, path: &dyn std::fmt::Display) -> FsResult<Vec<Vec<u8>>> {
    let mut reader = rustix::fs::Dir::read_from(dir).map_err(|e| FsError::of(e, path))?;
    let mut out = Vec::new();
    while let Some(entry) = reader.read() {
        let entry = entry.map_err(|e| FsError::of(e, path))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    out.sort();
    Ok(out)
}

/// The entries of `batch` (names of the directory `dir`), each looked at without following
/// a link; a name removed since it was listed is left out.
fn entries(dir: &OwnedFd, batch: &[Vec<u8>], path: &SandboxPath) -> FsResult<Vec<WireEntry>> {
    let mut out = Vec::with_capacity(batch.len());
    for name in batch {
        let stat = match rustix::fs::statat(dir, name.as_slice(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            // Removed since it was listed.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(FsError::of(e, path)),
        };
        out.push(WireEntry {
            name: String::from_utf8_lossy(name).into_owned(),
            kind: kind_of(FileType::from_raw_mode(stat.st_mode)).as_str().to_owned(),
            size: u64::try_from(stat.st_size).unwrap_or(0),
        });
    }
    Ok(out)
}

/// A file being written: unnamed until [`Pending::commit`]; dropped before it, nothing
/// of it stays.
struct Pending<'a> {
    dir: &'a OwnedFd,
    file: File,
    /// The hidden name it has while it is written (only where `O_TMPFILE` is missing).
    named: Option<String>,
}

/// Makes an entry of `dir` with `make` under a temporary name, then renames it over `name`
/// (what was there is replaced in one step); the temporary entry goes if the rename fails.
fn make_in_place(
    dir: &impl AsFd,
    name: &str,
    shown: &str,
    make: impl FnOnce(&str) -> rustix::io::Result<()>,
) -> FsResult<()> {
    let temp = temp_name();
    make(temp.as_str()).map_err(|e| FsError::of(e, &shown))?;
    if let Err(e) = rustix::fs::renameat(dir, temp.as_str(), dir, name) {
        let _ = rustix::fs::unlinkat(dir, temp.as_str(), AtFlags::empty());
        return Err(FsError::of(e, &shown));
    }
    Ok(())
}

/// A hidden name for a file being written.
fn temp_name() -> String {
    let mut bytes = [0u8; 8];
    let _ = getrandom::fill(&mut bytes);
    format!(".sandlane-upload-{}", u64::from_le_bytes(bytes))
}

impl<'a> Pending<'a> {
    fn new(dir: &'a OwnedFd, shown: &dyn std::fmt::Display) -> FsResult<Self> {
        let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
        match retry(|| rustix::fs::openat(dir, ".", flags, Mode::from_raw_mode(0o600))) {
            Ok(fd) => Ok(Self { dir, file: File::from(fd), named: None }),
            Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL) => {
                let name = temp_name();
                let flags =
                    OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
                let fd = retry(|| rustix::fs::openat(dir, name.as_str(), flags, Mode::from_raw_mode(0o600)))
                    .map_err(|e| FsError::of(e, shown))?;
                Ok(Self { dir, file: File::from(fd), named: Some(name) })
            }
            Err(e) => Err(FsError::of(e, shown)),
        }
    }

    fn write(&mut self, bytes: &[u8], shown: &dyn std::fmt::Display) -> FsResult<()> {
        self.file.write_all(bytes).map_err(|e| FsError::io(&e, shown))
    }

    /// Gives the file `mode` (and `mtime`, when given) and puts it at `name`, replacing
    /// what was there.
    fn commit(
        mut self,
        name: &str,
        mode: u32,
        mtime: Option<i64>,
        shown: &dyn std::fmt::Display,
    ) -> FsResult<()> {
        let fail = |e: Errno| FsError::of(e, shown);
        rustix::fs::fchmod(&self.file, Mode::from_raw_mode(mode)).map_err(fail)?;
        if let Some(secs) = mtime {
            let at = rustix::fs::Timespec { tv_sec: secs, tv_nsec: 0 };
            let _ = rustix::fs::futimens(&self.file, &Timestamps { last_access: at, last_modification: at });
        }
        let temp = match self.named.take() {
            Some(name) => name,
            None => {
                let name = temp_name();
                let fd_path = format!("/proc/self/fd/{}", self.file.as_raw_fd());
                retry(|| {
                    rustix::fs::linkat(
                        CWD,
                        fd_path.as_str(),
                        self.dir,
                        name.as_str(),
                        AtFlags::SYMLINK_FOLLOW,
                    )
                })
                .map_err(fail)?;
                name
            }
        };
        let renamed = retry(|| rustix::fs::renameat(self.dir, temp.as_str(), self.dir, name));
        if let Err(e) = renamed {
            let _ = rustix::fs::unlinkat(self.dir, temp.as_str(), AtFlags::empty());
            return Err(fail(e));
        }
        Ok(())
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(name) = &self.named {
            let _ = rustix::fs::unlinkat(self.dir, name.as_str(), AtFlags::empty());
        }
    }
}

/// What an upload's next piece is.
#[derive(Debug)]
pub enum Piece {
    /// More bytes.
    Bytes(Vec<u8>),
    /// The last byte has come: commit.
    End,
    /// The upload was abandoned: keep nothing.
    Abandoned,
}

/// The mode a file at `name` in `dir` keeps (an existing file's), or `None` when there is
/// none; a directory there is a conflict.
fn existing_mode(dir: &OwnedFd, name: &str, shown: &dyn std::fmt::Display) -> FsResult<Option<u32>> {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => Err(FsError::new("conflict", format!("{shown} is a directory"))),
            FileType::RegularFile => Ok(Some(stat.st_mode & 0o7777)),
            _ => Ok(None),
        },
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(FsError::of(e, shown)),
    }
}

/// Writes a file from the pieces `next` gives, creating missing parents; returns its
/// size. A symlink at the path is replaced by the file (not written through).
///
/// # Errors
/// [`FsError`]; code `abandoned` when the upload was abandoned (nothing was written).
pub fn write(path: &SandboxPath, next: &mut dyn FnMut() -> Piece) -> FsResult<u64> {
    let Some(name) = path.file_name() else {
        return Err(FsError::new("conflict", format!("{path} is a directory")));
    };
    let root = open_root(path.root())?;
    let (parent, _) = split(path.relative());
    let dir = make_dirs(&root, parent, path)?;
    let mode = existing_mode(&dir, name, path)?.unwrap_or(0o644);
    let mut pending = Pending::new(&dir, path)?;
    let mut size = 0u64;
    loop {
        match next() {
            Piece::Bytes(bytes) => {
                pending.write(&bytes, path)?;
                size += bytes.len() as u64;
            }
            Piece::End => break,
            Piece::Abandoned => {
                return Err(FsError::new("abandoned", format!("{path}: the upload was abandoned")));
            }
        }
    }
    pending.commit(name, mode, None, path)?;
    Ok(size)
}

/// Deletes a file, a link, an empty directory, or (with `recursive`) a whole tree.
///
/// # Errors
/// [`FsError`].
pub fn delete(path: &SandboxPath, recursive: bool) -> FsResult<()> {
    let Some(name) = path.file_name() else {
        return Err(FsError::new(
            "conflict",
            format!("{path} is a root of the sandbox; it is never deleted"),
        ));
    };
    let root = open_root(path.root())?;
    let (parent, _) = split(path.relative());
    let dir = open_beneath(&root, parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| FsError::of(e, path))?;
    let stat = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|e| FsError::of(e, path))?;
    if FileType::from_raw_mode(stat.st_mode) == FileType::Directory {
        if recursive {
            remove_tree(&dir, OsStr::new(name), path, 0)
        } else {
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR).map_err(|e| FsError::of(e, path))
        }
    } else {
        rustix::fs::unlinkat(&dir, name, AtFlags::empty()).map_err(|e| FsError::of(e, path))
    }
}

fn remove_tree(parent: &OwnedFd, name: &OsStr, shown: &SandboxPath, depth: usize) -> FsResult<()> {
    if depth >= MAX_DEPTH {
        return Err(FsError::new("conflict", format!("{shown} is more than {MAX_DEPTH} directories deep")));
    }
    let dir =
        open_name(parent, name, OFlags::RDONLY | OFlags::DIRECTORY).map_err(|e| FsError::of(e, shown))?;
    for child in names(&dir, shown)? {
        let child = OsStr::from_bytes(&child);
        match rustix::fs::statat(&dir, child, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) if FileType::from_raw_mode(stat.st_mode) == FileType::Directory => {
                remove_tree(&dir, child, shown, depth + 1)?;
            }
            Ok(_) => match rustix::fs::unlinkat(&dir, child, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => {}
                Err(e) => return Err(FsError::of(e, shown)),
            },
            Err(Errno::NOENT) => {}
            Err(e) => return Err(FsError::of(e, shown)),
        }
    }
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(FsError::of(e, shown)),
    }
}

/// A reader of exactly `left` bytes of a file that fails, rather than pads, when the file
/// is shorter than it was when its header was written.
struct Exact<'a> {
    file: File,
    left: u64,
    shown: &'a Path,
}

impl Read for Exact<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = usize::try_from(self.left).unwrap_or(usize::MAX).min(buf.len());
        let n = self.file.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::other(format!("{} shrank while it was archived", self.shown.display())));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

fn header(stat: &rustix::fs::Stat, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(stat.st_mode & 0o7777);
    h.set_uid(u64::from(stat.st_uid));
    h.set_gid(u64::from(stat.st_gid));
    h.set_mtime(u64::try_from(stat.st_mtime).unwrap_or(0));
    h
}

/// Writes a tar archive of the directory `path` into `out`: its files, directories and
/// symlinks (as links; never followed), FIFOs and devices as such (no contents); sockets,
/// which tar cannot hold, are left out. Paths in the archive are relative to `path`.
///
/// # Errors
/// [`FsError`]; `invalid` when `path` is not a directory.
pub fn archive_out(path: &SandboxPath, out: impl Write) -> FsResult<()> {
    let root = open_root(path.root())?;
    let dir = open_beneath(&root, path.relative(), OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| match e {
            Errno::NOTDIR => FsError::new("conflict", format!("{path} is not a directory")),
            e => FsError::of(e, path),
        })?;
    let mut builder = tar::Builder::new(out);
    walk(&mut builder, &dir, Path::new(""), path, 0)?;
    builder.into_inner().and_then(|mut w| w.flush()).map_err(|e| FsError::io(&e, path))
}

fn walk<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    prefix: &Path,
    shown: &SandboxPath,
    depth: usize,
) -> FsResult<()> {
    if depth >= MAX_DEPTH {
        return Err(FsError::new("conflict", format!("{shown} is more than {MAX_DEPTH} directories deep")));
    }
    let failed = |e: io::Error| FsError::io(&e, shown);
    for name in names(dir, shown)? {
        let name = OsStr::from_bytes(&name);
        let at: PathBuf = prefix.join(name);
        let stat = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(FsError::of(e, &at.display())),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory => {
                let mut h = header(&stat, tar::EntryType::Directory, 0);
                builder.append_data(&mut h, &at, io::empty()).map_err(failed)?;
                let child = open_name(dir, name, OFlags::RDONLY | OFlags::DIRECTORY)
                    .map_err(|e| FsError::of(e, &at.display()))?;
                walk(builder, &child, &at, shown, depth + 1)?;
            }
            FileType::RegularFile => {
                let fd = open_name(dir, name, OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY)
                    .map_err(|e| FsError::of(e, &at.display()))?;
                let stat = rustix::fs::fstat(&fd).map_err(|e| FsError::of(e, &at.display()))?;
                let size = u64::try_from(stat.st_size).unwrap_or(0);
                let mut h = header(&stat, tar::EntryType::Regular, size);
                let reader = Exact { file: File::from(fd), left: size, shown: &at };
                builder.append_data(&mut h, &at, reader).map_err(failed)?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(dir, name, Vec::new())
                    .map_err(|e| FsError::of(e, &at.display()))?;
                let target = PathBuf::from(OsStr::from_bytes(target.as_bytes()));
                let mut h = header(&stat, tar::EntryType::Symlink, 0);
                builder.append_link(&mut h, &at, &target).map_err(failed)?;
            }
            other => {
                let kind = match other {
                    FileType::Fifo => tar::EntryType::Fifo,
                    FileType::CharacterDevice => tar::EntryType::Char,
                    FileType::BlockDevice => tar::EntryType::Block,
                    // A socket (or an unknown kind): tar has no entry for it.
                    _ => continue,
                };
                let mut h = header(&stat, kind, 0);
                builder.append_data(&mut h, &at, io::empty()).map_err(failed)?;
            }
        }
    }
    Ok(())
}

/// The names of an archive entry's path, refused when it is absolute or holds `..`.
fn entry_names(bytes: &[u8]) -> Result<Vec<&str>, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "a name that is not UTF-8".to_owned())?;
    if text.starts_with('/') {
        return Err(format!("the absolute name {text:?}"));
    }
    let mut names = Vec::new();
    for name in text.split('/') {
        match name {
            "" | "." => {}
            ".." => return Err(format!("the name {text:?}, which holds `..`")),
            n if n.contains('\0') => return Err(format!("the name {text:?}, which holds a NUL")),
            n => names.push(n),
        }
    }
    Ok(names)
}

/// Unpacks the tar archive read from `input` into the directory `path` (created when
/// missing): files (whole or not at all, with their mode and modification time), directories,
/// symlinks and hard links (within the directory). Ownership is the sandbox user's. An
/// entry with an absolute name or `..` is refused, and every entry is resolved beneath
/// the root like any path. Returns (entries, bytes of file contents).
///
/// # Errors
/// [`FsError`]: `invalid` for a malformed archive or an entry refused; entries unpacked
/// before the failure stay.
pub fn archive_in(path: &SandboxPath, input: impl Read) -> FsResult<(u64, u64)> {
    let root = open_root(path.root())?;
    make_dirs(&root, path.relative(), path)?;
    let mut archive = tar::Archive::new(input);
    let bad = |e: io::Error| FsError::new("invalid", format!("the archive for {path} is malformed: {e}"));
    let (mut entries, mut bytes) = (0u64, 0u64);
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let raw = entry.path_bytes().into_owned();
        let names = entry_names(&raw).map_err(|why| {
            FsError::new(
                "invalid",
                format!("the archive for {path} has {why}; nothing beyond it was unpacked"),
            )
        })?;
        let kind = entry.header().entry_type();
        if kind == tar::EntryType::XGlobalHeader {
            continue;
        }
        let rel = join(path.relative(), &names);
        let shown = format!("{}/{}", path.root().as_str(), rel);
        match kind {
            tar::EntryType::Directory => {
                let dir = make_dirs(&root, &rel, &shown)?;
                if let Ok(mode) = entry.header().mode() {
                    let opened = open_beneath(&root, &rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty());
                    if let Ok(fd) = opened {
                        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode((mode & 0o777) | 0o700));
                    }
                }
                drop(dir);
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                let Some(name) = names.last() else { continue };
                let (parent, _) = split(&rel);
                let dir = make_dirs(&root, parent, &shown)?;
                let mode = entry.header().mode().map_or(0o644, |m| m & 0o777);
                let mtime = entry.header().mtime().ok().and_then(|t| i64::try_from(t).ok());
                let mut pending = Pending::new(&dir, &shown)?;
                let mut buf = vec![0u8; DATA_CHUNK];
                loop {
                    let n = match entry.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(bad(e)),
                    };
                    pending.write(&buf[..n], &shown)?;
                    bytes += n as u64;
                }
                pending.commit(name, mode, mtime, &shown)?;
            }
            tar::EntryType::Symlink => {
                let Some(name) = names.last() else { continue };
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        FsError::new("invalid", format!("the archive's symlink {shown} has no target"))
                    })?
                    .into_owned();
                let (parent, _) = split(&rel);
                let dir = make_dirs(&root, parent, &shown)?;
                make_in_place(&dir, name, &shown, |temp| {
                    rustix::fs::symlinkat(target.as_slice(), &dir, temp)
                })?;
            }
            tar::EntryType::Fifo => {
                // A FIFO the sandbox made (`mkfifo` needs no privilege): made again, so an
                // archive (or a snapshot) of a workspace that holds one unpacks whole.
                let Some(name) = names.last() else { continue };
                let mode = entry.header().mode().map_or(0o644, |m| m & 0o777);
                let (parent, _) = split(&rel);
                let dir = make_dirs(&root, parent, &shown)?;
                make_in_place(&dir, name, &shown, |temp| {
                    rustix::fs::mknodat(&dir, temp, FileType::Fifo, Mode::from_raw_mode(mode), 0)
                })?;
            }
            tar::EntryType::Link => {
                let Some(name) = names.last() else { continue };
                let target = entry
                    .link_name_bytes()
                    .ok_or_else(|| {
                        FsError::new("invalid", format!("the archive's hard link {shown} has no target"))
                    })?
                    .into_owned();
                let target_names = entry_names(&target).map_err(|why| {
                    FsError::new("invalid", format!("the archive's hard link {shown} has {why}"))
                })?;
                let target_rel = join(path.relative(), &target_names);
                let target_fd = open_beneath(&root, &target_rel, OFlags::PATH, Mode::empty())
                    .map_err(|e| FsError::of(e, &format!("{}/{target_rel}", path.root().as_str())))?;
                let (parent, _) = split(&rel);
                let dir = make_dirs(&root, parent, &shown)?;
                let fd_path = format!("/proc/self/fd/{}", target_fd.as_raw_fd());
                make_in_place(&dir, name, &shown, |temp| {
                    retry(|| rustix::fs::linkat(CWD, fd_path.as_str(), &dir, temp, AtFlags::SYMLINK_FOLLOW))
                })?;
            }
            other => {
                return Err(FsError::new(
                    "invalid",
                    format!(
                        "the archive's entry {shown} is a {other:?}: only files, directories, links and \
                         FIFOs are unpacked; nothing beyond it was unpacked"
                    ),
                ));
            }
        }
        entries += 1;
    }
    Ok((entries, bytes))
}

fn join(base: &str, names: &[&str]) -> String {
    let mut out = base.to_owned();
    for name in names {
        if !out.is_empty() {
            out.push('/');
        }
        out.push_str(name);
    }
    out
}

#[cfg(test)]
mod tests;
