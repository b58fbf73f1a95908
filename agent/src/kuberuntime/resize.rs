//! In-place pod resize: which running containers must get new cgroup settings after their spec's
//! resources changed, which must restart for it (`resizePolicy: RestartContainer`), and whether
//! the node can take the new requests at all (the kubelet's `computePodResizeAction` and
//! `doPodResizeAction` in `kuberuntime_manager.go`, with the allocated/actuated bookkeeping of
//! `pkg/kubelet/allocation`). The plan is a pure function; [`Resizes`] keeps, per pod, the
//! resources each running container was given, which the pod status reports.
//!
//! ringlet's pod cgroups carry no limits of their own (containers get theirs through the runtime),
//! so a resize only updates containers: there is no pod cgroup to raise first or lower last.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ringlet_proto::runtime::v1 as cri;

use super::KubeGenericRuntimeManager;
use super::changes::ContainerToKill;
use super::container::{CfsQuota, ContainerResources, linux_resources};
use super::sync::{failure, pod_name, pod_uid, step};
use crate::cm::{parse_quantity, qos_class};
use crate::container::{
    ContainerId, ContainerState, PodResize, PodStatus, PodSyncResult, PodUid, SyncAction,
};

/// The `PodResizePending` reason of a resize the node can never take.
pub const INFEASIBLE: &str = "Infeasible";

/// What the cgroup settings of a container are computed from besides its resources.
#[derive(Clone, Copy, Debug)]
pub struct LinuxParams {
    pub cpu_cfs_quota: CfsQuota,
    pub memory_capacity_bytes: u64,
}

/// New cgroup settings for one running container.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerUpdate {
    pub id: ContainerId,
    pub name: String,
    /// The spec's resources, recorded as actuated once applied.
    pub resources: ResourceRequirements,
    /// `None` when the new resources make the same cgroup settings (e.g. `2m` → `1m` of CPU, both
    /// the minimum shares): nothing to ask the runtime, only the record changes.
    pub linux: Option<cri::LinuxContainerResources>,
    /// Whether a cgroup setting goes down (applied before the ones that go up).
    pub decreases: bool,
}

/// What a sync does about the pod's resources.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResizePlan {
    pub updates: Vec<ContainerUpdate>,
    /// Running app containers to restart for their resize policy, with their index in
    /// `spec.containers`.
    pub restarts: Vec<(usize, ContainerToKill)>,
    /// The `PodResizePending` reason and message when the node cannot take the new requests.
    pub pending: Option<(String, String)>,
}

/// Per pod, the resources each of its running containers was given (the kubelet's actuated
/// resources); a clone shares the record.
#[derive(Clone, Debug, Default)]
pub struct Resizes {
    pods: Arc<Mutex<HashMap<PodUid, PodResize>>>,
}

impl Resizes {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<PodUid, PodResize>) -> T) -> T {
        f(&mut self.pods.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn get(&self, uid: &PodUid) -> Option<PodResize> {
        self.with(|pods| pods.get(uid).cloned())
    }

    /// A container was created with `resources`.
    pub fn record(&self, uid: &PodUid, id: ContainerId, resources: ResourceRequirements) {
        self.with(|pods| {
            pods.entry(uid.clone())
                .or_default()
                .actuated
                .insert(id, resources);
        });
    }

    /// Records what a sync's resize came to: the containers updated, why the rest waits, the error
    /// of the attempt; containers the runtime no longer reports are dropped.
    pub fn settle(
        &self,
        uid: &PodUid,
        status: &PodStatus,
        applied: Vec<(ContainerId, ResourceRequirements)>,
        pending: Option<(String, String)>,
        error: Option<String>,
    ) {
        self.with(|pods| {
            let record = pods.entry(uid.clone()).or_default();
            record
                .actuated
                .retain(|id, _| status.containers.iter().any(|c| &c.id == id));
            record.actuated.extend(applied);
            record.pending = pending;
            record.error = error;
        });
    }

    pub fn forget(&self, uid: &PodUid) {
        self.with(|pods| pods.remove(uid));
    }
}

/// The containers of a pod that may run beside the app containers: init containers (while they
/// run) and app containers, each with its index among the app containers, if it is one.
fn resizable(pod: &Pod) -> impl Iterator<Item = (Option<usize>, &Container)> {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|c| (None, c));
    let app = spec
        .map_or(&[][..], |s| s.containers.as_slice())
        .iter()
        .enumerate()
        .map(|(i, c)| (Some(i), c));
    init.chain(app)
}

