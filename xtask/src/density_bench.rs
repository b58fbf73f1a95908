//! `cargo xtask bench density`: ringlet with hundreds to a thousand real pods (host network,
//! busybox `sleep`) on the lab's containerd, both PLEG modes in one run. For each mode and pod
//! count, starting from no pods: writing the manifests → every pod Running; the agent's idle CPU
//! and RSS; the containerd CPU the agent causes (containerd's CPU while the agent runs minus while
//! it is stopped with SIGSTOP); container exit → status, seen on `/pods` and in the agent's own
//! histograms; the full relist's mean duration; one `/pods` read; teardown. A watcher reads
//! `/healthz/pleg` every second of the run and keeps every failure. The agent and containerd get
//! the file limit a node gives them (ringlet's systemd unit: `LimitNOFILE=1048576`) where the
//! machine allows it.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::benchkit::{
    self, Agent, Histogram, cleanup_within, free_port, fresh_run_dir, git_commit, histogram, ms,
    now_utc, percentile, process_cpu_seconds, rss_mib, runtime_containers, sleep_pod_manifest_on,
    time_exits, wait_all_running_every, wait_for_free_pins,
};
use ringlet_tests::metric_value;

use crate::health_watch::{HEALTH_POLL, HealthFailure, HealthLog, HealthWatcher};
use crate::{cmd, http, lab, workspace_root};

const NAMESPACE: &str = "ringlet-bench-density";
/// Distinct from the tests' and the other benches' nodes: agents only clean up their own pods.
const NODE: &str = "bench-density";
/// The PLEG modes; relist first: it needs no pins, so it runs while another agent may still hold
/// them.
const MODES: [&str; 2] = ["relist", "ebpf"];
/// A node's file limit for the agent and containerd (`deploy/systemd/ringlet.service`).
const OPEN_FILES: u64 = 1_048_576;
/// The `kernel.pid_max` systemd sets at boot on 64-bit machines: the kernel's default of 32768 is
/// used up by the shims' threads of about a thousand pods.
const PID_MAX: u64 = 4_194_304;
const PID_MAX_SYSCTL: &str = "/proc/sys/kernel/pid_max";
/// `/pods` of a thousand pods is megabytes: reading it often would slow the starts it times.
const RUNNING_POLL: Duration = Duration::from_millis(250);
const HEALTHZ_START: Duration = Duration::from_secs(30);
const POD_READS: usize = 5;
/// `--max-pods` is the largest pod count, at least the kubelet's default.
const MIN_MAX_PODS: usize = 110;
const EVENT_HISTOGRAM: &str = "ringlet_pleg_event_latency_seconds";
const STATUS_HISTOGRAM: &str = "ringlet_pod_status_latency_seconds";
const RELIST_DURATION: &str = "kubelet_pleg_relist_duration_seconds";
/// The targets at the largest pod count in ebpf mode.
const TARGET_IDLE_CPU_PERCENT: f64 = 1.0;
const TARGET_RSS_MIB: f64 = 60.0;
const TARGET_EXIT_GROWTH: f64 = 2.0;

#[derive(clap::Args)]
pub struct DensityArgs {
    /// Pod counts, ascending, comma separated; each starts from no pods.
    #[arg(long, value_delimiter = ',', default_value = "100,500,1000")]
    pods: Vec<usize>,
    /// The PLEG modes to run, comma separated (both by default).
    #[arg(long, value_delimiter = ',', default_value = "relist,ebpf")]
    modes: Vec<String>,
    /// Container exits timed per mode and pod count (one per pod).
    #[arg(long, default_value_t = 40)]
    exits: usize,
    /// Milliseconds between two `/pods` reads while an exit is awaited.
    #[arg(long, default_value_t = 10)]
    exit_poll_ms: u64,
    /// Seconds to let the agent settle after all pods run, before the CPU windows.
    #[arg(long, default_value_t = 20)]
    settle: u64,
    /// Length of each CPU window (agent running, agent stopped) in seconds.
    #[arg(long, default_value_t = 30)]
    window: u64,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Measure nothing: write density.md and density.svg again from this density.json.
    #[arg(long)]
    render: Option<PathBuf>,
}

