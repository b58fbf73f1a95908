//! Tests of the fake CRI runtime itself, through the generated tonic clients over its unix socket:
//! they pin down that the double answers like containerd 1.6 on the points the agent relies on, so
//! the component tests built on it test the agent and not the fake.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use ringlet_proto::runtime::v1 as cri;
use ringlet_proto::runtime::v1::image_service_client::ImageServiceClient;
use ringlet_proto::runtime::v1::runtime_service_client::RuntimeServiceClient;
use support::fake_cri::{FakeCri, StopBehaviour, image_id, normalise_image};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

async fn connect(fake: &FakeCri) -> (RuntimeServiceClient<Channel>, ImageServiceClient<Channel>) {
    let channel = Endpoint::from_shared(fake.endpoint())
        .unwrap_or_else(|e| panic!("bad endpoint {}: {e}", fake.endpoint()))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", fake.endpoint()));
    (
        RuntimeServiceClient::new(channel.clone()),
        ImageServiceClient::new(channel),
    )
}

fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn sandbox_config(
    name: &str,
    uid: &str,
    attempt: u32,
    host_network: bool,
) -> cri::PodSandboxConfig {
    let network = if host_network {
        cri::NamespaceMode::Node
    } else {
        cri::NamespaceMode::Pod
    };
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.to_owned(),
            uid: uid.to_owned(),
            namespace: "default".to_owned(),
            attempt,
        }),
        // runc refuses a hostname without a private UTS namespace, so host-network pods have none.
        hostname: if host_network {
            String::new()
        } else {
            name.to_owned()
        },
        log_directory: format!("/var/log/pods/default_{name}_{uid}"),
        labels: labels(&[
            ("io.kubernetes.pod.name", name),
            ("io.kubernetes.pod.uid", uid),
        ]),
        annotations: labels(&[("kubernetes.io/config.source", "file")]),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: format!("/kubepods/besteffort/pod{uid}"),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(cri::NamespaceOption {
                    network: network.into(),
                    ..cri::NamespaceOption::default()
                }),
                ..cri::LinuxSandboxSecurityContext::default()
            }),
            ..cri::LinuxPodSandboxConfig::default()
        }),
        ..cri::PodSandboxConfig::default()
    }
}

fn container_config(name: &str, image: &str) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: name.to_owned(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: image.to_owned(),
            ..cri::ImageSpec::default()
        }),
        command: vec!["sleep".to_owned()],
        args: vec!["3600".to_owned()],
        envs: vec![cri::KeyValue {
            key: "MODE".to_owned(),
            value: "test".to_owned(),
        }],
        mounts: vec![cri::Mount {
            container_path: "/data".to_owned(),
            host_path: "/tmp/data".to_owned(),
            readonly: true,
            ..cri::Mount::default()
        }],
        labels: labels(&[("io.kubernetes.container.name", name)]),
        annotations: labels(&[("io.kubernetes.container.restartCount", "0")]),
        log_path: format!("{name}/0.log"),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_shares: 2,
                memory_limit_in_bytes: 64 << 20,
                ..cri::LinuxContainerResources::default()
            }),
            security_context: None,
        }),
        ..cri::ContainerConfig::default()
    }
}

async fn run_sandbox(
    rt: &mut RuntimeServiceClient<Channel>,
    config: cri::PodSandboxConfig,
) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(config),
        runtime_handler: String::new(),
    })
    .await
    .unwrap_or_else(|e| panic!("RunPodSandbox: {e}"))
    .into_inner()
    .pod_sandbox_id
}

async fn create_container(
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox_id: &str,
    config: cri::ContainerConfig,
) -> Result<String, tonic::Status> {
    rt.create_container(cri::CreateContainerRequest {
        pod_sandbox_id: sandbox_id.to_owned(),
        config: Some(config),
        sandbox_config: None,
    })
    .await
    .map(|r| r.into_inner().container_id)
}

async fn start(rt: &mut RuntimeServiceClient<Channel>, id: &str) -> Result<(), tonic::Status> {
    rt.start_container(cri::StartContainerRequest {
        container_id: id.to_owned(),
    })
    .await
    .map(|_| ())
}

