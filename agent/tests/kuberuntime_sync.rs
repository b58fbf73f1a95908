//! Component tests of the CRI runtime manager (`ringlet::kuberuntime`, the kubelet's
//! `pkg/kubelet/kuberuntime` `SyncPod`, `KillPod`, `GetPodStatus` and container GC) against the fake
//! CRI server on a temporary unix socket: what a sync asks the runtime to create, how restart
//! policies, init containers, image policies, outages and deadlines play out, and what a kill and a
//! garbage collection leave behind. Every sync is given the status `get_pod_status` reads back, as
//! the PLEG would.

mod support;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use ringlet::container::{
    ContainerState, PodStatus, PodSyncResult, PodUid, Runtime, RuntimeError, SandboxState,
    SyncAction,
};
use ringlet::events::Recorder;
use ringlet::kuberuntime::credentials::PullSecrets;
use ringlet::kuberuntime::{CriClient, KubeGenericRuntimeManager, RuntimeHelper, RuntimeSettings};
use ringlet::volumes::VolumeManager;
use ringlet_proto::runtime::v1 as cri;
use serde_json::json;
use support::fake_cri::{FakeContainer, FakeCri};
use tempfile::TempDir;

const NODE: &str = "test-node";
const NAMESPACE: &str = "ns";
/// Present on the fake and tagged, so its default pull policy (`IfNotPresent`) never pulls.
const IMAGE: &str = "busybox:1.35";

/// Node facts for the manager: every path lives in the test's temporary directory, which is also
/// where the node's docker config is looked for first.
struct Helper {
    root: PathBuf,
    /// What every pod's `imagePullSecrets` read as.
    pull_secrets: Vec<Arc<Secret>>,
}

#[async_trait]
impl RuntimeHelper for Helper {
    fn pod_cgroup_parent(&self, pod: &Pod) -> Result<String, String> {
        Ok(format!(
            "/kubepods/burstable/pod{}",
            pod.metadata.uid.as_deref().unwrap_or_default()
        ))
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        self.root.join("pods").join(uid.as_str())
    }

    fn node_name(&self) -> &str {
        NODE
    }

    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{namespace}_{name}_{uid}"))
    }

    async fn pull_secrets(&self, _pod: &Pod) -> PullSecrets {
        PullSecrets {
            secrets: self.pull_secrets.clone(),
            unavailable: Vec::new(),
        }
    }

    fn docker_config_dir(&self) -> Option<PathBuf> {
        Some(self.root.clone())
    }
}

/// The fake, a manager on it and the directory its helper uses.
struct Setup {
    fake: FakeCri,
    manager: KubeGenericRuntimeManager,
    root: TempDir,
    recorder: Recorder,
}

impl Setup {
    fn new() -> Self {
        Self::with(Duration::from_secs(5), RuntimeSettings::default())
    }

    fn with(timeout: Duration, settings: RuntimeSettings) -> Self {
        Self::with_pull_secrets(timeout, settings, Vec::new())
    }

    fn with_pull_secrets(
        timeout: Duration,
        settings: RuntimeSettings,
        pull_secrets: Vec<Arc<Secret>>,
    ) -> Self {
        let fake = FakeCri::start();
        fake.add_image(IMAGE);
        let root = tempfile::tempdir()
            .unwrap_or_else(|e| panic!("creating the test's root directory: {e}"));
        let cri = CriClient::new(&fake.endpoint(), timeout)
            .unwrap_or_else(|e| panic!("creating the CRI client: {e}"));
        let recorder = Recorder::new(None);
        let manager = KubeGenericRuntimeManager::new(
            cri,
            Arc::new(Helper {
                root: root.path().to_owned(),
                pull_secrets,
            }),
            recorder.clone(),
            settings,
        );
        Self {
            fake,
            manager,
            root,
            recorder,
        }
    }

    /// Crash-loop back-off never delays a restart: for tests that restart a container many times.
    fn without_backoff() -> Self {
        Self::with(
            Duration::from_secs(5),
            RuntimeSettings {
                backoff_initial: Duration::ZERO,
                backoff_max: Duration::ZERO,
                ..RuntimeSettings::default()
            },
        )
    }

    fn path(&self) -> &Path {
        self.root.path()
    }

    /// `(reason, message)` of the events recorded so far.
    fn events(&self) -> Vec<(String, String)> {
        self.recorder
            .recent()
            .into_iter()
            .map(|e| (e.reason, e.message))
            .collect()
    }

    /// The pod's runtime status as the PLEG would read it.
    async fn status(&self, pod: &Pod) -> PodStatus {
        let meta = &pod.metadata;
        self.manager
            .get_pod_status(
                &uid(pod),
                meta.name.as_deref().unwrap_or_default(),
                meta.namespace.as_deref().unwrap_or_default(),
            )
            .await
            .unwrap_or_else(|e| panic!("reading the pod status: {e}"))
    }

    /// One PLEG-driven sync: read the status, sync the pod with it.
    async fn sync(&self, pod: &Pod) -> PodSyncResult {
        let status = self.status(pod).await;
        self.manager.sync_pod(pod, &status).await
    }

    /// Syncs and checks that no step failed.
    async fn sync_ok(&self, pod: &Pod) -> PodSyncResult {
        let result = self.sync(pod).await;
        assert_eq!(result.first_failure(), None, "sync failed: {result:?}");
        result
    }

    fn running(&self, name: &str) -> FakeContainer {
        let c = self
            .fake
            .container_named(name)
            .unwrap_or_else(|| panic!("no container named {name}"));
        assert_eq!(
            c.state,
            cri::ContainerState::ContainerRunning,
            "container {name} is not running: {c:?}"
        );
        c
    }

    /// Makes the newest container named `name` exit with `code`.
    fn exit(&self, name: &str, code: i32) {
        let id = self.running(name).id;
        self.fake.exit_container(&id, code, "");
    }

