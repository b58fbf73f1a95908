//! End-to-end: the systemd unit `deploy/systemd/ringlet.service`, run as systemd would run it but
//! without systemd (it is not PID 1 here). The test reads the unit's `ExecStart=` and
//! `CapabilityBoundingSet=`, runs that command line (the test's binary and config in place of the
//! installed paths) under that bounding set with `setpriv`, and plays the service manager's part of
//! `sd_notify(3)`: a unix datagram socket named by `NOTIFY_SOCKET`, and `WATCHDOG_USEC`. Run as root
//! after `cargo xtask lab up`, one test at a time.

use std::fs;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ringlet_tests::daemon::Daemon;
use ringlet_tests::{
    Agent, AgentOptions, container_status, http_get, lab_containerd, require_ebpf_lab,
    restart_lab_containerd, wait_for,
};

/// The unit the test runs, relative to the workspace.
const UNIT: &str = "deploy/systemd/ringlet.service";
/// The watchdog interval the test asks for: the agent pings every half of it.
const WATCHDOG: Duration = Duration::from_secs(2);
/// Upper bound for the agent or a pod to come up on this machine.
const START: Duration = Duration::from_mins(1);
/// The test's `KubeletConfiguration`: a 1 s resync makes the sync-loop health threshold its 10 s
/// floor; a 1 s full relist retries the first relist (which fails while containerd is down) at
/// once instead of after the 60 s safety period of ebpf mode. Image garbage collection is off, as
/// for every agent on the lab's containerd (`ringlet_tests::LAB_IMAGE_GC_OFF`).
const CONFIG: &str = "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
syncFrequency: 1s
plegMode: ebpf
plegRelistPeriod: 1s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
";

/// The settings of the unit file the test acts on.
struct Unit {
    exec_start: Vec<String>,
    capabilities: Vec<String>,
}

impl Unit {
    fn read() -> Result<Self> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(UNIT);
        let text = fs::read_to_string(&path).with_context(|| format!("reading {UNIT}"))?;
        let setting = |key: &str| -> Result<String> {
            let prefix = format!("{key}=");
            let values: Vec<&str> = text
                .lines()
                .filter_map(|line| line.trim().strip_prefix(&prefix))
                .collect();
            match values[..] {
                [value] => Ok(value.to_owned()),
                _ => bail!(
                    "{UNIT} must set {key}= exactly once, it does {} times",
                    values.len()
                ),
            }
        };
        let exec_start = setting("ExecStart")?;
        if exec_start.contains(['"', '\'', '\\', '$', '%']) {
            bail!(
                "{UNIT}: ExecStart={exec_start} uses quoting or expansion this test does not parse"
            );
        }
        assert_eq!(setting("Type")?, "notify", "{UNIT} must be Type=notify");
        assert!(
            !setting("WatchdogSec")?.is_empty(),
            "{UNIT} must set WatchdogSec="
        );
        Ok(Self {
            exec_start: exec_start.split_whitespace().map(str::to_owned).collect(),
            capabilities: setting("CapabilityBoundingSet")?
                .split_whitespace()
                .map(str::to_owned)
                .collect(),
        })
    }

    /// The unit's arguments with the installed config replaced by `config`; the binary must be
    /// `ringlet` (the harness runs the one it built).
    fn args_with_config(&self, config: &Path) -> Result<Vec<String>> {
        let (binary, args) = self
            .exec_start
            .split_first()
            .context("ExecStart= is empty")?;
        if Path::new(binary)
            .file_name()
            .is_none_or(|name| name != "ringlet")
        {
            bail!("ExecStart= runs {binary}, not ringlet");
        }
        let mut replaced = Vec::new();
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            replaced.push(arg.clone());
            if arg == "--config" {
                args.next()
                    .context("ExecStart=: --config without a value")?;
                replaced.push(config.display().to_string());
            } else if arg.starts_with('/') {
                bail!("ExecStart= names a path this test does not know how to replace: {arg}");
            }
        }
        Ok(replaced)
    }

    /// `setpriv` arguments giving the agent exactly the unit's bounding set (root's capabilities
    /// after exec are its bounding set, as under systemd).
    fn setpriv(&self) -> Result<Vec<String>> {
        let mut set = vec!["-all".to_owned()];
        for capability in &self.capabilities {
            let name = capability
                .strip_prefix("CAP_")
                .with_context(|| format!("CapabilityBoundingSet= names {capability}"))?;
            set.push(format!("+{}", name.to_ascii_lowercase()));
        }
        Ok(vec![
            "setpriv".to_owned(),
            "--bounding-set".to_owned(),
            set.join(","),
        ])
    }
}

