//! The node's containers as observe mode follows them through CRI, with read-only calls only
//! (`ListContainers`, `ContainerStatus`): who each container is (pod uid, namespace, name, container
//! name, from the kubelet's CRI labels) and which host process is its init (the pid the runtime
//! reports, through the PLEG's [`InitProcesses`] registry), so a kernel exit can be taken as the
//! container's death only when it is the init's. Corresponds to nothing in the kubelet.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ringlet_proto::runtime::v1 as cri;

use crate::container::{ContainerId, PodUid};
use crate::kuberuntime::{CriClient, CriError, labels};
use crate::pleg::InitProcesses;

/// How often a new container's init pid is asked for before the runtime reports it running.
const PID_ATTEMPTS: u32 = 40;
/// The pause between those attempts: the runtime records the pid once the start call returns,
/// which is after the init's first exec (the hint that made observe mode ask).
const PID_RETRY: Duration = Duration::from_millis(50);

/// Who a container is, from the labels the kubelet gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerInfo {
    pub id: ContainerId,
    pub pod_uid: PodUid,
    pub namespace: String,
    pub pod_name: String,
    pub container_name: String,
}

impl ContainerInfo {
    /// The container's identity from its CRI labels; `None` for one the kubelet did not create.
    pub fn from_labels(
        id: &str,
        container_labels: &HashMap<String, String>,
    ) -> Option<ContainerInfo> {
        let label = |key: &str| container_labels.get(key).cloned();
        Some(Self {
            id: ContainerId::new(id),
            pod_uid: PodUid::new(label(labels::POD_UID)?),
            namespace: label(labels::POD_NAMESPACE)?,
            pod_name: label(labels::POD_NAME)?,
            container_name: label(labels::CONTAINER_NAME)?,
        })
    }
}

/// The containers followed. Cloneable; clones share the state.
#[derive(Clone, Debug)]
pub struct Containers {
    cri: CriClient,
    known: Arc<Mutex<HashMap<ContainerId, ContainerInfo>>>,
    inits: InitProcesses,
}

impl Containers {
    pub fn new(cri: CriClient) -> Self {
        Self {
            cri,
            known: Arc::default(),
            inits: InitProcesses::default(),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, ContainerInfo>> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The CRI endpoint, for messages.
    pub fn endpoint(&self) -> &str {
        self.cri.endpoint()
    }

    /// Lists every container, follows the running ones (asking each new one's init pid) and forgets
    /// those gone from the runtime. Returns how many run.
    pub async fn relist(&self) -> Result<usize, CriError> {
        let listed = self.cri.list_containers(None).await?;
        let running: Vec<ContainerInfo> = listed
            .iter()
            .filter(|c| c.state() == cri::ContainerState::ContainerRunning)
            .filter_map(|c| ContainerInfo::from_labels(&c.id, &c.labels))
            .collect();
        {
            let mut known = self.known();
            known.retain(|id, _| listed.iter().any(|c| c.id == id.as_str()));
            for info in &running {
                known.insert(info.id.clone(), info.clone());
            }
        }
        self.inits
            .retain(|id| listed.iter().any(|c| c.id == id.as_str()));
        for id in self.inits.to_ask(running.iter().map(|c| c.id.clone())) {
            self.ask_pid(&id).await;
        }
        Ok(running.len())
    }

    /// Learns a container the kernel just saw start: its identity and init pid, retried until the
    /// runtime reports it running (or it is gone).
    pub async fn learn(&self, id: &ContainerId) {
        if self.inits.to_ask([id.clone()]).is_empty() {
            return;
        }
        for _ in 0..PID_ATTEMPTS {
            match self.cri.container_status(id.as_str()).await {
                Ok(status) => {
                    if let Some(info) = ContainerInfo::from_labels(id.as_str(), &status.labels) {
                        self.known().insert(id.clone(), info);
                    }
                    match status.state() {
                        cri::ContainerState::ContainerRunning => {
                            self.ask_pid(id).await;
                            return;
                        }
                        cri::ContainerState::ContainerExited => {
                            self.inits.reported(id, None);
                            return;
                        }
                        _ => {}
                    }
                }
                Err(err) if err.is_not_found() => {
                    // A sandbox's pause container or one removed already: nothing to follow.
                    self.inits.reported(id, None);
                    return;
                }
                Err(err) => {
                    tracing::debug!(container = %id, error = %crate::error_chain::error_chain(&err),
                        "reading a new container's status");
                }
            }
            tokio::time::sleep(PID_RETRY).await;
        }
        // A later relist asks again.
        self.inits.ask_again(id);
    }

    async fn ask_pid(&self, id: &ContainerId) {
        match self.cri.container_pid(id.as_str()).await {
            Ok(pid) => self.inits.reported(id, pid),
            Err(err) => {
                tracing::debug!(container = %id, error = %crate::error_chain::error_chain(&err),
                    "reading a container's init pid");
                self.inits.ask_again(id);
            }
        }
    }

    /// The container whose proven init is `tgid`, if `id` is one.
    pub fn init_exited(&self, id: &ContainerId, tgid: u32) -> Option<ContainerInfo> {
        if !self.inits.is_init(id, tgid) {
            return None;
        }
        self.known().get(id).cloned()
    }

    /// The container `id`, if followed.
    pub fn get(&self, id: &ContainerId) -> Option<ContainerInfo> {
        self.known().get(id).cloned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn identity_comes_from_the_kubelets_labels() {
        let mut container_labels: HashMap<String, String> = [
            (labels::POD_UID, "1234abcd-0000"),
            (labels::POD_NAMESPACE, "default"),
            (labels::POD_NAME, "web"),
            (labels::CONTAINER_NAME, "main"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let info = ContainerInfo::from_labels("abc", &container_labels).unwrap();
        assert_eq!(info.pod_uid, PodUid::new("1234abcd-0000"));
        assert_eq!(
            (
                info.namespace.as_str(),
                info.pod_name.as_str(),
                info.container_name.as_str()
            ),
            ("default", "web", "main")
        );
        container_labels.remove(labels::CONTAINER_NAME);
        assert_eq!(
            ContainerInfo::from_labels("abc", &container_labels),
            None,
            "a sandbox or a container the kubelet did not create"
        );
    }
}
