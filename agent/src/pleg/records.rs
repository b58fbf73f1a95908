//! The PLEG's record of each pod (the kubelet's `podRecords` in `pkg/kubelet/pleg/generic.go`): the
//! runtime's listing the lifecycle events were last computed against, the listing a full relist is
//! processing, and the pure diff of two listings into events (the kubelet's `computeEvents` and
//! `generateEvents`). Nothing here talks to the runtime, so the diff is tested on plain listings.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{HintKind, PodLifecycleEvent, PodLifecycleEventKind};
use crate::container::{ContainerId, ContainerState, PodUid, RunningPod, SandboxState};

/// The PLEG's coarse view of a container or sandbox (the kubelet's `plegContainerState`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    /// Created but not started, or a state the runtime could not tell.
    Unknown,
    NonExistent,
}

/// The last listing the events were computed against, and the listing being processed.
#[derive(Default)]
struct PodRecord {
    old: Option<RunningPod>,
    current: Option<RunningPod>,
}

/// Every pod the PLEG has listed, by uid.
#[derive(Default)]
pub(super) struct PodRecords {
    pods: HashMap<PodUid, PodRecord>,
}

impl PodRecords {
    /// Starts a full relist: `listing` becomes the current listing of its pods; every other pod has
    /// none (it is gone from the runtime).
    pub(super) fn set_current_listing(&mut self, listing: impl IntoIterator<Item = RunningPod>) {
        self.clear_current();
        for pod in listing {
            let uid = pod.uid.clone();
            self.pods.entry(uid).or_default().current = Some(pod);
        }
    }

    /// Drops every half-processed listing; the listings the events were computed against stay.
    pub(super) fn clear_current(&mut self) {
        for record in self.pods.values_mut() {
            record.current = None;
        }
    }

    /// Every recorded pod, sorted, so a full relist processes them in a stable order.
    pub(super) fn uids(&self) -> Vec<PodUid> {
        let mut uids: Vec<PodUid> = self.pods.keys().cloned().collect();
        uids.sort();
        uids
    }

    pub(super) fn contains(&self, uid: &PodUid) -> bool {
        self.pods.contains_key(uid)
    }

    /// The events between the pod's last listing and its current one; `None` for a pod not recorded.
    pub(super) fn pending_events(&self, uid: &PodUid) -> Option<Vec<PodLifecycleEvent>> {
        let record = self.pods.get(uid)?;
        Some(compute_pod_events(
            uid,
            record.old.as_ref(),
            record.current.as_ref(),
        ))
    }

    /// The listing a full relist is processing for the pod.
    pub(super) fn current(&self, uid: &PodUid) -> Option<&RunningPod> {
        self.pods.get(uid)?.current.as_ref()
    }

    /// The listing the pod's events were last computed against.
    pub(super) fn listed(&self, uid: &PodUid) -> Option<&RunningPod> {
        self.pods.get(uid)?.old.as_ref()
    }

    /// The listing to amend when the kernel publishes an exit before the runtime reports it.
    pub(super) fn listed_mut(&mut self, uid: &PodUid) -> Option<&mut RunningPod> {
        self.pods.get_mut(uid)?.old.as_mut()
    }

    /// Any listing of the pod, the last one processed first (for its name and namespace).
    pub(super) fn known(&self, uid: &PodUid) -> Option<&RunningPod> {
        let record = self.pods.get(uid)?;
        record.old.as_ref().or(record.current.as_ref())
    }

    /// The newest listing of the pod, the one being processed first.
    pub(super) fn newest(&self, uid: &PodUid) -> Option<&RunningPod> {
        let record = self.pods.get(uid)?;
        record.current.as_ref().or(record.old.as_ref())
    }

    /// Every listing the events were last computed against.
    pub(super) fn listed_pods(&self) -> impl Iterator<Item = &RunningPod> {
        self.pods.values().filter_map(|record| record.old.as_ref())
    }

    /// Makes the pod's current listing the one its events were computed against; a pod without a
    /// current listing is gone and forgotten.
    pub(super) fn advance(&mut self, uid: &PodUid) {
        let Some(record) = self.pods.get_mut(uid) else {
            return;
        };
        match record.current.take() {
            Some(current) => record.old = Some(current),
            None => {
                self.pods.remove(uid);
            }
        }
    }

