//! A smoke run against the real containerd of the lab (ignored by default: it needs root and
//! `/run/containerd/containerd.sock` with the lab's busybox and pause images). Run with
//! `cargo test -p ringlet --lib kuberuntime::smoke_tests -- --ignored`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector, Pod, PodSpec,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::{CriClient, KubeGenericRuntimeManager, RuntimeHelper, RuntimeSettings};
use crate::container::{ContainerState, PodStatus, PodUid, Runtime, SandboxState};
use crate::events::Recorder;

pub(super) const SOCKET: &str = "/run/containerd/containerd.sock";

struct Helper {
    root: PathBuf,
}

impl RuntimeHelper for Helper {
    fn pod_cgroup_parent(&self, pod: &Pod) -> Result<String, String> {
        Ok(format!(
            "/kubepods/besteffort/pod{}",
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
    }
    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.root.join("pods").join(uid.as_str())
    }
    fn node_name(&self) -> &'static str {
        "smoke-node"
    }
    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{name}_{uid}"))
    }
}

fn container(name: &str, script: &str) -> Container {
    Container {
        name: name.into(),
        image: Some("busybox".into()),
        // The lab has no registry for busybox: the default for `latest` (`Always`) cannot pull.
        image_pull_policy: Some("IfNotPresent".into()),
        command: Some(vec!["sh".into(), "-c".into(), script.into()]),
        env: Some(vec![EnvVar {
            name: "POD_IP".into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: None,
                    field_path: "status.podIP".into(),
                }),
                ..EnvVarSource::default()
            }),
        }]),
        volume_mounts: Some(vec![VolumeMount {
            name: "scratch".into(),
            mount_path: "/scratch".into(),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    }
}

pub(super) async fn status_when(
    manager: &KubeGenericRuntimeManager,
    uid: &PodUid,
    done: impl Fn(&PodStatus) -> bool,
) -> PodStatus {
    for _ in 0..100 {
        let status = manager
            .get_pod_status(uid, "", "ringlet-smoke")
            .await
            .unwrap();
        if done(&status) {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("pod status never reached the expected state");
}

fn remove_cgroups(uid: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for h in hierarchies.flatten() {
        let dir = h.path().join(format!("kubepods/besteffort/pod{uid}"));
        let _ = std::fs::remove_dir(&dir);
    }
}

pub(super) fn manager(root: &Path) -> KubeGenericRuntimeManager {
    let cri = CriClient::new(&format!("unix://{SOCKET}"), Duration::from_secs(30)).unwrap();
    KubeGenericRuntimeManager::new(
        cri,
        Arc::new(Helper {
            root: root.to_owned(),
        }),
        Recorder::new(None),
        RuntimeSettings::default(),
    )
}

/// Removes the pod's sandboxes (and with them its containers). Global garbage collection would
/// also touch other ringlet pods on this shared runtime.
pub(super) async fn remove_pod(manager: &KubeGenericRuntimeManager, uid: &PodUid) {
    let pods = manager.get_pods(true).await.unwrap();
    for pod in pods.iter().filter(|p| &p.uid == uid) {
        for sandbox in &pod.sandboxes {
            manager
                .cri()
                .remove_pod_sandbox(sandbox.id.as_str())
                .await
                .unwrap();
        }
    }
    assert!(
        !manager
            .get_pods(true)
            .await
            .unwrap()
            .iter()
            .any(|p| &p.uid == uid),
        "the pod is gone from the runtime"
    );
    remove_cgroups(uid.as_str());
}

#[tokio::test]
#[ignore = "needs root and the lab's containerd at /run/containerd/containerd.sock"]
async fn init_containers_run_in_order_and_a_failure_fails_a_never_pod() {
    assert!(
        Path::new(SOCKET).exists(),
        "no containerd socket at {SOCKET}"
    );
    let root = tempfile::tempdir().unwrap();
    let manager = manager(root.path());
    let uid = PodUid::from(format!("smoke-init-{}", std::process::id()));
    let bare = |name: &str, script: &str| Container {
        volume_mounts: None,
        env: None,
        ..container(name, script)
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("smoke-init".into()),
            namespace: Some("ringlet-smoke".into()),
            uid: Some(uid.to_string()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            host_network: Some(true),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(1),
            init_containers: Some(vec![bare("i1", "exit 0"), bare("i2", "exit 2")]),
            containers: vec![bare("app", "sleep 3600")],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };

    let first = manager.sync_pod(&pod, &PodStatus::default()).await;
    assert_eq!(first.first_failure(), None, "{first:?}");
    let status = status_when(&manager, &uid, |s| {
        s.container("i1")
            .is_some_and(|c| c.state == ContainerState::Exited)
    })
    .await;
    assert!(status.sandboxes[0].host_network);
    assert!(status.ips.is_empty(), "host-network pods report no pod IP");
    assert!(
        status.container("i2").is_none(),
        "one init container at a time"
    );

    let second = manager.sync_pod(&pod, &status).await;
    assert_eq!(second.first_failure(), None, "{second:?}");
    let status = status_when(&manager, &uid, |s| {
        s.container("i2")
            .is_some_and(|c| c.state == ContainerState::Exited)
    })
    .await;
    let third = manager.sync_pod(&pod, &status).await;
    let (_, failure) = third.first_failure().unwrap();
    assert_eq!(failure.reason, "RunInitContainerError");
    assert_eq!(failure.message, "init container \"i2\" exited with 2");

    let status = status_when(&manager, &uid, |s| {
        s.sandboxes
            .first()
            .is_some_and(|sb| sb.state == SandboxState::NotReady)
    })
    .await;
    let fourth = manager.sync_pod(&pod, &status).await;
    assert!(
        fourth.results.is_empty(),
        "a failed Never pod starts nothing: {fourth:?}"
    );
    assert!(status.container("app").is_none());
    remove_pod(&manager, &uid).await;
}

#[tokio::test]
#[allow(clippy::too_many_lines, reason = "one end-to-end scenario")]
#[ignore = "needs root and the lab's containerd at /run/containerd/containerd.sock"]
async fn runs_adopts_backs_off_kills_and_collects_a_pod() {
    assert!(
        Path::new(SOCKET).exists(),
        "no containerd socket at {SOCKET}"
    );
    let root = tempfile::tempdir().unwrap();
    let manager = manager(root.path());
    assert!(
        manager
            .version()
            .await
            .unwrap()
            .starts_with("containerd://")
    );

    let uid = PodUid::from(format!("smoke-{}", std::process::id()));
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("smoke".into()),
            namespace: Some("ringlet-smoke".into()),
            uid: Some(uid.to_string()),
            labels: Some(BTreeMap::from([("app".into(), "smoke".into())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            termination_grace_period_seconds: Some(1),
            volumes: Some(vec![Volume {
                name: "scratch".into(),
                empty_dir: Some(EmptyDirVolumeSource::default()),
                ..Volume::default()
            }]),
            containers: vec![
                container(
                    "app",
                    "echo hello $POD_IP > /scratch/out; echo hello $POD_IP; sleep 3600",
                ),
                container("crash", "exit 3"),
            ],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };

    let first = manager.sync_pod(&pod, &PodStatus::default()).await;
    assert_eq!(first.first_failure(), None, "{first:?}");

    let status = status_when(&manager, &uid, |s| {
        s.container("crash")
            .is_some_and(|c| c.state == ContainerState::Exited)
            && s.container("app")
                .is_some_and(|c| c.state == ContainerState::Running)
    })
    .await;
    assert_eq!(status.sandboxes[0].state, SandboxState::Ready);
    let ip = status.ips.first().cloned().unwrap();
    let crash = status.container("crash").unwrap();
    assert_eq!((crash.exit_code, crash.reason.as_str()), (3, "Error"));

    let written = root
        .path()
        .join("pods")
        .join(uid.as_str())
        .join("volumes/kubernetes.io~empty-dir/scratch/out");
    assert_eq!(
        std::fs::read_to_string(&written).unwrap().trim(),
        format!("hello {ip}")
    );

    // The crashed container restarts once at once, then waits out the back-off.
    let second = manager.sync_pod(&pod, &status).await;
    assert_eq!(second.first_failure(), None, "{second:?}");
    assert_eq!(
        second.results.len(),
        1,
        "only the crashed container restarts"
    );
    let status = status_when(&manager, &uid, |s| {
        s.container("crash")
            .is_some_and(|c| c.restart_count == 1 && c.state == ContainerState::Exited)
    })
    .await;
    let third = manager.sync_pod(&pod, &status).await;
    assert_eq!(
        third.results.len(),
        1,
        "the running app container is adopted, not touched: {third:?}"
    );
    let (_, failure) = third.first_failure().unwrap();
    assert_eq!(failure.reason, "CrashLoopBackOff");
    assert_eq!(
        failure.message,
        "back-off 10s restarting failed container=crash pod=smoke"
    );

    let log = root
        .path()
        .join("logs")
        .join(format!("ringlet-smoke_smoke_{uid}"))
        .join("app/0.log");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains(&format!("stdout F hello {ip}")), "{text}");

    let running = manager
        .get_pods(false)
        .await
        .unwrap()
        .into_iter()
        .find(|p| p.uid == uid)
        .unwrap();
    manager
        .kill_pod(Some(&pod), &running, Some(0))
        .await
        .unwrap();
    assert!(
        !manager
            .get_pods(false)
            .await
            .unwrap()
            .iter()
            .any(|p| p.uid == uid),
        "nothing of the pod runs after kill_pod"
    );
    remove_pod(&manager, &uid).await;
}
