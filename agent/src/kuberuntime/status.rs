//! Reading pods back from the runtime (the kubelet's `GetPods` and `GetPodStatus` in
//! `kuberuntime_manager.go`): sandboxes and containers grouped by the pod-uid label, only objects
//! ringlet labelled, and the full status of one pod with the agent's annotations decoded.

use std::collections::HashMap;

use std::path::Path;

use futures::future::join_all;
use ringlet_proto::runtime::v1 as cri;

use tokio::io::{AsyncReadExt, AsyncSeekExt};

use super::container::termination_message_file;
use super::{CriError, KubeGenericRuntimeManager, labels};
use crate::container::{
    ContainerId, ContainerState, ContainerStatus, PodStatus, PodUid, RunningContainer, RunningPod,
    RunningSandbox, SandboxId, SandboxState, SandboxStatus,
};

/// Kubernetes caps termination messages at 4 KiB.
const MAX_TERMINATION_MESSAGE_BYTES: usize = 4096;
/// How much of the log end `FallbackToLogsOnError` reports.
const FALLBACK_LOG_BYTES: u64 = 2048;
/// containerd's reason for a container whose start failed.
const START_ERROR_REASON: &str = "StartError";
/// What Go's gRPC server reports for a call its client abandoned.
const CANCELED_CALL_MESSAGE: &str = "context canceled";

pub(super) fn container_state(state: cri::ContainerState) -> ContainerState {
    match state {
        cri::ContainerState::ContainerCreated => ContainerState::Created,
        cri::ContainerState::ContainerRunning => ContainerState::Running,
        cri::ContainerState::ContainerExited => ContainerState::Exited,
        cri::ContainerState::ContainerUnknown => ContainerState::Unknown,
    }
}

pub(super) fn sandbox_state(state: cri::PodSandboxState) -> SandboxState {
    match state {
        cri::PodSandboxState::SandboxReady => SandboxState::Ready,
        cri::PodSandboxState::SandboxNotready => SandboxState::NotReady,
    }
}

/// Label selector matching every object ringlet created for `node`, optionally of one pod.
pub(super) fn selector(node: &str, uid: Option<&PodUid>) -> HashMap<String, String> {
    let mut selector = HashMap::from([(labels::MANAGED.to_owned(), node.to_owned())]);
    if let Some(uid) = uid {
        selector.insert(labels::POD_UID.to_owned(), uid.to_string());
    }
    selector
}

pub(super) fn sandbox_filter(
    node: &str,
    uid: Option<&PodUid>,
    ready_only: bool,
) -> cri::PodSandboxFilter {
    cri::PodSandboxFilter {
        state: ready_only.then(|| cri::PodSandboxStateValue {
            state: cri::PodSandboxState::SandboxReady.into(),
        }),
        label_selector: selector(node, uid),
        ..cri::PodSandboxFilter::default()
    }
}

pub(super) fn container_filter(
    node: &str,
    uid: Option<&PodUid>,
    running_only: bool,
) -> cri::ContainerFilter {
    cri::ContainerFilter {
        state: running_only.then(|| cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning.into(),
        }),
        label_selector: selector(node, uid),
        ..cri::ContainerFilter::default()
    }
}

/// Why an exited container stopped, when the runtime did not say.
fn exit_reason(state: ContainerState, exit_code: i32, reason: String) -> String {
    if !reason.is_empty() || state != ContainerState::Exited {
        return reason;
    }
    if exit_code == 0 {
        "Completed".to_owned()
    } else {
        "Error".to_owned()
    }
}

/// Whether the runtime abandoned this container's start because the caller went away: an agent
/// killed during `StartContainer` cancels the call, and containerd then marks the container exited
/// with reason `StartError` and a "context canceled" message, though its process never ran. Such a
/// container reads as created but not started, so the next sync starts it again instead of failing
/// a `Never` pod for the agent's own death. A start that failed on its merits (a missing command)
/// carries its own message and stays a failure.
fn start_abandoned_by_caller(status: &cri::ContainerStatus) -> bool {
    status.state() == cri::ContainerState::ContainerExited
        && status.started_at == 0
        && status.reason == START_ERROR_REASON
        && status.message.contains(CANCELED_CALL_MESSAGE)
}

