//! `cargo xtask bench cluster`: ringlet and the upstream kubelet as nodes of one control plane
//! (`cargo xtask cluster up`), one after the other in the same run, on the same containerd. Each
//! agent runs on a node of its own (`bench-ringlet`, `bench-kubelet`, client certificate
//! `system:node:<node>`); for each pod count the bench
//!
//! - creates the pods through the API server (one `POST` after the other; bound with
//!   `spec.nodeName`, busybox `sleep` under a shell that exits on SIGTERM, on the lab's bridge
//!   network) and times each from the moment its create returned to the first watch event showing
//!   it Running with Ready true;
//! - lets the agent settle, then watches it idle with the pods running: CPU (utime + stime from
//!   `/proc/<pid>/stat`), RSS (`VmRSS`, sampled every second) and the node's API requests (from
//!   the API server's audit log, user `system:node:<node>`);
//! - deletes the pods with the default grace period and times each from the moment its delete
//!   returned to the watch's `DELETED` event; then waits until containerd holds none of their
//!   containers, so the next round starts clean.
//!
//! The audit log also gives the server-side latency (`stageTimestamp − requestReceivedTimestamp`)
//! of every request of each node over its whole run, and the interval between its lease renewals.
//!
//! The upstream kubelet stops every pod in containerd it does not know (it cannot tell another
//! agent's pods from orphans of its own) and changes the host, so its side waits until no other
//! agent runs (no container in containerd, no eBPF pins, no other ringlet or kubelet process),
//! stops the kubelet at once when one appears while it runs (the pins within 0.1 s, the process
//! within a second; it removes its pods only once it is alone again), records what it will change
//! (three sysctls, iptables chains, directories, cgroups) in a state file and puts it back when it
//! stops, or at the next run if this one was killed. An agent that starts pods within that second
//! may still lose them: run this bench while nothing else uses the lab.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use ringlet_tests::cluster::{CLUSTER_DIR, Cluster};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::benchkit::{
    self, fresh_run_dir, git_commit, machine, now_utc, percentile, process_cpu_seconds,
    runtime_containers,
};
use crate::cluster;
use crate::kubelet_host::HostGuard;
use crate::node_bench::{
    AgentBinary, AgentSetup, Kind, NodeBench, PodWatch, Stats, Subject, WATCH_POLL, other_agents,
    remove_files, remove_node_objects, remove_pods_and_stop, spawn_agent, wait_node_ready,
    wait_runtime_clean,
};

/// Both nodes' pods live here. It stays after the run: without kube-controller-manager a deleted
/// namespace would stay `Terminating` for ever.
const NAMESPACE: &str = "ringlet-bench-cluster";
const IMAGE: &str = "docker.io/library/busybox:1.35";
/// busybox `sh` as PID 1 would ignore SIGTERM; with the trap the container exits at once, so the
/// default grace period (30 s) never decides how long a delete takes.
const POD_COMMAND: &str = "trap 'exit 0' TERM; sleep 3600 & wait";
/// How long after Ready the node's pressure conditions are checked (the kubelet's eviction
/// manager runs every 10 s).
const PRESSURE_SETTLE: Duration = Duration::from_secs(11);
const RSS_PERIOD: Duration = Duration::from_secs(1);
#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Pod counts, one round each, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    pods: Vec<usize>,
    /// Length of the idle window with the pods running, in seconds.
    #[arg(long, default_value_t = 60)]
    idle_seconds: u64,
    /// Seconds between all pods Ready and the idle window. Past a minute, so the window sees the
    /// steady state: the upstream kubelet resyncs every pod once a minute, and its first resync
    /// still writes a status (pod-level resources it could not read from the cgroup at start).
    #[arg(long, default_value_t = 70)]
    settle: u64,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
}

#[derive(Serialize)]
pub(crate) struct Idle {
    window_s: f64,
    /// utime + stime over the window, in % of one core.
    pub(crate) cpu_percent: f64,
    pub(crate) rss_mib_median: f64,
    pub(crate) rss_mib_max: f64,
    /// `None` without an audit log.
    api_requests_per_minute: Option<f64>,
    /// Requests in the window by `<verb> <resource>[/<subresource>]` (or the path).
    api_requests: BTreeMap<String, usize>,
}

#[derive(Serialize)]
struct Round {
    pods: usize,
    create_to_ready: Stats,
    delete_to_gone: Stats,
    /// From the last pod gone to containerd holding none of the round's containers.
    runtime_cleanup_s: f64,
    idle: Idle,
    #[serde(skip)]
    window: (jiff::Timestamp, jiff::Timestamp),
}

