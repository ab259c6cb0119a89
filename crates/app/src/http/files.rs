//! The files and archive routes: a file's raw bytes in and out (a directory read gives
//! its entries), deletes, and tar archives into and out of a directory, all streamed:
//! the server holds one chunk of a transfer at a time, never a whole file or archive.
//! Each parses, calls one use case ([`crate::usecase`]'s files) and maps.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::header::CONTENT_LENGTH;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use domain::files::{MAX_PATH_CHARS, PATH_PATTERN};
use domain::{DirEntry, SandboxPath};
use ports::{ByteStream, EntryStream, ReadOutcome};
use serde::{Deserialize, Serialize};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::{IntoParams, ToSchema};

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ErrorBody};
use super::ndjson::{BodySource, operation_error, streamed};
use super::processes::{RawBytes, ids};
use crate::usecase;

/// The schema of a path inside a sandbox: the domain's rule.
pub struct PathText;

impl utoipa::PartialSchema for PathText {
    fn schema() -> RefOr<Schema> {
        path_schema().into()
    }
}

impl ToSchema for PathText {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("SandboxPath")
    }
}

fn path_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(MAX_PATH_CHARS))
        .pattern(Some(PATH_PATTERN))
        .description(Some(
            "A path inside the sandbox: `/workspace` or `/tmp`, or a path beneath one, or a path relative to \
             `/workspace`; no `..` component. It is resolved inside the sandbox: a symlink or mount that leads \
             out of its root is refused (400), never followed. Each name is at most 255 bytes.",
        ))
        .examples(["/workspace/notes/todo.txt"])
        .into()
}

/// The path of a file or directory.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct PathQuery {
    /// The path.
    #[param(value_type = PathText)]
    pub path: String,
}

/// The path of a delete.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// The path.
    #[param(value_type = PathText)]
    pub path: String,
    /// Delete a directory with everything in it (default false: only an empty one).
    pub recursive: Option<bool>,
}

/// One directory entry.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct EntryBody {
    /// Its name (invalid UTF-8 replaced).
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    #[schema(schema_with = kind_schema)]
    #[serde(rename = "type")]
    pub kind: String,
    /// Its size in bytes (a symlink's own).
    pub size: u64,
}

fn kind_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(["file", "directory", "symlink", "other"]))
        .into()
}

/// A directory's entries (the route writes this JSON batch by batch, as they come).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DirectoryBody {
    /// Sorted by name; symlinks are listed, not followed.
    pub entries: Vec<EntryBody>,
}

impl From<DirEntry> for EntryBody {
    fn from(e: DirEntry) -> Self {
        Self { name: e.name, kind: e.kind.as_str().to_owned(), size: e.size }
    }
}

/// A directory's entries as the JSON of [`DirectoryBody`], written batch by batch as the
/// sandbox sends them: `{"entries":[`, each entry, `]}`. The server holds one batch, never
/// the listing, whatever the directory's size. The head (200) goes out with the first
/// batch; an error after it aborts the response (the client sees a broken transfer, never
/// a short listing as whole, as for a download).
fn entries_body(listing: Box<dyn EntryStream>) -> Body {
    enum State {
        Start(Box<dyn EntryStream>),
        Entries(Box<dyn EntryStream>),
        Done,
    }
    let chunks = futures_util::stream::unfold(State::Start(listing), |state| async move {
        let (mut listing, first) = match state {
            State::Start(listing) => (listing, true),
            State::Entries(listing) => (listing, false),
            State::Done => return None,
        };
        let mut out = if first { b"{\"entries\":[".to_vec() } else { Vec::new() };
        match listing.next().await {
            Ok(Some(batch)) => {
                for (i, entry) in batch.into_iter().enumerate() {
                    if !(first && i == 0) {
                        out.push(b',');
                    }
                    if let Err(e) = serde_json::to_writer(&mut out, &EntryBody::from(entry)) {
                        return Some((Err(std::io::Error::other(e)), State::Done));
                    }
                }
                Some((Ok(axum::body::Bytes::from(out)), State::Entries(listing)))
            }
            Ok(None) => {
                out.extend_from_slice(b"]}");
                Some((Ok(axum::body::Bytes::from(out)), State::Done))
            }
            Err(e) => {
                tracing::warn!(error = %e, "a directory listing broke off");
                Some((Err(std::io::Error::other(e.to_string())), State::Done))
            }
        }
    });
    Body::from_stream(chunks)
}

/// A file written.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileWrittenBody {
    /// Its path (absolute).
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
}