/// Converts a CRI container status into the runtime's view.
pub(super) fn convert_container_status(status: cri::ContainerStatus) -> ContainerStatus {
    let state = if start_abandoned_by_caller(&status) {
        ContainerState::Created
    } else {
        container_state(status.state())
    };
    let name = status
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .or_else(|| status.labels.get(labels::CONTAINER_NAME).cloned())
        .unwrap_or_default();
    let image = status
        .image
        .as_ref()
        .map(|i| {
            if i.user_specified_image.is_empty() {
                i.image.clone()
            } else {
                i.user_specified_image.clone()
            }
        })
        .unwrap_or_default();
    ContainerStatus {
        id: ContainerId::new(status.id),
        name,
        state,
        created_at: status.created_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        image,
        image_ref: status.image_ref,
        hash: status
            .annotations
            .get(labels::CONTAINER_HASH)
            .cloned()
            .unwrap_or_default(),
        restart_count: labels::restart_count(&status.annotations),
        reason: exit_reason(state, status.exit_code, status.reason),
        message: status.message,
    }
}

/// Converts a CRI sandbox status into the runtime's view.
pub(super) fn convert_sandbox_status(status: &cri::PodSandboxStatus) -> SandboxStatus {
    let host_network = status
        .linux
        .as_ref()
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network() == cri::NamespaceMode::Node);
    let ip = status
        .network
        .as_ref()
        .map(|n| n.ip.clone())
        .filter(|ip| !ip.is_empty());
    SandboxStatus {
        id: SandboxId::new(status.id.clone()),
        state: sandbox_state(status.state()),
        created_at: status.created_at,
        attempt: status.metadata.as_ref().map_or(0, |m| m.attempt),
        ip,
        host_network,
    }
}

/// Pod IPs of a sandbox status (primary first).
fn sandbox_ips(status: &cri::PodSandboxStatus) -> Vec<String> {
    status
        .network
        .iter()
        .flat_map(|n| {
            std::iter::once(n.ip.clone()).chain(n.additional_ips.iter().map(|p| p.ip.clone()))
        })
        .filter(|ip| !ip.is_empty())
        .collect()
}

fn pod_entry(pods: &mut HashMap<PodUid, RunningPod>, pod: labels::PodLabels) -> &mut RunningPod {
    pods.entry(pod.uid.clone()).or_insert_with(|| RunningPod {
        uid: pod.uid,
        name: pod.name,
        namespace: pod.namespace,
        ..RunningPod::default()
    })
}

/// The message an exited container left: its termination message file, or with
/// `FallbackToLogsOnError` and a failed exit, the tail of its log.
async fn termination_message(pod_dir: &Path, status: &cri::ContainerStatus) -> Option<String> {
    let name = &status.metadata.as_ref()?.name;
    let restart_count = labels::restart_count(&status.annotations);
    let file = termination_message_file(pod_dir, name, restart_count);
    if let Ok(bytes) = tokio::fs::read(&file).await
        && !bytes.is_empty()
    {
        let cut = &bytes[..bytes.len().min(MAX_TERMINATION_MESSAGE_BYTES)];
        return Some(String::from_utf8_lossy(cut).into_owned());
    }
    let fallback = status
        .annotations
        .get(labels::TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == "FallbackToLogsOnError");
    if !fallback || status.exit_code == 0 || status.log_path.is_empty() {
        return None;
    }
    let tail = read_tail(Path::new(&status.log_path), FALLBACK_LOG_BYTES)
        .await
        .ok()?;
    let message = cri_log_text(&tail);
    (!message.is_empty()).then_some(message)
}

/// The last `max` bytes of a file, starting at a line boundary.
async fn read_tail(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let start = len.saturating_sub(max);
    file.seek(std::io::SeekFrom::Start(start)).await?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).await?;
    if start > 0 {
        let first_newline = bytes
            .iter()
            .position(|&b| b == b'\n')
            .map_or(bytes.len(), |i| i + 1);
        bytes.drain(..first_newline);
    }
    Ok(bytes)
}

