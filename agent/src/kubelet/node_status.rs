//! The Node object of this agent (the kubelet's `kubelet_node_status.go`: `registerWithAPIServer`,
//! `tryRegisterWithAPIServer`, `updateNodeStatus`, `fastStatusUpdateOnce`): registration, then a
//! status round every `nodeStatusUpdateFrequency`, posted as a strategic-merge patch when something
//! changed and every `nodeStatusReportFrequency` otherwise.
//!
//! The current Node is published on a watch channel for the rest of the agent (admission reads its
//! allocatable, labels and taints; mirror pods and the lease name its UID). Without an API server
//! the Node is only computed, so admission works the same in standalone mode. Everything here runs
//! in its own task; an API server that is slow or away delays only this task.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeStatus, Taint};
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;

use super::RuntimeState;
use crate::apis::config::NodeSettings;
use crate::apiserver::{ApiClient, is_already_exists, is_not_found};
use crate::container::Runtime;
use crate::events::{EventObject, EventType, Recorder};
use crate::eviction::{EvictionHandle, PressureCondition};
use crate::nodeshutdown::NodeShutdownHandle;
use crate::nodestatus::{
    self, MachineInfo, NodeFacts, NodeHealth, StatusUpdate, initial_node, node_status_patch,
    reconcile_existing, status_changed,
};
use crate::pleg::PlegHandle;
use crate::status::wall_clock_now;

/// The version reported as `kubeletVersion`: the API level ringlet implements, so the API server and
/// kubectl treat the node as a current kubelet; ringlet's own version follows after `-ringlet.`.
pub const KUBELET_VERSION: &str = concat!("v1.36.0-ringlet.", env!("CARGO_PKG_VERSION"));
/// How often the status is computed while the node is not Ready yet after a start, so it turns
/// Ready within a second of being ready (the kubelet's fast status update).
const FAST_UPDATE_PERIOD: Duration = Duration::from_secs(1);
/// Registration retries back off from this…
const REGISTER_BACKOFF_START: Duration = Duration::from_millis(100);
/// …to this (the kubelet's 7 s).
const REGISTER_BACKOFF_MAX: Duration = Duration::from_secs(7);

/// What the node status needs from the configuration.
#[derive(Clone, Debug)]
pub struct NodeStatusSettings {
    pub node_name: String,
    pub hostname: String,
    /// `--node-ip`; empty to detect.
    pub node_ips: Vec<IpAddr>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub node: NodeSettings,
    pub max_pods: u32,
    pub pods_per_core: u32,
    pub kubelet_port: u16,
    pub root_dir: PathBuf,
}

impl NodeStatusSettings {
    /// The node's primary address: the first `--node-ip`, else the default route's address.
    pub fn host_ip(&self) -> IpAddr {
        self.node_ips
            .first()
            .copied()
            .unwrap_or_else(super::node_ip)
    }
}

/// Computes, registers and reports the Node; see the module docs.
pub struct NodeStatusManager {
    settings: NodeStatusSettings,
    client: Option<ApiClient>,
    runtime: Arc<dyn Runtime>,
    runtime_state: RuntimeState,
    pleg: PlegHandle,
    recorder: Recorder,
    published: watch::Sender<Option<Node>>,
    /// The pressure conditions; a change is reported at once rather than at the next round.
    evictions: EvictionHandle,
    /// A shutting-down node is not ready; reported at once too (the kubelet's `syncNodeStatus`
    /// on a shutdown event).
    shutdown: NodeShutdownHandle,
}

