//! The Ed25519 JWT credential minter and verifier (issue 3).
//!
//! Tokens are compact JWS with the header `{"typ":"sbx+jwt","alg":"EdDSA","kid":…}` (the
//! `kid` is the key's RFC 7638 thumbprint) and exactly the claims `iss`, `aud`, `sub`,
//! `org_id`, `session_id`, `execution_id`, `sandbox_id`, `iat`, `nbf`, `exp`, `jti`.
//!
//! - [`KeyStore`]: the signing keys, generated on first start into the data dir (mode
//!   0600), rotated with an overlap, published as a JWKS document.
//! - [`JwtMinter`]: implements both [`ports::CredentialMinter`] and
//!   [`ports::CredentialVerifier`], plus [`JwtMinter::verify_for`] and
//!   [`JwtMinter::introspect`] (RFC 7662).
//! - [`assert_crypto_provider`]: the start-up check that jsonwebtoken has exactly one
//!   crypto backend installed (with none or both it would panic on first use).
//!
//! Revocation is the sandbox's own record: a token verifies only while
//! [`SandboxRegistry::get`](ports::SandboxRegistry::get) returns a record of the token's
//! org whose [`tokens_active`](domain::SandboxRecord::tokens_active) holds, so it survives
//! restarts and holds across replicas sharing the registry.
//!
//! Composition (the app's one root), and `sandlane keys rotate`:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use adapters::jwt::{JwtConfig, JwtError, JwtMinter, KeyStore};
//! use ports::{CallerDirectory, Clock, SandboxRegistry, SystemClock};
//!
//! fn build(
//!     data_dir: &std::path::Path,
//!     registry: Arc<dyn SandboxRegistry>,
//!     callers: Arc<dyn CallerDirectory>,
//! ) -> Result<Arc<JwtMinter>, JwtError> {
//!     let clock: Arc<dyn Clock> = Arc::new(SystemClock);
//!     let keys = Arc::new(KeyStore::load_or_create(data_dir, clock.clone())?);
//!     // Serve both ports from the one value: `Arc<dyn CredentialMinter>` and
//!     // `Arc<dyn CredentialVerifier>` are clones of this `Arc`.
//!     Ok(Arc::new(JwtMinter::new(JwtConfig::default(), keys, registry, callers, clock)?))
//! }
//!
//! fn rotate(data_dir: &std::path::Path) -> Result<String, JwtError> {
//!     let keys = KeyStore::load_or_create(data_dir, Arc::new(SystemClock))?;
//!     // A running server picks the new key up with `KeyStore::reload`.
//!     Ok(keys.rotate()?)
//! }
//! ```

mod claims;
mod keys;
mod minter;

#[cfg(test)]
mod tests;

use jsonwebtoken::crypto::CryptoProvider;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey};

pub use keys::{KEYS_FILE, KeyError, KeyStore};
pub use minter::JwtMinter;

/// The `typ` header of every sandbox token.
pub const TOKEN_TYPE: &str = "sbx+jwt";
/// The default token lifetime, in seconds.
pub const DEFAULT_TTL_SECS: u64 = 900;
/// The longest token lifetime the configuration accepts, in seconds.
pub const MAX_TTL_SECS: u64 = 3600;
/// The clock-skew leeway applied to `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: u64 = 30;
/// How long a retired key keeps verifying: the longest TTL plus the leeway, in seconds.
pub const KEY_OVERLAP_SECS: u64 = MAX_TTL_SECS + LEEWAY_SECS;
/// The longest compact token the verifier reads, in bytes (minted tokens are ~500).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// The minter's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JwtConfig {
    /// The `iss` claim minted and required (default `sandlane`).
    pub issuer: String,
    /// The one `aud` value minted and required (default `sandlane-sandbox`).
    pub audience: String,
    /// Token lifetime in seconds (default 900, at most 3600). The verifier also refuses
    /// any token whose `exp − iat` exceeds it.
    pub ttl_secs: u64,
}

impl Default for JwtConfig {
    fn default() -> Self {
        Self {
            issuer: "sandlane".to_owned(),
            audience: "sandlane-sandbox".to_owned(),
            ttl_secs: DEFAULT_TTL_SECS,
        }
    }
}

impl JwtConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// [`JwtError::InvalidConfig`] naming the bad setting: `ttl_secs` outside
    /// `1..=3600`, or an empty `issuer` / `audience`.
    pub fn validate(&self) -> Result<(), JwtError> {
        if self.ttl_secs == 0 || self.ttl_secs > MAX_TTL_SECS {
            return Err(JwtError::InvalidConfig {
                setting: "ttl_secs",
                reason: format!("token lifetime {} s is outside 1..={MAX_TTL_SECS} s", self.ttl_secs),
            });
        }
        if self.issuer.is_empty() {
            return Err(JwtError::InvalidConfig {
                setting: "issuer",
                reason: "must not be empty".to_owned(),
            });
        }
        if self.audience.is_empty() {
            return Err(JwtError::InvalidConfig {
                setting: "audience",
                reason: "must not be empty".to_owned(),
            });
        }
        Ok(())
    }
}

/// Why the minter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    /// A setting is out of range.
    #[error("invalid token setting {setting}: {reason}")]
    InvalidConfig {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// jsonwebtoken has no usable crypto provider (no backend feature, or both).
    #[error("jsonwebtoken crypto provider unavailable: {0}")]
    CryptoProvider(String),
    /// The signing keys could not be loaded, created or written.
    #[error(transparent)]
    Key(#[from] KeyError),
}

/// A fixed, public probe seed: the start-up round trip needs no entropy and no secret.
const PROBE_SEED: [u8; 32] = [0x5a; 32];

/// Checks that jsonwebtoken has a process crypto provider (exactly one backend compiled
/// in) and that an EdDSA sign + verify round trip works through it. Called by
/// [`JwtMinter::new`]; the binary may call it first thing at start-up.
///
/// # Errors
/// [`JwtError::CryptoProvider`] instead of the panic jsonwebtoken would raise on first use.
pub fn assert_crypto_provider() -> Result<(), JwtError> {
    if CryptoProvider::try_get_default().is_none() {
        return Err(JwtError::CryptoProvider(
            "no process default; enable exactly one of the rust_crypto and aws_lc_rs features".to_owned(),
        ));
    }
    let der = keys::pkcs8_der(&PROBE_SEED);
    let encoding = EncodingKey::from_ed_der(&der);
    let public = ed25519_dalek::SigningKey::from_bytes(&PROBE_SEED).verifying_key();
    let decoding = DecodingKey::from_ed_der(public.as_bytes());
    let message = b"sandlane crypto provider probe";
    let signature = jsonwebtoken::crypto::sign(message, &encoding, Algorithm::EdDSA)
        .map_err(|e| JwtError::CryptoProvider(format!("EdDSA sign failed: {e}")))?;
    let ok = jsonwebtoken::crypto::verify(&signature, message, &decoding, Algorithm::EdDSA)
        .map_err(|e| JwtError::CryptoProvider(format!("EdDSA verify failed: {e}")))?;
    let forged_ok = jsonwebtoken::crypto::verify(&signature, b"other", &decoding, Algorithm::EdDSA)
        .map_err(|e| JwtError::CryptoProvider(format!("EdDSA verify failed: {e}")))?;
    if !ok || forged_ok {
        return Err(JwtError::CryptoProvider("EdDSA round trip gave a wrong answer".to_owned()));
    }
    Ok(())
}