    /// How many containers with this metadata name the fake holds.
    fn instances(&self, name: &str) -> usize {
        self.fake
            .containers()
            .iter()
            .filter(|c| c.name() == name)
            .count()
    }
}

fn uid(pod: &Pod) -> PodUid {
    PodUid::from(pod.metadata.uid.as_deref().unwrap_or_default())
}

fn pod(value: serde_json::Value) -> Pod {
    serde_json::from_value(value)
        .unwrap_or_else(|e| panic!("the test's pod is not a valid v1 Pod: {e}"))
}

/// A pod with one long-running container per name and the given restart policy.
fn simple_pod(name: &str, restart_policy: &str, containers: &[&str]) -> Pod {
    let containers: Vec<_> = containers
        .iter()
        .map(|c| json!({"name": c, "image": IMAGE, "command": ["sleep", "3600"]}))
        .collect();
    pod(json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}")},
        "spec": {
            "restartPolicy": restart_policy,
            "terminationGracePeriodSeconds": 1,
            "containers": containers,
        },
    }))
}

fn failure_reasons(result: &PodSyncResult) -> Vec<&str> {
    result
        .results
        .iter()
        .filter_map(|r| r.failure.as_ref().map(|f| f.reason.as_str()))
        .collect()
}

#[tokio::test]
#[allow(clippy::too_many_lines, reason = "one sync, every field it sets")]
async fn first_sync_creates_the_sandbox_and_containers_from_the_spec() {
    let setup = Setup::new();
    let pod = pod(json!({
        "metadata": {
            "name": "web",
            "namespace": NAMESPACE,
            "uid": "uid-web",
            "labels": {"app": "web"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "scratch", "emptyDir": {}}],
            "containers": [{
                "name": "app",
                "image": IMAGE,
                "command": ["sh", "-c"],
                "args": ["echo $(GREETING) && sleep 3600"],
                "env": [
                    {"name": "GREETING", "value": "hello"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                ],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
            }],
        },
    }));

    // The kubelet's volume manager prepares the volumes before the runtime's sync.
    let (_node, node) = tokio::sync::watch::channel(None);
    VolumeManager::new(setup.path().join("pods"), None, node)
        .mount_pod(&pod)
        .await
        .unwrap_or_else(|failures| panic!("mounting the volumes: {failures:?}"));
    let result = setup.sync_ok(&pod).await;
    assert_eq!(
        result.results.iter().map(|r| r.action).collect::<Vec<_>>(),
        [SyncAction::CreatePodSandbox, SyncAction::StartContainer],
        "{result:?}"
    );

    let sandboxes = setup.fake.sandboxes();
    assert_eq!(sandboxes.len(), 1, "one sandbox: {sandboxes:?}");
    let sandbox = &sandboxes[0];
    assert_eq!(sandbox.state, cri::PodSandboxState::SandboxReady);
    let labels = &sandbox.config.labels;
    for (key, value) in [
        ("io.kubernetes.pod.uid", "uid-web"),
        ("io.kubernetes.pod.name", "web"),
        ("io.kubernetes.pod.namespace", NAMESPACE),
        ("app", "web"),
    ] {
        assert_eq!(labels.get(key).map(String::as_str), Some(value), "{key}");
    }
    let metadata = sandbox.config.metadata.as_ref().expect("sandbox metadata");
    assert_eq!(
        (
            metadata.name.as_str(),
            metadata.uid.as_str(),
            metadata.attempt
        ),
        ("web", "uid-web", 0)
    );
    assert_eq!(sandbox.cgroup_parent(), "/kubepods/burstable/poduid-web");
    let log_dir = setup.path().join("logs").join("ns_web_uid-web");
    assert_eq!(
        Path::new(&sandbox.config.log_directory),
        log_dir,
        "log directory from the helper"
    );
    assert!(log_dir.is_dir(), "the pod log directory is created");

    let containers = setup.fake.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let app = setup.running("app");
    assert_eq!(app.sandbox_id, sandbox.id);
    assert_eq!(app.config.command, ["sh", "-c"]);
    assert_eq!(
        app.config.args,
        ["echo hello && sleep 3600"],
        "$(VAR) expanded"
    );
    let envs = app.envs();
    for (key, value) in [
        ("GREETING", "hello"),
        ("POD_NAME", "web"),
        ("NODE_NAME", NODE),
    ] {
        assert!(
            envs.contains(&(key.to_owned(), value.to_owned())),
            "env {key}={value} missing: {envs:?}"
        );
    }
    assert_eq!(
        app.config
            .labels
            .get("io.kubernetes.pod.uid")
            .map(String::as_str),
        Some("uid-web")
    );
    let resources = app.resources().expect("linux resources");
    assert_eq!(
        (resources.cpu_quota, resources.cpu_period),
        (50_000, 100_000)
    );
    assert_eq!(resources.memory_limit_in_bytes, 64 * 1024 * 1024);
    let empty_dir = setup
        .path()
        .join("pods/uid-web/volumes/kubernetes.io~empty-dir/scratch");
    let mount = app
        .config
        .mounts
        .iter()
        .find(|m| m.container_path == "/scratch")
        .unwrap_or_else(|| panic!("no /scratch mount: {:?}", app.config.mounts));
    assert_eq!(Path::new(&mount.host_path), empty_dir);
    assert!(empty_dir.is_dir(), "the emptyDir is created");

    let status = setup.status(&pod).await;
    assert_eq!(status.sandboxes.len(), 1);
    assert_eq!(status.sandboxes[0].state, SandboxState::Ready);
    assert_eq!(status.ips.len(), 1, "the pod has its sandbox's IP");
    let app_status = status.container("app").expect("app in the pod status");
    assert_eq!(app_status.state, ContainerState::Running);
    assert_eq!(app_status.restart_count, 0);
}

