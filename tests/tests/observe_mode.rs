//! `ringlet observe` next to the upstream kubelet (v1.36, standalone on the lab's containerd, static
//! pods, `/pods` on its read-only port): the test kills containers' init processes 20 times, takes
//! its own measurement of each kill and checks observe mode's against it.
//!
//! The outside measurement of a kill: a pidfd on the container's init (its pid from containerd's
//! task list) becomes readable when the process is dead, and the test's clock (`CLOCK_MONOTONIC`,
//! the clock of the kernel's BPF timestamps that observe mode measures from) is read then; the test
//! then polls the kubelet's `/pods` until it reports the container terminated
//! (terminated state, or a restart whose last state is that container) and reads the clock again.
//! Observe mode's value for the same kill comes from its live event stream (`ringlet events
//! --socket … -o json`): each measurement is a `StatusUpdated` event naming the container id with
//! the lag as its `kernel_to_event_ns`, the same feature an operator uses, not a test-only hook.
//! The test's polls take milliseconds each (a fresh connection and a JSON parse in a debug build,
//! then a pause of [`POLL_PAUSE`]), and the death lies somewhere between the SIGKILL and the pidfd turning readable, so its
//! measurement is a window: from the last poll that did not show the exit to the first that did,
//! counted from the death's latest and earliest possible moments. Kill by kill, observe mode's value (it polls every 1 ms)
//! must lie in that window widened by [`TOLERANCE`] either side; and the histogram on `/metrics` must hold exactly the 20
//! samples with their sum. The kills go to ten pods, two each (a container's first crash restarts
//! at once; later ones would meet the kubelet's crash-loop back-off and slow the test down).
//!
//! It also checks that observe mode touches no container (containerd's containers and tasks, with
//! pids and states, and the kubelet's restart counts are the same right before it starts and once
//! it is up, and right before it stops and after), leaves no BPF pins, and serves `/metrics` that
//! `promtool check metrics` accepts. The kubelet changes host state (sysctls, `KUBE-*` chains,
//! directories, `QoS` cgroups): `HostGuard` records it first and puts it back on every exit path,
//! after the kubelet's guard has removed its pods and stopped it.

use std::collections::BTreeMap;
use std::fs;
use std::io::{BufRead as _, BufReader};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ringlet_tests::cluster::run_with_input;
use ringlet_tests::kubelet_host::{
    HostGuard, LabKubelet, POD_REMOVAL_TIMEOUT, containers_in_containerd, kubelet_from_env,
    unmount_below, wait_for_empty_containerd,
};
use ringlet_tests::{
    LAB_DIR, containers_of_node, free_port, http_get, image_binary, metric_value, node_lock,
    require_ebpf_lab, ringlet_binary, tail, task, wait_for, wait_until_watching,
};
use serde_json::Value;

const TEST: &str = "observe_mode";
const NODE: &str = "observe-test";
const PODS: usize = 10;
const KILLS_PER_POD: usize = 2;
/// How far observe mode's value may lie outside the test's window (issue 15: 5 ms). Observe mode
/// brackets the report between its own reads of `/pods` (one started every millisecond,
/// overlapping) and counts to the bracket's middle, so it lies outside the window only when its
/// bracket is much wider than the test's (its poller was kept off the CPU for milliseconds).
const TOLERANCE: Duration = Duration::from_millis(5);
/// The test's own polls of `/pods` pause this long between them: back to back, a debug build's
/// fresh connection and JSON parse keep a core busy, and on two cores that delays the kubelet and
/// observe mode by milliseconds at random. The pause widens the test's window by as much.
const POLL_PAUSE: Duration = Duration::from_millis(1);
const PIN_PATH: &str = "/sys/fs/bpf/ringlet-observe-test";

