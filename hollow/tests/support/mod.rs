//! Harness for the hollow runtime's end-to-end tests: starts the real `ringlet-hollow` binary on a
//! private socket, connects CRI clients to it, gives each test its own cgroup subtree, and cleans
//! up (the runtime, its containers' processes, the subtree in every hierarchy) even when a test
//! fails.
//!
//! Tests that need cgroups call [`require_cgroups`]: it prints SKIP and returns `false` where they
//! cannot run (not root, no cgroup controllers), and panics instead under `CI=true`, so CI never
//! passes by skipping (the pattern of `ringlet-tests`' `require_*` helpers).

#![allow(
    dead_code,
    reason = "every test binary includes this module and uses a different part of it"
)]
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed call here is the calling test's failure"
)]

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use ringlet_hollow::cgroup::Hierarchies;
use ringlet_hollow::cri::v1 as cri;
use ringlet_hollow::cri::v1::image_service_client::ImageServiceClient;
use ringlet_hollow::cri::v1::runtime_service_client::RuntimeServiceClient;
use tempfile::TempDir;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// The prefix of each test's own cgroup subtree, directly below each hierarchy's root.
pub const TEST_CGROUP_PREFIX: &str = "ringlet-hollow-test";
/// The image tests pull (nothing is downloaded).
pub const IMAGE: &str = "busybox";
/// How the runtime reports [`IMAGE`].
pub const IMAGE_TAG: &str = "docker.io/library/busybox:latest";
/// How long a condition may take to come true.
pub const DEADLINE: Duration = Duration::from_secs(20);

/// Why the cgroup tests cannot run here, if they cannot.
fn missing_cgroups() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("not running as root".to_owned());
    }
    let hierarchies = match Hierarchies::discover() {
        Ok(h) => h,
        Err(e) => return Some(format!("no cgroup hierarchy: {e}")),
    };
    for controller in ["cpu", "memory", "pids"] {
        let Some(hierarchy) = hierarchies.for_controller(controller) else {
            return Some(format!("no hierarchy has the {controller} controller"));
        };
        let writable =
            nix::unistd::access(&hierarchy.mount, nix::unistd::AccessFlags::W_OK).is_ok();
        if !writable {
            return Some(format!("{} is not writable", hierarchy.mount.display()));
        }
    }
    None
}

/// Returns `true` when the test may go on; prints SKIP and returns `false` when it cannot run here,
/// and panics instead under `CI=true`.
pub fn require_cgroups(test: &str) -> bool {
    match missing_cgroups() {
        None => true,
        Some(reason) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("{test}: cannot run in CI: {reason}")
        }
        Some(reason) => {
            eprintln!("SKIP {test}: {reason}");
            false
        }
    }
}

/// A sandbox made by [`Hollow::pod`].
pub struct Pod {
    pub uid: String,
    pub config: cri::PodSandboxConfig,
    pub id: String,
    pub image_id: String,
}

/// A running `ringlet-hollow` and clients to it; dropping it stops the runtime and removes the
/// test's cgroups.
pub struct Hollow {
    process: Child,
    pub dir: TempDir,
    /// This test's subtree below each hierarchy's root.
    cgroup: String,
    pub runtime: RuntimeServiceClient<Channel>,
    pub images: ImageServiceClient<Channel>,
}

