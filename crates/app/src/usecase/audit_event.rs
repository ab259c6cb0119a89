//! Building the one audit event each use case writes.

use domain::{
    AuditAction, AuditEvent, AuditOutcome, Durability, SandboxCaller, SandboxId, SandboxKey, Timestamp,
    TokenId,
};

/// The parts of an audit event that vary per call; the rest comes from the call's context.
pub(crate) struct EventContext<'a> {
    pub action: AuditAction,
    pub key: &'a SandboxKey,
    pub caller: &'a SandboxCaller,
    pub driver: &'a str,
}

impl EventContext<'_> {
    /// The event for `outcome`.
    pub(crate) fn event(
        &self,
        outcome: AuditOutcome,
        sandbox_id: Option<&SandboxId>,
        durability: Option<Durability>,
        token_id: Option<&TokenId>,
        message: impl Into<String>,
        at: Timestamp,
    ) -> AuditEvent {
        AuditEvent {
            action: self.action,
            key: self.key.clone(),
            sandbox_id: sandbox_id.cloned(),
            caller_id: self.caller.identity_id().clone(),
            caller_class: self.caller.class(),
            durability,
            driver: self.driver.to_owned(),
            outcome,
            message: message.into(),
            token_id: token_id.cloned(),
            at,
        }
    }
}