fn resource_policy<'c>(container: &'c Container, resource: &str) -> &'c str {
    container
        .resize_policy
        .iter()
        .flatten()
        .find(|p| p.resource_name == resource)
        .map_or("NotRequired", |p| p.restart_policy.as_str())
}

fn settings_of(
    pod: &Pod,
    container: &Container,
    resources: &ResourceRequirements,
    params: LinuxParams,
) -> Option<cri::LinuxContainerResources> {
    let with = Container {
        resources: Some(resources.clone()),
        ..container.clone()
    };
    let parsed = ContainerResources::of(&with).ok()?;
    Some(linux_resources(
        &parsed,
        qos_class(pod),
        params.cpu_cfs_quota,
        params.memory_capacity_bytes,
    ))
}

fn cpu_differs(a: &cri::LinuxContainerResources, b: &cri::LinuxContainerResources) -> bool {
    (a.cpu_shares, a.cpu_quota, a.cpu_period) != (b.cpu_shares, b.cpu_quota, b.cpu_period)
}

/// A memory limit, 0 (no limit) counting as the largest.
fn memory_limit_order(limit: i64) -> i64 {
    if limit == 0 { i64::MAX } else { limit }
}

fn decreases(from: &cri::LinuxContainerResources, to: &cri::LinuxContainerResources) -> bool {
    let quota = |q: i64| if q <= 0 { i64::MAX } else { q };
    to.cpu_shares < from.cpu_shares
        || quota(to.cpu_quota) < quota(from.cpu_quota)
        || memory_limit_order(to.memory_limit_in_bytes)
            < memory_limit_order(from.memory_limit_in_bytes)
}

/// The sum of a resource's requests over the pod's app containers and the largest of its init
/// containers (the scheduler's effective request), in millicores for CPU and bytes for memory.
fn pod_request(pod: &Pod, resource: &str) -> i128 {
    let unit: i128 = if resource == "cpu" {
        1_000_000
    } else {
        1_000_000_000
    };
    let request = |c: &Container| {
        c.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref().and_then(|m| m.get(resource)))
            .and_then(|q| parse_quantity(&q.0).ok())
            .map_or(0, |nanos| (nanos + unit - 1) / unit)
    };
    let spec = pod.spec.as_ref();
    let app: i128 = spec
        .map_or(&[][..], |s| s.containers.as_slice())
        .iter()
        .map(request)
        .sum();
    let init = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default();
    let sidecars: i128 = init
        .iter()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(request)
        .sum();
    let largest_init = init.iter().map(request).max().unwrap_or(0);
    (app + sidecars).max(largest_init)
}

/// Why the node can never give the pod its new requests (the kubelet's `canResizePod`): more than
/// the node's allocatable CPU or memory.
fn infeasible(pod: &Pod, allocatable: &BTreeMap<String, Quantity>) -> Option<String> {
    let capacity = |resource: &str, unit: i128| {
        allocatable
            .get(resource)
            .and_then(|q| parse_quantity(&q.0).ok())
            .map(|nanos| nanos / unit)
    };
    let memory = pod_request(pod, "memory");
    if let Some(available) = capacity("memory", 1_000_000_000)
        && memory > available
    {
        return Some(format!(
            "Node didn't have enough capacity: memory, requested: {memory}, capacity: {available}"
        ));
    }
    let cpu = pod_request(pod, "cpu");
    if let Some(available) = capacity("cpu", 1_000_000)
        && cpu > available
    {
        return Some(format!(
            "Node didn't have enough capacity: cpu, requested: {cpu}, capacity: {available}"
        ));
    }
    None
}