#[test]
fn observe_mode_measures_the_kubelets_status_lag_as_an_outside_observer_does() -> Result<()> {
    if !require_ebpf_lab(TEST) {
        return Ok(());
    }
    let kubelet_binary = match binaries() {
        Ok(kubelet) => kubelet,
        Err(missing) => return skip(&missing),
    };
    let _lock = node_lock::node_lock()?;
    wait_for_empty_containerd()?;
    let _host = HostGuard::take()?;
    let kubelet = Kubelet::start(&kubelet_binary)?;
    for pod in 0..PODS {
        kubelet.write_manifest(pod)?;
    }
    let first_containers = wait_for("every pod running", Duration::from_mins(3), || {
        (0..PODS)
            .map(|pod| running_container(&kubelet.pods().ok()?, pod))
            .collect::<Option<Vec<String>>>()
    })
    .with_context(|| format!("kubelet log:\n{}", tail(&kubelet.log(), 40)))?;

    let before_start = snapshot(&kubelet)?;
    let mut observe = Observe::start(kubelet.read_only_port)?;
    observe.wait_healthy()?;
    ensure!(
        snapshot(&kubelet)? == before_start,
        "starting observe mode changed the containers"
    );
    let watcher = EventWatcher::start(&observe.events_socket)?;

    let outside = kill_all(&kubelet, first_containers)?;

    let observed = wait_for(
        "observe mode's 20 measurements on its event stream",
        Duration::from_secs(30),
        || match watcher.lags() {
            Ok(lags) => (lags.len() >= outside.len()).then_some(Ok(lags)),
            Err(err) => Some(Err(err)),
        },
    )
    .and_then(|lags| lags)
    .with_context(|| format!("observe log:\n{}", tail(&observe.log(), 40)))?;
    let metrics = observe.metrics()?;
    let before_stop = snapshot(&kubelet)?;
    observe.stop()?;
    ensure!(
        snapshot(&kubelet)? == before_stop,
        "stopping observe mode changed the containers"
    );
    ensure!(
        fs::read_dir(PIN_PATH).map_or(true, |mut entries| entries.next().is_none()),
        "observe mode left BPF pins in {PIN_PATH}"
    );

    let mut differences = Vec::new();
    for (container, lag) in &outside {
        let seen = observed
            .get(container)
            .with_context(|| format!("observe mode did not measure the exit of {container}"))?;
        differences.push((container, *lag, *seen));
    }
    ensure!(
        observed.len() == outside.len(),
        "observe mode measured exits the test did not cause: {observed:?}"
    );
    let series = "ringlet_observed_kubelet_status_lag_seconds_count{source=\"kubelet_pods\"}";
    assert_eq!(
        metric_value(&metrics, series),
        Some(20),
        "{series} in:\n{metrics}"
    );
    let sum = metric_f64(
        &metrics,
        "ringlet_observed_kubelet_status_lag_seconds_sum{source=\"kubelet_pods\"}",
    )
    .context("no lag histogram sum")?;
    let observed_sum: f64 = observed.values().map(Duration::as_secs_f64).sum();
    assert!(
        (sum - observed_sum).abs() < 1e-3,
        "the histogram sum {sum} is the sum of the measurements {observed_sum}"
    );
    promtool_accepts(&metrics)?;

    print_figures(&observed);
    assert_agreement(&differences);
    Ok(())
}

/// Every kill's lag as observe mode measured it lies in the test's window for it (widened by
/// [`TOLERANCE`]).
fn assert_agreement(differences: &[(&String, ReportWindow, Duration)]) {
    for (container, outside, seen) in differences {
        println!(
            "{container}: outside {:?} to {:?}, observe mode {seen:?} ({:+.2} ms past the window's end)",
            outside.earliest,
            outside.latest,
            (seen.as_secs_f64() - outside.latest.as_secs_f64()) * 1e3
        );
    }
    let disagreeing: Vec<String> = differences
        .iter()
        .filter(|(_, outside, seen)| !outside.agrees_with(*seen))
        .map(|(c, outside, seen)| {
            format!(
                "{c}: outside {:?} to {:?}, observe mode {seen:?}",
                outside.earliest, outside.latest
            )
        })
        .collect();
    assert!(
        disagreeing.is_empty(),
        "observe mode's lag is more than {TOLERANCE:?} outside the test's window:\n{}",
        disagreeing.join("\n")
    );
}

