//! Pod lifecycle hooks the sync loop runs around a pod's life on the node; for now the admission
//! predicate that decides whether a new pod may run here at all. Corresponds to the kubelet's
//! `pkg/kubelet/lifecycle`.

pub mod predicate;

pub use predicate::{Rejection, admit, pod_requests};
