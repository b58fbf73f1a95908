//! Container and sandbox garbage collection (the kubelet's `kuberuntime_gc.go`): removes exited
//! containers beyond the per-container limit, everything dead of pods that are no longer active, and
//! dead sandboxes nothing refers to any more, plus the log directories of pods that are fully gone.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, stream};

use ringlet_proto::runtime::v1 as cri;

use super::status::{container_filter, sandbox_filter};
use super::{CriError, KubeGenericRuntimeManager, labels};
use crate::container::PodUid;

/// How many removals garbage collection has in flight at once: a torn-down node's hundreds of
/// containers go in parallel, without flooding the runtime.
const REMOVAL_CONCURRENCY: usize = 8;

/// What garbage collection will remove, decided from the listed objects alone.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct GcPlan {
    pub containers: Vec<String>,
    pub sandboxes: Vec<String>,
    /// Pods (uid, name, namespace) none of whose sandboxes remain: their logs can go.
    pub gone_pods: Vec<(PodUid, String, String)>,
}

fn removable_container(state: cri::ContainerState) -> bool {
    matches!(
        state,
        cri::ContainerState::ContainerExited | cri::ContainerState::ContainerCreated
    )
}

/// Plans a collection. Active pods keep their newest `max_per_pod_container` dead instances per
/// container name and their newest sandbox; inactive pods keep nothing that is not running. A
/// sandbox is only removed once no remaining container belongs to it.
pub(super) fn plan(
    sandboxes: &[cri::PodSandbox],
    containers: &[cri::Container],
    max_per_pod_container: usize,
    active: &HashSet<PodUid>,
) -> GcPlan {
    let mut plan = GcPlan::default();
    let mut groups: HashMap<(PodUid, String), Vec<&cri::Container>> = HashMap::new();
    for c in containers {
        let Some(pod) = labels::pod_labels(&c.labels) else {
            continue;
        };
        if !removable_container(c.state()) {
            continue;
        }
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        groups.entry((pod.uid, name)).or_default().push(c);
    }
    let mut removed: HashSet<&str> = HashSet::new();
    for ((uid, _), mut group) in groups {
        group.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let keep = if active.contains(&uid) {
            max_per_pod_container
        } else {
            0
        };
        for c in group.into_iter().skip(keep) {
            removed.insert(&c.id);
            plan.containers.push(c.id.clone());
        }
    }
    let in_use: HashSet<&str> = containers
        .iter()
        .filter(|c| labels::is_managed(&c.labels) && !removed.contains(c.id.as_str()))
        .map(|c| c.pod_sandbox_id.as_str())
        .collect();

    let mut by_pod: HashMap<PodUid, (labels::PodLabels, Vec<&cri::PodSandbox>)> = HashMap::new();
    for s in sandboxes {
        if let Some(pod) = labels::pod_labels(&s.labels) {
            by_pod
                .entry(pod.uid.clone())
                .or_insert_with(|| (pod, Vec::new()))
                .1
                .push(s);
        }
    }
    for (uid, (pod, mut group)) in by_pod {
        group.sort_by_key(|s| std::cmp::Reverse(s.created_at));
        let is_active = active.contains(&uid);
        let mut remaining = 0;
        for (i, s) in group.iter().enumerate() {
            let dead = s.state() == cri::PodSandboxState::SandboxNotready;
            let keep_newest = is_active && i == 0;
            if dead && !keep_newest && !in_use.contains(s.id.as_str()) {
                plan.sandboxes.push(s.id.clone());
            } else {
                remaining += 1;
            }
        }
        if !is_active && remaining == 0 {
            plan.gone_pods.push((uid, pod.name, pod.namespace));
        }
    }
    plan.containers.sort();
    plan.sandboxes.sort();
    plan
}