#[tokio::test]
async fn a_second_sync_with_the_same_status_changes_nothing() {
    let setup = Setup::new();
    let pod = simple_pod("steady", "Always", &["a", "b"]);
    setup.sync_ok(&pod).await;
    assert_eq!(setup.fake.containers().len(), 2);

    setup.fake.clear_calls();
    let result = setup.sync_ok(&pod).await;
    assert!(result.results.is_empty(), "no step: {result:?}");
    let calls = setup.fake.calls();
    for mutating in [
        "RunPodSandbox",
        "CreateContainer",
        "StartContainer",
        "StopContainer",
        "StopPodSandbox",
        "RemoveContainer",
        "PullImage",
    ] {
        assert!(
            !calls.iter().any(|c| c == mutating),
            "{mutating} called: {calls:?}"
        );
    }
    assert_eq!(setup.fake.containers().len(), 2);
    assert_eq!(setup.fake.sandboxes().len(), 1);
}

/// Issue 14 §1.4: the PLEG reads a pod it has not listed yet by its uid alone, one pod's worth of
/// CRI calls, with the name and namespace from the runtime's labels.
#[tokio::test]
async fn a_pod_is_read_by_its_uid_alone() {
    let setup = Setup::new();
    let pod = simple_pod("by-uid", "Always", &["a", "b"]);
    let other = simple_pod("other", "Always", &["c"]);
    setup.sync_ok(&pod).await;
    setup.sync_ok(&other).await;

    setup.fake.clear_calls();
    let status = setup
        .manager
        .get_pod_status_by_uid(&uid(&pod))
        .await
        .unwrap_or_else(|e| panic!("reading the pod by uid: {e}"))
        .unwrap_or_else(|| panic!("the runtime has the pod"));
    assert_eq!(status.name, "by-uid");
    assert_eq!(status.namespace, NAMESPACE);
    assert_eq!(status.sandboxes.len(), 1);
    let mut names: Vec<&str> = status.containers.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b"], "only the pod's own containers");
    assert_eq!(
        setup.fake.call_count("ContainerStatus"),
        2,
        "no other pod's container is read: {:?}",
        setup.fake.calls()
    );
    assert_eq!(
        status,
        setup.status(&pod).await,
        "the same as a read by name"
    );

    let none = setup
        .manager
        .get_pod_status_by_uid(&PodUid::from("uid-no-such-pod"))
        .await
        .unwrap_or_else(|e| panic!("reading an absent pod by uid: {e}"));
    assert_eq!(none, None);
}

#[tokio::test]
async fn restart_policy_never_leaves_exited_containers_alone() {
    let setup = Setup::new();
    let pod = simple_pod("never", "Never", &["ok", "bad"]);
    setup.sync_ok(&pod).await;
    setup.exit("ok", 0);
    setup.exit("bad", 1);

    setup.fake.clear_calls();
    let result = setup.sync_ok(&pod).await;
    assert_eq!(setup.fake.call_count("CreateContainer"), 0, "{result:?}");
    assert_eq!(setup.fake.call_count("RunPodSandbox"), 0);
    assert_eq!((setup.instances("ok"), setup.instances("bad")), (1, 1));
}

#[tokio::test]
async fn restart_policy_on_failure_restarts_only_failed_containers() {
    let setup = Setup::new();
    let pod = simple_pod("onfailure", "OnFailure", &["ok", "bad"]);
    setup.sync_ok(&pod).await;
    setup.exit("ok", 0);
    setup.exit("bad", 2);

    setup.fake.clear_calls();
    let result = setup.sync_ok(&pod).await;
    assert_eq!(setup.fake.call_count("CreateContainer"), 1, "{result:?}");
    assert_eq!(setup.instances("ok"), 1, "a succeeded container stays done");
    let bad = setup.running("bad");
    assert_eq!(bad.attempt(), 1, "the restart is the second attempt");
    let status = setup.status(&pod).await;
    assert_eq!(status.container("bad").map(|c| c.restart_count), Some(1));
}

#[tokio::test]
async fn restart_policy_always_restarts_then_backs_off() {
    let setup = Setup::new();
    let pod = simple_pod("always", "Always", &["app"]);
    setup.sync_ok(&pod).await;

    setup.exit("app", 0);
    setup.fake.clear_calls();
    let result = setup.sync_ok(&pod).await;
    assert_eq!(
        setup.fake.call_count("CreateContainer"),
        1,
        "even a clean exit is restarted: {result:?}"
    );
    assert_eq!(setup.running("app").attempt(), 1);

    setup.exit("app", 1);
    setup.fake.clear_calls();
    let result = setup.sync(&pod).await;
    let (step, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the second restart is held back: {result:?}"));
    assert_eq!(step.action, SyncAction::StartContainer);
    assert_eq!(step.target, "app");
    assert_eq!(failure.reason, "CrashLoopBackOff");
    assert!(
        failure.message.contains("back-off 10s") && failure.message.contains("container=app"),
        "{}",
        failure.message
    );
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);
    let status = setup.status(&pod).await;
    let app = status.container("app").expect("app in the pod status");
    assert_eq!(
        (app.state, app.restart_count, app.exit_code),
        (ContainerState::Exited, 1, 1)
    );
}