/// Median, p99 and count of a latency in milliseconds.
#[derive(Serialize, Deserialize, Clone, Copy)]
pub(crate) struct Quantiles {
    pub(crate) median_ms: Option<f64>,
    pub(crate) p99_ms: Option<f64>,
    pub(crate) samples: usize,
}

impl Quantiles {
    pub(crate) fn of_samples(mut samples_ms: Vec<f64>) -> Self {
        samples_ms.sort_by(f64::total_cmp);
        Self {
            median_ms: finite(percentile(&samples_ms, 50.0)),
            p99_ms: finite(percentile(&samples_ms, 99.0)),
            samples: samples_ms.len(),
        }
    }

    pub(crate) fn of_histogram(delta: &Histogram) -> Self {
        Self {
            median_ms: finite(delta.quantile(0.5) * 1000.0),
            p99_ms: finite(delta.quantile(0.99) * 1000.0),
            samples: usize::try_from(delta.count()).unwrap_or(usize::MAX),
        }
    }

    pub(crate) fn show(&self) -> String {
        let one = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{v:.1}"));
        format!("{} / {}", one(self.median_ms), one(self.p99_ms))
    }
}

/// `None` for NaN (no samples) and infinity (above the largest bucket), which JSON cannot hold.
fn finite(v: f64) -> Option<f64> {
    v.is_finite().then_some(v)
}

/// Everything measured for one mode at one pod count.
#[derive(Serialize, Deserialize)]
struct Point {
    mode: String,
    pods: usize,
    all_running_s: f64,
    idle_cpu_percent: f64,
    rss_mib: f64,
    containerd_cpu_percent_with_agent: f64,
    containerd_cpu_percent_agent_stopped: f64,
    exit_status_on_pods: Quantiles,
    exit_status_agent: Quantiles,
    exit_event_agent: Quantiles,
    full_relists: u64,
    full_relist_mean_ms: Option<f64>,
    pods_read_ms: f64,
    teardown_s: f64,
}

impl Point {
    fn containerd_cpu_caused_percent(&self) -> f64 {
        self.containerd_cpu_percent_with_agent - self.containerd_cpu_percent_agent_stopped
    }
}

#[derive(Serialize, Deserialize)]
struct Report {
    benchmark: String,
    date: String,
    commit: String,
    machine: benchkit::Machine,
    exit_poll_ms: u64,
    settle_s: u64,
    window_s: u64,
    /// The file limits the agent and containerd ran with.
    agent_open_files: u64,
    containerd_open_files: u64,
    /// `kernel.pid_max` during the run.
    pid_max: u64,
    points: Vec<Point>,
    health_checks: u64,
    health_unanswered: u64,
    health_failures: Vec<HealthFailure>,
    /// Why a mode's run stopped early; its counts measured before stay in the report.
    #[serde(default)]
    failures: Vec<String>,
}

pub fn density(args: &DensityArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) || !args.pods.is_sorted() {
        bail!("--pods needs ascending pod counts, each above 0");
    }
    if args.modes.is_empty() || args.modes.iter().any(|m| !MODES.contains(&m.as_str())) {
        bail!("--modes takes {}", MODES.join(", "));
    }
    if args.exits == 0 || args.window == 0 {
        bail!("--exits and --window must be above 0");
    }
    let root = workspace_root();
    if let Some(json) = &args.render {
        let text = fs::read(json).with_context(|| format!("reading {}", json.display()))?;
        let report: Report =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", json.display()))?;
        return write_views(&root, &report);
    }
    lab::up()?;
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    let containerd = ringlet_tests::lab_containerd()
        .running_pid()?
        .context("the lab's containerd is not running")?;
    let containerd_open_files = raise_open_files(containerd)?;
    let pid_max = raise_pid_max()?;

    let mut points = Vec::new();
    let mut health = HealthLog::default();
    let mut agent_open_files = OPEN_FILES;
    let mut failures = Vec::new();
    for mode in MODES
        .into_iter()
        .filter(|m| args.modes.iter().any(|a| a == m))
    {
        println!("== --pleg-mode={mode}");
        let run = run_mode(&binary, mode, args, containerd)?;
        points.extend(run.points);
        health.add(run.health);
        agent_open_files = agent_open_files.min(run.open_files);
        failures.extend(run.failure);
    }
    let report = Report {
        benchmark: "density".into(),
        date: now_utc()?,
        commit: git_commit(&root),
        machine: benchkit::machine()?,
        exit_poll_ms: args.exit_poll_ms,
        settle_s: args.settle,
        window_s: args.window,
        agent_open_files,
        containerd_open_files,
        pid_max,
        points,
        health_checks: health.checks,
        health_unanswered: health.unanswered,
        health_failures: health.failures,
        failures,
    };
    benchkit::write_results(&root, "density", &report, &markdown(&report))?;
    write_svg(&root, &report)?;
    if !report.failures.is_empty() {
        bail!("the results are partial: {}", report.failures.join("; "));
    }
    Ok(())
}

