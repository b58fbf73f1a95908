//! `cargo xtask bench pressure`: how soon an agent acts on node memory pressure, ringlet and the
//! upstream kubelet side by side in one run. Each agent runs as a node of the shared control plane
//! (`cargo xtask cluster up`), one after the other on the lab's containerd, with the pieces
//! `bench cluster` uses ([`crate::node_bench`]). A round:
//!
//! - reads the node's `memory.available` the way the kubelet does on cgroup v1 (the root memory
//!   cgroup: `MemTotal − (memory.usage_in_bytes − total_inactive_file)`) and starts the agent
//!   with `--eviction-hard=memory.available<` that value minus `--margin-mib` (the lab's 1 %
//!   nodefs/imagefs thresholds kept, so nothing else is evicted on this nearly full disk) and
//!   `--eviction-pressure-transition-period=5s`. The threshold is only read at start, so every
//!   round starts the agent afresh, on a fresh Node object;
//! - creates two API pods (static pods are critical, and never evicted): a `BestEffort` victim, and
//!   a Burstable hog whose memory request covers what it will fill, so the kubelet's order
//!   (usage above requests first) puts the victim first; both must be Running and Ready;
//! - starts the fill: a file appears in the hog's `hostPath` signal directory, and the hog's
//!   busybox `dd` reads `--fill-mib` from `/dev/zero` into one buffer, then blocks writing it to a
//!   `sleep` that never reads: anonymous memory, not page cache the formula would leave out;
//! - samples the same formula from outside every [`SAMPLE_PERIOD`], and times from the first
//!   sample below the threshold (the crossing) to the first watch event showing a pod Failed with
//!   reason Evicted, and to the first showing the Node's `MemoryPressure` True;
//! - force-deletes the pods, waits until containerd holds none of their containers, stops the
//!   agent and deletes the Node.
//!
//! Sides: ringlet, which always registers the kernel's memory cgroup threshold notification
//! (the kubelet's `kernelMemcgNotification`; ringlet has no switch for it); the kubelet with its
//! default (`kernelMemcgNotification: false`: the eviction manager polls every 10 s); and, unless
//! `--no-kubelet-memcg`, the kubelet with `--kernel-memcg-notification=true`, the setting that
//! compares like with like. Flags set what differs from the lab's configuration, as for ringlet:
//! on the kubelet a flag wins over its configuration file. A crossing seen before the fill (other
//! work on the machine took the memory) voids the round; the report says so.
//!
//! The kubelet's side waits until no other agent runs before each round and is stopped as soon as
//! one appears (see `bench cluster`): run this bench while nothing else uses the lab.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde::Serialize;
use serde_json::json;

use crate::benchkit::{self, fresh_run_dir, git_commit, machine, now_utc, runtime_containers};
use crate::kubelet_host::HostGuard;
use crate::node_bench::{
    AgentBinary, AgentSetup, Kind, NodeBench, PodWatch, Stats, Subject, WATCH_POLL, other_agents,
    remove_files, remove_node_objects, remove_pods_and_stop, spawn_agent, wait_node_ready,
    watch_from_now,
};

/// The pods of every side. It stays after the run: without kube-controller-manager a deleted
/// namespace would stay `Terminating` for ever.
const NAMESPACE: &str = "ringlet-bench-pressure";
const IMAGE: &str = "docker.io/library/busybox:1.35";
const VICTIM: &str = "victim";
const HOG: &str = "hog";
/// busybox `sh` as PID 1 would ignore SIGTERM; with the trap the container exits at once.
const VICTIM_COMMAND: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// The hog's signal directory, in the side's run directory.
const SIGNAL_DIR: &str = "signal";
/// Where the hog sees the signal directory.
const SIGNAL_MOUNT: &str = "/signal";
/// The file whose appearance starts the fill.
const SIGNAL_FILE: &str = "go";
/// How often the bench reads the node's memory while the hog fills.
const SAMPLE_PERIOD: Duration = Duration::from_millis(5);
/// `evictionPressureTransitionPeriod` (default 5 min): short, so a condition does not outlive
/// its round.
const TRANSITION_PERIOD: &str = "5s";
/// The kubelet's default `evictionMonitoringPeriod` is 10 s and it writes the node status every
/// 10 s: both together stay well within this.
const PRESSURE_TIMEOUT: Duration = Duration::from_mins(1);
const PODS_READY_TIMEOUT: Duration = Duration::from_mins(2);
/// The v1 memory hierarchy's root, whose usage the kubelet's `memory.available` is made of.
const ROOT_MEMORY_CGROUP: &str = "/sys/fs/cgroup/memory";
const MIB: u64 = 1024 * 1024;

#[derive(clap::Args)]
pub struct PressureArgs {
    /// Rounds per agent (each starts the agent afresh).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// How far below the node's `memory.available` at the round's start the threshold lies, MiB.
    #[arg(long, default_value_t = 300)]
    margin_mib: u64,
    /// How much the hog fills, MiB: well past the margin, so memory other work gives back while
    /// it fills does not undo the crossing.
    #[arg(long, default_value_t = 1024)]
    fill_mib: u64,
    /// Leave out the kubelet with `kernelMemcgNotification: true`.
    #[arg(long)]
    no_kubelet_memcg: bool,
    /// Run ringlet only; the kubelet's sides are reported as skipped.
    #[arg(long)]
    skip_kubelet: bool,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
}