async fn stop(rt: &mut RuntimeServiceClient<Channel>, id: &str, timeout: i64) {
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.to_owned(),
        timeout,
    })
    .await
    .unwrap_or_else(|e| panic!("StopContainer {id}: {e}"));
}

async fn container_status(
    rt: &mut RuntimeServiceClient<Channel>,
    id: &str,
    verbose: bool,
) -> Result<cri::ContainerStatusResponse, tonic::Status> {
    rt.container_status(cri::ContainerStatusRequest {
        container_id: id.to_owned(),
        verbose,
    })
    .await
    .map(tonic::Response::into_inner)
}

async fn sandbox_status(
    rt: &mut RuntimeServiceClient<Channel>,
    id: &str,
) -> Result<cri::PodSandboxStatus, tonic::Status> {
    rt.pod_sandbox_status(cri::PodSandboxStatusRequest {
        pod_sandbox_id: id.to_owned(),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().status.unwrap_or_default())
}

async fn list_sandboxes(
    rt: &mut RuntimeServiceClient<Channel>,
    filter: Option<cri::PodSandboxFilter>,
) -> Vec<String> {
    rt.list_pod_sandbox(cri::ListPodSandboxRequest { filter })
        .await
        .unwrap_or_else(|e| panic!("ListPodSandbox: {e}"))
        .into_inner()
        .items
        .into_iter()
        .map(|s| s.id)
        .collect()
}

async fn list_containers(
    rt: &mut RuntimeServiceClient<Channel>,
    filter: Option<cri::ContainerFilter>,
) -> Vec<String> {
    rt.list_containers(cri::ListContainersRequest { filter })
        .await
        .unwrap_or_else(|e| panic!("ListContainers: {e}"))
        .into_inner()
        .containers
        .into_iter()
        .map(|c| c.id)
        .collect()
}

async fn image_status(
    img: &mut ImageServiceClient<Channel>,
    reference: &str,
) -> Option<cri::Image> {
    img.image_status(cri::ImageStatusRequest {
        image: Some(cri::ImageSpec {
            image: reference.to_owned(),
            ..cri::ImageSpec::default()
        }),
        verbose: false,
    })
    .await
    .unwrap_or_else(|e| panic!("ImageStatus {reference}: {e}"))
    .into_inner()
    .image
}

/// A started `app` container from busybox in a fresh pod sandbox: (sandbox id, container id).
async fn running_pod(
    fake: &FakeCri,
    rt: &mut RuntimeServiceClient<Channel>,
    pod: &str,
) -> (String, String) {
    fake.add_image("busybox");
    let sandbox = run_sandbox(rt, sandbox_config(pod, &format!("uid-{pod}"), 0, false)).await;
    let container = create_container(rt, &sandbox, container_config("app", "busybox"))
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
    start(rt, &container)
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    (sandbox, container)
}

#[tokio::test]
async fn version_and_status_report_a_ready_runtime() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;

    let version = rt
        .version(cri::VersionRequest::default())
        .await
        .unwrap_or_else(|e| panic!("Version: {e}"))
        .into_inner();
    assert_eq!(version.runtime_name, "fake-containerd");
    assert_eq!(version.runtime_api_version, "v1");

    let conditions = |status: cri::StatusResponse| -> Vec<(String, bool)> {
        status
            .status
            .unwrap_or_default()
            .conditions
            .into_iter()
            .map(|c| (c.r#type, c.status))
            .collect()
    };
    let ready = rt
        .status(cri::StatusRequest::default())
        .await
        .unwrap_or_else(|e| panic!("Status: {e}"))
        .into_inner();
    assert_eq!(
        conditions(ready),
        [
            ("RuntimeReady".to_owned(), true),
            ("NetworkReady".to_owned(), true)
        ]
    );

    fake.set_network_ready(false);
    let not_ready = rt
        .status(cri::StatusRequest::default())
        .await
        .unwrap_or_else(|e| panic!("Status: {e}"))
        .into_inner();
    assert_eq!(
        conditions(not_ready),
        [
            ("RuntimeReady".to_owned(), true),
            ("NetworkReady".to_owned(), false)
        ]
    );
}

#[tokio::test]
async fn without_network_only_host_network_sandboxes_start() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.set_network_ready(false);

    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("web", "u1", 0, false)),
            runtime_handler: String::new(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("a pod-network sandbox started without CNI"));
    assert!(
        err.message().contains("cni plugin not initialized"),
        "{err}"
    );
    assert!(fake.sandboxes().is_empty());

    let id = run_sandbox(&mut rt, sandbox_config("host", "u2", 0, true)).await;
    assert_eq!(fake.sandboxes()[0].id, id);
}