impl Hollow {
    pub async fn start() -> Self {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("hollow.sock");
        let mut process = Command::new(env!("CARGO_BIN_EXE_ringlet-hollow"))
            .arg("--listen")
            .arg(&socket)
            .arg("--root")
            .arg(dir.path().join("root"))
            .args(["--log", "warn"])
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let cgroup = format!(
            "{TEST_CGROUP_PREFIX}-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        );
        let channel = match connect(&mut process, &socket).await {
            Ok(channel) => channel,
            Err(e) => {
                let _ = process.kill();
                let _ = process.wait();
                panic!("{e}");
            }
        };
        Self {
            process,
            dir,
            cgroup,
            runtime: RuntimeServiceClient::new(channel.clone()),
            images: ImageServiceClient::new(channel),
        }
    }

    /// A `cgroup_parent` for a pod of this test (cgroupfs spelling).
    pub fn cgroup_parent(&self, uid: &str) -> String {
        format!("/{}/pod{uid}", self.cgroup)
    }

    /// A sandbox config as the kubelet sends it: metadata, labels, annotations, log directory and
    /// cgroup parent.
    pub fn sandbox_config(&self, name: &str, uid: &str) -> cri::PodSandboxConfig {
        let log_directory = self.dir.path().join("pods").join(uid);
        std::fs::create_dir_all(&log_directory).unwrap();
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_owned(),
                uid: uid.to_owned(),
                namespace: "default".to_owned(),
                attempt: 0,
            }),
            log_directory: log_directory.to_string_lossy().into_owned(),
            labels: [("io.kubernetes.pod.name".to_owned(), name.to_owned())].into(),
            annotations: [("note".to_owned(), "hollow".to_owned())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: self.cgroup_parent(uid),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub async fn run_sandbox(&mut self, config: &cri::PodSandboxConfig) -> String {
        self.runtime
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .pod_sandbox_id
    }

    /// Pulls `image` and returns its id, which the kubelet puts in container configs.
    pub async fn pull(&mut self, image: &str) -> String {
        self.images
            .pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner()
            .image_ref
    }

    /// `ImageStatus` of `image`: `None` when it is not present.
    pub async fn image_status(&self, image: &str) -> Option<cri::Image> {
        let request = cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            verbose: false,
        };
        let mut images = self.images.clone();
        images
            .image_status(request)
            .await
            .unwrap()
            .into_inner()
            .image
    }

    /// A container config whose log is `<name>/0.log` in the pod's log directory (created, as the
    /// kubelet does).
    pub fn container_config(
        sandbox: &cri::PodSandboxConfig,
        name: &str,
        image_id: &str,
        command: &[&str],
    ) -> cri::ContainerConfig {
        std::fs::create_dir_all(Path::new(&sandbox.log_directory).join(name)).unwrap();
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.to_owned(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: image_id.to_owned(),
                ..Default::default()
            }),
            command: command.iter().map(|w| (*w).to_owned()).collect(),
            log_path: format!("{name}/0.log"),
            labels: [("io.kubernetes.container.name".to_owned(), name.to_owned())].into(),
            annotations: [(
                "io.kubernetes.container.restartCount".to_owned(),
                "0".to_owned(),
            )]
            .into(),
            ..Default::default()
        }
    }

    pub async fn create(
        &mut self,
        sandbox_id: &str,
        sandbox: &cri::PodSandboxConfig,
        config: cri::ContainerConfig,
    ) -> String {
        self.runtime
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox_id.to_owned(),
                config: Some(config),
                sandbox_config: Some(sandbox.clone()),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id
    }

    pub async fn start_container(&mut self, id: &str) {
        self.runtime
            .start_container(cri::StartContainerRequest {
                container_id: id.to_owned(),
            })
            .await
            .unwrap();
    }

    pub async fn status(&mut self, id: &str) -> cri::ContainerStatus {
        self.runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
    }

    /// The container's pid, from the verbose status.
    pub async fn pid(&mut self, id: &str) -> i32 {
        let info = self
            .runtime
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner()
            .info;
        let info: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
        i32::try_from(info["pid"].as_i64().unwrap()).unwrap()
    }

    /// Waits until the container has exited; returns its status.
    pub async fn wait_exited(&mut self, id: &str) -> cri::ContainerStatus {
        let runtime = self.runtime.clone();
        eventually("the container's exit", || {
            let mut runtime = runtime.clone();
            let request = cri::ContainerStatusRequest {
                container_id: id.to_owned(),
                verbose: false,
            };
            async move {
                let status = runtime
                    .container_status(request)
                    .await
                    .unwrap()
                    .into_inner()
                    .status
                    .unwrap();
                (status.state == cri::ContainerState::ContainerExited as i32).then_some(status)
            }
        })
        .await
    }

    /// Sends SIGTERM and waits for the runtime to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.process.id()).unwrap());
        kill(pid, Signal::SIGTERM).unwrap();
        let process = &mut self.process;
        let started = Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if let Some(status) = process.try_wait().unwrap() {
                return status;
            }
            assert!(started.elapsed() < DEADLINE, "ringlet-hollow did not stop");
        }
    }

    /// SIGKILLs the runtime and reaps it.
    pub fn kill_runtime(&mut self) {
        self.process.kill().unwrap();
        self.process.wait().unwrap();
    }

    /// A pod's cgroup directory in the hierarchy that has `controller`.
    pub fn pod_cgroup(&self, uid: &str, controller: &str) -> PathBuf {
        let hierarchies = Hierarchies::discover().unwrap();
        let mount = &hierarchies.for_controller(controller).unwrap().mount;
        mount.join(self.cgroup_parent(uid).trim_start_matches('/'))
    }

    /// A container's cgroup directory (cgroupfs naming) in the hierarchy that has `controller`.
    pub fn container_cgroup(&self, uid: &str, id: &str, controller: &str) -> PathBuf {
        self.pod_cgroup(uid, controller).join(id)
    }

    /// A ready sandbox named `name` with the test image pulled: what most tests start from.
    pub async fn pod(&mut self, name: &str, uid: &str) -> Pod {
        let config = self.sandbox_config(name, uid);
        let id = self.run_sandbox(&config).await;
        let image_id = self.pull(IMAGE).await;
        Pod {
            uid: uid.to_owned(),
            config,
            id,
            image_id,
        }
    }

    /// Creates and starts a container of `pod` running `command`; returns its id.
    pub async fn run(&mut self, pod: &Pod, name: &str, command: &[&str]) -> String {
        let config = Self::container_config(&pod.config, name, &pod.image_id, command);
        let id = self.create(&pod.id, &pod.config, config).await;
        self.start_container(&id).await;
        id
    }

    /// The directories of this test's cgroup subtree, one per hierarchy.
    pub fn cgroup_dirs(&self) -> Vec<PathBuf> {
        Hierarchies::discover()
            .unwrap()
            .all()
            .iter()
            .map(|h| h.mount.join(&self.cgroup))
            .collect()
    }
}