/// Kills every pod's container [`KILLS_PER_POD`] times, waiting between rounds until each pod runs
/// a new one; returns the outside measurement of each kill by container id.
fn kill_all(
    kubelet: &Kubelet,
    first_containers: Vec<String>,
) -> Result<BTreeMap<String, ReportWindow>> {
    let mut outside = BTreeMap::new();
    let mut current = first_containers;
    for round in 0..KILLS_PER_POD {
        for (pod, container) in current.iter().enumerate() {
            let window = kill_and_measure(kubelet, pod, container)?;
            println!(
                "kill {round}/{pod}: container {container} reported after {:?} to {:?}",
                window.earliest, window.latest
            );
            outside.insert(container.clone(), window);
        }
        // Every pod runs a new container again (a second crash may wait out a back-off).
        current = wait_for("every pod running again", Duration::from_mins(2), || {
            let pods = kubelet.pods().ok()?;
            (0..PODS)
                .map(|pod| running_container(&pods, pod).filter(|c| !outside.contains_key(c)))
                .collect::<Option<Vec<String>>>()
        })?;
    }

    Ok(outside)
}

/// The figures of the run: median and p99 of observe mode's measurements.
fn print_figures(observed: &BTreeMap<String, Duration>) {
    let mut lags: Vec<f64> = observed.values().map(|d| d.as_secs_f64() * 1e3).collect();
    lags.sort_by(f64::total_cmp);
    println!(
        "observed kubelet status lag over {} kills: median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        lags.len(),
        f64::midpoint(lags[lags.len() / 2 - 1], lags[lags.len() / 2]),
        lags[(lags.len() * 99).div_ceil(100) - 1],
        lags[lags.len() - 1],
    );
}

/// The upstream kubelet's binary once observe mode's (the image's static release binary) is there
/// too, or what is missing. Observe mode runs as shipped: a debug build reads `/pods` too slowly
/// to be timed within milliseconds.
fn binaries() -> Result<PathBuf, String> {
    let kubelet = kubelet_from_env()
        .ok_or("no upstream kubelet: set KUBELET or KUBEBUILDER_ASSETS (with a kubelet)")?;
    if !image_binary().is_file() {
        return Err(format!(
            "no {}: run `cargo xtask image`",
            image_binary().display()
        ));
    }
    Ok(kubelet)
}

fn skip(reason: &str) -> Result<()> {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        bail!("{TEST}: cannot run in CI: {reason}");
    }
    eprintln!("SKIP {TEST}: {reason}");
    Ok(())
}

/// When, after a container's death, the kubelet's `/pods` first reported it, as the test sees it:
/// after the start of the last poll that did not show it and before the end of the first that did,
/// counted from the death, which lies between the SIGKILL and the pidfd turning readable (the
/// kernel first kills and reaps the rest of the container's pid namespace). Each of these takes
/// milliseconds, so the outside measurement is this window, not an instant.
#[derive(Clone, Copy, Debug)]
struct ReportWindow {
    earliest: Duration,
    latest: Duration,
}

impl ReportWindow {
    /// Whether `lag` (observe mode's) lies in the window, widened by [`TOLERANCE`] either side.
    fn agrees_with(&self, lag: Duration) -> bool {
        lag + TOLERANCE >= self.earliest && lag <= self.latest + TOLERANCE
    }
}