/// The kubelet keys a container's back-off by its name and image: a pod whose crash-looping
/// container gets a new image restarts it at once instead of waiting out the old back-off.
#[tokio::test]
async fn a_new_image_starts_the_back_off_over() {
    let setup = Setup::new();
    let pod = simple_pod("reimage", "Always", &["app"]);
    setup.sync_ok(&pod).await;
    setup.exit("app", 1);
    setup.sync_ok(&pod).await;
    setup.exit("app", 1);
    let held = setup.sync(&pod).await;
    assert_eq!(
        held.first_failure()
            .map(|(_, failure)| failure.reason.as_str()),
        Some("CrashLoopBackOff"),
        "{held:?}"
    );

    let mut updated = pod.clone();
    let spec = updated.spec.as_mut().expect("the pod has a spec");
    spec.containers[0].image = Some("docker.io/library/busybox:1.35".to_owned());
    setup.fake.clear_calls();
    let result = setup.sync(&updated).await;
    assert!(
        result
            .first_failure()
            .is_none_or(|(_, failure)| failure.reason != "CrashLoopBackOff"),
        "{result:?}"
    );
    assert_eq!(setup.fake.call_count("CreateContainer"), 1, "{result:?}");
}

#[tokio::test]
async fn init_containers_run_one_at_a_time_and_a_failure_stops_a_never_pod() {
    let setup = Setup::new();
    let pod = pod(json!({
        "metadata": {"name": "init", "namespace": NAMESPACE, "uid": "uid-init"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "initContainers": [
                {"name": "first", "image": IMAGE, "command": ["true"]},
                {"name": "second", "image": IMAGE, "command": ["false"]},
            ],
            "containers": [{"name": "app", "image": IMAGE, "command": ["sleep", "3600"]}],
        },
    }));

    let result = setup.sync_ok(&pod).await;
    assert_eq!(
        result
            .results
            .iter()
            .map(|r| (r.action, r.target.as_str()))
            .filter(|(a, _)| *a != SyncAction::CreatePodSandbox)
            .collect::<Vec<_>>(),
        [(SyncAction::InitContainer, "first")]
    );
    setup.running("first");
    assert_eq!(setup.fake.containers().len(), 1, "only the first init runs");

    setup.fake.clear_calls();
    setup.sync_ok(&pod).await;
    assert_eq!(
        setup.fake.call_count("CreateContainer"),
        0,
        "nothing starts while an init container runs"
    );

    setup.exit("first", 0);
    setup.sync_ok(&pod).await;
    setup.running("second");
    assert_eq!(setup.instances("app"), 0, "app waits for every init");

    setup.exit("second", 1);
    let result = setup.sync(&pod).await;
    assert!(
        failure_reasons(&result).contains(&"RunInitContainerError"),
        "{result:?}"
    );
    let sandboxes = setup.fake.sandboxes();
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(
        sandboxes[0].state,
        cri::PodSandboxState::SandboxNotready,
        "the failed pod's sandbox is stopped"
    );

    setup.fake.clear_calls();
    let result = setup.sync(&pod).await;
    assert!(
        result.results.is_empty(),
        "a failed Never pod starts nothing: {result:?}"
    );
    assert_eq!(setup.fake.call_count("RunPodSandbox"), 0);
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);
    assert_eq!(setup.instances("app"), 0);
    assert_eq!(setup.instances("first"), 1, "the first init ran once");
}

#[tokio::test]
async fn a_missing_image_with_pull_policy_never_is_err_image_never_pull() {
    let setup = Setup::new();
    setup.fake.enable_pulls(true);
    let pod = pod(json!({
        "metadata": {"name": "nopull", "namespace": NAMESPACE, "uid": "uid-nopull"},
        "spec": {"containers": [{
            "name": "app",
            "image": "registry.local:5000/absent:1",
            "imagePullPolicy": "Never",
        }]},
    }));

    let result = setup.sync(&pod).await;
    let (step, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(
        (step.action, step.target.as_str()),
        (SyncAction::StartContainer, "app")
    );
    assert_eq!(failure.reason, "ErrImageNeverPull");
    assert!(
        failure.message.contains("registry.local:5000/absent:1"),
        "{}",
        failure.message
    );
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);
    assert_eq!(setup.fake.call_count("PullImage"), 0, "Never never pulls");
}

#[tokio::test]
async fn a_failed_pull_with_if_not_present_is_err_image_pull_then_back_off() {
    let setup = Setup::new();
    let pod = pod(json!({
        "metadata": {"name": "pullfail", "namespace": NAMESPACE, "uid": "uid-pullfail"},
        "spec": {"containers": [{
            "name": "app",
            "image": "registry.local:5000/absent:1",
            "imagePullPolicy": "IfNotPresent",
        }]},
    }));

    let result = setup.sync(&pod).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ErrImagePull", "{failure:?}");
    assert_eq!(setup.fake.call_count("PullImage"), 1);
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);

    // The kubelet does not hammer the registry: the next sync waits out the pull back-off.
    let result = setup.sync(&pod).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ImagePullBackOff", "{failure:?}");
    assert_eq!(setup.fake.call_count("PullImage"), 1);
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);
}

/// The private image the pull-credential tests pull.
const PRIVATE_IMAGE: &str = "registry.local:5000/private/app:1";

/// A docker config secret of `type_` holding `config` under its key.
fn pull_secret(name: &str, type_: &str, config: &serde_json::Value) -> Arc<Secret> {
    let key = if type_ == "kubernetes.io/dockercfg" {
        ".dockercfg"
    } else {
        ".dockerconfigjson"
    };
    Arc::new(Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        type_: Some(type_.to_owned()),
        data: Some(
            [(key.to_owned(), ByteString(config.to_string().into_bytes()))]
                .into_iter()
                .collect(),
        ),
        ..Secret::default()
    })
}

/// Three secrets: one for the private image's registry, one for its repository's path there
/// (more specific, so tried first), one for another registry.
fn private_registry_secrets() -> Vec<Arc<Secret>> {
    vec![
        pull_secret(
            "registry",
            "kubernetes.io/dockerconfigjson",
            &json!({"auths": {"https://registry.local:5000/v2/": {"username": "puller", "password": "p1"}}}),
        ),
        pull_secret(
            "team",
            "kubernetes.io/dockercfg",
            &json!({"registry.local:5000/private": {"username": "team", "password": "p2"}}),
        ),
        pull_secret(
            "elsewhere",
            "kubernetes.io/dockerconfigjson",
            &json!({"auths": {"other.io": {"username": "stranger", "password": "p3"}}}),
        ),
    ]
}