/// One agent under one setting.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Ringlet,
    /// The kubelet with `kernelMemcgNotification` at its default, false.
    Kubelet,
    /// The kubelet with `kernelMemcgNotification: true`.
    KubeletMemcg,
}

impl Variant {
    fn kind(self) -> Kind {
        match self {
            Self::Ringlet => Kind::Ringlet,
            Self::Kubelet | Self::KubeletMemcg => Kind::Kubelet,
        }
    }

    fn slug(self) -> &'static str {
        match self {
            Self::Ringlet => "ringlet",
            Self::Kubelet => "kubelet",
            Self::KubeletMemcg => "kubelet-memcg",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Ringlet => "ringlet",
            Self::Kubelet => "kubelet (default)",
            Self::KubeletMemcg => "kubelet (kernelMemcgNotification)",
        }
    }

    /// How the agent learns of the crossing.
    fn notification(self) -> &'static str {
        match self {
            Self::Ringlet => "kernel memcg threshold notification (always on, no switch)",
            Self::Kubelet => "polling every 10 s (kernelMemcgNotification: false, the default)",
            Self::KubeletMemcg => {
                "kernel memcg threshold notification (kernelMemcgNotification: true)"
            }
        }
    }

    fn node(self) -> String {
        format!("bench-{}", self.slug())
    }

    /// The flags that set this round's thresholds (and, for [`Variant::KubeletMemcg`], the
    /// notification), from the lab's `--eviction-hard` with its memory threshold replaced.
    fn flags(self, threshold_mib: u64) -> Result<Vec<String>> {
        let mut flags = vec![
            eviction_hard(ringlet_tests::LAB_EVICTION_HARD, threshold_mib)?,
            format!("--eviction-pressure-transition-period={TRANSITION_PERIOD}"),
        ];
        if self == Self::KubeletMemcg {
            flags.push("--kernel-memcg-notification=true".to_owned());
        }
        Ok(flags)
    }
}

/// `lab` (`--eviction-hard=<signal><<value>,…`) with `memory.available` at `threshold_mib`.
fn eviction_hard(lab: &str, threshold_mib: u64) -> Result<String> {
    let thresholds = lab
        .strip_prefix("--eviction-hard=")
        .context("the lab's eviction flag is not --eviction-hard=…")?;
    let memory = format!("memory.available<{threshold_mib}Mi");
    let mut replaced = false;
    let parts: Vec<String> = thresholds
        .split(',')
        .map(|part| {
            if part.starts_with("memory.available<") {
                replaced = true;
                memory.clone()
            } else {
                part.to_owned()
            }
        })
        .collect();
    if !replaced {
        bail!("the lab's eviction flag {lab} has no memory.available threshold");
    }
    Ok(format!("--eviction-hard={}", parts.join(",")))
}

/// `memory.available` as the kubelet computes it on cgroup v1: the machine's memory (`MemTotal`
/// of `/proc/meminfo`) minus the root memory cgroup's working set (its usage minus
/// `total_inactive_file`), in bytes; `None` when a figure is missing.
fn available(meminfo: &str, usage: &str, stat: &str) -> Option<u64> {
    let capacity = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?
        .checked_mul(1024)?;
    let usage: u64 = usage.trim().parse().ok()?;
    let inactive_file: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("total_inactive_file "))?
        .trim()
        .parse()
        .ok()?;
    Some(capacity.saturating_sub(usage.saturating_sub(inactive_file)))
}

/// Reads the node's `memory.available` (see [`available`]).
fn read_available() -> Result<u64> {
    let read = |path: &str| fs::read_to_string(path).with_context(|| format!("reading {path}"));
    let usage = read(&format!("{ROOT_MEMORY_CGROUP}/memory.usage_in_bytes"))?;
    let stat = read(&format!("{ROOT_MEMORY_CGROUP}/memory.stat"))?;
    available(&read("/proc/meminfo")?, &usage, &stat).context(
        "no MemTotal, root cgroup usage or total_inactive_file to compute memory.available",
    )
}

/// The round's threshold in MiB: `margin_mib` below the available memory, rounded down.
fn threshold_mib(available: u64, margin_mib: u64) -> Result<u64> {
    match (available / MIB).checked_sub(margin_mib) {
        Some(threshold) if threshold > 0 => Ok(threshold),
        _ => bail!(
            "only {} MiB available: no threshold {margin_mib} MiB below it",
            available / MIB
        ),
    }
}

/// What the sampler saw: the first sample below the threshold.
#[derive(Debug)]
struct Crossing {
    threshold: u64,
    first_below: Option<Instant>,
    lowest: u64,
    samples: usize,
}

impl Crossing {
    fn new(threshold: u64) -> Self {
        Self {
            threshold,
            first_below: None,
            lowest: u64::MAX,
            samples: 0,
        }
    }