fn write_views(root: &Path, report: &Report) -> Result<()> {
    let md_path = root.join("bench/results/density.md");
    fs::write(&md_path, markdown(report))
        .with_context(|| format!("writing {}", md_path.display()))?;
    write_svg(root, report)
}

fn write_svg(root: &Path, report: &Report) -> Result<()> {
    let svg_path = root.join("bench/results/density.svg");
    fs::write(&svg_path, svg(report)).with_context(|| format!("writing {}", svg_path.display()))?;
    println!("wrote {}", svg_path.display());
    Ok(())
}

/// Gives `pid` the node's file limit (soft and hard), as `LimitNOFILE` would. Without
/// `CAP_SYS_RESOURCE` (some VMs withhold it even from root) the hard limit cannot grow: the soft one
/// is raised to it. Returns the limit `pid` now has.
pub(crate) fn raise_open_files(pid: u32) -> Result<u64> {
    let raised = Command::new("prlimit")
        .args(["--pid", &pid.to_string()])
        .arg(format!("--nofile={OPEN_FILES}:{OPEN_FILES}"))
        .output()
        .context("running prlimit")?;
    if raised.status.success() {
        return Ok(OPEN_FILES);
    }
    let hard = hard_open_files(pid)?;
    println!(
        "cannot raise pid {pid}'s hard file limit to {OPEN_FILES} ({}): using its hard limit {hard}",
        String::from_utf8_lossy(&raised.stderr).trim()
    );
    cmd::run(
        Command::new("prlimit")
            .args(["--pid", &pid.to_string()])
            .arg(format!("--nofile={hard}:{hard}")),
    )?;
    Ok(hard)
}

/// Raises `kernel.pid_max` to [`PID_MAX`] when it is lower, as systemd does at boot (PID 1 here is
/// not systemd); returns the value in force.
pub(crate) fn raise_pid_max() -> Result<u64> {
    let current: u64 = fs::read_to_string(PID_MAX_SYSCTL)
        .with_context(|| format!("reading {PID_MAX_SYSCTL}"))?
        .trim()
        .parse()
        .with_context(|| format!("parsing {PID_MAX_SYSCTL}"))?;
    if current >= PID_MAX {
        return Ok(current);
    }
    fs::write(PID_MAX_SYSCTL, PID_MAX.to_string())
        .with_context(|| format!("raising {PID_MAX_SYSCTL} from {current} to {PID_MAX}"))?;
    println!("kernel.pid_max raised from {current} to {PID_MAX}, as systemd sets it at boot");
    Ok(PID_MAX)
}

/// The hard `Max open files` of `pid`.
fn hard_open_files(pid: u32) -> Result<u64> {
    let limits = fs::read_to_string(format!("/proc/{pid}/limits"))
        .with_context(|| format!("reading /proc/{pid}/limits"))?;
    limits
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|rest| rest.split_whitespace().nth(1))
        .and_then(|hard| hard.parse().ok())
        .with_context(|| format!("no hard open-files limit in /proc/{pid}/limits"))
}

/// What one mode's run measured, up to where it failed.
struct ModeRun {
    points: Vec<Point>,
    health: HealthLog,
    /// The file limit the agent ran with.
    open_files: u64,
    /// Why the run stopped early, if it did.
    failure: Option<String>,
}