/// Kills the init of `container` (pod `pod`'s) and returns the window in which the kubelet's
/// `/pods` started reporting it, counted from its death, as the test sees them.
fn kill_and_measure(kubelet: &Kubelet, pod: usize, container: &str) -> Result<ReportWindow> {
    let (pid, status) =
        task(container)?.with_context(|| format!("container {container} has no task"))?;
    ensure!(
        status == "RUNNING",
        "container {container}'s task is {status}"
    );
    let pidfd = pidfd_open(pid)?;
    let signalled = monotonic_now();
    // SAFETY: pidfd_send_signal on a pidfd we own, with no siginfo.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    ensure!(
        sent == 0,
        "killing pid {pid}: {}",
        std::io::Error::last_os_error()
    );
    let mut poll = [readable(&pidfd)];
    // SAFETY: `poll` holds one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(poll.as_mut_ptr(), 1, 10_000) };
    let died = monotonic_now();
    ensure!(ready == 1, "pid {pid} did not die within 10 s");
    let deadline = Instant::now() + Duration::from_mins(1);
    let mut unreported_at = died;
    loop {
        let sent = monotonic_now();
        let (code, body) = http_get(kubelet.read_only_port, "/pods")?;
        let seen = monotonic_now();
        if code == 200 {
            let pods: Value = serde_json::from_str(&body)?;
            if reports_exit(&pods, pod, container) {
                // The death itself lies between the signal and the pidfd turning readable.
                return Ok(ReportWindow {
                    earliest: unreported_at.saturating_sub(died),
                    latest: seen.saturating_sub(signalled),
                });
            }
            unreported_at = sent;
        }
        if Instant::now() > deadline {
            bail!("the kubelet did not report the exit of {container} within 60 s");
        }
        std::thread::sleep(POLL_PAUSE);
    }
}

/// A `poll` entry waiting for `fd` to become readable (a pidfd does when its process is dead).
fn readable(fd: &OwnedFd) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    }
}

fn pidfd_open(pid: u32) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    ensure!(
        fd >= 0,
        "pidfd_open({pid}): {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel just returned this descriptor to us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd)?) })
}

/// `CLOCK_MONOTONIC`, the clock of `bpf_ktime_get_ns`.
fn monotonic_now() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut now) };
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or_default(),
        u32::try_from(now.tv_nsec).unwrap_or_default(),
    )
}

fn pod_name(pod: usize) -> String {
    format!("observe-{pod}")
}

/// The pod's entry in a `/pods` answer (static pods are named `<name>-<node>`).
fn pod_entry(pods: &Value, pod: usize) -> Option<&Value> {
    let name = format!("{}-{NODE}", pod_name(pod));
    pods["items"]
        .as_array()?
        .iter()
        .find(|p| p["metadata"]["name"] == name.as_str())
}

fn bare_id(container_id: &Value) -> Option<&str> {
    container_id.as_str()?.rsplit_once("://").map(|(_, id)| id)
}

/// The id of the pod's running container.
fn running_container(pods: &Value, pod: usize) -> Option<String> {
    let status = &pod_entry(pods, pod)?["status"]["containerStatuses"][0];
    status["state"]["running"].is_object().then_some(())?;
    bare_id(&status["containerID"]).map(str::to_owned)
}

/// Whether the pod's status reports `container` terminated (its state, or the last state of a
/// restarted container).
fn reports_exit(pods: &Value, pod: usize, container: &str) -> bool {
    let Some(entry) = pod_entry(pods, pod) else {
        return false;
    };
    let status = &entry["status"]["containerStatuses"][0];
    let terminated_now = status["state"]["terminated"].is_object()
        && bare_id(&status["containerID"]) == Some(container);
    let last = bare_id(&status["lastState"]["terminated"]["containerID"]) == Some(container);
    terminated_now || last
}

/// What observe mode must not change: containerd's containers, their tasks (pid and status) and
/// the kubelet's restart counts.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    tasks: BTreeMap<String, Option<(u32, String)>>,
    restart_counts: Vec<u64>,
}

fn snapshot(kubelet: &Kubelet) -> Result<Snapshot> {
    let mut tasks = BTreeMap::new();
    for id in containers_in_containerd()? {
        let state = task(&id)?;
        tasks.insert(id, state);
    }
    let pods = kubelet.pods()?;
    let restart_counts = (0..PODS)
        .map(|pod| {
            pod_entry(&pods, pod)
                .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_u64())
                .unwrap_or_default()
        })
        .collect();
    Ok(Snapshot {
        tasks,
        restart_counts,
    })
}