    /// Takes a targeted read of one pod (`None`: the runtime has nothing of it) as its listing and
    /// returns the events since the listing before.
    pub(super) fn apply_read(
        &mut self,
        uid: &PodUid,
        read: Option<RunningPod>,
    ) -> Vec<PodLifecycleEvent> {
        let events = compute_pod_events(uid, self.listed(uid), read.as_ref());
        match read {
            Some(read) => {
                let record = self.pods.entry(uid.clone()).or_default();
                record.old = Some(read);
                record.current = None;
            }
            None => {
                self.pods.remove(uid);
            }
        }
        events
    }
}

/// Whether a read that shows `pod` has not caught up with a hint of `kind` about `container` yet:
/// an exit while it still runs, a start before it runs (or ran).
pub(super) fn runtime_lags(kind: HintKind, pod: &RunningPod, container: &ContainerId) -> bool {
    let state = states(Some(pod)).get(container).copied();
    match kind {
        HintKind::Died => state == Some(PlegState::Running),
        HintKind::Started => !matches!(state, Some(PlegState::Running | PlegState::Exited)),
        HintKind::CgroupCreated | HintKind::CgroupRemoved | HintKind::OomKilled => false,
    }
}

/// Every container and sandbox of a listing with its PLEG state, keyed by id. Sandbox ids share the
/// key space with container ids, as in the kubelet.
fn states(pod: Option<&RunningPod>) -> BTreeMap<ContainerId, PlegState> {
    let Some(pod) = pod else {
        return BTreeMap::new();
    };
    let containers = pod.containers.iter().map(|c| {
        let state = match c.state {
            ContainerState::Running => PlegState::Running,
            ContainerState::Exited => PlegState::Exited,
            ContainerState::Created | ContainerState::Unknown => PlegState::Unknown,
        };
        (c.id.clone(), state)
    });
    let sandboxes = pod.sandboxes.iter().map(|s| {
        let state = match s.state {
            SandboxState::Ready => PlegState::Running,
            SandboxState::NotReady => PlegState::Exited,
        };
        (ContainerId::new(s.id.as_str()), state)
    });
    containers.chain(sandboxes).collect()
}

fn compute_pod_events(
    uid: &PodUid,
    old: Option<&RunningPod>,
    current: Option<&RunningPod>,
) -> Vec<PodLifecycleEvent> {
    let old = states(old);
    let current = states(current);
    let ids: BTreeSet<&ContainerId> = old.keys().chain(current.keys()).collect();
    let mut events = Vec::new();
    for id in ids {
        let before = old.get(id).copied().unwrap_or(PlegState::NonExistent);
        let after = current.get(id).copied().unwrap_or(PlegState::NonExistent);
        for kind in transition_events(before, after) {
            events.push(PodLifecycleEvent {
                pod: uid.clone(),
                kind: *kind,
                container: Some(id.clone()),
            });
        }
    }
    events
}