/// The ports one agent serves.
struct Ports {
    read_only: u16,
    healthz: u16,
}

fn run_mode(
    binary: &Path,
    mode: &'static str,
    args: &DensityArgs,
    containerd: u32,
) -> Result<ModeRun> {
    let (run_dir, manifests, root_dir) = fresh_run_dir(&format!("density-{mode}"))?;
    if !runtime_containers(NAMESPACE)?.is_empty() {
        bail!("containers of namespace {NAMESPACE} are still in containerd from an earlier run");
    }
    if mode == "ebpf" {
        wait_for_free_pins()?;
    }
    let max_pods = args
        .pods
        .iter()
        .max()
        .copied()
        .unwrap_or_default()
        .max(MIN_MAX_PODS);
    let ports = Ports {
        read_only: free_port()?,
        healthz: free_port()?,
    };
    let mut agent = Agent::spawn(
        Command::new(binary)
            .args(ringlet_tests::LAB_AGENT_FLAGS)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .arg("--root-dir")
            .arg(&root_dir)
            .args(["--read-only-port", &ports.read_only.to_string()])
            .args(["--healthz-port", &ports.healthz.to_string()])
            .args(["--port", &free_port()?.to_string()])
            .args(["--hostname-override", NODE])
            .args(["--pleg-mode", mode])
            // The kubelet's default of 110 would reject the rest, as it should.
            .args(["--max-pods", &max_pods.to_string()])
            .arg("--events-socket")
            .arg(run_dir.join("events.sock")),
        run_dir.join("ringlet.log"),
    )?;
    let open_files = raise_open_files(agent.pid())?;
    let started = Instant::now();
    while http::status(ports.healthz, "/healthz").is_err() {
        agent.exited()?;
        if started.elapsed() > HEALTHZ_START {
            bail!("the agent's healthz port did not answer within {HEALTHZ_START:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let watcher = HealthWatcher::start(ports.healthz, "/healthz/pleg", mode.to_owned());
    let mut points = Vec::new();
    let mut result = Ok(());
    for &pods in &args.pods {
        match measure_count(
            &mut agent, &ports, mode, pods, &manifests, args, containerd, &watcher,
        ) {
            Ok(point) => points.push(point),
            Err(err) => {
                result = Err(err);
                break;
            }
        }
    }
    // Whatever failed above, the pods go: removing the manifests makes the agent delete them.
    let cleaned = cleanup_within(&manifests, NAMESPACE, teardown_timeout(max_pods));
    let health = watcher.stop();
    agent.stop();
    let failure = result
        .and(cleaned.map(|_| ()))
        .err()
        .map(|err| format!("--pleg-mode={mode}: {err:#}"));
    Ok(ModeRun {
        points,
        health,
        open_files,
        failure,
    })
}

#[allow(clippy::too_many_arguments)]
fn measure_count(
    agent: &mut Agent,
    ports: &Ports,
    mode: &'static str,
    pods: usize,
    manifests: &Path,
    args: &DensityArgs,
    containerd: u32,
    watcher: &HealthWatcher,
) -> Result<Point> {
    watcher.set_phase(format!("starting {pods} pods"));
    let started = Instant::now();
    for i in 0..pods {
        fs::write(
            manifests.join(format!("density-{i}.yaml")),
            sleep_pod_manifest_on(&format!("density-{i}"), NAMESPACE, true),
        )?;
    }
    wait_all_running_every(
        agent,
        ports.read_only,
        pods,
        started,
        NAMESPACE,
        RUNNING_POLL,
    )?;
    let all_running = started.elapsed();
    println!(
        "{pods} pods running after {:.1} s",
        all_running.as_secs_f64()
    );

    watcher.set_phase(format!("idle with {pods} pods"));
    std::thread::sleep(Duration::from_secs(args.settle));
    let metrics_before = read_metrics(ports.read_only)?;
    let window = Duration::from_secs(args.window);
    let [agent_cpu, containerd_with_agent] = cpu_percent([agent.pid(), containerd], window)?;
    agent.exited()?;
    let rss = rss_mib(agent.pid())?;
    let metrics_after = read_metrics(ports.read_only)?;
    let relists = metric_value::<f64>(&metrics_after, &format!("{RELIST_DURATION}_count"))
        .unwrap_or(0.0)
        - metric_value::<f64>(&metrics_before, &format!("{RELIST_DURATION}_count")).unwrap_or(0.0);
    let relist_seconds = metric_value::<f64>(&metrics_after, &format!("{RELIST_DURATION}_sum"))
        .unwrap_or(0.0)
        - metric_value::<f64>(&metrics_before, &format!("{RELIST_DURATION}_sum")).unwrap_or(0.0);
    println!(
        "idle: agent {agent_cpu:.2} % of a core, {rss:.1} MiB; containerd {containerd_with_agent:.2} %"
    );

    let containerd_alone = {
        let _paused = watcher.pause();
        let _stopped = Stopped::new(agent.pid());
        cpu_percent([containerd], window)?[0]
    };
    agent.exited()?;
    println!("containerd with the agent stopped: {containerd_alone:.2} % of a core");

    let mut reads = Vec::with_capacity(POD_READS);
    for _ in 0..POD_READS {
        let read = Instant::now();
        http::get(ports.read_only, "/pods").context("reading /pods")?;
        reads.push(ms(read.elapsed()));
    }
    reads.sort_by(f64::total_cmp);

    watcher.set_phase(format!("container exits with {pods} pods"));
    let before = read_metrics(ports.read_only)?;
    let exits = time_exits(
        agent,
        ports.read_only,
        NAMESPACE,
        args.exits.min(pods),
        Duration::from_millis(args.exit_poll_ms),
        Duration::from_millis(200),
        Duration::from_secs(1),
    )?;
    // The status histogram is observed when the status manager writes: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let after = read_metrics(ports.read_only)?;
    let delta = |family| histogram(&after, family).minus(&histogram(&before, family));

    watcher.set_phase(format!("removing {pods} pods"));
    let teardown = cleanup_within(manifests, NAMESPACE, teardown_timeout(pods))?;
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(Point {
        mode: mode.into(),
        pods,
        all_running_s: all_running.as_secs_f64(),
        idle_cpu_percent: agent_cpu,
        rss_mib: rss,
        containerd_cpu_percent_with_agent: containerd_with_agent,
        containerd_cpu_percent_agent_stopped: containerd_alone,
        exit_status_on_pods: Quantiles::of_samples(exits),
        exit_status_agent: Quantiles::of_histogram(&delta(STATUS_HISTOGRAM)),
        exit_event_agent: Quantiles::of_histogram(&delta(EVENT_HISTOGRAM)),
        full_relists: relists.max(0.0).round() as u64,
        full_relist_mean_ms: (relists > 0.0).then(|| relist_seconds / relists * 1000.0),
        pods_read_ms: percentile(&reads, 50.0),
        teardown_s: teardown.as_secs_f64(),
    })
}

/// How long removing `pods` pods may take: a thousand take minutes on this machine.
fn teardown_timeout(pods: usize) -> Duration {
    Duration::from_mins(2) + Duration::from_millis(500) * u32::try_from(pods).unwrap_or(u32::MAX)
}

pub(crate) fn read_metrics(port: u16) -> Result<String> {
    let body = http::get(port, "/metrics").context("reading /metrics")?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The CPU (utime + stime) each of `pids` uses over `window`, in % of one core.
fn cpu_percent<const N: usize>(pids: [u32; N], window: Duration) -> Result<[f64; N]> {
    let mut before = [0.0; N];
    for (seconds, pid) in before.iter_mut().zip(pids) {
        *seconds = process_cpu_seconds(pid)?;
    }
    std::thread::sleep(window);
    let mut used = [0.0; N];
    for ((percent, pid), before) in used.iter_mut().zip(pids).zip(before) {
        *percent = (process_cpu_seconds(pid)? - before) * 100.0 / window.as_secs_f64();
    }
    Ok(used)
}

/// The agent stopped with SIGSTOP until this is dropped (SIGCONT), however the window ends.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Self {
        ringlet_tests::daemon::signal(pid, libc::SIGSTOP);
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        ringlet_tests::daemon::signal(self.0, libc::SIGCONT);
    }
}

fn find<'a>(report: &'a Report, mode: &str, pods: usize) -> Option<&'a Point> {
    report
        .points
        .iter()
        .find(|p| p.mode == mode && p.pods == pods)
}

