//! Places per sandbox on this replica: a cap on how much of one kind of work (file
//! operations, preview connections) one sandbox holds here at once, so that what a sandbox
//! (or whoever uses it) costs this replica is bounded by that cap and never reaches what
//! the other sandboxes need. The places are counted per replica because the cost they bound
//! (memory, descriptors, connections) is the replica's own; a place is taken after
//! authorisation, so nobody but those who may use the sandbox can take its places.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use domain::SandboxId;

/// The places of each sandbox in use on this replica, for one kind of work. Share it
/// (`Arc`).
#[derive(Debug, Default)]
pub struct SandboxPlaces {
    held: Mutex<HashMap<SandboxId, u32>>,
}

impl SandboxPlaces {
    fn lock(&self) -> MutexGuard<'_, HashMap<SandboxId, u32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place of `sandbox`, which may hold at most `limit` at once; `None` when it holds
    /// `limit` already.
    pub fn take(self: &Arc<Self>, sandbox: &SandboxId, limit: u32) -> Option<Place> {
        let mut held = self.lock();
        let count = held.entry(sandbox.clone()).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                held.remove(sandbox);
            }
            return None;
        }
        *count += 1;
        Some(Place { places: self.clone(), sandbox: sandbox.clone() })
    }

    /// How many places `sandbox` holds on this replica.
    pub fn held(&self, sandbox: &SandboxId) -> u32 {
        self.lock().get(sandbox).copied().unwrap_or(0)
    }

    /// How many sandboxes hold a place (none is kept for a sandbox that holds none).
    pub fn sandboxes(&self) -> usize {
        self.lock().len()
    }
}

/// One place; dropping it gives it back.
#[derive(Debug)]
pub struct Place {
    places: Arc<SandboxPlaces>,
    sandbox: SandboxId,
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut held = self.places.lock();
        if let Some(count) = held.get_mut(&self.sandbox) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.sandbox);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> SandboxId {
        SandboxId::generate(1, n)
    }

    #[test]
    fn a_sandbox_holds_at_most_its_limit_and_a_dropped_place_comes_back() {
        let places = Arc::new(SandboxPlaces::default());
        let (a, b) = (id(1), id(2));
        let first = places.take(&a, 2).expect("a first place");
        let second = places.take(&a, 2).expect("a second place");
        assert!(places.take(&a, 2).is_none(), "a third is past the limit");
        assert!(places.take(&b, 2).is_some(), "another sandbox's places are its own");
        assert_eq!(places.held(&a), 2);
        drop(first);
        assert_eq!(places.held(&a), 1);
        let third = places.take(&a, 2).expect("the place given back is taken again");
        drop((second, third));
        assert_eq!(places.held(&a), 0);
        assert_eq!(places.sandboxes(), 0, "nothing is kept for a sandbox that holds nothing");
    }

    #[test]
    fn a_limit_of_zero_takes_nothing_and_keeps_nothing() {
        let places = Arc::new(SandboxPlaces::default());
        assert!(places.take(&id(3), 0).is_none());
        assert_eq!(places.sandboxes(), 0);
    }
}