impl NodeStatusManager {
    /// The manager; it publishes the current Node on `published`.
    // One handle per part of the agent the status reports on.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: NodeStatusSettings,
        client: Option<ApiClient>,
        runtime: Arc<dyn Runtime>,
        runtime_state: RuntimeState,
        pleg: PlegHandle,
        recorder: Recorder,
        published: watch::Sender<Option<Node>>,
        evictions: EvictionHandle,
        shutdown: NodeShutdownHandle,
    ) -> Self {
        Self {
            settings,
            client,
            runtime,
            runtime_state,
            pleg,
            recorder,
            published,
            evictions,
            shutdown,
        }
    }

    pub async fn run(self) {
        self.recorder.event(
            EventType::Normal,
            EventObject::node(&self.settings.node_name),
            "Starting",
            "Starting kubelet.",
        );
        let machine = loop {
            match tokio::task::spawn_blocking(nodestatus::read_machine_info).await {
                Ok(Ok(machine)) => break machine,
                Ok(Err(err)) => tracing::warn!(
                    "cannot read the machine's facts for the node status, retrying: {}",
                    crate::error_chain::error_chain(&err)
                ),
                Err(err) => tracing::warn!("reading the machine's facts failed: {err}"),
            }
            tokio::time::sleep(REGISTER_BACKOFF_MAX).await;
        };
        let mut round = Round {
            manager: &self,
            machine: &machine,
        };
        let mut node = match &self.client {
            Some(client) => round.register(client).await,
            None => round.initial().await,
        };
        self.published.send_replace(Some(node.clone()));
        let mut last_report = Instant::now();
        let mut pressure = self.evictions.subscribe();
        let mut shutting_down = self.shutdown.subscribe();
        loop {
            let period = if is_ready(&node) {
                self.settings.node.node_status_update_frequency
            } else {
                FAST_UPDATE_PERIOD
            };
            tokio::select! {
                () = tokio::time::sleep(period) => {}
                Ok(()) = pressure.changed() => {}
                Ok(()) = shutting_down.changed() => {}
            }
            let mut updated = node.clone();
            round.set_status(&mut updated).await;
            let Some(client) = &self.client else {
                node = updated;
                self.published.send_replace(Some(node.clone()));
                continue;
            };
            let empty = NodeStatus::default();
            let changed = status_changed(
                node.status.as_ref().unwrap_or(&empty),
                updated.status.as_ref().unwrap_or(&empty),
            );
            let report_due =
                last_report.elapsed() >= self.settings.node.node_status_report_frequency;
            if !changed && !report_due {
                continue;
            }
            match round.patch(client, &node, &updated).await {
                Some(posted) => {
                    node = posted;
                    last_report = Instant::now();
                    self.published.send_replace(Some(node.clone()));
                }
                None => {
                    // The Node vanished (deleted by an operator): register it again.
                    if round.node_is_gone(client).await {
                        node = round.register(client).await;
                        self.published.send_replace(Some(node.clone()));
                    }
                }
            }
        }
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// One status computation's context.
struct Round<'a> {
    manager: &'a NodeStatusManager,
    machine: &'a MachineInfo,
}