fn markdown(report: &Report) -> String {
    let mut out = format!(
        "# Density: ringlet with up to {} pods on one node\n\n\
         ringlet commit `{}`, {}; `cargo xtask bench density` (both PLEG modes in one run, the \
         lab's containerd, static pods: busybox `sleep`, host network, restartPolicy Always, node \
         `{NODE}`; `--max-pods` the largest count; file limits: agent {}, containerd {}; \
         `kernel.pid_max` {})\n\n\
         machine: {}\n\n\
         Each pod count starts from no pods. **all Running**: writing the manifests → every pod \
         Running on `/pods` (read every {} ms). **idle**: after {} s of settling, utime + stime \
         over {} s, % of one core; RSS at the window's end. **containerd caused**: containerd's \
         CPU over that window minus over a window as long with the agent stopped (SIGSTOP); shims \
         excluded. **full relist**: `kubelet_pleg_relist_duration_seconds` over the idle window \
         (ebpf mode relists in full only as a safety net). **GET /pods**: one read of `/pods`, \
         median of {POD_READS}.\n\n\
         | mode | pods | all Running s | idle CPU % | RSS MiB | containerd % (with agent / stopped / caused) | full relists | full relist mean ms | GET /pods ms | teardown s |\n\
         |---|---:|---:|---:|---:|---|---:|---:|---:|---:|\n",
        report
            .points
            .iter()
            .map(|p| p.pods)
            .max()
            .unwrap_or_default(),
        report.commit,
        report.date,
        report.agent_open_files,
        report.containerd_open_files,
        report.pid_max,
        report.machine.describe(),
        RUNNING_POLL.as_millis(),
        report.settle_s,
        report.window_s,
    );
    for p in &report.points {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.2} | {:.1} | {:.2} / {:.2} / {:.2} | {} | {} | {:.1} | {:.1} |",
            p.mode,
            p.pods,
            p.all_running_s,
            p.idle_cpu_percent,
            p.rss_mib,
            p.containerd_cpu_percent_with_agent,
            p.containerd_cpu_percent_agent_stopped,
            p.containerd_cpu_caused_percent(),
            p.full_relists,
            p.full_relist_mean_ms
                .map_or_else(|| "–".to_owned(), |v| format!("{v:.1}")),
            p.pods_read_ms,
            p.teardown_s,
        );
    }
    let _ = write!(
        out,
        "\n## Container exit → status\n\n\
         One SIGKILL of a container's main process per pod (up to 40 pods per count, the next \
         kill 0.2–1.2 s after an exit shows). **on /pods**: the kill → `/pods` shows the container \
         terminated or restarted, reading `/pods` every {} ms (each read costs the agent the GET \
         /pods time above, which grows with the pods). **agent**: the agent's histograms over the \
         exits' window, so every container change the kernel timed in it, the exits and the \
         restarts that follow them (kernel timestamp → status written, → PLEG event), quantiles \
         interpolated within buckets four per decade; relist mode has no kernel timestamp. \
         median / p99 ms.\n\n\
         | mode | pods | on /pods | agent: → status | agent: → PLEG event | exits |\n\
         |---|---:|---:|---:|---:|---:|\n",
        report.exit_poll_ms
    );
    for p in &report.points {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            p.mode,
            p.pods,
            p.exit_status_on_pods.show(),
            p.exit_status_agent.show(),
            p.exit_event_agent.show(),
            p.exit_status_on_pods.samples,
        );
    }
    let _ = write!(
        out,
        "\n## PLEG health\n\n`/healthz/pleg` read every {} s through the whole run (paused while \
         the agent was stopped on purpose): {} reads, {} unanswered (the agent busy past the \
         read's 5 s timeout), {} failed.\n",
        HEALTH_POLL.as_secs(),
        report.health_checks,
        report.health_unanswered,
        report.health_failures.len()
    );
    for f in &report.health_failures {
        let _ = writeln!(out, "- {}: {} while {}", f.mode, f.status, f.phase);
    }
    if !report.failures.is_empty() {
        out.push_str("\n## Runs that stopped early\n\n");
        for failure in &report.failures {
            let _ = writeln!(out, "- {failure}");
        }
    }
    out.push_str(&targets(report));
    out.push_str("\n![cost per pod](density.svg)\n");
    out
}

