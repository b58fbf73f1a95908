//! A small expiring map for webhook answers (k8s.io/apiserver's `pkg/authentication/token/cache` and
//! the webhook authorizer's decision cache). Keys are SHA-256 digests, so a bearer token is never kept
//! in memory longer than the request that carried it. Expiry follows tokio time.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use sha2::{Digest as _, Sha256};
use tokio::time::Instant;

/// What the cache is keyed by: the SHA-256 of the token or of the review's spec.
pub(crate) type Key = [u8; 32];

pub(crate) fn key(bytes: &[u8]) -> Key {
    Sha256::digest(bytes).into()
}

/// Bounds memory when many distinct tokens or users hit the port; beyond it the entry closest to
/// expiry makes room.
const DEFAULT_CAPACITY: usize = 4096;

pub(crate) struct TtlCache<V> {
    entries: Mutex<HashMap<Key, (Instant, V)>>,
    capacity: usize,
}

impl<V: Clone> TtlCache<V> {
    pub(crate) fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    fn with_capacity(capacity: usize) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            capacity,
        }
    }

    pub(crate) fn get(&self, key: &Key) -> Option<V> {
        let mut entries = self.lock();
        match entries.get(key) {
            Some((expires, value)) if *expires > Instant::now() => Some(value.clone()),
            Some(_) => {
                entries.remove(key);
                None
            }
            None => None,
        }
    }

    /// Stores `value` for `ttl`; a zero TTL means "do not cache", as in the kubelet's config.
    pub(crate) fn insert(&self, key: Key, value: V, ttl: Duration) {
        if ttl.is_zero() {
            return;
        }
        let now = Instant::now();
        let mut entries = self.lock();
        if entries.len() >= self.capacity && !entries.contains_key(&key) {
            entries.retain(|_, (expires, _)| *expires > now);
            if entries.len() >= self.capacity {
                let soonest = entries
                    .iter()
                    .min_by_key(|(_, (expires, _))| *expires)
                    .map(|(key, _)| *key);
                if let Some(soonest) = soonest {
                    entries.remove(&soonest);
                }
            }
        }
        entries.insert(key, (now + ttl, value));
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, (Instant, V)>> {
        // The map stays consistent even if a holder panicked: every update is a single call.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn entries_expire_after_their_ttl() {
        let cache = TtlCache::new();
        cache.insert(key(b"a"), 1, Duration::from_secs(30));
        cache.insert(key(b"b"), 2, Duration::from_mins(5));
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(cache.get(&key(b"a")), Some(1));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(cache.get(&key(b"a")), None);
        assert_eq!(cache.get(&key(b"b")), Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn zero_ttl_is_not_cached() {
        let cache = TtlCache::new();
        cache.insert(key(b"a"), 1, Duration::ZERO);
        assert_eq!(cache.get(&key(b"a")), None);
    }

    #[tokio::test(start_paused = true)]
    async fn full_cache_drops_expired_then_soonest_entries() {
        let cache = TtlCache::with_capacity(2);
        cache.insert(key(b"short"), 1, Duration::from_secs(1));
        cache.insert(key(b"long"), 2, Duration::from_secs(100));
        cache.insert(key(b"new"), 3, Duration::from_secs(50));
        assert_eq!(cache.get(&key(b"short")), None);
        assert_eq!(cache.get(&key(b"long")), Some(2));
        assert_eq!(cache.get(&key(b"new")), Some(3));
    }
}
