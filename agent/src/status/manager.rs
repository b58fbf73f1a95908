//! The status manager's store (the kubelet's `status.manager`): the latest API status of every pod,
//! versioned so readers can tell whether it changed. With an API server, [`super::StatusSyncer`]
//! writes changed versions back to it; it is woken through [`StatusManager::changed`].

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::Notify;

use k8s_openapi::api::core::v1::{Pod, PodStatus as ApiPodStatus};

use super::generate::{with_container_readiness, with_container_startup};
use crate::container::{ContainerId, PodUid};

struct Versioned {
    status: ApiPodStatus,
    version: u64,
    /// The pod starts a new life (added again with the same UID after it terminated): the next
    /// status is stored without the transition rules.
    restarting: bool,
}

/// Cloneable handle to the pod statuses; every clone sees the same store.
#[derive(Clone, Default)]
pub struct StatusManager {
    pods: Arc<Mutex<HashMap<PodUid, Versioned>>>,
    changed: Arc<Notify>,
}

impl StatusManager {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, Versioned>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores the pod's status, bumping its version when it differs from the stored one. A status
    /// that would move a terminated container of a pod that does not restart it back to another
    /// state, or move a terminal pod out of its phase, is refused (logged), as the kubelet does.
    /// Returns whether the stored status changed.
    pub fn set_pod_status(&self, pod: &Pod, status: ApiPodStatus) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()) else {
            tracing::warn!(
                pod = pod.metadata.name.as_deref().unwrap_or_default(),
                "not storing status of a pod without metadata.uid"
            );
            return false;
        };
        let uid = PodUid::from(uid);
        let mut pods = self.lock();
        match pods.get_mut(&uid) {
            Some(old) if old.status == status => false,
            Some(old) => {
                if !old.restarting
                    && let Err(reason) = check_transition(pod, &old.status, &status)
                {
                    tracing::warn!(pod = %uid, reason, "refusing pod status update");
                    return false;
                }
                old.status = status;
                old.version += 1;
                old.restarting = false;
                self.changed.notify_one();
                true
            }
            None => {
                pods.insert(
                    uid,
                    Versioned {
                        status,
                        version: 1,
                        restarting: false,
                    },
                );
                self.changed.notify_one();
                true
            }
        }
    }

    /// Marks container `id` of `pod` ready or not and recomputes the pod's `Ready` and
    /// `ContainersReady` conditions at once (a readiness probe's verdict), without waiting for the
    /// pod's next sync. Returns whether the stored status changed.
    pub fn set_container_readiness(&self, pod: &Pod, id: &ContainerId, ready: bool) -> bool {
        self.update_with(pod, |current| {
            with_container_readiness(pod, current, id, ready)
        })
    }

    /// Marks container `id` of `pod` started or not (a startup probe's verdict). Returns whether
    /// the stored status changed.
    pub fn set_container_startup(&self, pod: &Pod, id: &ContainerId, started: bool) -> bool {
        self.update_with(pod, |current| with_container_startup(current, id, started))
    }

    /// Replaces the pod's stored status by what `update` makes of it, under one lock so no other
    /// writer's status is lost in between; `None` from `update` leaves it alone.
    fn update_with(
        &self,
        pod: &Pod,
        update: impl FnOnce(&ApiPodStatus) -> Option<ApiPodStatus>,
    ) -> bool {
        let Some(uid) = pod.metadata.uid.as_deref() else {
            return false;
        };
        let mut pods = self.lock();
        let Some(old) = pods.get_mut(&PodUid::from(uid)) else {
            return false;
        };
        let Some(status) = update(&old.status) else {
            return false;
        };
        if let Err(reason) = check_transition(pod, &old.status, &status) {
            tracing::warn!(pod = %uid, reason, "refusing pod status update");
            return false;
        }
        old.status = status;
        old.version += 1;
        self.changed.notify_one();
        true
    }

    /// Notified whenever a stored status changes (many changes may wake the waiter once).
    pub fn changed(&self) -> Arc<Notify> {
        Arc::clone(&self.changed)
    }

    /// Every pod's status and version.
    pub fn snapshot(&self) -> Vec<(PodUid, ApiPodStatus, u64)> {
        self.lock()
            .iter()
            .map(|(uid, v)| (uid.clone(), v.status.clone(), v.version))
            .collect()
    }

    /// The latest status of the pod.
    pub fn get_pod_status(&self, uid: &PodUid) -> Option<ApiPodStatus> {
        self.lock().get(uid).map(|v| v.status.clone())
    }

    /// How many distinct statuses the pod has had (1 after the first).
    pub fn version(&self, uid: &PodUid) -> Option<u64> {
        self.lock().get(uid).map(|v| v.version)
    }

    /// Every pod's status version, under one lock.
    pub fn versions(&self) -> HashMap<PodUid, u64> {
        self.lock()
            .iter()
            .map(|(uid, v)| (uid.clone(), v.version))
            .collect()
    }

    /// Lets the next status of pod `uid` move its containers and phase anywhere: the pod was
    /// stopped and runs again with the same UID. The version keeps counting, so the change still
    /// reaches the API server.
    pub fn allow_restart(&self, uid: &PodUid) {
        if let Some(stored) = self.lock().get_mut(uid) {
            stored.restarting = true;
        }
    }

    /// Forgets every pod not in `keep`.
    pub fn remove_orphans(&self, keep: &HashSet<PodUid>) {
        self.lock().retain(|uid, _| keep.contains(uid));
    }
}