#[tokio::test]
async fn sandbox_lifecycle_follows_containerd() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;

    let id = run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;
    assert_eq!(id.len(), 64);
    assert!(id.chars().all(|c| c.is_ascii_hexdigit()));

    let status = sandbox_status(&mut rt, &id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.state(), cri::PodSandboxState::SandboxReady);
    assert_eq!(status.network.unwrap_or_default().ip, "10.88.0.2");
    assert_eq!(status.labels["io.kubernetes.pod.name"], "web");
    assert_eq!(status.annotations["kubernetes.io/config.source"], "file");
    assert!(status.created_at > 0);
    assert_eq!(status.metadata.unwrap_or_default().uid, "u1");

    // The name (pod, namespace, uid, attempt) stays reserved while the sandbox exists.
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("web", "u1", 0, false)),
            runtime_handler: String::new(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("a second sandbox with the same name started"));
    assert_eq!(err.code(), Code::Unknown);
    assert!(err.message().contains("is reserved for"), "{err}");
    let second = run_sandbox(&mut rt, sandbox_config("web", "u1", 1, false)).await;
    assert_ne!(second, id);
    let status = sandbox_status(&mut rt, &second)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.network.unwrap_or_default().ip, "10.88.0.3");

    for _ in 0..2 {
        rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox is idempotent: {e}"));
    }
    let status = sandbox_status(&mut rt, &id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.state(), cri::PodSandboxState::SandboxNotready);
    assert_eq!(status.network.unwrap_or_default().ip, "");

    for _ in 0..2 {
        rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox is idempotent: {e}"));
    }
    assert_eq!(list_sandboxes(&mut rt, None).await, [second.as_str()]);
    let err = sandbox_status(&mut rt, &id)
        .await
        .err()
        .unwrap_or_else(|| panic!("removed sandbox has a status"));
    assert_eq!(err.code(), Code::NotFound);
    let err = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id: id })
        .await
        .err()
        .unwrap_or_else(|| panic!("stopping a removed sandbox succeeded"));
    assert_eq!(err.code(), Code::NotFound);

    // Removal releases the name.
    run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;
}

#[tokio::test]
async fn host_network_sandbox_with_a_hostname_fails_like_runc() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let mut config = sandbox_config("host", "u1", 0, true);
    config.hostname = "host".to_owned();
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("a host-network sandbox took a hostname"));
    assert!(
        err.message()
            .contains("unable to set hostname without a private UTS namespace"),
        "{err}"
    );
    assert!(fake.sandboxes().is_empty());
}

#[tokio::test]
async fn host_network_sandbox_has_no_ip() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let id = run_sandbox(&mut rt, sandbox_config("host", "u1", 0, true)).await;
    let status = sandbox_status(&mut rt, &id)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(status.network.unwrap_or_default().ip, "");
    let options = status
        .linux
        .and_then(|l| l.namespaces)
        .and_then(|n| n.options)
        .unwrap_or_default();
    assert_eq!(options.network(), cri::NamespaceMode::Node);
    assert_eq!(fake.sandboxes()[0].ip, None);
}

