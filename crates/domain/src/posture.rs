//! What a provisioning failure does: session ensures are non-critical, workflow ensures
//! critical. Either way the failure carries the same message prefix.

use crate::key::SandboxKind;

/// The prefix of every provisioning failure message a caller sees.
pub const SANDBOX_PROVISIONING_FAILED_PREFIX: &str = "Sandbox provisioning failed: ";

/// How an ensure treats a provisioning failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posture {
    /// The launch never fails, but the failure is logged, audited and reported.
    NonCritical,
    /// The ensure fails with Unavailable.
    Critical,
}

impl Posture {
    /// The posture of an ensure of `kind`: session non-critical, workflow critical.
    pub const fn for_kind(kind: SandboxKind) -> Self {
        match kind {
            SandboxKind::Session => Self::NonCritical,
            SandboxKind::Workflow => Self::Critical,
        }
    }
}

/// The message a caller sees for a provisioning failure with `cause`.
pub fn provisioning_failed_message(cause: &str) -> String {
    format!("{SANDBOX_PROVISIONING_FAILED_PREFIX}{cause}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postures_by_kind_and_prefix() {
        assert_eq!(Posture::for_kind(SandboxKind::Session), Posture::NonCritical);
        assert_eq!(Posture::for_kind(SandboxKind::Workflow), Posture::Critical);
        assert_eq!(
            provisioning_failed_message("bwrap missing"),
            "Sandbox provisioning failed: bwrap missing"
        );
    }
}