    /// The threshold is met, as for the agents, once less than it is available.
    fn observe(&mut self, at: Instant, available: u64) {
        self.samples += 1;
        self.lowest = self.lowest.min(available);
        if available < self.threshold {
            self.first_below.get_or_insert(at);
        }
    }
}

/// Reads `memory.available` every [`SAMPLE_PERIOD`] on a thread of its own until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<Crossing>>,
}

impl Sampler {
    fn start(threshold: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = Arc::clone(&stop);
            move || {
                let mut crossing = Crossing::new(threshold);
                while !stop.load(Ordering::Relaxed) {
                    let available = read_available()?;
                    crossing.observe(Instant::now(), available);
                    std::thread::sleep(SAMPLE_PERIOD);
                }
                Ok(crossing)
            }
        });
        Self { stop, thread }
    }

    fn stop(self) -> Result<Crossing> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("the memory sampler panicked"))?
    }
}

/// The first moment a watch on the node showed `MemoryPressure` True.
struct PressureWatch {
    first_true: Arc<Mutex<Option<Instant>>>,
    task: tokio::task::JoinHandle<Result<()>>,
}

impl PressureWatch {
    async fn start(nodes: Api<Node>, node: &str) -> Result<Self> {
        let first_true: Arc<Mutex<Option<Instant>>> = Arc::default();
        let task = watch_from_now(nodes, &format!("metadata.name={node}"), {
            let first_true = Arc::clone(&first_true);
            move |node: Node, gone, now| {
                if !gone && memory_pressure(&node) {
                    first_true
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get_or_insert(now);
                }
            }
        })
        .await?;
        Ok(Self { first_true, task })
    }

    fn seen(&self) -> Result<Option<Instant>> {
        if self.task.is_finished() {
            bail!("the node watch ended");
        }
        Ok(*self
            .first_true
            .lock()
            .unwrap_or_else(PoisonError::into_inner))
    }
}

impl Drop for PressureWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn memory_pressure(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == "MemoryPressure" && c.status == "True")
        })
}

#[derive(Serialize)]
struct Round {
    /// `memory.available` when the round started, MiB.
    available_mib: u64,
    threshold_mib: u64,
    /// From the signal to the crossing: how fast the hog filled.
    signal_to_crossing_ms: Option<f64>,
    crossing_to_eviction_ms: Option<f64>,
    crossing_to_memory_pressure_ms: Option<f64>,
    first_evicted: Option<String>,
    /// Why the round does not count.
    void: Option<String>,
}

#[derive(Serialize)]
struct Side {
    label: &'static str,
    agent: &'static str,
    node: String,
    notification: &'static str,
    /// Why the side did not run, or stopped before its last round.
    error: Option<String>,
    rounds: Vec<Round>,
    crossing_to_eviction: Option<Stats>,
    crossing_to_memory_pressure: Option<Stats>,
}

impl Side {
    fn new(variant: Variant) -> Self {
        Self {
            label: variant.label(),
            agent: variant.kind().name(),
            node: variant.node(),
            notification: variant.notification(),
            error: None,
            rounds: Vec::new(),
            crossing_to_eviction: None,
            crossing_to_memory_pressure: None,
        }
    }

    /// Medians and p99s over the rounds that count.
    fn summarize(&mut self) {
        let of = |pick: fn(&Round) -> Option<f64>| {
            let samples: Vec<f64> = self
                .rounds
                .iter()
                .filter(|r| r.void.is_none())
                .filter_map(pick)
                .collect();
            (!samples.is_empty()).then(|| Stats::of(samples))
        };
        self.crossing_to_eviction = of(|r| r.crossing_to_eviction_ms);
        self.crossing_to_memory_pressure = of(|r| r.crossing_to_memory_pressure_ms);
    }
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    machine: benchkit::Machine,
    kubelet_version: Option<String>,
    rounds: usize,
    margin_mib: u64,
    fill_mib: u64,
    sample_period_ms: f64,
    pressure_transition_period: &'static str,
    sides: Vec<Side>,
}

/// What every round of a run shares.
struct Bench<'a> {
    node: NodeBench,
    args: &'a PressureArgs,
}

