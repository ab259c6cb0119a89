//! sandlane's adapters: the real implementations of the ports.
//!
//! - [`jwt`]: the Ed25519 JWT credential minter and verifier.
//! - [`sql`]: the SQLite and Postgres stores (registry, audit log, caller directory).
//! - [`bwrap`]: the bubblewrap sandbox driver.
//! - [`container`]: the container sandbox driver (Docker Engine API; tested on podman).
//! - [`egress`]: the egress proxy the server runs for every sandbox, and the system resolver.
//! - [`kubernetes`]: the Kubernetes sandbox driver (a pod per sandbox; tested against a
//!   fake API server whose kubelet runs pods as bubblewrap sandboxes).
//! - [`supervisor_link`]: the server's side of every sandbox's supervisor (the program in
//!   `crates/supervisor`): the client of its protocol, the descriptors it hands over, and
//!   the streams, processes and files side of the driver port built on them.
//! - [`workspace_image`]: workspace quotas enforced by the kernel (loop-mounted ext4
//!   images), shared by the drivers.
//! - [`settings`]: what the drivers' settings share (each driver defines its own, and the
//!   app reads them as they are).

pub mod bwrap;
pub mod container;
pub mod datadir;
#[cfg(test)]
pub(crate) mod driver_contract;
pub mod egress;
pub mod jwt;
pub mod kubernetes;
pub mod settings;
pub mod snapshot_files;
pub mod sql;
pub mod supervisor_link;
pub mod watch;
pub mod webhook_sender;
pub mod workspace_image;
