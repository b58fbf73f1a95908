//! Pieces every `cargo xtask bench` shares: building and running the agent under test (always
//! stopped, however the run ends), nearest-rank percentiles and Prometheus histogram quantiles,
//! containerd task listings, and the commit/machine description each result file carries.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{cargo, cmd, exit_poll, http, lab};

const STOP_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_POLL: Duration = Duration::from_millis(10);
const RUNNING_POLL: Duration = Duration::from_millis(10);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
pub const CLEANUP_TIMEOUT: Duration = Duration::from_mins(3);
/// ebpf mode pins under one global bpffs directory: another agent's pins mean it is running.
pub const PIN_DIR: &str = "/sys/fs/bpf/ringlet";
const QUIET_WAIT: Duration = Duration::from_mins(15);
const QUIET_FOR: Duration = Duration::from_secs(20);

/// `binary`, or `release/ringlet` freshly built in cargo's target directory (`CARGO_TARGET_DIR`,
/// relative to the workspace, else `target`).
pub fn ringlet_binary(root: &Path, binary: Option<&Path>) -> Result<PathBuf> {
    release_binary(root, "ringlet", "ringlet", binary)
}

/// `binary`, or program `name` of `package` freshly built in release mode in cargo's target
/// directory.
pub fn release_binary(
    root: &Path,
    package: &str,
    name: &str,
    binary: Option<&Path>,
) -> Result<PathBuf> {
    if let Some(binary) = binary {
        return Ok(binary.to_path_buf());
    }
    cmd::run(
        cargo()
            .current_dir(root)
            .args(["build", "--release", "-p", package]),
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| root.join("target"), |d| root.join(d));
    Ok(target.join("release").join(name))
}

/// Set by Ctrl-C once [`stop_on_interrupt`] is installed.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Makes Ctrl-C end the run through [`Agent::exited`], which every wait of a bench calls, so the
/// bench's cleanup still runs. Only for benches that start their processes in a process group of
/// their own: the others' would get the terminal's SIGINT and nobody would stop them.
pub fn stop_on_interrupt() -> Result<()> {
    ctrlc::set_handler(|| {
        println!("interrupted: cleaning up");
        INTERRUPTED.store(true, Ordering::SeqCst);
    })
    .context("installing the Ctrl-C handler")
}

/// Fails once Ctrl-C was pressed (see [`stop_on_interrupt`]).
pub fn check_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// A running agent (ringlet, or the upstream kubelet it is compared with) that is stopped
/// (SIGTERM, then SIGKILL) however the run ends.
pub struct Agent {
    child: Child,
    /// The program's file name, for messages.
    name: String,
    pub log: PathBuf,
    stopped: bool,
    // One node agent at a time on the lab's containerd; released after the agent stopped.
    _node_lock: ringlet_tests::node_lock::NodeLock,
}

