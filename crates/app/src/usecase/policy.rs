//! Org policy, applied: the effective policy of an org (the config file's defaults with the
//! org's stored changes laid over them), read through a cache that every replica refreshes
//! within [`POLICY_TTL`], so a change made on any replica (`sandlane org set`) is obeyed by
//! every replica within a second, without a restart; the lane per org and key kind
//! ([`PolicyLane`], the [`SandboxLane`] the composition uses); reading an org's policy
//! ([`get_org_policy`], for its service callers); changing it ([`set_org_policy`], for the
//! operator's CLI).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use domain::{
    Actor, OrgId, OrgPolicy, PolicyError, PolicyField, PolicyPatch, SandboxKind, Timestamp,
    authorize_org_read,
};
use ports::{PolicyOverrides, PolicyStore, PolicyStoreError, SandboxLane};
use tracing::{error, warn};

use super::access::AccessError;

/// How long a replica uses an org's policy before it reads it again: a change is obeyed
/// everywhere within this (plus one read).
pub const POLICY_TTL: Duration = Duration::from_millis(500);

/// An org's policy as it applies now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectivePolicy {
    /// The org.
    pub org: OrgId,
    /// The policy: the defaults with the org's changes.
    pub policy: OrgPolicy,
    /// The version of the org's changes (0: never changed).
    pub version: i64,
    /// When they were last changed.
    pub updated_at: Option<Timestamp>,
    /// The fields the org changed (the others are the defaults).
    pub overridden: Vec<PolicyField>,
}

/// Why an org's policy could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyReadError {
    /// The store could not be read and no earlier answer is at hand.
    #[error("cannot read the policy of org {org}")]
    Store {
        /// The org.
        org: OrgId,
        /// The store's error.
        #[source]
        source: PolicyStoreError,
    },
    /// The stored changes no longer apply to the defaults (a default changed under them,
    /// or the row was edited by hand).
    #[error("the stored policy of org {org} is invalid")]
    Invalid {
        /// The org.
        org: OrgId,
        /// Why.
        #[source]
        source: PolicyError,
    },
}

struct Cached {
    read_at: Instant,
    policy: Arc<EffectivePolicy>,
}

/// The effective policies, cached per org for [`POLICY_TTL`]. Reading a fresh entry costs
/// no query; a stale one is read again (concurrent readers may each read: a read is one
/// primary-key lookup). When the store cannot be read, the last answer keeps applying
/// (logged), so a database blip does not flip every org to the defaults.
pub struct Policies {
    store: Arc<dyn PolicyStore>,
    defaults: OrgPolicy,
    ttl: Duration,
    cache: Mutex<HashMap<OrgId, Cached>>,
}

impl std::fmt::Debug for Policies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policies")
            .field("defaults", &self.defaults)
            .field("ttl", &self.ttl)
            .finish_non_exhaustive()
    }
}

impl Policies {
    /// Policies over `store`, with `defaults` for every field an org never set.
    pub fn new(store: Arc<dyn PolicyStore>, defaults: OrgPolicy) -> Self {
        Self::with_ttl(store, defaults, POLICY_TTL)
    }

    /// As [`Policies::new`], re-reading an org after `ttl`.
    pub fn with_ttl(store: Arc<dyn PolicyStore>, defaults: OrgPolicy, ttl: Duration) -> Self {
        Self { store, defaults, ttl, cache: Mutex::new(HashMap::new()) }
    }