#[derive(Serialize)]
struct ServerLatency {
    request: String,
    count: usize,
    median_ms: f64,
    p99_ms: f64,
}

#[derive(Serialize)]
struct Side {
    agent: &'static str,
    node: String,
    /// Why this side did not run.
    skipped: Option<String>,
    start_to_node_ready_ms: Option<f64>,
    rounds: Vec<Round>,
    /// Every request of the node's user over its whole run, watches left out (their latency is
    /// how long they stayed open).
    server_latency: Vec<ServerLatency>,
    lease_renew_interval: Option<Stats>,
    /// Why there are no audit numbers.
    audit_missing: Option<String>,
}

impl Side {
    fn skipped(kind: Kind, reason: String) -> Self {
        Self {
            agent: kind.name(),
            node: kind.node(),
            skipped: Some(reason),
            start_to_node_ready_ms: None,
            rounds: Vec::new(),
            server_latency: Vec::new(),
            lease_renew_interval: None,
            audit_missing: None,
        }
    }
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    machine: benchkit::Machine,
    kubelet_version: Option<String>,
    pods: Vec<usize>,
    idle_seconds: u64,
    settle_seconds: u64,
    network: &'static str,
    sides: Vec<Side>,
}

pub fn cluster(args: &ClusterArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) || args.idle_seconds == 0 {
        bail!("--pods needs pod counts above 0 and --idle-seconds a window above 0");
    }
    let NodeBench {
        root,
        ringlet,
        kubelet,
        control_plane,
        runtime,
        client,
    } = NodeBench::prepare(NAMESPACE, args.binary.as_deref())?;

    println!("== ringlet");
    let mut sides = vec![run_side(
        &runtime,
        &client,
        &control_plane,
        &AgentBinary {
            kind: Kind::Ringlet,
            path: ringlet,
        },
        args,
    )?];
    println!("== kubelet");
    let kubelet_version = kubelet.as_ref().ok().map(|(_, version)| version.clone());
    let quiet = kubelet.and_then(|(path, _)| {
        benchkit::wait_until_quiet(|| other_agents(None))
            .map_err(|e| format!("{e:#}: the upstream kubelet would stop their pods"))?;
        Ok(path)
    });
    sides.push(match quiet {
        Ok(path) => run_side(
            &runtime,
            &client,
            &control_plane,
            &AgentBinary {
                kind: Kind::Kubelet,
                path,
            },
            args,
        )?,
        Err(reason) => {
            println!("SKIP kubelet: {reason}");
            Side::skipped(Kind::Kubelet, reason)
        }
    });

    let report = Report {
        benchmark: "cluster",
        date: now_utc()?,
        commit: git_commit(&root),
        machine: machine()?,
        kubelet_version,
        pods: args.pods.clone(),
        idle_seconds: args.idle_seconds,
        settle_seconds: args.settle,
        network: "pod network: the lab's bridge CNI (10.88.0.0/16), set up by containerd",
        sides,
    };
    benchkit::write_results(&root, "cluster", &report, &markdown(&report))
}