#[tokio::test]
async fn container_lifecycle_keeps_the_config() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.add_image("busybox");
    let sandbox = run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;

    let id = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e}"));
    let created = container_status(&mut rt, &id, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let created = created.status.unwrap_or_default();
    assert_eq!(created.state(), cri::ContainerState::ContainerCreated);
    assert_eq!(created.started_at, 0);

    // (name, attempt) is unique within the sandbox.
    let err = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .err()
        .unwrap_or_else(|| panic!("a duplicate container name was accepted"));
    assert!(err.message().contains("is reserved for"), "{err}");

    start(&mut rt, &id)
        .await
        .unwrap_or_else(|e| panic!("StartContainer: {e}"));
    let err = start(&mut rt, &id)
        .await
        .err()
        .unwrap_or_else(|| panic!("started twice"));
    assert!(err.message().contains("CONTAINER_RUNNING"), "{err}");

    let response = container_status(&mut rt, &id, true)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = response.status.unwrap_or_default();
    assert_eq!(status.state(), cri::ContainerState::ContainerRunning);
    assert!(status.started_at >= status.created_at);
    assert_eq!(status.labels["io.kubernetes.container.name"], "app");
    assert_eq!(
        status.annotations["io.kubernetes.container.restartCount"],
        "0"
    );
    assert_eq!(status.log_path, "/var/log/pods/default_web_u1/app/0.log");
    assert_eq!(
        status.image.unwrap_or_default().image,
        "docker.io/library/busybox:latest"
    );
    // Images imported without a registry have no repo digest: the reference is the image id.
    assert_eq!(
        status.image_ref,
        image_id("docker.io/library/busybox:latest")
    );
    let listed = rt
        .list_containers(cri::ListContainersRequest::default())
        .await
        .unwrap_or_else(|e| panic!("ListContainers: {e}"))
        .into_inner()
        .containers;
    // The summary repeats the image as the config named it.
    assert_eq!(
        listed[0].image.as_ref().map(|i| i.image.as_str()),
        Some("busybox")
    );
    assert_eq!(listed[0].image_ref, status.image_ref);
    assert_eq!(status.mounts.len(), 1);
    let info: serde_json::Value = serde_json::from_str(&response.info["info"])
        .unwrap_or_else(|e| panic!("verbose info is not JSON: {e}"));
    assert_eq!(
        info["runtimeSpec"]["linux"]["cgroupsPath"],
        format!("/kubepods/besteffort/podu1/{id}")
    );
    assert!(info["pid"].as_u64().is_some_and(|pid| pid > 0));

    let snapshot = fake
        .container_named("app")
        .unwrap_or_else(|| panic!("no snapshot"));
    assert_eq!(snapshot.id, id);
    assert_eq!(snapshot.sandbox_id, sandbox);
    assert_eq!(snapshot.envs(), [("MODE".to_owned(), "test".to_owned())]);
    assert_eq!(snapshot.config.command, ["sleep"]);
    assert_eq!(snapshot.config.args, ["3600"]);
    assert_eq!(
        snapshot.resources().map(|r| r.memory_limit_in_bytes),
        Some(64 << 20)
    );
    assert_eq!(
        fake.sandboxes()[0].cgroup_parent(),
        "/kubepods/besteffort/podu1"
    );
    assert_eq!(
        fake.sandboxes()[0].config.log_directory,
        "/var/log/pods/default_web_u1"
    );
}

#[tokio::test]
async fn stop_and_remove_are_idempotent() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (_, id) = running_pod(&fake, &mut rt, "web").await;

    // Default stop behaviour: the process dies of SIGTERM, as busybox `sleep` does on the lab.
    stop(&mut rt, &id, 30).await;
    let status = container_status(&mut rt, &id, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = status.status.unwrap_or_default();
    assert_eq!(status.state(), cri::ContainerState::ContainerExited);
    assert_eq!((status.exit_code, status.reason.as_str()), (143, "Error"));
    assert!(status.finished_at >= status.started_at);
    stop(&mut rt, &id, 30).await;

    for _ in 0..2 {
        rt.remove_container(cri::RemoveContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer is idempotent: {e}"));
    }
    assert!(fake.containers().is_empty());
    let err = container_status(&mut rt, &id, false)
        .await
        .err()
        .unwrap_or_else(|| panic!("removed container has a status"));
    assert_eq!(err.code(), Code::NotFound);
    // Repeating a stop is fine, but containerd 1.6.20 does not know a removed container.
    let err = rt
        .stop_container(cri::StopContainerRequest {
            container_id: id,
            timeout: 30,
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("stopping a removed container succeeded"));
    assert_eq!(err.code(), Code::NotFound);
}

#[tokio::test]
async fn creating_in_a_stopped_sandbox_fails() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.add_image("busybox");
    let sandbox = run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let err = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .err()
        .unwrap_or_else(|| panic!("created a container in a stopped sandbox"));
    assert_eq!(err.code(), Code::NotFound);
    assert!(err.message().contains("no running task found"), "{err}");
    assert!(fake.containers().is_empty());
}

#[tokio::test(start_paused = true)]
async fn stop_waits_the_timeout_for_a_process_that_ignores_sigterm() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.set_stop_behaviour("app", StopBehaviour::IgnoresSigterm);
    let (_, id) = running_pod(&fake, &mut rt, "web").await;

    let before = tokio::time::Instant::now();
    stop(&mut rt, &id, 30).await;
    assert!(before.elapsed() >= Duration::from_secs(30));
    let exited = fake
        .container_named("app")
        .unwrap_or_else(|| panic!("gone"));
    assert_eq!(
        (exited.state, exited.exit_code),
        (cri::ContainerState::ContainerExited, 137)
    );
}

