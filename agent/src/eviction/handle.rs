//! The eviction manager's state as the rest of the agent sees it (the kubelet's eviction
//! `Manager` interface: `IsUnderMemoryPressure` and friends, and the admit handler's `Admit`), and
//! the status an evicted pod keeps (the kubelet's `killPodNow` status function): phase `Failed`,
//! reason `Evicted`, the eviction message and a `DisruptionTarget` condition. The node shutdown
//! manager records the pods it stops here too, with its own reason and message.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus as ApiPodStatus, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;

use super::message::{DISRUPTION_REASON, REASON, admission_message};
use super::rank::priority;
use super::signals::PressureCondition;
use crate::cm::{QosClass, qos_class};
use crate::container::PodUid;
use crate::lifecycle::Rejection;

/// The priority from which a pod is critical (`scheduling.SystemCriticalPriority`).
const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The taint a `BestEffort` pod must tolerate to be admitted under memory pressure.
const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";
const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// Cloneable view of the eviction manager's state.
#[derive(Debug, Clone)]
pub struct EvictionHandle {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    conditions: watch::Sender<BTreeSet<PressureCondition>>,
    /// The pods evicted (or terminated by the node shutdown) and why.
    evicted: Mutex<HashMap<PodUid, Evicted>>,
}

#[derive(Debug, Clone)]
struct Evicted {
    reason: String,
    message: String,
    at: Time,
    /// A pod that already succeeded stays `Succeeded` (the node shutdown's status function); an
    /// evicted pod turns `Failed` whatever it was.
    keeps_succeeded: bool,
}

impl Default for EvictionHandle {
    fn default() -> Self {
        Self {
            shared: Arc::new(Shared {
                conditions: watch::channel(BTreeSet::new()).0,
                evicted: Mutex::new(HashMap::new()),
            }),
        }
    }
}

/// Static, mirror and system-critical pods (the kubelet's `IsCriticalPod`): never evicted, always
/// admitted.
pub fn is_critical_pod(pod: &Pod) -> bool {
    crate::podconfig::is_static_pod(pod)
        || crate::pod::is_mirror_pod(pod)
        || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn tolerates_memory_pressure(tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let key_matches = match t.key.as_deref() {
            None | Some("") => t.operator.as_deref() == Some("Exists"),
            Some(key) => key == MEMORY_PRESSURE_TAINT,
        };
        let effect_matches = matches!(t.effect.as_deref(), None | Some("" | "NoSchedule"));
        let value_matches = match t.operator.as_deref() {
            Some("Exists") => true,
            _ => t.value.as_deref().unwrap_or_default().is_empty(),
        };
        key_matches && effect_matches && value_matches
    })
}

impl EvictionHandle {
    /// The pressure conditions now.
    pub fn conditions(&self) -> BTreeSet<PressureCondition> {
        self.shared.conditions.borrow().clone()
    }

    /// Wakes when the conditions change.
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<PressureCondition>> {
        self.shared.conditions.subscribe()
    }

    pub(super) fn set_conditions(&self, conditions: BTreeSet<PressureCondition>) {
        self.shared.conditions.send_if_modified(|current| {
            let changed = *current != conditions;
            *current = conditions;
            changed
        });
    }

