//! The CRI gRPC client (the kubelet's `pkg/kubelet/cri/remote`: `remoteRuntimeService` and
//! `remoteImageService`): one lazily connected channel over the runtime's unix socket, a deadline on
//! every call, and errors that name the call and say whether the runtime was down, slow, missing the
//! object, or does not implement the call.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use ringlet_proto::runtime::v1 as cri;
use ringlet_proto::runtime::v1::image_service_client::ImageServiceClient;
use ringlet_proto::runtime::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::container::RuntimeError;

/// The CRI version the client speaks, sent in `Version`.
const CRI_VERSION: &str = "v1";

/// Pulls legitimately outlast the ordinary request timeout (upstream gives them no deadline at all);
/// this only keeps a wedged pull from holding a pod worker forever.
const MIN_PULL_TIMEOUT: Duration = Duration::from_mins(15);

/// The largest CRI message the client sends or accepts: the kubelet's `maxMsgSize` (16 MiB) in
/// `pkg/kubelet/cri/remote`. tonic's default of 4 MiB is not enough for `ListContainers` on a dense
/// node (a few KiB of labels and annotations per container), and a refused listing fails the relist.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// Why a CRI call failed.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("invalid CRI endpoint {endpoint:?}: only unix:// endpoints are supported")]
    InvalidEndpoint { endpoint: String },
    #[error("CRI call {call} failed: runtime unavailable at {endpoint}: {message}")]
    Unavailable {
        call: &'static str,
        endpoint: String,
        message: String,
    },
    #[error("CRI call {call} failed: timed out after {timeout:?}")]
    Timeout {
        call: &'static str,
        timeout: Duration,
    },
    #[error("CRI call {call} failed: not found: {message}")]
    NotFound { call: &'static str, message: String },
    /// The runtime does not serve this call: a missing feature, not a broken runtime.
    #[error("CRI call {call} failed: not supported by the runtime: {message}")]
    Unimplemented { call: &'static str, message: String },
    #[error("CRI call {call} failed: {code:?}: {message}")]
    Call {
        call: &'static str,
        code: Code,
        message: String,
    },
    #[error("CRI call {call} failed: the response has no {field}")]
    MissingField {
        call: &'static str,
        field: &'static str,
    },
}

impl CriError {
    fn from_status(call: &'static str, status: &Status, timeout: Duration, endpoint: &str) -> Self {
        let message = status.message().to_owned();
        match status.code() {
            Code::Unavailable => Self::Unavailable {
                call,
                endpoint: endpoint.to_owned(),
                message,
            },
            Code::DeadlineExceeded => Self::Timeout { call, timeout },
            Code::NotFound => Self::NotFound { call, message },
            Code::Unimplemented => Self::Unimplemented { call, message },
            code => Self::Call {
                call,
                code,
                message,
            },
        }
    }

    /// Whether the object the call named does not exist (removed concurrently, usually).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether the runtime does not implement the call.
    pub fn is_unimplemented(&self) -> bool {
        matches!(self, Self::Unimplemented { .. })
    }

    /// The call that failed, if the error came from one.
    pub fn call(&self) -> Option<&'static str> {
        match self {
            Self::InvalidEndpoint { .. } => None,
            Self::Unavailable { call, .. }
            | Self::Timeout { call, .. }
            | Self::NotFound { call, .. }
            | Self::Unimplemented { call, .. }
            | Self::Call { call, .. }
            | Self::MissingField { call, .. } => Some(call),
        }
    }
}

impl From<CriError> for RuntimeError {
    fn from(err: CriError) -> Self {
        let message = err.to_string();
        match err {
            CriError::InvalidEndpoint { endpoint } | CriError::Unavailable { endpoint, .. } => {
                Self::Unavailable { endpoint, message }
            }
            CriError::Timeout { call, timeout } => Self::Timeout {
                call,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            },
            CriError::NotFound { call, .. } => Self::NotFound {
                what: "object of CRI call",
                id: format!("{call}: {message}"),
            },
            CriError::Unimplemented { call, .. }
            | CriError::Call { call, .. }
            | CriError::MissingField { call, .. } => Self::Call { call, message },
        }
    }
}

/// A cloneable client for the runtime and image services of one CRI endpoint.
#[derive(Clone, Debug)]
pub struct CriClient {
    endpoint: String,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
}