#[tokio::test]
async fn stop_exit_codes_follow_the_process() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.set_stop_behaviour("app", StopBehaviour::ExitsWith(0));
    let (_, graceful) = running_pod(&fake, &mut rt, "graceful").await;
    stop(&mut rt, &graceful, 30).await;
    let (_, killed) = running_pod(&fake, &mut rt, "killed").await;
    stop(&mut rt, &killed, 0).await;

    let by_id = |id: &str| {
        fake.containers()
            .into_iter()
            .find(|c| c.id == id)
            .unwrap_or_else(|| panic!("no container {id}"))
    };
    let graceful = by_id(&graceful);
    assert_eq!(
        (graceful.exit_code, graceful.reason.as_str()),
        (0, "Completed")
    );
    // Timeout 0 is SIGKILL straight away, whatever the process does with SIGTERM.
    let killed = by_id(&killed);
    assert_eq!((killed.exit_code, killed.reason.as_str()), (137, "Error"));
}

#[tokio::test]
async fn exit_simulation_shows_in_status() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (_, id) = running_pod(&fake, &mut rt, "web").await;

    fake.exit_container(&id, 137, "OOMKilled");
    let status = container_status(&mut rt, &id, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = status.status.unwrap_or_default();
    assert_eq!(status.state(), cri::ContainerState::ContainerExited);
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (137, "OOMKilled")
    );
    assert!(status.finished_at > 0);

    let running = list_containers(
        &mut rt,
        Some(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning.into(),
            }),
            ..cri::ContainerFilter::default()
        }),
    )
    .await;
    assert!(running.is_empty());
}

#[tokio::test]
async fn removing_a_running_container_kills_it_like_containerd() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (_, id) = running_pod(&fake, &mut rt, "web").await;
    rt.remove_container(cri::RemoveContainerRequest { container_id: id })
        .await
        .unwrap_or_else(|e| panic!("RemoveContainer of a running container: {e}"));
    assert!(fake.containers().is_empty());
}