/// What the sync must do so the running containers get the resources their spec now asks for,
/// given the `record` of what they were given (a container missing from it is left alone).
pub fn plan(
    pod: &Pod,
    status: &PodStatus,
    record: Option<&PodResize>,
    params: LinuxParams,
    allocatable: &BTreeMap<String, Quantity>,
) -> ResizePlan {
    let mut plan = ResizePlan::default();
    let Some(record) = record else {
        return plan;
    };
    let empty = ResourceRequirements::default();
    for (app_index, container) in resizable(pod) {
        let Some(running) = status
            .container(&container.name)
            .filter(|c| c.state == ContainerState::Running)
        else {
            continue;
        };
        let Some(actuated) = record.actuated.get(&running.id) else {
            continue;
        };
        let wanted = container.resources.as_ref().unwrap_or(&empty);
        if actuated == wanted {
            continue;
        }
        let (Some(from), Some(to)) = (
            settings_of(pod, container, actuated, params),
            settings_of(pod, container, wanted, params),
        ) else {
            continue;
        };
        let cpu_changed = cpu_differs(&from, &to);
        let memory_changed = from.memory_limit_in_bytes != to.memory_limit_in_bytes;
        let restart = (cpu_changed && resource_policy(container, "cpu") == "RestartContainer")
            || (memory_changed && resource_policy(container, "memory") == "RestartContainer");
        match app_index {
            Some(index) if restart => plan.restarts.push((
                index,
                ContainerToKill {
                    id: running.id.clone(),
                    name: container.name.clone(),
                    message: format!("Container {} resize requires restart", container.name),
                    probe: None,
                },
            )),
            _ => plan.updates.push(ContainerUpdate {
                id: running.id.clone(),
                name: container.name.clone(),
                resources: wanted.clone(),
                decreases: decreases(&from, &to),
                linux: (cpu_changed || memory_changed).then_some(to),
            }),
        }
    }
    if (!plan.updates.is_empty() || !plan.restarts.is_empty())
        && let Some(message) = infeasible(pod, allocatable)
    {
        return ResizePlan {
            pending: Some((INFEASIBLE.to_owned(), message)),
            ..ResizePlan::default()
        };
    }
    // Lower settings first, so the containers' sum never exceeds both the old and the new one.
    plan.updates.sort_by_key(|u| !u.decreases);
    plan
}

/// Whether two cgroup settings give a container the same CPU and memory.
fn same_settings(a: &cri::LinuxContainerResources, b: &cri::LinuxContainerResources) -> bool {
    !cpu_differs(a, b) && a.memory_limit_in_bytes == b.memory_limit_in_bytes
}

/// Resources that make the given cgroup settings (CPU shares and quota, memory limit): what a
/// container the agent did not start runs with, as far as a resize needs to know.
fn requirements_of(linux: &cri::LinuxContainerResources) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    // Rounded up, so the shares computed back from it are not one short.
    let milli = (linux.cpu_shares * 1000 + 1023) / 1024;
    requests.insert("cpu".to_owned(), Quantity(format!("{milli}m")));
    if linux.cpu_quota > 0 && linux.cpu_period > 0 {
        let milli = linux.cpu_quota * 1000 / linux.cpu_period;
        limits.insert("cpu".to_owned(), Quantity(format!("{milli}m")));
    }
    if linux.memory_limit_in_bytes > 0 {
        let bytes = linux.memory_limit_in_bytes.to_string();
        limits.insert("memory".to_owned(), Quantity(bytes));
    }
    ResourceRequirements {
        requests: Some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    }
}

/// What a running container the agent has no record of (it started before the agent did) was
/// given: its spec's resources when the runtime reports their settings (or reports none), else
/// resources that make the settings it reports, so a resize missed meanwhile is applied.
fn adopted(
    pod: &Pod,
    container: &Container,
    reported: Option<&cri::LinuxContainerResources>,
    params: LinuxParams,
) -> ResourceRequirements {
    let wanted = container.resources.clone().unwrap_or_default();
    match (reported, settings_of(pod, container, &wanted, params)) {
        (Some(reported), Some(settings)) if !same_settings(reported, &settings) => {
            requirements_of(reported)
        }
        _ => wanted,
    }
}