/// One agent on its own node: start, rounds, and a cleanup that runs however the rounds end.
fn run_side(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    control_plane: &Cluster,
    binary: &AgentBinary,
    args: &ClusterArgs,
) -> Result<Side> {
    let kind = binary.kind;
    let node = kind.node();
    let (run_dir, _, root_dir) = fresh_run_dir(&format!("cluster-{}", kind.name()))?;
    // What an earlier, interrupted run may have left of this node.
    runtime.block_on(remove_node_objects(client, NAMESPACE, &node))?;
    let left = runtime_containers(NAMESPACE)?;
    if !left.is_empty() {
        bail!(
            "{} containers of namespace {NAMESPACE} are still in containerd from an earlier run",
            left.len()
        );
    }
    let kubeconfig = control_plane.node_kubeconfig(&node)?;
    let host = match kind {
        Kind::Ringlet => {
            // Starting in ebpf mode would clear another agent's pins.
            benchkit::wait_for_free_pins()?;
            None
        }
        Kind::Kubelet => Some(HostGuard::take()?),
    };
    let audit = AuditMark::now();
    let setup = AgentSetup {
        run_dir: &run_dir,
        root_dir: &root_dir,
        node: &node,
        kubeconfig: &kubeconfig,
        control_plane,
        flags: None,
    };
    let spawn = |log: &str| spawn_agent(binary, &setup, log);
    let started = Instant::now();
    let mut agent = Subject::new(spawn(&format!("{}.log", kind.name()))?, kind);
    println!(
        "{} started as node {node} (pid {}), log {}",
        kind.name(),
        agent.agent.pid(),
        agent.log().display()
    );

    let measured = runtime.block_on(measure(client, &mut agent, &node, args, started));
    // Whatever happened: no pod, container, node object or host change of this side stays.
    let pods_removed = remove_pods_and_stop(runtime, client, NAMESPACE, &node, &mut agent, || {
        spawn(&format!("{}-cleanup.log", kind.name()))
    });
    let objects_removed = runtime.block_on(remove_node_objects(client, NAMESPACE, &node));
    let host_restored = host.map_or(Ok(()), HostGuard::restore);
    let files_removed = remove_files(&root_dir, &run_dir, Some(&kubeconfig));
    let (node_ready_ms, mut rounds) = measured?;
    pods_removed?;
    objects_removed?;
    host_restored?;
    files_removed?;

    let user = format!("system:node:{node}");
    let (server_latency, lease_renew_interval, audit_missing) =
        match audit.and_then(|mark| mark.events(&user)) {
            Ok(events) => {
                for round in &mut rounds {
                    let (per_minute, requests) = requests_in(&events, round.window);
                    round.idle.api_requests_per_minute = Some(per_minute);
                    round.idle.api_requests = requests;
                }
                (
                    server_latency(&events),
                    lease_renewals(&events, &node),
                    None,
                )
            }
            Err(reason) => {
                println!("no audit numbers: {reason}");
                (Vec::new(), None, Some(reason))
            }
        };
    Ok(Side {
        agent: kind.name(),
        node,
        skipped: None,
        start_to_node_ready_ms: Some(node_ready_ms),
        rounds,
        server_latency,
        lease_renew_interval,
        audit_missing,
    })
}

/// Node Ready, then one round per pod count; returns start → node Ready (ms) and the rounds.
async fn measure(
    client: &kube::Client,
    agent: &mut Subject,
    node: &str,
    args: &ClusterArgs,
    started: Instant,
) -> Result<(f64, Vec<Round>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    wait_node_ready(&nodes, agent, node, started).await?;
    let node_ready_ms = benchkit::ms(started.elapsed());
    println!("node {node} Ready after {node_ready_ms:.0} ms");
    // The agent's view of its pressure conditions settles with its first eviction check.
    tokio::time::sleep(PRESSURE_SETTLE).await;
    if let Some(node) = nodes.get_opt(node).await? {
        refuse_pressure(&node)?;
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut watch = PodWatch::start(pods.clone(), node).await?;
    let mut rounds = Vec::new();
    for &count in &args.pods {
        rounds.push(round(&pods, &mut watch, agent, node, count, args).await?);
    }
    Ok((node_ready_ms, rounds))
}

/// A node under memory, disk or PID pressure evicts and refuses pods: its figures would measure
/// the eviction, not the agent.
fn refuse_pressure(node: &Node) -> Result<()> {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten();
    for condition in conditions {
        if condition.type_.ends_with("Pressure") && condition.status == "True" {
            bail!(
                "node {} reports {}: {} (free disk space or memory first; the agent would evict \
                 the bench's pods)",
                node.metadata.name.as_deref().unwrap_or_default(),
                condition.type_,
                condition.message.as_deref().unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// Every bench pod must still be running when the idle window ends: one that failed (evicted,
/// rejected) makes the round meaningless.
async fn refuse_failed_pods(pods: &Api<Pod>, names: &[String]) -> Result<()> {
    let listed = pods
        .list(&ListParams::default())
        .await
        .context("listing the bench pods")?;
    let mut statuses: HashMap<String, _> = listed
        .items
        .into_iter()
        .map(|p| {
            (
                p.metadata.name.unwrap_or_default(),
                p.status.unwrap_or_default(),
            )
        })
        .collect();
    for name in names {
        let status = statuses.remove(name).unwrap_or_default();
        if status.phase.as_deref() != Some("Running") {
            bail!(
                "pod {name} is {} ({}: {}) after the idle window; the round is void",
                status.phase.unwrap_or_default(),
                status.reason.unwrap_or_default(),
                status.message.unwrap_or_default()
            );
        }
    }
    Ok(())
}

fn bench_pod(name: &str, node: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NAMESPACE },
        "spec": {
            "nodeName": node,
            // ringlet does not serve projected service-account volumes yet.
            "automountServiceAccountToken": false,
            // There is no cluster DNS here: with ClusterFirst and no clusterDNS both agents would
            // send a MissingClusterDNS warning event at every sync of every pod.
            "dnsPolicy": "Default",
            "restartPolicy": "Always",
            "containers": [{
                "name": "sleep",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", POD_COMMAND],
            }],
        },
    }))?)
}

