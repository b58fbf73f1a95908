//! The descriptive setters of `pkg/kubelet/nodestatus`: `VersionInfo`, `DaemonEndpoints`, `Images`
//! and `GoRuntime`.

use std::cmp::Reverse;

use k8s_openapi::api::core::v1::{ContainerImage, DaemonEndpoint, NodeDaemonEndpoints, NodeStatus};

use super::{ImageInfo, NodeFacts, NodeStatusError, node_system_info};

/// At most this many names (digests first, then tags) are reported per image.
const MAX_NAMES_PER_IMAGE: usize = 5;

pub(super) fn set_version_info(status: &mut NodeStatus, facts: &NodeFacts<'_>) {
    let info = node_system_info(status);
    info.kernel_version
        .clone_from(&facts.machine.kernel_version);
    info.os_image.clone_from(&facts.machine.os_image);
    facts
        .container_runtime_version
        .clone_into(&mut info.container_runtime_version);
    facts.kubelet_version.clone_into(&mut info.kubelet_version);
    // kubeProxyVersion is deprecated and cleared (DisableNodeKubeProxyVersion is locked on).
    info.kube_proxy_version.clear();
}

pub(super) fn set_daemon_endpoints(status: &mut NodeStatus, facts: &NodeFacts<'_>) {
    status.daemon_endpoints = Some(NodeDaemonEndpoints {
        kubelet_endpoint: Some(DaemonEndpoint {
            port: i32::from(facts.kubelet_port),
        }),
    });
}

pub(super) fn set_go_runtime(status: &mut NodeStatus, facts: &NodeFacts<'_>) {
    let info = node_system_info(status);
    info.operating_system
        .clone_from(&facts.machine.operating_system);
    info.architecture.clone_from(&facts.machine.architecture);
}

/// The largest images first (ties: the greater id first, as the kubelet's image list is sorted),
/// at most `max_images` of them unless it is -1. A failed listing clears the list.
pub(super) fn set_images(
    status: &mut NodeStatus,
    facts: &NodeFacts<'_>,
) -> Result<(), NodeStatusError> {
    let images = match facts.images {
        Ok(images) => images,
        Err(ref err) => {
            status.images = None;
            return Err(NodeStatusError::ImageList(err.clone()));
        }
    };
    let mut sorted: Vec<&ImageInfo> = images.iter().collect();
    sorted.sort_by_key(|image| (Reverse(image.size_bytes), Reverse(image.id.as_str())));
    if let Ok(max) = usize::try_from(facts.max_images) {
        sorted.truncate(max);
    }
    let reported: Vec<ContainerImage> = sorted
        .into_iter()
        .map(|image| ContainerImage {
            names: Some(
                image
                    .repo_digests
                    .iter()
                    .chain(&image.repo_tags)
                    .take(MAX_NAMES_PER_IMAGE)
                    .cloned()
                    .collect(),
            ),
            size_bytes: Some(i64::try_from(image.size_bytes).unwrap_or(i64::MAX)),
        })
        .collect();
    // An empty list is absent in the API (Go leaves the slice nil).
    status.images = (!reported.is_empty()).then_some(reported);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::tests::{facts_with, machine};
    use super::*;

    fn image(id: &str, size: u64, tags: usize, digests: usize) -> ImageInfo {
        ImageInfo {
            id: id.to_owned(),
            repo_tags: (0..tags).map(|i| format!("{id}:t{i}")).collect(),
            repo_digests: (0..digests).map(|i| format!("{id}@d{i}")).collect(),
            size_bytes: size,
        }
    }

    fn reported(max_images: i32, images: &[ImageInfo]) -> Vec<ContainerImage> {
        let machine = machine();
        let mut facts = facts_with(&machine);
        facts.images = Ok(images);
        facts.max_images = max_images;
        let mut status = NodeStatus::default();
        set_images(&mut status, &facts).unwrap();
        status.images.unwrap_or_default()
    }

    fn first_names(images: &[ContainerImage]) -> Vec<&str> {
        images
            .iter()
            .map(|i| i.names.as_ref().unwrap()[0].as_str())
            .collect()
    }

    #[test]
    fn largest_first_ties_by_id_and_capped() {
        let images = [
            image("a", 10, 1, 0),
            image("b", 30, 1, 0),
            image("c", 20, 1, 0),
            image("d", 20, 1, 0),
        ];
        let all = reported(-1, &images);
        assert_eq!(first_names(&all), ["b:t0", "d:t0", "c:t0", "a:t0"]);
        assert_eq!(all[0].size_bytes, Some(30));
        assert_eq!(first_names(&reported(2, &images)), ["b:t0", "d:t0"]);
        assert!(reported(0, &images).is_empty());
    }

    #[test]
    fn digests_come_before_tags_and_names_are_capped_at_five() {
        let images = [image("x", 1, 4, 3)];
        let names = reported(50, &images)[0].names.clone().unwrap();
        assert_eq!(names, ["x@d0", "x@d1", "x@d2", "x:t0", "x:t1"]);
    }

    #[test]
    fn version_info_clears_kube_proxy_version() {
        let machine = machine();
        let facts = facts_with(&machine);
        let mut status = NodeStatus::default();
        node_system_info(&mut status).kube_proxy_version = "v1.29.0".to_owned();
        set_version_info(&mut status, &facts);
        set_go_runtime(&mut status, &facts);
        let info = status.node_info.unwrap();
        assert_eq!(info.kube_proxy_version, "");
        assert_eq!(info.kernel_version, "6.1.0-18-amd64");
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
        assert_eq!(info.operating_system, "linux");
    }
}
