//! The timestamped pod cache (the kubelet's `kubecontainer.Cache`). The PLEG is its only writer; pod
//! workers read it with `get_newer_than`, which waits until the cache has seen the runtime after the
//! worker's last sync, so a worker never acts on a status older than its own last action.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{PodStatus, PodUid};

#[derive(Clone)]
struct Entry {
    status: Arc<PodStatus>,
    modified: Instant,
}

#[derive(Default)]
struct State {
    pods: HashMap<PodUid, Entry>,
    /// When the runtime was last read for a pod it had nothing of, for pods read since the last
    /// full relist (older reads are covered by `global`).
    absent: HashMap<PodUid, Instant>,
    /// Every pod's entry is at least this fresh (set after each full relist).
    global: Option<Instant>,
}

/// Asks whoever writes the cache to read one pod again.
type Refresher = Box<dyn Fn(&PodUid) + Send + Sync>;

/// Pod statuses with the time the runtime was last read for them.
#[derive(Default)]
pub struct PodCache {
    state: Mutex<State>,
    changed: Notify,
    refresher: Option<Refresher>,
}

impl PodCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// A cache whose `get_newer_than` asks `refresher` to re-read a pod when its entry is too old,
    /// for writers that do not relist on their own soon (the PLEG in ebpf mode).
    pub fn with_refresher(refresher: impl Fn(&PodUid) + Send + Sync + 'static) -> Self {
        Self {
            refresher: Some(Box::new(refresher)),
            ..Self::default()
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores the status read from the runtime at `modified`.
    pub fn set(&self, status: PodStatus, modified: Instant) {
        let uid = status.uid.clone();
        let mut state = self.lock();
        state.absent.remove(&uid);
        state.pods.insert(
            uid,
            Entry {
                status: Arc::new(status),
                modified,
            },
        );
        drop(state);
        self.changed.notify_waiters();
    }

    /// Replaces a cached pod's status without making its entry fresher: what the agent learned
    /// besides the runtime (an exit the kernel reported) on top of the last read. A worker whose
    /// own last sync is newer than that read still waits for the next one, so it never acts on a
    /// status that misses what it just did. Does nothing for a pod not cached.
    pub fn amend(&self, status: PodStatus) {
        let mut state = self.lock();
        if let Some(entry) = state.pods.get_mut(&status.uid) {
            entry.status = Arc::new(status);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// The cached status of a pod, if the runtime has been read for it.
    pub fn get(&self, uid: &PodUid) -> Option<Arc<PodStatus>> {
        self.lock().pods.get(uid).map(|e| Arc::clone(&e.status))
    }

    /// Forgets a pod the runtime had nothing of when it was read at `read_at`: a worker waiting
    /// for a read newer than its last sync gets the pod's empty status from that read.
    pub fn delete(&self, uid: &PodUid, read_at: Instant) {
        let mut state = self.lock();
        state.pods.remove(uid);
        state.absent.insert(uid.clone(), read_at);
        drop(state);
        self.changed.notify_waiters();
    }

    /// Marks every entry as fresh as `time` (the start of a completed full relist).
    pub fn update_time(&self, time: Instant) {
        let mut state = self.lock();
        state.global = Some(time);
        state.absent.retain(|_, read_at| *read_at > time);
        drop(state);
        self.changed.notify_waiters();
    }

    fn newer_than(&self, uid: &PodUid, min: Option<Instant>) -> Option<Arc<PodStatus>> {
        let state = self.lock();
        let entry = state.pods.get(uid);
        let after_min = |t: Instant| min.is_none_or(|min| t > min);
        let fresh = entry.is_some_and(|e| after_min(e.modified))
            || state.absent.get(uid).copied().is_some_and(after_min)
            || state.global.is_some_and(after_min);
        fresh.then(|| {
            entry.map_or_else(
                || {
                    Arc::new(PodStatus {
                        uid: uid.clone(),
                        ..PodStatus::default()
                    })
                },
                |e| Arc::clone(&e.status),
            )
        })
    }

    /// The pod's status once the cache is newer than `min`: either the pod's own entry or the whole
    /// cache. A pod the runtime does not know yields an empty status. `None` accepts any entry, or
    /// waits for the first full relist when there is none.
    pub async fn get_newer_than(&self, uid: &PodUid, min: Option<Instant>) -> Arc<PodStatus> {
        let mut refresh_asked = false;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(status) = self.newer_than(uid, min) {
                return status;
            }
            if !refresh_asked && let Some(refresher) = &self.refresher {
                refresher(uid);
                refresh_asked = true;
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn status(uid: &str, name: &str) -> PodStatus {
        PodStatus {
            uid: PodUid::from(uid),
            name: name.to_owned(),
            ..PodStatus::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn get_newer_than_waits_for_a_fresh_entry() {
        let cache = Arc::new(PodCache::new());
        let before = Instant::now();
        cache.set(status("a", "old"), before);
        let waiter = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&PodUid::from("a"), Some(before)).await }
        });
        tokio::time::advance(Duration::from_millis(5)).await;
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "an entry as old as min must not satisfy the wait"
        );
        cache.set(status("a", "new"), Instant::now());
        let got = waiter.await.unwrap();
        assert_eq!(got.name, "new");
    }

    #[tokio::test(start_paused = true)]
    async fn an_amended_status_is_no_fresher_than_the_read_it_amends() {
        let cache = Arc::new(PodCache::new());
        let read = Instant::now();
        cache.set(status("a", "read"), read);
        tokio::time::advance(Duration::from_millis(5)).await;
        let synced = Instant::now();
        cache.amend(status("a", "amended"));
        cache.amend(status("unknown", "ignored"));
        assert!(cache.get(&PodUid::from("unknown")).is_none());
        let uid = PodUid::from("a");
        let early = cache.get_newer_than(&uid, Some(read - Duration::from_millis(1)));
        assert_eq!(
            early.await.name,
            "amended",
            "a worker that synced before the read"
        );
        let waiter = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&PodUid::from("a"), Some(synced)).await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "a worker that synced after the read waits for a new one"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.set(status("a", "reread"), Instant::now());
        assert_eq!(waiter.await.unwrap().name, "reread");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_entry_asks_the_refresher_once_and_a_fresh_one_never() {
        let (asked, mut requests) = tokio::sync::mpsc::unbounded_channel();
        let cache = Arc::new(PodCache::with_refresher(move |uid: &PodUid| {
            asked.send(uid.clone()).unwrap();
        }));
        let before = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.set(status("a", "fresh"), Instant::now());
        assert_eq!(
            cache
                .get_newer_than(&PodUid::from("a"), Some(before))
                .await
                .name,
            "fresh"
        );
        assert!(
            requests.try_recv().is_err(),
            "a fresh entry needs no refresh"
        );

        let after = Instant::now();
        let waiter = tokio::spawn({
            let cache = Arc::clone(&cache);
            async move { cache.get_newer_than(&PodUid::from("a"), Some(after)).await }
        });
        assert_eq!(requests.recv().await, Some(PodUid::from("a")));
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.update_time(before);
        tokio::task::yield_now().await;
        assert!(requests.try_recv().is_err(), "asked once per wait");
        cache.set(status("a", "refreshed"), Instant::now());
        assert_eq!(waiter.await.unwrap().name, "refreshed");
    }

    #[tokio::test(start_paused = true)]
    async fn global_time_satisfies_unknown_pods_with_an_empty_status() {
        let cache = PodCache::new();
        let min = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.update_time(Instant::now());
        let got = cache
            .get_newer_than(&PodUid::from("unknown"), Some(min))
            .await;
        assert_eq!(got.uid, PodUid::from("unknown"));
        assert!(got.containers.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_read_that_finds_nothing_of_the_pod_satisfies_a_waiting_worker() {
        let cache = Arc::new(PodCache::new());
        let uid = PodUid::from("never-started");
        let early_read = Instant::now();
        tokio::time::advance(Duration::from_millis(1)).await;
        let synced = Instant::now();
        cache.delete(&uid, early_read);
        let waiter = tokio::spawn({
            let (cache, uid) = (Arc::clone(&cache), uid.clone());
            async move { cache.get_newer_than(&uid, Some(synced)).await }
        });
        tokio::task::yield_now().await;
        assert!(
            !waiter.is_finished(),
            "a read from before the worker's sync does not satisfy it"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        cache.delete(&uid, Instant::now());
        let got = waiter.await.unwrap();
        assert_eq!(got.uid, uid);
        assert!(got.sandboxes.is_empty() && got.containers.is_empty());

        tokio::time::advance(Duration::from_millis(1)).await;
        cache.update_time(Instant::now());
        assert!(
            cache.lock().absent.is_empty(),
            "a later full relist covers the reads that found nothing"
        );
    }
}