async fn round(
    pods: &Api<Pod>,
    watch: &mut PodWatch,
    agent: &mut Subject,
    node: &str,
    count: usize,
    args: &ClusterArgs,
) -> Result<Round> {
    let names: Vec<String> = (0..count).map(|i| format!("bench-{count}-{i}")).collect();
    let mut created = HashMap::new();
    for name in &names {
        pods.create(&PostParams::default(), &bench_pod(name, node)?)
            .await
            .with_context(|| format!("creating pod {name}"))?;
        created.insert(name.clone(), Instant::now());
    }
    let timeout = Duration::from_mins(2) + Duration::from_secs(2) * u32::try_from(count)?;
    let ready = watch
        .wait(
            agent,
            &format!("{count} pods Running and Ready"),
            timeout,
            |seen| {
                names
                    .iter()
                    .map(|n| seen.get(n).and_then(|s| s.ready))
                    .collect::<Option<Vec<Instant>>>()
            },
        )
        .await?;
    let create_to_ready = Stats::of(
        names
            .iter()
            .zip(&ready)
            .map(|(n, r)| benchkit::ms(r.duration_since(created[n])))
            .collect(),
    );
    println!(
        "{count} pods: create → Running, Ready median {:.0} ms, p99 {:.0} ms",
        create_to_ready.median_ms, create_to_ready.p99_ms
    );

    tokio::time::sleep(Duration::from_secs(args.settle)).await;
    let idle = idle_window(agent, Duration::from_secs(args.idle_seconds)).await?;
    let window = idle.1;
    let idle = idle.0;
    println!(
        "{count} pods idle: CPU {:.2}% of a core, RSS {:.1} MiB",
        idle.cpu_percent, idle.rss_mib_median
    );

    refuse_failed_pods(pods, &names).await?;
    let mut deleted = HashMap::new();
    for name in &names {
        pods.delete(name, &DeleteParams::default())
            .await
            .with_context(|| format!("deleting pod {name}"))?;
        deleted.insert(name.clone(), Instant::now());
    }
    let timeout = Duration::from_mins(2) + Duration::from_secs(1) * u32::try_from(count)?;
    let gone = watch
        .wait(agent, &format!("{count} pods gone"), timeout, |seen| {
            names
                .iter()
                .map(|n| seen.get(n).and_then(|s| s.gone))
                .collect::<Option<Vec<Instant>>>()
        })
        .await?;
    let delete_to_gone = Stats::of(
        names
            .iter()
            .zip(&gone)
            .map(|(n, g)| benchkit::ms(g.duration_since(deleted[n])))
            .collect(),
    );
    println!(
        "{count} pods: delete → gone median {:.0} ms, p99 {:.0} ms",
        delete_to_gone.median_ms, delete_to_gone.p99_ms
    );
    let last_gone = gone.iter().max().copied().unwrap_or_else(Instant::now);
    wait_runtime_clean(agent, NAMESPACE).await?;
    let runtime_cleanup_s = last_gone.elapsed().as_secs_f64();
    println!("containers removed from containerd {runtime_cleanup_s:.1} s after the last pod went");
    Ok(Round {
        pods: count,
        create_to_ready,
        delete_to_gone,
        runtime_cleanup_s,
        idle,
        window,
    })
}

/// CPU and RSS of the agent over `length`, with the wall-clock window for the audit log.
pub(crate) async fn idle_window(
    agent: &mut Subject,
    length: Duration,
) -> Result<(Idle, (jiff::Timestamp, jiff::Timestamp))> {
    agent.alive()?;
    let pid = agent.agent.pid();
    let from = jiff::Timestamp::try_from(SystemTime::now())?;
    let started = Instant::now();
    let cpu_before = process_cpu_seconds(pid)?;
    let mut rss = Vec::new();
    let end = started + length;
    let mut next_rss = started;
    loop {
        agent.alive()?;
        let now = Instant::now();
        if now >= next_rss {
            rss.push(benchkit::rss_mib(pid)?);
            next_rss += RSS_PERIOD;
        }
        if now >= end {
            break;
        }
        tokio::time::sleep(WATCH_POLL.min(end - now)).await;
    }
    let cpu = process_cpu_seconds(pid)? - cpu_before;
    let window = started.elapsed().as_secs_f64();
    let to = jiff::Timestamp::try_from(SystemTime::now())?;
    rss.sort_by(f64::total_cmp);
    Ok((
        Idle {
            window_s: window,
            cpu_percent: cpu / window * 100.0,
            rss_mib_median: percentile(&rss, 50.0),
            rss_mib_max: rss.last().copied().unwrap_or(f64::NAN),
            api_requests_per_minute: None,
            api_requests: BTreeMap::new(),
        },
        (from, to),
    ))
}