    /// The eviction admit handler: under memory pressure alone only `BestEffort` pods that do not
    /// tolerate the memory-pressure taint are refused; under any other pressure every pod is;
    /// critical pods always pass.
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let conditions = self.conditions();
        if conditions.is_empty() || is_critical_pod(pod) {
            return Ok(());
        }
        if conditions.len() == 1 && conditions.contains(&PressureCondition::Memory) {
            let tolerations = pod
                .spec
                .as_ref()
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or_default();
            if qos_class(pod) != QosClass::BestEffort || tolerates_memory_pressure(tolerations) {
                return Ok(());
            }
        }
        Err(Rejection {
            reason: REASON.to_owned(),
            message: admission_message(&conditions),
        })
    }

    pub(super) fn mark_evicted(&self, uid: PodUid, message: String) {
        let evicted = Evicted {
            reason: REASON.to_owned(),
            message,
            at: Time(crate::status::wall_clock_now()),
            keeps_succeeded: false,
        };
        self.evicted().insert(uid, evicted);
    }

    /// Records that the kubelet itself stops the pod for `reason` (the node shutdown manager's
    /// `Terminated`): from the kill on its status is `Failed` (unless it had succeeded) with the
    /// reason, the message and the same `DisruptionTarget` condition as an evicted pod's.
    pub fn mark_terminated_by_kubelet(&self, uid: PodUid, reason: &str, message: String) {
        let terminated = Evicted {
            reason: reason.to_owned(),
            message,
            at: Time(crate::status::wall_clock_now()),
            keeps_succeeded: true,
        };
        self.evicted().insert(uid, terminated);
    }

    /// Makes `status` the status of an evicted pod when `uid` was evicted (or terminated by the
    /// node shutdown); returns whether it was.
    pub fn apply_eviction(&self, uid: &PodUid, status: &mut ApiPodStatus) -> bool {
        let Some(evicted) = self.evicted().get(uid).cloned() else {
            return false;
        };
        if !(evicted.keeps_succeeded && status.phase.as_deref() == Some("Succeeded")) {
            status.phase = Some("Failed".to_owned());
        }
        status.reason = Some(evicted.reason.clone());
        status.message = Some(evicted.message.clone());
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != DISRUPTION_TARGET);
        conditions.push(PodCondition {
            type_: DISRUPTION_TARGET.to_owned(),
            status: "True".to_owned(),
            reason: Some(DISRUPTION_REASON.to_owned()),
            message: Some(evicted.message),
            last_transition_time: Some(evicted.at),
            ..PodCondition::default()
        });
        true
    }

    /// Forgets the evictions of pods that are gone.
    pub(super) fn retain_evicted(&self, keep: impl Fn(&PodUid) -> bool) {
        self.evicted().retain(|uid, _| keep(uid));
    }

    fn evicted(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, Evicted>> {
        self.shared
            .evicted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use super::*;

    fn pod(memory_request: Option<&str>, tolerations: Vec<Toleration>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".to_owned(),
                    resources: Some(ResourceRequirements {
                        requests: memory_request.map(|m| {
                            BTreeMap::from([("memory".to_owned(), Quantity(m.to_owned()))])
                        }),
                        ..ResourceRequirements::default()
                    }),
                    ..Container::default()
                }],
                tolerations: Some(tolerations),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn memory_pressure_refuses_only_best_effort_pods_and_disk_pressure_every_pod() {
        let handle = EvictionHandle::default();
        let best_effort = pod(None, Vec::new());
        let burstable = pod(Some("10Mi"), Vec::new());
        assert!(handle.admit(&best_effort).is_ok());
        handle.set_conditions(BTreeSet::from([PressureCondition::Memory]));
        let refused = handle.admit(&best_effort).unwrap_err();
        assert_eq!(refused.reason, "Evicted");
        assert_eq!(
            refused.message,
            "The node had condition: [MemoryPressure]. "
        );
        assert!(handle.admit(&burstable).is_ok());
        let tolerant = pod(
            None,
            vec![Toleration {
                key: Some(MEMORY_PRESSURE_TAINT.to_owned()),
                operator: Some("Exists".to_owned()),
                effect: Some("NoSchedule".to_owned()),
                ..Toleration::default()
            }],
        );
        assert!(handle.admit(&tolerant).is_ok());
        handle.set_conditions(BTreeSet::from([
            PressureCondition::Memory,
            PressureCondition::Disk,
        ]));
        assert_eq!(
            handle.admit(&burstable).unwrap_err().message,
            "The node had condition: [MemoryPressure DiskPressure]. "
        );
        let mut critical = burstable.clone();
        critical.spec.as_mut().unwrap().priority = Some(SYSTEM_CRITICAL_PRIORITY);
        assert!(handle.admit(&critical).is_ok());
    }

    #[test]
    fn an_evicted_pod_keeps_failed_evicted_and_a_disruption_target_condition() {
        let handle = EvictionHandle::default();
        let uid = PodUid::from("u1");
        let mut status = ApiPodStatus {
            phase: Some("Running".to_owned()),
            ..ApiPodStatus::default()
        };
        assert!(!handle.apply_eviction(&uid, &mut status));
        handle.mark_evicted(
            uid.clone(),
            "The node was low on resource: memory. ".to_owned(),
        );
        assert!(handle.apply_eviction(&uid, &mut status));
        assert!(handle.apply_eviction(&uid, &mut status), "applied again");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        let conditions = status.conditions.unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0].type_, "DisruptionTarget");
        assert_eq!(
            conditions[0].reason.as_deref(),
            Some("TerminationByKubelet")
        );
        handle.retain_evicted(|_| false);
        let mut fresh = ApiPodStatus::default();
        assert!(!handle.apply_eviction(&uid, &mut fresh));
    }

    #[test]
    fn a_pod_terminated_by_the_kubelet_gets_its_reason_and_keeps_a_success() {
        let handle = EvictionHandle::default();
        let (running, succeeded) = (PodUid::from("running"), PodUid::from("succeeded"));
        let message = "Pod was terminated in response to imminent node shutdown.";
        for uid in [&running, &succeeded] {
            handle.mark_terminated_by_kubelet(uid.clone(), "Terminated", message.to_owned());
        }
        let mut status = ApiPodStatus {
            phase: Some("Running".to_owned()),
            ..ApiPodStatus::default()
        };
        assert!(handle.apply_eviction(&running, &mut status));
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Terminated"));
        assert_eq!(status.message.as_deref(), Some(message));
        let conditions = status.conditions.unwrap();
        assert_eq!(conditions[0].type_, "DisruptionTarget");
        assert_eq!(
            conditions[0].reason.as_deref(),
            Some("TerminationByKubelet")
        );
        assert_eq!(conditions[0].message.as_deref(), Some(message));
        let mut done = ApiPodStatus {
            phase: Some("Succeeded".to_owned()),
            ..ApiPodStatus::default()
        };
        assert!(handle.apply_eviction(&succeeded, &mut done));
        assert_eq!(done.phase.as_deref(), Some("Succeeded"));
        assert_eq!(done.reason.as_deref(), Some("Terminated"));
    }
}
