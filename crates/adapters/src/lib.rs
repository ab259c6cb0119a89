//! sandlane's adapters: the real implementations of the ports.
//!
//! - [`jwt`]: the Ed25519 JWT credential minter and verifier.
//! - [`sql`]: the SQLite and Postgres stores (registry, audit log, caller directory).
//! - [`bwrap`]: the bubblewrap sandbox driver.
//! - [`container`]: the container sandbox driver (Docker Engine API; tested on podman).
//! - [`egress`]: the egress proxy the server runs for every sandbox, and the system resolver.
//! - [`kubernetes`]: the Kubernetes sandbox driver (a pod per sandbox; tested against a
//!   fake API server whose kubelet runs pods as bubblewrap sandboxes).
//! - [`supervisor`]: the process inside every resident sandbox, and its protocol.
//! - [`workspace_image`]: workspace quotas enforced by the kernel (loop-mounted ext4
//!   images), shared by the drivers.

pub mod bwrap;
pub mod container;
pub mod datadir;
#[cfg(test)]
pub(crate) mod driver_contract;
pub mod egress;
pub mod jwt;
pub mod kubernetes;
pub mod sql;
pub mod supervisor;
mod vfork;
pub mod workspace_image;
