//! The quota against the real kernel: loop-mounted ext4 images (these tests run as root,
//! as the server does).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::Command;

use super::*;

/// A uid no one on the host uses, for an unprivileged writer.
const WRITER: u32 = 1_987_654_321;

fn fixture(name: &str) -> (tempfile::TempDir, WorkspaceImage) {
    let dir = tempfile::Builder::new().prefix("sandlane-quota-").tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mountpoint = dir.path().join(name);
    fs::create_dir(&mountpoint).unwrap();
    fs::set_permissions(&mountpoint, fs::Permissions::from_mode(0o755)).unwrap();
    let image = WorkspaceImage::new(
        dir.path().join("images").join(format!("{name}.img")),
        mountpoint,
        dir.path().join("images/templates"),
    );
    (dir, image)
}

/// `dd` of `mib` MiB appended to `file`, as the unprivileged writer: (success, stderr).
fn write_as_sandbox(file: &Path, mib: u64) -> (bool, String) {
    let out = Command::new("dd")
        .args(["if=/dev/zero", &format!("of={}", file.display()), "bs=1M", &format!("count={mib}")])
        .args(["oflag=append", "conv=notrunc,fsync"])
        .uid(WRITER)
        .gid(WRITER)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

struct Unmount<'a>(&'a WorkspaceImage);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        let _ = self.0.unmount();
    }
}

#[test]
fn an_unprivileged_writer_gets_exactly_the_quota_and_then_enospc() {
    let (dir, ws) = fixture("exact");
    let host_before = statfs(dir.path()).unwrap();
    assert_eq!(ws.prepare(8 << 20, (WRITER, WRITER)).unwrap(), Prepared::Created);
    let _unmount = Unmount(&ws);
    assert!(is_mounted(&ws.mountpoint).unwrap());
    let stat = statfs(&ws.mountpoint).unwrap();
    assert_eq!(stat.available * stat.block_size, 8 << 20, "statfs shows the quota to the sandbox");
    assert_eq!(fs::read_dir(&ws.mountpoint).unwrap().count(), 0, "an empty workspace, no lost+found");
    let root = fs::metadata(&ws.mountpoint).unwrap();
    assert_eq!(
        (root.permissions().mode() & 0o7777, std::os::unix::fs::MetadataExt::uid(&root)),
        (0o700, WRITER)
    );
    let file = ws.mountpoint.join("fill");
    let (ok, err) = write_as_sandbox(&file, 7);
    assert!(ok, "7 MiB of an 8 MiB quota: {err}");
    let (ok, err) = write_as_sandbox(&file, 2);
    assert!(!ok, "past the quota the write fails");
    assert!(err.contains("No space left on device"), "{err}");
    // On the host, the workspace takes at most the quota and the image's metadata: the
    // image's allocated blocks (the host's free space moves with every other process too).
    let taken = std::os::unix::fs::MetadataExt::blocks(&fs::metadata(&ws.image).unwrap()) * 512;
    assert!(taken <= (8 << 20) + (4 << 20), "the image holds {taken} bytes for an 8 MiB quota");
    assert!(taken >= 7 << 20, "the image holds what was written: {taken}");
    let _ = host_before;
    assert!(used_bytes(&ws.mountpoint).unwrap() >= 7 << 20);
}