pub fn pressure(args: &PressureArgs) -> Result<()> {
    if args.rounds == 0 || args.margin_mib == 0 || args.fill_mib <= args.margin_mib {
        bail!("--rounds and --margin-mib must be above 0, and --fill-mib above --margin-mib");
    }
    if !Path::new(ROOT_MEMORY_CGROUP)
        .join("memory.usage_in_bytes")
        .exists()
    {
        bail!("no cgroup v1 memory hierarchy at {ROOT_MEMORY_CGROUP}: this bench reads its root");
    }
    let bench = Bench {
        node: NodeBench::prepare(NAMESPACE, args.binary.as_deref())?,
        args,
    };
    let (root, ringlet, kubelet) = (&bench.node.root, &bench.node.ringlet, &bench.node.kubelet);

    let mut variants = vec![Variant::Ringlet, Variant::Kubelet];
    if !args.no_kubelet_memcg {
        variants.push(Variant::KubeletMemcg);
    }
    let mut sides = Vec::new();
    for variant in variants {
        println!("== {}", variant.label());
        let path = match (variant.kind(), &kubelet) {
            (Kind::Ringlet, _) => Ok(ringlet.clone()),
            (Kind::Kubelet, _) if args.skip_kubelet => Err("skipped: --skip-kubelet".to_owned()),
            (Kind::Kubelet, Ok((path, _))) => Ok(path.clone()),
            (Kind::Kubelet, Err(reason)) => Err(reason.clone()),
        };
        let mut side = Side::new(variant);
        let ran = path.map_err(anyhow::Error::msg).and_then(|path| {
            bench.run_side(
                &AgentBinary {
                    kind: variant.kind(),
                    path,
                },
                variant,
                &mut side,
            )
        });
        if let Err(err) = ran {
            println!("{} stopped: {err:#}", variant.label());
            side.error = Some(format!("{err:#}"));
        }
        side.summarize();
        sides.push(side);
        benchkit::check_interrupted()?;
    }

    let report = Report {
        benchmark: "pressure",
        date: now_utc()?,
        commit: git_commit(root),
        machine: machine()?,
        kubelet_version: kubelet.as_ref().ok().map(|(_, version)| version.clone()),
        rounds: args.rounds,
        margin_mib: args.margin_mib,
        fill_mib: args.fill_mib,
        sample_period_ms: benchkit::ms(SAMPLE_PERIOD),
        pressure_transition_period: TRANSITION_PERIOD,
        sides,
    };
    benchkit::write_results(root, "pressure", &report, &markdown(&report))
}

impl Bench<'_> {
    /// The rounds of one variant, pushed to `side` as they complete; whatever happens, no node
    /// object, file or host change of the side stays.
    fn run_side(&self, binary: &AgentBinary, variant: Variant, side: &mut Side) -> Result<()> {
        let node = variant.node();
        let (run_dir, _, root_dir) = fresh_run_dir(&format!("pressure-{}", variant.slug()))?;
        fs::create_dir_all(run_dir.join(SIGNAL_DIR))?;
        // What an earlier, interrupted run may have left of this node.
        self.node
            .runtime
            .block_on(remove_node_objects(&self.node.client, NAMESPACE, &node))?;
        let left = runtime_containers(NAMESPACE)?;
        if !left.is_empty() {
            bail!(
                "{} containers of namespace {NAMESPACE} are still in containerd from an earlier run",
                left.len()
            );
        }
        let kubeconfig = self.node.control_plane.node_kubeconfig(&node)?;
        let host = match binary.kind {
            Kind::Ringlet => None,
            Kind::Kubelet => {
                benchkit::wait_until_quiet(|| other_agents(None))
                    .context("the upstream kubelet would stop the pods of other agents")?;
                Some(HostGuard::take()?)
            }
        };
        let mut ran = Ok(());
        for index in 0..self.args.rounds {
            let round = self.round(binary, variant, index, &run_dir, &root_dir, &kubeconfig);
            match round {
                Ok(round) => side.rounds.push(round),
                Err(err) => {
                    ran = Err(err.context(format!("round {}", index + 1)));
                    break;
                }
            }
        }
        let host_restored = host.map_or(Ok(()), HostGuard::restore);
        let files_removed = remove_files(&root_dir, &run_dir, Some(&kubeconfig));
        ran?;
        host_restored?;
        files_removed
    }

    /// One round on a freshly started agent; its pods, containers and Node object are gone
    /// afterwards however it ended.
    fn round(
        &self,
        binary: &AgentBinary,
        variant: Variant,
        index: usize,
        run_dir: &Path,
        root_dir: &Path,
        kubeconfig: &Path,
    ) -> Result<Round> {
        match binary.kind {
            // Starting in ebpf mode would clear another agent's pins.
            Kind::Ringlet => benchkit::wait_for_free_pins()?,
            // Another agent may have started since the last round (the side waited before the
            // first).
            Kind::Kubelet if index > 0 => benchkit::wait_until_quiet(|| other_agents(None))?,
            Kind::Kubelet => {}
        }
        let available = read_available()?;
        let threshold = threshold_mib(available, self.args.margin_mib)?;
        let flags = variant.flags(threshold)?;
        let node = variant.node();
        let setup = AgentSetup {
            run_dir,
            root_dir,
            node: &node,
            kubeconfig,
            control_plane: &self.node.control_plane,
            flags: Some(&flags),
        };
        let log = format!("{}-{}.log", variant.slug(), index + 1);
        let agent = spawn_agent(binary, &setup, &log)?;
        // After the spawn, which waits for the lab's node lock as long as another agent holds it.
        let started = Instant::now();
        let mut agent = Subject::new(agent, binary.kind);
        println!(
            "round {}: {} as node {node} (pid {}), {} MiB available, threshold {threshold} MiB; log {}",
            index + 1,
            variant.label(),
            agent.agent.pid(),
            available / MIB,
            agent.log().display()
        );
        let signal = run_dir.join(SIGNAL_DIR);
        let measured = self.node.runtime.block_on(self.measure(
            &mut agent,
            &node,
            threshold * MIB,
            &signal,
            started,
        ));
        let signal_removed = match fs::remove_file(signal.join(SIGNAL_FILE)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
        let pods_removed = remove_pods_and_stop(
            &self.node.runtime,
            &self.node.client,
            NAMESPACE,
            &node,
            &mut agent,
            || spawn_agent(binary, &setup, &format!("{}-cleanup.log", variant.slug())),
        );
        let objects_removed =
            self.node
                .runtime
                .block_on(remove_node_objects(&self.node.client, NAMESPACE, &node));
        let mut round = measured?;
        pods_removed?;
        objects_removed?;
        signal_removed?;
        round.available_mib = available / MIB;
        round.threshold_mib = threshold;
        Ok(round)
    }

    /// Node Ready, both pods Running and Ready, the fill, and the agent's answer to it.
    async fn measure(
        &self,
        agent: &mut Subject,
        node: &str,
        threshold: u64,
        signal: &Path,
        started: Instant,
    ) -> Result<Round> {
        let nodes: Api<Node> = Api::all(self.node.client.clone());
        if memory_pressure(&wait_node_ready(&nodes, agent, node, started).await?) {
            return Ok(void_round("MemoryPressure before the fill"));
        }
        let pressure = PressureWatch::start(nodes, node).await?;
        let pods: Api<Pod> = Api::namespaced(self.node.client.clone(), NAMESPACE);
        let mut watch = PodWatch::start(pods.clone(), node).await?;
        for pod in [
            victim_pod(node)?,
            hog_pod(node, signal, self.args.fill_mib)?,
        ] {
            pods.create(&PostParams::default(), &pod)
                .await
                .context("creating a bench pod")?;
        }
        watch
            .wait(
                agent,
                "victim and hog Running and Ready",
                PODS_READY_TIMEOUT,
                |seen| {
                    [VICTIM, HOG]
                        .iter()
                        .all(|n| seen.get(*n).is_some_and(|s| s.ready.is_some()))
                        .then_some(())
                },
            )
            .await?;
        if pressure.seen()?.is_some() {
            return Ok(void_round("MemoryPressure before the fill"));
        }

        let sampler = Sampler::start(threshold);
        let signalled = Instant::now();
        fs::write(signal.join(SIGNAL_FILE), b"")
            .with_context(|| format!("writing the signal in {}", signal.display()))?;
        let deadline = signalled + PRESSURE_TIMEOUT;
        let (evicted, pressured) = loop {
            let evicted = first_evicted(&watch);
            let pressured = pressure.seen()?;
            if (evicted.is_some() && pressured.is_some()) || Instant::now() > deadline {
                break (evicted, pressured);
            }
            agent.alive()?;
            tokio::time::sleep(WATCH_POLL).await;
        };
        let crossing = sampler.stop()?;
        let mut round = timings(signalled, &crossing, evicted.as_ref(), pressured);
        println!(
            "crossing {} ms after the signal (lowest {} MiB available over {} samples); eviction of {} {} ms and MemoryPressure {} ms after it",
            shown(round.signal_to_crossing_ms),
            crossing.lowest / MIB,
            crossing.samples,
            round.first_evicted.as_deref().unwrap_or("no pod"),
            shown(round.crossing_to_eviction_ms),
            shown(round.crossing_to_memory_pressure_ms),
        );
        if round.void.is_none() && (evicted.is_none() || pressured.is_none()) {
            round.void = Some(format!(
                "no eviction and MemoryPressure within {PRESSURE_TIMEOUT:?}; see {}",
                agent.log().display()
            ));
        }
        Ok(round)
    }
}