/// Where the audit log was when a side started.
pub(crate) struct AuditMark {
    since: jiff::Timestamp,
    offset: u64,
    inode: u64,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuditEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    verb: String,
    #[serde(rename = "requestURI")]
    request_uri: String,
    user: AuditUser,
    object_ref: Option<ObjectRef>,
    response_status: Option<ResponseStatus>,
    request_received_timestamp: String,
    stage_timestamp: String,
}

#[derive(Deserialize)]
struct AuditUser {
    username: String,
}

#[derive(Deserialize)]
struct ObjectRef {
    resource: Option<String>,
    subresource: Option<String>,
    name: Option<String>,
}

#[derive(Deserialize)]
struct ResponseStatus {
    code: Option<u16>,
}

/// One request of a node, from its audit event.
pub(crate) struct Request {
    id: String,
    /// `<verb> <resource>[/<subresource>]`, or `<verb> <path>` for a non-resource URL.
    kind: String,
    verb: String,
    name: Option<String>,
    resource: Option<String>,
    received: jiff::Timestamp,
    latency_ms: f64,
    complete: bool,
    ok: bool,
}

fn audit_log() -> PathBuf {
    Path::new(CLUSTER_DIR).join(cluster::AUDIT_LOG)
}

impl AuditMark {
    pub(crate) fn now() -> Result<Self, String> {
        use std::os::unix::fs::MetadataExt;
        let meta = fs::metadata(audit_log()).map_err(|e| {
            format!(
                "no audit log at {} ({e}): `cargo xtask cluster up` restarts the API server with one",
                audit_log().display()
            )
        })?;
        Ok(Self {
            since: jiff::Timestamp::try_from(SystemTime::now()).map_err(|e| e.to_string())?,
            offset: meta.len(),
            inode: meta.ino(),
        })
    }

    /// The requests of `user` since the mark. After a rotation the whole current and rotated
    /// files are read and filtered by time.
    pub(crate) fn events(self, user: &str) -> Result<Vec<Request>, String> {
        self.read(user)
            .map_err(|e| format!("reading the audit log: {e:#}"))
    }

    fn read(&self, user: &str) -> Result<Vec<Request>> {
        use std::io::{Read, Seek};
        use std::os::unix::fs::MetadataExt;
        let log = audit_log();
        let mut file = fs::File::open(&log)?;
        let mut text = String::new();
        if file.metadata()?.ino() == self.inode {
            file.seek(std::io::SeekFrom::Start(self.offset))?;
            file.read_to_string(&mut text)?;
        } else {
            for entry in fs::read_dir(CLUSTER_DIR)? {
                let path = entry?.path();
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                if name.starts_with("audit") && name.ends_with(".log") && path != log {
                    text.push_str(&fs::read_to_string(&path)?);
                }
            }
            file.read_to_string(&mut text)?;
        }
        let mut requests = Vec::new();
        for line in text.lines() {
            // Cheap filter first: most lines are someone else's.
            if !line.contains(user) {
                continue;
            }
            let Ok(event) = serde_json::from_str::<AuditEvent>(line) else {
                continue;
            };
            if event.user.username != user {
                continue;
            }
            let received: jiff::Timestamp = event.request_received_timestamp.parse()?;
            if received < self.since {
                continue;
            }
            let stage: jiff::Timestamp = event.stage_timestamp.parse()?;
            let kind = match &event.object_ref {
                Some(ObjectRef {
                    resource: Some(resource),
                    subresource,
                    ..
                }) => match subresource {
                    Some(sub) => format!("{} {resource}/{sub}", event.verb),
                    None => format!("{} {resource}", event.verb),
                },
                _ => format!(
                    "{} {}",
                    event.verb,
                    event.request_uri.split('?').next().unwrap_or_default()
                ),
            };
            #[allow(clippy::cast_precision_loss)]
            let latency_ms = stage.duration_since(received).as_micros() as f64 / 1000.0;
            requests.push(Request {
                id: event.audit_id,
                kind,
                name: event.object_ref.as_ref().and_then(|o| o.name.clone()),
                resource: event.object_ref.and_then(|o| o.resource),
                verb: event.verb,
                received,
                latency_ms,
                complete: event.stage == "ResponseComplete",
                ok: event
                    .response_status
                    .and_then(|s| s.code)
                    .is_some_and(|c| (200..300).contains(&c)),
            });
        }
        Ok(requests)
    }
}