#[test]
fn a_workspace_keeps_its_files_across_mounts_and_grows_with_a_larger_quota() {
    let (_dir, ws) = fixture("grow");
    ws.prepare(4 << 20, (WRITER, WRITER)).unwrap();
    let _unmount = Unmount(&ws);
    let file = ws.mountpoint.join("kept");
    assert!(write_as_sandbox(&file, 3).0);
    ws.unmount().unwrap();
    assert!(!is_mounted(&ws.mountpoint).unwrap());
    assert!(!file.exists(), "unmounted, the files are in the image only");
    // A smaller quota changes nothing; the same one neither.
    assert_eq!(ws.prepare(2 << 20, (WRITER, WRITER)).unwrap(), Prepared::Existing);
    assert_eq!(fs::metadata(&file).unwrap().len(), 3 << 20, "the workspace came back");
    assert!(!write_as_sandbox(&ws.mountpoint.join("more"), 2).0, "still 4 MiB");
    ws.unmount().unwrap();
    // A larger one: 12 MiB more room, whatever the workspace already holds.
    assert_eq!(ws.prepare(16 << 20, (WRITER, WRITER)).unwrap(), Prepared::Existing);
    let _ = fs::remove_file(ws.mountpoint.join("more"));
    let stat = statfs(&ws.mountpoint).unwrap();
    let left = stat.available * stat.block_size;
    assert!(
        ((13 << 20) - (64 << 10)..=13 << 20).contains(&left),
        "{left} bytes left of 16 MiB with 3 MiB used"
    );
    assert!(write_as_sandbox(&ws.mountpoint.join("more"), 10).0);
    assert!(!write_as_sandbox(&ws.mountpoint.join("more"), 4).0);
}

#[test]
fn a_workspace_made_before_quotas_is_left_as_it_is_and_removal_cleans_up() {
    let (_dir, ws) = fixture("legacy");
    fs::write(ws.mountpoint.join("old"), b"data").unwrap();
    assert_eq!(ws.prepare(4 << 20, (WRITER, WRITER)).unwrap(), Prepared::Legacy);
    assert!(!is_mounted(&ws.mountpoint).unwrap());
    assert!(!ws.image.exists());

    let (_dir, ws) = fixture("removed");
    ws.prepare(4 << 20, (WRITER, WRITER)).unwrap();
    ws.remove().unwrap();
    assert!(!is_mounted(&ws.mountpoint).unwrap());
    assert!(!ws.image.exists() && !ws.mountpoint.exists());
    ws.remove().unwrap(); // idempotent
}

#[test]
fn mountinfo_paths_are_unescaped() {
    assert_eq!(unescape_mountinfo("/a\\040b\\011c\\134d"), "/a b\tc\\d");
    assert_eq!(unescape_mountinfo("/plain"), "/plain");
    assert_eq!(unescape_mountinfo("/x\\04"), "/x\\04");
}

/// The mount options of the mount at `path` (mountinfo's fourth-from-mount field).
fn mount_options(path: &Path) -> Option<String> {
    let table = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_string_lossy().into_owned();
    table.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        (fields.get(4).map(|m| unescape_mountinfo(m)) == Some(want.clone())).then(|| fields[5].to_owned())
    })
}

#[test]
fn a_workspace_is_mounted_through_its_own_loop_device_which_goes_with_the_mount() {
    let (_dir, ws) = fixture("device");
    ws.prepare(4 << 20, (WRITER, WRITER)).unwrap();
    let unmount = Unmount(&ws);
    let devices = loop_devices_backed_by(&ws.image);
    assert_eq!(devices.len(), 1, "one loop device backs the image: {devices:?}");
    let autoclear = fs::read_to_string(format!("/sys/block/{}/loop/autoclear", devices[0])).unwrap();
    assert_eq!(autoclear.trim(), "1", "the device detaches when its mount goes");
    let options = mount_options(&ws.mountpoint).expect("mounted");
    for want in ["nosuid", "nodev", "noatime"] {
        assert!(options.split(',').any(|o| o == want), "{want} in {options}");
    }
    // Prepared again while mounted: nothing more is attached.
    assert_eq!(ws.prepare(4 << 20, (WRITER, WRITER)).unwrap(), Prepared::Existing);
    assert_eq!(loop_devices_backed_by(&ws.image).len(), 1);
    drop(unmount);
    assert!(!is_mounted(&ws.mountpoint).unwrap());
    assert_eq!(wait_detached(&ws.image), Vec::<String>::new(), "the device detached with the mount");
    // And mounts again (the files were kept: the image is the workspace).
    ws.prepare(4 << 20, (WRITER, WRITER)).unwrap();
    let _unmount = Unmount(&ws);
    assert_eq!(loop_devices_backed_by(&ws.image).len(), 1);
}