fn void_round(reason: &str) -> Round {
    Round {
        available_mib: 0,
        threshold_mib: 0,
        signal_to_crossing_ms: None,
        crossing_to_eviction_ms: None,
        crossing_to_memory_pressure_ms: None,
        first_evicted: None,
        void: Some(reason.to_owned()),
    }
}

/// The pod the watch saw evicted first, and when.
fn first_evicted(watch: &PodWatch) -> Option<(String, Instant)> {
    [VICTIM, HOG]
        .iter()
        .filter_map(|name| Some(((*name).to_owned(), watch.seen(name)?.evicted?)))
        .min_by_key(|(_, at)| *at)
}

/// The round's figures from the signal, the crossing and what the watches saw.
fn timings(
    signalled: Instant,
    crossing: &Crossing,
    evicted: Option<&(String, Instant)>,
    pressured: Option<Instant>,
) -> Round {
    let since = |from: Instant, to: Instant| to.checked_duration_since(from).map(benchkit::ms);
    let crossed = crossing.first_below;
    let mut round = Round {
        available_mib: 0,
        threshold_mib: 0,
        signal_to_crossing_ms: crossed.and_then(|c| since(signalled, c)),
        crossing_to_eviction_ms: crossed.zip(evicted).and_then(|(c, (_, e))| since(c, *e)),
        crossing_to_memory_pressure_ms: crossed.zip(pressured).and_then(|(c, p)| since(c, p)),
        first_evicted: evicted.map(|(name, _)| name.clone()),
        void: None,
    };
    round.void = match crossed {
        None => Some("the sampler never saw memory.available below the threshold".to_owned()),
        Some(c) if c < signalled => {
            Some("memory crossed the threshold before the fill started".to_owned())
        }
        Some(_) if round.first_evicted.is_some() && round.crossing_to_eviction_ms.is_none() => {
            Some("a pod was evicted before the sampler saw the crossing".to_owned())
        }
        Some(_) => None,
    };
    round
}