fn targets(report: &Report) -> String {
    let most = report
        .points
        .iter()
        .map(|p| p.pods)
        .max()
        .unwrap_or_default();
    let least = report
        .points
        .iter()
        .map(|p| p.pods)
        .min()
        .unwrap_or_default();
    let mut out = format!(
        "\n## Targets (issue 14 §4, ebpf mode at {most} pods)\n\n| target | measured | verdict |\n|---|---|---|\n"
    );
    let verdict = |ok: bool| if ok { "met" } else { "**not met**" };
    let Some(top) = find(report, "ebpf", most) else {
        out.push_str("| (no ebpf run) | – | – |\n");
        return out;
    };
    let _ = writeln!(
        out,
        "| idle agent CPU ≤ {TARGET_IDLE_CPU_PERCENT} % of a core | {:.2} % | {} |",
        top.idle_cpu_percent,
        verdict(top.idle_cpu_percent <= TARGET_IDLE_CPU_PERCENT)
    );
    let _ = writeln!(
        out,
        "| RSS ≤ {TARGET_RSS_MIB} MiB | {:.1} MiB | {} |",
        top.rss_mib,
        verdict(top.rss_mib <= TARGET_RSS_MIB)
    );
    if let Some(base) = find(report, "ebpf", least).filter(|_| least < most) {
        for (what, at_most, at_least) in [
            (
                "exit → status p99 (agent)",
                top.exit_status_agent.p99_ms,
                base.exit_status_agent.p99_ms,
            ),
            (
                "exit → status p99 (on /pods)",
                top.exit_status_on_pods.p99_ms,
                base.exit_status_on_pods.p99_ms,
            ),
        ] {
            let (measured, ok) = match (at_most, at_least) {
                (Some(a), Some(b)) => (
                    format!("{a:.1} ms vs {b:.1} ms at {least} pods: {:.2}×", a / b),
                    a <= TARGET_EXIT_GROWTH * b,
                ),
                _ => ("no samples".to_owned(), false),
            };
            let _ = writeln!(
                out,
                "| {what} ≤ {TARGET_EXIT_GROWTH}× its {least}-pod value | {measured} | {} |",
                verdict(ok)
            );
        }
    }
    let flaps = report
        .health_failures
        .iter()
        .filter(|f| f.mode == "ebpf")
        .count();
    let _ = writeln!(
        out,
        "| no PLEG health flap | {flaps} failed `/healthz/pleg` reads | {} |",
        verdict(flaps == 0)
    );
    out
}

