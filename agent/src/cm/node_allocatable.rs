//! Node allocatable enforcement (the kubelet's `pkg/kubelet/cm/node_container_manager_linux.go`):
//! the pods' top cgroup (`kubepods`) gets the node's capacity, less `systemReserved` and
//! `kubeReserved` when `enforceNodeAllocatable` has `pods`, as its memory limit, CPU shares and
//! process limit; `systemReservedCgroup` and `kubeReservedCgroup` get their reservations when it
//! has `system-reserved` / `kube-reserved` (only the CPU shares with the `-compressible` keys).
//! Hard eviction thresholds only come off the allocatable the node reports, not off these limits,
//! as in the kubelet; they count in the check that reservations fit the capacity.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::CmError;
use super::pod_container_manager::PodContainerManager;
use super::qos::parse_quantity;
use super::resource_config::{ResourceConfig, milli_cpu_to_shares};
use crate::apis::config::{
    ENFORCE_KUBE_RESERVED, ENFORCE_KUBE_RESERVED_COMPRESSIBLE, ENFORCE_PODS,
    ENFORCE_SYSTEM_RESERVED, ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE, KubeletConfiguration,
};
use crate::events::{EventObject, EventType, Recorder};
use crate::nodestatus::MachineInfo;

/// The reservation key of process IDs (the kubelet's `pidlimit.PIDs`).
const PID: &str = "pid";
/// The kernel's system-wide task limits; the smaller one is the node's process capacity.
const TASK_LIMIT_FILES: [&str; 2] = ["/proc/sys/kernel/pid_max", "/proc/sys/kernel/threads-max"];
/// How long to wait before trying the pods' limits again (the kubelet's retry period).
const RETRY: Duration = Duration::from_mins(1);
const ENFORCED: &str = "NodeAllocatableEnforced";
const FAILED: &str = "FailedNodeAllocatableEnforcement";
const NANOS: i128 = 1_000_000_000;

/// The node resources a cgroup limit is made of; `None` when not known or not listed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeResources {
    pub cpu_milli: Option<i64>,
    pub memory_bytes: Option<i64>,
    pub pids: Option<i64>,
}

impl NodeResources {
    /// The machine's capacity: its CPUs, its memory and the kernel's task limit.
    pub fn of_machine(machine: &MachineInfo) -> Self {
        Self {
            cpu_milli: Some(i64::from(machine.num_cores) * 1000),
            memory_bytes: Some(i64::try_from(machine.memory_capacity_bytes).unwrap_or(i64::MAX)),
            pids: task_capacity(),
        }
    }

    /// The `cpu`, `memory` and `pid` entries of a reservation (`systemReserved`, `kubeReserved`),
    /// rounded up as the kubelet's `MilliValue` and `Value` do; other resources are not cgroup
    /// limits and are ignored here.
    pub fn from_list(list: &BTreeMap<String, String>) -> Result<Self, CmError> {
        let read = |name: &str, per_unit: i128| -> Result<Option<i64>, CmError> {
            let Some(value) = list.get(name) else {
                return Ok(None);
            };
            let nanos = parse_quantity(value)?;
            let units = nanos.div_euclid(per_unit) + i128::from(nanos.rem_euclid(per_unit) != 0);
            Ok(Some(i64::try_from(units).unwrap_or(i64::MAX)))
        };
        Ok(Self {
            cpu_milli: read("cpu", NANOS / 1000)?,
            memory_bytes: read("memory", NANOS)?,
            pids: read(PID, NANOS)?,
        })
    }

    /// This capacity less the reservations, never below zero; a resource the capacity does not
    /// have stays unknown.
    #[must_use]
    pub fn less(&self, reserved: &[Self]) -> Self {
        let minus = |capacity: Option<i64>, pick: fn(&Self) -> Option<i64>| {
            capacity.map(|capacity| {
                let taken: i64 = reserved.iter().filter_map(pick).sum();
                capacity.saturating_sub(taken).max(0)
            })
        };
        Self {
            cpu_milli: minus(self.cpu_milli, |r| r.cpu_milli),
            memory_bytes: minus(self.memory_bytes, |r| r.memory_bytes),
            pids: minus(self.pids, |r| r.pids),
        }
    }

    /// The cgroup settings that hold a cgroup to these resources (the kubelet's
    /// `getCgroupConfig`): CPU shares only when `compressible_only`.
    pub fn cgroup_config(&self, compressible_only: bool) -> ResourceConfig {
        let cpu_shares = self.cpu_milli.map(milli_cpu_to_shares);
        if compressible_only {
            return ResourceConfig {
                cpu_shares,
                ..ResourceConfig::default()
            };
        }
        ResourceConfig {
            cpu_shares,
            memory_bytes: self.memory_bytes,
            pids_max: self.pids,
        }
    }
}

