//! `cargo xtask bench scale`: ringlet and the upstream kubelet with thousands of pods on
//! `ringlet-hollow`, a scale harness, not a container runtime (its containers are tiny real
//! processes in real cgroups, so the kernel's cgroup and exit events are real and the runtime
//! costs next to nothing). For each mode (standalone: static pods; cluster: a node of the loopback
//! control plane, pods bound to it by the bench), pod count and agent, one after the other: a
//! fresh `ringlet-hollow` on a socket of its own, the agent on it, the pods created, all Running,
//! then the agent's idle CPU and RSS, its full relists, `/pods` and `/stats/summary` latency,
//! container exit → status for randomly chosen containers killed with SIGKILL, and in cluster mode
//! the API server's requests; `/healthz` is read every second of the run. Then the agent and the
//! runtime stop and everything they left (pods, cgroups, manifests, node objects, the kubelet's
//! host changes) goes, however the run ended (Ctrl-C included). The report, its ratios and plot are
//! written by [`crate::scale_report`].

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use ringlet_tests::cluster::Cluster;
use ringlet_tests::kubelet_host::{LabKubelet, Registration};
use ringlet_tests::metric_value;
use serde_json::json;

use crate::benchkit::{self, Agent, free_port, fresh_run_dir, histogram, ms, percentile};
use crate::cluster_bench::{AuditMark, idle_window, requests_in};
use crate::density_bench::{Quantiles, raise_open_files, raise_pid_max, read_metrics};
use crate::health_watch::HealthWatcher;
use crate::hollow_host::{Hollow, PodCgroups};
use crate::kubelet_host::{HostGuard, find_kubelet};
use crate::node_bench::{
    Kind, PodWatch, Subject, admin_client, node_ready, remove_files, remove_node_objects,
};
use crate::scale_report::{Point, Report};
use crate::{cluster, cmd, exit_poll, http, workspace_root};

pub const NAMESPACE: &str = "ringlet-bench-scale";
const RELIST_DURATION: &str = "kubelet_pleg_relist_duration_seconds";
const APISERVER_REQUESTS: &str = "apiserver_request_total";
/// What both agents log (the kubelet at every skipped sync, ringlet in its node condition).
const PLEG_UNHEALTHY: &str = "PLEG is not healthy";
const SERVING_TIMEOUT: Duration = Duration::from_mins(2);
/// One read of `/pods` or `/stats/summary` at ten thousand pods takes seconds.
const READ_TIMEOUT: Duration = Duration::from_mins(1);
/// How often `/pods` is read while the pods start (it is megabytes).
const RUNNING_POLL: Duration = Duration::from_secs(1);
const EXIT_POLL: Duration = Duration::from_millis(5);
const EXIT_TIMEOUT: Duration = Duration::from_mins(1);
/// After each exit shows, the next kill waits this plus a spread part of [`EXIT_JITTER`], so kills
/// do not lock to the phase of a periodic relist.
const EXIT_PAUSE: Duration = Duration::from_millis(200);
const EXIT_JITTER: Duration = Duration::from_secs(1);
/// API creates in flight at once in cluster mode.
const CREATES_IN_FLIGHT: usize = 8;

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum AgentChoice {
    Ringlet,
    Kubelet,
    Both,
}

#[derive(clap::ValueEnum, Clone, Copy, PartialEq, Eq)]
pub enum ModeChoice {
    Standalone,
    Cluster,
    Both,
}