fn private_pod(name: &str) -> Pod {
    pod(json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}")},
        "spec": {
            "imagePullSecrets": [{"name": "registry"}, {"name": "team"}, {"name": "elsewhere"}],
            "containers": [{"name": "app", "image": PRIVATE_IMAGE, "imagePullPolicy": "IfNotPresent"}],
        },
    }))
}

/// A credential as the fake saw it in `PullImageRequest.auth`.
fn auth(user: &str, password: &str) -> (String, String) {
    (user.to_owned(), password.to_owned())
}

#[tokio::test]
async fn a_failed_always_pull_is_err_image_pull_not_the_image_on_the_node() {
    let setup = Setup::new();
    let pod = pod(json!({
        "metadata": {"name": "always", "namespace": NAMESPACE, "uid": "uid-always"},
        "spec": {"containers": [{"name": "app", "image": IMAGE, "imagePullPolicy": "Always"}]},
    }));

    let result = setup.sync(&pod).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ErrImagePull", "{failure:?}");
    assert!(failure.message.contains("no such host"), "{failure:?}");
    assert_eq!(
        setup.fake.call_count("CreateContainer"),
        0,
        "the image on the node is not used"
    );
    assert_eq!(
        setup.fake.pull_auths(),
        [None],
        "no credentials: one anonymous pull"
    );
    let events = setup.events();
    assert!(
        events.contains(&(
            "Pulling".to_owned(),
            "Pulling image \"busybox:1.35\"".to_owned()
        )),
        "{events:?}"
    );
    assert!(
        events.iter().any(|(reason, message)| reason == "Failed"
            && message.starts_with("Failed to pull image \"busybox:1.35\": ")),
        "{events:?}"
    );
    assert!(
        events.contains(&("Failed".to_owned(), "Error: ErrImagePull".to_owned())),
        "{events:?}"
    );

    // Within the back-off the pull is not tried again, and the status still says why it failed.
    let result = setup.sync(&pod).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ImagePullBackOff", "{failure:?}");
    assert!(
        failure
            .message
            .starts_with("Back-off pulling image \"busybox:1.35\": ErrImagePull: "),
        "{failure:?}"
    );
    assert_eq!(setup.fake.call_count("PullImage"), 1);
    assert_eq!(setup.fake.call_count("CreateContainer"), 0);
    assert!(
        setup
            .events()
            .contains(&("Failed".to_owned(), "Error: ImagePullBackOff".to_owned())),
        "{:?}",
        setup.events()
    );
}

#[tokio::test]
async fn a_present_image_is_used_under_if_not_present_with_an_event() {
    let setup = Setup::new();
    let pod = simple_pod("present", "Always", &["app"]);
    setup.sync_ok(&pod).await;
    assert_eq!(setup.fake.call_count("PullImage"), 0);
    assert!(
        setup.events().contains(&(
            "Pulled".to_owned(),
            "Container image \"busybox:1.35\" already present on machine".to_owned()
        )),
        "{:?}",
        setup.events()
    );
}

#[tokio::test]
async fn a_pull_sends_the_most_specific_pull_secret_for_the_registry_and_reports_the_pull() {
    let setup = Setup::with_pull_secrets(
        Duration::from_secs(5),
        RuntimeSettings::default(),
        private_registry_secrets(),
    );
    setup.fake.enable_pulls(true);
    setup.sync_ok(&private_pod("private")).await;
    setup.running("app");
    assert_eq!(setup.fake.pull_auths(), [Some(auth("team", "p2"))]);
    let events = setup.events();
    let pulled = events
        .iter()
        .find(|(reason, message)| reason == "Pulled" && message.starts_with("Successfully"))
        .unwrap_or_else(|| panic!("no Pulled event: {events:?}"));
    let prefix = format!("Successfully pulled image \"{PRIVATE_IMAGE}\" in ");
    assert!(pulled.1.starts_with(&prefix), "{pulled:?}");
    assert!(
        pulled
            .1
            .ends_with(" including waiting). Image size: 4096000 bytes."),
        "{pulled:?}"
    );
}

#[tokio::test]
async fn a_failing_pull_tries_the_pods_credentials_then_the_nodes_and_never_anonymously() {
    let setup = Setup::with_pull_secrets(
        Duration::from_secs(5),
        RuntimeSettings::default(),
        private_registry_secrets(),
    );
    // The node's docker config in its root dir: `auth` is base64 of `node:pw`.
    std::fs::write(
        setup.path().join("config.json"),
        json!({"auths": {"registry.local:5000": {"auth": "bm9kZTpwdw=="}}}).to_string(),
    )
    .unwrap_or_else(|e| panic!("writing the node's config.json: {e}"));

    let result = setup.sync(&private_pod("refused")).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ErrImagePull", "{failure:?}");
    assert_eq!(
        setup.fake.pull_auths(),
        [
            Some(auth("team", "p2")),
            Some(auth("puller", "p1")),
            Some(auth("node", "pw"))
        ]
    );
    // Three identical refusals read as one, as the kubelet's aggregate error does.
    assert!(!failure.message.starts_with('['), "{failure:?}");
}

#[tokio::test]
async fn a_malformed_pull_secret_fails_the_pull_without_asking_the_runtime() {
    let setup = Setup::with_pull_secrets(
        Duration::from_secs(5),
        RuntimeSettings::default(),
        vec![pull_secret(
            "registry",
            "kubernetes.io/dockerconfigjson",
            &json!("not a docker config"),
        )],
    );
    setup.fake.enable_pulls(true);
    let result = setup.sync(&private_pod("malformed")).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(failure.reason, "ErrImagePull", "{failure:?}");
    assert!(failure.message.contains("\"registry\""), "{failure:?}");
    assert_eq!(setup.fake.call_count("PullImage"), 0);
}

