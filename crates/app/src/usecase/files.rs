//! Files and archives in a sandbox: read (a file's bytes, or a directory's entries),
//! write (whole or not at all), delete, and tar archives into and out of a directory.
//! For service callers of the org, the user who owns the sandbox's key, and the sandbox's
//! own token ([`domain::Operation::Files`]). Paths are [`SandboxPath`]s, resolved by the
//! driver inside the sandbox. Sizes are held to [`super::StreamLimits`]: an upload over
//! its cap is refused before a byte is read when it says its length, and abandoned (nothing
//! kept) the moment it passes the cap otherwise. Every operation passes the gate of
//! [`super::streams`] (a suspended sandbox is resumed; the sandbox is active while the
//! operation, or the download it started, goes on); none takes a place in the command
//! quotas (no program runs). Writes land in the workspace, so its quota holds for them: a
//! write or an archive past it fails with [`DriverError::ResourceExhausted`] (the disk is
//! full) and keeps nothing of the file that did not fit (an archive's entries unpacked
//! before it stay, as for any archive that fails part-way).
//!
//! # What a sandbox's files cost the server
//! Every transfer is streamed (the server holds one chunk, or one batch of a directory's
//! entries, at a time), and each operation, for as long as it or the download or listing
//! it started goes on, takes one of the sandbox's places on this replica
//! ([`LaneDeps::file_ops`], at most [`StreamLimits::max_file_ops_per_sandbox`](super::StreamLimits)):
//! one more is refused with [`OperationError::FilesBusy`] before the driver is asked. So
//! what a sandbox's file operations cost a replica is bounded by that cap, whatever the
//! size of its directories and files ([`super::places`] says how the places are counted).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use domain::{Actor, DirEntry, Operation, OrgId, SandboxId, SandboxPath};
use ports::{ByteSource, ByteStream, DriverError, EntryStream, ReadOutcome, Unpacked};

use super::LaneDeps;
use super::places::Place;
use super::sandbox::Admission;
use super::streams::{Capped, CappedStream, Counted, OperationError, driver, gated, gated_with};

/// A download or a listing that holds its file operation's place and the sandbox's
/// activity until it ends, fails or is dropped.
struct Placed<S: ?Sized> {
    inner: Box<S>,
    held: Option<(Admission, Place)>,
}

#[async_trait]
impl ByteStream for Placed<dyn ByteStream> {
    async fn next(&mut self) -> Result<Option<Vec<u8>>, DriverError> {
        let next = self.inner.next().await;
        if matches!(next, Ok(None) | Err(_)) {
            self.held = None;
        }
        next
    }
}

#[async_trait]
impl EntryStream for Placed<dyn EntryStream> {
    async fn next(&mut self) -> Result<Option<Vec<DirEntry>>, DriverError> {
        let next = self.inner.next().await;
        if matches!(next, Ok(None) | Err(_)) {
            self.held = None;
        }
        next
    }
}

/// A place for a file operation of `sandbox_id` (see the module's doc).
fn place(deps: &LaneDeps, sandbox_id: &SandboxId) -> Result<Place, OperationError> {
    let limit = deps.streams.max_file_ops_per_sandbox;
    deps.file_ops
        .take(sandbox_id, limit)
        .ok_or_else(|| OperationError::FilesBusy { sandbox_id: sandbox_id.clone(), limit })
}

/// Reads the file at `path` (its size and bytes, streamed) or lists the directory there
/// (its entries, streamed); either holds a file operation's place until it is read.
///
/// # Errors
/// [`OperationError`]; [`OperationError::TooLarge`] for a file over the cap;
/// [`OperationError::FilesBusy`].
pub async fn read_path(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    path: &SandboxPath,
) -> Result<ReadOutcome, OperationError> {
    let limit = deps.streams.max_file_bytes;
    // The sandbox stays active, and the place taken, while the file's bytes or the
    // directory's entries are read.
    let call = |admission| async move {
        let place = place(deps, sandbox_id)?;
        match driver(deps.driver.read_path(sandbox_id, path).await)? {
            ReadOutcome::File { size, .. } if size > limit => {
                Err(OperationError::TooLarge { what: format!("{path} ({size} bytes)"), limit })
            }
            ReadOutcome::File { size, contents } => Ok(ReadOutcome::File {
                size,
                contents: Box::new(Placed { inner: contents, held: Some((admission, place)) }),
            }),
            ReadOutcome::Directory(entries) => Ok(ReadOutcome::Directory(Box::new(Placed {
                inner: entries,
                held: Some((admission, place)),
            }))),
        }
    };
    gated_with(deps, actor, Operation::Files, "read_path", org, sandbox_id, false, call).await
}