/// One panel's line: a mode's cost per pod at each pod count.
pub(crate) struct Line {
    pub(crate) mode: String,
    pub(crate) color: &'static str,
    pub(crate) points: Vec<(f64, f64)>,
}

/// One panel's value of a point: a cost divided by the pods.
type PerPod = fn(&Point) -> f64;

/// Four panels of cost per pod against the pod count, one line per mode.
fn svg(report: &Report) -> String {
    const W: f64 = 960.0;
    const H: f64 = 640.0;
    #[allow(clippy::cast_precision_loss)]
    let panels: [(&str, PerPod); 4] = [
        ("idle agent CPU per pod (µs of CPU per s)", |p: &Point| {
            p.idle_cpu_percent / 100.0 * 1e6 / p.pods as f64
        }),
        ("agent RSS per pod (KiB)", |p: &Point| {
            p.rss_mib * 1024.0 / p.pods as f64
        }),
        (
            "containerd CPU the agent causes, per pod (µs per s)",
            |p: &Point| p.containerd_cpu_caused_percent() / 100.0 * 1e6 / p.pods as f64,
        ),
        (
            "writing manifests → all Running, per pod (ms)",
            |p: &Point| p.all_running_s * 1000.0 / p.pods as f64,
        ),
    ];
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
         font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>\n\
         <text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"14\">ringlet cost per pod \
         against pods on the node (commit {})</text>\n",
        W / 2.0,
        report.commit
    );
    #[allow(clippy::cast_precision_loss)]
    for (i, (title, value)) in panels.iter().enumerate() {
        let lines: Vec<Line> = MODES
            .iter()
            .map(|mode| Line {
                mode: (*mode).to_owned(),
                color: if *mode == "ebpf" {
                    "#d62728"
                } else {
                    "#1f77b4"
                },
                points: report
                    .points
                    .iter()
                    .filter(|p| p.mode == *mode)
                    .map(|p| (p.pods as f64, value(p)))
                    .collect(),
            })
            .collect();
        let (x0, y0) = (
            (i % 2) as f64 * W / 2.0,
            30.0 + (i / 2) as f64 * (H - 30.0) / 2.0,
        );
        panel(&mut out, (x0, y0, W / 2.0, (H - 30.0) / 2.0), title, &lines);
    }
    out.push_str("</svg>\n");
    out
}

