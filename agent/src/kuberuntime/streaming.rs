//! `StreamingRuntime` over the CRI (the kubelet's `kuberuntime_container.go` `GetExec` / `GetAttach` /
//! `GetPortForward` / `RunInContainer` and the log-path lookup of `kuberuntime_logs.go`): each session
//! call only asks the runtime for a URL on its streaming server.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use ringlet_proto::runtime::v1 as cri;

use super::KubeGenericRuntimeManager;
use crate::container::{
    ContainerId, ExecRequest, RuntimeError, SandboxId, StreamOptions, StreamingRuntime,
};

#[async_trait]
impl StreamingRuntime for KubeGenericRuntimeManager {
    async fn get_exec(
        &self,
        container: &ContainerId,
        request: ExecRequest,
    ) -> Result<String, RuntimeError> {
        let streams = request.streams;
        let request = cri::ExecRequest {
            container_id: container.to_string(),
            cmd: request.cmd,
            tty: streams.tty,
            stdin: streams.stdin,
            stdout: streams.stdout,
            stderr: streams.stderr && !streams.tty,
        };
        Ok(self.cri().exec(request).await?)
    }

    async fn get_attach(
        &self,
        container: &ContainerId,
        streams: StreamOptions,
    ) -> Result<String, RuntimeError> {
        let request = cri::AttachRequest {
            container_id: container.to_string(),
            stdin: streams.stdin,
            tty: streams.tty,
            stdout: streams.stdout,
            stderr: streams.stderr && !streams.tty,
        };
        Ok(self.cri().attach(request).await?)
    }

    async fn get_port_forward(
        &self,
        sandbox: &SandboxId,
        ports: Vec<i32>,
    ) -> Result<String, RuntimeError> {
        Ok(self.cri().port_forward(sandbox.as_str(), ports).await?)
    }

    async fn run_in_container(
        &self,
        container: &ContainerId,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<Vec<u8>, RuntimeError> {
        let response = self
            .cri()
            .exec_sync(container.as_str(), cmd.clone(), timeout)
            .await?;
        if response.exit_code != 0 {
            return Err(RuntimeError::Call {
                call: "ExecSync",
                message: format!(
                    "command {cmd:?} in container {container} exited with {}: {}",
                    response.exit_code,
                    String::from_utf8_lossy(&response.stderr).trim_end()
                ),
            });
        }
        let mut output = response.stdout;
        output.extend_from_slice(&response.stderr);
        Ok(output)
    }

    async fn container_log_path(&self, container: &ContainerId) -> Result<PathBuf, RuntimeError> {
        let status = self.cri().container_status(container.as_str()).await?;
        // containerd and CRI-O report the full path (sandbox log directory joined with the
        // container's relative path), which is what the kubelet reads too.
        if status.log_path.is_empty() {
            return Err(RuntimeError::NotFound {
                what: "log file of container",
                id: container.to_string(),
            });
        }
        Ok(PathBuf::from(status.log_path))
    }

    async fn container_running(&self, container: &ContainerId) -> Result<bool, RuntimeError> {
        match self.cri().container_status(container.as_str()).await {
            Ok(status) => Ok(status.state() == cri::ContainerState::ContainerRunning),
            Err(err) if err.is_not_found() => Ok(false),
            Err(err) => Err(err.into()),
        }
    }
}