#[tokio::test]
async fn an_unavailable_runtime_gives_errors_naming_the_call() {
    let setup = Setup::new();
    let pod = simple_pod("outage", "Always", &["app"]);
    setup.fake.set_unavailable(true);

    let err = setup
        .manager
        .get_pods(true)
        .await
        .expect_err("get_pods fails while the runtime is down");
    assert!(matches!(err, RuntimeError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("ListPodSandbox") || text.contains("ListContainers"),
        "the error names the call: {text}"
    );

    let err = setup
        .manager
        .get_pod_status(&uid(&pod), "outage", NAMESPACE)
        .await
        .expect_err("get_pod_status fails while the runtime is down");
    let text = err.to_string();
    assert!(
        text.contains("ListPodSandbox") || text.contains("ListContainers"),
        "the error names the call: {text}"
    );

    let result = setup.manager.sync_pod(&pod, &PodStatus::default()).await;
    let (step, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the sync fails: {result:?}"));
    assert_eq!(step.action, SyncAction::CreatePodSandbox);
    assert_eq!(failure.reason, "CreatePodSandboxError");
    assert!(
        failure.message.contains("RunPodSandbox"),
        "{}",
        failure.message
    );
    assert!(setup.fake.sandboxes().is_empty());

    // Back up: the same client reconnects and the pod starts.
    setup.fake.set_unavailable(false);
    setup.sync_ok(&pod).await;
    setup.running("app");
}

#[tokio::test]
async fn a_call_slower_than_the_deadline_is_a_timeout_naming_the_call() {
    let setup = Setup::with(Duration::from_millis(200), RuntimeSettings::default());
    setup.fake.delay_calls(Duration::from_secs(2));

    let err = setup
        .manager
        .get_pods(false)
        .await
        .expect_err("get_pods times out");
    match err {
        RuntimeError::Timeout { call, timeout_ms } => {
            assert!(
                call == "ListPodSandbox" || call == "ListContainers",
                "unexpected call {call}"
            );
            assert_eq!(timeout_ms, 200);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }

    let err = setup
        .manager
        .version()
        .await
        .expect_err("version times out");
    assert!(
        matches!(
            err,
            RuntimeError::Timeout {
                call: "Version",
                ..
            }
        ),
        "{err:?}"
    );

    // Abandoned calls leave the client usable once the runtime answers in time again.
    setup.fake.delay_calls(Duration::ZERO);
    let pods = setup
        .manager
        .get_pods(false)
        .await
        .expect("listing after the slow spell");
    assert!(pods.is_empty());
    let pod = simple_pod("after-timeout", "Always", &["app"]);
    setup.sync_ok(&pod).await;
    setup.running("app");
}

#[tokio::test]
async fn a_changed_container_spec_restarts_only_that_container() {
    let setup = Setup::new();
    let pod = simple_pod("edit", "Always", &["kept", "changed"]);
    setup.sync_ok(&pod).await;
    let kept = setup.running("kept").id;
    let old = setup.running("changed").id;

    let mut edited = pod.clone();
    if let Some(spec) = edited.spec.as_mut() {
        spec.containers[1].command = Some(vec!["sleep".into(), "7200".into()]);
    }
    setup.fake.clear_calls();
    let result = setup.sync_ok(&edited).await;
    assert_eq!(
        result
            .results
            .iter()
            .map(|r| (r.action, r.target.as_str()))
            .collect::<Vec<_>>(),
        [
            (SyncAction::KillContainer, "changed"),
            (SyncAction::StartContainer, "changed")
        ]
    );
    assert_eq!(
        setup.running("kept").id,
        kept,
        "the unchanged container keeps running"
    );
    let new = setup.running("changed");
    assert_ne!(new.id, old);
    assert_eq!(new.config.command, ["sleep", "7200"]);
    assert_eq!(
        setup.fake.call_count("RunPodSandbox"),
        0,
        "the sandbox is kept"
    );
}

#[tokio::test]
async fn kill_pod_stops_the_containers_and_the_sandbox() {
    let setup = Setup::new();
    let pod = simple_pod("victim", "Always", &["a", "b"]);
    let bystander = simple_pod("bystander", "Always", &["c"]);
    setup.sync_ok(&pod).await;
    setup.sync_ok(&bystander).await;

    let running = setup
        .manager
        .get_pods(false)
        .await
        .expect("listing running pods");
    let victim = running
        .iter()
        .find(|p| p.uid == uid(&pod))
        .expect("the pod is listed");
    assert_eq!(victim.containers.len(), 2);
    assert_eq!(victim.sandboxes.len(), 1);

    setup.fake.clear_calls();
    setup
        .manager
        .kill_pod(Some(&pod), victim, Some(0))
        .await
        .expect("killing the pod");
    assert_eq!(setup.fake.call_count("StopContainer"), 2);
    assert_eq!(setup.fake.call_count("StopPodSandbox"), 1);

    for c in setup.fake.containers() {
        let expected = if c.name() == "c" {
            cri::ContainerState::ContainerRunning
        } else {
            cri::ContainerState::ContainerExited
        };
        assert_eq!(c.state, expected, "{}", c.name());
    }
    for s in setup.fake.sandboxes() {
        let expected = if s.name() == "victim" {
            cri::PodSandboxState::SandboxNotready
        } else {
            cri::PodSandboxState::SandboxReady
        };
        assert_eq!(s.state, expected, "{}", s.name());
    }
    let running = setup
        .manager
        .get_pods(false)
        .await
        .expect("listing running pods");
    let uids: Vec<_> = running.iter().map(|p| p.uid.clone()).collect();
    assert_eq!(uids, [uid(&bystander)], "only the bystander still runs");
}

#[tokio::test]
async fn garbage_collection_keeps_the_limit_and_running_pods() {
    let setup = Setup::without_backoff();
    // Container names differ per pod so `exit` finds the right one.
    let active = simple_pod("active", "Always", &["app"]);
    let gone = simple_pod("gone", "Always", &["g"]);
    let orphan = simple_pod("orphan", "Always", &["o"]);
    for p in [&active, &gone, &orphan] {
        setup.sync_ok(p).await;
    }

    // Three dead instances of the active pod's container and a fourth running.
    let mut dead = Vec::new();
    for attempt in 1..=3 {
        let before = setup.running("app").id;
        setup.exit("app", 0);
        dead.push(before);
        setup.sync_ok(&active).await;
        assert_eq!(setup.running("app").attempt(), attempt, "restarted");
    }

    // The "gone" pod is killed; the "orphan" one still runs but no source wants it.
    let running = setup.manager.get_pods(false).await.expect("listing pods");
    let gone_running = running
        .iter()
        .find(|p| p.uid == uid(&gone))
        .expect("gone is listed");
    setup
        .manager
        .kill_pod(Some(&gone), gone_running, Some(0))
        .await
        .expect("killing gone");
    let gone_logs = setup.path().join("logs").join("ns_gone_uid-gone");
    assert!(gone_logs.is_dir());

    setup
        .manager
        .garbage_collect(1, &HashSet::from([uid(&active)]))
        .await
        .expect("collecting garbage");

    let remaining: Vec<String> = setup.fake.containers().into_iter().map(|c| c.id).collect();
    assert!(
        !remaining.contains(&dead[0]) && !remaining.contains(&dead[1]),
        "dead instances beyond the limit are removed"
    );
    assert!(
        remaining.contains(&dead[2]),
        "the newest dead instance stays"
    );
    assert_eq!(
        setup.instances("app"),
        2,
        "the running one and the newest dead"
    );
    assert_eq!(setup.running("app").attempt(), 3);

    assert_eq!(
        setup.instances("g"),
        0,
        "the inactive pod's containers are removed"
    );
    let sandboxes = setup.fake.sandboxes();
    assert!(
        !sandboxes.iter().any(|s| s.name() == "gone"),
        "the inactive pod's sandbox is removed: {sandboxes:?}"
    );
    assert!(!gone_logs.exists(), "the gone pod's logs are removed");

    setup.running("o");
    for name in ["active", "orphan"] {
        let sandbox = sandboxes
            .iter()
            .find(|s| s.name() == name)
            .unwrap_or_else(|| panic!("{name} keeps its sandbox"));
        assert_eq!(sandbox.state, cri::PodSandboxState::SandboxReady, "{name}");
    }
}

#[tokio::test]
async fn a_dead_sandbox_is_replaced_and_its_containers_restart_in_the_new_one() {
    let setup = Setup::new();
    let pod = simple_pod("phoenix", "Always", &["app"]);
    setup.sync_ok(&pod).await;
    let old_sandbox = setup.fake.sandboxes()[0].id.clone();
    let old_app = setup.running("app").id;

    // The sandbox goes away under the agent (its pause process died, or someone stopped it).
    setup
        .manager
        .cri()
        .stop_pod_sandbox(&old_sandbox)
        .await
        .expect("stopping the sandbox behind the agent's back");

    let result = setup.sync_ok(&pod).await;
    assert!(
        result
            .results
            .iter()
            .any(|r| r.action == SyncAction::CreatePodSandbox),
        "{result:?}"
    );
    let sandboxes = setup.fake.sandboxes();
    let new_sandbox = sandboxes
        .iter()
        .find(|s| s.id != old_sandbox)
        .unwrap_or_else(|| panic!("a new sandbox: {sandboxes:?}"));
    assert_eq!(new_sandbox.state, cri::PodSandboxState::SandboxReady);
    assert_eq!(
        new_sandbox.config.metadata.as_ref().map(|m| m.attempt),
        Some(1),
        "the new sandbox is the next attempt"
    );
    let app = setup.running("app");
    assert_ne!(app.id, old_app);
    assert_eq!(app.sandbox_id, new_sandbox.id);

    let status = setup.status(&pod).await;
    assert_eq!(
        status.sandboxes[0].id.as_str(),
        new_sandbox.id,
        "newest first"
    );
    assert_eq!(status.container("app").map(|c| c.restart_count), Some(1));

    setup.fake.clear_calls();
    let result = setup.sync_ok(&pod).await;
    assert!(result.results.is_empty(), "settled: {result:?}");
}

#[tokio::test]
async fn failed_create_and_start_are_reported_and_retried() {
    let setup = Setup::new();
    let pod = simple_pod("flaky", "Always", &["app"]);

    setup
        .fake
        .fail_next("CreateContainer", tonic::Code::Internal, "no space left");
    let result = setup.sync(&pod).await;
    let (step, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the create fails: {result:?}"));
    assert_eq!(
        (step.action, step.target.as_str()),
        (SyncAction::StartContainer, "app")
    );
    assert_eq!(failure.reason, "CreateContainerError");
    assert!(failure.message.contains("no space left"), "{failure:?}");
    assert!(setup.fake.containers().is_empty());

    setup
        .fake
        .fail_next("StartContainer", tonic::Code::Unknown, "exec format error");
    let result = setup.sync(&pod).await;
    let (_, failure) = result
        .first_failure()
        .unwrap_or_else(|| panic!("the start fails: {result:?}"));
    assert_eq!(failure.reason, "RunContainerError");
    assert!(failure.message.contains("exec format error"), "{failure:?}");
    let created = setup
        .fake
        .container_named("app")
        .unwrap_or_else(|| panic!("the container was created"));
    assert_eq!(created.state, cri::ContainerState::ContainerCreated);

    // The next sync tries again and the pod runs; one sandbox throughout.
    setup.sync_ok(&pod).await;
    setup.running("app");
    assert_eq!(setup.fake.sandboxes().len(), 1);
    assert_eq!(setup.fake.call_count("RunPodSandbox"), 1);
}

/// A one-container pod whose container `a` has `lifecycle` and the given grace period.
fn hooked_pod(name: &str, grace: i64, lifecycle: &serde_json::Value) -> Pod {
    pod(json!({
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{name}")},
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "a", "image": IMAGE, "lifecycle": lifecycle.clone()}],
        },
    }))
}

#[tokio::test]
async fn a_post_start_hook_runs_after_the_start_and_its_failure_kills_the_container() {
    let setup = Setup::new();
    let hook = json!({"postStart": {"exec": {"command": ["sh", "-c", "touch /started"]}}});
    setup.sync_ok(&hooked_pod("fine", 30, &hook)).await;
    let calls = setup.fake.calls();
    let started = calls.iter().position(|c| c == "StartContainer");
    let hooked = calls.iter().position(|c| c == "ExecSync");
    assert!(started.is_some() && started < hooked, "{calls:?}");
    assert_eq!(
        setup.running("a").state,
        cri::ContainerState::ContainerRunning
    );

    setup.fake.set_exec_result("a", 1, "");
    let failing = hooked_pod("failing", 30, &hook);
    let result = setup.sync(&failing).await;
    assert_eq!(failure_reasons(&result), ["PostStartHookError"]);
    let (_, failure) = result.first_failure().expect("a failure");
    assert_eq!(
        failure.message,
        "Exec lifecycle hook ([sh -c touch /started]) for Container \"a\" in Pod \
         \"failing_ns(uid-failing)\" failed - error: command 'sh -c touch /started' exited with \
         1: , message: \"\""
    );
    let killed = setup
        .fake
        .container_named("a")
        .expect("the container is still listed");
    assert_eq!(killed.state, cri::ContainerState::ContainerExited);
    let events = setup.events();
    assert!(
        events.contains(&(
            "FailedPostStartHook".to_owned(),
            "PostStartHook failed".to_owned()
        )),
        "{events:?}"
    );
    assert!(
        events.contains(&("Killing".to_owned(), "FailedPostStartHook".to_owned())),
        "{events:?}"
    );
}

#[tokio::test]
async fn a_pre_stop_hook_runs_before_the_stop_within_the_grace_period() {
    let setup = Setup::new();
    let exec_hook = json!({"preStop": {"exec": {"command": ["drain"]}}});
    let pod = hooked_pod("draining", 30, &exec_hook);
    setup.sync_ok(&pod).await;
    setup.fake.clear_calls();
    let running = setup.status(&pod).await.live_part();
    setup
        .manager
        .kill_pod(Some(&pod), &running, None)
        .await
        .expect("killing the pod");
    let calls = setup.fake.calls();
    let hooked = calls.iter().position(|c| c == "ExecSync");
    let stopped = calls.iter().position(|c| c == "StopContainer");
    assert!(hooked.is_some() && hooked < stopped, "{calls:?}");
    assert_eq!(setup.fake.stops(), [("a".to_owned(), 30)]);

    // A hook that outlasts the grace period is cut off at its end; the stop still gets the
    // minimum grace period.
    let sleeper = hooked_pod(
        "sleeper",
        2,
        &json!({"preStop": {"sleep": {"seconds": 600}}}),
    );
    setup.sync_ok(&sleeper).await;
    let running = setup.status(&sleeper).await.live_part();
    tokio::time::timeout(
        Duration::from_mins(1),
        setup.manager.kill_pod(Some(&sleeper), &running, None),
    )
    .await
    .expect("the kill does not wait for the whole hook")
    .expect("killing the pod");
    assert_eq!(setup.fake.stops().last(), Some(&("a".to_owned(), 2)));

    // A failing hook is reported and the container still stopped.
    setup.fake.set_exec_result("a", 1, "");
    let failing = hooked_pod(
        "failing-hook",
        30,
        &json!({"preStop": {"exec": {"command": ["x"]}}}),
    );
    setup.sync_ok(&failing).await;
    let running = setup.status(&failing).await.live_part();
    setup
        .manager
        .kill_pod(Some(&failing), &running, None)
        .await
        .expect("killing the pod");
    assert!(
        setup.events().contains(&(
            "FailedPreStopHook".to_owned(),
            "PreStopHook failed".to_owned()
        )),
        "{:?}",
        setup.events()
    );
    assert_eq!(setup.fake.stops().last(), Some(&("a".to_owned(), 30)));
}

#[tokio::test]
async fn a_pre_stop_hook_is_restored_for_a_pod_that_is_gone() {
    let setup = Setup::new();
    let pod = hooked_pod(
        "orphan",
        30,
        &json!({"preStop": {"exec": {"command": ["drain"]}}}),
    );
    setup.sync_ok(&pod).await;
    setup.fake.clear_calls();
    let running = setup.status(&pod).await.live_part();
    setup
        .manager
        .kill_pod(None, &running, None)
        .await
        .expect("killing the pod without its spec");
    let calls = setup.fake.calls();
    let hooked = calls.iter().position(|c| c == "ExecSync");
    let stopped = calls.iter().position(|c| c == "StopContainer");
    assert!(hooked.is_some() && hooked < stopped, "{calls:?}");
}

#[tokio::test]
async fn a_stop_signal_goes_into_the_container_config() {
    let setup = Setup::new();
    setup
        .sync_ok(&hooked_pod("signal", 30, &json!({"stopSignal": "SIGUSR1"})))
        .await;
    let created = setup.running("a");
    assert_eq!(created.config.stop_signal(), cri::Signal::Sigusr1);
}
