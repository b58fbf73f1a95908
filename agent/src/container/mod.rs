//! The container-runtime abstraction the rest of the agent is written against: IDs, the runtime's view
//! of a pod (`PodStatus`), the `Runtime` trait and the timestamped pod cache. Corresponds to the
//! kubelet's `pkg/kubelet/container`.

mod cache;
mod ids;
mod runtime;
mod streaming;

pub use cache::PodCache;
pub use ids::{ContainerId, PodUid, SandboxId};
pub use runtime::{
    ContainerState, ContainerStatus, ImageInfo, PodResize, PodStatus, PodSyncResult,
    RunningContainer, RunningPod, RunningSandbox, Runtime, RuntimeCondition, RuntimeError,
    RuntimeStatus, SandboxState, SandboxStatus, SyncAction, SyncFailure, SyncResult,
};
pub use streaming::{CommandRunner, ExecOutput, ExecRequest, StreamOptions, StreamingRuntime};