/// The kubelet's `checkContainerStateTransition` plus the rule that a terminal phase is final.
fn check_transition(pod: &Pod, old: &ApiPodStatus, new: &ApiPodStatus) -> Result<(), String> {
    let old_phase = old.phase.as_deref();
    if matches!(old_phase, Some("Succeeded" | "Failed")) && new.phase.as_deref() != old_phase {
        return Err(format!(
            "pod attempted illegal phase transition from {} to {}",
            old_phase.unwrap_or_default(),
            new.phase.as_deref().unwrap_or_default()
        ));
    }
    let policy = pod
        .spec
        .as_ref()
        .and_then(|s| s.restart_policy.as_deref())
        .unwrap_or("Always");
    if policy == "Always" {
        return Ok(());
    }
    let old_statuses = old.container_statuses.iter().flatten();
    let new_statuses = new.container_statuses.as_deref().unwrap_or_default();
    for old_status in old_statuses {
        let Some(terminated) = old_status
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
        else {
            continue;
        };
        if policy == "OnFailure" && terminated.exit_code != 0 {
            continue;
        }
        let still_terminated = new_statuses
            .iter()
            .find(|s| s.name == old_status.name)
            .is_some_and(|s| s.state.as_ref().is_some_and(|st| st.terminated.is_some()));
        if !still_terminated {
            return Err(format!(
                "terminated container {} attempted illegal transition to non-terminated state",
                old_status.name
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStatus, PodSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(uid: &str, policy: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some(uid.to_owned()),
                name: Some(format!("{uid}-name")),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                restart_policy: Some(policy.to_owned()),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn status(phase: &str, terminated: Option<i32>) -> ApiPodStatus {
        let state = match terminated {
            Some(exit_code) => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code,
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            },
            None => ContainerState {
                running: Some(ContainerStateRunning::default()),
                ..ContainerState::default()
            },
        };
        ApiPodStatus {
            phase: Some(phase.to_owned()),
            container_statuses: Some(vec![ContainerStatus {
                name: "c".to_owned(),
                state: Some(state),
                ..ContainerStatus::default()
            }]),
            ..ApiPodStatus::default()
        }
    }

    #[test]
    fn version_bumps_only_on_change() {
        let manager = StatusManager::new();
        let uid = PodUid::from("a");
        let p = pod("a", "Always");
        assert!(manager.set_pod_status(&p, status("Pending", None)));
        assert_eq!(manager.version(&uid), Some(1));
        assert!(!manager.set_pod_status(&p, status("Pending", None)));
        assert_eq!(manager.version(&uid), Some(1));
        let clone = manager.clone();
        assert!(clone.set_pod_status(&p, status("Running", None)));
        assert_eq!(manager.version(&uid), Some(2));
        assert_eq!(
            manager.get_pod_status(&uid).unwrap().phase.as_deref(),
            Some("Running")
        );
    }

    #[test]
    fn refuses_illegal_transitions() {
        let manager = StatusManager::new();
        let uid = PodUid::from("n");
        let p = pod("n", "Never");
        manager.set_pod_status(&p, status("Running", Some(1)));
        assert!(!manager.set_pod_status(&p, status("Running", None)));
        assert_eq!(
            manager.version(&uid),
            Some(1),
            "terminated container came back"
        );
        manager.set_pod_status(&p, status("Failed", Some(1)));
        manager.set_pod_status(&p, status("Pending", Some(1)));
        assert_eq!(
            manager.get_pod_status(&uid).unwrap().phase.as_deref(),
            Some("Failed")
        );
    }

    #[test]
    fn ignores_pods_without_uid_and_removes_orphans() {
        let manager = StatusManager::new();
        let mut anonymous = pod("x", "Always");
        anonymous.metadata.uid = None;
        manager.set_pod_status(&anonymous, status("Pending", None));
        assert_eq!(manager.get_pod_status(&PodUid::from("")), None);

        manager.set_pod_status(&pod("a", "Always"), status("Pending", None));
        manager.set_pod_status(&pod("b", "Always"), status("Pending", None));
        manager.remove_orphans(&HashSet::from([PodUid::from("b")]));
        assert!(manager.get_pod_status(&PodUid::from("a")).is_none());
        assert!(manager.get_pod_status(&PodUid::from("b")).is_some());
    }

    #[test]
    fn is_shared_between_tasks() {
        let manager = StatusManager::new();
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let manager = manager.clone();
                std::thread::spawn(move || {
                    manager
                        .set_pod_status(&pod(&format!("p{i}"), "Always"), status("Running", None));
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!((0..4).all(|i| manager.version(&PodUid::from(format!("p{i}"))) == Some(1)));
    }
}
