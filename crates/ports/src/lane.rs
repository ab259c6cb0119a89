//! The gate: whether sandboxes are provisioned at all, for an org and a key kind.

use async_trait::async_trait;
use domain::{OrgId, SandboxKind};

/// Whether the lane is on for an org and a key kind. Off means every ensure is a no-op:
/// nothing is minted, claimed, provisioned or audited.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait SandboxLane: Send + Sync {
    /// MUST return `true` exactly when sandboxes of `kind` are provisioned for `org`.
    /// Infallible: an implementation that cannot decide MUST answer `false` (off) and log.
    async fn enabled(&self, org: &OrgId, kind: SandboxKind) -> bool;
}

/// A lane that is on or off everywhere, from configuration.
#[derive(Debug, Clone, Copy)]
pub struct StaticLane(pub bool);

#[async_trait]
impl SandboxLane for StaticLane {
    async fn enabled(&self, _org: &OrgId, _kind: SandboxKind) -> bool {
        self.0
    }
}