/// Server-side latency by request kind, most frequent first; watches left out.
fn server_latency(requests: &[Request]) -> Vec<ServerLatency> {
    let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in requests.iter().filter(|r| r.complete && r.verb != "watch") {
        by_kind.entry(&r.kind).or_default().push(r.latency_ms);
    }
    let mut out: Vec<ServerLatency> = by_kind
        .into_iter()
        .map(|(kind, mut samples)| {
            samples.sort_by(f64::total_cmp);
            ServerLatency {
                request: kind.to_owned(),
                count: samples.len(),
                median_ms: percentile(&samples, 50.0),
                p99_ms: percentile(&samples, 99.0),
            }
        })
        .collect();
    out.sort_by(|a, b| b.count.cmp(&a.count).then(a.request.cmp(&b.request)));
    out
}

/// Intervals between successful writes (update or patch) of the node's Lease.
fn lease_renewals(requests: &[Request], node: &str) -> Option<Stats> {
    let mut times: Vec<jiff::Timestamp> = requests
        .iter()
        .filter(|r| {
            r.complete
                && r.ok
                && r.resource.as_deref() == Some("leases")
                && r.name.as_deref() == Some(node)
                && (r.verb == "update" || r.verb == "patch")
        })
        .map(|r| r.received)
        .collect();
    times.sort();
    #[allow(clippy::cast_precision_loss)]
    let intervals: Vec<f64> = times
        .windows(2)
        .map(|w| w[1].duration_since(w[0]).as_micros() as f64 / 1000.0)
        .collect();
    (!intervals.is_empty()).then(|| Stats::of(intervals))
}

/// Requests received in `window` (a watch counted once): per minute, and by kind.
pub(crate) fn requests_in(
    requests: &[Request],
    window: (jiff::Timestamp, jiff::Timestamp),
) -> (f64, BTreeMap<String, usize>) {
    let mut ids = HashSet::new();
    let mut by_kind = BTreeMap::new();
    for r in requests
        .iter()
        .filter(|r| r.received >= window.0 && r.received < window.1)
    {
        if ids.insert(r.id.as_str()) {
            *by_kind.entry(r.kind.clone()).or_insert(0) += 1;
        }
    }
    let seconds = window.1.duration_since(window.0).as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let per_minute = ids.len() as f64 * 60.0 / seconds;
    (per_minute, by_kind)
}

fn markdown(report: &Report) -> String {
    let mut out = format!(
        "# bench cluster: ringlet and the upstream kubelet as nodes of one control plane\n\n\
         ringlet commit `{}`, {}; kubelet {}; `cargo xtask bench cluster --pods {} --idle-seconds {}` \
         (settle {} s)\n\nmachine: {}\n\n\
         Both agents join the same kube-apiserver (v1.36.2, `cargo xtask cluster up`) as their own node \
         (client certificate `system:node:<node>`), one after the other in this run, on the same \
         containerd; {}. Pods are busybox `sh -c \"{POD_COMMAND}\"`, bound with `spec.nodeName`, \
         `automountServiceAccountToken: false`, `dnsPolicy: Default` (no cluster DNS here: with \
         ClusterFirst the kubelet sends a MissingClusterDNS warning event at every pod sync), \
         restartPolicy Always, default grace period.\n\n\
         - **create → Running, Ready**: per pod, from the moment its `POST` returned (the bench \
         creates them one after the other) to the first event of a watch (`spec.nodeName=<node>`, \
         opened before the first create) with phase Running and condition Ready True.\n\
         - **delete → gone**: per pod, from the moment its `DELETE` (default grace period; the \
         container exits on SIGTERM) returned to the watch's `DELETED` event.\n\
         - **idle**: after all pods are Ready and {} s of settling (past the kubelet's first \
         one-minute resync of each pod, which still writes its status), over {} s with the pods \
         running: the agent process's utime + stime from `/proc/<pid>/stat` in % of one core, \
         `VmRSS` sampled every second (median), and the requests of user `system:node:<node>` \
         received in the window according to the API server's audit log, per minute.\n\
         - **server-side latency**: `stageTimestamp − requestReceivedTimestamp` of each \
         completed request of the node's user in the audit log (Metadata level) over its whole \
         run, watches left out; **lease renewals**: intervals between its successful Lease \
         updates. **containers removed**: from the last pod gone to containerd holding none of \
         the round's containers (polled every 0.5 s with `ctr`).\n\n",
        report.commit,
        report.date,
        report.kubelet_version.as_deref().unwrap_or("not found"),
        report
            .pods
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        report.idle_seconds,
        report.settle_seconds,
        report.machine.describe(),
        report.network,
        report.settle_seconds,
        report.idle_seconds,
    );
    for side in &report.sides {
        side_markdown(&mut out, side);
    }
    ratios_markdown(&mut out, report);
    out
}

