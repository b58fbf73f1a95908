//! The runtime side of the kubelet's debugging endpoints (the kubelet's `kubecontainer.StreamingRuntime`
//! and `CommandRunner` from `pkg/kubelet/container`): interactive sessions are served by the runtime's
//! own streaming server, so the agent only asks for a session URL and proxies the client to it.
//! [`CommandRunner`] runs a command to completion, for exec probes and lifecycle hooks.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

use super::{ContainerId, RuntimeError, SandboxId};

/// Which standard streams a session carries. At least one of `stdin`, `stdout` and `stderr` is set;
/// with `tty` there is no separate `stderr` (a terminal has one output stream).
#[allow(
    clippy::struct_excessive_bools,
    reason = "the CRI's own four independent stream flags"
)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// An interactive command to run in a container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    pub cmd: Vec<String>,
    pub streams: StreamOptions,
}

/// Sessions on the runtime's streaming server, and one-shot commands.
#[async_trait]
pub trait StreamingRuntime: Send + Sync + 'static {
    /// Prepares `kubectl exec`; returns the session URL on the runtime's streaming server.
    async fn get_exec(
        &self,
        container: &ContainerId,
        request: ExecRequest,
    ) -> Result<String, RuntimeError>;

    /// Prepares `kubectl attach` to the container's main process; returns the session URL.
    async fn get_attach(
        &self,
        container: &ContainerId,
        streams: StreamOptions,
    ) -> Result<String, RuntimeError>;

    /// Prepares `kubectl port-forward` into the sandbox's network namespace; returns the session URL.
    /// `ports` may be empty: SPDY clients name the port per stream instead.
    async fn get_port_forward(
        &self,
        sandbox: &SandboxId,
        ports: Vec<i32>,
    ) -> Result<String, RuntimeError>;

    /// Runs `cmd` to completion (the kubelet's `RunInContainer`, behind `/run/...`) and returns its
    /// stdout followed by its stderr. A non-zero exit is an error carrying the code and stderr, as
    /// upstream.
    async fn run_in_container(
        &self,
        container: &ContainerId,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<Vec<u8>, RuntimeError>;

    /// Where the runtime writes the container's CRI-format log file.
    async fn container_log_path(&self, container: &ContainerId) -> Result<PathBuf, RuntimeError>;

    /// Whether the container is still running: a followed log ends once it is not.
    async fn container_running(&self, container: &ContainerId) -> Result<bool, RuntimeError>;
}

/// What a command run to completion in a container left behind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Runs commands in containers to completion (the kubelet's `CommandRunner` as the prober and the
/// lifecycle handlers use it).
#[async_trait]
pub trait CommandRunner: Send + Sync + 'static {
    /// Runs `cmd` in the container (CRI `ExecSync`) and returns its exit code and output, whatever
    /// the exit code. A command still running after `timeout` is killed by the runtime and reported
    /// as [`RuntimeError::Timeout`]; a zero `timeout` sets no limit of its own (the runtime request
    /// timeout still bounds the call).
    async fn exec_sync(
        &self,
        container: &ContainerId,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError>;
}