fn metric_f64(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (name, value) = line.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok()).flatten()
    })
}

fn promtool_accepts(metrics: &str) -> Result<()> {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        return skip("promtool is missing (`cargo xtask lab up` installs it): /metrics not linted");
    }
    run_with_input(Command::new("promtool").args(["check", "metrics"]), metrics)
        .context("promtool check metrics on observe mode's /metrics")?;
    Ok(())
}

/// The upstream kubelet standalone on the lab's containerd; dropping it removes its pods, stops it
/// and unmounts what it left mounted.
struct Kubelet {
    child: Child,
    config: LabKubelet,
    read_only_port: u16,
    _dir: tempfile::TempDir,
}

impl Kubelet {
    fn start(binary: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("observe-kubelet-")
            .tempdir_in(LAB_DIR)?;
        let config = LabKubelet {
            manifests: dir.path().join("manifests"),
            run_dir: dir.path().to_path_buf(),
            root_dir: dir.path().join("root"),
            read_only_port: free_port()?,
            port: free_port()?,
            healthz_port: free_port()?,
            registration: None,
            evented_pleg: false,
        };
        let child = config.spawn(binary, NODE)?;
        let kubelet = Self {
            child,
            read_only_port: config.read_only_port,
            config,
            _dir: dir,
        };
        wait_for(
            "the kubelet's read-only port",
            Duration::from_mins(1),
            || {
                http_get(kubelet.read_only_port, "/pods")
                    .ok()
                    .filter(|(code, _)| *code == 200)
            },
        )
        .with_context(|| format!("kubelet log:\n{}", tail(&kubelet.log(), 40)))?;
        Ok(kubelet)
    }

    fn log(&self) -> String {
        fs::read_to_string(self.config.log_path()).unwrap_or_default()
    }

    fn write_manifest(&self, pod: usize) -> Result<()> {
        let name = pod_name(pod);
        let manifest = format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostNetwork: true
  restartPolicy: Always
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: busybox
    imagePullPolicy: IfNotPresent
    command: ["sleep", "3600"]
"#
        );
        fs::write(self.config.manifests.join(format!("{name}.yaml")), manifest)?;
        Ok(())
    }

    fn pods(&self) -> Result<Value> {
        let (code, body) = http_get(self.read_only_port, "/pods")?;
        ensure!(code == 200, "/pods answered {code}");
        Ok(serde_json::from_str(&body)?)
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        if let Ok(entries) = fs::read_dir(&self.config.manifests) {
            for entry in entries.flatten() {
                let _ = fs::remove_file(entry.path());
            }
        }
        if let Err(err) = wait_for(
            "the kubelet to remove its pods",
            POD_REMOVAL_TIMEOUT,
            || containers_of_node(NODE).ok()?.is_empty().then_some(()),
        ) {
            eprintln!("{TEST}: {err:#}; kubelet log:\n{}", tail(&self.log(), 30));
        }
        ringlet_tests::daemon::signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
        if let Err(err) = unmount_below(&self.config.run_dir) {
            eprintln!("{TEST}: unmounting what the kubelet left: {err:#}");
        }
    }
}