/// Whose reservation a reserved cgroup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    System,
    Kube,
}

impl Reservation {
    /// As the kubelet's event messages name it, in lower and in title case.
    fn label(self) -> (&'static str, &'static str) {
        match self {
            Self::System => ("system reserved", "System Reserved"),
            Self::Kube => ("kube reserved", "Kube Reserved"),
        }
    }
}

/// A reserved cgroup and the settings it gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservedCgroup {
    pub reservation: Reservation,
    /// `systemReservedCgroup` or `kubeReservedCgroup`, as configured.
    pub cgroup: String,
    pub config: ResourceConfig,
    pub compressible_only: bool,
}

/// What enforcing node allocatable writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAllocatablePlan {
    /// The settings of the pods' top cgroup (`None` without `cgroupsPerQOS`).
    pub pods: Option<ResourceConfig>,
    pub reserved: Vec<ReservedCgroup>,
}

impl NodeAllocatablePlan {
    /// The plan for `config` on a node with `capacity`; a reservation larger than the capacity is
    /// an error, as in the kubelet's `validateNodeAllocatable`.
    pub fn new(config: &KubeletConfiguration, capacity: &NodeResources) -> Result<Self, CmError> {
        let system = NodeResources::from_list(&config.node.system_reserved)?;
        let kube = NodeResources::from_list(&config.node.kube_reserved)?;
        let eviction_memory = hard_eviction_memory(&config.node.eviction_hard, capacity)?;
        validate_reservation(capacity, &[system, kube], eviction_memory)?;

        let resources = &config.resources;
        let pods = config.cgroups_per_qos.then(|| {
            let limits = if resources.enforces(ENFORCE_PODS) {
                capacity.less(&[system, kube])
            } else {
                // The pods' cgroup gets the node's capacity anyway: a new cgroup's default CPU
                // shares are low enough to starve pods.
                *capacity
            };
            limits.cgroup_config(false)
        });
        let mut reserved = Vec::new();
        for (reservation, cgroup, resources_of, full, compressible) in [
            (
                Reservation::System,
                &resources.system_reserved_cgroup,
                system,
                ENFORCE_SYSTEM_RESERVED,
                ENFORCE_SYSTEM_RESERVED_COMPRESSIBLE,
            ),
            (
                Reservation::Kube,
                &resources.kube_reserved_cgroup,
                kube,
                ENFORCE_KUBE_RESERVED,
                ENFORCE_KUBE_RESERVED_COMPRESSIBLE,
            ),
        ] {
            for (key, compressible_only) in [(full, false), (compressible, true)] {
                if resources.enforces(key) {
                    reserved.push(ReservedCgroup {
                        reservation,
                        cgroup: cgroup.clone(),
                        config: resources_of.cgroup_config(compressible_only),
                        compressible_only,
                    });
                }
            }
        }
        Ok(Self { pods, reserved })
    }
}

/// The memory a hard `memory.available` threshold keeps back: its quantity, or its percentage of
/// the node's memory.
fn hard_eviction_memory(
    eviction_hard: &BTreeMap<String, String>,
    capacity: &NodeResources,
) -> Result<i64, CmError> {
    let Some(threshold) = eviction_hard.get("memory.available") else {
        return Ok(0);
    };
    if let Some(percent) = threshold.strip_suffix('%') {
        let percent: f64 = percent.parse().map_err(|_| CmError::InvalidQuantity {
            value: threshold.clone(),
        })?;
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_precision_loss,
            reason = "a share of the node's memory, far below 2^53 bytes"
        )]
        return Ok((capacity.memory_bytes.unwrap_or(0) as f64 * percent / 100.0) as i64);
    }
    let nanos = parse_quantity(threshold)?;
    Ok(i64::try_from(nanos.div_euclid(NANOS)).unwrap_or(i64::MAX))
}

