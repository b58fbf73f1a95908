//! `StreamingRuntime` over the CRI (the kubelet's `kuberuntime_container.go` `GetExec` / `GetAttach` /
//! `GetPortForward` / `RunInContainer` and the log-path lookup of `kuberuntime_logs.go`): each session
//! call only asks the runtime for a URL on its streaming server. Also the `CommandRunner` exec probes
//! and lifecycle hooks run their commands with (`ExecSync`).

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use ringlet_proto::runtime::v1 as cri;

use super::KubeGenericRuntimeManager;
use crate::container::{
    CommandRunner, ContainerId, ExecOutput, ExecRequest, RuntimeError, SandboxId, StreamOptions,
    StreamingRuntime,
};

#[async_trait]
impl CommandRunner for KubeGenericRuntimeManager {
    async fn exec_sync(
        &self,
        container: &ContainerId,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, RuntimeError> {
        let response = self
            .cri()
            .exec_sync(container.as_str(), cmd, timeout)
            .await?;
        Ok(ExecOutput {
            exit_code: response.exit_code,
            stdout: response.stdout,
            stderr: response.stderr,
        })
    }
}

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

/// The CRI mapping against a fake runtime on a temporary socket.
#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::{Arc, Mutex};

    use k8s_openapi::api::core::v1::Pod;
    use ringlet_proto::runtime::v1::runtime_service_server::{
        RuntimeService, RuntimeServiceServer,
    };
    use tokio::net::UnixListener;
    use tokio_stream::wrappers::UnixListenerStream;
    use tonic::{Request, Response, Status};

    use super::*;
    use crate::container::PodUid;
    use crate::events::Recorder;
    use crate::kuberuntime::{CriClient, RuntimeHelper, RuntimeSettings};

    /// Remembers the session requests; containers `app` (running, with a log), `exited`,
    /// `nolog` (running, no log path) exist; exec in `fail` exits 2.
    #[derive(Default)]
    struct Fake {
        exec: Mutex<Option<cri::ExecRequest>>,
        attach: Mutex<Option<cri::AttachRequest>>,
        port_forward: Mutex<Option<cri::PortForwardRequest>>,
    }

    #[tonic::async_trait]
    impl RuntimeService for Fake {
        async fn exec(
            &self,
            request: Request<cri::ExecRequest>,
        ) -> Result<Response<cri::ExecResponse>, Status> {
            let request = request.into_inner();
            let url = format!("http://127.0.0.1:1/exec/{}", request.container_id);
            *self.exec.lock().unwrap() = Some(request);
            Ok(Response::new(cri::ExecResponse { url }))
        }

        async fn attach(
            &self,
            request: Request<cri::AttachRequest>,
        ) -> Result<Response<cri::AttachResponse>, Status> {
            *self.attach.lock().unwrap() = Some(request.into_inner());
            Ok(Response::new(cri::AttachResponse {
                url: "http://127.0.0.1:1/attach/t".into(),
            }))
        }

        async fn port_forward(
            &self,
            request: Request<cri::PortForwardRequest>,
        ) -> Result<Response<cri::PortForwardResponse>, Status> {
            *self.port_forward.lock().unwrap() = Some(request.into_inner());
            Ok(Response::new(cri::PortForwardResponse {
                url: "http://127.0.0.1:1/portforward/t".into(),
            }))
        }

        async fn exec_sync(
            &self,
            request: Request<cri::ExecSyncRequest>,
        ) -> Result<Response<cri::ExecSyncResponse>, Status> {
            let exit_code = if request.get_ref().container_id == "fail" {
                2
            } else {
                0
            };
            Ok(Response::new(cri::ExecSyncResponse {
                stdout: b"out\n".to_vec(),
                stderr: b"err\n".to_vec(),
                exit_code,
            }))
        }

