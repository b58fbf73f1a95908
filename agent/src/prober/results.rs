//! The probe result caches (the kubelet's `pkg/kubelet/prober/results`): the latest verdict of each
//! probe type per container, read by status generation (ready, started) and by the runtime manager
//! (restart a container whose liveness or startup probe failed). A verdict that changes is also sent
//! on the update channel the sync loop listens to.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::mpsc;

use super::ProbeType;
use crate::container::{ContainerId, PodUid};

/// A container's verdict for one probe type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    /// No verdict yet (a startup probe that has not run).
    Unknown,
    Success,
    Failure,
}

/// A verdict that changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResultUpdate {
    pub probe_type: ProbeType,
    pub container: ContainerId,
    pub result: ProbeResult,
    pub pod: PodUid,
}

/// The receiving end of the update channel, read by the sync loop.
pub type ResultUpdates = mpsc::UnboundedReceiver<ResultUpdate>;

#[derive(Default)]
struct Caches {
    liveness: HashMap<ContainerId, ProbeResult>,
    readiness: HashMap<ContainerId, ProbeResult>,
    startup: HashMap<ContainerId, ProbeResult>,
}

impl Caches {
    fn of(&mut self, probe_type: ProbeType) -> &mut HashMap<ContainerId, ProbeResult> {
        match probe_type {
            ProbeType::Liveness => &mut self.liveness,
            ProbeType::Readiness => &mut self.readiness,
            ProbeType::Startup => &mut self.startup,
        }
    }
}

/// Cloneable handle to the three caches; every clone sees the same verdicts.
#[derive(Clone)]
pub struct ProbeResults {
    caches: Arc<Mutex<Caches>>,
    updates: mpsc::UnboundedSender<ResultUpdate>,
}

impl ProbeResults {
    /// Empty caches and the channel their changes go to.
    pub fn new() -> (Self, ResultUpdates) {
        let (updates, receiver) = mpsc::unbounded_channel();
        (
            Self {
                caches: Arc::default(),
                updates,
            },
            receiver,
        )
    }

    fn caches(&self) -> std::sync::MutexGuard<'_, Caches> {
        self.caches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The container's verdict for `probe_type`, if a worker has given one.
    pub fn get(&self, probe_type: ProbeType, container: &ContainerId) -> Option<ProbeResult> {
        self.caches().of(probe_type).get(container).copied()
    }

    /// Stores a verdict; a new or changed one is sent to the sync loop.
    pub fn set(
        &self,
        probe_type: ProbeType,
        container: &ContainerId,
        result: ProbeResult,
        pod: &PodUid,
    ) {
        let previous = self
            .caches()
            .of(probe_type)
            .insert(container.clone(), result);
        if previous != Some(result) {
            // The sync loop is gone only when the agent is shutting down.
            let _ = self.updates.send(ResultUpdate {
                probe_type,
                container: container.clone(),
                result,
                pod: pod.clone(),
            });
        }
    }

    /// Forgets a container's verdict (its worker stopped or moved on to a new container).
    pub fn remove(&self, probe_type: ProbeType, container: &ContainerId) {
        self.caches().of(probe_type).remove(container);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_changes_are_sent() {
        let (results, mut updates) = ProbeResults::new();
        let id = ContainerId::from("c1");
        let pod = PodUid::from("p1");
        results.set(ProbeType::Readiness, &id, ProbeResult::Failure, &pod);
        results.set(ProbeType::Readiness, &id, ProbeResult::Failure, &pod);
        results.set(ProbeType::Readiness, &id, ProbeResult::Success, &pod);
        results.set(ProbeType::Liveness, &id, ProbeResult::Success, &pod);
        let sent: Vec<(ProbeType, ProbeResult)> = std::iter::from_fn(|| updates.try_recv().ok())
            .map(|u| (u.probe_type, u.result))
            .collect();
        assert_eq!(
            sent,
            [
                (ProbeType::Readiness, ProbeResult::Failure),
                (ProbeType::Readiness, ProbeResult::Success),
                (ProbeType::Liveness, ProbeResult::Success),
            ]
        );
        assert_eq!(
            results.get(ProbeType::Readiness, &id),
            Some(ProbeResult::Success)
        );
        assert_eq!(results.get(ProbeType::Startup, &id), None);
        results.remove(ProbeType::Readiness, &id);
        assert_eq!(results.get(ProbeType::Readiness, &id), None);
    }
}