#[tokio::test]
async fn stopping_and_removing_a_sandbox_takes_its_containers() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (sandbox, id) = running_pod(&fake, &mut rt, "web").await;
    let (_, other) = running_pod(&fake, &mut rt, "other").await;

    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: sandbox.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let status = container_status(&mut rt, &id, false)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let status = status.status.unwrap_or_default();
    assert_eq!(
        (status.state(), status.exit_code),
        (cri::ContainerState::ContainerExited, 137)
    );

    rt.remove_pod_sandbox(cri::RemovePodSandboxRequest {
        pod_sandbox_id: sandbox,
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(list_containers(&mut rt, None).await, [other.as_str()]);
    let other_status = fake
        .container_named("app")
        .unwrap_or_else(|| panic!("other pod's container gone"));
    assert_eq!(
        (other_status.id, other_status.state),
        (other, cri::ContainerState::ContainerRunning)
    );
}

/// Pod "web" (stopped, its `app` exited) and pod "db" (ready, `app` running, `sidecar` created):
/// (web, web app, db, db app, db sidecar).
async fn two_pods(
    fake: &FakeCri,
    rt: &mut RuntimeServiceClient<Channel>,
) -> (String, String, String, String, String) {
    let (web, web_app) = running_pod(fake, rt, "web").await;
    let (db, db_app) = running_pod(fake, rt, "db").await;
    let db_sidecar = create_container(rt, &db, container_config("sidecar", "busybox"))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    rt.stop_pod_sandbox(cri::StopPodSandboxRequest {
        pod_sandbox_id: web.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    (web, web_app, db, db_app, db_sidecar)
}

#[tokio::test]
async fn sandbox_list_filters_combine() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (web, _, db, _, _) = two_pods(&fake, &mut rt).await;

    let sandbox_filter =
        |id: &str, state: Option<cri::PodSandboxState>, selector: &[(&str, &str)]| {
            Some(cri::PodSandboxFilter {
                id: id.to_owned(),
                state: state.map(|s| cri::PodSandboxStateValue { state: s.into() }),
                label_selector: labels(selector),
            })
        };
    assert_eq!(
        list_sandboxes(&mut rt, None).await,
        [web.clone(), db.clone()]
    );
    assert_eq!(
        list_sandboxes(&mut rt, sandbox_filter(&db, None, &[])).await,
        [db.as_str()]
    );
    // containerd also finds a sandbox by a unique id prefix.
    assert_eq!(
        list_sandboxes(&mut rt, sandbox_filter(&db[..12], None, &[])).await,
        [db.as_str()]
    );
    assert!(
        list_sandboxes(&mut rt, sandbox_filter("ffff0000nothere", None, &[]))
            .await
            .is_empty()
    );
    assert_eq!(
        list_sandboxes(
            &mut rt,
            sandbox_filter("", Some(cri::PodSandboxState::SandboxReady), &[])
        )
        .await,
        [db.as_str()]
    );
    assert_eq!(
        list_sandboxes(
            &mut rt,
            sandbox_filter("", None, &[("io.kubernetes.pod.name", "web")])
        )
        .await,
        [web.as_str()]
    );
    assert!(
        list_sandboxes(
            &mut rt,
            sandbox_filter(&web, Some(cri::PodSandboxState::SandboxReady), &[])
        )
        .await
        .is_empty()
    );
    assert!(
        list_sandboxes(
            &mut rt,
            sandbox_filter(
                "",
                None,
                &[
                    ("io.kubernetes.pod.name", "web"),
                    ("io.kubernetes.pod.uid", "other")
                ]
            )
        )
        .await
        .is_empty()
    );
}

#[tokio::test]
async fn container_list_filters_combine() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (web, web_app, db, db_app, db_sidecar) = two_pods(&fake, &mut rt).await;

    let container_filter =
        |id: &str, sandbox: &str, state: Option<cri::ContainerState>, selector: &[(&str, &str)]| {
            Some(cri::ContainerFilter {
                id: id.to_owned(),
                state: state.map(|s| cri::ContainerStateValue { state: s.into() }),
                pod_sandbox_id: sandbox.to_owned(),
                label_selector: labels(selector),
            })
        };
    assert_eq!(
        list_containers(&mut rt, None).await,
        [web_app.clone(), db_app.clone(), db_sidecar.clone()]
    );
    assert_eq!(
        list_containers(&mut rt, container_filter("", &db, None, &[])).await,
        [db_app.clone(), db_sidecar.clone()]
    );
    assert_eq!(
        list_containers(&mut rt, container_filter(&web_app, "", None, &[])).await,
        [web_app.as_str()]
    );
    assert_eq!(
        list_containers(
            &mut rt,
            container_filter("", "", Some(cri::ContainerState::ContainerCreated), &[])
        )
        .await,
        [db_sidecar.as_str()]
    );
    assert_eq!(
        list_containers(
            &mut rt,
            container_filter("", "", Some(cri::ContainerState::ContainerExited), &[])
        )
        .await,
        [web_app.as_str()]
    );
    assert_eq!(
        list_containers(
            &mut rt,
            container_filter("", &db, None, &[("io.kubernetes.container.name", "app")])
        )
        .await,
        [db_app]
    );
    assert!(
        list_containers(&mut rt, container_filter(&db_sidecar, &web, None, &[]))
            .await
            .is_empty()
    );
}

#[tokio::test]
async fn images_are_normalised_and_missing_ones_are_not_errors() {
    let fake = FakeCri::start();
    let (mut rt, mut img) = connect(&fake).await;

    assert!(image_status(&mut img, "busybox").await.is_none());
    let sandbox = run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;
    let err = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .err()
        .unwrap_or_else(|| panic!("created a container from a missing image"));
    assert_eq!(err.code(), Code::NotFound);
    assert!(fake.containers().is_empty());

    fake.add_image("busybox");
    let image = image_status(&mut img, "busybox")
        .await
        .unwrap_or_else(|| panic!("busybox is present"));
    assert_eq!(image.repo_tags, ["docker.io/library/busybox:latest"]);
    assert!(image.id.starts_with("sha256:"));
    // The same image by its canonical name and by its id.
    assert_eq!(
        image_status(&mut img, "docker.io/library/busybox:latest").await,
        Some(image.clone())
    );
    assert_eq!(image_status(&mut img, &image.id).await, Some(image.clone()));
    assert!(image_status(&mut img, "busybox:1.36").await.is_none());

    let listed = img
        .list_images(cri::ListImagesRequest::default())
        .await
        .unwrap_or_else(|e| panic!("ListImages: {e}"))
        .into_inner()
        .images;
    assert_eq!(listed, std::slice::from_ref(&image));

    img.remove_image(cri::RemoveImageRequest {
        image: Some(cri::ImageSpec {
            image: "busybox".to_owned(),
            ..cri::ImageSpec::default()
        }),
    })
    .await
    .unwrap_or_else(|e| panic!("RemoveImage: {e}"));
    assert!(image_status(&mut img, "busybox").await.is_none());
    assert!(fake.images().is_empty());
}

#[tokio::test]
async fn pulls_fail_unless_enabled() {
    let fake = FakeCri::start();
    let (_, mut img) = connect(&fake).await;
    let pull = |reference: &str| cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: reference.to_owned(),
            ..cri::ImageSpec::default()
        }),
        auth: None,
        sandbox_config: None,
    };

    let err = img
        .pull_image(pull("nginx:1.27"))
        .await
        .err()
        .unwrap_or_else(|| panic!("pulled without a registry"));
    assert_eq!(err.code(), Code::Unknown);
    assert!(
        err.message()
            .starts_with("failed to pull and unpack image \"docker.io/library/nginx:1.27\""),
        "{err}"
    );
    assert!(fake.images().is_empty());

    fake.enable_pulls(true);
    let pulled = img
        .pull_image(pull("nginx:1.27"))
        .await
        .unwrap_or_else(|e| panic!("PullImage: {e}"))
        .into_inner();
    let image = image_status(&mut img, "nginx:1.27")
        .await
        .unwrap_or_else(|| panic!("pulled image is not present"));
    assert_eq!(pulled.image_ref, image.id);
}

