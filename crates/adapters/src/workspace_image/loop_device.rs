//! A workspace image attached to a loop device and mounted, through the kernel's own
//! interface rather than `mount -o loop`.
//!
//! Why not the command: before it attaches an image, util-linux's `mount` looks for a
//! loop device already backed by the same file, reading the sysfs entries of every loop
//! device on the host. With one loop device per live sandbox that costs O(sandboxes) per
//! mount: measured here with 175 live sandboxes, 1,346 `stat`s and 568 `open`s, 22 ms of
//! the ensure (the `mount(2)` itself: 0.5 ms). The command's process start goes too. What
//! that search also did, mount again through a device that still backed the image (the
//! same filesystem again, when an earlier mount had not ended), [`wait_unused`] does in
//! O(1): the device an image was last bound to is recorded beside it.
//!
//! [`attach`] binds an image to a device; the container driver then mounts it on the host
//! ([`mount_image`]), the bubblewrap driver in the sandbox's own mount namespace (its
//! start's forked child mounts `/dev/loopN`), so the host's mount table does not grow
//! with the sandboxes.
//!
//! How: `LOOP_CTL_GET_FREE` on `/dev/loop-control` names a free device; `LOOP_CONFIGURE`
//! binds the image to it in one call with `LO_FLAGS_AUTOCLEAR`, so the device detaches by
//! itself when its last user goes (the mount's end, or this function's failure before the
//! mount); a device taken by someone else in between (`EBUSY`) is skipped for the next.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::mount::MountFlags;

/// `<linux/loop.h>`: the ioctls and the flag used.
const LOOP_CTL_GET_FREE: libc::c_ulong = 0x4C82;
const LOOP_CONFIGURE: libc::c_ulong = 0x4C0A;
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

/// `struct loop_config` (Linux 5.8).
#[repr(C)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

// The kernel's sizes: a layout mistake fails the build, not a mount.
const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// How many free devices to try when others take the one named first.
const ATTEMPTS: usize = 16;

/// An image bound to a loop device that detaches by itself once nothing uses it: while
/// this is held, and then for as long as a mount of the device lasts.
#[derive(Debug)]
pub(crate) struct Attached {
    number: u32,
    _device: File,
}

impl Attached {
    /// The device's number (`/dev/loopN`).
    pub(crate) fn number(&self) -> u32 {
        self.number
    }

    /// The device's path.
    pub(crate) fn path(&self) -> PathBuf {
        PathBuf::from(format!("/dev/loop{}", self.number))
    }
}

/// How long [`wait_unused`] waits for an earlier filesystem on an image to go.
const UNUSED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The side file naming the device an image was last bound to.
pub(super) fn device_file(image: &Path) -> PathBuf {
    let mut name = image.as_os_str().to_owned();
    name.push(".loop");
    PathBuf::from(name)
}