impl KubeGenericRuntimeManager {
    /// `Runtime::garbage_collect`. Keeps going after a failed removal; returns the first failure.
    pub(super) async fn collect_garbage(
        &self,
        max_per_pod_container: usize,
        active: &HashSet<PodUid>,
    ) -> Result<(), CriError> {
        let (sandboxes, containers) = tokio::try_join!(
            self.cri
                .list_pod_sandbox(Some(sandbox_filter(self.helper.node_name(), None, false))),
            self.cri
                .list_containers(Some(container_filter(self.helper.node_name(), None, false))),
        )?;
        let plan = plan(&sandboxes, &containers, max_per_pod_container, active);
        let mut first_error = None;
        let mut note = |result: Result<(), CriError>| {
            if let Err(e) = result
                && !e.is_not_found()
            {
                tracing::warn!(error = %e, "garbage collection step failed");
                first_error.get_or_insert(e);
            }
        };
        // Containers first: a sandbox is only removed once nothing refers to it.
        let cri = &self.cri;
        let removed: Vec<_> = stream::iter(plan.containers.iter().cloned())
            .map(|id| async move { cri.remove_container(&id).await })
            .buffer_unordered(REMOVAL_CONCURRENCY)
            .collect()
            .await;
        removed.into_iter().for_each(&mut note);
        let removed: Vec<_> = stream::iter(plan.sandboxes.iter().cloned())
            .map(|id| async move { cri.remove_pod_sandbox(&id).await })
            .buffer_unordered(REMOVAL_CONCURRENCY)
            .collect()
            .await;
        removed.into_iter().for_each(&mut note);
        for (uid, name, namespace) in &plan.gone_pods {
            self.forget_pod(uid);
            let dir = self.helper.pod_log_dir(namespace, name, uid);
            if let Err(e) = tokio::fs::remove_dir_all(&dir).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(dir = %dir.display(), error = %e, "removing pod logs failed");
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod_labels(uid: &str, container: Option<&str>) -> HashMap<String, String> {
        let mut l = HashMap::from([
            (labels::MANAGED.to_owned(), "node1".to_owned()),
            (labels::POD_UID.to_owned(), uid.to_owned()),
            (labels::POD_NAME.to_owned(), format!("p-{uid}")),
            (labels::POD_NAMESPACE.to_owned(), "default".to_owned()),
        ]);
        if let Some(c) = container {
            l.insert(labels::CONTAINER_NAME.to_owned(), c.to_owned());
        }
        l
    }

    fn container(
        id: &str,
        uid: &str,
        name: &str,
        sandbox: &str,
        state: cri::ContainerState,
        created_at: i64,
    ) -> cri::Container {
        cri::Container {
            id: id.into(),
            pod_sandbox_id: sandbox.into(),
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            state: state.into(),
            created_at,
            labels: pod_labels(uid, Some(name)),
            ..cri::Container::default()
        }
    }

    fn sandbox(id: &str, uid: &str, ready: bool, created_at: i64) -> cri::PodSandbox {
        cri::PodSandbox {
            id: id.into(),
            state: if ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            }
            .into(),
            created_at,
            labels: pod_labels(uid, None),
            ..cri::PodSandbox::default()
        }
    }

    use cri::ContainerState::{ContainerExited as Exited, ContainerRunning as Running};

    #[test]
    fn active_pods_keep_the_newest_dead_instances_and_sandbox() {
        let containers = vec![
            container("c1", "a", "app", "s2", Exited, 1),
            container("c2", "a", "app", "s2", Exited, 2),
            container("c3", "a", "app", "s2", Exited, 3),
            container("c4", "a", "app", "s2", Running, 4),
        ];
        let sandboxes = vec![
            sandbox("s1", "a", false, 1),
            sandbox("s2", "a", true, 2),
            sandbox("s0", "a", false, 0),
        ];
        let active = HashSet::from([PodUid::from("a")]);
        let plan = plan(&sandboxes, &containers, 1, &active);
        assert_eq!(plan.containers, ["c1", "c2"]);
        assert_eq!(plan.sandboxes, ["s0", "s1"]);
        assert!(plan.gone_pods.is_empty());
    }

    #[test]
    fn inactive_pods_lose_everything_dead_but_running_objects_stay() {
        let mut foreign = container("foreign", "x", "app", "s9", Exited, 1);
        foreign.labels.remove(labels::MANAGED);
        let containers = vec![
            container("c1", "gone", "app", "s1", Exited, 1),
            container("c2", "stopping", "app", "s2", Running, 1),
            foreign,
        ];
        let sandboxes = vec![
            sandbox("s1", "gone", false, 1),
            sandbox("s2", "stopping", false, 1),
        ];
        let plan = plan(&sandboxes, &containers, 5, &HashSet::new());
        assert_eq!(plan.containers, ["c1"]);
        assert_eq!(plan.sandboxes, ["s1"], "s2 still has a running container");
        assert_eq!(
            plan.gone_pods,
            [(
                PodUid::from("gone"),
                "p-gone".to_owned(),
                "default".to_owned()
            )]
        );
    }
}