#[derive(clap::Args)]
pub struct ScaleArgs {
    /// The agents to measure.
    #[arg(long, value_enum, default_value = "both")]
    agent: AgentChoice,
    /// Pod counts, comma separated; each starts from a fresh runtime and agent.
    #[arg(long, value_delimiter = ',', default_value = "1000,3000,10000")]
    pods: Vec<usize>,
    /// Static pods (standalone), pods bound by the API server (cluster), or both.
    #[arg(long, value_enum, default_value = "both")]
    mode: ModeChoice,
    /// Containers killed (each in another pod, chosen at random) per agent and pod count.
    #[arg(long, default_value_t = 20)]
    exits: usize,
    /// Seconds between all pods Running and the idle window.
    #[arg(long, default_value_t = 20)]
    settle: u64,
    /// Length of the idle window in seconds.
    #[arg(long, default_value_t = 30)]
    window: u64,
    /// Reads of `/pods` and of `/stats/summary` timed per agent and pod count.
    #[arg(long, default_value_t = 10)]
    reads: usize,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Run this ringlet-hollow (with ringlet-hollow-child next to it) instead of a release build.
    #[arg(long)]
    hollow: Option<PathBuf>,
    /// Measure nothing: write scale.md and scale.svg again from this scale.json.
    #[arg(long)]
    render: Option<PathBuf>,
}

impl ScaleArgs {
    fn kinds(&self) -> Vec<Kind> {
        match self.agent {
            AgentChoice::Ringlet => vec![Kind::Ringlet],
            AgentChoice::Kubelet => vec![Kind::Kubelet],
            AgentChoice::Both => vec![Kind::Ringlet, Kind::Kubelet],
        }
    }

    fn modes(&self) -> Vec<Mode> {
        match self.mode {
            ModeChoice::Standalone => vec![Mode::Standalone],
            ModeChoice::Cluster => vec![Mode::Cluster],
            ModeChoice::Both => vec![Mode::Standalone, Mode::Cluster],
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Standalone,
    Cluster,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Standalone => "standalone",
            Self::Cluster => "cluster",
        }
    }
}

/// What every run shares.
struct Bench<'a> {
    args: &'a ScaleArgs,
    ringlet: PathBuf,
    /// The upstream kubelet, or why it does not run.
    kubelet: Result<PathBuf, String>,
    hollow: PathBuf,
    runtime: tokio::runtime::Runtime,
    /// The admin client and the control plane, in cluster mode.
    cluster: Option<(kube::Client, Cluster)>,
}

pub fn scale(args: &ScaleArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) {
        bail!("--pods needs pod counts above 0");
    }
    if args.exits == 0 || args.window == 0 || args.reads == 0 {
        bail!("--exits, --window and --reads must be above 0");
    }
    let root = workspace_root();
    if let Some(json) = &args.render {
        let text = fs::read(json).with_context(|| format!("reading {}", json.display()))?;
        let report: Report =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", json.display()))?;
        return crate::scale_report::write(&root, &report);
    }
    cmd::ensure_root("the scale bench")?;
    benchkit::stop_on_interrupt()?;
    let ringlet = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    let hollow = benchkit::release_binary(
        &root,
        "ringlet-hollow",
        "ringlet-hollow",
        args.hollow.as_deref(),
    )?;
    let kinds = args.kinds();
    let (kubelet, kubelet_version) = if kinds.contains(&Kind::Kubelet) {
        match find_kubelet() {
            Ok((path, version)) => (Ok(path), Some(version)),
            Err(reason) => (Err(reason), None),
        }
    } else {
        (Err("not asked for (--agent ringlet)".to_owned()), None)
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let modes = args.modes();
    let cluster = if modes.contains(&Mode::Cluster) {
        // Also (re)starts the API server with its audit log when an older `up` started it without.
        cluster::up(false)?;
        let control_plane = Cluster::local();
        control_plane.prepare_namespace(NAMESPACE)?;
        Some((
            runtime.block_on(admin_client(&control_plane))?,
            control_plane,
        ))
    } else {
        None
    };
    let pid_max = raise_pid_max()?;
    // The whole bench is the node's: no test or other bench starts an agent between two runs.
    let _node_lock = ringlet_tests::node_lock::node_lock()?;
    // Both agents remove pod cgroups they do not know, killing what runs in them (the kubelet).
    benchkit::wait_until_quiet(lab_tasks)?;
    // Ctrl-C while waiting for the lock: nothing ran yet.
    benchkit::check_interrupted()?;
    let bench = Bench {
        args,
        ringlet,
        kubelet,
        hollow,
        runtime,
        cluster,
    };

    let (points, failures) = bench.run_all(&modes, &kinds);
    let report = Report {
        benchmark: "scale".into(),
        harness: crate::scale_report::HARNESS.into(),
        date: benchkit::now_utc()?,
        commit: benchkit::git_commit(&root),
        machine: benchkit::machine_with("ringlet-hollow (a scale harness, not a runtime)"),
        ringlet_version: cmd::output(Command::new(&bench.ringlet).arg("--version"))
            .map_or_else(|_| "unknown".to_owned(), |v| v.trim().to_owned()),
        kubelet_version,
        kubelet_skipped: bench.kubelet.as_ref().err().cloned(),
        pid_max,
        exits: args.exits,
        settle_s: args.settle,
        window_s: args.window,
        reads: args.reads,
        points,
        failures,
    };
    crate::scale_report::write(&root, &report)?;
    if !report.failures.is_empty() {
        bail!("the results are partial: {}", report.failures.join("; "));
    }
    Ok(())
}

