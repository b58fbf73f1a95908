//! Pod status: turning the runtime's view of a pod into the API `PodStatus` (the kubelet's
//! `generateAPIPodStatus` in `kubelet_pods.go` and the condition generators of
//! `pkg/kubelet/status`), the final status of a pod stopped for good, the reason cache of start
//! failures, the status manager that keeps the latest versioned status of every pod, and the syncer
//! that writes it to the API server.
//! Corresponds to the kubelet's `pkg/kubelet/status`.

mod generate;
mod manager;
mod reason_cache;
mod syncer;
mod terminate;

pub use generate::{NoProbes, ProbeView, StatusInputs, generate_api_pod_status, wall_clock_now};
pub use manager::StatusManager;
pub use reason_cache::ReasonCache;
pub use syncer::{PodDeletionSafety, SYNC_PERIOD, StatusSyncer};
pub use terminate::final_pod_status;

/// The runtime type prefixed to container ids in the API (`containerd://<id>`).
pub const CONTAINER_ID_SCHEME: &str = "containerd";