fn shown(ms: Option<f64>) -> String {
    ms.map_or_else(|| "n/a".to_owned(), |ms| format!("{ms:.0}"))
}

fn base_pod(name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "nodeName": node,
            // ringlet does not serve projected service-account volumes yet.
            "automountServiceAccountToken": false,
            // No cluster DNS here (see bench cluster).
            "dnsPolicy": "Default",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
        },
    })
}

/// A `BestEffort` pod that sleeps: usage above its (zero) request, evicted first.
fn victim_pod(node: &str) -> Result<Pod> {
    let mut pod = base_pod(VICTIM, node);
    pod["spec"]["containers"] = json!([{
        "name": "sleep",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", VICTIM_COMMAND],
    }]);
    Ok(serde_json::from_value(pod)?)
}

/// A Burstable pod that waits for the signal file, then holds `fill_mib` of anonymous memory;
/// its memory request covers that, so its usage never exceeds it.
fn hog_pod(node: &str, signal: &Path, fill_mib: u64) -> Result<Pod> {
    let mut pod = base_pod(HOG, node);
    pod["spec"]["containers"] = json!([{
        "name": "fill",
        "image": IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", "-c", hog_command(fill_mib)],
        "resources": { "requests": { "memory": format!("{}Mi", fill_mib + 64) } },
        "volumeMounts": [{ "name": "signal", "mountPath": SIGNAL_MOUNT, "readOnly": true }],
    }]);
    pod["spec"]["volumes"] = json!([{
        "name": "signal",
        "hostPath": { "path": signal.to_string_lossy(), "type": "Directory" },
    }]);
    Ok(serde_json::from_value(pod)?)
}

/// `dd` reads the whole fill into one buffer (`/dev/zero` writes every page: resident anonymous
/// memory), then blocks for ever writing it to a `sleep` that never reads.
fn hog_command(fill_mib: u64) -> String {
    format!(
        "trap 'exit 0' TERM; until [ -e {SIGNAL_MOUNT}/{SIGNAL_FILE} ]; do sleep 1; done; \
         dd if=/dev/zero bs={fill_mib}M count=1 2>/dev/null | sleep 3600 & wait"
    )
}

fn ratio(kubelet: f64, ringlet: f64) -> String {
    if kubelet.is_finite() && ringlet.is_finite() && ringlet > 0.0 {
        format!("{:.1}×", kubelet / ringlet)
    } else {
        "n/a".to_owned()
    }
}

fn stats_cells(stats: Option<&Stats>) -> String {
    stats.map_or_else(
        || "n/a | n/a".to_owned(),
        |s| format!("{:.0} | {:.0}", s.median_ms, s.p99_ms),
    )
}

fn markdown(report: &Report) -> String {
    let mut out = format!(
        "# bench pressure: memory threshold crossing → eviction and MemoryPressure\n\n\
         ringlet commit `{}`, {}; kubelet {}; `cargo xtask bench pressure --rounds {} \
         --margin-mib {} --fill-mib {}`\n\nmachine: {}\n\n\
         Each agent joins the shared kube-apiserver (v1.36.2) as its own node, one after the other \
         on the same containerd, started afresh for every round with `--eviction-hard=memory.\
         available<` the node's `memory.available` at the round's start minus {} MiB (nodefs and \
         imagefs at the lab's 1 %) and `--eviction-pressure-transition-period={}`. \
         `memory.available` is computed as the kubelet does on cgroup v1: `MemTotal` minus the \
         root memory cgroup's usage minus its `total_inactive_file`. Two API pods: a BestEffort \
         victim (busybox `sleep`) and a Burstable hog (memory request {} MiB) that, once a file \
         appears in its hostPath signal directory, has busybox `dd` read {} MiB of `/dev/zero` \
         into one buffer and hold it (anonymous memory).\n\n\
         - **crossing**: the first of the bench's own samples of that formula (every {} ms) below \
         the threshold.\n\
         - **→ eviction**: to the first event of a pod watch showing a pod Failed with reason \
         Evicted (which pod is in the table).\n\
         - **→ MemoryPressure**: to the first event of a watch on the Node showing condition \
         MemoryPressure True.\n\n",
        report.commit,
        report.date,
        report.kubelet_version.as_deref().unwrap_or("not found"),
        report.rounds,
        report.margin_mib,
        report.fill_mib,
        report.machine.describe(),
        report.margin_mib,
        report.pressure_transition_period,
        report.fill_mib + 64,
        report.fill_mib,
        report.sample_period_ms,
    );
    out.push_str(
        "| agent | how it learns of the crossing | rounds counted | crossing → eviction median ms \
         | p99 ms | crossing → MemoryPressure median ms | p99 ms |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for side in &report.sides {
        let counted = side.rounds.iter().filter(|r| r.void.is_none()).count();
        let _ = writeln!(
            out,
            "| {} | {} | {counted} of {} | {} | {} |",
            side.label,
            side.notification,
            side.rounds.len(),
            stats_cells(side.crossing_to_eviction.as_ref()),
            stats_cells(side.crossing_to_memory_pressure.as_ref()),
        );
    }
    ratios_markdown(&mut out, report);
    for side in &report.sides {
        side_markdown(&mut out, side);
    }
    out
}

