use std::os::unix::fs::MetadataExt;

use domain::{OrgId, SnapshotId};

use super::*;

fn snapshot(n: u128) -> SnapshotRef {
    SnapshotRef { org: OrgId::parse("acme").unwrap(), id: SnapshotId::generate(1, n) }
}

#[test]
fn a_tree_snapshot_is_a_copy_that_later_writes_do_not_reach() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    fs::create_dir_all(ws.join("sub")).unwrap();
    fs::write(ws.join("sub/a.txt"), b"one").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ws.join("link")).unwrap();
    let files = SnapshotFiles::new(tmp.path().join("snapshots"));
    let s = snapshot(1);
    let bytes = files.take_tree(&s, &ws).unwrap();
    assert!(bytes > 0);
    fs::write(ws.join("sub/a.txt"), b"two").unwrap();
    let Some(Stored::Tree(tree)) = files.stored(&s).unwrap() else { panic!("a tree") };
    assert_eq!(fs::read(tree.join("sub/a.txt")).unwrap(), b"one");
    assert_eq!(fs::read_link(tree.join("link")).unwrap(), Path::new("/etc/passwd"), "a link stays a link");
    files.delete(&s).unwrap();
    assert_eq!(files.stored(&s).unwrap(), None);
    files.delete(&s).unwrap();
}

#[test]
fn an_image_snapshot_copies_what_the_image_holds_not_its_size() {
    let tmp = tempfile::tempdir().unwrap();
    let image = tmp.path().join("ws.img");
    let file = fs::File::create(&image).unwrap();
    file.set_len(1 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, &[7u8; 1 << 20], 64 << 20).unwrap();
    drop(file);
    let files = SnapshotFiles::new(tmp.path().join("snapshots"));
    let s = snapshot(2);
    let bytes = files.take_image(&s, &image, 123 << 20, Some((7, 8))).unwrap();
    assert!((1 << 20..4 << 20).contains(&bytes), "{bytes} bytes for a 1 GiB image holding 1 MiB");
    let Some(Stored::Image { image: copy, quota, owner }) = files.stored(&s).unwrap() else {
        panic!("an image")
    };
    assert_eq!((quota, owner), (123 << 20, Some((7, 8))));
    assert_eq!(fs::metadata(&copy).unwrap().len(), 1 << 30);
    let mut at = [0u8; 4];
    std::os::unix::fs::FileExt::read_exact_at(&fs::File::open(&copy).unwrap(), &mut at, 64 << 20).unwrap();
    assert_eq!(at, [7; 4]);
}

#[test]
fn a_failed_snapshot_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let files = SnapshotFiles::new(tmp.path().join("snapshots"));
    let s = snapshot(3);
    assert!(files.take_image(&s, &tmp.path().join("missing.img"), 1, None).is_err());
    assert!(files.take_tree(&s, &tmp.path().join("missing")).is_err());
    assert_eq!(files.stored(&s).unwrap(), None);
    let org = tmp.path().join("snapshots/acme");
    assert_eq!(fs::read_dir(org).unwrap().count(), 0, "no partial directory left");
}

#[test]
fn rechown_gives_the_source_owners_entries_to_the_new_owner_only() {
    if !nix_root() {
        return; // lchown to other uids needs root
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("ws");
    fs::create_dir_all(dir.join("d")).unwrap();
    fs::write(dir.join("d/f"), b"x").unwrap();
    fs::write(dir.join("root-owned"), b"x").unwrap();
    std::os::unix::fs::symlink("nowhere", dir.join("l")).unwrap();
    for p in [dir.clone(), dir.join("d"), dir.join("d/f")] {
        std::os::unix::fs::lchown(&p, Some(5001), Some(5001)).unwrap();
    }
    std::os::unix::fs::lchown(dir.join("l"), Some(5001), Some(5001)).unwrap();
    rechown(&dir, (6002, 6003)).unwrap();
    for p in [dir.clone(), dir.join("d"), dir.join("d/f"), dir.join("l")] {
        let m = fs::symlink_metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid()), (6002, 6003), "{}", p.display());
    }
    assert_eq!(fs::metadata(dir.join("root-owned")).unwrap().uid(), 0, "another owner's entry stays");
}

fn nix_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    unsafe {
        libc::geteuid() == 0
    }
}
