//! What the kubelet runs around a pod's and a container's life on the node: the admission
//! predicate that decides whether a new pod may run here at all, the sysctls a pod may set, and
//! the container lifecycle hooks (`postStart`, `preStop`). Corresponds to the kubelet's `pkg/kubelet/lifecycle`.

pub mod handlers;
pub mod predicate;
pub mod sysctls;

pub use handlers::{HookError, HookTarget, run_handler};
pub use predicate::{Rejection, admit, pod_requests};
pub use sysctls::SysctlAllowlist;