/// Why no agent may start yet: the lab's containerd runs containers, whose pod cgroups an agent
/// would take for orphans.
fn lab_tasks() -> Result<Option<String>> {
    if ringlet_tests::lab_containerd().running_pid()?.is_none() {
        return Ok(None);
    }
    let tasks = benchkit::task_pids()?.len();
    Ok((tasks > 0).then(|| {
        format!(
            "the lab's containerd runs {tasks} containers, which the agent would take for orphans"
        )
    }))
}

/// The directories and ports of one run.
struct Place {
    run_dir: PathBuf,
    manifests: PathBuf,
    root_dir: PathBuf,
    node: String,
    read_only: u16,
    healthz: u16,
    /// The node's kubeconfig, in cluster mode.
    kubeconfig: Option<PathBuf>,
}

impl Bench<'_> {
    /// Every run asked for, in order; a failed run is recorded and the next one goes on, until
    /// Ctrl-C.
    fn run_all(&self, modes: &[Mode], kinds: &[Kind]) -> (Vec<Point>, Vec<String>) {
        let mut points = Vec::new();
        let mut failures = Vec::new();
        'all: for &mode in modes {
            for &pods in &self.args.pods {
                for &kind in kinds {
                    if kind == Kind::Kubelet
                        && let Err(reason) = &self.kubelet
                    {
                        println!("SKIP kubelet: {reason}");
                        continue;
                    }
                    println!("== {} {} with {pods} pods", mode.name(), kind.name());
                    match self.run(mode, kind, pods) {
                        Ok(point) => points.push(point),
                        Err(err) => {
                            println!("FAILED: {err:#}");
                            failures.push(format!(
                                "{} {} {pods} pods: {err:#}",
                                mode.name(),
                                kind.name()
                            ));
                            if benchkit::check_interrupted().is_err() {
                                break 'all;
                            }
                        }
                    }
                }
            }
        }
        (points, failures)
    }

    /// One agent with `pods` pods on a fresh runtime; everything goes afterwards, however it ended.
    fn run(&self, mode: Mode, kind: Kind, pods: usize) -> Result<Point> {
        let (run_dir, manifests, root_dir) =
            fresh_run_dir(&format!("scale-{}-{}", mode.name(), kind.name()))?;
        let node = format!("scale-{}", kind.name());
        let kubeconfig = match &self.cluster {
            Some((client, control_plane)) if mode == Mode::Cluster => {
                // What an earlier, interrupted run may have left of this node.
                self.runtime
                    .block_on(remove_node_objects(client, NAMESPACE, &node))?;
                self.runtime.block_on(remove_pods(client, &node))?;
                Some(control_plane.node_kubeconfig(&node)?)
            }
            _ => None,
        };
        let place = Place {
            run_dir,
            manifests,
            root_dir,
            node,
            read_only: free_port()?,
            healthz: free_port()?,
            kubeconfig,
        };
        if kind == Kind::Ringlet {
            // Starting in ebpf mode would clear another agent's pins.
            benchkit::wait_for_free_pins()?;
        }
        let host = match kind {
            Kind::Kubelet => Some(HostGuard::take()?),
            Kind::Ringlet => None,
        };
        let cgroups = PodCgroups::snapshot()?;
        // Stopped when dropped, should anything below fail before the agent starts.
        let mut hollow = Hollow::start(&self.hollow, &place.run_dir)?;
        let measured = self.with_agent(mode, kind, pods, &place, &mut hollow);
        // The runtime kills its containers and removes their cgroups.
        hollow.stop();
        let api_cleaned = match &self.cluster {
            Some((client, _)) if mode == Mode::Cluster => self.runtime.block_on(async {
                remove_pods(client, &place.node).await?;
                remove_node_objects(client, NAMESPACE, &place.node).await
            }),
            _ => Ok(()),
        };
        let cgroups_removed = cgroups.remove_new();
        let files_removed =
            remove_files(&place.root_dir, &place.run_dir, place.kubeconfig.as_deref());
        let host_restored = host.map_or(Ok(()), HostGuard::restore);
        let point = measured?;
        api_cleaned?;
        let left = cgroups_removed?;
        files_removed?;
        host_restored?;
        println!("cleaned up ({left} pod cgroups the agent left removed)");
        Ok(point)
    }

    /// Starts the agent on `hollow`, measures, and stops it.
    fn with_agent(
        &self,
        mode: Mode,
        kind: Kind,
        pods: usize,
        place: &Place,
        hollow: &mut Hollow,
    ) -> Result<Point> {
        let agent = self.spawn(mode, kind, pods, place, hollow)?;
        raise_open_files(agent.pid())?;
        let mut subject = Subject::new(agent, kind);
        let label = format!("{} {} {pods} pods", mode.name(), kind.name());
        let watcher = HealthWatcher::start(place.healthz, "/healthz", label);
        let mut run = Run {
            bench: self,
            mode,
            kind,
            pods,
            place,
            hollow,
            subject: &mut subject,
            watcher: &watcher,
        };
        let measured = run.measure();
        let health = watcher.stop();
        subject.agent.stop();
        let mut point = measured?;
        point.health_checks = health.checks;
        point.health_unanswered = health.unanswered;
        point.health_failures = health.failures;
        point.pleg_unhealthy_log_lines = fs::read_to_string(&subject.agent.log).map_or(0, |log| {
            log.lines().filter(|l| l.contains(PLEG_UNHEALTHY)).count()
        });
        Ok(point)
    }

    fn spawn(
        &self,
        mode: Mode,
        kind: Kind,
        pods: usize,
        place: &Place,
        hollow: &Hollow,
    ) -> Result<Agent> {
        let endpoint = hollow.endpoint();
        let max_pods = pods.max(110).to_string();
        let api_port = free_port()?.to_string();
        let mut command = match kind {
            Kind::Ringlet => {
                let mut command = Command::new(&self.ringlet);
                command
                    .args(["--container-runtime-endpoint", &endpoint])
                    .arg("--root-dir")
                    .arg(&place.root_dir)
                    .args(["--hostname-override", &place.node])
                    .args(["--read-only-port", &place.read_only.to_string()])
                    .args(["--healthz-port", &place.healthz.to_string()])
                    .args(["--port", &api_port])
                    .args(["--address", "127.0.0.1"])
                    .args(["--max-pods", &max_pods])
                    // As the kubelet's configuration has it.
                    .args(ringlet_tests::LAB_AGENT_FLAGS)
                    .arg("--events-socket")
                    .arg(place.run_dir.join("events.sock"));
                match (&place.kubeconfig, &self.cluster) {
                    (Some(kubeconfig), Some((_, control_plane))) => command
                        .arg("--kubeconfig")
                        .arg(kubeconfig)
                        .arg("--client-ca-file")
                        .arg(control_plane.ca_file()),
                    _ => command.arg("--pod-manifest-path").arg(&place.manifests),
                };
                command
            }
            Kind::Kubelet => {
                let kubelet = self.kubelet.as_ref().map_err(|r| anyhow::anyhow!("{r}"))?;
                let registration = match (&place.kubeconfig, &self.cluster) {
                    (Some(kubeconfig), Some((_, control_plane))) => Some(Registration {
                        kubeconfig: kubeconfig.clone(),
                        client_ca_file: control_plane.ca_file(),
                    }),
                    _ => None,
                };
                let mut command = LabKubelet {
                    manifests: place.manifests.clone(),
                    run_dir: place.run_dir.clone(),
                    root_dir: place.root_dir.clone(),
                    read_only_port: place.read_only,
                    port: api_port.parse()?,
                    healthz_port: place.healthz,
                    registration,
                    evented_pleg: false,
                }
                .command(kubelet, &place.node)?;
                // Flags win over its configuration file, which names the lab's containerd.
                command
                    .args(["--container-runtime-endpoint", &endpoint])
                    .args(["--max-pods", &max_pods]);
                command
            }
        };
        let log = place
            .run_dir
            .join(format!("{}-{}.log", mode.name(), kind.name()));
        // Its own process group: Ctrl-C reaches only the bench, which then stops it in order.
        Agent::spawn(command.process_group(0), log)
    }
}

