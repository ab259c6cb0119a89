//! Terminal tickets in the store: short-lived, single-use credentials that attach one
//! caller to one terminal (a browser cannot set headers on a WebSocket). The store keeps
//! only a ticket's SHA-256, so every replica can take it and none can show it.

use async_trait::async_trait;
use domain::{CallerClass, IdentityId, OrgId, SandboxId, TerminalId, Timestamp};

use crate::Cause;

/// What a ticket grants: one caller, one terminal, until it expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketGrant {
    /// The org of the sandbox.
    pub org: OrgId,
    /// The sandbox.
    pub sandbox: SandboxId,
    /// The terminal.
    pub terminal: TerminalId,
    /// The caller who asked for it.
    pub identity: IdentityId,
    /// That caller's class.
    pub class: CallerClass,
    /// When it stops being good.
    pub expires_at: Timestamp,
}

/// Why a ticket store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketStoreError {
    /// The store failed.
    #[error("terminal ticket store: {0}")]
    Store(#[source] Cause),
}

/// The terminal tickets of every org.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait TerminalTickets: Send + Sync {
    /// Records a ticket by its SHA-256 `digest` (and forgets tickets expired by `now`).
    ///
    /// # Errors
    /// [`TicketStoreError::Store`].
    async fn insert(
        &self,
        digest: [u8; 32],
        grant: &TicketGrant,
        now: Timestamp,
    ) -> Result<(), TicketStoreError>;

    /// Takes the ticket of `digest`: it is gone from the store on every replica
    /// afterwards, whatever the answer. Returns its grant when it existed and had not
    /// expired at `now`. Of callers taking the same ticket at once, at most one gets it.
    ///
    /// # Errors
    /// [`TicketStoreError::Store`].
    async fn take(&self, digest: [u8; 32], now: Timestamp) -> Result<Option<TicketGrant>, TicketStoreError>;
}