/// Runs one unary call under the client's deadline and maps its status.
macro_rules! call {
    ($self:ident, $client:ident, $method:ident, $name:literal, $request:expr) => {
        call!($self, $client, $method, $name, $request, $self.timeout)
    };
    ($self:ident, $client:ident, $method:ident, $name:literal, $request:expr, $timeout:expr) => {{
        let mut client = $self.$client.clone();
        let timeout = $timeout;
        match tokio::time::timeout(timeout, client.$method($request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(CriError::from_status(
                $name,
                &status,
                timeout,
                &$self.endpoint,
            )),
            Err(_) => Err(CriError::Timeout {
                call: $name,
                timeout,
            }),
        }
    }};
}

impl CriClient {
    /// A client for `endpoint` (`unix:///run/containerd/containerd.sock` or a bare socket path).
    /// Connecting is lazy: the agent starts while the runtime is down, and each call reconnects as
    /// needed. `timeout` bounds every call (`--runtime-request-timeout`).
    pub fn new(endpoint: &str, timeout: Duration) -> Result<Self, CriError> {
        let path = socket_path(endpoint)?;
        // The URI is required by tonic but never resolved: the connector dials the socket.
        let channel = Endpoint::from_static("http://cri.invalid").connect_with_connector_lazy(
            tower::service_fn(move |_| {
                let path = path.clone();
                async move { UnixStream::connect(path).await.map(TokioIo::new) }
            }),
        );
        Ok(Self::from_channel(endpoint, channel, timeout))
    }

    /// A client over an existing channel, e.g. one whose connector does its socket I/O through
    /// another engine; `endpoint` is only used in messages.
    pub fn from_channel(endpoint: &str, channel: Channel, timeout: Duration) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            timeout,
        }
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The deadline of an ordinary call (`--runtime-request-timeout`).
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    pub async fn version(&self) -> Result<cri::VersionResponse, CriError> {
        let request = cri::VersionRequest {
            version: CRI_VERSION.to_owned(),
        };
        call!(self, runtime, version, "Version", request)
    }

    pub async fn status(&self) -> Result<cri::RuntimeStatus, CriError> {
        let response = call!(
            self,
            runtime,
            status,
            "Status",
            cri::StatusRequest::default()
        )?;
        response.status.ok_or(CriError::MissingField {
            call: "Status",
            field: "status",
        })
    }

    /// Creates and starts a sandbox; returns its id.
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
        runtime_handler: &str,
    ) -> Result<String, CriError> {
        let request = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: runtime_handler.to_owned(),
        };
        let response = call!(self, runtime, run_pod_sandbox, "RunPodSandbox", request)?;
        Ok(response.pod_sandbox_id)
    }

    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        call!(self, runtime, stop_pod_sandbox, "StopPodSandbox", request).map(drop)
    }

    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let request = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        call!(
            self,
            runtime,
            remove_pod_sandbox,
            "RemovePodSandbox",
            request
        )
        .map(drop)
    }

    pub async fn pod_sandbox_status(&self, id: &str) -> Result<cri::PodSandboxStatus, CriError> {
        let response = self.pod_sandbox_status_response(id, false).await?;
        response.status.ok_or(CriError::MissingField {
            call: "PodSandboxStatus",
            field: "status",
        })
    }

    async fn pod_sandbox_status_response(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::PodSandboxStatusResponse, CriError> {
        let request = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_owned(),
            verbose,
        };
        call!(
            self,
            runtime,
            pod_sandbox_status,
            "PodSandboxStatus",
            request
        )
    }

    pub async fn list_pod_sandbox(
        &self,
        filter: Option<cri::PodSandboxFilter>,
    ) -> Result<Vec<cri::PodSandbox>, CriError> {
        let request = cri::ListPodSandboxRequest { filter };
        let response = call!(self, runtime, list_pod_sandbox, "ListPodSandbox", request)?;
        Ok(response.items)
    }

    /// Creates a container in a sandbox; returns its id.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let response = call!(self, runtime, create_container, "CreateContainer", request)?;
        Ok(response.container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let request = cri::StartContainerRequest {
            container_id: id.to_owned(),
        };
        call!(self, runtime, start_container, "StartContainer", request).map(drop)
    }

    /// Stops a container, killing it after `grace_seconds`. The call's own deadline is extended by
    /// the grace period, since the runtime legitimately takes that long.
    pub async fn stop_container(&self, id: &str, grace_seconds: i64) -> Result<(), CriError> {
        let request = cri::StopContainerRequest {
            container_id: id.to_owned(),
            timeout: grace_seconds,
        };
        let grace = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0));
        call!(
            self,
            runtime,
            stop_container,
            "StopContainer",
            request,
            self.timeout + grace
        )
        .map(drop)
    }

    pub async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let request = cri::RemoveContainerRequest {
            container_id: id.to_owned(),
        };
        call!(self, runtime, remove_container, "RemoveContainer", request).map(drop)
    }

    pub async fn list_containers(
        &self,
        filter: Option<cri::ContainerFilter>,
    ) -> Result<Vec<cri::Container>, CriError> {
        let request = cri::ListContainersRequest { filter };
        let response = call!(self, runtime, list_containers, "ListContainers", request)?;
        Ok(response.containers)
    }

    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        let request = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        };
        let response = call!(self, runtime, container_status, "ContainerStatus", request)?;
        response.status.ok_or(CriError::MissingField {
            call: "ContainerStatus",
            field: "status",
        })
    }

    /// Applies new cgroup settings to a running container (an in-place resize).
    pub async fn update_container_resources(
        &self,
        id: &str,
        linux: cri::LinuxContainerResources,
    ) -> Result<(), CriError> {
        let request = cri::UpdateContainerResourcesRequest {
            container_id: id.to_owned(),
            linux: Some(linux),
            annotations: std::collections::HashMap::new(),
        };
        call!(
            self,
            runtime,
            update_container_resources,
            "UpdateContainerResources",
            request
        )
        .map(drop)
    }

    /// Asks the runtime to write the container's output to a new file at its log path, after log
    /// rotation renamed the old one away.
    pub async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        let request = cri::ReopenContainerLogRequest {
            container_id: id.to_owned(),
        };
        call!(
            self,
            runtime,
            reopen_container_log,
            "ReopenContainerLog",
            request
        )
        .map(drop)
    }

    /// The container's init pid from the verbose status: containerd's `info` entry is JSON with a
    /// `pid` field. `None` when the runtime reports no (or no positive) pid.
    pub async fn container_pid(&self, id: &str) -> Result<Option<u32>, CriError> {
        let request = cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: true,
        };
        let response = call!(self, runtime, container_status, "ContainerStatus", request)?;
        Ok(response.info.get("info").and_then(|info| verbose_pid(info)))
    }

    /// The sandbox's init (pause) pid from the verbose status, as for [`CriClient::container_pid`].
    pub async fn sandbox_pid(&self, id: &str) -> Result<Option<u32>, CriError> {
        let response = self.pod_sandbox_status_response(id, true).await?;
        Ok(response.info.get("info").and_then(|info| verbose_pid(info)))
    }

    /// Runs `cmd` in a container and waits up to `timeout` for it (plus the call deadline).
    pub async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<cri::ExecSyncResponse, CriError> {
        let request = cri::ExecSyncRequest {
            container_id: id.to_owned(),
            cmd,
            timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        };
        call!(
            self,
            runtime,
            exec_sync,
            "ExecSync",
            request,
            self.timeout + timeout
        )
    }

    /// Prepares an interactive exec session; returns its URL on the runtime's streaming server.
    pub async fn exec(&self, request: cri::ExecRequest) -> Result<String, CriError> {
        let response = call!(self, runtime, exec, "Exec", request)?;
        Ok(response.url)
    }

    /// Prepares an attach session to a container's main process; returns its URL.
    pub async fn attach(&self, request: cri::AttachRequest) -> Result<String, CriError> {
        let response = call!(self, runtime, attach, "Attach", request)?;
        Ok(response.url)
    }

    /// Prepares a port-forward session into a sandbox's network namespace; returns its URL.
    pub async fn port_forward(
        &self,
        sandbox_id: &str,
        ports: Vec<i32>,
    ) -> Result<String, CriError> {
        let request = cri::PortForwardRequest {
            pod_sandbox_id: sandbox_id.to_owned(),
            port: ports,
        };
        let response = call!(self, runtime, port_forward, "PortForward", request)?;
        Ok(response.url)
    }

    pub async fn list_images(
        &self,
        filter: Option<cri::ImageFilter>,
    ) -> Result<Vec<cri::Image>, CriError> {
        let request = cri::ListImagesRequest { filter };
        let response = call!(self, images, list_images, "ListImages", request)?;
        Ok(response.images)
    }

    /// The image, or `None` when it is not present on the node.
    pub async fn image_status(&self, image: &str) -> Result<Option<cri::Image>, CriError> {
        let request = cri::ImageStatusRequest {
            image: Some(image_spec(image)),
            verbose: false,
        };
        let response = call!(self, images, image_status, "ImageStatus", request)?;
        Ok(response.image)
    }

    /// Pulls an image, with the registry credentials `auth` when given; returns the runtime's
    /// reference to it. Bounded by at least 15 minutes.
    pub async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let request = cri::PullImageRequest {
            image: Some(image_spec(image)),
            auth,
            sandbox_config,
        };
        let response = call!(
            self,
            images,
            pull_image,
            "PullImage",
            request,
            self.timeout.max(MIN_PULL_TIMEOUT)
        )?;
        Ok(response.image_ref)
    }

    pub async fn remove_image(&self, image: &str) -> Result<(), CriError> {
        let request = cri::RemoveImageRequest {
            image: Some(image_spec(image)),
        };
        call!(self, images, remove_image, "RemoveImage", request).map(drop)
    }

    /// What the filesystems holding images use, as the runtime reports it.
    pub async fn image_fs_info(&self) -> Result<cri::ImageFsInfoResponse, CriError> {
        call!(
            self,
            images,
            image_fs_info,
            "ImageFsInfo",
            cri::ImageFsInfoRequest {}
        )
    }

    /// The runtime's verbose `Status` information (containerd: its configuration as JSON under
    /// `config`, which names the sandbox image).
    pub async fn status_info(&self) -> Result<HashMap<String, String>, CriError> {
        let request = cri::StatusRequest { verbose: true };
        let response = call!(self, runtime, status, "Status", request)?;
        Ok(response.info)
    }
}

fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        ..cri::ImageSpec::default()
    }
}

/// The `pid` of a verbose `ContainerStatus`'s `info` JSON (containerd's layout; CRI-O's too).
fn verbose_pid(info: &str) -> Option<u32> {
    let info: serde_json::Value = serde_json::from_str(info).ok()?;
    let pid = u32::try_from(info.get("pid")?.as_u64()?).ok()?;
    (pid > 0).then_some(pid)
}

/// The socket path of a `unix://` endpoint; a bare absolute path is accepted as well.
fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(CriError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use ringlet_proto::runtime::v1::runtime_service_server::{
        RuntimeService, RuntimeServiceServer,
    };
    use tokio::net::UnixListener;
    use tokio_stream::wrappers::UnixListenerStream;

    use super::*;

    #[test]
    fn the_verbose_info_names_the_init_pid() {
        assert_eq!(
            verbose_pid(r#"{"sandboxID":"abc","pid":4242,"removing":false}"#),
            Some(4242)
        );
        assert_eq!(verbose_pid(r#"{"pid":0}"#), None, "not started");
        assert_eq!(verbose_pid(r#"{"sandboxID":"abc"}"#), None);
        assert_eq!(verbose_pid("not json"), None);
    }

    #[test]
    fn endpoints_resolve_to_socket_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        assert!(matches!(
            socket_path("tcp://localhost:1234"),
            Err(CriError::InvalidEndpoint { .. })
        ));
    }

    #[test]
    fn status_codes_map_to_kinds_naming_the_call() {
        let t = Duration::from_secs(1);
        let err = CriError::from_status(
            "RunPodSandbox",
            &Status::unavailable("down"),
            t,
            "unix:///x.sock",
        );
        assert_eq!(
            err.to_string(),
            "CRI call RunPodSandbox failed: runtime unavailable at unix:///x.sock: down"
        );
        assert!(
            CriError::from_status("GetContainerEvents", &Status::unimplemented("x"), t, "")
                .is_unimplemented()
        );
        assert!(
            CriError::from_status("ContainerStatus", &Status::not_found("x"), t, "").is_not_found()
        );
        assert!(matches!(
            CriError::from_status("StopContainer", &Status::deadline_exceeded("x"), t, ""),
            CriError::Timeout {
                call: "StopContainer",
                ..
            }
        ));
        let runtime: RuntimeError = CriError::Timeout {
            call: "ListContainers",
            timeout: Duration::from_secs(2),
        }
        .into();
        assert!(matches!(
            runtime,
            RuntimeError::Timeout {
                call: "ListContainers",
                timeout_ms: 2000
            }
        ));
    }

    #[test]
    fn stream_requests_use_upstream_field_numbers() {
        use prost::Message;
        // Attach orders its flags differently from Exec upstream: a slip here swaps streams.
        let attach = cri::AttachRequest {
            stdout: true,
            ..cri::AttachRequest::default()
        };
        assert_eq!(attach.encode_to_vec(), [4 << 3, 1]);
        let exec = cri::ExecRequest {
            stdout: true,
            ..cri::ExecRequest::default()
        };
        assert_eq!(exec.encode_to_vec(), [5 << 3, 1]);
        let forward = cri::PortForwardRequest {
            port: vec![80],
            ..cri::PortForwardRequest::default()
        };
        // Field 2, packed (length-delimited): one byte of varints.
        assert_eq!(forward.encode_to_vec(), [(2 << 3) | 2, 1, 80]);
    }

    /// A runtime whose `ListContainers` answers with containers carrying `label_bytes` of labels
    /// each, `count` of them.
    struct BigListing {
        count: usize,
        label_bytes: usize,
    }

    #[tonic::async_trait]
    impl RuntimeService for BigListing {
        async fn list_containers(
            &self,
            _request: tonic::Request<cri::ListContainersRequest>,
        ) -> Result<tonic::Response<cri::ListContainersResponse>, Status> {
            let containers = (0..self.count)
                .map(|i| cri::Container {
                    id: format!("container-{i}"),
                    labels: [("padding".to_owned(), "x".repeat(self.label_bytes))].into(),
                    ..cri::Container::default()
                })
                .collect();
            Ok(tonic::Response::new(cri::ListContainersResponse {
                containers,
            }))
        }
    }

    /// Serves `runtime` on a unix socket in a temporary directory and returns a client for it.
    fn serve(runtime: BigListing) -> (tempfile::TempDir, CriClient) {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("cri.sock");
        let incoming = UnixListenerStream::new(UnixListener::bind(&socket).unwrap());
        tokio::spawn(
            tonic::transport::Server::builder()
                .serve_with_incoming(RuntimeServiceServer::new(runtime), incoming),
        );
        let endpoint = format!("unix://{}", socket.display());
        let client = CriClient::new(&endpoint, Duration::from_secs(30)).unwrap();
        (dir, client)
    }

    #[tokio::test]
    async fn a_listing_over_four_mebibytes_is_accepted_as_by_the_kubelet() {
        // 3,000 containers of 2 KiB labels: about 6 MiB, over tonic's default limit of 4 MiB.
        let (_dir, client) = serve(BigListing {
            count: 3_000,
            label_bytes: 2048,
        });
        let containers = client.list_containers(None).await.unwrap();
        assert_eq!(containers.len(), 3_000);
        let size: usize = containers.iter().map(prost::Message::encoded_len).sum();
        assert!(size > 4 * 1024 * 1024, "only {size} bytes");
    }

    #[tokio::test]
    async fn a_listing_over_the_limit_is_refused_with_the_call_named() {
        // 17 MiB: past the kubelet's limit too, so the limit still protects the agent.
        let (_dir, client) = serve(BigListing {
            count: 17,
            label_bytes: 1024 * 1024,
        });
        let err = client.list_containers(None).await.unwrap_err();
        assert!(
            matches!(
                err,
                CriError::Call {
                    call: "ListContainers",
                    code: Code::OutOfRange | Code::ResourceExhausted | Code::Internal,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn a_missing_socket_is_unavailable_not_a_startup_failure() {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!("unix://{}/none.sock", dir.path().display());
        let client = CriClient::new(&endpoint, Duration::from_secs(5)).unwrap();
        let err = client.version().await.unwrap_err();
        assert!(
            matches!(
                err,
                CriError::Unavailable {
                    call: "Version",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}
