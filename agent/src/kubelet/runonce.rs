//! Run-once mode (the kubelet's `pkg/kubelet/runonce.go`, `--runonce`): take the pods the sources
//! offer once they are all ready, start each one, poll the runtime until its containers run or it
//! fails, report every pod, and leave. No servers, no sync loop, no PLEG.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;

use crate::container::{ContainerState, PodUid};
use crate::pod_workers::{PodSyncer, UpdateType};
use crate::podconfig::{PodOperation, PodUpdate, SourcesReady};

use super::{Kubelet, pod_uid};

/// How many times a pod is synced before run-once gives up on it.
const MAX_ATTEMPTS: u32 = 10;
/// Wait before the first re-check; doubled after each attempt.
const FIRST_RETRY_DELAY: Duration = Duration::from_secs(1);
/// How long to wait for every source to deliver its pods.
const SOURCES_TIMEOUT: Duration = Duration::from_mins(1);

/// The outcome for one pod.
#[derive(Debug)]
pub struct RunPodResult {
    pub pod: String,
    pub outcome: Result<(), String>,
}

fn describe(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

impl Kubelet {
    /// Runs the pods once. Errors only when the pods could not even be collected.
    pub async fn run_once(
        self,
        mut updates: mpsc::Receiver<PodUpdate>,
        sources_ready: SourcesReady,
    ) -> Result<Vec<RunPodResult>, String> {
        tracing::info!("starting ringlet in run-once mode");
        let mut pods: HashMap<PodUid, Pod> = HashMap::new();
        let collect = async {
            while !sources_ready.all_ready() {
                let Some(update) = updates.recv().await else {
                    break;
                };
                for pod in update.pods {
                    let Some(uid) = pod_uid(&pod) else { continue };
                    match update.op {
                        PodOperation::Remove => {
                            pods.remove(&uid);
                        }
                        _ => {
                            pods.insert(uid, Pod::clone(&pod));
                        }
                    }
                }
            }
        };
        tokio::time::timeout(SOURCES_TIMEOUT, collect)
            .await
            .map_err(|_| {
                format!(
                    "pod sources were not ready within {}s",
                    SOURCES_TIMEOUT.as_secs()
                )
            })?;
        self.runtime_state
            .update_runtime_up(self.runtime.as_ref())
            .await;
        if let Some(err) = self.runtime_state.runtime_error() {
            return Err(err);
        }
        let runs = pods.into_values().map(|pod| self.run_pod(pod));
        Ok(futures::future::join_all(runs).await)
    }

    async fn run_pod(&self, pod: Pod) -> RunPodResult {
        let name = describe(&pod);
        let outcome = self.run_pod_until_running(&pod).await;
        match &outcome {
            Ok(()) => tracing::info!(pod = %name, "pod is running"),
            Err(err) => tracing::warn!(pod = %name, %err, "pod failed to run"),
        }
        RunPodResult { pod: name, outcome }
    }

    async fn run_pod_until_running(&self, pod: &Pod) -> Result<(), String> {
        let uid = pod_uid(pod).ok_or("pod has no uid")?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let wanted = container_names(pod);
        let mut delay = FIRST_RETRY_DELAY;
        let mut last_error = String::from("containers did not start");
        for _ in 0..MAX_ATTEMPTS {
            let status = self
                .runtime
                .get_pod_status(&uid, &name, &namespace)
                .await
                .map_err(|err| err.to_string())?;
            let all_running = wanted.iter().all(|c| {
                status
                    .container(c)
                    .is_some_and(|s| s.state == ContainerState::Running)
            });
            if all_running {
                return Ok(());
            }
            match self.syncer.sync_pod(pod, &status, UpdateType::Create).await {
                Ok(outcome) if outcome.terminal => {
                    let phase = self
                        .status
                        .get_pod_status(&uid)
                        .and_then(|s| s.phase)
                        .unwrap_or_default();
                    return if phase == "Succeeded" {
                        Ok(())
                    } else {
                        Err(format!("pod finished in phase {phase}"))
                    };
                }
                Ok(_) => {}
                Err(err) => last_error = err.to_string(),
            }
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
        Err(last_error)
    }
}
