//! Paths inside a sandbox, as the files and archive operations name them, and what a
//! directory listing reports.
//!
//! A path is confined to the sandbox's two writable trees, `/workspace` and `/tmp`: an
//! absolute path names one of them (or a path beneath), a relative path is taken against
//! `/workspace` (the commands' working directory). A `..` component is refused here,
//! before anything reaches a sandbox; symlinks and mounts are the supervisor's to resolve,
//! inside the sandbox, beneath the root this path names (`adapters::supervisor`), so no
//! link leads out either.

use std::fmt;

use crate::split::WORKSPACE_PATH;

/// The sandbox's temporary tree.
pub const TMP_PATH: &str = "/tmp";

/// The longest path accepted, in characters (at most 4 bytes each, so always within the
/// kernel's 4096-byte limit).
pub const MAX_PATH_CHARS: usize = 1024;

/// The longest name (one component of a path) accepted, in characters. The kernel's own
/// limit is 255 bytes: a name of many multi-byte characters can still be refused there.
pub const MAX_NAME_CHARS: usize = 255;

/// The path rule as a regular expression for schemas that describe the API: `/workspace`
/// or `/tmp`, alone or followed by `/` and names, or a relative path of names; names are
/// separated by one or more `/`, hold no NUL, are at most [`MAX_NAME_CHARS`] characters,
/// and none is `..`.
pub const PATH_PATTERN: &str = concat!(
    "^(?:/(?:workspace|tmp)(?:/+(?:[^/\\x00.][^/\\x00]{0,254}|\\.[^/\\x00.][^/\\x00]{0,253}|\\.\\.[^/\\x00]{1,253}|\\.))*/*",
    "|(?:[^/\\x00.][^/\\x00]{0,254}|\\.[^/\\x00.][^/\\x00]{0,253}|\\.\\.[^/\\x00]{1,253}|\\.)",
    "(?:/+(?:[^/\\x00.][^/\\x00]{0,254}|\\.[^/\\x00.][^/\\x00]{0,253}|\\.\\.[^/\\x00]{1,253}|\\.))*/*)$"
);

/// The tree a path lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Root {
    /// `/workspace`: the sandbox's workspace (durable or ephemeral by the caller's class).
    Workspace,
    /// `/tmp`: the sandbox's private temporary files.
    Tmp,
}

impl Root {
    /// The root's absolute path inside the sandbox.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Workspace => WORKSPACE_PATH,
            Self::Tmp => TMP_PATH,
        }
    }

    /// The root named by an absolute path (`/workspace`, `/tmp`).
    pub fn parse(path: &str) -> Option<Self> {
        [Self::Workspace, Self::Tmp].into_iter().find(|r| r.as_str() == path)
    }
}

/// A validated path inside a sandbox: a [`Root`] and the names beneath it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SandboxPath {
    root: Root,
    /// The names beneath the root joined by single `/`; empty for the root itself.
    relative: String,
}

/// Why a path was refused. Each variant names the input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// No path was given.
    #[error("path must not be empty")]
    Empty,
    /// The path is longer than [`MAX_PATH_CHARS`].
    #[error("path is {0} characters long; at most {MAX_PATH_CHARS} are allowed")]
    TooLong(usize),
    /// The path holds a NUL byte.
    #[error("path {0:?} contains a NUL byte")]
    Nul(String),
    /// An absolute path outside the two trees.
    #[error("path {0:?} is outside /workspace and /tmp, the only places the files API reaches")]
    OutsideRoots(String),
    /// A `..` component.
    #[error("path {0:?} contains `..`; name the place directly")]
    DotDot(String),
    /// A name longer than [`MAX_NAME_CHARS`].
    #[error("path {0:?} has a name longer than {MAX_NAME_CHARS} characters")]
    NameTooLong(String),
}

impl SandboxPath {
    /// A path, validated (see the module's rules). Repeated `/` and `.` components are
    /// dropped.
    ///
    /// # Errors
    /// [`PathError`] naming what is wrong.
    pub fn parse(text: &str) -> Result<Self, PathError> {
        if text.is_empty() {
            return Err(PathError::Empty);
        }
        let chars = text.chars().count();
        if chars > MAX_PATH_CHARS {
            return Err(PathError::TooLong(chars));
        }
        if text.contains('\0') {
            return Err(PathError::Nul(text.to_owned()));
        }
        let (root, rest) = if let Some(after) = text.strip_prefix('/') {
            let (first, rest) = after.split_once('/').unwrap_or((after, ""));
            let root =
                Root::parse(&format!("/{first}")).ok_or_else(|| PathError::OutsideRoots(text.to_owned()))?;
            (root, rest)
        } else {
            (Root::Workspace, text)
        };
        let mut names = Vec::new();
        for name in rest.split('/') {
            match name {
                "" | "." => {}
                ".." => return Err(PathError::DotDot(text.to_owned())),
                other if other.chars().count() > MAX_NAME_CHARS => {
                    return Err(PathError::NameTooLong(text.to_owned()));
                }
                other => names.push(other),
            }
        }
        Ok(Self { root, relative: names.join("/") })
    }

    /// The tree the path lies in.
    pub fn root(&self) -> Root {
        self.root
    }

    /// The names beneath the root joined by `/` (no leading `/`); empty for the root.
    pub fn relative(&self) -> &str {
        &self.relative
    }

    /// Whether the path is the root itself (`/workspace`, `/tmp`).
    pub fn is_root(&self) -> bool {
        self.relative.is_empty()
    }

    /// The last name, if the path is not a root.
    pub fn file_name(&self) -> Option<&str> {
        if self.is_root() { None } else { self.relative.rsplit('/').next() }
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str(self.root.as_str())
        } else {
            write!(f, "{}/{}", self.root.as_str(), self.relative)
        }
    }
}

/// What a directory entry is (symlinks are reported, not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// Anything else (a FIFO, a socket, a device).
    Other,
}

impl EntryKind {
    /// `file`, `directory`, `symlink`, `other`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::File => "file",
            Self::Directory => "directory",
            Self::Symlink => "symlink",
            Self::Other => "other",
        }
    }

    /// The kind named `name` (as [`EntryKind::as_str`]).
    pub fn parse(name: &str) -> Option<Self> {
        [Self::File, Self::Directory, Self::Symlink, Self::Other].into_iter().find(|k| k.as_str() == name)
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    /// The entry's name (invalid UTF-8 replaced).
    pub name: String,
    /// What it is.
    pub kind: EntryKind,
    /// Its size in bytes (of the link itself for a symlink).
    pub size: u64,
}

#[cfg(test)]
mod tests;