/// One agent's run with its pods.
struct Run<'a> {
    bench: &'a Bench<'a>,
    mode: Mode,
    kind: Kind,
    pods: usize,
    place: &'a Place,
    hollow: &'a mut Hollow,
    subject: &'a mut Subject,
    watcher: &'a HealthWatcher,
}

impl Run<'_> {
    fn alive(&mut self) -> Result<()> {
        self.subject.alive()?;
        self.hollow.exited()
    }

    fn measure(&mut self) -> Result<Point> {
        self.wait_serving()?;
        let pods_api = self
            .bench
            .cluster
            .as_ref()
            .map(|(client, _)| Api::<Pod>::namespaced(client.clone(), NAMESPACE));
        let watch = match (&pods_api, self.mode) {
            (Some(api), Mode::Cluster) => Some(
                self.bench
                    .runtime
                    .block_on(PodWatch::start(api.clone(), &self.place.node))?,
            ),
            _ => None,
        };
        let audit = AuditMark::now();

        self.watcher
            .set_phase(format!("starting {} pods", self.pods));
        let started = Instant::now();
        let mut watch = watch;
        match (&mut watch, &pods_api) {
            (Some(watch), Some(api)) => self.start_in_cluster(api, watch)?,
            _ => self.start_static()?,
        }
        let all_running_s = started.elapsed().as_secs_f64();
        println!("{} pods running after {all_running_s:.1} s", self.pods);
        let metrics_before = read_metrics(self.place.read_only)?;

        self.watcher
            .set_phase(format!("idle with {} pods", self.pods));
        self.sleep(Duration::from_secs(self.bench.args.settle))?;
        let api_before = self.apiserver_requests()?;
        let (idle, window) = self.bench.runtime.block_on(idle_window(
            self.subject,
            Duration::from_secs(self.bench.args.window),
        ))?;
        let api_after = self.apiserver_requests()?;
        println!(
            "idle: {:.2} % of a core, RSS {:.1} MiB",
            idle.cpu_percent, idle.rss_mib_median
        );

        self.watcher.set_phase(format!(
            "reading /pods and /stats/summary with {} pods",
            self.pods
        ));
        let pods_read = self.reads("/pods")?;
        let summary_read = self.reads("/stats/summary")?;
        println!(
            "GET /pods {} ms, GET /stats/summary {} ms (median / p99)",
            pods_read.show(),
            summary_read.show()
        );

        self.watcher
            .set_phase(format!("container exits with {} pods", self.pods));
        let exits = self.exits(watch.as_ref())?;
        let metrics_after = read_metrics(self.place.read_only)?;
        let relist = histogram(&metrics_after, RELIST_DURATION)
            .minus(&histogram(&metrics_before, RELIST_DURATION));
        let relist_sum = metric_value::<f64>(&metrics_after, &format!("{RELIST_DURATION}_sum"))
            .unwrap_or(0.0)
            - metric_value::<f64>(&metrics_before, &format!("{RELIST_DURATION}_sum"))
                .unwrap_or(0.0);
        let relists = relist.count();
        #[allow(clippy::cast_precision_loss)]
        let relist_mean_ms = (relists > 0).then(|| relist_sum / relists as f64 * 1000.0);

        let window_minutes = window.1.duration_since(window.0).as_secs_f64() / 60.0;
        let (api_requests_per_minute, node_requests_per_minute) = match (api_before, api_after) {
            (Some(before), Some(after)) => {
                let user = format!("system:node:{}", self.place.node);
                let node = audit
                    .and_then(|mark| mark.events(&user))
                    .map(|events| requests_in(&events, window).0)
                    .map_err(|reason| println!("no audit numbers: {reason}"))
                    .ok();
                (Some((after - before) / window_minutes), node)
            }
            _ => (None, None),
        };
        Ok(Point {
            mode: self.mode.name().into(),
            agent: self.kind.name().into(),
            pods: self.pods,
            all_running_s,
            idle_cpu_percent: idle.cpu_percent,
            rss_mib: idle.rss_mib_median,
            rss_mib_max: idle.rss_mib_max,
            full_relists: relists,
            full_relist_mean_ms: relist_mean_ms,
            full_relist: Quantiles::of_histogram(&relist),
            exit_status: Quantiles::of_samples(exits.status),
            exit_on_pods: exits.on_pods.map(Quantiles::of_samples),
            status_update_lag: exits.lag.map(Quantiles::of_samples),
            pods_read,
            summary_read,
            api_requests_per_minute,
            node_requests_per_minute,
            health_checks: 0,
            health_unanswered: 0,
            health_failures: Vec::new(),
            pleg_unhealthy_log_lines: 0,
        })
    }

    fn sleep(&mut self, length: Duration) -> Result<()> {
        let end = Instant::now() + length;
        while Instant::now() < end {
            self.alive()?;
            std::thread::sleep(Duration::from_millis(200).min(end - Instant::now()));
        }
        Ok(())
    }

    /// Until the agent answers `/healthz` (whatever it says) and, in cluster mode, its node is
    /// Ready.
    fn wait_serving(&mut self) -> Result<()> {
        let started = Instant::now();
        loop {
            self.alive()?;
            let serving = http::status(self.place.healthz, "/healthz").is_ok();
            let ready = match (&self.bench.cluster, self.mode) {
                (Some((client, _)), Mode::Cluster) => self.bench.runtime.block_on(async {
                    Api::<Node>::all(client.clone())
                        .get_opt(&self.place.node)
                        .await
                        .map(|n| n.is_some_and(|n| node_ready(&n)))
                })?,
                _ => true,
            };
            if serving && ready {
                return Ok(());
            }
            if started.elapsed() > SERVING_TIMEOUT {
                bail!(
                    "the agent was not serving (and its node Ready) within {SERVING_TIMEOUT:?}; see {}",
                    self.subject.log().display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn running_timeout(&self) -> Duration {
        Duration::from_mins(2)
            + Duration::from_millis(100) * u32::try_from(self.pods).unwrap_or(u32::MAX)
    }

    /// Writes the static pods' manifests and reads `/pods` until all of them run.
    fn start_static(&mut self) -> Result<()> {
        for i in 0..self.pods {
            let name = format!("scale-{i}");
            fs::write(
                self.place.manifests.join(format!("{name}.yaml")),
                benchkit::sleep_pod_manifest_on(&name, NAMESPACE, true),
            )?;
        }
        let started = Instant::now();
        let timeout = self.running_timeout();
        let mut last_report = Instant::now();
        loop {
            self.alive()?;
            let running = http::get_within(self.place.read_only, "/pods", READ_TIMEOUT)
                .map_or(0, |body| exit_poll::running_pods(&body, NAMESPACE).len());
            if running >= self.pods {
                return Ok(());
            }
            if started.elapsed() > timeout {
                bail!(
                    "only {running} of {} pods running after {timeout:?}; see {}",
                    self.pods,
                    self.subject.log().display()
                );
            }
            if last_report.elapsed() > Duration::from_secs(15) {
                println!("{running} of {} pods running", self.pods);
                last_report = Instant::now();
            }
            std::thread::sleep(RUNNING_POLL);
        }
    }

    /// Creates the pods through the API server, bound to the node, and waits until the watch has
    /// seen each Running and Ready.
    fn start_in_cluster(&mut self, api: &Api<Pod>, watch: &mut PodWatch) -> Result<()> {
        let names: Vec<String> = (0..self.pods).map(|i| format!("scale-{i}")).collect();
        let node = self.place.node.clone();
        let timeout = self.running_timeout();
        let subject = &mut *self.subject;
        self.bench.runtime.block_on(async {
            futures::stream::iter(names.iter().map(|name| {
                let pod = scale_pod(name, &node);
                async move {
                    api.create(&PostParams::default(), &pod?)
                        .await
                        .with_context(|| format!("creating pod {name}"))
                }
            }))
            .buffer_unordered(CREATES_IN_FLIGHT)
            .try_for_each(|_| async { benchkit::check_interrupted() })
            .await?;
            watch
                .wait(subject, "all pods Running and Ready", timeout, |seen| {
                    names
                        .iter()
                        .all(|n| seen.get(n).is_some_and(|s| s.ready.is_some()))
                        .then_some(())
                })
                .await
        })
    }

    /// `apiserver_request_total` summed over its series, in cluster mode.
    fn apiserver_requests(&self) -> Result<Option<f64>> {
        let (Some((client, _)), Mode::Cluster) = (&self.bench.cluster, self.mode) else {
            return Ok(None);
        };
        let request = hyper::Request::get("/metrics").body(Vec::new())?;
        let text = self
            .bench
            .runtime
            .block_on(client.request_text(request))
            .context("reading the API server's /metrics")?;
        Ok(Some(sum_series(&text, APISERVER_REQUESTS)))
    }

    /// `--reads` reads of `path` one after the other, timed.
    fn reads(&mut self, path: &str) -> Result<Quantiles> {
        let mut samples = Vec::with_capacity(self.bench.args.reads);
        for _ in 0..self.bench.args.reads {
            self.alive()?;
            let read = Instant::now();
            http::get_within(self.place.read_only, path, READ_TIMEOUT)
                .with_context(|| format!("reading {path}"))?;
            samples.push(ms(read.elapsed()));
        }
        Ok(Quantiles::of_samples(samples))
    }

    /// Kills the container process of `--exits` running pods chosen at random, one at a time, and
    /// times until the exit shows on `/pods` and, in cluster mode, on the API server.
    fn exits(&mut self, watch: Option<&PodWatch>) -> Result<Exits> {
        let body = http::get_within(self.place.read_only, "/pods", READ_TIMEOUT)?;
        let running = exit_poll::running_pods(&body, NAMESPACE);
        let pids = self.hollow.container_pids()?;
        let seed = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() ^ u64::from(d.subsec_nanos()))
            | 1;
        println!(
            "killing {} containers (seed {seed})",
            self.bench.args.exits.min(running.len())
        );
        let mut exits = Exits {
            status: Vec::new(),
            on_pods: watch.map(|_| Vec::new()),
            lag: watch.map(|_| Vec::new()),
        };
        for (k, index) in pick(running.len(), self.bench.args.exits, seed)
            .into_iter()
            .enumerate()
        {
            let (name, id, restarts) = &running[index];
            let Some(&pid) = pids.get(id) else {
                println!("no process for container {id} of {name}; skipped");
                continue;
            };
            let killed = Instant::now();
            if !ringlet_tests::daemon::signal(pid, libc::SIGKILL) {
                bail!(
                    "killing pid {pid} of {name}: {}",
                    std::io::Error::last_os_error()
                );
            }
            let mut local = None;
            let mut api = None;
            while local.is_none() || (watch.is_some() && api.is_none()) {
                self.alive()?;
                if killed.elapsed() > EXIT_TIMEOUT {
                    bail!("the exit of {name} did not show within {EXIT_TIMEOUT:?}");
                }
                if local.is_none()
                    && exit_poll::pod_changed(self.place.read_only, NAMESPACE, name, id, *restarts)
                {
                    local = Some(killed.elapsed());
                }
                if let Some(watch) = watch {
                    api = api.or_else(|| {
                        let pod = watch.seen(name)?;
                        let first = pod.changes.into_iter().find(|&at| at > killed)?;
                        Some(first - killed)
                    });
                }
                std::thread::sleep(EXIT_POLL);
            }
            let local = ms(local.unwrap_or_default());
            match api {
                Some(api) => {
                    let api = ms(api);
                    exits.status.push(api);
                    exits.on_pods.get_or_insert_with(Vec::new).push(local);
                    exits.lag.get_or_insert_with(Vec::new).push(api - local);
                }
                None => exits.status.push(local),
            }
            // Steps of 0.61 of the jitter (mod 1) cover its range evenly without a random source.
            #[allow(clippy::cast_precision_loss)]
            let spread = (k * 61 % 100) as f64 / 100.0;
            self.sleep(EXIT_PAUSE + EXIT_JITTER.mul_f64(spread))?;
        }
        let mut sorted = exits.status.clone();
        sorted.sort_by(f64::total_cmp);
        println!(
            "{} exits: median {:.1} ms, p99 {:.1} ms",
            sorted.len(),
            percentile(&sorted, 50.0),
            percentile(&sorted, 99.0)
        );
        Ok(exits)
    }
}

/// The timed exits of one run, in ms.
struct Exits {
    /// Kill → status: on `/pods` standalone, on the API server in cluster mode.
    status: Vec<f64>,
    /// Cluster mode: kill → the agent's `/pods`.
    on_pods: Option<Vec<f64>>,
    /// Cluster mode: the API server's view minus the agent's `/pods`.
    lag: Option<Vec<f64>>,
}

/// `count` distinct indices below `len` (all of them when there are fewer), drawn with xorshift
/// from `seed` (not zero).
fn pick(len: usize, count: usize, seed: u64) -> Vec<usize> {
    let mut indices: Vec<usize> = (0..len).collect();
    let mut state = seed.max(1);
    let count = count.min(len);
    for i in 0..count {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        #[allow(clippy::cast_possible_truncation)]
        let j = i + (state % (len - i) as u64) as usize;
        indices.swap(i, j);
    }
    indices.truncate(count);
    indices
}

/// The sum of every series of counter `name` in a Prometheus text exposition.
fn sum_series(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter_map(|l| l.rsplit_once(' ')?.1.trim().parse::<f64>().ok())
        .sum()
}

/// A pod for the hollow runtime bound to `node`: one container that runs until stopped, on the
/// host's network (the runtime has no other).
fn scale_pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "nodeName": node,
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "dnsPolicy": "Default",
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "sleep",
                "image": "docker.io/library/busybox:1.35",
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"],
            }],
        },
    }))?)
}