fn ratios_markdown(out: &mut String, report: &Report) {
    let Some(ringlet) = report.sides.iter().find(|s| s.agent == "ringlet") else {
        return;
    };
    out.push_str(
        "\n## kubelet / ringlet\n\nAbove 1: the kubelet takes that many times longer.\n\n\
         | kubelet | crossing → eviction median | p99 | crossing → MemoryPressure median | p99 |\n\
         |---|---:|---:|---:|---:|\n",
    );
    let get = |stats: Option<&Stats>, pick: fn(&Stats) -> f64| stats.map_or(f64::NAN, pick);
    for kubelet in report.sides.iter().filter(|s| s.agent == "kubelet") {
        let cell = |k: Option<&Stats>, r: Option<&Stats>, pick: fn(&Stats) -> f64| {
            ratio(get(k, pick), get(r, pick))
        };
        let (ke, re) = (
            kubelet.crossing_to_eviction.as_ref(),
            ringlet.crossing_to_eviction.as_ref(),
        );
        let (kp, rp) = (
            kubelet.crossing_to_memory_pressure.as_ref(),
            ringlet.crossing_to_memory_pressure.as_ref(),
        );
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            kubelet.label,
            cell(ke, re, |s| s.median_ms),
            cell(ke, re, |s| s.p99_ms),
            cell(kp, rp, |s| s.median_ms),
            cell(kp, rp, |s| s.p99_ms),
        );
    }
}

