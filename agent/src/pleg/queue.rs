//! The ebpf-mode PLEG's per-pod hint bookkeeping (ringlet's own): which pods wait for a targeted
//! relist, the kernel times of the facts not yet reflected in an event, and the bounded back-off of
//! pods whose runtime has not caught up with the kernel yet (still reports running a container the
//! kernel saw exit, or not yet running one the kernel saw start).
//!
//! Hints for a pod that is already queued merge into its entry, so a burst of hints costs one relist,
//! plus at most one more for hints that arrived while that relist ran.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::{HintKind, KERNEL_EXIT_GRACE, PodHint, PodLifecycleEventKind};
use crate::container::{ContainerId, PodUid};

/// Lag retries after the first read wait 1, 2, 4, … 128 ms (from 16 ms while the pod only waits
/// for confirmations, see [`CONFIRMATION_SKIPPED_DOUBLINGS`]), then 128 ms each, until the runtime
/// has lagged [`KERNEL_EXIT_GRACE`]: as long as a kernel-published exit may overlay it.
const LAG_RETRY_DOUBLINGS: u32 = 7;

/// Doublings a pod skips while all it waits for is the runtime's confirmation of exits the kernel
/// already published: its retries start at 16 ms. The pod already shows those exits, and containerd
/// records an exit 40–160 ms after the kernel, so reads in the first milliseconds find nothing and
/// only compete for the CPU with the shim's exit handling and with the pod's readers.
const CONFIRMATION_SKIPPED_DOUBLINGS: u32 = 4;

/// The wait before lag retry `attempt`; `confirming`: the pod waits only for the runtime to confirm
/// exits the kernel published.
fn lag_retry_delay(attempt: u32, confirming: bool) -> Duration {
    let skipped = if confirming {
        CONFIRMATION_SKIPPED_DOUBLINGS
    } else {
        0
    };
    Duration::from_millis(1 << (attempt + skipped).min(LAG_RETRY_DOUBLINGS))
}

/// A pod whose runtime lags behind a kernel-reported start or exit.
#[derive(Debug)]
struct Retry {
    /// Retries done since the back-off last started.
    attempt: u32,
    due: Instant,
    /// When a read first still missed the reported change.
    since: Instant,
    /// Whether all the pod waits for is the runtime's confirmation of exits the kernel published.
    confirming: bool,
}

#[derive(Debug, Default)]
struct PendingPod {
    /// The earliest kernel time of each fact (kind, container) not yet reflected.
    facts: HashMap<(HintKind, Option<ContainerId>), u64>,
    /// For each container with a `Died` fact, the processes (tgids) whose exits it stands for.
    exited: HashMap<ContainerId, Vec<u32>>,
    queued: bool,
    retry: Option<Retry>,
}

/// What a targeted relist's read meant for the pod's lag back-off.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Settled {
    /// Every reported start and exit is visible in the runtime; `lag` is how long the runtime
    /// trailed, if it did.
    Done { lag: Option<Duration> },
    /// The runtime still misses a reported start or exit; the pod is read again after a back-off.
    Retrying,
    /// The runtime kept missing it for [`KERNEL_EXIT_GRACE`].
    GaveUp { waited: Duration },
}

#[derive(Debug, Default)]
pub(super) struct HintQueue {
    pods: HashMap<PodUid, PendingPod>,
    ready: VecDeque<PodUid>,
}

impl HintQueue {
    /// Records a hint and queues its pod for a targeted relist unless it already is.
    pub(super) fn push(&mut self, hint: PodHint) {
        let pod = self.pods.entry(hint.pod.clone()).or_default();
        match pod.facts.entry((hint.kind, hint.container.clone())) {
            Entry::Occupied(mut e) => {
                let t = e.get_mut();
                *t = (*t).min(hint.kernel_time_ns);
            }
            Entry::Vacant(e) => {
                e.insert(hint.kernel_time_ns);
            }
        }
        if hint.kind == HintKind::Died
            && let (Some(container), Some(tgid)) = (hint.container, hint.tgid)
        {
            let tgids = pod.exited.entry(container).or_default();
            if !tgids.contains(&tgid) {
                tgids.push(tgid);
            }
        }
        if !pod.queued {
            pod.queued = true;
            self.ready.push_back(hint.pod);
        }
    }

    /// Queues `pod` for a targeted relist without a fact to expect (a pod worker's refresh).
    pub(super) fn request(&mut self, uid: PodUid) {
        let pod = self.pods.entry(uid.clone()).or_default();
        if !pod.queued {
            pod.queued = true;
            self.ready.push_back(uid);
        }
    }