/// Waits until no filesystem of an earlier mount uses `image` any more. `mount -o loop`
/// found a device already backed by the image and mounted that one (the same filesystem
/// again); a second device would be a second, independent filesystem on the same image:
/// one that does not see what the other still holds in memory, and two writers. That
/// happens when a workspace is mounted again while its last mount has not ended yet: an
/// unmount that had to detach lazily (a container engine still holding the mount), a
/// sandbox whose processes are still going. So the device an image was last bound to is
/// recorded beside it, and before the image is grown or bound again: if that device still
/// backs the image and is in use by a filesystem (an exclusive open is refused), this
/// waits for it to go, up to 10 s, then refuses. A device that backs the image unused (its
/// autoclear rundown is asynchronous) holds no filesystem and is left to go.
///
/// # Errors
/// A message when a filesystem still uses the image after the wait.
pub(crate) fn wait_unused(image: &Path) -> Result<(), String> {
    let Some(number) =
        std::fs::read_to_string(device_file(image)).ok().and_then(|n| n.trim().parse::<u32>().ok())
    else {
        return Ok(());
    };
    let name = format!("loop{number}");
    let backs_image = || backs(&name, image);
    let deadline = std::time::Instant::now() + UNUSED_WAIT;
    loop {
        if !backs_image() {
            return Ok(());
        }
        let in_use =
            match OpenOptions::new().read(true).custom_flags(libc::O_EXCL).open(format!("/dev/loop{number}"))
            {
                Ok(_) => false,
                Err(e) => e.raw_os_error() == Some(libc::EBUSY),
            };
        if !in_use {
            return Ok(());
        }
        if std::time::Instant::now() >= deadline {
            return Err(format!(
                "the workspace image {} is still mounted (through /dev/loop{number}) by a sandbox that has \
                 not ended; try again once it has",
                image.display()
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Whether the loop device `name` (`loopN`) is bound to `image` now, by sysfs (an image
/// deleted while bound included).
pub(crate) fn backs(name: &str, image: &Path) -> bool {
    std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file"))
        .is_ok_and(|f| Path::new(f.trim().trim_end_matches(" (deleted)")) == image)
}

/// Binds `image` to a free loop device (autoclear), and records which (see
/// [`wait_unused`]). The caller has waited for [`wait_unused`].
///
/// # Errors
/// A message naming the step that failed.
pub(crate) fn attach(image: &Path) -> Result<Attached, String> {
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .open(image)
        .map_err(|e| format!("cannot open {}: {e}", image.display()))?;
    let control = OpenOptions::new().read(true).write(true).open("/dev/loop-control").map_err(|e| {
        format!("cannot open /dev/loop-control (loop devices are needed for workspace quotas): {e}")
    })?;
    let fd = u32::try_from(backing.as_raw_fd()).map_err(|_| "a negative descriptor".to_owned())?;
    let mut last = None;
    for _ in 0..ATTEMPTS {
        let number = free_device(&control)?;
        let path = PathBuf::from(format!("/dev/loop{number}"));
        let device = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        match configure(&device, fd, image) {
            Ok(()) => {
                std::fs::write(device_file(image), number.to_string())
                    .map_err(|e| format!("cannot record the loop device of {}: {e}", image.display()))?;
                return Ok(Attached { number, _device: device });
            }
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => last = Some(e),
            Err(e) => return Err(format!("cannot attach {} to {}: {e}", image.display(), path.display())),
        }
    }
    Err(format!(
        "no free loop device for {} after {ATTEMPTS} tries: {}",
        image.display(),
        last.map_or_else(String::new, |e| e.to_string())
    ))
}

/// Mounts the ext4 filesystem in `image` on `mountpoint` (`nosuid,nodev,noatime`) through a
/// free loop device that detaches when the mount ends.
///
/// # Errors
/// A message naming the step that failed.
pub(super) fn mount_image(image: &Path, mountpoint: &Path) -> Result<(), String> {
    let attached = attach(image)?;
    let flags = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOATIME;
    // On failure the device detaches as `attached` drops (autoclear).
    rustix::mount::mount(attached.path(), mountpoint, "ext4", flags, None).map_err(|e| {
        format!(
            "cannot mount {} ({}) on {}: {e}",
            image.display(),
            attached.path().display(),
            mountpoint.display()
        )
    })
}

/// The number of a free loop device (the kernel adds one when none is free).
#[allow(unsafe_code)]
fn free_device(control: &File) -> Result<u32, String> {
    // SAFETY: LOOP_CTL_GET_FREE takes no argument; the descriptor is open and ours.
    let number = unsafe { libc::ioctl(control.as_raw_fd(), LOOP_CTL_GET_FREE) };
    u32::try_from(number).map_err(|_| format!("no free loop device: {}", io::Error::last_os_error()))
}

/// Binds the open image `fd` to `device`, detaching by itself when unused.
#[allow(unsafe_code)]
fn configure(device: &File, fd: u32, image: &Path) -> io::Result<()> {
    let mut info = LoopInfo64 {
        lo_device: 0,
        lo_inode: 0,
        lo_rdevice: 0,
        lo_offset: 0,
        lo_sizelimit: 0,
        lo_number: 0,
        lo_encrypt_type: 0,
        lo_encrypt_key_size: 0,
        lo_flags: LO_FLAGS_AUTOCLEAR,
        lo_file_name: [0; 64],
        lo_crypt_name: [0; 64],
        lo_encrypt_key: [0; 32],
        lo_init: [0; 2],
    };
    // The name `losetup -l` shows (informational; the kernel keeps 63 bytes of it).
    let name = image.as_os_str().as_bytes();
    let n = name.len().min(info.lo_file_name.len() - 1);
    info.lo_file_name[..n].copy_from_slice(&name[..n]);
    let config = LoopConfig { fd, block_size: 0, info, reserved: [0; 8] };
    // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, whose layout `LoopConfig` has
    // (checked above); the pointer is valid for the call and the kernel does not keep it.
    let done = unsafe { libc::ioctl(device.as_raw_fd(), LOOP_CONFIGURE, &raw const config) };
    if done == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}