/// `ringlet observe` next to the kubelet; stopped with SIGTERM when dropped.
struct Observe {
    child: Option<Child>,
    port: u16,
    events_socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Observe {
    fn start(read_only_port: u16) -> Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ringlet-observe-")
            .tempdir()?;
        let port = free_port()?;
        let events_socket = dir.path().join("events.sock");
        let log = dir.path().join("observe.log");
        let log_file = fs::File::create(&log)?;
        let child = Command::new(image_binary())
            .arg("observe")
            .args([
                "--kubelet-url",
                &format!("http://127.0.0.1:{read_only_port}"),
            ])
            .args(["--kubelet-poll-interval", "1ms"])
            .args(["--listen-address", &format!("127.0.0.1:{port}")])
            .arg("--events-socket")
            .arg(&events_socket)
            .args(["--bpf-pin-path", PIN_PATH])
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .context("starting ringlet observe")?;
        Ok(Self {
            child: Some(child),
            port,
            events_socket,
            log,
            _dir: dir,
        })
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_healthy(&mut self) -> Result<()> {
        let port = self.port;
        let socket = self.events_socket.clone();
        let child = self.child.as_mut().context("observe mode is stopped")?;
        wait_for("observe mode to be healthy", Duration::from_mins(1), || {
            if matches!(child.try_wait(), Ok(Some(_))) {
                return Some(Err(()));
            }
            let healthy =
                http_get(port, "/healthz").is_ok_and(|(code, body)| code == 200 && body == "ok");
            (healthy && socket.exists()).then_some(Ok(()))
        })?
        .map_err(|()| anyhow::anyhow!("observe mode exited:\n{}", tail(&self.log(), 40)))
    }

    fn metrics(&self) -> Result<String> {
        let (code, body) = http_get(self.port, "/metrics")?;
        ensure!(code == 200, "/metrics answered {code}");
        Ok(body)
    }

    /// SIGTERM, and the exit status must be success.
    fn stop(&mut self) -> Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        ringlet_tests::daemon::signal(child.id(), libc::SIGTERM);
        let status = child.wait()?;
        ensure!(
            status.success(),
            "observe mode stopped with {status}:\n{}",
            tail(&self.log(), 40)
        );
        Ok(())
    }
}

impl Drop for Observe {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            ringlet_tests::daemon::signal(child.id(), libc::SIGTERM);
            let _ = child.wait();
        }
    }
}

/// `ringlet events --socket … -o json` on observe mode's stream, its lines kept in a file.
struct EventWatcher {
    child: Child,
    output: PathBuf,
    _dir: tempfile::TempDir,
}

impl EventWatcher {
    /// Starts `ringlet events` and returns once it says it is watching, so no later event is
    /// missed. Its stderr goes on to the test's.
    fn start(socket: &Path) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let output = dir.path().join("events.jsonl");
        let child = Command::new(ringlet_binary()?)
            .arg("events")
            .arg("--socket")
            .arg(socket)
            .args(["-o", "json"])
            .stdin(Stdio::null())
            .stdout(fs::File::create(&output)?)
            .stderr(Stdio::piped())
            .spawn()
            .context("starting ringlet events")?;
        let mut watcher = Self {
            child,
            output,
            _dir: dir,
        };
        wait_until_watching(&mut watcher.child, Duration::from_secs(30))?;
        Ok(watcher)
    }

    /// Observe mode's measurements so far: container id → lag. Each must follow a
    /// `ContainerDied` event for the same container.
    fn lags(&self) -> Result<BTreeMap<String, Duration>> {
        let mut died = Vec::new();
        let mut lags = BTreeMap::new();
        for line in BufReader::new(fs::File::open(&self.output)?).lines() {
            // The last line may be half written.
            let Ok(event) = serde_json::from_str::<Value>(&line?) else {
                continue;
            };
            let id = event["container_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            match event["kind"].as_str() {
                Some("ContainerDied") => died.push(id),
                Some("EventsLost") => bail!(
                    "ringlet events read too slowly and lost {} events",
                    event["missed"]
                ),
                Some("StatusUpdated") => {
                    ensure!(
                        died.contains(&id),
                        "a lag for {id} before its ContainerDied event"
                    );
                    let ns = event["kernel_to_event_ns"].as_u64().context("no lag")?;
                    lags.insert(id, Duration::from_nanos(ns));
                }
                _ => {}
            }
        }
        Ok(lags)
    }
}

impl Drop for EventWatcher {
    fn drop(&mut self) {
        ringlet_tests::daemon::signal(self.child.id(), libc::SIGTERM);
        let _ = self.child.wait();
    }
}
