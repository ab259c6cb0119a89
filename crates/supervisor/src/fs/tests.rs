//! The file operations on the host's `/tmp` (a root like the sandbox's): confinement,
//! nothing partial, archives both ways.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::PathBuf;

use super::*;

/// A fresh directory under `/tmp`, removed at the end, and the paths beneath it.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = PathBuf::from("/tmp").join(format!("sandlane-fs-{}", temp_name()));
        std::fs::create_dir(&dir).unwrap();
        Self(dir)
    }
    fn rel(&self, name: &str) -> String {
        let base = self.0.strip_prefix("/tmp").unwrap().display().to_string();
        if name.is_empty() { format!("/tmp/{base}") } else { format!("/tmp/{base}/{name}") }
    }
    fn path(&self, name: &str) -> SandboxPath {
        SandboxPath::parse(&self.rel(name)).unwrap()
    }
    fn host(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn read_all(path: &SandboxPath) -> FsResult<(Option<u64>, Vec<u8>, Vec<WireEntry>)> {
    let (mut size, mut data, mut entries) = (None, Vec::new(), Vec::new());
    read(path, &mut |part| {
        match part {
            ReadPart::File(n) => size = Some(n),
            ReadPart::Data(bytes) => data.extend(bytes),
            ReadPart::Directory => {}
            ReadPart::Entries(e) => entries.extend(e),
        }
        Ok(())
    })?;
    Ok((size, data, entries))
}

fn write_bytes(path: &SandboxPath, chunks: &[&[u8]], end: Piece) -> FsResult<u64> {
    let mut pieces: Vec<Piece> = chunks.iter().map(|c| Piece::Bytes(c.to_vec())).collect();
    pieces.push(end);
    pieces.reverse();
    write(path, &mut || pieces.pop().unwrap_or(Piece::Abandoned))
}

/// A big directory comes in parts of at most [`ENTRIES_PER_PART`], in name order across
/// them, after its announcement.
#[test]
fn a_listing_comes_in_bounded_parts() {
    let s = Scratch::new();
    std::fs::create_dir(s.host("big")).unwrap();
    for i in 0..250 {
        std::fs::write(s.host(&format!("big/{i:03}")), b"x").unwrap();
    }
    let mut parts = Vec::new();
    let mut announced = false;
    read(&s.path("big"), &mut |part| {
        match part {
            ReadPart::Directory => announced = true,
            ReadPart::Entries(e) => {
                assert!(announced, "entries before the listing was announced");
                parts.push(e);
            }
            other => panic!("{other:?}"),
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(parts.iter().map(Vec::len).collect::<Vec<_>>(), [100, 100, 50]);
    let names: Vec<String> = parts.into_iter().flatten().map(|e| e.name).collect();
    assert_eq!(names, (0..250).map(|i| format!("{i:03}")).collect::<Vec<_>>());
    // An empty directory: announced, no part.
    std::fs::create_dir(s.host("empty")).unwrap();
    let mut seen = Vec::new();
    read(&s.path("empty"), &mut |part| {
        seen.push(format!("{part:?}"));
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, ["Directory"]);
}

#[test]
fn write_creates_parents_then_read_and_list() {
    let s = Scratch::new();
    let n = write_bytes(&s.path("a/b/c.txt"), &[b"hello ", b"world"], Piece::End).unwrap();
    assert_eq!(n, 11);
    assert_eq!(std::fs::read(s.host("a/b/c.txt")).unwrap(), b"hello world");
    let meta = std::fs::metadata(s.host("a/b/c.txt")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);
    assert_eq!(std::fs::metadata(s.host("a/b")).unwrap().permissions().mode() & 0o777, 0o755);
    let (size, data, _) = read_all(&s.path("a/b/c.txt")).unwrap();
    assert_eq!((size, data), (Some(11), b"hello world".to_vec()));
    // Replacing keeps the mode.
    std::fs::set_permissions(s.host("a/b/c.txt"), std::fs::Permissions::from_mode(0o600)).unwrap();
    write_bytes(&s.path("a/b/c.txt"), &[b"new"], Piece::End).unwrap();
    assert_eq!(std::fs::read(s.host("a/b/c.txt")).unwrap(), b"new");
    assert_eq!(std::fs::metadata(s.host("a/b/c.txt")).unwrap().permissions().mode() & 0o777, 0o600);
    symlink("c.txt", s.host("a/b/link")).unwrap();
    let (_, _, entries) = read_all(&s.path("a/b")).unwrap();
    let shown: Vec<(String, String, u64)> = entries.into_iter().map(|e| (e.name, e.kind, e.size)).collect();
    assert_eq!(shown, vec![("c.txt".into(), "file".into(), 3), ("link".into(), "symlink".into(), 5)]);
    // A link beneath the root is followed.
    assert_eq!(read_all(&s.path("a/b/link")).unwrap().1, b"new");
}

#[test]
fn an_abandoned_or_failed_upload_leaves_nothing() {
    let s = Scratch::new();
    std::fs::write(s.host("kept"), b"old").unwrap();
    let err = write_bytes(&s.path("kept"), &[b"partial"], Piece::Abandoned).unwrap_err();
    assert_eq!(err.code, "abandoned");
    assert_eq!(std::fs::read(s.host("kept")).unwrap(), b"old", "the old file stays whole");
    let err = write_bytes(&s.path("fresh"), &[b"partial"], Piece::Abandoned).unwrap_err();
    assert_eq!(err.code, "abandoned");
    let left: Vec<_> = std::fs::read_dir(&s.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, vec![std::ffi::OsString::from("kept")], "no partial or temporary file");
    // Positive control: the same upload ended commits.
    write_bytes(&s.path("fresh"), &[b"whole"], Piece::End).unwrap();
    assert_eq!(std::fs::read(s.host("fresh")).unwrap(), b"whole");
}

#[test]
fn links_and_mounts_never_lead_out() {
    let s = Scratch::new();
    symlink("/etc", s.host("etc")).unwrap();
    symlink("../../..", s.host("up")).unwrap();
    std::fs::create_dir(s.host("d")).unwrap();
    for (path, what) in [("etc/passwd", "absolute link"), ("up/etc/passwd", "relative link up")] {
        let err = read_all(&s.path(path)).unwrap_err();
        assert_eq!(err.code, "invalid", "{what}: {err:?}");
        assert!(err.message.contains("leads outside"), "{err:?}");
        let err = write_bytes(&s.path(&format!("{path}.new")), &[b"x"], Piece::End).unwrap_err();
        assert_eq!(err.code, "invalid", "{what}: {err:?}");
        let err = delete(&s.path(path), false).unwrap_err();
        assert_eq!(err.code, "invalid", "{what}: {err:?}");
    }
    assert!(!std::path::Path::new("/etc/passwd.new").exists());
    // A mount (here /tmp's own, when it is one, or /proc) is never crossed: /proc is
    // reachable only by a link, which leads out.
    symlink("/proc/self", s.host("proc")).unwrap();
    assert_eq!(read_all(&s.path("proc/environ")).unwrap_err().code, "invalid");
    // Positive control: the same names inside are read.
    std::fs::write(s.host("d/passwd"), b"mine").unwrap();
    symlink("d", s.host("inside")).unwrap();
    assert_eq!(read_all(&s.path("inside/passwd")).unwrap().1, b"mine");
}

#[test]
fn delete_files_links_and_trees() {
    let s = Scratch::new();
    std::fs::create_dir_all(s.host("t/u/v")).unwrap();
    std::fs::write(s.host("t/u/v/f"), b"x").unwrap();
    std::fs::write(s.host("outside"), b"keep").unwrap();
    symlink(s.host("outside"), s.host("t/link")).unwrap();
    assert_eq!(delete(&s.path("t"), false).unwrap_err().code, "conflict");
    delete(&s.path("t"), true).unwrap();
    assert!(!s.host("t").exists());
    assert_eq!(std::fs::read(s.host("outside")).unwrap(), b"keep", "a link is removed, not its target");
    assert_eq!(delete(&s.path("t"), true).unwrap_err().code, "not_found");
    assert_eq!(delete(&SandboxPath::parse("/tmp").unwrap(), true).unwrap_err().code, "conflict");
    std::fs::write(s.host("f"), b"x").unwrap();
    delete(&s.path("f"), false).unwrap();
    assert!(!s.host("f").exists());
}

#[test]
fn reads_refuse_fifos_and_name_missing_paths() {
    let s = Scratch::new();
    let status = std::process::Command::new("mkfifo").arg(s.host("fifo")).status().unwrap();
    assert!(status.success());
    let err = read_all(&s.path("fifo")).unwrap_err();
    assert_eq!(err.code, "conflict", "a FIFO is refused without blocking: {err:?}");
    let err = read_all(&s.path("missing")).unwrap_err();
    assert_eq!(err.code, "not_found");
    assert!(err.message.contains("missing"), "{err:?}");
    std::fs::create_dir(s.host("dir")).unwrap();
    assert_eq!(write_bytes(&s.path("dir"), &[b"x"], Piece::End).unwrap_err().code, "conflict");
    std::fs::write(s.host("file"), b"x").unwrap();
    assert_eq!(write_bytes(&s.path("file/below"), &[b"x"], Piece::End).unwrap_err().code, "conflict");
}

#[test]
fn archives_round_trip_byte_exact() {
    let src = Scratch::new();
    std::fs::create_dir_all(src.host("deep/er")).unwrap();
    let blob: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(src.host("deep/er/blob.bin"), &blob).unwrap();
    std::fs::write(src.host("empty"), b"").unwrap();
    let long = "n".repeat(150);
    std::fs::write(src.host(&format!("deep/{long}")), b"long name").unwrap();
    std::fs::set_permissions(src.host("empty"), std::fs::Permissions::from_mode(0o750)).unwrap();
    symlink("er/blob.bin", src.host("deep/link")).unwrap();
    std::fs::hard_link(src.host("empty"), src.host("hard")).unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        src.host("pipe").as_path(),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o640),
        0,
    )
    .unwrap();

    let mut tar_bytes = Vec::new();
    archive_out(&src.path(""), &mut tar_bytes).unwrap();
    let dst = Scratch::new();
    let (entries, bytes) = archive_in(&dst.path("into/here"), &tar_bytes[..]).unwrap();
    assert!(entries >= 7, "{entries}");
    assert_eq!(bytes, blob.len() as u64 + 9);
    let at = |p: &str| dst.host(&format!("into/here/{p}"));
    assert_eq!(std::fs::read(at("deep/er/blob.bin")).unwrap(), blob);
    assert_eq!(std::fs::read(at(&format!("deep/{long}"))).unwrap(), b"long name");
    assert_eq!(std::fs::read_link(at("deep/link")).unwrap(), PathBuf::from("er/blob.bin"));
    assert_eq!(std::fs::metadata(at("empty")).unwrap().permissions().mode() & 0o777, 0o750);
    // A FIFO comes back a FIFO (a snapshot of a workspace holding one restores whole).
    let pipe = std::fs::symlink_metadata(at("pipe")).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&pipe.file_type()), "{pipe:?}");
    assert_eq!(pipe.permissions().mode() & 0o777, 0o640);
    let src_mtime = std::fs::metadata(src.host("deep/er/blob.bin")).unwrap().mtime();
    assert_eq!(std::fs::metadata(at("deep/er/blob.bin")).unwrap().mtime(), src_mtime);
    // A tar of a file is refused: not a directory.
    assert_eq!(archive_out(&src.path("empty"), Vec::new()).unwrap_err().code, "conflict");
}

fn tar_with(path: &str, link: Option<(&str, tar::EntryType)>) -> Vec<u8> {
    // Headers written by hand: tar's builder refuses `..` itself.
    let mut h = tar::Header::new_gnu();
    {
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..path.len()].copy_from_slice(path.as_bytes());
    }
    h.set_mode(0o644);
    match link {
        Some((target, kind)) => {
            h.set_entry_type(kind);
            h.set_size(0);
            h.as_gnu_mut().unwrap().linkname[..target.len()].copy_from_slice(target.as_bytes());
        }
        None => {
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(3);
        }
    }
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    if link.is_none() {
        let mut block = vec![0u8; 512];
        block[..3].copy_from_slice(b"bad");
        out.extend(block);
    }
    out.extend(vec![0u8; 1024]);
    out
}

#[test]
fn hostile_archives_are_refused() {
    let s = Scratch::new();
    for (path, link) in [
        ("../escape", None),
        ("/tmp/escape", None),
        ("a/../../escape", None),
        ("evil", Some(("../../../../etc/passwd", tar::EntryType::Link))),
    ] {
        let err = archive_in(&s.path("in"), &tar_with(path, link)[..]).unwrap_err();
        assert_eq!(err.code, "invalid", "{path}: {err:?}");
    }
    assert!(!std::path::Path::new("/tmp/escape").exists());
    // A symlink in the archive is kept as a link, but a file written through it later
    // would lead out, and is refused.
    let archive = tar_with("out", Some(("/etc", tar::EntryType::Symlink)));
    archive_in(&s.path("in"), &archive[..]).unwrap();
    let archive = tar_with("out/passwd", None);
    let err = archive_in(&s.path("in"), &archive[..]).unwrap_err();
    assert_eq!(err.code, "invalid", "{err:?}");
    // Positive control: a plain entry is unpacked.
    archive_in(&s.path("in"), &tar_with("ok", None)[..]).unwrap();
    assert_eq!(std::fs::read(s.host("in/ok")).unwrap(), b"bad");
}
