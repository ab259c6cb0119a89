//! The server's side of every sandbox's supervisor: the program `sandlane-supervisor`
//! (crate `supervisor`) that runs as PID 1 of every resident sandbox. Every driver runs
//! it (bubblewrap as the sandbox's init, the container driver as the container's init,
//! the Kubernetes driver as the pod's process) and reaches it through this module.
//!
//! - [`client`]: the protocol's client, and the mapping of its answers onto the driver
//!   port's errors and streams (shared by every driver).
//! - [`channel`]: one unix-socket connection to a supervisor, which receives a descriptor
//!   only with a reply that names one (`take`, `connect`) and refuses them everywhere else.
//! - [`closer`]: where every descriptor a sandbox handed over is closed, so that no
//!   close the sandbox can make wait (`SO_LINGER`) waits on a runtime thread.
//! - [`listener`]: the egress proxy's listening socket, opened by the server in a
//!   sandbox's network namespace (held by no process inside, so accepted on the runtime).
//! - [`taken`]: one egress connection (or one to a preview port) once handed over, read and
//!   written without trusting the flags or the options of a descriptor the sandbox may
//!   still hold.
//! - `ops`: the streams, processes, files and preview ports (`open_port`) side of the
//!   driver port, written once for every driver on top of [`client`].
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
//! sandbox's channel key (`supervisor::gate`); [`client`] speaks the same protocol over
//! any byte stream ([`client::Connect`]).

pub mod channel;
pub mod client;
pub mod closer;
pub mod listener;
pub(crate) mod ops;
pub mod taken;

#[cfg(test)]
mod egress_tests;
#[cfg(test)]
mod linger_tests;

/// The supervisor's program, `sandlane-supervisor`, as the server looks for it by
/// default: beside the running executable (`cargo build` puts both binaries in
/// `target/<profile>/`; a package installs them side by side).
pub fn beside_current_exe() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent().unwrap_or_else(|| std::path::Path::new(".")).join(supervisor::PROGRAM)
}

/// Where the supervisor's program is looked for by tests and benchmarks:
/// `$SANDLANE_SUPERVISOR_BIN`, else `target/<profile>/sandlane-supervisor` next to the
/// running executable's directory (a test or bench binary lives in `target/<profile>/deps`).
///
/// # Errors
/// A message saying how to build it.
pub fn locate_for_tests() -> Result<std::path::PathBuf, String> {
    if let Some(path) = std::env::var_os("SANDLANE_SUPERVISOR_BIN") {
        return Ok(path.into());
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the running executable: {e}"))?;
    let candidates = exe.ancestors().skip(1).take(3).map(|dir| dir.join(supervisor::PROGRAM));
    for candidate in candidates {
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(format!(
        "the supervisor binary `{}` was not found near {}: build it with `cargo build -p supervisor` (or set \
         SANDLANE_SUPERVISOR_BIN)",
        supervisor::PROGRAM,
        exe.display()
    ))
}
