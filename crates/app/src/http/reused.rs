//! A value reused for a while whoever asks: what a polled or open route reads at a cost
//! that must not grow with how often it is asked (`/readyz`'s driver check, an anonymous
//! `/metrics` scrape, the audit log's verdict). Concurrent callers of a stale value wait
//! for one computation; a failed computation is not kept.

use std::future::Future;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio::time::Instant;

/// A value computed at most once per `TTL_MS` milliseconds (by default; [`Reused::new`]
/// takes another time).
#[derive(Debug)]
pub struct Reused<T, const TTL_MS: u64> {
    ttl: Duration,
    slot: Mutex<Option<(Instant, T)>>,
}

impl<T: Clone, const TTL_MS: u64> Reused<T, TTL_MS> {
    /// How long a value is reused by default.
    pub const TTL: Duration = Duration::from_millis(TTL_MS);

    /// A value reused for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self { ttl, slot: Mutex::new(None) }
    }

    /// The value while it is fresh, else `make`'s (kept when it is `Ok`).
    ///
    /// # Errors
    /// `make`'s.
    pub async fn try_get<E, F, Fut>(&self, make: F) -> Result<T, E>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let mut slot = self.slot.lock().await;
        if let Some((at, value)) = slot.as_ref()
            && at.elapsed() < self.ttl
        {
            return Ok(value.clone());
        }
        let value = make().await?;
        *slot = Some((Instant::now(), value.clone()));
        Ok(value)
    }

    /// The value while it is fresh, else `make`'s.
    pub async fn get<F, Fut>(&self, make: F) -> T
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let made = self.try_get(|| async { Ok::<_, std::convert::Infallible>(make().await) }).await;
        match made {
            Ok(value) => value,
            Err(never) => match never {},
        }
    }
}

impl<T: Clone, const TTL_MS: u64> Default for Reused<T, TTL_MS> {
    fn default() -> Self {
        Self::new(Self::TTL)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Calls within the TTL reuse one value, concurrent ones too; the first after it
    /// computes again; a failure is not kept.
    #[tokio::test(start_paused = true)]
    async fn one_computation_per_ttl_and_no_failure_kept() {
        type Cache = Reused<usize, 5_000>;
        let cache = Arc::new(Cache::default());
        let made = Arc::new(AtomicUsize::new(0));
        let call = |cache: Arc<Cache>, made: Arc<AtomicUsize>| async move {
            cache
                .get(|| async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    made.fetch_add(1, Ordering::SeqCst) + 1
                })
                .await
        };
        let both = tokio::join!(call(cache.clone(), made.clone()), call(cache.clone(), made.clone()));
        assert_eq!(both, (1, 1), "concurrent callers: one computation");
        tokio::time::sleep(Cache::TTL / 2).await;
        assert_eq!(call(cache.clone(), made.clone()).await, 1, "within the TTL: reused");
        tokio::time::sleep(Cache::TTL).await;
        let failed = cache.try_get(|| async { Err::<usize, &str>("down") }).await;
        assert_eq!(failed, Err("down"));
        assert_eq!(call(cache.clone(), made.clone()).await, 2, "after it, and after a failure: made again");
    }
}