impl Agent {
    /// Starts `command` with stdout and stderr going to `log`.
    pub fn spawn(command: &mut Command, log: PathBuf) -> Result<Self> {
        let node_lock = ringlet_tests::node_lock::node_lock()?;
        let log_file =
            fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone()?)
            .stderr(log_file)
            .spawn()
            .with_context(|| format!("starting {command:?}"))?;
        let name = Path::new(command.get_program())
            .file_name()
            .map_or_else(|| "the agent".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            child,
            name,
            log,
            stopped: false,
            _node_lock: node_lock,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the agent exited, or when the run was interrupted.
    pub fn exited(&mut self) -> Result<()> {
        check_interrupted()?;
        if let Some(status) = self.child.try_wait()? {
            // Reaped: its pid may be reused, so stop() must not signal it.
            self.stopped = true;
            bail!(
                "{} exited with {status}; see {}",
                self.name,
                self.log.display()
            );
        }
        Ok(())
    }

    pub fn stop(&mut self) {
        // Once reaped, the pid may belong to another process: never signal it twice.
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        ringlet_tests::daemon::signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(STOP_POLL);
        }
        // Best effort: the run is over either way and the error has nowhere better to go.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

/// Nearest-rank percentile of sorted samples (NaN when there are none).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Buckets as (upper bound, cumulative count), ascending, `+Inf` last.
pub fn sorted_buckets(buckets: &BTreeMap<String, f64>) -> Vec<(f64, f64)> {
    let mut sorted: Vec<(f64, f64)> = buckets
        .iter()
        .filter_map(|(le, count)| {
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((bound, *count))
        })
        .collect();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    sorted
}

/// Prometheus' `histogram_quantile`: the `q` quantile by linear interpolation within the bucket it
/// falls in (the highest finite bound when it falls in `+Inf`); NaN without samples.
pub fn histogram_quantile(sorted: &[(f64, f64)], q: f64) -> f64 {
    let Some(&(_, total)) = sorted.last() else {
        return f64::NAN;
    };
    if total <= 0.0 {
        return f64::NAN;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(bound, count) in sorted {
        if count >= rank {
            if bound.is_infinite() {
                return lower.0;
            }
            if count - lower.1 <= 0.0 {
                return bound;
            }
            return lower.0 + (bound - lower.0) * (rank - lower.1) / (count - lower.1);
        }
        lower = (bound, count);
    }
    lower.0
}

pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Task id -> pid of every running task in containerd's CRI namespace.
pub fn task_pids() -> Result<HashMap<String, u32>> {
    let listing = cmd::output(lab::ctr().args(["tasks", "ls"]))?;
    Ok(listing
        .lines()
        .skip(1)
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            let pid = fields.next()?.parse().ok()?;
            (fields.next() == Some("RUNNING")).then(|| (id.to_owned(), pid))
        })
        .collect())
}

/// Containers (sandboxes included) that containerd still holds for pods of `namespace`.
pub fn runtime_containers(namespace: &str) -> Result<Vec<String>> {
    let filter = format!("labels.\"io.kubernetes.pod.namespace\"=={namespace}");
    Ok(
        cmd::output(lab::ctr().args(["containers", "ls", "-q", &filter]))?
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

pub fn now_utc() -> Result<String> {
    Ok(
        cmd::output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))?
            .trim()
            .to_owned(),
    )
}

pub fn git_commit(root: &Path) -> String {
    let head =
        cmd::output(
            Command::new("git")
                .current_dir(root)
                .args(["rev-parse", "--short", "HEAD"]),
        )
        .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned());
    let dirty = cmd::output(Command::new("git").current_dir(root).args([
        "status",
        "--porcelain",
        "--untracked-files=no",
    ]))
    .is_ok_and(|s| !s.trim().is_empty());
    if dirty { format!("{head}-dirty") } else { head }
}

#[derive(Serialize, Deserialize)]
pub struct Machine {
    pub cpu: String,
    pub cpus: usize,
    pub memory: String,
    pub kernel: String,
    pub containerd: String,
}

impl Machine {
    pub fn describe(&self) -> String {
        format!(
            "{} × {}, {} memory, Linux {}, {}",
            self.cpus, self.cpu, self.memory, self.kernel, self.containerd
        )
    }
}

fn proc_field(file: &str, key: &str) -> String {
    fs::read_to_string(file)
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// This machine, with the version of the containerd that answers on the lab's socket (which is not
/// the one on `PATH` when the lab runs trixie's).
pub fn machine() -> Result<Machine> {
    let version = format!("containerd {}", crate::lab::server_version()?);
    Ok(machine_with(&version))
}

/// This machine, with `runtime` as the container runtime the bench ran on.
pub fn machine_with(runtime: &str) -> Machine {
    Machine {
        cpu: proc_field("/proc/cpuinfo", "model name"),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        memory: proc_field("/proc/meminfo", "MemTotal"),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned()),
        containerd: runtime.trim().to_owned(),
    }
}

pub use ringlet_tests::kubelet_host::unmount_below;