        async fn container_status(
            &self,
            request: Request<cri::ContainerStatusRequest>,
        ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
            let id = request.into_inner().container_id;
            let (state, log_path) = match id.as_str() {
                "app" => (
                    cri::ContainerState::ContainerRunning,
                    "/var/log/pods/x/app/0.log",
                ),
                "exited" => (
                    cri::ContainerState::ContainerExited,
                    "/var/log/pods/x/e/0.log",
                ),
                "nolog" => (cri::ContainerState::ContainerRunning, ""),
                _ => return Err(Status::not_found(format!("container {id} not found"))),
            };
            Ok(Response::new(cri::ContainerStatusResponse {
                status: Some(cri::ContainerStatus {
                    id,
                    state: state.into(),
                    log_path: log_path.into(),
                    ..cri::ContainerStatus::default()
                }),
                info: std::collections::HashMap::default(),
            }))
        }
    }

    struct Helper;

    impl RuntimeHelper for Helper {
        fn pod_cgroup_parent(&self, _pod: &Pod) -> Result<String, String> {
            Ok("/kubepods".into())
        }
        fn pod_dir(&self, uid: &PodUid) -> PathBuf {
            Path::new("/nonexistent").join(uid.as_str())
        }
        fn node_name(&self) -> &'static str {
            "node"
        }
        fn pod_log_dir(&self, _namespace: &str, _name: &str, uid: &PodUid) -> PathBuf {
            Path::new("/nonexistent").join(uid.as_str())
        }
    }

    fn serve(fake: Arc<Fake>) -> (tempfile::TempDir, KubeGenericRuntimeManager) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let incoming = UnixListenerStream::new(UnixListener::bind(&socket).unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .serve_with_incoming(RuntimeServiceServer::from_arc(fake), incoming),
        );
        let cri = CriClient::new(&socket.display().to_string(), Duration::from_secs(5)).unwrap();
        let manager = KubeGenericRuntimeManager::new(
            cri,
            Arc::new(Helper),
            Recorder::new(None),
            RuntimeSettings::default(),
        );
        (dir, manager)
    }

    #[tokio::test]
    async fn sessions_ask_the_runtime_for_urls_with_the_requested_streams() {
        let fake = Arc::new(Fake::default());
        let (_dir, manager) = serve(Arc::clone(&fake));
        let id = ContainerId::from("app");
        let tty = StreamOptions {
            stdin: true,
            stdout: true,
            stderr: true,
            tty: true,
        };
        let url = manager
            .get_exec(
                &id,
                ExecRequest {
                    cmd: vec!["sh".into()],
                    streams: tty,
                },
            )
            .await
            .unwrap();
        assert_eq!(url, "http://127.0.0.1:1/exec/app");
        let exec = fake.exec.lock().unwrap().take().unwrap();
        assert_eq!(exec.cmd, ["sh"]);
        assert!(exec.tty && exec.stdin && exec.stdout);
        assert!(!exec.stderr, "a terminal has no separate stderr");

        let streams = StreamOptions {
            stdout: true,
            stderr: true,
            ..StreamOptions::default()
        };
        manager.get_attach(&id, streams).await.unwrap();
        let attach = fake.attach.lock().unwrap().take().unwrap();
        assert_eq!(
            (
                attach.container_id.as_str(),
                attach.stdin,
                attach.stdout,
                attach.stderr,
                attach.tty
            ),
            ("app", false, true, true, false)
        );

        let url = manager
            .get_port_forward(&SandboxId::from("sb"), vec![80, 443])
            .await
            .unwrap();
        assert_eq!(url, "http://127.0.0.1:1/portforward/t");
        let forward = fake.port_forward.lock().unwrap().take().unwrap();
        assert_eq!(
            (forward.pod_sandbox_id.as_str(), forward.port),
            ("sb", vec![80, 443])
        );
    }

    #[tokio::test]
    async fn run_log_path_and_liveness_map_the_runtimes_answers() {
        let (_dir, manager) = serve(Arc::new(Fake::default()));
        let output = manager
            .run_in_container(&"app".into(), vec!["x".into()], Duration::from_secs(1))
            .await
            .unwrap();
        assert_eq!(output, b"out\nerr\n");
        let err = manager
            .run_in_container(&"fail".into(), vec!["x".into()], Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "runtime call ExecSync failed: command [\"x\"] in container fail exited with 2: err"
        );

        assert_eq!(
            manager.container_log_path(&"app".into()).await.unwrap(),
            Path::new("/var/log/pods/x/app/0.log")
        );
        assert!(matches!(
            manager.container_log_path(&"nolog".into()).await,
            Err(RuntimeError::NotFound { .. })
        ));
        assert!(matches!(
            manager.container_log_path(&"gone".into()).await,
            Err(RuntimeError::NotFound { .. })
        ));

        assert!(manager.container_running(&"app".into()).await.unwrap());
        assert!(!manager.container_running(&"exited".into()).await.unwrap());
        assert!(
            !manager.container_running(&"gone".into()).await.unwrap(),
            "a removed container is not running"
        );
    }
}

