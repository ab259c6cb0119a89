//! The sandbox supervisor: the small program (`sandlane-supervisor`) that runs as PID 1
//! inside every sandbox, and the wire protocol the server drives it with.
//!
//! Everything here faces a hostile sandbox, so it is its own crate with its own small
//! dependency tree: no database, HTTP server, Kubernetes or container client, JWT
//! library. The server's side of the protocol is `adapters::supervisor_link`; the two
//! share [`protocol`], [`gate`]'s channel key and [`vfork`].
//!
//! - [`protocol`]: versioned, length-delimited frames; JSON control messages, raw data.
//! - [`args`]: the program's command line.
//! - [`supervise()`]: the supervisor itself (module `supervise`); `launch`: how it starts a
//!   command (`clone(CLONE_VM | CLONE_VFORK)` and `execve`, not `fork`).
//! - [`processes`]: the background processes it keeps; [`pty`]: the pseudo-terminals of
//!   those started on one (terminals).
//! - [`fs`]: its file and archive operations, confined beneath `/workspace` and `/tmp`.
//! - [`egress`]: the loopback listener of the egress proxy, which it hands to the server
//!   or whose connections it relays to the server.
//! - `preview`: connections to the sandbox's own ports for preview URLs, handed to the
//!   server or relayed to it.
//! - [`gate`]: the loopback TCP listener behind a channel key, for pods (Kubernetes).
//! - [`seccomp`]: the syscall filter it installs on itself and so on every command.
//! - [`vfork`]: starting a program the way `posix_spawn` does, shared with the server
//!   (which starts each sandbox's bubblewrap with it).

pub mod args;
pub mod egress;
pub mod fs;
pub mod gate;
mod launch;
mod preview;
pub mod processes;
pub mod protocol;
pub mod pty;
pub mod seccomp;
mod supervise;
pub mod vfork;

pub use supervise::{FEATURES, SuperviseOptions, diagnose, supervise};

/// The supervisor program's file name, installed beside the `sandlane` binary.
pub const PROGRAM: &str = "sandlane-supervisor";