fn transition_events(before: PlegState, after: PlegState) -> &'static [PodLifecycleEventKind] {
    use PodLifecycleEventKind::{
        ContainerChanged, ContainerDied, ContainerRemoved, ContainerStarted,
    };
    if before == after {
        return &[];
    }
    match (before, after) {
        (_, PlegState::Running) => &[ContainerStarted],
        // A container that started and exited between two relists was never seen running.
        (PlegState::NonExistent, PlegState::Exited) => &[ContainerStarted, ContainerDied],
        (_, PlegState::Exited) => &[ContainerDied],
        (_, PlegState::Unknown) => &[ContainerChanged],
        (PlegState::Exited, PlegState::NonExistent) => &[ContainerRemoved],
        (_, PlegState::NonExistent) => &[ContainerDied, ContainerRemoved],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{RunningContainer, RunningSandbox, SandboxId};
    use PodLifecycleEventKind::{
        ContainerChanged, ContainerDied, ContainerRemoved, ContainerStarted,
    };

    fn uid() -> PodUid {
        PodUid::from("pod-a")
    }

    /// A listing of pod-a with a ready sandbox `s` and one container `c` in `state`.
    fn listing(state: ContainerState) -> RunningPod {
        RunningPod {
            uid: uid(),
            name: "a".into(),
            namespace: "default".into(),
            sandboxes: vec![RunningSandbox {
                id: SandboxId::from("s"),
                state: SandboxState::Ready,
                created_at: 1,
            }],
            containers: vec![RunningContainer {
                id: ContainerId::from("c"),
                name: "app".into(),
                state,
                hash: String::new(),
                created_at: 2,
            }],
        }
    }

    fn kinds(events: &[PodLifecycleEvent]) -> Vec<(String, PodLifecycleEventKind)> {
        events
            .iter()
            .map(|e| {
                let id = e.container.as_ref().map(ToString::to_string);
                (id.unwrap_or_default(), e.kind)
            })
            .collect()
    }

    #[test]
    fn each_transition_gives_the_kubelets_events() {
        use PlegState::{Exited, NonExistent, Running, Unknown};
        let cases: [(PlegState, PlegState, &[PodLifecycleEventKind]); 9] = [
            (NonExistent, Running, &[ContainerStarted]),
            (Exited, Running, &[ContainerStarted]),
            (NonExistent, Exited, &[ContainerStarted, ContainerDied]),
            (Running, Exited, &[ContainerDied]),
            (Running, Unknown, &[ContainerChanged]),
            (Exited, NonExistent, &[ContainerRemoved]),
            (Running, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Unknown, NonExistent, &[ContainerDied, ContainerRemoved]),
            (Running, Running, &[]),
        ];
        for (before, after, expected) in cases {
            assert_eq!(
                transition_events(before, after),
                expected,
                "{before:?} -> {after:?}"
            );
        }
    }

    #[test]
    fn a_first_read_starts_the_sandbox_and_the_container() {
        let mut records = PodRecords::default();
        let events = records.apply_read(&uid(), Some(listing(ContainerState::Running)));
        assert_eq!(
            kinds(&events),
            [
                ("c".to_owned(), ContainerStarted),
                ("s".to_owned(), ContainerStarted)
            ]
        );
        assert_eq!(
            records.listed(&uid()),
            Some(&listing(ContainerState::Running))
        );
    }

    #[test]
    fn a_read_diffs_against_the_last_listing_only() {
        let mut records = PodRecords::default();
        records.apply_read(&uid(), Some(listing(ContainerState::Running)));
        let died = records.apply_read(&uid(), Some(listing(ContainerState::Exited)));
        assert_eq!(kinds(&died), [("c".to_owned(), ContainerDied)]);
        let again = records.apply_read(&uid(), Some(listing(ContainerState::Exited)));
        assert!(again.is_empty(), "{again:?}");
    }

    #[test]
    fn an_empty_read_removes_everything_and_forgets_the_pod() {
        let mut records = PodRecords::default();
        records.apply_read(&uid(), Some(listing(ContainerState::Exited)));
        let events = records.apply_read(&uid(), None);
        assert_eq!(
            kinds(&events),
            [
                ("c".to_owned(), ContainerRemoved),
                ("s".to_owned(), ContainerDied),
                ("s".to_owned(), ContainerRemoved)
            ]
        );
        assert!(!records.contains(&uid()));
    }

    #[test]
    fn a_full_relist_keeps_the_old_listing_until_the_pod_advances() {
        let mut records = PodRecords::default();
        records.apply_read(&uid(), Some(listing(ContainerState::Running)));
        records.set_current_listing([listing(ContainerState::Exited)]);
        assert_eq!(
            kinds(&records.pending_events(&uid()).unwrap_or_default()),
            [("c".to_owned(), ContainerDied)]
        );
        assert_eq!(
            records.newest(&uid()),
            Some(&listing(ContainerState::Exited))
        );
        assert_eq!(
            records.known(&uid()),
            Some(&listing(ContainerState::Running))
        );
        records.advance(&uid());
        assert!(records.current(&uid()).is_none());
        assert_eq!(
            records.listed(&uid()),
            Some(&listing(ContainerState::Exited))
        );
    }

    #[test]
    fn a_pod_missing_from_a_full_relist_is_forgotten_when_it_advances() {
        let mut records = PodRecords::default();
        records.apply_read(&uid(), Some(listing(ContainerState::Running)));
        records.set_current_listing([]);
        assert!(records.current(&uid()).is_none());
        records.advance(&uid());
        assert!(!records.contains(&uid()));
        assert!(records.uids().is_empty());
    }

    #[test]
    fn the_runtime_lags_until_it_shows_the_hinted_change() {
        let container = ContainerId::from("c");
        let unseen = ContainerId::from("new");
        let running = listing(ContainerState::Running);
        let exited = listing(ContainerState::Exited);
        assert!(runtime_lags(HintKind::Died, &running, &container));
        assert!(!runtime_lags(HintKind::Died, &exited, &container));
        assert!(runtime_lags(HintKind::Started, &running, &unseen));
        assert!(!runtime_lags(HintKind::Started, &exited, &container));
        assert!(!runtime_lags(HintKind::OomKilled, &running, &container));
    }
}
