//! The Node object this agent registers and the status it reports, computed without I/O from facts
//! the caller gathers: the kubelet's `pkg/kubelet/nodestatus` setters, `initialNode`,
//! `tryRegisterWithAPIServer`'s reconciliation and `nodeStatusHasChanged`
//! (`pkg/kubelet/kubelet_node_status.go`), node allocatable (`pkg/kubelet/cm`) and the status patch
//! (`component-helpers` `PatchNodeStatus`).
//!
//! The update loop (API client, timers) lives with its caller: each round it builds [`NodeFacts`],
//! runs [`set_node_status`] on a copy of the Node it read, posts [`node_status_patch`] when
//! [`status_changed`] says so or the report interval ran out, and records the returned events.
//! [`read_machine_info`] and [`resolve_node_ips`] are the two functions here that touch the host.

mod addresses;
mod capacity;
mod conditions;
mod info;
mod machine;
mod patch;
mod quantity;
mod register;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Node, NodeStatus, NodeSystemInfo};
use k8s_openapi::jiff::Timestamp;

pub use crate::container::ImageInfo;
use crate::events::EventType;
use crate::stats::StatsError;

pub use addresses::{NodeIpRejection, resolve_node_ips};
pub use machine::{MachineInfo, read_machine_info};
pub use patch::{STRATEGIC_MERGE_PATCH_CONTENT_TYPE, node_status_patch, status_changed};
pub(crate) use quantity::{QuantityFormat, format_quantity};
pub use register::{initial_node, reconcile_existing};

/// Everything a status round needs besides the Node itself, gathered by the caller.
#[derive(Debug, Clone)]
pub struct NodeFacts<'a> {
    pub node_name: &'a str,
    /// `kubernetes.io/hostname` and the `Hostname` address (`--hostname-override` or the host name).
    pub hostname: &'a str,
    /// The node's addresses from [`resolve_node_ips`]: one, or an IPv4 and an IPv6 one. Empty when
    /// they could not be resolved this round, which leaves `status.addresses` as it was.
    pub node_ips: &'a [IpAddr],
    pub machine: &'a MachineInfo,
    /// Size of the filesystem holding the root directory; `None` until it could be read, which
    /// keeps the node not ready ("missing node capacity").
    pub ephemeral_storage_capacity_bytes: Option<u64>,
    pub max_pods: u32,
    /// `podsPerCore`; 0 leaves pods at `max_pods`.
    pub pods_per_core: u32,
    /// `systemReserved`: resource name -> quantity (`"cpu"` -> `"100m"`).
    pub system_reserved: &'a BTreeMap<String, String>,
    /// `kubeReserved`, like `system_reserved`.
    pub kube_reserved: &'a BTreeMap<String, String>,
    /// `evictionHard`: signal -> threshold (`"memory.available"` -> `"100Mi"`, `"nodefs.available"`
    /// -> `"10%"`).
    pub eviction_hard: &'a BTreeMap<String, String>,
    /// `"<runtime name>://<version>"`, e.g. `"containerd://1.6.20"` (`"<name>://Unknown"` when the
    /// runtime's `Version` call failed).
    pub container_runtime_version: &'a str,
    /// The version reported as `kubeletVersion`, e.g. `"v1.36.2"`.
    pub kubelet_version: &'a str,
    /// The kubelet API port (`daemonEndpoints.kubeletEndpoint.Port`).
    pub kubelet_port: u16,
    /// The runtime's images, in any order, or why listing them failed.
    pub images: Result<&'a [ImageInfo], String>,
    /// `nodeStatusMaxImages`: at most this many images are reported, all of them when -1.
    pub max_images: i32,
    pub health: NodeHealth,
}

/// What decides the node's conditions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHealth {
    /// When the runtime's `Status` last answered with `RuntimeReady` true (the kubelet's
    /// `lastBaseRuntimeSync`); `None` before it ever did. Older than 30 s means the runtime is down.
    pub last_runtime_sync: Option<Timestamp>,
    /// The PLEG health check's failure, e.g. `"pleg was last seen active 3m5s ago; threshold is
    /// 3m0s"` or `"pleg has yet to be successful"`; reported as `"PLEG is not healthy: <it>"`.
    pub pleg_error: Option<String>,
    /// Upstream's text is `"container runtime not ready: RuntimeReady=false reason:<r>
    /// message:<m>"` (`<nil>` in place of the condition when the runtime did not report one).
    pub runtime_error: Option<String>,
    /// Upstream's texts are `"network state unknown"` before the first status check and
    /// `"container runtime network not ready: NetworkReady=false reason:<r> message:<m>"`.
    pub network_error: Option<String>,
    /// `"node is shutting down"` while graceful node shutdown runs (the kubelet's
    /// `ShutdownStatus`).
    pub shutdown_error: Option<String>,
    pub memory_pressure: bool,
    pub disk_pressure: bool,
    pub pid_pressure: bool,
}

/// An event the caller records on the Node (`involvedObject` kind Node, name = node name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    pub event_type: EventType,
    pub reason: &'static str,
    pub message: String,
}

/// What a status round produced besides the status: events to record and the setters' errors,
/// which the kubelet logs ("Failed to set some node status fields") without stopping.
#[derive(Debug, Default)]
pub struct StatusUpdate {
    pub events: Vec<NodeEvent>,
    pub errors: Vec<NodeStatusError>,
}