/// Force-deletes the bench pods bound to `node` (the agent is gone or about to go) and the
/// namespace's events.
async fn remove_pods(client: &kube::Client, node: &str) -> Result<()> {
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete_collection(
            &force,
            &ListParams::default().fields(&format!("spec.nodeName={node}")),
        )
        .await
        .context("deleting the bench pods")?;
    Api::<Event>::namespaced(client.clone(), NAMESPACE)
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .context("deleting the bench pods' events")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pick_draws_distinct_indices_in_range() {
        let picked = pick(50, 20, 7);
        assert_eq!(picked.len(), 20);
        let mut unique = picked.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), 20, "{picked:?}");
        assert!(picked.iter().all(|&i| i < 50));
        assert_ne!(pick(50, 20, 7), pick(50, 20, 8), "the seed decides");
        assert_eq!(pick(3, 20, 7).len(), 3, "no more than there are");
    }

    #[test]
    fn sum_series_adds_every_series_of_the_counter_only() {
        let text = "# TYPE apiserver_request_total counter\n\
                    apiserver_request_total{verb=\"GET\"} 3\n\
                    apiserver_request_total{verb=\"PATCH\"} 4.5\n\
                    apiserver_request_total_other 100\n\
                    apiserver_request_total 1\n";
        assert!((sum_series(text, APISERVER_REQUESTS) - 8.5).abs() < 1e-9);
    }
}
