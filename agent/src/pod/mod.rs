//! The pods the agent should run and their mirrors on the API server (the kubelet's
//! `pkg/kubelet/pod`): the pod manager and the mirror pods of static pods.

mod manager;
mod mirror;

pub use manager::{PodManager, VersionedPod, full_name, is_mirror_pod, is_mirror_pod_of, pod_uid};
pub use mirror::MirrorPods;