impl KubeGenericRuntimeManager {
    fn linux_params(&self) -> LinuxParams {
        LinuxParams {
            cpu_cfs_quota: self.settings.container.cpu_cfs_quota,
            memory_capacity_bytes: self.settings.memory_capacity_bytes,
        }
    }

    /// Records what the running containers the agent did not start were given, as the runtime
    /// reports it (once per container: after an agent restart).
    async fn adopt_running_containers(&self, pod: &Pod, status: &PodStatus) {
        let uid = pod_uid(pod);
        let record = self.resizes.get(&uid).unwrap_or_default();
        for (_, container) in resizable(pod) {
            let Some(running) = status
                .container(&container.name)
                .filter(|c| c.state == ContainerState::Running)
                .filter(|c| !record.actuated.contains_key(&c.id))
            else {
                continue;
            };
            let reported = match self.cri.container_status(running.id.as_str()).await {
                Ok(s) => s.resources.and_then(|r| r.linux),
                Err(e) => {
                    tracing::debug!(container = %running.id, error = %e, "reading a container's resources");
                    None
                }
            };
            let resources = adopted(pod, container, reported.as_ref(), self.linux_params());
            self.resizes.record(&uid, running.id.clone(), resources);
        }
    }

    /// The resize the pod's spec asks for, given what its running containers were given.
    pub(super) async fn resize_plan(&self, pod: &Pod, status: &PodStatus) -> ResizePlan {
        self.adopt_running_containers(pod, status).await;
        let params = self.linux_params();
        plan(
            pod,
            status,
            self.resizes.get(&pod_uid(pod)).as_ref(),
            params,
            &self.helper.node_allocatable(),
        )
    }

