//! The sandbox supervisor: the small process that runs as PID 1 of every resident
//! sandbox (the `sandlane` binary's hidden `supervise` mode), and the protocol the server
//! drives it with. Both drivers use it: bubblewrap runs it as the sandbox's init, the
//! container driver as the container's init.
//!
//! - [`protocol`]: versioned, length-delimited frames; JSON control messages, raw data.
//! - [`inside`]: the supervisor itself ([`supervise`]); `launch`: how it starts a
//!   command (`clone(CLONE_VM | CLONE_VFORK)` and `execve`, not `fork`).
//! - [`client`]: the server's side, and the mapping of its answers onto the driver
//!   port's errors and streams (shared by every driver that runs the supervisor).
//! - [`gate`]: the loopback TCP listener behind a channel key, for pods (Kubernetes).
//! - [`processes`]: the background processes the supervisor keeps.
//! - [`fs`]: its file and archive operations, confined beneath `/workspace` and `/tmp`.
//! - [`egress`]: the loopback listener of the egress proxy, which it hands to the server
//!   or whose connections it relays to the server.
//! - [`listener`]: that listening socket once handed over to the server, accepted on by
//!   a thread of its own, since the sandbox may still hold it.
//! - [`taken`]: one such connection once handed over to the server, read and written
//!   without trusting the flags of a descriptor the sandbox may still hold.
//! - [`seccomp`]: the syscall filter the supervisor installs on itself and so on every
//!   command.
//!
//! # The channel
//! One unix-socket connection per operation. Only the server can reach it: under
//! bubblewrap the server creates the listening socket in the sandbox's root-only state
//! directory and hands the listening descriptor to the supervisor, so nothing inside can
//! name the socket; in a container the socket lives in a root-only host directory
//! bind-mounted into the container. Either way the supervisor also refuses any peer
//! inside its own pid namespace (`SO_PEERCRED`), and a restarted server finds every
//! sandbox again by connecting to the socket's path. In a Kubernetes pod the server is on
//! another machine: the supervisor listens on a loopback TCP port of the pod, reached
//! through the API server's port-forward, and admits only connections that open with the
//! sandbox's channel key ([`gate`]); [`client`] speaks the same protocol over any byte
//! stream ([`client::Connect`]).

pub mod client;
pub mod egress;
pub mod fs;
pub mod gate;
pub mod inside;
mod launch;
pub mod listener;
pub(crate) mod ops;
pub mod processes;
pub mod protocol;
pub mod seccomp;
pub mod taken;

pub use inside::{SuperviseOptions, supervise};

/// Where the supervisor's program is looked for by tests and benchmarks:
/// `$SANDLANE_SUPERVISOR_BIN`, else `target/<profile>/sandlane` next to the running
/// executable's directory (a test or bench binary lives in `target/<profile>/deps`).
///
/// # Errors
/// A message saying how to build it.
pub fn locate_for_tests() -> Result<std::path::PathBuf, String> {
    if let Some(path) = std::env::var_os("SANDLANE_SUPERVISOR_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
    let candidates = exe.ancestors().skip(1).take(3).map(|dir| dir.join("sandlane"));
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the supervisor binary `sandlane` was not found near {}: build it with `cargo build -p app --bin \
         sandlane` (or set SANDLANE_SUPERVISOR_BIN)",
        exe.display()
    ))
}
