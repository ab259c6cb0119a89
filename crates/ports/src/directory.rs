//! The caller directory: API keys to caller identities.

use async_trait::async_trait;

use crate::Cause;
use domain::{CallerIdentity, CallerKey, IdentityId, Timestamp};

/// A caller as listed (never with its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallerEntry {
    /// The caller.
    pub identity: CallerIdentity,
    /// When it was added.
    pub created_at: Timestamp,
    /// When its key was revoked, if it was.
    pub revoked_at: Option<Timestamp>,
}

/// Why a directory call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DirectoryError {
    /// An `internal` caller cannot be added.
    #[error("caller class \"internal\" is reserved for the server's own calls")]
    InternalRefused,
    /// A caller with this id already exists.
    #[error("caller {0} already exists")]
    Exists(IdentityId),
    /// No caller with this id.
    #[error("caller {0} not found")]
    NotFound(IdentityId),
    /// The store failed.
    #[error("caller store: {0}")]
    Store(#[source] Cause),
}

/// Authenticates caller keys and manages callers. Keys are shown once, stored only as
/// hashes, and compared in constant time.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait CallerDirectory: Send + Sync {
    /// MUST return the caller whose unrevoked key this is, or `None` for any other key.
    /// Never returns an `internal` caller.
    ///
    /// # Errors
    /// [`DirectoryError::Store`].
    async fn authenticate(&self, key: &CallerKey) -> Result<Option<CallerIdentity>, DirectoryError>;

    /// Adds a `user` or `service` caller and returns its new key (the only time it is
    /// ever available).
    ///
    /// # Errors
    /// [`DirectoryError::InternalRefused`], [`DirectoryError::Exists`],
    /// [`DirectoryError::Store`].
    async fn add(&self, caller: &CallerIdentity, now: Timestamp) -> Result<CallerKey, DirectoryError>;

    /// Whether `caller` is a revoked caller. Identities the directory never issued a key
    /// for (the server's own) are not revoked. Tokens minted for a revoked caller MUST
    /// NOT verify, and are not refreshed.
    ///
    /// # Errors
    /// [`DirectoryError::Store`].
    async fn is_revoked(&self, caller: &IdentityId) -> Result<bool, DirectoryError>;

    /// Revokes the caller's key; it authenticates no more.
    ///
    /// # Errors
    /// [`DirectoryError::NotFound`], [`DirectoryError::Store`].
    async fn revoke(&self, caller: &IdentityId, now: Timestamp) -> Result<(), DirectoryError>;

    /// Every caller, oldest first.
    ///
    /// # Errors
    /// [`DirectoryError::Store`].
    async fn list(&self) -> Result<Vec<CallerEntry>, DirectoryError>;
}