#[tokio::test]
async fn unavailable_mode_fails_every_call_until_cleared() {
    let fake = FakeCri::start();
    let (mut rt, mut img) = connect(&fake).await;
    fake.set_unavailable(true);

    let err = rt
        .version(cri::VersionRequest::default())
        .await
        .err()
        .unwrap_or_else(|| panic!("Version answered while unavailable"));
    assert_eq!(err.code(), Code::Unavailable);
    let err = img
        .list_images(cri::ListImagesRequest::default())
        .await
        .err()
        .unwrap_or_else(|| panic!("ListImages answered while unavailable"));
    assert_eq!(err.code(), Code::Unavailable);
    let err = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(sandbox_config("web", "u1", 0, false)),
            runtime_handler: String::new(),
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("RunPodSandbox answered while unavailable"));
    assert_eq!(err.code(), Code::Unavailable);
    assert!(fake.sandboxes().is_empty());

    fake.set_unavailable(false);
    rt.version(cri::VersionRequest::default())
        .await
        .unwrap_or_else(|e| panic!("Version after the outage: {e}"));
    assert_eq!(
        fake.calls(),
        ["Version", "ListImages", "RunPodSandbox", "Version"]
    );
}

#[tokio::test]
async fn injected_failure_hits_the_next_call_only() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.add_image("busybox");
    let sandbox = run_sandbox(&mut rt, sandbox_config("web", "u1", 0, false)).await;
    fake.fail_next("CreateContainer", Code::ResourceExhausted, "disk full");

    let err = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .err()
        .unwrap_or_else(|| panic!("the injected failure did not happen"));
    assert_eq!(
        (err.code(), err.message()),
        (Code::ResourceExhausted, "disk full")
    );
    assert!(fake.containers().is_empty());
    let id = create_container(&mut rt, &sandbox, container_config("app", "busybox"))
        .await
        .unwrap_or_else(|e| panic!("the failure was injected once only: {e}"));
    assert_eq!(fake.containers()[0].id, id);
    assert_eq!(
        fake.calls(),
        ["RunPodSandbox", "CreateContainer", "CreateContainer"]
    );
    assert_eq!(fake.call_count("CreateContainer"), 2);
    fake.clear_calls();
    assert!(fake.calls().is_empty());
}