/// Refuses reservations (with the hard eviction threshold on memory) beyond the node's capacity,
/// naming each resource as the kubelet does.
fn validate_reservation(
    capacity: &NodeResources,
    reserved: &[NodeResources],
    eviction_memory: i64,
) -> Result<(), CmError> {
    let mut problems = Vec::new();
    let sum =
        |pick: fn(&NodeResources) -> Option<i64>| -> i64 { reserved.iter().filter_map(pick).sum() };
    let cpu = sum(|r| r.cpu_milli);
    if let Some(have) = capacity.cpu_milli
        && cpu > have
    {
        problems.push(format!(
            "Resource \"cpu\" has a reservation of {cpu}m but capacity of {have}m. Expected capacity >= reservation."
        ));
    }
    let memory = sum(|r| r.memory_bytes).saturating_add(eviction_memory);
    if let Some(have) = capacity.memory_bytes
        && memory > have
    {
        problems.push(format!(
            "Resource \"memory\" has a reservation of {memory} but capacity of {have}. Expected capacity >= reservation."
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CmError::InvalidNodeAllocatable {
            problems: problems.join(" "),
        })
    }
}

/// The node's process capacity: the smaller of `kernel.pid_max` and `kernel.threads-max`, `None`
/// when either cannot be read (as the kubelet then leaves `pids.max` alone).
fn task_capacity() -> Option<i64> {
    TASK_LIMIT_FILES
        .iter()
        .map(|file| read_number(Path::new(file)))
        .try_fold(i64::MAX, |least, value| value.map(|v| least.min(v)))
}

fn read_number(path: &Path) -> Option<i64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Enforces node allocatable at start: the reserved cgroups at once (a failure stops the agent,
/// as it stops the kubelet), then the pods' cgroup in the background, retried every minute while
/// it fails (pods may use more memory than the new limit until evictions bring them under it).
/// Each outcome is an event on the node.
pub async fn enforce_node_allocatable(
    manager: Arc<PodContainerManager>,
    plan: NodeAllocatablePlan,
    recorder: Recorder,
    node_name: String,
) -> Result<(), CmError> {
    for reserved in plan.reserved {
        let (cgroups, name, config) = (
            Arc::clone(&manager),
            reserved.cgroup.clone(),
            reserved.config,
        );
        let result = tokio::task::spawn_blocking(move || cgroups.enforce_existing(&name, &config))
            .await
            .unwrap_or_else(|e| Err(CmError::Join(e.to_string())));
        let compressible = if reserved.compressible_only {
            " Compressible"
        } else {
            ""
        };
        let (label, title) = reserved.reservation.label();
        if let Err(err) = result {
            let message = format!(
                "Failed to enforce {title}{compressible} Cgroup Limits on {:?}: {}",
                reserved.cgroup,
                crate::error_chain::error_chain(&err)
            );
            recorder.event(
                EventType::Warning,
                EventObject::node(&node_name),
                FAILED,
                message,
            );
            return Err(err);
        }
        recorder.event(
            EventType::Normal,
            EventObject::node(&node_name),
            ENFORCED,
            format!("Updated limits on {label} cgroup {}", reserved.cgroup),
        );
    }
    if let Some(config) = plan.pods {
        tokio::spawn(enforce_pods(manager, config, recorder, node_name));
    }
    Ok(())
}

async fn enforce_pods(
    manager: Arc<PodContainerManager>,
    config: ResourceConfig,
    recorder: Recorder,
    node_name: String,
) {
    loop {
        let cgroups = Arc::clone(&manager);
        let result = tokio::task::spawn_blocking(move || cgroups.enforce_pods_cgroup(&config))
            .await
            .unwrap_or_else(|e| Err(CmError::Join(e.to_string())));
        match result {
            Ok(()) => {
                recorder.event(
                    EventType::Normal,
                    EventObject::node(&node_name),
                    ENFORCED,
                    "Updated Node Allocatable limit across pods",
                );
                return;
            }
            Err(err) => recorder.event(
                EventType::Warning,
                EventObject::node(&node_name),
                FAILED,
                format!(
                    "Failed to update Node Allocatable Limits {:?}: {}",
                    manager.pods_cgroup_path(),
                    crate::error_chain::error_chain(&err)
                ),
            ),
        }
        tokio::time::sleep(RETRY).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apis::config::ResourceSettings;

    const GI: i64 = 1 << 30;

    fn list(entries: &[(&str, &str)]) -> BTreeMap<String, String> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn capacity() -> NodeResources {
        NodeResources {
            cpu_milli: Some(4000),
            memory_bytes: Some(16 * GI),
            pids: Some(32_768),
        }
    }

    fn config(
        system: &[(&str, &str)],
        kube: &[(&str, &str)],
        enforce: &[&str],
    ) -> KubeletConfiguration {
        let mut config = KubeletConfiguration::default();
        config.node.system_reserved = list(system);
        config.node.kube_reserved = list(kube);
        config.resources = ResourceSettings {
            enforce_node_allocatable: enforce.iter().map(|k| (*k).to_owned()).collect(),
            system_reserved_cgroup: "/system.slice".to_owned(),
            kube_reserved_cgroup: "/kube.slice".to_owned(),
            ..ResourceSettings::default()
        };
        config
    }

    #[test]
    fn reservations_read_cpu_memory_and_pids_rounded_up() {
        let reserved = NodeResources::from_list(&list(&[
            ("cpu", "500m"),
            ("memory", "1.5Gi"),
            ("pid", "1000"),
            ("ephemeral-storage", "1Gi"),
        ]))
        .unwrap();
        assert_eq!(
            reserved,
            NodeResources {
                cpu_milli: Some(500),
                memory_bytes: Some(3 * GI / 2),
                pids: Some(1000),
            }
        );
        let tiny = NodeResources::from_list(&list(&[("cpu", "0.1m"), ("memory", "1.5")])).unwrap();
        assert_eq!(tiny.cpu_milli, Some(1));
        assert_eq!(tiny.memory_bytes, Some(2));
        assert!(matches!(
            NodeResources::from_list(&list(&[("cpu", "lots")])),
            Err(CmError::InvalidQuantity { .. })
        ));
    }

    #[test]
    fn enforcing_pods_limits_kubepods_to_capacity_less_reservations() {
        let plan = NodeAllocatablePlan::new(
            &config(
                &[("cpu", "500m"), ("memory", "1Gi"), ("pid", "1000")],
                &[("cpu", "250m"), ("memory", "512Mi")],
                &["pods"],
            ),
            &capacity(),
        )
        .unwrap();
        // Not the hard eviction threshold: it only comes off the reported allocatable.
        assert_eq!(
            plan.pods,
            Some(ResourceConfig {
                cpu_shares: Some(3250 * 1024 / 1000),
                memory_bytes: Some(16 * GI - GI - GI / 2),
                pids_max: Some(31_768),
            })
        );
        assert!(plan.reserved.is_empty());
    }

    #[test]
    fn without_pods_enforcement_kubepods_gets_the_whole_capacity() {
        for enforce in [&[][..], &["none"]] {
            let plan =
                NodeAllocatablePlan::new(&config(&[("memory", "1Gi")], &[], enforce), &capacity())
                    .unwrap();
            assert_eq!(
                plan.pods,
                Some(ResourceConfig {
                    cpu_shares: Some(4096),
                    memory_bytes: Some(16 * GI),
                    pids_max: Some(32_768),
                })
            );
        }
        let mut no_qos = config(&[], &[], &[]);
        no_qos.cgroups_per_qos = false;
        assert_eq!(
            NodeAllocatablePlan::new(&no_qos, &capacity()).unwrap().pods,
            None
        );
        // An unknown process capacity leaves pids.max alone.
        let plan = NodeAllocatablePlan::new(
            &config(&[], &[], &["pods"]),
            &NodeResources {
                pids: None,
                ..capacity()
            },
        )
        .unwrap();
        assert_eq!(plan.pods.unwrap().pids_max, None);
    }

    #[test]
    fn reserved_cgroups_get_their_reservation() {
        let plan = NodeAllocatablePlan::new(
            &config(
                &[("cpu", "1"), ("memory", "2Gi")],
                &[("cpu", "500m"), ("memory", "1Gi"), ("pid", "100")],
                &["pods", "system-reserved-compressible", "kube-reserved"],
            ),
            &capacity(),
        )
        .unwrap();
        assert_eq!(
            plan.reserved,
            [
                ReservedCgroup {
                    reservation: Reservation::System,
                    cgroup: "/system.slice".to_owned(),
                    config: ResourceConfig {
                        cpu_shares: Some(1024),
                        ..ResourceConfig::default()
                    },
                    compressible_only: true,
                },
                ReservedCgroup {
                    reservation: Reservation::Kube,
                    cgroup: "/kube.slice".to_owned(),
                    config: ResourceConfig {
                        cpu_shares: Some(512),
                        memory_bytes: Some(GI),
                        pids_max: Some(100),
                    },
                    compressible_only: false,
                },
            ]
        );
    }

    #[test]
    fn reservations_beyond_capacity_are_refused() {
        let err = NodeAllocatablePlan::new(
            &config(&[("cpu", "3")], &[("cpu", "1500m")], &["pods"]),
            &capacity(),
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid Node Allocatable configuration. Resource \"cpu\" has a reservation of 4500m \
             but capacity of 4000m. Expected capacity >= reservation."
        );
        // The hard eviction threshold counts here: 15.5Gi reserved + 10% of 16Gi > 16Gi.
        let mut tight = config(&[("memory", "15Gi")], &[("memory", "512Mi")], &["pods"]);
        tight
            .node
            .eviction_hard
            .insert("memory.available".to_owned(), "10%".to_owned());
        let err = NodeAllocatablePlan::new(&tight, &capacity()).unwrap_err();
        assert!(
            err.to_string()
                .contains("Resource \"memory\" has a reservation of"),
            "{err}"
        );
        // The default 100Mi threshold fits next to 15.5Gi.
        tight
            .node
            .eviction_hard
            .insert("memory.available".to_owned(), "100Mi".to_owned());
        assert!(NodeAllocatablePlan::new(&tight, &capacity()).is_ok());
    }

    #[test]
    fn the_task_capacity_is_the_smaller_kernel_limit() {
        let capacity = task_capacity().unwrap();
        for file in TASK_LIMIT_FILES {
            assert!(capacity <= read_number(Path::new(file)).unwrap(), "{file}");
        }
        assert!(capacity > 0);
    }
}