fn side_markdown(out: &mut String, side: &Side) {
    let _ = writeln!(out, "## {} (node `{}`)\n", side.agent, side.node);
    if let Some(reason) = &side.skipped {
        let _ = writeln!(out, "SKIP: {reason}\n");
        return;
    }
    if let Some(ms) = side.start_to_node_ready_ms {
        let _ = writeln!(
            out,
            "agent start → node Ready on the API server: {ms:.0} ms\n"
        );
    }
    out.push_str(
        "| pods | create → Ready median ms | p99 ms | delete → gone median ms | p99 ms | \
         idle CPU % of a core | idle RSS MiB | API requests/min idle | containers removed s |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in &side.rounds {
        let _ = writeln!(
            out,
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} | {} | {:.1} |",
            r.pods,
            r.create_to_ready.median_ms,
            r.create_to_ready.p99_ms,
            r.delete_to_gone.median_ms,
            r.delete_to_gone.p99_ms,
            r.idle.cpu_percent,
            r.idle.rss_mib_median,
            r.idle
                .api_requests_per_minute
                .map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}")),
            r.runtime_cleanup_s,
        );
    }
    out.push('\n');
    if let Some(reason) = &side.audit_missing {
        let _ = writeln!(out, "No audit numbers: {reason}\n");
        return;
    }
    for r in &side.rounds {
        let requests: Vec<String> = r
            .idle
            .api_requests
            .iter()
            .map(|(kind, n)| format!("`{kind}` {n}"))
            .collect();
        let _ = writeln!(
            out,
            "Requests in the idle window with {} pods ({:.0} s): {}\n",
            r.pods,
            r.idle.window_s,
            if requests.is_empty() {
                "none".to_owned()
            } else {
                requests.join(", ")
            }
        );
    }
    out.push_str(
        "| request (server side, whole run) | count | median ms | p99 ms |\n|---|---:|---:|---:|\n",
    );
    for l in &side.server_latency {
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.2} | {:.2} |",
            l.request, l.count, l.median_ms, l.p99_ms
        );
    }
    match &side.lease_renew_interval {
        Some(s) => {
            let _ = writeln!(
                out,
                "\nlease renewals: median interval {:.2} s, p99 {:.2} s ({} intervals)\n",
                s.median_ms / 1000.0,
                s.p99_ms / 1000.0,
                s.samples
            );
        }
        None => out.push_str("\nlease renewals: fewer than two seen\n\n"),
    }
}

fn ratio(a: f64, b: f64) -> String {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "n/a".to_owned()
    }
}

/// (metric, ringlet, kubelet, unit) of one pod count.
fn round_rows(r: &Round, k: &Round) -> [(&'static str, f64, f64, &'static str); 7] {
    let requests = |round: &Round| round.idle.api_requests_per_minute.unwrap_or(f64::NAN);
    [
        (
            "create → Ready median",
            r.create_to_ready.median_ms,
            k.create_to_ready.median_ms,
            "ms",
        ),
        (
            "create → Ready p99",
            r.create_to_ready.p99_ms,
            k.create_to_ready.p99_ms,
            "ms",
        ),
        (
            "delete → gone median",
            r.delete_to_gone.median_ms,
            k.delete_to_gone.median_ms,
            "ms",
        ),
        (
            "delete → gone p99",
            r.delete_to_gone.p99_ms,
            k.delete_to_gone.p99_ms,
            "ms",
        ),
        (
            "idle CPU",
            r.idle.cpu_percent,
            k.idle.cpu_percent,
            "% of a core",
        ),
        (
            "idle RSS",
            r.idle.rss_mib_median,
            k.idle.rss_mib_median,
            "MiB",
        ),
        ("API requests idle", requests(r), requests(k), "/min"),
    ]
}

