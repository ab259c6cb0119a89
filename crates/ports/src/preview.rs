//! Preview links in the store: one record per link, found by the SHA-256 of its token on
//! every preview request (so a revocation holds at once on every replica).

use async_trait::async_trait;
use domain::{OrgId, PreviewLink, PreviewLinkId, SandboxId, Timestamp};

use crate::Cause;

/// Why a preview link store call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreviewLinkStoreError {
    /// The store failed.
    #[error("preview link store: {0}")]
    Store(#[source] Cause),
}

/// The preview links of every org.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait PreviewLinkStore: Send + Sync {
    /// Records `link`.
    ///
    /// # Errors
    /// [`PreviewLinkStoreError::Store`].
    async fn insert(&self, link: &PreviewLink) -> Result<(), PreviewLinkStoreError>;

    /// The link whose token has this SHA-256 (revoked or expired ones too: the caller
    /// decides, [`PreviewLink::admits`]). Read from the store itself, never a cache.
    ///
    /// # Errors
    /// [`PreviewLinkStoreError::Store`].
    async fn by_token(&self, token_sha256: &[u8; 32]) -> Result<Option<PreviewLink>, PreviewLinkStoreError>;

    /// One link of `org`.
    ///
    /// # Errors
    /// [`PreviewLinkStoreError::Store`].
    async fn get(
        &self,
        org: &OrgId,
        id: &PreviewLinkId,
    ) -> Result<Option<PreviewLink>, PreviewLinkStoreError>;

    /// The links of `sandbox` in `org` (all ports when `port` is `None`), oldest first,
    /// revoked and expired ones included.
    ///
    /// # Errors
    /// [`PreviewLinkStoreError::Store`].
    async fn list(
        &self,
        org: &OrgId,
        sandbox: &SandboxId,
        port: Option<u16>,
    ) -> Result<Vec<PreviewLink>, PreviewLinkStoreError>;

    /// Marks the link revoked at `at`: `true` when this call revoked it, `false` when there
    /// is no such link or it was revoked already.
    ///
    /// # Errors
    /// [`PreviewLinkStoreError::Store`].
    async fn revoke(
        &self,
        org: &OrgId,
        id: &PreviewLinkId,
        at: Timestamp,
    ) -> Result<bool, PreviewLinkStoreError>;
}
