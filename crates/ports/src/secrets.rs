//! Brokered secrets in the store: per org, a binding and a value sealed at rest. Values go
//! in ([`SecretStore::put`]) and come out only towards the egress gate
//! ([`SecretStore::for_host`]); every other call sees bindings alone.

use async_trait::async_trait;
use domain::broker::{SecretBinding, SecretName};
use domain::{IdentityId, OrgId, SecretValue, Timestamp};

use crate::Cause;

/// A secret as listed: its binding and dates, never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretEntry {
    /// The binding.
    pub binding: SecretBinding,
    /// When it was first set.
    pub created_at: Timestamp,
    /// When it was last set.
    pub updated_at: Timestamp,
}

/// Which existing secret a write may replace or remove.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretGuard {
    /// Any (a service caller of the org, the operator).
    Any,
    /// Only one scoped to this identity (a user caller: its own secrets).
    Identity(IdentityId),
}

/// How many secrets a put may leave (see [`SecretStore::put`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SecretLimits {
    /// In the org, all scopes together.
    pub per_org: u32,
    /// Scoped to one identity, in the org.
    pub per_identity: u32,
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// There was no secret of that name: made.
    Created,
    /// The secret of that name was replaced.
    Replaced,
    /// A secret of that name exists that the guard does not let this write replace:
    /// nothing was written.
    Taken,
    /// A new name in an org that holds [`SecretLimits::per_org`] secrets: nothing was
    /// written.
    OrgFull,
    /// The identity the binding is scoped to would hold more than
    /// [`SecretLimits::per_identity`] secrets: nothing was written.
    IdentityFull,
}

/// Why a secret store call failed. Never holds a value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretStoreError {
    /// The store failed, or its sealing key is missing or cannot open a value.
    #[error("secret store: {0}")]
    Store(#[source] Cause),
}

/// An org's brokered secrets, values sealed at rest under a key kept outside the database.
#[cfg_attr(any(test, feature = "mocks"), mockall::automock)]
#[async_trait]
pub trait SecretStore: Send + Sync {
    /// Makes or replaces the secret `binding.name` of `org` with `value`, if `guard`
    /// allows replacing the one there and the org and the identity the binding is scoped
    /// to stay within `limits`, atomically: neither a concurrent write to the same name nor
    /// concurrent puts of new names can slip past either check.
    ///
    /// # Errors
    /// [`SecretStoreError::Store`].
    async fn put(
        &self,
        org: &OrgId,
        binding: &SecretBinding,
        value: &SecretValue,
        guard: &SecretGuard,
        limits: SecretLimits,
        now: Timestamp,
    ) -> Result<PutOutcome, SecretStoreError>;

    /// The org's secrets, by name, without values.
    ///
    /// # Errors
    /// [`SecretStoreError::Store`].
    async fn list(&self, org: &OrgId) -> Result<Vec<SecretEntry>, SecretStoreError>;

    /// Deletes the secret `name` of `org` if `guard` allows; `false` when there was none
    /// it allows.
    ///
    /// # Errors
    /// [`SecretStoreError::Store`].
    async fn delete(
        &self,
        org: &OrgId,
        name: &SecretName,
        guard: &SecretGuard,
    ) -> Result<bool, SecretStoreError>;

    /// Every secret of `org` whose hosts cover `host` (as `normalize_host` gives it) on
    /// `port` ([`SecretBinding::covers`]), with its value: the egress gate's read, on every
    /// connection (so a change holds at the next one, on every replica).
    ///
    /// # Errors
    /// [`SecretStoreError::Store`], also when a value cannot be opened.
    async fn for_host(
        &self,
        org: &OrgId,
        host: &str,
        port: u16,
    ) -> Result<Vec<(SecretBinding, SecretValue)>, SecretStoreError>;
}