/// Waits for the runtime's socket, then connects a channel to it.
async fn connect(process: &mut Child, socket: &Path) -> Result<Channel, String> {
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        if let Some(status) = process.try_wait().map_err(|e| e.to_string())? {
            return Err(format!("ringlet-hollow exited before serving: {status}"));
        }
        if UnixStream::connect(socket).await.is_ok() {
            break;
        }
        if started.elapsed() > DEADLINE {
            return Err("ringlet-hollow did not listen".to_owned());
        }
    }
    let socket = socket.to_owned();
    Endpoint::from_static("http://hollow.invalid")
        .connect_with_connector(tower::service_fn(move |_| {
            let socket = socket.clone();
            async move { UnixStream::connect(socket).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| e.to_string())
}

impl Drop for Hollow {
    fn drop(&mut self) {
        // Killed, the runtime takes its containers' processes along (their death signal), and
        // what remains of the cgroups is removed here. (A graceful stop would wait for this
        // test's client connections, whose tasks cannot run while this blocks.)
        let _ = self.process.kill();
        let _ = self.process.wait();
        for dir in self.cgroup_dirs() {
            remove_cgroup_tree(&dir);
        }
    }
}

/// Kills what is left in a cgroup subtree and removes it, bottom up. Killed processes leave their
/// cgroup a moment after the signal, so a busy directory is tried again for a while.
fn remove_cgroup_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path());
        }
    }
    let started = Instant::now();
    loop {
        let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) if started.elapsed() > DEADLINE => {
                eprintln!("cleanup: cannot remove {}: {e}", dir.display());
                return;
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The code and message of a call that must fail.
pub fn error_of<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> (tonic::Code, String) {
    let status = result.unwrap_err();
    (status.code(), status.message().to_owned())
}

/// Whether `pid` has ended (gone, or a zombie nobody reaped yet).
pub fn has_ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        // The state follows the command, which is in parentheses.
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X'))
    })
}

/// The pids in a cgroup's `cgroup.procs`.
pub fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// One line of a CRI log: time, stream, tag, text.
pub fn parse_log_line(line: &str) -> (jiff::Timestamp, String, String, String) {
    let mut parts = line.splitn(4, ' ');
    let mut next = || parts.next().unwrap().to_owned();
    let time = next().parse().unwrap();
    (time, next(), next(), next())
}

/// Polls `check` until it yields a value, for up to [`DEADLINE`].
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < DEADLINE, "timed out waiting for {what}");
    }
}