/// Why part of the node status could not be read or set.
#[derive(Debug, thiserror::Error)]
pub enum NodeStatusError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the machine's memory size")]
    Meminfo(#[source] StatsError),
    #[error("reading {}: expected {what}", path.display())]
    MachineFact { path: PathBuf, what: &'static str },
    #[error("{setting} for {resource} is not a valid quantity: {value:?}")]
    InvalidQuantity {
        setting: &'static str,
        resource: String,
        value: String,
    },
    /// Upstream's text: `failed to validate nodeIP: nodeIP can't be loopback address`.
    #[error("failed to validate {which}: {reason}")]
    InvalidNodeIp {
        which: &'static str,
        reason: NodeIpRejection,
    },
    /// Upstream's text: `can't get ip address of node <name>. error: <cause>`.
    #[error("can't get ip address of node {node}. error: {cause}")]
    NoNodeIp { node: String, cause: String },
    #[error("error getting image list: {0}")]
    ImageList(String),
    #[error("serializing a node for its status patch")]
    Serialize(#[source] serde_json::Error),
}

/// Runs every setter on `node.status` in upstream's order: addresses, machine info (capacity,
/// allocatable), version info, daemon endpoints, images, OS and architecture, then the
/// `MemoryPressure`, `DiskPressure`, `PIDPressure` and `Ready` conditions. Times are whole seconds, as the
/// API stores them.
pub fn set_node_status(node: &mut Node, facts: &NodeFacts<'_>, now: Timestamp) -> StatusUpdate {
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let mut update = StatusUpdate::default();
    addresses::set_addresses(node, facts);
    let status = node.status.get_or_insert_with(NodeStatus::default);
    capacity::set_machine_info(status, facts, &mut update.events, &mut update.errors);
    info::set_version_info(status, facts);
    info::set_daemon_endpoints(status, facts);
    if let Err(err) = info::set_images(status, facts) {
        update.errors.push(err);
    }
    info::set_go_runtime(status, facts);
    conditions::set_conditions(status, facts, now, &mut update.events);
    update
}

/// The status's `nodeInfo`, created empty when missing.
fn node_system_info(status: &mut NodeStatus) -> &mut NodeSystemInfo {
    status.node_info.get_or_insert_with(NodeSystemInfo::default)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn machine() -> MachineInfo {
        MachineInfo {
            num_cores: 4,
            memory_capacity_bytes: 8_029_064 * 1024,
            swap_capacity_bytes: 0,
            hugepages: BTreeMap::from([(2048, 16), (1_048_576, 0)]),
            machine_id: "m-id".to_owned(),
            system_uuid: "s-uuid".to_owned(),
            boot_id: "boot-1".to_owned(),
            kernel_version: "6.1.0-18-amd64".to_owned(),
            os_image: "Debian GNU/Linux 12 (bookworm)".to_owned(),
            architecture: "amd64".to_owned(),
            operating_system: "linux".to_owned(),
        }
    }

    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    static IPS: [IpAddr; 1] = [IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2))];

    /// A healthy node with no reservations, no images and the defaults for the rest.
    pub(crate) fn facts_with(machine: &MachineInfo) -> NodeFacts<'_> {
        NodeFacts {
            node_name: "node-1",
            hostname: "node-1.example",
            node_ips: &IPS,
            machine,
            ephemeral_storage_capacity_bytes: Some(51_474_912 * 1024),
            max_pods: 110,
            pods_per_core: 0,
            system_reserved: &EMPTY,
            kube_reserved: &EMPTY,
            eviction_hard: &EMPTY,
            container_runtime_version: "containerd://1.6.20",
            kubelet_version: "v1.36.2",
            kubelet_port: 10250,
            images: Ok(&[]),
            max_images: 50,
            health: NodeHealth {
                last_runtime_sync: Some(Timestamp::from_second(1_700_000_000).unwrap_or_default()),
                ..NodeHealth::default()
            },
        }
    }

    #[test]
    fn a_full_round_fills_every_part_and_truncates_times() {
        let machine = machine();
        let facts = facts_with(&machine);
        let mut node = Node::default();
        let now = Timestamp::new(1_700_000_010, 600_000_000).unwrap_or_default();
        let update = set_node_status(&mut node, &facts, now);
        assert!(update.errors.is_empty(), "{:?}", update.errors);
        let status = node.status.unwrap();
        let info = status.node_info.unwrap();
        assert_eq!(info.kubelet_version, "v1.36.2");
        assert_eq!(info.container_runtime_version, "containerd://1.6.20");
        assert_eq!(info.architecture, "amd64");
        assert_eq!(
            status
                .daemon_endpoints
                .unwrap()
                .kubelet_endpoint
                .unwrap()
                .port,
            10250
        );
        assert_eq!(status.addresses.unwrap().len(), 2);
        let ready = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .unwrap();
        assert_eq!(ready.status, "True", "{ready:?}");
        assert_eq!(
            ready.last_heartbeat_time.as_ref().unwrap().0,
            Timestamp::from_second(1_700_000_010).unwrap()
        );
    }

    #[test]
    fn a_failed_image_list_is_reported_and_clears_images() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.images = Err("rpc error: unavailable".to_owned());
        let mut node = Node::default();
        let update = set_node_status(&mut node, &facts, Timestamp::UNIX_EPOCH);
        assert_eq!(update.errors.len(), 1);
        assert_eq!(
            update.errors[0].to_string(),
            "error getting image list: rpc error: unavailable"
        );
        assert_eq!(node.status.unwrap().images, None);
    }
}