/// An archive unpacked.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct UnpackedBody {
    /// The directory (absolute).
    pub path: String,
    /// Entries written (files, directories, links).
    pub entries: u64,
    /// Bytes of file contents written.
    pub bytes: u64,
}

/// The schema of a tar archive.
pub struct TarArchive;

impl utoipa::PartialSchema for TarArchive {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(utoipa::openapi::KnownFormat::Binary)))
            .description(Some(
                "A tar archive (POSIX ustar, GNU or pax; not compressed): files, directories, symlinks and hard \
                 links, paths relative to the directory.",
            ))
            .into()
    }
}

impl ToSchema for TarArchive {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("TarArchive")
    }
}

fn sandbox_path(text: &str) -> Result<SandboxPath, ApiError> {
    SandboxPath::parse(text).map_err(|e| ApiError::invalid(e.to_string()))
}

fn declared(headers: &HeaderMap) -> Option<u64> {
    headers.get(CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok())
}

/// A byte stream as a response body; an error mid-way aborts the response (the client
/// sees a broken transfer, never a short one presented as whole).
fn bytes_body(stream: Box<dyn ByteStream>) -> Body {
    let chunks = futures_util::stream::unfold(Some(stream), |state| async move {
        let mut stream = state?;
        match stream.next().await {
            Ok(Some(bytes)) => Some((Ok(axum::body::Bytes::from(bytes)), Some(stream))),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "a download broke off");
                Some((Err(std::io::Error::other(e.to_string())), None))
            }
        }
    });
    Body::from_stream(chunks)
}