/// An empty `<lab>/bench/<name>` with `manifests/` and `root/` in it (what an earlier run left is
/// unmounted and removed): returns the run, manifest and root directories.
pub fn fresh_run_dir(name: &str) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let run_dir = Path::new(crate::lab::LAB_DIR).join("bench").join(name);
    if run_dir.exists() {
        unmount_below(&run_dir)?;
        std::fs::remove_dir_all(&run_dir)
            .with_context(|| format!("removing {}", run_dir.display()))?;
    }
    let manifests = run_dir.join("manifests");
    let root_dir = run_dir.join("root");
    std::fs::create_dir_all(&manifests)?;
    std::fs::create_dir_all(&root_dir)?;
    Ok((run_dir, manifests, root_dir))
}

/// A static pod whose one container sleeps for an hour on the pod network; the benches' workload.
pub fn sleep_pod_manifest(name: &str, namespace: &str) -> String {
    sleep_pod_manifest_on(name, namespace, false)
}

/// [`sleep_pod_manifest`] on the host's network (`hostNetwork: true`, no CNI call) or the pod
/// network.
pub fn sleep_pod_manifest_on(name: &str, namespace: &str, host_network: bool) -> String {
    // sleep ignores SIGTERM as PID 1: a short grace period keeps the cleanup from waiting 30 s per pod.
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {namespace}
spec:
  hostNetwork: {host_network}
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers:
  - name: sleep
    image: docker.io/library/busybox:1.35
    imagePullPolicy: IfNotPresent
    command: [\"sleep\", \"3600\"]
"
    )
}

/// The bench pods on `/pods`, or `None` while the server is not answering yet.
pub fn bench_pods(port: u16, namespace: &str) -> Option<Vec<Value>> {
    let body = http::get(port, "/pods").ok()?;
    let list: Value = serde_json::from_slice(&body).ok()?;
    // The kubelet serves an empty pod list as `"items": null`.
    if list["kind"] == "PodList" && list["items"].is_null() {
        return Some(Vec::new());
    }
    Some(
        list["items"]
            .as_array()?
            .iter()
            .filter(|p| p["metadata"]["namespace"] == namespace)
            .cloned()
            .collect(),
    )
}