    /// The defaults.
    pub fn defaults(&self) -> &OrgPolicy {
        &self.defaults
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn PolicyStore> {
        &self.store
    }

    /// The effective policy of `org`.
    ///
    /// # Errors
    /// [`PolicyReadError`] when it cannot be read and no earlier answer is cached.
    pub async fn of(&self, org: &OrgId) -> Result<Arc<EffectivePolicy>, PolicyReadError> {
        let cached = {
            let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            cache.get(org).map(|c| (c.read_at.elapsed() < self.ttl, c.policy.clone()))
        };
        match cached {
            Some((true, policy)) => Ok(policy),
            stale => match self.read(org).await {
                Ok(policy) => Ok(policy),
                Err(e) => match stale {
                    Some((_, policy)) => {
                        warn!(org = %org, error = %super::chain(&e), "using the last policy read");
                        Ok(policy)
                    }
                    None => Err(e),
                },
            },
        }
    }

    /// Reads `org`'s policy from the store (and caches it).
    async fn read(&self, org: &OrgId) -> Result<Arc<EffectivePolicy>, PolicyReadError> {
        let overrides = self
            .store
            .overrides(org)
            .await
            .map_err(|source| PolicyReadError::Store { org: org.clone(), source })?;
        let policy = Arc::new(self.effective(org, overrides.as_ref())?);
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cache.insert(org.clone(), Cached { read_at: Instant::now(), policy: policy.clone() });
        Ok(policy)
    }

    /// The defaults with `overrides` laid over them.
    ///
    /// # Errors
    /// [`PolicyReadError::Invalid`].
    pub fn effective(
        &self,
        org: &OrgId,
        overrides: Option<&PolicyOverrides>,
    ) -> Result<EffectivePolicy, PolicyReadError> {
        let Some(o) = overrides else {
            return Ok(EffectivePolicy {
                org: org.clone(),
                policy: self.defaults.clone(),
                version: 0,
                updated_at: None,
                overridden: Vec::new(),
            });
        };
        let policy = self
            .defaults
            .apply(&o.patch)
            .map_err(|source| PolicyReadError::Invalid { org: org.clone(), source })?;
        Ok(EffectivePolicy {
            org: org.clone(),
            policy,
            version: o.version,
            updated_at: Some(o.updated_at),
            overridden: o.patch.fields(),
        })
    }

    /// Forgets what is cached of `org` (after this replica changed it).
    pub fn forget(&self, org: &OrgId) {
        self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(org);
    }
}

/// The lane per org and key kind: on when the server's lane is on (`lane_enabled`) and the
/// org's policy has the kind's lane on.
pub struct PolicyLane {
    /// The server-wide switch.
    pub enabled: bool,
    /// The policies.
    pub policies: Arc<Policies>,
}

#[async_trait]
impl SandboxLane for PolicyLane {
    async fn enabled(&self, org: &OrgId, kind: SandboxKind) -> bool {
        if !self.enabled {
            return false;
        }
        match self.policies.of(org).await {
            Ok(p) => p.policy.lane(kind),
            Err(e) => {
                // The port's contract: undecided is off, and never silent.
                error!(org = %org, kind = %kind, error = %super::chain(&e), "lane off: the org's policy cannot be read");
                false
            }
        }
    }
}

/// Why a policy read through the API failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GetPolicyError {
    /// The actor may not read it.
    #[error(transparent)]
    Access(#[from] AccessError),
    /// It could not be read.
    #[error(transparent)]
    Read(#[from] PolicyReadError),
}

/// The effective policy of `org`, for the org's service callers (and the server).
///
/// # Errors
/// [`GetPolicyError::Access`] for anyone else; [`GetPolicyError::Read`].
pub async fn get_org_policy(
    policies: &Policies,
    actor: &Actor,
    org: &OrgId,
) -> Result<Arc<EffectivePolicy>, GetPolicyError> {
    authorize_org_read(actor, org, "policy").map_err(AccessError::Denied)?;
    Ok(policies.of(org).await?)
}

/// Why a policy change failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetPolicyError {
    /// A value is out of bounds (nothing was written).
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    /// The store failed.
    #[error("cannot change the policy of org {org}")]
    Store {
        /// The org.
        org: OrgId,
        /// The store's error.
        #[source]
        source: PolicyStoreError,
    },
    /// Other changes kept winning.
    #[error("the policy of org {0} kept changing under this change; try again")]
    Contended(OrgId),
    /// The stored changes are not valid over the defaults.
    #[error(transparent)]
    Stored(#[from] PolicyReadError),
}

/// Changes `org`'s policy: the fields `patch` names take its values (checked against the
/// defaults first: an out-of-bounds value writes nothing), the others keep theirs. Safe
/// against concurrent changes (compare-and-set on the version, retried). Every replica
/// obeys it within [`POLICY_TTL`].
///
/// # Errors
/// [`SetPolicyError`].
pub async fn set_org_policy(
    policies: &Policies,
    org: &OrgId,
    patch: &PolicyPatch,
    now: Timestamp,
) -> Result<EffectivePolicy, SetPolicyError> {
    let store_error = |source| SetPolicyError::Store { org: org.clone(), source };
    for _ in 0..8 {
        let current = policies.store.overrides(org).await.map_err(store_error)?;
        let base = current.as_ref().map(|c| c.patch.clone()).unwrap_or_default();
        let merged = base.merged(patch);
        policies.defaults.apply(&merged)?;
        let version = current.as_ref().map_or(0, |c| c.version);
        if let Some(written) =
            policies.store.replace(org, &merged, version, now).await.map_err(store_error)?
        {
            policies.forget(org);
            return Ok(policies.effective(org, Some(&written))?);
        }
    }
    Err(SetPolicyError::Contended(org.clone()))
}

/// The effective policy of `org` straight from the store (for `sandlane org show`).
///
/// # Errors
/// [`PolicyReadError`].
pub async fn show_org_policy(policies: &Policies, org: &OrgId) -> Result<EffectivePolicy, PolicyReadError> {
    policies.forget(org);
    policies.of(org).await.map(|p| (*p).clone())
}

#[cfg(test)]
mod tests;
