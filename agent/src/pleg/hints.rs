//! Hints: what a hint source (the eBPF ring-buffer reader) tells the PLEG. A hint makes the PLEG
//! re-read one pod from the runtime (a targeted relist), or, for `Resync`, everything; only a `Died`
//! hint whose process is the container's proven init also writes the pod cache (the kernel knows
//! that death first). Pod workers' refresh requests reach the PLEG on their own path
//! ([`Refreshes`]): the hint channel is bounded and the reader drops into it when it is full (a
//! resync covers kernel hints), but nothing would cover a dropped refresh, whose worker would wait
//! for the safety relist. Corresponds to nothing in the kubelet: upstream's Evented PLEG wrote the cache
//! from every runtime event, which is what this design avoids.

use std::collections::HashSet;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use tokio::sync::{Notify, mpsc};

use crate::container::{ContainerId, PodUid};

/// What the kernel saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HintKind {
    /// A container (or sandbox) cgroup was created under the pods' parent cgroup.
    CgroupCreated,
    /// A container (or sandbox) cgroup was removed.
    CgroupRemoved,
    /// First exec in a container cgroup: the container's process started.
    Started,
    /// The container's init task exited.
    Died,
    /// The OOM killer chose a task of the container.
    OomKilled,
}

/// One fact about one pod, with the kernel's monotonic timestamp (`CLOCK_MONOTONIC`, ns) so the
/// PLEG can measure kernel → event and kernel → status latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHint {
    pub pod: PodUid,
    pub kind: HintKind,
    /// The container (or sandbox) id when the cgroup path names it.
    pub container: Option<ContainerId>,
    /// The process (thread group) the kernel event is about, in the initial pid namespace; `None`
    /// for cgroup events.
    pub tgid: Option<u32>,
    /// For `Died`: the exit code (`status >> 8`) and the terminating signal (`status & 0x7f`).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub kernel_time_ns: u64,
}

/// What a hint source sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hint {
    Pod(PodHint),
    /// Events may have been lost (ring-buffer reservations failed, or the reader fell behind): the
    /// PLEG must relist everything now.
    Resync {
        reason: String,
    },
}

/// The PLEG's end of a hint source: the kernel's hints, the pod workers' refresh requests, and the
/// way to ask the source to look for lost events.
pub struct HintChannel {
    pub hints: PlegHints,
    /// How pod workers ask for a newer read of their pod; see [`RefreshRequester`].
    pub refresh: RefreshRequester,
    pub check: HintSourceCheck,
}

/// What the PLEG receives in ebpf mode: the hint source's channel, and the refresh requests, which
/// travel apart from it so a full hint channel cannot lose one.
pub struct PlegHints {
    pub kernel: mpsc::Receiver<Hint>,
    pub refreshes: Refreshes,
}

impl PlegHints {
    /// The PLEG's inputs over the hint source's receiver, with a new refresh path.
    pub fn new(kernel: mpsc::Receiver<Hint>) -> Self {
        Self {
            kernel,
            refreshes: Refreshes::default(),
        }
    }
}

#[derive(Debug, Default)]
struct RefreshState {
    pending: Mutex<HashSet<PodUid>>,
    notify: Notify,
}

/// The PLEG's end of the refresh requests: pods whose worker needs the pod's status read after its
/// own last sync (the cache only holds an older read, and in ebpf mode no relist may come for a
/// minute). A set of pending pods and a wake-up instead of a channel: a request never waits and is
/// never dropped, and requests for a pod already pending coalesce, so the set holds at most one
/// entry per pod.
#[derive(Debug, Default)]
pub struct Refreshes {
    state: Arc<RefreshState>,
}

impl Refreshes {
    /// A handle pod workers ask through. It does not keep the PLEG's end alive: requests made
    /// after the PLEG is gone are ignored.
    pub fn requester(&self) -> RefreshRequester {
        RefreshRequester {
            state: Arc::downgrade(&self.state),
        }
    }

    /// Takes every pending request, in uid order.
    pub fn take(&self) -> Vec<PodUid> {
        let mut pods: Vec<PodUid> = lock(&self.state.pending).drain().collect();
        pods.sort();
        pods
    }

    /// Waits until a request may be pending. A request made while nobody waits is remembered, so
    /// the next wait returns at once; [`Refreshes::take`] may then find nothing.
    pub async fn requested(&self) {
        self.state.notify.notified().await;
    }
}

/// Asks the PLEG for a newer read of a pod. Cloneable; never blocks, never drops a request.
#[derive(Clone, Debug)]
pub struct RefreshRequester {
    state: Weak<RefreshState>,
}

impl RefreshRequester {
    /// Asks for a targeted relist of `pod`; `false` when the PLEG is gone.
    pub fn request(&self, pod: &PodUid) -> bool {
        let Some(state) = self.state.upgrade() else {
            return false;
        };
        let newly = lock(&state.pending).insert(pod.clone());
        if newly {
            // notify_one keeps a permit when the PLEG is busy, so the request is not slept through.
            state.notify.notify_one();
        }
        true
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Asks a hint source to check now whether it lost events (the eBPF reader then reads the kernel's
/// drop counter and sends [`Hint::Resync`] if it grew). The PLEG asks at the start of every full
/// relist: with the source's own wake-ups on events, that covers an idle source without a timer.
/// Cloneable; clones reach the same source.
#[derive(Clone, Debug)]
pub struct HintSourceCheck {
    /// The source's eventfd: every write wakes it.
    wake: Arc<OwnedFd>,
}

impl HintSourceCheck {
    /// Requests go to the source blocked on `eventfd` (non-blocking, so a request never waits).
    pub fn new(eventfd: Arc<OwnedFd>) -> Self {
        Self { wake: eventfd }
    }

    /// Wakes the source to check; never blocks.
    pub fn request(&self) {
        match rustix::io::write(&*self.wake, &1_u64.to_ne_bytes()) {
            // The counter is full only when requests are already pending, which ask the same.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(error) => tracing::warn!(%error, "waking the hint source to check for lost events"),
        }
    }
}

impl HintChannel {
    /// A refresher for [`crate::container::PodCache::with_refresher`].
    pub fn refresher(&self) -> impl Fn(&PodUid) + Send + Sync + 'static {
        let refresh = self.refresh.clone();
        move |pod: &PodUid| {
            refresh.request(pod);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_coalesce_per_pod_and_come_out_in_uid_order() {
        let refreshes = Refreshes::default();
        let requester = refreshes.requester();
        for pod in ["b", "a", "b", "b"] {
            assert!(requester.request(&PodUid::from(pod)));
        }
        assert_eq!(refreshes.take(), vec![PodUid::from("a"), PodUid::from("b")]);
        assert!(refreshes.take().is_empty());
    }

    #[tokio::test]
    async fn a_request_made_before_the_wait_wakes_it() {
        let refreshes = Refreshes::default();
        refreshes.requester().request(&PodUid::from("a"));
        // Returns at once: the permit was kept.
        refreshes.requested().await;
        assert_eq!(refreshes.take(), vec![PodUid::from("a")]);
    }

    #[test]
    fn requests_after_the_pleg_is_gone_are_ignored() {
        let refreshes = Refreshes::default();
        let requester = refreshes.requester();
        drop(refreshes);
        assert!(!requester.request(&PodUid::from("a")));
    }
}
