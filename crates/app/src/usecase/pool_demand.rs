//! Which orgs are adopting warm sandboxes on this replica right now, so that the pool pass
//! stands aside while they do.
//!
//! A refill provision is the work of a cold ensure (a workspace image, a bubblewrap start,
//! the supervisor's start). Run beside a burst of adoptions it takes CPU the adoptions
//! need, on the host that serves them. So the pool pass does not refill an org that
//! adopted a warm sandbox here within the last [`ADOPTING`] while its pool still holds a
//! ready one: the burst drains the pool at full speed, and the refill starts once the org
//! is quiet. An empty pool is refilled at once whatever the demand (its org's ensures
//! provision cold meanwhile, and a refill is then what helps them). Per replica: what
//! competes for a host's CPU is that host's own work.

use std::collections::HashMap;
use std::sync::Mutex;

use domain::{OrgId, Timestamp};

/// How long after an adoption an org counts as adopting.
pub const ADOPTING_MS: i64 = 100;

/// When each org last adopted a warm sandbox on this replica. Share it (`Arc`).
#[derive(Debug, Default)]
pub struct PoolDemand {
    last: Mutex<HashMap<OrgId, Timestamp>>,
}

impl PoolDemand {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<OrgId, Timestamp>> {
        self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Notes an adoption in `org` at `at`.
    pub fn adopted(&self, org: &OrgId, at: Timestamp) {
        self.lock().insert(org.clone(), at);
    }

    /// Whether `org` adopted within [`ADOPTING_MS`] before `now`. Forgets the orgs that
    /// have been quiet longer.
    pub fn adopting(&self, org: &OrgId, now: Timestamp) -> bool {
        let mut last = self.lock();
        last.retain(|_, at| at.plus_millis(ADOPTING_MS) > now);
        last.contains_key(org)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_org_is_adopting_for_a_while_after_its_last_adoption_and_alone() {
        let demand = PoolDemand::default();
        let (acme, beta) = (OrgId::parse("acme").unwrap(), OrgId::parse("beta").unwrap());
        let t = Timestamp::from_unix_millis(1_000_000);
        assert!(!demand.adopting(&acme, t));
        demand.adopted(&acme, t);
        assert!(demand.adopting(&acme, t));
        assert!(demand.adopting(&acme, t.plus_millis(ADOPTING_MS - 1)));
        assert!(!demand.adopting(&beta, t), "another org is not");
        assert!(!demand.adopting(&acme, t.plus_millis(ADOPTING_MS)), "quiet since");
        assert!(demand.lock().is_empty(), "quiet orgs are forgotten");
    }
}
