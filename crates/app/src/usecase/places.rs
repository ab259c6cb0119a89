//! Places on this replica, counted per holder: a cap on how much of one kind of work one
//! sandbox (file operations, preview connections) or one org (webhook attempts) holds here
//! at once, so that what one of them (or whoever uses it) costs this replica is bounded by
//! that cap and never reaches what the others need. The places are counted per replica
//! because the cost they bound (memory, descriptors, connections) is the replica's own; a
//! sandbox's place is taken after authorisation, so nobody but those who may use the
//! sandbox can take its places.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use domain::SandboxId;

/// The places each holder (`K`) has in use on this replica, for one kind of work. Share it
/// (`Arc`).
#[derive(Debug)]
pub struct Places<K> {
    held: Mutex<HashMap<K, u32>>,
}

/// The places of sandboxes.
pub type SandboxPlaces = Places<SandboxId>;

impl<K> Default for Places<K> {
    fn default() -> Self {
        Self { held: Mutex::new(HashMap::new()) }
    }
}

impl<K: Eq + Hash + Clone> Places<K> {
    fn lock(&self) -> MutexGuard<'_, HashMap<K, u32>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place of `holder`, which may hold at most `limit` at once; `None` when it holds
    /// `limit` already.
    pub fn take(self: &Arc<Self>, holder: &K, limit: u32) -> Option<Place<K>> {
        let mut held = self.lock();
        let count = held.entry(holder.clone()).or_insert(0);
        if *count >= limit {
            if *count == 0 {
                held.remove(holder);
            }
            return None;
        }
        *count += 1;
        Some(Place { places: self.clone(), holder: holder.clone() })
    }

    /// How many places `holder` has on this replica.
    pub fn held(&self, holder: &K) -> u32 {
        self.lock().get(holder).copied().unwrap_or(0)
    }

    /// How many places are taken, all holders.
    pub fn total(&self) -> u32 {
        self.lock().values().sum()
    }

    /// Every holder with a place, and how many it has.
    pub fn held_by_all(&self) -> Vec<(K, u32)> {
        self.lock().iter().map(|(k, n)| (k.clone(), *n)).collect()
    }

    /// How many holders have a place (none is kept for a holder that has none).
    pub fn holders(&self) -> usize {
        self.lock().len()
    }
}

/// One place; dropping it gives it back.
#[derive(Debug)]
pub struct Place<K: Eq + Hash + Clone = SandboxId> {
    places: Arc<Places<K>>,
    holder: K,
}

impl<K: Eq + Hash + Clone> Drop for Place<K> {
    fn drop(&mut self) {
        let mut held = self.places.lock();
        if let Some(count) = held.get_mut(&self.holder) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                held.remove(&self.holder);
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
        let of_b = places.take(&b, 2);
        assert!(of_b.is_some(), "another sandbox's places are its own");
        assert_eq!(places.held(&a), 2);
        drop(first);
        assert_eq!(places.held(&a), 1);
        let third = places.take(&a, 2).expect("the place given back is taken again");
        assert_eq!(places.total(), 3, "two of a, one of b");
        drop((second, third));
        assert_eq!(places.held(&a), 0);
        assert_eq!(places.holders(), 1, "nothing is kept for a sandbox that holds nothing");
    }

    #[test]
    fn a_limit_of_zero_takes_nothing_and_keeps_nothing() {
        let places = Arc::new(SandboxPlaces::default());
        assert!(places.take(&id(3), 0).is_none());
        assert_eq!(places.holders(), 0);
    }
}