impl Round<'_> {
    fn settings(&self) -> &NodeStatusSettings {
        &self.manager.settings
    }

    fn node_object(&self) -> EventObject {
        EventObject::node(&self.settings().node_name)
    }

    /// The Node as it would be registered now.
    async fn initial(&mut self) -> Node {
        let gathered = self.gather().await;
        let taints = &self.settings().taints;
        let (node, update) = initial_node(
            &gathered.facts(self),
            &self.settings().labels,
            taints,
            wall_clock_now(),
        );
        self.report(update);
        node
    }

    /// Creates the Node, or adopts the existing one of the same name; retries until it works.
    async fn register(&mut self, client: &ApiClient) -> Node {
        let name = self.settings().node_name.clone();
        let api: Api<Node> = Api::all(client.client());
        let mut backoff = REGISTER_BACKOFF_START;
        loop {
            let wanted = self.initial().await;
            if self.settings().node.register_node {
                match api.create(&PostParams::default(), &wanted).await {
                    Ok(created) => {
                        tracing::info!(node = %name, "registered the node");
                        self.manager.recorder.event(
                            EventType::Normal,
                            self.node_object(),
                            "RegisteredNode",
                            format!("Node {name} registered with the API server"),
                        );
                        return created;
                    }
                    Err(err) if is_already_exists(&err) => {
                        if let Some(adopted) = self.adopt(client, &wanted).await {
                            return adopted;
                        }
                    }
                    Err(err) => tracing::warn!(
                        "unable to register the node: {}",
                        client.describe(&format!("create node/{name}"), &err)
                    ),
                }
            } else {
                match api.get(&name).await {
                    Ok(existing) => return existing,
                    Err(err) => tracing::warn!(
                        "{} (registerNode is false: the Node must be created by someone else)",
                        client.describe(&format!("get node/{name}"), &err)
                    ),
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(REGISTER_BACKOFF_MAX);
        }
    }

    /// Takes over an existing Node of this name (the agent restarted, or the machine was
    /// reinstalled), reconciling what the kubelet reconciles.
    async fn adopt(&self, client: &ApiClient, wanted: &Node) -> Option<Node> {
        let name = &self.settings().node_name;
        let api: Api<Node> = Api::all(client.client());
        let existing = match api.get(name).await {
            Ok(existing) => existing,
            Err(err) => {
                tracing::warn!("{}", client.describe(&format!("get node/{name}"), &err));
                return None;
            }
        };
        let machine_id = |node: &Node| {
            node.status
                .as_ref()
                .and_then(|s| s.node_info.as_ref())
                .map(|i| i.machine_id.clone())
                .filter(|id| !id.is_empty())
        };
        if let (Some(theirs), Some(ours)) = (machine_id(&existing), machine_id(wanted))
            && theirs != ours
        {
            tracing::warn!(
                node = %name,
                "node {name} was registered by another machine (machineID {theirs}, this one is \
                 {ours}); taking it over, as the kubelet does"
            );
        }
        let Some(reconciled) = reconcile_existing(&existing, wanted) else {
            tracing::info!(node = %name, "the node was registered before; using it");
            return Some(existing);
        };
        self.patch(client, &existing, &reconciled).await
    }

    /// Posts `updated` as a strategic-merge patch of `current`; the Node as the API server has it
    /// afterwards, or `None` when the patch failed (logged).
    async fn patch(&self, client: &ApiClient, current: &Node, updated: &Node) -> Option<Node> {
        let name = &self.settings().node_name;
        let body = match node_status_patch(current, updated) {
            Ok(body) => body,
            Err(err) => {
                tracing::warn!("cannot compute the node status patch: {err}");
                return None;
            }
        };
        if body.as_object().is_some_and(serde_json::Map::is_empty) {
            return Some(current.clone());
        }
        let api: Api<Node> = Api::all(client.client());
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
            .await
        {
            Ok(node) => Some(node),
            Err(err) => {
                tracing::warn!(
                    "error updating node status, will retry: {}",
                    client.describe(&format!("patch node/{name} status"), &err)
                );
                None
            }
        }
    }

    async fn node_is_gone(&self, client: &ApiClient) -> bool {
        let api: Api<Node> = Api::all(client.client());
        matches!(api.get(&self.settings().node_name).await, Err(err) if is_not_found(&err))
    }

    async fn set_status(&mut self, node: &mut Node) {
        let gathered = self.gather().await;
        let update = nodestatus::set_node_status(node, &gathered.facts(self), wall_clock_now());
        self.report(update);
    }

    fn report(&self, update: StatusUpdate) {
        for event in update.events {
            self.manager.recorder.event(
                event.event_type,
                self.node_object(),
                event.reason,
                event.message,
            );
        }
        for err in update.errors {
            tracing::warn!(
                "failed to set some node status fields: {}",
                crate::error_chain::error_chain(&err)
            );
        }
    }

    /// The facts that change between rounds, read from the runtime and the host.
    async fn gather(&self) -> Gathered {
        let manager = self.manager;
        let settings = &manager.settings;
        let resolve = {
            let (configured, hostname, name) = (
                settings.node_ips.clone(),
                settings.hostname.clone(),
                settings.node_name.clone(),
            );
            tokio::task::spawn_blocking(move || {
                nodestatus::resolve_node_ips(&configured, &hostname, &name)
            })
        };
        let root_dir = settings.root_dir.clone();
        let storage = tokio::task::spawn_blocking(move || {
            crate::stats::fs_usage(&root_dir).map(|usage| usage.capacity)
        });
        let pressure = manager.evictions.conditions();
        let version = manager.runtime.version().await;
        let images = manager.runtime.list_images().await;
        let node_ips = match resolve.await {
            Ok(Ok(ips)) => ips,
            Ok(Err(err)) => {
                tracing::warn!("{err}");
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        Gathered {
            node_ips,
            storage: storage.await.ok().and_then(Result::ok),
            runtime_version: version
                .unwrap_or_else(|_| manager.runtime_state.unknown_runtime_version()),
            images: images.map_err(|err| err.to_string()),
            health: NodeHealth {
                last_runtime_sync: manager.runtime_state.last_runtime_sync(),
                pleg_error: manager.pleg.healthy().err(),
                runtime_error: manager.runtime_state.runtime_error(),
                network_error: manager.runtime_state.network_error(),
                shutdown_error: manager.shutdown.status(),
                memory_pressure: pressure.contains(&PressureCondition::Memory),
                disk_pressure: pressure.contains(&PressureCondition::Disk),
                pid_pressure: pressure.contains(&PressureCondition::Pid),
            },
        }
    }
}

/// What one round gathered.
struct Gathered {
    node_ips: Vec<IpAddr>,
    storage: Option<u64>,
    runtime_version: String,
    images: Result<Vec<nodestatus::ImageInfo>, String>,
    health: NodeHealth,
}

impl Gathered {
    fn facts<'a>(&'a self, round: &'a Round<'_>) -> NodeFacts<'a> {
        let settings = round.settings();
        NodeFacts {
            node_name: &settings.node_name,
            hostname: &settings.hostname,
            node_ips: &self.node_ips,
            machine: round.machine,
            ephemeral_storage_capacity_bytes: self.storage,
            max_pods: settings.max_pods,
            pods_per_core: settings.pods_per_core,
            system_reserved: &settings.node.system_reserved,
            kube_reserved: &settings.node.kube_reserved,
            eviction_hard: &settings.node.eviction_hard,
            container_runtime_version: &self.runtime_version,
            kubelet_version: KUBELET_VERSION,
            kubelet_port: settings.kubelet_port,
            images: self.images.as_deref().map_err(Clone::clone),
            max_images: settings.node.node_status_max_images,
            health: self.health.clone(),
        }
    }
}