    /// The next pod due for a targeted relist.
    pub(super) fn pop_ready(&mut self) -> Option<PodUid> {
        while let Some(uid) = self.ready.pop_front() {
            if let Some(pod) = self.pods.get_mut(&uid)
                && pod.queued
            {
                pod.queued = false;
                return Some(uid);
            }
        }
        None
    }

    /// When the earliest lag retry is due.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.pods
            .values()
            .filter(|p| !p.queued)
            .filter_map(|p| p.retry.as_ref().map(|r| r.due))
            .min()
    }

    /// Queues every pod whose lag retry is due at `now`.
    pub(super) fn queue_due_retries(&mut self, now: Instant) {
        for (uid, pod) in &mut self.pods {
            if !pod.queued && pod.retry.as_ref().is_some_and(|r| r.due <= now) {
                pod.queued = true;
                self.ready.push_back(uid.clone());
            }
        }
    }

    /// The containers a `Started` or `Died` hint named for `pod`, with the hint's kind: what a read
    /// of the pod must show for the runtime to have caught up.
    pub(super) fn expected_changes(&self, pod: &PodUid) -> Vec<(HintKind, ContainerId)> {
        self.pods.get(pod).map_or_else(Vec::new, |p| {
            p.facts
                .keys()
                .filter(|(kind, _)| matches!(kind, HintKind::Started | HintKind::Died))
                .filter_map(|(kind, container)| Some((*kind, container.clone()?)))
                .collect()
        })
    }

    /// The processes whose exits the `Died` hints for `container` of `pod` reported (empty when the
    /// hints named none).
    pub(super) fn exited_tgids(&self, pod: &PodUid, container: &ContainerId) -> &[u32] {
        self.pods
            .get(pod)
            .and_then(|p| p.exited.get(container))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether every hint for `pod` reported a removed cgroup: for a pod the PLEG does not know,
    /// there is nothing left to find.
    pub(super) fn only_removals(&self, pod: &PodUid) -> bool {
        self.pods.get(pod).is_some_and(|p| {
            !p.facts.is_empty()
                && p.facts
                    .keys()
                    .all(|(kind, _)| *kind == HintKind::CgroupRemoved)
        })
    }

    /// The kernel time of the hint that led to an event of `kind` for `container` of `pod`: the
    /// earliest matching fact about that container, else about the container at all, else a fact
    /// that named no container; for `PodSync`, the pod's earliest fact.
    pub(super) fn hint_time(
        &self,
        pod: &PodUid,
        kind: PodLifecycleEventKind,
        container: Option<&ContainerId>,
    ) -> Option<u64> {
        let facts = &self.pods.get(pod)?.facts;
        let earliest = |keep: &dyn Fn(HintKind, Option<&ContainerId>) -> bool| {
            facts
                .iter()
                .filter(|((k, c), _)| keep(*k, c.as_ref()))
                .map(|(_, t)| *t)
                .min()
        };
        if kind == PodLifecycleEventKind::PodSync {
            return earliest(&|_, _| true);
        }
        let related = |k: HintKind| match kind {
            PodLifecycleEventKind::ContainerStarted => {
                matches!(k, HintKind::Started | HintKind::CgroupCreated)
            }
            PodLifecycleEventKind::ContainerDied => {
                matches!(k, HintKind::Died | HintKind::OomKilled)
            }
            PodLifecycleEventKind::ContainerRemoved => k == HintKind::CgroupRemoved,
            PodLifecycleEventKind::ContainerChanged | PodLifecycleEventKind::PodSync => true,
        };
        earliest(&|k, c| c == container && related(k))
            .or_else(|| earliest(&|_, c| c == container))
            .or_else(|| earliest(&|_, c| c.is_none()))
    }

    /// After a targeted relist of `pod` read at `now`: `lagging` are the containers whose reported
    /// start or exit the runtime does not show yet; `confirming`, when those are all exits the
    /// kernel already published. Clears what the read settled and schedules or advances the lag
    /// back-off.
    pub(super) fn settle(
        &mut self,
        pod: &PodUid,
        lagging: &[ContainerId],
        confirming: bool,
        now: Instant,
    ) -> Settled {
        let Some(entry) = self.pods.get_mut(pod) else {
            return Settled::Done { lag: None };
        };
        if lagging.is_empty() {
            let lag = entry.retry.take().map(|r| now - r.since);
            if !entry.queued {
                self.pods.remove(pod);
            }
            return Settled::Done { lag };
        }
        entry.facts.retain(|(kind, container), _| {
            matches!(kind, HintKind::Started | HintKind::Died)
                && container.as_ref().is_some_and(|c| lagging.contains(c))
        });
        entry
            .exited
            .retain(|container, _| lagging.contains(container));
        match &mut entry.retry {
            None => {
                entry.retry = Some(Retry {
                    attempt: 0,
                    due: now + lag_retry_delay(0, confirming),
                    since: now,
                    confirming,
                });
            }
            // This read was the retry itself (a hint may also have moved a read earlier, which does
            // not count as an attempt), or the pod now waits for more than confirmations: a lag the
            // kernel did not publish (a start, say) is not left to their slower schedule, the
            // back-off starts over.
            Some(retry) if retry.due <= now || (retry.confirming && !confirming) => {
                if now - retry.since >= KERNEL_EXIT_GRACE {
                    let waited = now - retry.since;
                    self.pods.remove(pod);
                    return Settled::GaveUp { waited };
                }
                retry.attempt = if retry.confirming && !confirming {
                    0
                } else {
                    retry.attempt + 1
                };
                retry.due = now + lag_retry_delay(retry.attempt, confirming);
                retry.confirming = confirming;
            }
            Some(_) => {}
        }
        Settled::Retrying
    }

    /// How many pods wait, with back-off, for the runtime to catch up with the kernel.
    pub(super) fn awaiting_runtime(&self) -> usize {
        self.pods.values().filter(|p| p.retry.is_some()).count()
    }

    /// Drops `pod`'s hints (its targeted relist failed; the next full relist re-reads it).
    pub(super) fn forget(&mut self, pod: &PodUid) {
        if self.pods.get(pod).is_some_and(|p| !p.queued) {
            self.pods.remove(pod);
        }
    }

    /// After a full relist: drops the hints of pods that wait for nothing more (neither queued nor
    /// backing off), i.e. unknown pods whose hints the full relist answered.
    pub(super) fn forget_settled(&mut self) {
        self.pods.retain(|_, p| p.queued || p.retry.is_some());
    }

    #[cfg(test)]
    pub(super) fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use PodLifecycleEventKind::{ContainerDied, ContainerRemoved, ContainerStarted, PodSync};

    fn hint(pod: &str, kind: HintKind, container: Option<&str>, t: u64) -> PodHint {
        PodHint {
            pod: PodUid::from(pod),
            kind,
            container: container.map(ContainerId::from),
            tgid: None,
            exit_code: None,
            signal: None,
            kernel_time_ns: t,
        }
    }

    #[test]
    fn hints_for_a_queued_pod_coalesce() {
        let mut q = HintQueue::default();
        for i in 0..50 {
            q.push(hint("p", HintKind::Died, Some("c"), 100 + i));
        }
        q.push(hint("other", HintKind::Started, Some("x"), 7));
        assert_eq!(q.pop_ready(), Some(PodUid::from("p")));
        assert_eq!(q.pop_ready(), Some(PodUid::from("other")));
        assert_eq!(q.pop_ready(), None);
        assert_eq!(
            q.hint_time(
                &PodUid::from("p"),
                PodLifecycleEventKind::ContainerDied,
                Some(&ContainerId::from("c"))
            ),
            Some(100),
            "the earliest of the coalesced hints"
        );
        // A hint during the relist queues the pod once more.
        q.push(hint("p", HintKind::Died, Some("c"), 200));
        q.push(hint("p", HintKind::Died, Some("c"), 201));
        assert_eq!(q.pop_ready(), Some(PodUid::from("p")));
        assert_eq!(q.pop_ready(), None);
    }

    #[test]
    fn hint_time_prefers_the_matching_fact() {
        let mut q = HintQueue::default();
        q.push(hint("p", HintKind::Started, Some("c"), 10));
        q.push(hint("p", HintKind::Died, Some("c"), 20));
        q.push(hint("p", HintKind::OomKilled, None, 5));
        let p = PodUid::from("p");
        let c = ContainerId::from("c");
        let other = ContainerId::from("d");
        assert_eq!(q.hint_time(&p, ContainerStarted, Some(&c)), Some(10));
        assert_eq!(q.hint_time(&p, ContainerDied, Some(&c)), Some(20));
        assert_eq!(q.hint_time(&p, ContainerRemoved, Some(&c)), Some(10));
        assert_eq!(q.hint_time(&p, ContainerDied, Some(&other)), Some(5));
        assert_eq!(q.hint_time(&p, PodSync, None), Some(5));
        assert_eq!(q.hint_time(&PodUid::from("x"), PodSync, None), None);
    }

    #[test]
    fn lag_backs_off_then_gives_up() {
        let mut q = HintQueue::default();
        let p = PodUid::from("p");
        let c = ContainerId::from("c");
        q.push(hint("p", HintKind::Died, Some("c"), 1));
        let mut now = Instant::now();
        assert_eq!(q.pop_ready(), Some(p.clone()));
        assert_eq!(
            q.settle(&p, std::slice::from_ref(&c), false, now),
            Settled::Retrying
        );
        let mut waits = Vec::new();
        loop {
            let due = q.next_retry().unwrap();
            waits.push(due - now);
            now = due;
            q.queue_due_retries(now);
            assert_eq!(q.pop_ready(), Some(p.clone()));
            match q.settle(&p, std::slice::from_ref(&c), false, now) {
                Settled::Retrying => {}
                Settled::GaveUp { waited } => {
                    assert!(waited >= KERNEL_EXIT_GRACE);
                    assert!(waited < KERNEL_EXIT_GRACE + Duration::from_millis(128));
                    break;
                }
                Settled::Done { .. } => panic!("still lagging"),
            }
        }
        let doubling: Vec<Duration> = (0..8).map(|i| Duration::from_millis(1 << i)).collect();
        assert_eq!(waits[..8], doubling[..]);
        assert!(
            waits[8..].iter().all(|w| *w == Duration::from_millis(128)),
            "then steady: {waits:?}"
        );
        assert!(q.is_empty());
    }

    #[test]
    fn a_pod_awaiting_only_confirmations_is_retried_from_16_ms() {
        let mut q = HintQueue::default();
        let p = PodUid::from("p");
        let c = ContainerId::from("c");
        q.push(hint("p", HintKind::Died, Some("c"), 1));
        let mut now = Instant::now();
        q.pop_ready();
        let mut waits = Vec::new();
        for _ in 0..5 {
            assert_eq!(
                q.settle(&p, std::slice::from_ref(&c), true, now),
                Settled::Retrying
            );
            let due = q.next_retry().unwrap();
            waits.push((due - now).as_millis());
            now = due;
            q.queue_due_retries(now);
            q.pop_ready();
        }
        assert_eq!(waits, [16, 32, 64, 128, 128]);
        assert_eq!(
            q.settle(&p, std::slice::from_ref(&c), false, now),
            Settled::Retrying
        );
        assert_eq!(
            q.next_retry().unwrap() - now,
            Duration::from_millis(1),
            "a lag the kernel did not publish starts the back-off over"
        );
    }

    #[test]
    fn lag_resolves_with_its_duration() {
        let mut q = HintQueue::default();
        let p = PodUid::from("p");
        let c = ContainerId::from("c");
        q.push(hint("p", HintKind::Died, Some("c"), 1));
        let start = Instant::now();
        q.pop_ready();
        q.settle(&p, std::slice::from_ref(&c), false, start);
        let due = q.next_retry().unwrap();
        q.queue_due_retries(due);
        q.pop_ready();
        assert_eq!(
            q.settle(&p, &[], false, due),
            Settled::Done {
                lag: Some(Duration::from_millis(1))
            }
        );
        assert!(q.is_empty());
    }

    #[test]
    fn died_hints_keep_which_processes_exited_until_their_container_settles() {
        let mut q = HintQueue::default();
        let p = PodUid::from("p");
        let (first, second) = (ContainerId::from("c"), ContainerId::from("d"));
        let exit_of = |container: &str, tgid: u32| {
            let mut h = hint("p", HintKind::Died, Some(container), 1);
            h.tgid = Some(tgid);
            h
        };
        q.push(exit_of("c", 10));
        q.push(exit_of("c", 11));
        q.push(exit_of("c", 10));
        q.push(exit_of("d", 20));
        q.push(hint("p", HintKind::Started, Some("c"), 2));
        assert_eq!(q.exited_tgids(&p, &first), [10, 11]);
        assert_eq!(q.exited_tgids(&p, &second), [20]);
        q.pop_ready();
        assert_eq!(
            q.settle(&p, std::slice::from_ref(&second), false, Instant::now()),
            Settled::Retrying
        );
        assert!(q.exited_tgids(&p, &first).is_empty(), "c settled");
        assert_eq!(q.exited_tgids(&p, &second), [20]);
    }
}
