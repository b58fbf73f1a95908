//! A [`ServerHost`] for the server's tests: fixed pods and checks, a gate to hold `/pods` in
//! flight, containers registered by path, and a streaming runtime that records what it was asked.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use tokio::sync::oneshot;

use super::{FoundContainer, HealthCheck, HostError, PodRef, ServerHost};
use crate::container::{
    ContainerId, ExecRequest, RuntimeError, SandboxId, StreamOptions, StreamingRuntime,
};
use crate::metrics::Metrics;
use crate::stats::Summary;

/// Makes `pods()` block until the test lets it go, to hold a request in flight.
pub(crate) struct Gate {
    pub(crate) entered: Mutex<Option<oneshot::Sender<()>>>,
    pub(crate) release: Mutex<mpsc::Receiver<()>>,
}

pub(crate) struct FakeHost {
    pub(crate) pods: Vec<Pod>,
    pub(crate) checks: Mutex<Vec<HealthCheck>>,
    pub(crate) gate: Option<Gate>,
    pub(crate) metrics: Metrics,
    /// Containers by `namespace/pod/container`.
    pub(crate) containers: HashMap<String, FoundContainer>,
    pub(crate) node_log_dir: PathBuf,
    pub(crate) streaming: FakeStreaming,
}

impl FakeHost {
    pub(crate) fn new() -> Self {
        Self {
            pods: vec![pod("web", "Running"), pod("db", "Pending")],
            checks: Mutex::new(vec![
                check("ping", Ok(())),
                check("syncloop", Ok(())),
                check("pleg", Ok(())),
            ]),
            gate: None,
            metrics: Metrics::new().unwrap(),
            containers: HashMap::new(),
            node_log_dir: PathBuf::from("/nonexistent"),
            streaming: FakeStreaming::default(),
        }
    }

    /// A host whose pod `default/web-node1` has a running container `main` (id `c1`).
    pub(crate) fn with_running_container() -> Self {
        let mut host = Self::new();
        host.containers.insert(
            "default/web-node1/main".to_owned(),
            FoundContainer {
                id: ContainerId::from("c1"),
                running: true,
            },
        );
        host
    }

    pub(crate) fn fail(&self, name: &'static str, reason: &str) {
        for check in self.checks.lock().unwrap().iter_mut() {
            if check.name == name {
                check.result = Err(reason.to_owned());
            }
        }
    }
}

#[async_trait]
impl ServerHost for FakeHost {
    fn pod_list_json(&self) -> serde_json::Result<Vec<u8>> {
        if let Some(gate) = &self.gate {
            if let Some(entered) = gate.entered.lock().unwrap().take() {
                entered.send(()).unwrap();
            }
            gate.release.lock().unwrap().recv().unwrap();
        }
        serde_json::to_vec(&List {
            items: self.pods.clone(),
            metadata: ListMeta::default(),
        })
    }

    fn health_checks(&self) -> Vec<HealthCheck> {
        self.checks.lock().unwrap().clone()
    }

    fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn configz(&self) -> serde_json::Value {
        serde_json::json!({ "kubeletconfig": { "port": 10250 } })
    }

    fn node_log_dir(&self) -> &Path {
        &self.node_log_dir
    }

    async fn running_pods(&self) -> Result<Vec<Pod>, HostError> {
        Ok(self.pods[..1].to_vec())
    }

    async fn stats_summary(&self, _cpu_and_memory_only: bool) -> Result<Summary, HostError> {
        Err(HostError::Unavailable("no stats in this test".to_owned()))
    }

    async fn container(
        &self,
        pod: &PodRef<'_>,
        container: &str,
        previous: bool,
    ) -> Result<FoundContainer, HostError> {
        let key = format!("{}/{}/{container}", pod.namespace, pod.name);
        self.containers
            .get(&key)
            .filter(|_| !previous)
            .cloned()
            .ok_or_else(|| HostError::NotFound(format!("container {key} not found")))
    }

    async fn sandbox(&self, pod: &PodRef<'_>) -> Result<SandboxId, HostError> {
        Err(HostError::NotFound(format!(
            "pod {}/{} has no ready sandbox",
            pod.namespace, pod.name
        )))
    }

    fn streaming(&self) -> &dyn StreamingRuntime {
        &self.streaming
    }
}

/// Records the commands `/run` asked for and answers with their words joined; every streaming
/// URL request fails as a runtime without a streaming server would.
#[derive(Default)]
pub(crate) struct FakeStreaming {
    pub(crate) ran: Mutex<Vec<(ContainerId, Vec<String>)>>,
}

#[async_trait]
impl StreamingRuntime for FakeStreaming {
    async fn get_exec(
        &self,
        _container: &ContainerId,
        _request: ExecRequest,
    ) -> Result<String, RuntimeError> {
        Err(RuntimeError::Other("no streaming server".to_owned()))
    }

    async fn get_attach(
        &self,
        _container: &ContainerId,
        _streams: StreamOptions,
    ) -> Result<String, RuntimeError> {
        Err(RuntimeError::Other("no streaming server".to_owned()))
    }

    async fn get_port_forward(
        &self,
        _sandbox: &SandboxId,
        _ports: Vec<i32>,
    ) -> Result<String, RuntimeError> {
        Err(RuntimeError::Other("no streaming server".to_owned()))
    }

    async fn run_in_container(
        &self,
        container: &ContainerId,
        cmd: Vec<String>,
        _timeout: Duration,
    ) -> Result<Vec<u8>, RuntimeError> {
        let output = cmd.join("+").into_bytes();
        self.ran.lock().unwrap().push((container.clone(), cmd));
        Ok(output)
    }

    async fn container_log_path(&self, container: &ContainerId) -> Result<PathBuf, RuntimeError> {
        Err(RuntimeError::NotFound {
            what: "container",
            id: container.to_string(),
        })
    }

    async fn container_running(&self, _container: &ContainerId) -> Result<bool, RuntimeError> {
        Ok(false)
    }
}

pub(crate) fn check(name: &'static str, result: Result<(), String>) -> HealthCheck {
    HealthCheck {
        name,
        result,
        detail: None,
    }
}

pub(crate) fn pod(name: &str, phase: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("{name}-node1")),
            namespace: Some("default".to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        status: Some(PodStatus {
            phase: Some(phase.to_owned()),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}