/// The text of CRI-format log lines (`<time> <stream> <F|P> <text>`); partial lines are joined.
pub(super) fn cri_log_text(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    for line in text.lines() {
        let mut parts = line.splitn(4, ' ');
        let (Some(_), Some(_), Some(tag)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        out.push_str(parts.next().unwrap_or_default());
        if tag != "P" {
            out.push('\n');
        }
    }
    out.trim_end().to_owned()
}

/// Groups listed sandboxes and containers into pods by their pod-uid label.
pub(super) fn group_pods(
    sandboxes: Vec<cri::PodSandbox>,
    containers: Vec<cri::Container>,
) -> Vec<RunningPod> {
    let mut pods: HashMap<PodUid, RunningPod> = HashMap::new();
    for s in sandboxes {
        let Some(pod) = labels::pod_labels(&s.labels) else {
            continue;
        };
        let running = pod_entry(&mut pods, pod);
        running.sandboxes.push(RunningSandbox {
            id: SandboxId::new(s.id.clone()),
            state: sandbox_state(s.state()),
            created_at: s.created_at,
        });
    }
    for c in containers {
        let Some(pod) = labels::pod_labels(&c.labels) else {
            continue;
        };
        let running = pod_entry(&mut pods, pod);
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .or_else(|| c.labels.get(labels::CONTAINER_NAME).cloned())
            .unwrap_or_default();
        running.containers.push(RunningContainer {
            id: ContainerId::new(c.id.clone()),
            name,
            state: container_state(c.state()),
            hash: c
                .annotations
                .get(labels::CONTAINER_HASH)
                .cloned()
                .unwrap_or_default(),
            created_at: c.created_at,
        });
    }
    let mut out: Vec<RunningPod> = pods.into_values().collect();
    for pod in &mut out {
        pod.sandboxes
            .sort_by_key(|s| std::cmp::Reverse(s.created_at));
        pod.containers
            .sort_by_key(|c| std::cmp::Reverse(c.created_at));
    }
    out.sort_by(|a, b| a.uid.cmp(&b.uid));
    out
}

impl KubeGenericRuntimeManager {
    /// Every ringlet pod the runtime knows; `all` includes exited containers and not-ready sandboxes.
    pub(super) async fn list_pods(&self, all: bool) -> Result<Vec<RunningPod>, CriError> {
        let (sandboxes, containers) = tokio::try_join!(
            self.cri
                .list_pod_sandbox(Some(sandbox_filter(self.helper.node_name(), None, !all))),
            self.cri
                .list_containers(Some(container_filter(self.helper.node_name(), None, !all))),
        )?;
        Ok(group_pods(sandboxes, containers))
    }

    /// Every sandbox and container of one pod, exited ones included, found by the pod-uid label
    /// (the runtime filters, so the cost does not grow with the node's pods).
    async fn list_pod_objects(
        &self,
        uid: &PodUid,
    ) -> Result<(Vec<cri::PodSandbox>, Vec<cri::Container>), CriError> {
        tokio::try_join!(
            self.cri.list_pod_sandbox(Some(sandbox_filter(
                self.helper.node_name(),
                Some(uid),
                false
            ))),
            self.cri.list_containers(Some(container_filter(
                self.helper.node_name(),
                Some(uid),
                false
            ))),
        )
    }

    /// Full status of one pod. Objects removed while it is being read are skipped.
    pub(super) async fn pod_status(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
    ) -> Result<PodStatus, CriError> {
        let (sandboxes, containers) = self.list_pod_objects(uid).await?;
        self.status_of(uid, name, namespace, &sandboxes, &containers)
            .await
    }

    /// Full status of a pod known only by its uid: the name and namespace come from the labels of
    /// its sandboxes and containers. `None` when the runtime has nothing of the pod.
    pub(super) async fn pod_status_by_uid(
        &self,
        uid: &PodUid,
    ) -> Result<Option<PodStatus>, CriError> {
        let (sandboxes, containers) = self.list_pod_objects(uid).await?;
        let Some(pod) = sandboxes
            .iter()
            .map(|s| &s.labels)
            .chain(containers.iter().map(|c| &c.labels))
            .find_map(labels::pod_labels)
        else {
            return Ok(None);
        };
        self.status_of(uid, &pod.name, &pod.namespace, &sandboxes, &containers)
            .await
            .map(Some)
    }

    /// Reads the status of each listed sandbox and container of one pod.
    async fn status_of(
        &self,
        uid: &PodUid,
        name: &str,
        namespace: &str,
        sandboxes: &[cri::PodSandbox],
        containers: &[cri::Container],
    ) -> Result<PodStatus, CriError> {
        let sandbox_statuses =
            join_all(sandboxes.iter().map(|s| self.cri.pod_sandbox_status(&s.id))).await;
        let container_statuses =
            join_all(containers.iter().map(|c| self.cri.container_status(&c.id))).await;

        let mut raw_sandboxes = Vec::new();
        for status in sandbox_statuses {
            match status {
                Ok(s) => raw_sandboxes.push(s),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        raw_sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let ips = raw_sandboxes
            .first()
            .filter(|s| s.state() == cri::PodSandboxState::SandboxReady)
            .map(|s| {
                let converted = convert_sandbox_status(s);
                if converted.host_network {
                    Vec::new()
                } else {
                    sandbox_ips(s)
                }
            })
            .unwrap_or_default();

        let pod_dir = self.helper.pod_dir(uid);
        let mut statuses = Vec::new();
        for status in container_statuses {
            match status {
                Ok(s) => {
                    let message = if s.state() == cri::ContainerState::ContainerExited
                        && s.message.is_empty()
                    {
                        termination_message(&pod_dir, &s).await
                    } else {
                        None
                    };
                    let mut converted = convert_container_status(s);
                    if let Some(message) = message {
                        converted.message = message;
                    }
                    statuses.push(converted);
                }
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        statuses.sort_by_key(|c| std::cmp::Reverse(c.created_at));

        Ok(PodStatus {
            uid: uid.clone(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            ips,
            sandboxes: raw_sandboxes
                .into_iter()
                .map(|s| convert_sandbox_status(&s))
                .collect(),
            containers: statuses,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cri_labels(uid: &str, container: Option<&str>) -> HashMap<String, String> {
        let mut l = selector("node1", Some(&PodUid::from(uid)));
        l.insert(labels::POD_NAME.into(), format!("pod-{uid}"));
        l.insert(labels::POD_NAMESPACE.into(), "default".into());
        if let Some(c) = container {
            l.insert(labels::CONTAINER_NAME.into(), c.into());
        }
        l
    }

    #[test]
    fn objects_are_grouped_by_pod_and_foreign_ones_ignored() {
        let sandboxes = vec![
            cri::PodSandbox {
                id: "s1".into(),
                created_at: 1,
                labels: cri_labels("a", None),
                ..cri::PodSandbox::default()
            },
            cri::PodSandbox {
                id: "s2".into(),
                created_at: 2,
                labels: cri_labels("a", None),
                ..cri::PodSandbox::default()
            },
            cri::PodSandbox {
                id: "foreign".into(),
                labels: HashMap::from([(labels::POD_UID.into(), "x".into())]),
                ..cri::PodSandbox::default()
            },
        ];
        let containers = vec![cri::Container {
            id: "c1".into(),
            state: cri::ContainerState::ContainerRunning.into(),
            labels: cri_labels("b", Some("app")),
            annotations: HashMap::from([(labels::CONTAINER_HASH.into(), "h".into())]),
            ..cri::Container::default()
        }];
        let pods = group_pods(sandboxes, containers);
        assert_eq!(pods.len(), 2);
        assert_eq!(pods[0].uid, PodUid::from("a"));
        assert_eq!(pods[0].name, "pod-a");
        assert_eq!(
            pods[0]
                .sandboxes
                .iter()
                .map(|s| s.id.as_str())
                .collect::<Vec<_>>(),
            ["s2", "s1"],
            "newest first"
        );
        assert_eq!(pods[1].containers[0].name, "app");
        assert_eq!(pods[1].containers[0].hash, "h");
        assert_eq!(pods[1].containers[0].state, ContainerState::Running);
    }

    #[test]
    fn container_status_decodes_annotations_and_exit_reason() {
        let status = cri::ContainerStatus {
            id: "c".into(),
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 4,
            }),
            state: cri::ContainerState::ContainerExited.into(),
            exit_code: 1,
            annotations: HashMap::from([(labels::RESTART_COUNT.into(), "4".into())]),
            ..cri::ContainerStatus::default()
        };
        let converted = convert_container_status(status.clone());
        assert_eq!(converted.restart_count, 4);
        assert_eq!(converted.reason, "Error");
        let oom = convert_container_status(cri::ContainerStatus {
            reason: "OOMKilled".into(),
            exit_code: 137,
            ..status.clone()
        });
        assert_eq!(oom.reason, "OOMKilled");
        let ok = convert_container_status(cri::ContainerStatus {
            exit_code: 0,
            ..status
        });
        assert_eq!(ok.reason, "Completed");
    }

    #[test]
    fn a_start_abandoned_by_a_dead_caller_reads_as_never_started() {
        let abandoned = cri::ContainerStatus {
            id: "c".into(),
            state: cri::ContainerState::ContainerExited.into(),
            created_at: 1,
            finished_at: 2,
            exit_code: 128,
            reason: "StartError".into(),
            message: "failed to start containerd task \"c\": context canceled: unknown".into(),
            ..cri::ContainerStatus::default()
        };
        let converted = convert_container_status(abandoned.clone());
        assert_eq!(converted.state, ContainerState::Created);

        let missing_command = convert_container_status(cri::ContainerStatus {
            message: "exec: \"nope\": executable file not found in $PATH: unknown".into(),
            ..abandoned.clone()
        });
        assert_eq!(missing_command.state, ContainerState::Exited);
        assert_eq!(missing_command.reason, "StartError");

        let ran_then_canceled = convert_container_status(cri::ContainerStatus {
            started_at: 1,
            ..abandoned
        });
        assert_eq!(ran_then_canceled.state, ContainerState::Exited);
    }

    #[test]
    fn cri_log_lines_become_text() {
        let log = b"2026-01-01T00:00:00Z stdout F first\n\
2026-01-01T00:00:00Z stderr P par\n\
2026-01-01T00:00:00Z stderr F tial\n";
        assert_eq!(cri_log_text(log), "first\npartial");
    }

    #[tokio::test]
    async fn termination_message_comes_from_the_file_or_the_log_tail() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("0.log");
        let lines = (0..200)
            .map(|i| format!("2026-01-01T00:00:00Z stdout F line {i}"))
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&log, lines).unwrap();
        let mut status = cri::ContainerStatus {
            metadata: Some(cri::ContainerMetadata {
                name: "app".into(),
                attempt: 0,
            }),
            exit_code: 1,
            log_path: log.to_string_lossy().into_owned(),
            annotations: HashMap::from([(
                labels::TERMINATION_MESSAGE_POLICY.into(),
                "FallbackToLogsOnError".into(),
            )]),
            ..cri::ContainerStatus::default()
        };
        let tail = termination_message(dir.path(), &status).await.unwrap();
        assert!(tail.ends_with("line 199"), "{tail}");
        assert!(tail.starts_with("line "), "starts at a whole line: {tail}");
        assert!(tail.len() <= 2048);

        let file = termination_message_file(dir.path(), "app", 0);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, "bye").unwrap();
        assert_eq!(
            termination_message(dir.path(), &status).await.unwrap(),
            "bye"
        );

        std::fs::remove_file(&file).unwrap();
        status.annotations.clear();
        assert_eq!(termination_message(dir.path(), &status).await, None);
    }

    #[test]
    fn sandbox_status_detects_host_network() {
        let status = cri::PodSandboxStatus {
            id: "s".into(),
            metadata: Some(cri::PodSandboxMetadata {
                attempt: 2,
                ..cri::PodSandboxMetadata::default()
            }),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node.into(),
                        ..cri::NamespaceOption::default()
                    }),
                }),
            }),
            ..cri::PodSandboxStatus::default()
        };
        let converted = convert_sandbox_status(&status);
        assert!(converted.host_network);
        assert_eq!(converted.attempt, 2);
        assert_eq!(converted.ip, None);
        assert_eq!(converted.state, SandboxState::Ready);
    }
}