/// Exec, run and logs against the lab's real containerd (ignored by default, like `smoke_tests`):
/// `cargo test -p ringlet --lib kuberuntime::streaming -- --ignored`.
#[cfg(test)]
mod smoke_tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::panic::AssertUnwindSafe;
    use std::path::Path;
    use std::sync::Arc;

    use futures::{FutureExt, StreamExt};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use tokio::net::TcpListener;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    use super::super::smoke_tests::{SOCKET, manager, remove_pod, status_when};
    use super::*;
    use crate::container::{ContainerState, PodStatus, PodUid, Runtime};
    use crate::io::IoEngine;
    use crate::kuberuntime::logs::{LogOptions, read_logs};

    fn container(name: &str, script: &str) -> Container {
        Container {
            name: name.into(),
            image: Some("busybox".into()),
            image_pull_policy: Some("IfNotPresent".into()),
            command: Some(vec!["sh".into(), "-c".into(), script.into()]),
            ..Container::default()
        }
    }

    /// Runs a v4.channel.k8s.io WebSocket session on `url` and returns its stdout (channel 1) and
    /// its status message (channel 3).
    async fn websocket_exec(url: &str) -> (String, String) {
        let mut request = url
            .replacen("http://", "ws://", 1)
            .into_client_request()
            .unwrap();
        request.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "v4.channel.k8s.io".parse().unwrap(),
        );
        let (mut socket, response) = tokio_tungstenite::connect_async(request).await.unwrap();
        assert_eq!(
            response.headers()["sec-websocket-protocol"],
            "v4.channel.k8s.io"
        );
        let (mut stdout, mut status) = (Vec::new(), Vec::new());
        while let Some(message) = socket.next().await {
            match message.unwrap() {
                Message::Binary(data) => match data.split_first() {
                    Some((1, rest)) => stdout.extend_from_slice(rest),
                    Some((3, rest)) => status.extend_from_slice(rest),
                    _ => {}
                },
                Message::Close(_) => break,
                _ => {}
            }
        }
        let _ = socket.close(None).await;
        (
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(status).unwrap(),
        )
    }

    /// The agent's proxy in front of one session URL.
    async fn proxy(target: String) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(move |request| {
                let target = target.clone();
                async move {
                    Ok::<_, Infallible>(
                        crate::server::streaming::proxy_to_runtime(request, &target).await,
                    )
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
        addr
    }

    #[tokio::test]
    #[ignore = "needs root and the lab's containerd at /run/containerd/containerd.sock"]
    async fn exec_run_and_logs_on_a_real_container() {
        assert!(
            Path::new(SOCKET).exists(),
            "no containerd socket at {SOCKET}"
        );
        let root = tempfile::tempdir().unwrap();
        let manager = Arc::new(manager(root.path()));
        let uid = PodUid::from(format!("smoke-streaming-{}", std::process::id()));
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some("smoke-streaming".into()),
                namespace: Some("ringlet-smoke".into()),
                uid: Some(uid.to_string()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                host_network: Some(true),
                termination_grace_period_seconds: Some(1),
                containers: vec![
                    container("app", "echo line-one; echo line-two >&2; sleep 3600"),
                    container("ticker", "for i in 1 2 3; do echo tick $i; sleep 1; done"),
                ],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let scenario = AssertUnwindSafe(scenario(Arc::clone(&manager), &pod, &uid));
        let outcome = scenario.catch_unwind().await;
        remove_pod(&manager, &uid).await;
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    async fn scenario(manager: Arc<KubeGenericRuntimeManager>, pod: &Pod, uid: &PodUid) {
        let synced = manager.sync_pod(pod, &PodStatus::default()).await;
        assert_eq!(synced.first_failure(), None, "{synced:?}");
        let pod_status = status_when(&manager, uid, |s| {
            s.container("app")
                .is_some_and(|c| c.state == ContainerState::Running)
                && s.container("ticker").is_some()
        })
        .await;
        let app = pod_status.container("app").unwrap().id.clone();
        let ticker = pod_status.container("ticker").unwrap().id.clone();
        let exec = |cmd: &str| ExecRequest {
            cmd: vec!["echo".into(), cmd.into()],
            streams: StreamOptions {
                stdout: true,
                stderr: true,
                ..StreamOptions::default()
            },
        };

        // Straight to the runtime's streaming server, then through the agent's proxy.
        let url = manager.get_exec(&app, exec("hello-exec")).await.unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");
        let (stdout, status) = websocket_exec(&url).await;
        assert_eq!(stdout, "hello-exec\n");
        assert!(status.contains("Success"), "{status}");
        let url = manager.get_exec(&app, exec("via-proxy")).await.unwrap();
        let path = url.splitn(4, '/').nth(3).unwrap().to_owned();
        let proxied = proxy(url).await;
        let (stdout, _) = websocket_exec(&format!("http://{proxied}/{path}")).await;
        assert_eq!(stdout, "via-proxy\n");

        let output = manager
            .run_in_container(
                &app,
                vec!["sh".into(), "-c".into(), "echo out; echo err >&2".into()],
                Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(String::from_utf8(output).unwrap(), "out\nerr\n");
        let err = manager
            .run_in_container(
                &app,
                vec!["sh".into(), "-c".into(), "echo bad >&2; exit 3".into()],
                Duration::from_secs(10),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("exited with 3: bad"), "{err}");

        let sandbox = &pod_status.sandboxes[0].id;
        let url = manager.get_port_forward(sandbox, vec![80]).await.unwrap();
        assert!(url.starts_with("http://127.0.0.1:"), "{url}");

        let path = manager.container_log_path(&app).await.unwrap();
        assert!(
            path.starts_with(
                manager
                    .helper
                    .pod_log_dir("ringlet-smoke", "smoke-streaming", uid)
            )
        );
        let chunks: Vec<_> = read_logs(path, LogOptions::default(), IoEngine::Epoll, || async {
            true
        })
        .collect()
        .await;
        let text: String = chunks
            .into_iter()
            .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
            .collect();
        assert!(
            text.contains("line-one\n") && text.contains("line-two\n"),
            "{text}"
        );

        // Following ends by itself once the ticker exits.
        let path = manager.container_log_path(&ticker).await.unwrap();
        let options = LogOptions {
            follow: true,
            ..LogOptions::default()
        };
        let runtime = Arc::clone(&manager);
        let still_running = move || {
            let runtime = Arc::clone(&runtime);
            let id = ticker.clone();
            async move { runtime.container_running(&id).await.unwrap_or(false) }
        };
        let followed = tokio::time::timeout(
            Duration::from_secs(30),
            read_logs(path, options, IoEngine::Epoll, still_running).collect::<Vec<_>>(),
        )
        .await
        .expect("the followed log ends when the container exits");
        let text: String = followed
            .into_iter()
            .map(|c| String::from_utf8(c.unwrap().to_vec()).unwrap())
            .collect();
        assert_eq!(text, "tick 1\ntick 2\ntick 3\n");
    }
}