/// The service manager's end of `NOTIFY_SOCKET`: a thread reads every datagram as it comes (a
/// full socket would block the agent) and hands its `KEY=value` lines over in order.
struct NotifySocket {
    path: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> Result<Self> {
        let path = dir.join("notify.sock");
        let socket = UnixDatagram::bind(&path).context("binding the notify socket")?;
        let (send, lines) = mpsc::channel();
        thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(len) = socket.recv(&mut buf) {
                for line in String::from_utf8_lossy(&buf[..len]).lines() {
                    if send.send(line.to_owned()).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Self { path, lines })
    }

    /// The lines that arrived so far.
    fn drain(&self) -> Vec<String> {
        self.lines.try_iter().collect()
    }

    /// The lines arriving within `period`.
    fn during(&self, period: Duration) -> Vec<String> {
        let end = Instant::now() + period;
        let mut lines = Vec::new();
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        lines
    }

    /// Reads lines until `wanted` arrives; the lines before it.
    fn until(&self, wanted: &str, timeout: Duration) -> Result<Vec<String>> {
        let end = Instant::now() + timeout;
        let mut before = Vec::new();
        loop {
            let left = end
                .checked_duration_since(Instant::now())
                .unwrap_or_default();
            match self.lines.recv_timeout(left) {
                Ok(line) if line == wanted => return Ok(before),
                Ok(line) => before.push(line),
                Err(_) => bail!("no {wanted} within {timeout:?}; got {before:?}"),
            }
        }
    }
}

/// The lab's containerd stopped by the test; started again with its command line when dropped, so
/// a failing test does not leave the lab without it.
struct ContainerdStopped {
    containerd: Daemon,
    command_line: Vec<String>,
    stopped: bool,
}

impl ContainerdStopped {
    fn stop() -> Result<Self> {
        let containerd = lab_containerd();
        let command_line = containerd
            .command_line()?
            .context("the lab's containerd is not running")?;
        containerd.stop(Duration::from_secs(15))?;
        Ok(Self {
            containerd,
            command_line,
            stopped: true,
        })
    }

    fn restart(&mut self) -> Result<()> {
        self.stopped = false;
        restart_lab_containerd(&self.containerd, &self.command_line)
    }
}

impl Drop for ContainerdStopped {
    fn drop(&mut self) {
        if self.stopped {
            let _ = restart_lab_containerd(&self.containerd, &self.command_line);
        }
    }
}

fn count(lines: &[String], wanted: &str) -> usize {
    lines.iter().filter(|line| *line == wanted).count()
}

/// A pod running as user 1000 with `fsGroup` 2000 (the volumes' group, set by the agent only with
/// `CAP_CHOWN`) that writes into a private directory of a disk `emptyDir` (removed by the agent
/// only with `CAP_DAC_OVERRIDE`) and into a `medium: Memory` one (a tmpfs the agent mounts with
/// `CAP_SYS_ADMIN`).
const VOLUMES_POD: &str = r#"
apiVersion: v1
kind: Pod
metadata:
  name: volumes
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {runAsUser: 1000, fsGroup: 2000}
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sh", "-c", "mkdir -m 700 /scratch/private && echo x > /scratch/private/file && echo y > /memory/file && exec sleep 3600"]
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: memory, mountPath: /memory}
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: memory, emptyDir: {medium: Memory}}
"#;

fn is_mount_point(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let path = path.display().to_string();
    mounts
        .lines()
        .any(|line| line.split_whitespace().nth(4) == Some(path.as_str()))
}