pub fn all_containers_running(pod: &Value) -> bool {
    let wanted = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    pod["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|s| s.len() == wanted && s.iter().all(|c| c["state"]["running"].is_object()))
}

/// Polls `/pods` until every bench pod runs; returns each pod's time to Running since `started`.
pub fn wait_all_running(
    agent: &mut Agent,
    port: u16,
    pods: usize,
    started: Instant,
    namespace: &str,
) -> Result<HashMap<String, f64>> {
    wait_all_running_every(agent, port, pods, started, namespace, RUNNING_POLL)
}

/// [`wait_all_running`] reading `/pods` every `poll`: on a dense node one read costs the agent
/// enough to slow what is measured.
pub fn wait_all_running_every(
    agent: &mut Agent,
    port: u16,
    pods: usize,
    started: Instant,
    namespace: &str,
    poll: Duration,
) -> Result<HashMap<String, f64>> {
    let timeout = Duration::from_mins(1) + Duration::from_secs(2) * u32::try_from(pods)?;
    let mut running = HashMap::new();
    while running.len() < pods {
        agent.exited()?;
        if started.elapsed() > timeout {
            bail!(
                "only {} of {pods} pods running after {timeout:?}; see {}",
                running.len(),
                agent.log.display()
            );
        }
        let now = ms(started.elapsed());
        for pod in bench_pods(port, namespace).unwrap_or_default() {
            // A bench pod (restartPolicy Always) only fails when the agent rejected it.
            if pod["status"]["phase"] == "Failed" {
                bail!(
                    "pod {} failed: {} {}",
                    pod["metadata"]["name"],
                    pod["status"]["reason"],
                    pod["status"]["message"]
                );
            }
            if all_containers_running(&pod)
                && let Some(name) = pod["metadata"]["name"].as_str()
            {
                running.entry(name.to_owned()).or_insert(now);
            }
        }
        std::thread::sleep(poll);
    }
    Ok(running)
}

/// The first container of a bench pod: (pod name, container id, restart count).
pub fn first_container(pod: &Value) -> Option<(String, String, u64)> {
    let status = &pod["status"]["containerStatuses"][0];
    let id = status["containerID"].as_str()?;
    let id = id.split_once("://").map_or(id, |(_, id)| id);
    Some((
        pod["metadata"]["name"].as_str()?.to_owned(),
        id.to_owned(),
        status["restartCount"].as_u64().unwrap_or(0),
    ))
}

/// SIGKILLs the main process of one container in each of `count` pods of `namespace`, one at a
/// time, and times how long `/pods` (polled every `poll`) takes to show each exit (the container
/// terminated, restarted, or replaced). Waits `pause` plus a spread part of `jitter` after each
/// sample, so the kills do not lock to the phase of a periodic relist.
pub fn time_exits(
    agent: &mut Agent,
    port: u16,
    namespace: &str,
    count: usize,
    poll: Duration,
    pause: Duration,
    jitter: Duration,
) -> Result<Vec<f64>> {
    let mut pods = bench_pods(port, namespace).context("reading /pods")?;
    pods.sort_by_key(|p| p["metadata"]["name"].as_str().map(str::to_owned));
    let task_pid = task_pids()?;
    let mut samples = Vec::new();
    for (k, (name, id, restarts)) in pods
        .iter()
        .filter_map(first_container)
        .take(count)
        .enumerate()
    {
        let Some(&pid) = task_pid.get(&id) else {
            println!("no running task for {name} ({id}); skipped");
            continue;
        };
        let killed = Instant::now();
        if !ringlet_tests::daemon::signal(pid, libc::SIGKILL) {
            bail!(
                "killing pid {pid} of {name}: {}",
                std::io::Error::last_os_error()
            );
        }
        loop {
            agent.exited()?;
            if killed.elapsed() > EXIT_TIMEOUT {
                bail!("the exit of {name} did not show on /pods within {EXIT_TIMEOUT:?}");
            }
            if exit_poll::pod_changed(port, namespace, &name, &id, restarts) {
                samples.push(ms(killed.elapsed()));
                break;
            }
            std::thread::sleep(poll);
        }
        // Steps of 0.61 of the jitter (mod 1) cover its range evenly without a random source.
        #[allow(clippy::cast_precision_loss)]
        let spread = (k * 61 % 100) as f64 / 100.0;
        std::thread::sleep(pause + jitter.mul_f64(spread));
    }
    println!("{} exits timed", samples.len());
    Ok(samples)
}

/// Removes the manifests and waits until the agent has removed every bench container from
/// containerd; returns how long that took (containerd is listed every 200 ms).
pub fn cleanup(manifests: &Path, namespace: &str) -> Result<Duration> {
    cleanup_within(manifests, namespace, CLEANUP_TIMEOUT)
}

/// [`cleanup`] waiting at most `timeout` (a thousand pods take minutes to go).
pub fn cleanup_within(manifests: &Path, namespace: &str, timeout: Duration) -> Result<Duration> {
    cleanup_observed(manifests, namespace, timeout, |_| Ok(()))
}

/// [`cleanup_within`], calling `on_poll` with the time since the manifests went before each look
/// at containerd.
pub fn cleanup_observed(
    manifests: &Path,
    namespace: &str,
    timeout: Duration,
    mut on_poll: impl FnMut(Duration) -> Result<()>,
) -> Result<Duration> {
    for entry in fs::read_dir(manifests)? {
        fs::remove_file(entry?.path())?;
    }
    let started = Instant::now();
    loop {
        on_poll(started.elapsed())?;
        let left = runtime_containers(namespace)?;
        if left.is_empty() {
            let took = started.elapsed();
            println!("pods gone after {:.1} s", took.as_secs_f64());
            return Ok(took);
        }
        if started.elapsed() > timeout {
            bail!(
                "{} bench containers still in containerd {timeout:?} after removing the manifests",
                left.len()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether another agent holds ringlet's global eBPF pins; starting an agent in ebpf mode would
/// clear them.
pub fn pins_in_use() -> Option<String> {
    fs::read_dir(PIN_DIR)
        .is_ok_and(|mut d| d.next().is_some())
        .then(|| format!("{PIN_DIR} is in use by another agent"))
}

/// Waits (bounded) until no other agent holds the global pins.
pub fn wait_for_free_pins() -> Result<()> {
    wait_until_quiet(|| Ok(pins_in_use()))
}

/// Waits (bounded) until `busy` (what is in the way, `None` when nothing is) has been quiet for a
/// while: a test suite starts agents back to back, so quiet must last, not just an instant.
pub fn wait_until_quiet(busy: impl Fn() -> Result<Option<String>>) -> Result<()> {
    let started = Instant::now();
    let mut free_since: Option<Instant> = None;
    loop {
        match busy()? {
            Some(reason) => {
                if free_since.take().is_some() || started.elapsed().as_secs().is_multiple_of(30) {
                    println!("{reason}; waiting");
                }
                if started.elapsed() > QUIET_WAIT {
                    bail!("{reason} for {QUIET_WAIT:?}");
                }
            }
            None => {
                if free_since.get_or_insert_with(Instant::now).elapsed() >= QUIET_FOR {
                    return Ok(());
                }
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A Prometheus histogram read from the text format: `le` → cumulative count.
#[derive(Debug, Default, PartialEq)]
pub struct Histogram(BTreeMap<String, f64>);

pub fn histogram(text: &str, family: &str) -> Histogram {
    let prefix = format!("{family}_bucket{{");
    let mut out = Histogram::default();
    for line in text.lines().filter(|l| l.starts_with(&prefix)) {
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Some(le) = labels
            .split("le=\"")
            .nth(1)
            .and_then(|rest| rest.split('"').next())
        else {
            continue;
        };
        *out.0.entry(le.to_owned()).or_default() += value.trim().parse::<f64>().unwrap_or(0.0);
    }
    out
}

impl Histogram {
    /// Observations in all (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        self.0.get("+Inf").map_or(0, |count| count.round() as u64)
    }

    pub fn minus(&self, earlier: &Self) -> Self {
        Self(
            self.0
                .iter()
                .map(|(le, count)| {
                    let before = earlier.0.get(le).copied().unwrap_or(0.0);
                    (le.clone(), (count - before).max(0.0))
                })
                .collect(),
        )
    }

    /// The `q` quantile as Prometheus' `histogram_quantile` computes it, by linear interpolation
    /// within the bucket it falls in; infinite when it falls above the largest finite bucket, where
    /// Prometheus would give that bucket's bound, which the report would read as a measurement.
    pub fn quantile(&self, q: f64) -> f64 {
        let sorted = sorted_buckets(&self.0);
        let below_inf = sorted
            .iter()
            .rev()
            .find(|(bound, _)| bound.is_finite())
            .map_or(0.0, |(_, count)| *count);
        #[allow(clippy::cast_precision_loss)]
        if self.count() > 0 && q * self.count() as f64 > below_inf {
            return f64::INFINITY;
        }
        histogram_quantile(&sorted, q)
    }
}

/// utime + stime of `pid`, in seconds.
pub fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("no command name in /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<f64> {
        fields
            .get(n - 3)
            .and_then(|f| f.parse::<f64>().ok())
            .with_context(|| format!("field {n} of /proc/{pid}/stat"))
    };
    Ok((field(14)? + field(15)?) / clock_ticks())
}

/// Clock ticks per second (`_SC_CLK_TCK`), the unit of `/proc`'s CPU counters.
pub fn clock_ticks() -> f64 {
    // SAFETY: sysconf takes a plain integer and touches no memory of ours.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[allow(clippy::cast_precision_loss)]
    if ticks > 0 { ticks as f64 } else { 100.0 }
}

/// `VmRSS` of `pid` in MiB.
pub fn rss_mib(pid: u32) -> Result<f64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kib / 1024.0)
}

/// One line of [`cdf_svg`]: sorted samples in milliseconds.
pub struct Series<'a> {
    pub label: String,
    pub color: &'static str,
    pub samples_ms: &'a [f64],
}

/// A hand-written SVG of the CDFs of `series` on a log-scaled time axis, legend top left.
pub fn cdf_svg(title: &str, series: &[Series]) -> String {
    const W: f64 = 720.0;
    const H: f64 = 420.0;
    const L: f64 = 70.0;
    const R: f64 = 20.0;
    const T: f64 = 40.0;
    const B: f64 = 50.0;
    let all = series.iter().flat_map(|m| m.samples_ms.iter().copied());
    let lo = all.clone().fold(f64::INFINITY, f64::min).max(0.01);
    let hi = all.fold(0.0, f64::max).max(lo * 10.0);
    let (lo, hi) = (lo.log10().floor(), hi.log10().ceil());
    let x = |v: f64| L + (v.max(1e-3).log10() - lo) / (hi - lo) * (W - L - R);
    let y = |p: f64| T + (1.0 - p) * (H - T - B);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">{title}</text>\n",
        W / 2.0
    );
    #[allow(clippy::cast_possible_truncation)]
    for decade in (lo as i32)..=(hi as i32) {
        let v = 10f64.powi(decade);
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" y1=\"{T}\" x2=\"{0:.1}\" y2=\"{1}\" stroke=\"#ddd\"/>\
             <text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{v} ms</text>",
            x(v),
            H - B,
            H - B + 18.0
        );
    }
    for p in [0.0, 0.5, 0.99, 1.0] {
        let _ = writeln!(
            out,
            "<line x1=\"{L}\" y1=\"{0:.1}\" x2=\"{1}\" y2=\"{0:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{2}\" y=\"{3:.1}\" text-anchor=\"end\">{p}</text>",
            y(p),
            W - R,
            L - 6.0,
            y(p) + 4.0
        );
    }
    for (i, m) in series.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let n = m.samples_ms.len() as f64;
        let mut path = String::new();
        #[allow(clippy::cast_precision_loss)]
        for (k, v) in m.samples_ms.iter().enumerate() {
            let cmd = if k == 0 { 'M' } else { 'L' };
            let _ = write!(
                path,
                "{cmd}{:.1},{:.1} L{:.1},{:.1} ",
                x(*v),
                y(k as f64 / n),
                x(*v),
                y((k + 1) as f64 / n)
            );
        }
        #[allow(clippy::cast_precision_loss)]
        let legend_y = T + 16.0 + 18.0 * i as f64;
        let _ = writeln!(
            out,
            "<path d=\"{path}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>\n\
             <text x=\"{}\" y=\"{legend_y}\" fill=\"{color}\">{}</text>",
            L + 10.0,
            m.label,
            color = m.color,
        );
    }
    out.push_str("</svg>\n");
    out
}

/// Writes a bench's results as `bench/results/<name>.json` (the report) and `<name>.md`, and
/// prints the markdown with where both went.
pub fn write_results(root: &Path, name: &str, report: &impl Serialize, md: &str) -> Result<()> {
    let out_dir = root.join("bench/results");
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let json_path = out_dir.join(format!("{name}.json"));
    fs::write(&json_path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md_path = out_dir.join(format!("{name}.md"));
    fs::write(&md_path, md).with_context(|| format!("writing {}", md_path.display()))?;
    println!(
        "{md}\nwrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "\
ringlet_pleg_event_latency_seconds_bucket{le=\"0.001\"} 3
ringlet_pleg_event_latency_seconds_bucket{le=\"0.005\"} 9
ringlet_pleg_event_latency_seconds_bucket{le=\"+Inf\"} 10
ringlet_pleg_event_latency_seconds_count 10
ringlet_pod_status_latency_seconds_bucket{le=\"0.001\"} 7
";

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    #[test]
    fn histogram_quantiles_interpolate_within_buckets_of_the_difference() {
        let after = histogram(METRICS, "ringlet_pleg_event_latency_seconds");
        assert_eq!(after.count(), 10);
        // Rank 5 of 10: the 2nd of the 6 in (1 ms, 5 ms].
        assert!(close(after.quantile(0.5), 0.001 + 0.004 * 2.0 / 6.0));
        // Rank 3: the last of the 3 in [0, 1 ms].
        assert!(close(after.quantile(0.3), 0.001));
        assert!(
            after.quantile(0.99).is_infinite(),
            "above the largest finite bucket"
        );
        // Cumulative before: 2, 3, 3; the difference: 1 below 1 ms, 5 more below 5 ms, 1 above.
        let before = histogram(
            &METRICS
                .replace("} 3", "} 2")
                .replace("} 9", "} 3")
                .replace("} 10", "} 3"),
            "ringlet_pleg_event_latency_seconds",
        );
        let delta = after.minus(&before);
        assert_eq!(delta.count(), 7);
        // Rank 0.7: 70 % of the one below 1 ms.
        assert!(close(delta.quantile(0.1), 0.000_7));
        // Rank 3.5: 2.5 of the 5 in (1 ms, 5 ms].
        assert!(close(delta.quantile(0.5), 0.003));
        assert!(delta.quantile(0.99).is_infinite());
        assert!(
            Histogram::default().quantile(0.5).is_nan(),
            "no samples, no quantile"
        );
    }

    #[test]
    fn cpu_seconds_skip_a_command_name_with_spaces() {
        let pid = std::process::id();
        assert!(process_cpu_seconds(pid).unwrap() >= 0.0);
        assert!(process_cpu_seconds(u32::MAX).is_err());
    }

    #[test]
    fn percentile_uses_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((percentile(&samples, 50.0) - 50.0).abs() < f64::EPSILON);
        assert!((percentile(&samples, 99.0) - 99.0).abs() < f64::EPSILON);
        assert!((percentile(&[7.0], 99.0) - 7.0).abs() < f64::EPSILON);
        assert!(percentile(&[], 50.0).is_nan());
    }

    #[test]
    fn histogram_quantiles_interpolate_as_prometheus_does() {
        let buckets: BTreeMap<String, f64> = [("0.005", 80.0), ("0.01", 100.0), ("+Inf", 100.0)]
            .into_iter()
            .map(|(le, count)| (le.to_owned(), count))
            .collect();
        let sorted = sorted_buckets(&buckets);
        assert_eq!(sorted.last(), Some(&(f64::INFINITY, 100.0)));
        // 50 of the 80 in [0, 5 ms].
        assert!((histogram_quantile(&sorted, 0.5) - 0.003_125).abs() < 1e-12);
        // 99 of 100: 19 of the 20 in (5 ms, 10 ms].
        assert!((histogram_quantile(&sorted, 0.99) - 0.009_75).abs() < 1e-12);
        assert!(histogram_quantile(&[], 0.5).is_nan());
        let overflow = [(0.005, 0.0), (f64::INFINITY, 10.0)];
        assert!((histogram_quantile(&overflow, 0.5) - 0.005).abs() < 1e-12);
    }

    #[test]
    fn running_needs_every_container_running() {
        let pod = serde_json::json!({
            "spec": { "containers": [{ "name": "a" }, { "name": "b" }] },
            "status": { "containerStatuses": [
                { "name": "a", "state": { "running": { "startedAt": "x" } } },
                { "name": "b", "state": { "waiting": { "reason": "ContainerCreating" } } }
            ] }
        });
        assert!(!all_containers_running(&pod));
        let mut both = pod.clone();
        both["status"]["containerStatuses"][1]["state"] = serde_json::json!({ "running": {} });
        assert!(all_containers_running(&both));
    }

    #[test]
    fn first_container_strips_the_runtime_prefix() {
        let pod = serde_json::json!({
            "metadata": { "name": "bench-0" },
            "status": { "containerStatuses": [
                { "containerID": "containerd://abc", "restartCount": 2 }
            ] }
        });
        assert_eq!(
            first_container(&pod),
            Some(("bench-0".to_owned(), "abc".to_owned(), 2))
        );
    }
}
