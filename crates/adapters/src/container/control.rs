//! A sandbox's control directory, the one host directory its container writes: bounded.
//!
//! The supervisor (root in its container) listens on a unix socket the server must reach
//! from the host, so it creates that socket in a host directory bound read-write into the
//! container (`/.sandlane/control`). On the data dir's disk, that directory would let a
//! supervisor a sandbox took over write without bound to the server's disk. So it is a
//! tmpfs of its own, mounted on the host by the driver before the container is created:
//! [`CONTROL_BYTES`] of data and [`CONTROL_INODES`] entries (the socket, and a little
//! room), root only (0700), `nosuid,nodev,noexec`. A write past it fails inside with
//! `ENOSPC` and costs the host nothing more (its pages are charged to the memory cgroup of
//! the writer, the container). One mount per running sandbox, none for a suspended one:
//! unmounted (lazily) when the container goes (deprovision, suspension, a failed
//! provision, a supervisor found gone), before the host state is removed.
//!
//! (Not a tmpfs the engine mounts inside the container: the server could not reach the
//! socket in it. Not only the socket bound in: a listening socket is made where it is
//! bound, in a directory. Not an image with a quota, as the workspace's: 64 KiB of memory
//! costs less than a loop device and a filesystem.)

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::mount::{MountFlags, UnmountFlags};

/// The most bytes a sandbox's control directory holds.
pub const CONTROL_BYTES: u64 = 64 << 10;
/// The most entries (inodes) it holds, itself included.
pub const CONTROL_INODES: u64 = 16;

/// Whether `dir` is a mountpoint (a filesystem other than its parent's).
fn is_mounted(dir: &Path) -> io::Result<bool> {
    let here = std::fs::symlink_metadata(dir)?;
    let parent = std::fs::metadata(dir.join(".."))?;
    Ok(here.dev() != parent.dev())
}

/// Mounts the bounded tmpfs on the existing directory `dir`, unless one is there already
/// (a provision again, of a running sandbox).
///
/// # Errors
/// `mount`'s (the server must be root, as the driver requires).
pub fn mount(dir: &Path) -> io::Result<()> {
    if is_mounted(dir)? {
        return Ok(());
    }
    let options = format!("size={CONTROL_BYTES},nr_inodes={CONTROL_INODES},mode=0700,uid=0,gid=0");
    let options = std::ffi::CString::new(options).map_err(io::Error::other)?;
    rustix::mount::mount(
        "sandlane-control",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        options.as_c_str(),
    )?;
    Ok(())
}

/// Unmounts whatever is mounted on `dir` (lazily: a container still holding it keeps it
/// until it goes). `Ok` when nothing is, or `dir` is missing.
///
/// # Errors
/// `umount2`'s.
pub fn unmount(dir: &Path) -> io::Result<()> {
    loop {
        match is_mounted(dir) {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        }
        match rustix::mount::unmount(dir, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
            Ok(()) => {}
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::NOENT) => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    }
}