#[tokio::test]
#[should_panic(expected = "no RPC named")]
async fn injecting_into_an_unknown_rpc_is_a_test_bug() {
    let fake = FakeCri::start();
    fake.fail_next("CreateContainers", Code::Internal, "typo");
}

#[tokio::test(start_paused = true)]
async fn delayed_calls_trip_the_client_deadline() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    fake.delay_calls(Duration::from_secs(10));

    let late = tokio::time::timeout(
        Duration::from_secs(2),
        rt.version(cri::VersionRequest::default()),
    )
    .await;
    assert!(late.is_err(), "answered before the delay");

    let before = tokio::time::Instant::now();
    tokio::time::timeout(
        Duration::from_mins(1),
        rt.version(cri::VersionRequest::default()),
    )
    .await
    .unwrap_or_else(|_| panic!("no answer after the delay"))
    .unwrap_or_else(|e| panic!("Version: {e}"));
    assert!(before.elapsed() >= Duration::from_secs(10));

    fake.delay_calls(Duration::ZERO);
    rt.version(cri::VersionRequest::default())
        .await
        .unwrap_or_else(|e| panic!("Version without delay: {e}"));
}

#[tokio::test]
async fn exec_answers_what_the_test_set() {
    let fake = FakeCri::start();
    let (mut rt, _) = connect(&fake).await;
    let (_, id) = running_pod(&fake, &mut rt, "web").await;
    fake.set_exec_result("app", 1, "not ready");
    let exec = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec!["cat".to_owned(), "/ready".to_owned()],
            timeout: 1,
        })
        .await
        .unwrap_or_else(|e| panic!("ExecSync: {e}"))
        .into_inner();
    assert_eq!(
        (exec.exit_code, exec.stdout.as_slice()),
        (1, b"not ready".as_slice())
    );

    fake.exit_container(&id, 0, "");
    let err = rt
        .exec_sync(cri::ExecSyncRequest {
            container_id: id,
            cmd: vec!["true".to_owned()],
            timeout: 1,
        })
        .await
        .err()
        .unwrap_or_else(|| panic!("exec in an exited container succeeded"));
    assert!(err.message().contains("CONTAINER_EXITED"), "{err}");
}

#[tokio::test]
async fn dropping_the_fake_stops_serving() {
    let fake = FakeCri::start();
    let socket = fake.socket_path().to_owned();
    let endpoint = fake.endpoint();
    assert!(
        endpoint.starts_with("unix:///") && endpoint.ends_with("/cri.sock"),
        "{endpoint}"
    );
    assert!(socket.exists());
    drop(fake);
    assert!(!socket.exists());
    let connected = Endpoint::from_shared(endpoint)
        .unwrap_or_else(|e| panic!("{e}"))
        .connect()
        .await;
    assert!(connected.is_err());
}

#[test]
fn references_normalise_like_containerd() {
    assert_eq!(
        normalise_image("busybox"),
        "docker.io/library/busybox:latest"
    );
    assert_eq!(
        normalise_image("busybox:1.36"),
        "docker.io/library/busybox:1.36"
    );
    assert_eq!(
        normalise_image("library/busybox"),
        "docker.io/library/busybox:latest"
    );
    assert_eq!(
        normalise_image("bitnami/redis:7"),
        "docker.io/bitnami/redis:7"
    );
    assert_eq!(
        normalise_image("registry.k8s.io/pause:3.9"),
        "registry.k8s.io/pause:3.9"
    );
    assert_eq!(
        normalise_image("localhost:5000/app"),
        "localhost:5000/app:latest"
    );
    assert_eq!(
        normalise_image("busybox@sha256:abcd"),
        "docker.io/library/busybox@sha256:abcd"
    );
}