/// Read a file (its raw bytes) or list a directory (its entries as JSON).
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/files", tag = "files",
    params(super::dto::SandboxPath, PathQuery),
    responses(
        (status = 200, description = "a file's bytes (with its Content-Length), or a directory's entries", content(
            (RawBytes = "application/octet-stream"),
            (DirectoryBody = "application/json"),
        )),
        (status = 400, description = "an id in the path or the path breaks the rules; the path leads out of its root", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's files", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or nothing at the path", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready; the path is neither a file nor a directory (a FIFO, a socket), a parent is a file, or the sandbox user may not read it", body = ErrorBody),
        (status = 429, description = "resource_exhausted: the sandbox has `streams.max_file_ops_per_sandbox` file operations under way already; or resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
        (status = 413, description = "too_large: the file is over `streams.max_file_bytes`, or the directory has more entries than a listing holds", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn read_file(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let path = sandbox_path(&q.path)?;
    match usecase::read_path(&state.deps, &principal.0, &org, &sandbox_id, &path)
        .await
        .map_err(operation_error(&state, &org))?
    {
        ReadOutcome::File { size, contents } => {
            Ok(streamed("application/octet-stream", bytes_body(contents), Some(size)))
        }
        ReadOutcome::Directory(listing) => Ok(streamed("application/json", entries_body(listing), None)),
    }
}

/// Write a file from the raw body: missing parent directories are created, the file is
/// the sandbox user's, an existing file is replaced whole (keeping its mode). Nothing is
/// visible until the last byte has come; a body that breaks off, or passes the cap,
/// leaves nothing.
#[utoipa::path(
    put, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/files", tag = "files",
    params(super::dto::SandboxPath, PathQuery),
    request_body(content = Option<RawBytes>, content_type = "application/octet-stream", description = "the file's bytes (any content type; none: an empty file), at most `streams.max_file_bytes`"),
    responses(
        (status = 200, description = "written", body = FileWrittenBody),
        (status = 400, description = "an id in the path or the path breaks the rules; the path leads out of its root", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's files", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready; the path is a directory, or a parent is a file; the sandbox user may not write there", body = ErrorBody),
        (status = 413, description = "too_large: the body is over `streams.max_file_bytes` or the sandbox's file size limit; nothing was written", body = ErrorBody),
        (status = 429, description = "resource_exhausted: the sandbox has `streams.max_file_ops_per_sandbox` file operations under way already; the sandbox's disk is full (its workspace quota is used up), and nothing was written; or resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn write_file(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<FileWrittenBody>, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let path = sandbox_path(&q.path)?;
    let source = Box::new(BodySource(body.into_data_stream()));
    let size =
        usecase::write_file(&state.deps, &principal.0, &org, &sandbox_id, &path, source, declared(&headers))
            .await
            .map_err(operation_error(&state, &org))?;
    Ok(Json(FileWrittenBody { path: path.to_string(), size }))
}

/// Delete a file, a symlink (never what it points to), an empty directory, or with
/// `recursive=true` a directory and everything in it. `/workspace` and `/tmp` themselves
/// are never deleted.
#[utoipa::path(
    delete, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/files", tag = "files",
    params(super::dto::SandboxPath, DeleteQuery),
    responses(
        (status = 204, description = "deleted"),
        (status = 400, description = "an id in the path or the path breaks the rules; the path leads out of its root", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's files", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or nothing at the path", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready; the directory is not empty (without recursive); the path is `/workspace` or `/tmp`, which are never deleted", body = ErrorBody),
        (status = 429, description = "resource_exhausted: the sandbox has `streams.max_file_ops_per_sandbox` file operations under way already; or resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn delete_file(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Query(q): Query<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let path = sandbox_path(&q.path)?;
    let recursive = q.recursive.unwrap_or(false);
    usecase::delete_path(&state.deps, &principal.0, &org, &sandbox_id, &path, recursive)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(StatusCode::NO_CONTENT)
}

/// A tar archive of a directory, streamed as it is made: files, directories, symlinks as
/// links (never followed). A transfer that passes `streams.max_archive_bytes` is broken
/// off (the client sees an incomplete response, never a short archive as whole).
#[utoipa::path(
    get, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/archive", tag = "files",
    params(super::dto::SandboxPath, PathQuery),
    responses(
        (status = 200, description = "the archive (paths relative to the directory)", content_type = "application/x-tar", body = TarArchive),
        (status = 400, description = "an id in the path or the path breaks the rules; the path leads out of its root", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's files", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org, or nothing at the path", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready, or the path is not a directory", body = ErrorBody),
        (status = 429, description = "resource_exhausted: the sandbox has `streams.max_file_ops_per_sandbox` file operations under way already; or resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn read_archive(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Query(q): Query<PathQuery>,
) -> Result<Response, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let path = sandbox_path(&q.path)?;
    let stream = usecase::archive_out(&state.deps, &principal.0, &org, &sandbox_id, &path)
        .await
        .map_err(operation_error(&state, &org))?;
    Ok(streamed("application/x-tar", bytes_body(stream), None))
}

/// Unpack a tar archive (the raw body) into a directory, created when missing: entries
/// are the sandbox user's, each resolved inside the directory (an absolute name, `..`,
/// or a link that leads out is refused). Each file appears whole or not at all; entries
/// before a failure stay.
#[utoipa::path(
    put, path = "/v1/orgs/{org}/sandboxes/{sandbox_id}/archive", tag = "files",
    params(super::dto::SandboxPath, PathQuery),
    request_body(content = TarArchive, content_type = "application/x-tar", description = "the archive (any content type), at most `streams.max_archive_bytes`"),
    responses(
        (status = 200, description = "unpacked", body = UnpackedBody),
        (status = 400, description = "an id in the path or the path breaks the rules; the path or an entry leads out of its root; the archive is empty, malformed or holds a device", body = ErrorBody),
        (status = 403, description = "the caller may not use this sandbox's files", body = ErrorBody),
        (status = 404, description = "no such sandbox in this org", body = ErrorBody),
        (status = 409, description = "the sandbox is not ready; the path or a parent of an entry is a file; an entry meets a directory where a file is", body = ErrorBody),
        (status = 413, description = "too_large: the body is over `streams.max_archive_bytes`, or a file over the sandbox's file size limit", body = ErrorBody),
        (status = 429, description = "resource_exhausted: the sandbox has `streams.max_file_ops_per_sandbox` file operations under way already; the sandbox's disk is full (its workspace quota is used up), and the file that did not fit was not kept; or resuming the suspended sandbox would pass the org's quota of running sandboxes (max_sandboxes)", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn write_archive(
    State(state): State<Arc<AppState>>,
    principal: Principal,
    Path((org, sandbox_id)): Path<(String, String)>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<UnpackedBody>, ApiError> {
    let (org, sandbox_id) = ids(org, sandbox_id)?;
    let path = sandbox_path(&q.path)?;
    let source = Box::new(BodySource(body.into_data_stream()));
    let unpacked =
        usecase::archive_in(&state.deps, &principal.0, &org, &sandbox_id, &path, source, declared(&headers))
            .await
            .map_err(operation_error(&state, &org))?;
    Ok(Json(UnpackedBody { path: path.to_string(), entries: unpacked.entries, bytes: unpacked.bytes }))
}