#[test]
fn the_unit_notifies_ready_watchdog_and_stopping_and_runs_pods_with_its_capabilities() -> Result<()>
{
    let test = "the_unit_notifies_ready_watchdog_and_stopping_and_runs_pods_with_its_capabilities";
    if !require_ebpf_lab(test) {
        return Ok(());
    }
    let unit = Unit::read()?;
    let dir = tempfile::Builder::new()
        .prefix("ringlet-systemd-")
        .tempdir()?;
    let config = dir.path().join("config.yaml");
    fs::write(&config, CONFIG)?;
    let notify = NotifySocket::bind(dir.path())?;
    let started = Instant::now();
    let phase = |what: &str| eprintln!("{:>6.1?} {what}", started.elapsed());

    // Started while containerd is down: the servers listen, but no relist can succeed, so no READY.
    let mut containerd = ContainerdStopped::stop()?;
    let setpriv = unit.setpriv()?;
    let wrapper: Vec<&str> = setpriv.iter().map(String::as_str).collect();
    let mut agent = Agent::start_wrapped(
        "systemd",
        AgentOptions {
            args: unit.args_with_config(&config)?,
            env: vec![
                (
                    "NOTIFY_SOCKET".to_owned(),
                    notify.path.display().to_string(),
                ),
                ("WATCHDOG_USEC".to_owned(), WATCHDOG.as_micros().to_string()),
            ],
            ..AgentOptions::default()
        },
        &wrapper,
    )?;
    let (code, body) = http_get(agent.healthz_port, "/healthz/pleg")?;
    assert_eq!(code, 500, "no relist without containerd: {body}");
    let early = notify.during(WATCHDOG);
    assert!(
        early.is_empty(),
        "nothing before the first relist, got {early:?}"
    );

    phase("agent started, containerd down");
    // containerd back: the first relist succeeds and READY=1 follows, then the watchdog pings.
    containerd.restart()?;
    let before_ready = notify.until("READY=1", START)?;
    assert!(before_ready.is_empty(), "{before_ready:?}");
    let (code, body) = http_get(agent.healthz_port, "/healthz/pleg")?;
    assert_eq!(code, 200, "READY=1 comes after a relist: {body}");
    let (code, body) = http_get(agent.healthz_port, "/healthz")?;
    assert_eq!(code, 200, "READY=1 comes with every check passing: {body}");
    let healthy = notify.during(WATCHDOG * 2);
    assert!(
        count(&healthy, "WATCHDOG=1") >= 2,
        "pings every {:?} while healthy: {healthy:?}",
        WATCHDOG / 2
    );
    let (_, verbose) = http_get(agent.healthz_port, "/healthz?verbose")?;
    assert!(
        verbose.contains("info: pleg: mode ebpf"),
        "the eBPF PLEG runs under the unit's capabilities: {verbose}"
    );

    phase("READY=1 and pings");
    pod_volumes_are_mounted_and_removed(&agent)?;

    phase("pod volumes");
    // containerd down again: the sync loop stops going round, /healthz fails, the pings stop.
    notify.drain();
    let mut containerd = ContainerdStopped::stop()?;
    wait_for("/healthz to fail", START, || {
        http_get(agent.healthz_port, "/healthz")
            .ok()
            .and_then(|(code, _)| (code == 500).then_some(()))
    })?;
    // A ping sent just before may still arrive; from the unhealthy STATUS= on there must be none.
    let unhealthy_since = wait_for("an unhealthy STATUS=", START, || {
        notify
            .lines
            .recv_timeout(WATCHDOG)
            .ok()
            .filter(|line| line.starts_with("STATUS=unhealthy: "))
    })?;
    assert!(unhealthy_since.contains("syncloop"), "{unhealthy_since}");
    let unhealthy = notify.during(WATCHDOG * 2);
    assert_eq!(
        count(&unhealthy, "WATCHDOG=1"),
        0,
        "no pings while unhealthy: {unhealthy:?}"
    );
    phase("unhealthy, no pings");
    containerd.restart()?;
    notify.until("WATCHDOG=1", START)?;

    phase("pings again");
    // SIGTERM: STOPPING=1 before the agent exits.
    notify.drain();
    assert!(agent.stop()?, "the agent exits cleanly on SIGTERM");
    let stopping = notify.drain();
    assert!(
        stopping.iter().any(|line| line == "STOPPING=1"),
        "STOPPING=1 before exit: {stopping:?}"
    );
    phase("STOPPING=1");
    Ok(())
}

/// The unit's capabilities are enough for a pod's volumes, from mount to removal.
fn pod_volumes_are_mounted_and_removed(agent: &Agent) -> Result<()> {
    agent.write_manifest("volumes.yaml", VOLUMES_POD)?;
    let pod = agent.wait_pod("volumes", "running", START, |pod| {
        container_status(pod, "main").is_some_and(|c| c["state"]["running"].is_object())
    })?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let pod_dir = agent.root_dir().join("pods").join(uid);
    let empty_dirs = pod_dir.join("volumes").join("kubernetes.io~empty-dir");
    wait_for("the pod's file in its private directory", START, || {
        fs::metadata(empty_dirs.join("scratch/private/file")).ok()
    })?;
    assert!(
        is_mount_point(&empty_dirs.join("memory")),
        "a tmpfs on the memory volume"
    );
    agent.remove_manifest("volumes.yaml")?;
    wait_for("the pod's directory to be removed", START, || {
        (!pod_dir.exists()).then_some(())
    })
    .with_context(|| ringlet_tests::tail(&agent.log(), 30))?;
    Ok(())
}