/// Draws one panel with linear axes from zero into `out`; `frame` is (x, y, width, height).
pub(crate) fn panel(out: &mut String, frame: (f64, f64, f64, f64), title: &str, lines: &[Line]) {
    const L: f64 = 70.0;
    const R: f64 = 20.0;
    const T: f64 = 30.0;
    const B: f64 = 40.0;
    let (fx, fy, fw, fh) = frame;
    let all = lines.iter().flat_map(|l| l.points.iter());
    let x_max = all.clone().map(|p| p.0).fold(1.0, f64::max);
    let y_max = all
        .map(|p| p.1)
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let y_max = if y_max > 0.0 { y_max * 1.1 } else { 1.0 };
    let x = |v: f64| fx + L + v / x_max * (fw - L - R);
    let y = |v: f64| fy + T + (1.0 - v.max(0.0) / y_max) * (fh - T - B);
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{title}</text>\n\
         <line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>\n\
         <line x1=\"{:.1}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
        fx + fw / 2.0,
        fy + T - 10.0,
        x(0.0),
        y(0.0),
        x(x_max),
        y(0.0),
        x(0.0),
        y(0.0),
        x(0.0),
        y(y_max),
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" y1=\"{1:.1}\" x2=\"{2:.1}\" y2=\"{1:.1}\" stroke=\"#eee\"/>\
             <text x=\"{3:.1}\" y=\"{4:.1}\" text-anchor=\"end\">{v:.3}</text>",
            x(0.0),
            y(v),
            x(x_max),
            x(0.0) - 6.0,
            y(v) + 4.0
        );
    }
    let mut ticks: Vec<f64> = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.0))
        .collect();
    ticks.sort_by(f64::total_cmp);
    ticks.dedup();
    for t in ticks {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t} pods</text>",
            x(t),
            y(0.0) + 16.0
        );
    }
    for (i, line) in lines.iter().enumerate() {
        let path: Vec<String> = line
            .points
            .iter()
            .enumerate()
            .map(|(k, &(px, py))| {
                format!(
                    "{}{:.1},{:.1}",
                    if k == 0 { 'M' } else { 'L' },
                    x(px),
                    y(py)
                )
            })
            .collect();
        #[allow(clippy::cast_precision_loss)]
        let legend_y = fy + T + 14.0 + 16.0 * i as f64;
        let _ = writeln!(
            out,
            "<path d=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"/>\n\
             <text x=\"{:.1}\" y=\"{legend_y:.1}\" fill=\"{color}\">{}</text>",
            path.join(" "),
            x(0.0) + 10.0,
            line.mode,
            color = line.color,
        );
        for &(px, py) in &line.points {
            let _ = writeln!(
                out,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{}\"/>",
                x(px),
                y(py),
                line.color
            );
        }
    }
}