    /// Gives running containers their new cgroup settings, lower ones first (the kubelet's
    /// `doPodResizeAction`), stopping at the first the runtime refuses, and records the outcome.
    pub(super) async fn resize_containers(
        &self,
        pod: &Pod,
        status: &PodStatus,
        plan: &ResizePlan,
        result: &mut PodSyncResult,
    ) {
        let mut applied = Vec::with_capacity(plan.updates.len());
        let mut error = None;
        for update in &plan.updates {
            if let Some(linux) = &update.linux
                && let Err(e) = self
                    .cri
                    .update_container_resources(update.id.as_str(), linux.clone())
                    .await
            {
                error = Some(format!("failed to resize container {:?}: {e}", update.name));
                break;
            }
            applied.push((update.id.clone(), update.resources.clone()));
        }
        if !plan.updates.is_empty() {
            result.results.push(step(
                SyncAction::ResizePodInPlace,
                pod_name(pod),
                error
                    .as_ref()
                    .map(|message| failure("ResizePodInPlaceError", message.clone())),
            ));
        }
        self.resizes
            .settle(&pod_uid(pod), status, applied, plan.pending.clone(), error);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::container::ContainerStatus;
    use k8s_openapi::api::core::v1::{ContainerResizePolicy, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const PARAMS: LinuxParams = LinuxParams {
        cpu_cfs_quota: CfsQuota {
            enforce: true,
            period_us: crate::kuberuntime::container::CPU_PERIOD_US,
        },
        memory_capacity_bytes: 8 << 30,
    };

    fn list(items: &[(&str, &str)]) -> Option<BTreeMap<String, Quantity>> {
        (!items.is_empty()).then(|| {
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned())))
                .collect()
        })
    }

    fn resources(requests: &[(&str, &str)], limits: &[(&str, &str)]) -> ResourceRequirements {
        ResourceRequirements {
            requests: list(requests),
            limits: list(limits),
            ..ResourceRequirements::default()
        }
    }

    fn container(name: &str, r: ResourceRequirements) -> Container {
        Container {
            name: name.to_owned(),
            resources: Some(r),
            ..Container::default()
        }
    }

    fn pod(containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                uid: Some("u1".to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                containers,
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    fn running(name: &str) -> ContainerStatus {
        ContainerStatus::for_test(&format!("id-{name}"), name, ContainerState::Running)
    }

    fn status(names: &[&str]) -> PodStatus {
        PodStatus {
            containers: names.iter().map(|n| running(n)).collect(),
            ..PodStatus::default()
        }
    }

    fn record(entries: &[(&str, ResourceRequirements)]) -> PodResize {
        PodResize {
            actuated: entries
                .iter()
                .map(|(n, r)| (ContainerId::from(format!("id-{n}")), r.clone()))
                .collect(),
            ..PodResize::default()
        }
    }

    fn allocatable() -> BTreeMap<String, Quantity> {
        list(&[("cpu", "2"), ("memory", "4Gi")]).unwrap()
    }

    #[test]
    fn changed_resources_become_new_cgroup_settings_decreases_first() {
        let old = resources(
            &[("cpu", "200m"), ("memory", "100Mi")],
            &[("cpu", "200m"), ("memory", "100Mi")],
        );
        let up = resources(
            &[("cpu", "300m"), ("memory", "200Mi")],
            &[("cpu", "300m"), ("memory", "200Mi")],
        );
        let down = resources(
            &[("cpu", "100m"), ("memory", "50Mi")],
            &[("cpu", "100m"), ("memory", "50Mi")],
        );
        let pod = pod(vec![
            container("c1", up.clone()),
            container("c2", down.clone()),
        ]);
        let plan = plan(
            &pod,
            &status(&["c1", "c2"]),
            Some(&record(&[("c1", old.clone()), ("c2", old)])),
            PARAMS,
            &allocatable(),
        );
        assert_eq!(plan.pending, None);
        assert!(plan.restarts.is_empty());
        let names: Vec<&str> = plan.updates.iter().map(|u| u.name.as_str()).collect();
        assert_eq!(names, ["c2", "c1"]);
        let c1 = plan.updates.iter().find(|u| u.name == "c1").unwrap();
        let linux = c1.linux.as_ref().unwrap();
        assert_eq!(linux.cpu_quota, 30_000);
        assert_eq!(linux.cpu_shares, 307);
        assert_eq!(linux.memory_limit_in_bytes, 200 << 20);
        assert_eq!(c1.resources, up);
    }

    #[test]
    fn equivalent_resources_change_the_record_only_and_unchanged_ones_nothing() {
        let before = resources(&[("cpu", "2m")], &[("cpu", "10m")]);
        let after = resources(&[("cpu", "1m")], &[("cpu", "5m")]);
        let pod = pod(vec![
            container("c1", after.clone()),
            container("c2", before.clone()),
        ]);
        let plan = plan(
            &pod,
            &status(&["c1", "c2"]),
            Some(&record(&[("c1", before.clone()), ("c2", before)])),
            PARAMS,
            &allocatable(),
        );
        assert_eq!(plan.updates.len(), 1);
        assert_eq!(plan.updates[0].name, "c1");
        assert_eq!(plan.updates[0].linux, None);
        assert_eq!(plan.updates[0].resources, after);
    }

    #[test]
    fn without_a_record_or_a_running_container_there_is_nothing_to_do() {
        let pod = pod(vec![container("c1", resources(&[("cpu", "1")], &[]))]);
        let old = resources(&[("cpu", "500m")], &[]);
        assert!(
            plan(&pod, &status(&["c1"]), None, PARAMS, &allocatable()) == ResizePlan::default()
        );
        let mut exited = status(&["c1"]);
        exited.containers[0].state = ContainerState::Exited;
        assert!(
            plan(
                &pod,
                &exited,
                Some(&record(&[("c1", old)])),
                PARAMS,
                &allocatable()
            ) == ResizePlan::default()
        );
    }

    #[test]
    fn the_restart_container_policy_restarts_for_its_resource_only() {
        let mut c = container(
            "c1",
            resources(&[("memory", "200Mi")], &[("memory", "200Mi"), ("cpu", "1")]),
        );
        c.resize_policy = Some(vec![ContainerResizePolicy {
            resource_name: "memory".to_owned(),
            restart_policy: "RestartContainer".to_owned(),
        }]);
        let pod = pod(vec![c]);
        let memory_change = resources(&[("memory", "100Mi")], &[("memory", "100Mi"), ("cpu", "1")]);
        let plan_memory = plan(
            &pod,
            &status(&["c1"]),
            Some(&record(&[("c1", memory_change)])),
            PARAMS,
            &allocatable(),
        );
        assert!(plan_memory.updates.is_empty());
        assert_eq!(plan_memory.restarts.len(), 1);
        assert_eq!(plan_memory.restarts[0].0, 0);
        assert_eq!(
            plan_memory.restarts[0].1.message,
            "Container c1 resize requires restart"
        );
        let cpu_change = resources(&[("memory", "200Mi")], &[("memory", "200Mi"), ("cpu", "2")]);
        let plan_cpu = plan(
            &pod,
            &status(&["c1"]),
            Some(&record(&[("c1", cpu_change)])),
            PARAMS,
            &allocatable(),
        );
        assert!(plan_cpu.restarts.is_empty());
        assert_eq!(plan_cpu.updates.len(), 1);
    }

    #[test]
    fn requests_beyond_the_nodes_allocatable_are_infeasible() {
        let old = resources(&[("cpu", "1")], &[]);
        let pod = pod(vec![container("c1", resources(&[("cpu", "3")], &[]))]);
        let plan = plan(
            &pod,
            &status(&["c1"]),
            Some(&record(&[("c1", old)])),
            PARAMS,
            &allocatable(),
        );
        assert!(plan.updates.is_empty());
        assert_eq!(
            plan.pending,
            Some((
                INFEASIBLE.to_owned(),
                "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000".to_owned()
            ))
        );
    }

    #[test]
    fn an_adopted_container_runs_with_its_spec_unless_the_runtime_says_otherwise() {
        let wanted = resources(&[("cpu", "250m")], &[("cpu", "500m"), ("memory", "64Mi")]);
        let c = container("c1", wanted.clone());
        let pod = pod(vec![c.clone()]);
        let settings = settings_of(&pod, &c, &wanted, PARAMS).unwrap();
        assert_eq!(adopted(&pod, &c, Some(&settings), PARAMS), wanted);
        assert_eq!(adopted(&pod, &c, None, PARAMS), wanted);

        let old = resources(&[("cpu", "100m")], &[("cpu", "200m"), ("memory", "32Mi")]);
        let reported = settings_of(&pod, &c, &old, PARAMS).unwrap();
        let got = adopted(&pod, &c, Some(&reported), PARAMS);
        assert!(same_settings(
            &settings_of(&pod, &c, &got, PARAMS).unwrap(),
            &reported
        ));
        let plan = plan(
            &pod,
            &status(&["c1"]),
            Some(&record(&[("c1", got)])),
            PARAMS,
            &allocatable(),
        );
        assert_eq!(plan.updates.len(), 1);
        assert_eq!(plan.updates[0].linux.as_ref(), Some(&settings));
    }

    #[test]
    fn the_record_keeps_what_was_applied_to_live_containers() {
        let resizes = Resizes::default();
        let uid = PodUid::from("u1");
        let old = resources(&[("cpu", "1")], &[]);
        let new = resources(&[("cpu", "2")], &[]);
        resizes.record(&uid, ContainerId::from("id-c1"), old.clone());
        resizes.record(&uid, ContainerId::from("id-gone"), old);
        resizes.settle(
            &uid,
            &status(&["c1"]),
            vec![(ContainerId::from("id-c1"), new.clone())],
            None,
            Some("boom".to_owned()),
        );
        let got = resizes.get(&uid).unwrap();
        assert_eq!(got.actuated.len(), 1);
        assert_eq!(got.actuated[&ContainerId::from("id-c1")], new);
        assert_eq!(got.error.as_deref(), Some("boom"));
        resizes.forget(&uid);
        assert_eq!(resizes.get(&uid), None);
    }
}