/// Writes the file at `path` from `contents` (parents created, owned by the sandbox's
/// user, replacing a file there whole). `declared` is the length the caller announced,
/// if any. Returns the bytes written.
///
/// # Errors
/// [`OperationError`]; [`OperationError::TooLarge`] over the cap (nothing is written).
pub async fn write_file(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    path: &SandboxPath,
    contents: Box<dyn ByteSource>,
    declared: Option<u64>,
) -> Result<u64, OperationError> {
    let limit = deps.streams.max_file_bytes;
    let call = async {
        if let Some(len) = declared.filter(|len| *len > limit) {
            return Err(OperationError::TooLarge { what: format!("a file of {len} bytes"), limit });
        }
        let _place = place(deps, sandbox_id)?;
        let (capped, over) = Capped::new(contents, limit);
        match deps.driver.write_file(sandbox_id, path, Box::new(capped)).await {
            Err(DriverError::Source(_)) if over.load(Ordering::SeqCst) => {
                Err(OperationError::TooLarge { what: format!("the file for {path}"), limit })
            }
            other => driver(other),
        }
    };
    gated(deps, actor, Operation::Files, "write_file", org, sandbox_id, call).await
}

/// Deletes the file, link or (empty, or with `recursive` any) directory at `path`.
///
/// # Errors
/// [`OperationError`].
pub async fn delete_path(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    path: &SandboxPath,
    recursive: bool,
) -> Result<(), OperationError> {
    let call = async {
        let _place = place(deps, sandbox_id)?;
        driver(deps.driver.delete_path(sandbox_id, path, recursive).await)
    };
    gated(deps, actor, Operation::Files, "delete_path", org, sandbox_id, call).await
}

/// A tar archive of the directory at `path`, streamed as it is made; past the archive cap
/// the stream fails with [`DriverError::TooLarge`].
///
/// # Errors
/// [`OperationError`].
pub async fn archive_out(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    path: &SandboxPath,
) -> Result<Box<dyn ByteStream>, OperationError> {
    let limit = deps.streams.max_archive_bytes;
    // The sandbox stays active while the archive is read.
    let call = |admission| async move {
        let place = place(deps, sandbox_id)?;
        let inner = driver(deps.driver.archive_out(sandbox_id, path).await)?;
        let capped: Box<dyn ByteStream> = Box::new(CappedStream { inner, left: limit, limit });
        Ok(Box::new(Placed { inner: capped, held: Some((admission, place)) }) as Box<dyn ByteStream>)
    };
    gated_with(deps, actor, Operation::Files, "archive_out", org, sandbox_id, false, call).await
}

/// Unpacks the tar archive `archive` into the directory at `path` (created when missing).
/// `declared` is the length the caller announced, if any.
///
/// # Errors
/// [`OperationError`]; [`OperationError::TooLarge`] over the cap.
pub async fn archive_in(
    deps: &LaneDeps,
    actor: &Actor,
    org: &OrgId,
    sandbox_id: &SandboxId,
    path: &SandboxPath,
    archive: Box<dyn ByteSource>,
    declared: Option<u64>,
) -> Result<Unpacked, OperationError> {
    let limit = deps.streams.max_archive_bytes;
    let call = async {
        let empty =
            || OperationError::Invalid("the archive is empty: send a tar archive as the body".to_owned());
        if let Some(len) = declared.filter(|len| *len > limit) {
            return Err(OperationError::TooLarge { what: format!("an archive of {len} bytes"), limit });
        }
        if declared == Some(0) {
            return Err(empty());
        }
        let _place = place(deps, sandbox_id)?;
        let any = Arc::new(AtomicBool::new(false));
        let (capped, over) = Capped::new(Box::new(Counted { inner: archive, any: any.clone() }), limit);
        match deps.driver.archive_in(sandbox_id, path, Box::new(capped)).await {
            Err(DriverError::Source(_)) if over.load(Ordering::SeqCst) => {
                Err(OperationError::TooLarge { what: format!("the archive for {path}"), limit })
            }
            // Nothing came (a chunked body with no bytes): nothing was unpacked either.
            Ok(_) if !any.load(Ordering::SeqCst) => Err(empty()),
            other => driver(other),
        }
    };
    gated(deps, actor, Operation::Files, "archive_in", org, sandbox_id, call).await
}

#[cfg(test)]
mod tests;
