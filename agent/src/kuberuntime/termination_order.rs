//! The order in which the containers of a pod with sidecars stop when they stop together (the
//! kubelet's `terminationOrdering`, `kuberuntime_termination_order.go`): the regular containers at
//! once, each sidecar only after every regular container and every sidecar after it in the spec
//! have stopped, so the sidecars stop in the reverse of their start order and serve the regular
//! containers to the end. Waiting for its turn takes from a container's grace period and never
//! exceeds it.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio::time::Instant;

use super::changes::is_sidecar;

/// See the module docs.
pub(super) struct TerminationOrdering {
    /// Whether each container of the spec has stopped; one that was not running has.
    stopped: HashMap<String, watch::Sender<bool>>,
    /// The containers each sidecar waits for.
    waits_for: HashMap<String, Vec<String>>,
}

impl TerminationOrdering {
    /// The ordering of `pod`'s containers, of which those named in `running` are still to stop.
    pub(super) fn new(pod: &Pod, running: &[&str]) -> Self {
        let spec = pod.spec.as_ref();
        let apps = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let inits = spec
            .and_then(|s| s.init_containers.as_deref())
            .unwrap_or_default();
        let stopped = apps
            .iter()
            .chain(inits)
            .map(|c| {
                let (sender, _) = watch::channel(!running.contains(&c.name.as_str()));
                (c.name.clone(), sender)
            })
            .collect();
        let regular: Vec<String> = apps.iter().map(|c| c.name.clone()).collect();
        let mut waits_for = HashMap::new();
        let mut later_sidecar: Option<&str> = None;
        for sidecar in inits.iter().rev().filter(|c| is_sidecar(c)) {
            let mut prerequisites = regular.clone();
            prerequisites.extend(later_sidecar.map(str::to_owned));
            waits_for.insert(sidecar.name.clone(), prerequisites);
            later_sidecar = Some(&sidecar.name);
        }
        Self { stopped, waits_for }
    }

    /// Waits until every container `name` must outlast has stopped, at most `limit`; returns how
    /// long it waited.
    pub(super) async fn wait_for_turn(&self, name: &str, limit: Duration) -> Duration {
        let began = Instant::now();
        let prerequisites = self.waits_for.get(name).map(Vec::as_slice);
        let waits = prerequisites
            .unwrap_or_default()
            .iter()
            .filter_map(|p| self.stopped.get(p))
            .map(|sender| {
                let mut stopped = sender.subscribe();
                async move {
                    // The sender lives as long as `self`, which this future borrows.
                    let _ = stopped.wait_for(|done| *done).await;
                }
            });
        let _ = tokio::time::timeout(limit, join_all(waits)).await;
        began.elapsed()
    }

    /// Container `name` has stopped: the sidecars waiting for it may go on.
    pub(super) fn container_stopped(&self, name: &str) {
        if let Some(sender) = self.stopped.get(name) {
            sender.send_replace(true);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::api::core::v1::{Container, PodSpec};

    use super::*;

    fn container(name: &str) -> Container {
        Container {
            name: name.into(),
            restart_policy: name.starts_with("sc").then(|| "Always".into()),
            ..Container::default()
        }
    }

    fn pod(inits: &[&str], apps: &[&str]) -> Pod {
        Pod {
            spec: Some(PodSpec {
                init_containers: Some(inits.iter().map(|n| container(n)).collect()),
                containers: apps.iter().map(|n| container(n)).collect(),
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    const GRACE: Duration = Duration::from_secs(30);

    /// Stops every running container of the pod in parallel, each after its turn and `work` of
    /// its own; returns the names in the order they stopped.
    async fn stop_all(
        ordering: Arc<TerminationOrdering>,
        running: &[&str],
        work: Duration,
    ) -> Vec<String> {
        let (sender, mut stops) = tokio::sync::mpsc::unbounded_channel();
        for name in running {
            let (ordering, sender, name) = (Arc::clone(&ordering), sender.clone(), *name);
            let name = name.to_owned();
            tokio::spawn(async move {
                ordering.wait_for_turn(&name, GRACE).await;
                tokio::time::sleep(work).await;
                ordering.container_stopped(&name);
                let _ = sender.send(name);
            });
        }
        drop(sender);
        let mut order = Vec::new();
        while let Some(name) = stops.recv().await {
            order.push(name);
        }
        order
    }

    #[tokio::test(start_paused = true)]
    async fn regular_containers_stop_first_then_sidecars_in_reverse_spec_order() {
        let running = ["sc1", "i1", "sc2", "sc3", "a", "b"];
        let p = pod(&["sc1", "i1", "sc2", "sc3"], &["a", "b"]);
        let ordering = Arc::new(TerminationOrdering::new(&p, &running));
        let order = stop_all(ordering, &running, Duration::from_secs(1)).await;
        let position = |name: &str| order.iter().position(|n| n == name).unwrap();
        assert!(position("a") < position("sc3") && position("b") < position("sc3"));
        assert!(position("sc3") < position("sc2"), "{order:?}");
        assert!(position("sc2") < position("sc1"), "{order:?}");
        assert!(
            position("i1") < position("sc3"),
            "a regular init container waits for nobody"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn containers_that_are_not_running_are_not_waited_for() {
        let p = pod(&["sc1", "sc2"], &["a"]);
        let ordering = TerminationOrdering::new(&p, &["sc1"]);
        assert_eq!(ordering.wait_for_turn("sc1", GRACE).await, Duration::ZERO);
        assert_eq!(ordering.wait_for_turn("a", GRACE).await, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sidecar_waits_at_most_its_grace_period() {
        let p = pod(&["sc"], &["a"]);
        let ordering = TerminationOrdering::new(&p, &["sc", "a"]);
        let waited = ordering.wait_for_turn("sc", Duration::from_secs(7)).await;
        assert_eq!(waited, Duration::from_secs(7), "a never stopped");
        ordering.container_stopped("a");
        assert_eq!(ordering.wait_for_turn("sc", GRACE).await, Duration::ZERO);
    }
}