#[test]
fn an_image_that_does_not_mount_leaves_no_loop_device_behind() {
    let (dir, ws) = fixture("broken");
    let image = dir.path().join("not-ext4.img");
    let file = fs::File::create(&image).unwrap();
    file.set_len(8 << 20).unwrap();
    drop(file);
    let err = loop_device::mount_image(&image, &ws.mountpoint).unwrap_err();
    assert!(err.contains("cannot mount") && err.contains("not-ext4.img"), "{err}");
    assert!(!is_mounted(&ws.mountpoint).unwrap());
    assert_eq!(wait_detached(&image), Vec::<String>::new(), "the device detached on failure");
    let err = loop_device::mount_image(&dir.path().join("missing.img"), &ws.mountpoint).unwrap_err();
    assert!(err.contains("cannot open") && err.contains("missing.img"), "{err}");
}

#[test]
fn an_image_is_mounted_again_only_once_its_last_filesystem_has_gone() {
    use std::io::{Read, Write};
    let (_dir, ws) = fixture("again");
    ws.prepare(8 << 20, (WRITER, WRITER)).unwrap();
    fs::write(ws.mountpoint.join("kept"), b"first\n").unwrap();
    // Something still uses the workspace (a container engine's late mount, a process that
    // has not ended): the unmount can only detach it lazily, and its filesystem lives on.
    let mut held = fs::OpenOptions::new().append(true).open(ws.mountpoint.join("kept")).unwrap();
    ws.unmount().unwrap();
    assert!(!is_mounted(&ws.mountpoint).unwrap(), "detached from the host");
    held.write_all(b"late\n").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(500));
        drop(held);
    });
    let started = std::time::Instant::now();
    assert_eq!(ws.prepare(8 << 20, (WRITER, WRITER)).unwrap(), Prepared::Existing);
    let _unmount = Unmount(&ws);
    release.join().unwrap();
    assert!(started.elapsed() >= std::time::Duration::from_millis(400), "waited for the old filesystem");
    // One filesystem at a time: what the old one held reached the image before the new one
    // read it.
    let mut kept = String::new();
    fs::File::open(ws.mountpoint.join("kept")).unwrap().read_to_string(&mut kept).unwrap();
    assert_eq!(kept, "first\nlate\n");
}

#[test]
fn a_sparse_copy_keeps_the_data_and_the_holes() {
    use std::os::unix::fs::{FileExt, MetadataExt};
    let dir = tempfile::tempdir().unwrap();
    let (from, to) = (dir.path().join("from"), dir.path().join("to"));
    let file = fs::File::create(&from).unwrap();
    file.set_len(64 << 20).unwrap();
    // Data at the start, in the middle across an extent's end, and at the very end.
    let pattern: Vec<u8> = (0..(3 << 20)).map(|i: u32| (i % 251) as u8).collect();
    file.write_all_at(&pattern[..8192], 0).unwrap();
    file.write_all_at(&pattern, 20 << 20).unwrap();
    file.write_all_at(&pattern[..4096], (64 << 20) - 4096).unwrap();
    file.sync_all().unwrap();
    drop(file);
    sparse_copy(&from, &to, false).unwrap();
    assert_eq!(fs::read(&from).unwrap(), fs::read(&to).unwrap(), "the same bytes");
    let (a, b) = (fs::metadata(&from).unwrap(), fs::metadata(&to).unwrap());
    assert_eq!(b.len(), 64 << 20);
    assert_eq!(b.mode() & 0o777, 0o600);
    // What is allocated is what the source holds (3 MiB and 12 KiB), not 64 MiB.
    assert!(b.blocks() * 512 <= a.blocks() * 512 + (1 << 20), "{} against {}", b.blocks(), a.blocks());
    assert!(b.blocks() * 512 >= 3 << 20);
    // A copy never overwrites.
    assert_eq!(sparse_copy(&from, &to, false).unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
}