fn ratios_markdown(out: &mut String, report: &Report) {
    let find = |agent: &str| {
        report
            .sides
            .iter()
            .find(|s| s.agent == agent && s.skipped.is_none())
    };
    let (Some(ringlet), Some(kubelet)) = (find("ringlet"), find("kubelet")) else {
        out.push_str("## ringlet / kubelet\n\nno ratios: one side did not run\n");
        return;
    };
    out.push_str(
        "## ringlet / kubelet\n\nBelow 1 means ringlet is faster or cheaper.\n\n\
         | pods | metric | ringlet | kubelet | ringlet / kubelet |\n|---:|---|---:|---:|---:|\n",
    );
    for r in &ringlet.rounds {
        let Some(k) = kubelet.rounds.iter().find(|k| k.pods == r.pods) else {
            continue;
        };
        for (name, a, b, unit) in round_rows(r, k) {
            let _ = writeln!(
                out,
                "| {} | {name} ({unit}) | {a:.2} | {b:.2} | {} |",
                r.pods,
                ratio(a, b)
            );
        }
    }
    if let (Some(a), Some(b)) = (
        ringlet.start_to_node_ready_ms,
        kubelet.start_to_node_ready_ms,
    ) {
        let _ = writeln!(
            out,
            "| | agent start → node Ready (ms) | {a:.0} | {b:.0} | {} |",
            ratio(a, b)
        );
    }
    if let (Some(a), Some(b)) = (&ringlet.lease_renew_interval, &kubelet.lease_renew_interval) {
        let _ = writeln!(
            out,
            "| | lease renewal interval median (s) | {:.2} | {:.2} | {} |",
            a.median_ms / 1000.0,
            b.median_ms / 1000.0,
            ratio(a.median_ms, b.median_ms)
        );
    }
    let shared: Vec<(&ServerLatency, &ServerLatency)> = ringlet
        .server_latency
        .iter()
        .filter_map(|a| {
            kubelet
                .server_latency
                .iter()
                .find(|b| b.request == a.request)
                .map(|b| (a, b))
        })
        .collect();
    if !shared.is_empty() {
        out.push_str(
            "\nServer-side latency of the requests both agents make (whole run):\n\n\
             | request | ringlet count | kubelet count | ringlet median ms | kubelet median ms | \
             median ratio | ringlet p99 ms | kubelet p99 ms | p99 ratio |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (a, b) in shared {
            let _ = writeln!(
                out,
                "| `{}` | {} | {} | {:.2} | {:.2} | {} | {:.2} | {:.2} | {} |",
                a.request,
                a.count,
                b.count,
                a.median_ms,
                b.median_ms,
                ratio(a.median_ms, b.median_ms),
                a.p99_ms,
                b.p99_ms,
                ratio(a.p99_ms, b.p99_ms)
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(id: &str, kind: &str, at: &str, latency_ms: f64) -> Request {
        let (verb, resource) = kind.split_once(' ').unwrap();
        Request {
            id: id.to_owned(),
            kind: kind.to_owned(),
            verb: verb.to_owned(),
            name: Some("n".to_owned()),
            resource: Some(resource.to_owned()),
            received: at.parse().unwrap(),
            latency_ms,
            complete: true,
            ok: true,
        }
    }

    #[test]
    fn lease_intervals_and_idle_requests_come_from_the_audit_events() {
        let requests = [
            request("a", "update leases", "2026-01-01T00:00:00Z", 2.0),
            request("b", "get nodes", "2026-01-01T00:00:05Z", 1.0),
            request("c", "update leases", "2026-01-01T00:00:10Z", 4.0),
            request("d", "update leases", "2026-01-01T00:00:20.5Z", 3.0),
            // A watch: started (counted as a request, not a latency), still open.
            Request {
                complete: false,
                ..request("e", "watch pods", "2026-01-01T00:00:25Z", 0.1)
            },
        ];
        let lease = lease_renewals(&requests, "n").unwrap();
        assert_eq!(lease.samples_ms, [10_000.0, 10_500.0]);
        let window = (
            "2026-01-01T00:00:00Z".parse().unwrap(),
            "2026-01-01T00:00:30Z".parse().unwrap(),
        );
        let (per_minute, by_kind) = requests_in(&requests, window);
        assert!((per_minute - 10.0).abs() < 1e-9);
        assert_eq!(by_kind["update leases"], 3);
        assert_eq!(by_kind["watch pods"], 1);
        let latency = server_latency(&requests);
        assert_eq!(latency.len(), 2);
        assert_eq!(latency[0].request, "update leases");
        assert_eq!(latency[0].count, 3);
        assert!((latency[0].median_ms - 3.0).abs() < 1e-9);
    }
}