fn side_markdown(out: &mut String, side: &Side) {
    let _ = writeln!(out, "\n## {} (node `{}`)\n", side.label, side.node);
    if let Some(error) = &side.error {
        let _ = writeln!(out, "Stopped: {error}\n");
    }
    if side.rounds.is_empty() {
        return;
    }
    out.push_str(
        "| round | available MiB | threshold MiB | signal → crossing ms | crossing → eviction ms \
         | first evicted | crossing → MemoryPressure ms | note |\n\
         |---:|---:|---:|---:|---:|---|---:|---|\n",
    );
    for (i, r) in side.rounds.iter().enumerate() {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            i + 1,
            r.available_mib,
            r.threshold_mib,
            shown(r.signal_to_crossing_ms),
            shown(r.crossing_to_eviction_ms),
            r.first_evicted.as_deref().unwrap_or("none"),
            shown(r.crossing_to_memory_pressure_ms),
            r.void.as_deref().unwrap_or(""),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MEMINFO: &str = "MemTotal:       24731648 kB\nMemFree:        10661376 kB\n";
    const STAT: &str = "cache 1\ntotal_cache 12356632576\ntotal_inactive_file 3810021376\n\
                        total_active_file 8000000000\n";

    #[test]
    fn available_is_capacity_minus_the_working_set() {
        let capacity = 24_731_648 * 1024;
        let usage = 13_412_388_864_u64;
        let working_set = usage - 3_810_021_376;
        assert_eq!(
            available(MEMINFO, "13412388864\n", STAT),
            Some(capacity - working_set)
        );
        // A working set above the capacity leaves nothing, as for the kubelet.
        assert_eq!(available(MEMINFO, "99999999999999\n", STAT), Some(0));
        assert_eq!(available("MemFree: 1 kB\n", "1", STAT), None);
        assert_eq!(available(MEMINFO, "1", "total_cache 5\n"), None);
    }

    #[test]
    fn the_threshold_lies_the_margin_below_what_is_available() {
        assert_eq!(threshold_mib(14_000 * MIB + MIB / 2, 300).unwrap(), 13_700);
        assert!(threshold_mib(300 * MIB, 300).is_err());
        assert!(threshold_mib(100 * MIB, 300).is_err());
    }

    #[test]
    fn the_lab_memory_threshold_is_replaced_and_the_disk_ones_kept() {
        assert_eq!(
            eviction_hard(ringlet_tests::LAB_EVICTION_HARD, 13_700).unwrap(),
            "--eviction-hard=memory.available<13700Mi,nodefs.available<1%,imagefs.available<1%"
        );
        assert!(eviction_hard("--eviction-hard=nodefs.available<1%", 1).is_err());
        assert!(eviction_hard("--eviction-soft=memory.available<1Mi", 1).is_err());
        let flags = Variant::KubeletMemcg.flags(100).unwrap();
        assert_eq!(flags[1], "--eviction-pressure-transition-period=5s");
        assert_eq!(flags[2], "--kernel-memcg-notification=true");
        assert_eq!(Variant::Kubelet.flags(100).unwrap().len(), 2);
        assert_eq!(Variant::Ringlet.flags(100).unwrap().len(), 2);
    }

    #[test]
    fn the_crossing_is_the_first_sample_below_the_threshold() {
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let mut crossing = Crossing::new(1000);
        crossing.observe(at(0), 1500);
        // Equal is not below: the threshold is `memory.available<1000`.
        crossing.observe(at(5), 1000);
        crossing.observe(at(10), 999);
        crossing.observe(at(15), 1200);
        crossing.observe(at(20), 500);
        assert_eq!(crossing.first_below, Some(at(10)));
        assert_eq!(crossing.lowest, 500);
        assert_eq!(crossing.samples, 5);
    }

    fn crossed_at(at: Instant) -> Crossing {
        let mut crossing = Crossing::new(10);
        crossing.observe(at, 1);
        crossing
    }

    #[test]
    fn timings_count_from_the_crossing_and_void_a_crossing_before_the_fill() {
        let signal = Instant::now();
        let at = |ms: u64| signal + Duration::from_millis(ms);
        let evicted = ("victim".to_owned(), at(350));
        let round = timings(signal, &crossed_at(at(200)), Some(&evicted), Some(at(1200)));
        assert_eq!(round.signal_to_crossing_ms, Some(200.0));
        assert_eq!(round.crossing_to_eviction_ms, Some(150.0));
        assert_eq!(round.crossing_to_memory_pressure_ms, Some(1000.0));
        assert_eq!(round.first_evicted.as_deref(), Some("victim"));
        assert!(round.void.is_none());

        let early = timings(at(100), &crossed_at(signal), Some(&evicted), None);
        assert!(early.void.unwrap().contains("before the fill"));
        let never = timings(signal, &Crossing::new(10), None, None);
        assert!(never.void.unwrap().contains("never saw"));
        let evicted_first = timings(signal, &crossed_at(at(400)), Some(&evicted), None);
        assert!(evicted_first.void.unwrap().contains("before the sampler"));
    }

    fn side(variant: Variant, eviction_ms: &[f64], pressure_ms: &[f64]) -> Side {
        let mut side = Side::new(variant);
        side.rounds = eviction_ms
            .iter()
            .zip(pressure_ms)
            .map(|(e, p)| Round {
                available_mib: 14_000,
                threshold_mib: 13_700,
                signal_to_crossing_ms: Some(150.0),
                crossing_to_eviction_ms: Some(*e),
                crossing_to_memory_pressure_ms: Some(*p),
                first_evicted: Some(VICTIM.to_owned()),
                void: None,
            })
            .collect();
        side.rounds.push(void_round(
            "memory crossed the threshold before the fill started",
        ));
        side.summarize();
        side
    }

    #[test]
    fn the_report_gives_medians_and_ratios_over_the_rounds_that_count() {
        let ringlet = side(
            Variant::Ringlet,
            &[100.0, 300.0, 200.0],
            &[150.0, 250.0, 200.0],
        );
        assert_eq!(ringlet.crossing_to_eviction.as_ref().unwrap().samples, 3);
        assert!((ringlet.crossing_to_eviction.as_ref().unwrap().median_ms - 200.0).abs() < 1e-9);
        let kubelet = side(
            Variant::Kubelet,
            &[4000.0, 6000.0, 5000.0],
            &[9000.0, 11_000.0, 10_000.0],
        );
        let mut skipped = Side::new(Variant::KubeletMemcg);
        skipped.error = Some("no upstream kubelet".to_owned());
        skipped.summarize();
        let report = Report {
            benchmark: "pressure",
            date: "2026-11-29T03:00:00Z".to_owned(),
            commit: "abc1234".to_owned(),
            machine: benchkit::machine_with("containerd 1.6.20"),
            kubelet_version: Some("Kubernetes v1.36.2".to_owned()),
            rounds: 4,
            margin_mib: 300,
            fill_mib: 1024,
            sample_period_ms: 5.0,
            pressure_transition_period: TRANSITION_PERIOD,
            sides: vec![ringlet, kubelet, skipped],
        };
        let md = markdown(&report);
        assert!(md.contains("| ringlet | kernel memcg threshold notification (always on, no switch) | 3 of 4 | 200 | 300 | 200 | 250 |"), "{md}");
        assert!(
            md.contains("| kubelet (default) | 25.0× | 20.0× | 50.0× | 44.0× |"),
            "{md}"
        );
        assert!(
            md.contains("| kubelet (kernelMemcgNotification) | n/a | n/a | n/a | n/a |"),
            "{md}"
        );
        assert!(md.contains("Stopped: no upstream kubelet"), "{md}");
        assert!(md.contains("| 4 | 0 | 0 | n/a | n/a | none | n/a | memory crossed the threshold before the fill started |"), "{md}");
    }

    #[test]
    fn the_hog_waits_for_the_signal_and_requests_what_it_fills() {
        let pod = hog_pod("n", Path::new("/lab/signal"), 1024).unwrap();
        let spec = pod.spec.unwrap();
        let container = &spec.containers[0];
        let requests = container
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(requests["memory"].0, "1088Mi");
        assert!(container.command.as_ref().unwrap()[2].contains("until [ -e /signal/go ]"));
        assert!(container.command.as_ref().unwrap()[2].contains("bs=1024M count=1"));
        let volume = &spec.volumes.unwrap()[0];
        assert_eq!(volume.host_path.as_ref().unwrap().path, "/lab/signal");
        let victim = victim_pod("n").unwrap().spec.unwrap();
        assert!(victim.containers[0].resources.is_none(), "BestEffort");
    }
}
