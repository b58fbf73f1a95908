//! The read behind every timed exit (`benchkit::time_exits`): one `GET /pods`, decoded only as far as
//! the question needs (each pod's name and namespace, how many containers its spec has, and its
//! container statuses' ids, restart counts and running states). The rest of the list is skipped
//! and nothing is copied, so with a hundred pods (about 170 KB) a poll costs little more than the
//! request itself, and the poll does not blur the latency it times.

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::http;

#[derive(Deserialize)]
struct PodList {
    items: Option<Vec<Pod>>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Metadata,
    spec: Option<Spec>,
    status: Option<Status>,
}

#[derive(Deserialize)]
struct Metadata {
    name: Option<String>,
    namespace: Option<String>,
}

#[derive(Deserialize)]
struct Spec {
    containers: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    container_statuses: Option<Vec<ContainerStatus>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerStatus {
    #[serde(rename = "containerID")]
    container_id: Option<String>,
    restart_count: Option<u64>,
    state: Option<State>,
}

#[derive(Deserialize)]
struct State {
    running: Option<IgnoredAny>,
}

impl Pod {
    fn all_containers_running(&self) -> bool {
        let wanted = self
            .spec
            .as_ref()
            .and_then(|s| s.containers.as_ref())
            .map_or(0, Vec::len);
        self.statuses().is_some_and(|statuses| {
            statuses.len() == wanted
                && statuses
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
        })
    }

    fn statuses(&self) -> Option<&Vec<ContainerStatus>> {
        self.status.as_ref()?.container_statuses.as_ref()
    }

    /// The first container's id (without the runtime prefix) and restart count.
    fn first_container(&self) -> Option<(&str, u64)> {
        let first = self.statuses()?.first()?;
        let id = first.container_id.as_deref()?;
        let id = id.split_once("://").map_or(id, |(_, id)| id);
        Some((id, first.restart_count.unwrap_or(0)))
    }
}

/// Whether pod `name` of `namespace`, whose first container was `id` with `restarts` restarts, shows
/// a change in `body` (a `/pods` answer): a container not running, or its first container replaced
/// or restarted.
fn shows_change(body: &[u8], namespace: &str, name: &str, id: &str, restarts: u64) -> bool {
    let Ok(list) = serde_json::from_slice::<PodList>(body) else {
        return false;
    };
    list.items.unwrap_or_default().iter().any(|pod| {
        pod.metadata.namespace.as_deref() == Some(namespace)
            && pod.metadata.name.as_deref() == Some(name)
            && (!pod.all_containers_running()
                || pod
                    .first_container()
                    .is_some_and(|(i, r)| i != id || r != restarts))
    })
}

/// How many pods of `namespace` in `body` (a `/pods` answer) run all their containers, and each
/// of those pods' (name, first container id, restart count); empty for a bad answer.
pub fn running_pods(body: &[u8], namespace: &str) -> Vec<(String, String, u64)> {
    let Ok(list) = serde_json::from_slice::<PodList>(body) else {
        return Vec::new();
    };
    list.items
        .unwrap_or_default()
        .iter()
        .filter(|pod| {
            pod.metadata.namespace.as_deref() == Some(namespace) && pod.all_containers_running()
        })
        .filter_map(|pod| {
            let (id, restarts) = pod.first_container()?;
            Some((pod.metadata.name.clone()?, id.to_owned(), restarts))
        })
        .collect()
}

/// One read of the agent's `/pods` on `port`: whether it shows the change [`shows_change`] names.
/// A failed read shows nothing.
pub fn pod_changed(port: u16, namespace: &str, name: &str, id: &str, restarts: u64) -> bool {
    http::get(port, "/pods").is_ok_and(|body| shows_change(&body, namespace, name, id, restarts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(state: &str, id: &str, restarts: u64) -> Vec<u8> {
        format!(
            r#"{{"kind":"PodList","items":[
              {{"metadata":{{"name":"other","namespace":"ns"}},"spec":{{"containers":[{{}}]}}}},
              {{"metadata":{{"name":"p","namespace":"ns","uid":"u"}},
                "spec":{{"containers":[{{"name":"main","image":"busybox"}}]}},
                "status":{{"phase":"Running","containerStatuses":[{{"name":"main",
                  "containerID":"containerd://{id}","restartCount":{restarts},
                  "state":{{"{state}":{{"startedAt":"2026-01-01T00:00:00Z"}}}}}}]}}}}]}}"#
        )
        .into_bytes()
    }

    #[test]
    fn a_running_unchanged_container_is_no_change() {
        assert!(!shows_change(
            &body("running", "abc", 0),
            "ns",
            "p",
            "abc",
            0
        ));
    }

    #[test]
    fn an_exit_a_restart_or_a_new_container_is_a_change() {
        assert!(shows_change(
            &body("terminated", "abc", 0),
            "ns",
            "p",
            "abc",
            0
        ));
        assert!(shows_change(
            &body("running", "abc", 1),
            "ns",
            "p",
            "abc",
            0
        ));
        assert!(shows_change(
            &body("running", "def", 0),
            "ns",
            "p",
            "abc",
            0
        ));
    }

    #[test]
    fn running_pods_lists_only_running_pods_of_the_namespace() {
        assert_eq!(
            running_pods(&body("running", "abc", 2), "ns"),
            [("p".to_owned(), "abc".to_owned(), 2)]
        );
        assert!(running_pods(&body("terminated", "abc", 0), "ns").is_empty());
        assert!(running_pods(&body("running", "abc", 0), "other").is_empty());
        assert!(running_pods(b"<html>", "ns").is_empty());
    }

    #[test]
    fn another_pod_namespace_or_a_bad_answer_is_no_change() {
        assert!(!shows_change(
            &body("terminated", "abc", 0),
            "ns",
            "q",
            "abc",
            0
        ));
        assert!(!shows_change(
            &body("terminated", "abc", 0),
            "other",
            "p",
            "abc",
            0
        ));
        assert!(!shows_change(b"<html>", "ns", "p", "abc", 0));
        assert!(!shows_change(
            br#"{"kind":"PodList","items":null}"#,
            "ns",
            "p",
            "abc",
            0
        ));
    }
}
