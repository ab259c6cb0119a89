//! Credentials minted FOR the caller, and their verification.

use async_trait::async_trait;

use crate::Cause;
use domain::{IdentityId, MintRequest, OrgId, SandboxId, SandboxToken, Timestamp, TokenId};

/// A freshly minted credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintedCredential {
    /// The compact JWS (redacted in `Debug`).
    pub token: SandboxToken,
    /// Its `jti`.
    pub token_id: TokenId,
    /// Its `iat`.
    pub issued_at: Timestamp,
    /// Its `exp`.
    pub expires_at: Timestamp,
}

/// Why a credential could not be minted or revoked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MintError {
    /// No usable signing key (missing, unreadable or corrupt key file, no crypto provider).
    #[error("signing key unavailable: {0}")]
    KeyUnavailable(#[source] Cause),
    /// The revocation state could not be written.
    #[error("revocation could not be recorded: {0}")]
    Revocation(#[source] Cause),
}

/// Mints credentials for sandbox callers.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait CredentialMinter: Send + Sync {
    /// Mints a token whose subject is the request's caller identity id and whose claims
    /// are exactly the request's sandbox facts. MUST return a unique `jti` per call.
    ///
    /// # Errors
    /// [`MintError::KeyUnavailable`] when no signing key can be used.
    async fn mint(&self, request: &MintRequest) -> Result<MintedCredential, MintError>;

    /// Revokes every token minted for `sandbox`: from when this returns `Ok`, none of them
    /// verifies, on any replica, even before its `exp`. Idempotent.
    ///
    /// # Errors
    /// [`MintError::Revocation`] when the revocation could not be recorded durably.
    async fn revoke(&self, sandbox: &SandboxId) -> Result<(), MintError>;
}

/// The verified claims of a sandbox token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenClaims {
    /// Issuer.
    pub iss: String,
    /// Audience (exactly one).
    pub aud: String,
    /// The caller the token was minted for.
    pub sub: IdentityId,
    /// The org.
    pub org_id: OrgId,
    /// The session, empty for a workflow sandbox.
    pub session_id: String,
    /// The execution.
    pub execution_id: String,
    /// The sandbox.
    pub sandbox_id: SandboxId,
    /// Issued at (seconds since the epoch).
    pub iat: i64,
    /// Not before.
    pub nbf: i64,
    /// Expiry.
    pub exp: i64,
    /// Token id.
    pub jti: TokenId,
}

/// Why a token did not verify. The message never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// Malformed, badly signed, wrong algorithm/type/issuer/audience, expired, not yet
    /// valid, or with unexpected headers or claims.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// Well-formed and signed, but its sandbox was deprovisioned, replaced or revoked.
    #[error("token revoked: sandbox {0} is no longer live")]
    Revoked(SandboxId),
    /// Well-formed and signed, but the caller it was minted for has been revoked.
    #[error("token revoked: caller {0} was revoked")]
    CallerRevoked(IdentityId),
    /// The revocation state could not be read; the token MUST be treated as inactive.
    #[error("revocation state unavailable: {0}")]
    Unavailable(#[source] Cause),
}

/// Verifies sandbox tokens (signature, header, claims, revocation) and publishes the keys.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait CredentialVerifier: Send + Sync {
    /// MUST return the claims exactly when the token is valid now, its sandbox's tokens
    /// are not revoked, and the caller it was minted for (`sub`) is not revoked.
    ///
    /// # Errors
    /// [`VerifyError`] saying why not; never containing the token.
    async fn verify(&self, token: &SandboxToken) -> Result<TokenClaims, VerifyError>;

    /// The JWKS document (RFC 7517) of every key that verifies, as JSON text.
    fn jwks_json(&self) -> String;
}
