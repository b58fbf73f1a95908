//! The agent's CRI round trips and cgroup file sweeps on one I/O engine: `Version`,
//! `ListContainers`, `PodSandboxStatus` and a targeted relist of one pod (`get_pod_status` through
//! the runtime manager) against a real containerd, then `read_small_files` over the cgroup files a
//! `/stats/summary` scrape reads, and whole scrapes (`StatsProvider::scrape`, what the agent runs
//! for `/stats/summary`), for the running bench pods and for a synthetic tree of pod and container
//! cgroups (created here, removed however the run ends). Prints one JSON array of cases on stdout.
//! `cargo xtask bench io` runs it once per engine; it corresponds to no kubelet package.

use std::collections::HashMap;
use std::fs;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ringlet::container::ContainerId;
use ringlet::container::{PodUid, Runtime};
use ringlet::events::Recorder;
use ringlet::io::{self, IoEngine, IoEngineSetting};
use ringlet::kuberuntime::{
    CriClient, KubeGenericRuntimeManager, RuntimeHelper, RuntimeSettings, labels,
};
use ringlet::stats::{
    CgroupLayout, ContainerStatsInput, PodStatsInput, StatsProvider, StatsSettings,
    timestamp_from_unix_nanos,
};
use ringlet_proto::runtime::v1 as cri;
use serde_json::{Value, json};

const CRI_TIMEOUT: Duration = Duration::from_secs(10);
const QOS_CLASSES: &[&str] = &["besteffort", "burstable", ""];
/// Containers per pod in the synthetic tree.
const SYNTHETIC_CONTAINERS_PER_POD: usize = 10;

#[derive(Parser)]
struct Args {
    /// `uring` or `epoll` (`auto` probes).
    #[arg(long)]
    io_engine: String,
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    endpoint: PathBuf,
    /// Namespace of the bench pods whose containers and cgroups are measured.
    #[arg(long, default_value = "ringlet-bench")]
    namespace: String,
    /// Measured calls of each CRI method, after as many warm-up calls as `--warmup`.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    #[arg(long, default_value_t = 100)]
    warmup: usize,
    /// Measured sweeps of each cgroup file set, after `--warmup` / 10 warm-up sweeps.
    #[arg(long, default_value_t = 200)]
    sweeps: usize,
    /// Synthetic container cgroups to create for the large sweep and scrape (in pods of 10).
    #[arg(long, default_value_t = 1000)]
    synthetic: usize,
    /// Mount point of the cgroup v1 hierarchies.
    #[arg(long, default_value = "/sys/fs/cgroup")]
    cgroup_root: PathBuf,
    /// Name of the synthetic tree below the `memory` and `cpuacct` hierarchies.
    #[arg(long, default_value = "ringlet-io-bench")]
    synthetic_name: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let setting = IoEngineSetting::from_str(&args.io_engine)?;
    let (engine, fallback) = io::select(setting)?;
    if let Some(reason) = fallback {
        eprintln!("io_uring unavailable, measuring epoll: {reason}");
    }
    let cases = io::block_on(engine, run(&args, engine))??;
    println!("{}", serde_json::to_string_pretty(&cases)?);
    Ok(())
}

async fn run(args: &Args, engine: IoEngine) -> Result<Vec<Value>> {
    let endpoint = args.endpoint.display().to_string();
    let cri = CriClient::from_channel(
        &endpoint,
        io::unix_channel(args.endpoint.clone(), engine),
        CRI_TIMEOUT,
    );
    let filter = cri::ContainerFilter {
        label_selector: HashMap::from([(labels::POD_NAMESPACE.to_owned(), args.namespace.clone())]),
        ..Default::default()
    };
    let containers = cri.list_containers(Some(filter.clone())).await?;
    let Some(first) = containers.first() else {
        bail!(
            "no containers of namespace {} in {endpoint}",
            args.namespace
        );
    };
    let sandbox = first.pod_sandbox_id.clone();
    let pod_label = |key: &str| first.labels.get(key).cloned().unwrap_or_default();
    let (uid, name, namespace) = (
        PodUid::new(pod_label(labels::POD_UID)),
        pod_label(labels::POD_NAME),
        pod_label(labels::POD_NAMESPACE),
    );
    let engine_name = engine.as_str();
    let mut cases = Vec::new();
    let calls = (args.calls, args.warmup);
    cases.push(
        measure(engine_name, "cri", "Version", calls, || async {
            cri.version().await.map(drop)
        })
        .await?,
    );
    let listed = format!("ListContainers ({} containers)", containers.len());
    cases.push(
        measure(engine_name, "cri", &listed, calls, || async {
            cri.list_containers(None).await.map(drop)
        })
        .await?,
    );
    cases.push(
        measure(engine_name, "cri", "PodSandboxStatus", calls, || async {
            cri.pod_sandbox_status(&sandbox).await.map(drop)
        })
        .await?,
    );
    let manager = KubeGenericRuntimeManager::new(
        cri.clone(),
        Arc::new(BenchHelper),
        Recorder::new(None),
        RuntimeSettings::default(),
    );
    cases.push(
        measure(
            engine_name,
            "cri",
            "targeted relist of one pod (get_pod_status)",
            calls,
            || async {
                manager
                    .get_pod_status(&uid, &name, &namespace)
                    .await
                    .map(drop)
            },
        )
        .await?,
    );

    let sweeps = (args.sweeps, (args.warmup / 10).max(1));
    let layout = CgroupLayout::detect().context("finding the cgroup mounts")?;
    let stats = StatsProvider::new(StatsSettings::new("ringlet-io-bench", layout));
    let real = bench_pods(&args.cgroup_root, &containers)?;
    let real_files = stats.cgroup_files(&real);
    let real_case = format!(
        "{} bench pods, {} containers ({} cgroup files)",
        real.len(),
        containers.len(),
        real_files.len()
    );
    cases.push(sweep_case(engine, &real_case, &real_files, sweeps).await?);
    cases.push(scrape_case(engine, &stats, &real_case, &real, sweeps).await?);

    let tree = SyntheticTree::create(&args.cgroup_root, &args.synthetic_name, args.synthetic)?;
    let synthetic_files = stats.cgroup_files(&tree.pods);
    let synthetic_case = format!(
        "{} synthetic pods, {} containers ({} cgroup files)",
        tree.pods.len(),
        args.synthetic,
        synthetic_files.len()
    );
    cases.push(sweep_case(engine, &synthetic_case, &synthetic_files, sweeps).await?);
    cases.push(scrape_case(engine, &stats, &synthetic_case, &tree.pods, sweeps).await?);
    drop(tree);
    Ok(cases)
}

/// Times `calls.0` sequential calls of `call` after `calls.1` unmeasured ones.
async fn measure<F, Fut, E>(
    engine: &str,
    section: &str,
    case: &str,
    (calls, warmup): (usize, usize),
    mut call: F,
) -> Result<Value>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    for _ in 0..warmup {
        call().await.with_context(|| format!("warming up {case}"))?;
    }
    let mut latencies = Vec::with_capacity(calls);
    let cpu_before = cpu_seconds()?;
    let started = Instant::now();
    for _ in 0..calls {
        let sent = Instant::now();
        call().await.with_context(|| format!("measuring {case}"))?;
        latencies.push(sent.elapsed());
    }
    let elapsed = started.elapsed();
    let cpu = cpu_seconds()? - cpu_before;
    Ok(summary(engine, section, case, latencies, elapsed, cpu))
}

async fn sweep_case(
    engine: IoEngine,
    case: &str,
    files: &[PathBuf],
    sweeps: (usize, usize),
) -> Result<Value> {
    measure(
        engine.as_str(),
        "cgroup file sweep",
        case,
        sweeps,
        || async {
            let read = io::read_small_files(files, engine).await;
            match read
                .into_iter()
                .zip(files)
                .find_map(|(r, p)| r.err().map(|e| (e, p)))
            {
                Some((error, path)) => Err(std::io::Error::new(
                    error.kind(),
                    format!("reading {}: {error}", path.display()),
                )),
                None => Ok(()),
            }
        },
    )
    .await
}

/// Whole `/stats/summary` scrapes of `pods` without the HTTP around them; fails when a container
/// is missing from a summary (its cgroup could not be read).
async fn scrape_case(
    engine: IoEngine,
    stats: &StatsProvider,
    case: &str,
    pods: &[PodStatsInput],
    scrapes: (usize, usize),
) -> Result<Value> {
    let containers: usize = pods.iter().map(|pod| pod.containers.len()).sum();
    measure(
        engine.as_str(),
        "stats summary scrape in process",
        case,
        scrapes,
        || async {
            let summary = stats
                .scrape(pods.to_vec(), engine, false)
                .await
                .map_err(std::io::Error::other)?;
            let with_cpu = summary
                .pods
                .iter()
                .flat_map(|pod| &pod.containers)
                .filter(|container| container.cpu.is_some() && container.memory.is_some())
                .count();
            if with_cpu == containers {
                Ok(())
            } else {
                Err(std::io::Error::other(format!(
                    "{with_cpu} of {containers} containers have CPU and memory figures"
                )))
            }
        },
    )
    .await
}

fn summary(
    engine: &str,
    section: &str,
    case: &str,
    mut latencies: Vec<Duration>,
    elapsed: Duration,
    cpu_seconds: f64,
) -> Value {
    latencies.sort();
    let ms = |d: Option<&Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    let rank = |p: usize| (latencies.len() * p).div_ceil(100).saturating_sub(1);
    #[allow(clippy::cast_precision_loss)]
    let samples = latencies.len() as f64;
    json!({
        "section": section,
        "case": case,
        "engine": engine,
        "samples": latencies.len(),
        "errors": 0,
        "p50_ms": ms(latencies.get(rank(50))),
        "p99_ms": ms(latencies.get(rank(99))),
        "per_second": samples / elapsed.as_secs_f64(),
        "cpu_ms_per_op": cpu_seconds * 1000.0 / samples,
        "cpu_seconds_per_second": cpu_seconds / elapsed.as_secs_f64(),
    })
}

/// user + system CPU of this process, its `io_uring` workers included (they are its threads).
fn cpu_seconds() -> Result<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given and reads nothing.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage");
    }
    // SAFETY: getrusage succeeded, so it initialised the struct.
    let usage = unsafe { usage.assume_init() };
    #[allow(clippy::cast_precision_loss)]
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(seconds(usage.ru_utime) + seconds(usage.ru_stime))
}

/// The bench pods as the agent's stats scrape sees them: each pod's cgroup below `kubepods` and
/// its containers.
fn bench_pods(root: &Path, containers: &[cri::Container]) -> Result<Vec<PodStatsInput>> {
    let mut pods: HashMap<String, PodStatsInput> = HashMap::new();
    for container in containers {
        let label = |key: &str| container.labels.get(key).cloned().unwrap_or_default();
        let uid = label(labels::POD_UID);
        if uid.is_empty() {
            bail!("container {} has no pod uid label", container.id);
        }
        let pod = match pods.entry(uid.clone()) {
            std::collections::hash_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::hash_map::Entry::Vacant(entry) => {
                let cgroup = QOS_CLASSES
                    .iter()
                    .map(|qos| Path::new("/kubepods").join(qos).join(format!("pod{uid}")))
                    .find(|pod| {
                        root.join("memory")
                            .join(pod.strip_prefix("/").unwrap_or(pod))
                            .is_dir()
                    })
                    .with_context(|| format!("no memory cgroup of pod {uid} under kubepods"))?;
                entry.insert(PodStatsInput {
                    namespace: label(labels::POD_NAMESPACE),
                    name: label(labels::POD_NAME),
                    uid: PodUid::new(uid),
                    start_time: timestamp_from_unix_nanos(container.created_at),
                    cgroup: cgroup.display().to_string(),
                    containers: Vec::new(),
                })
            }
        };
        pod.containers.push(ContainerStatsInput {
            name: label(labels::CONTAINER_NAME),
            id: ContainerId::new(container.id.clone()),
            start_time: timestamp_from_unix_nanos(container.created_at),
        });
    }
    Ok(pods.into_values().collect())
}

/// `<hierarchy>/<name>/pod<i>/c<j>` in the `memory` and `cpuacct` hierarchies, in pods of
/// [`SYNTHETIC_CONTAINERS_PER_POD`]; removed on drop.
struct SyntheticTree {
    parents: Vec<PathBuf>,
    pods: Vec<PodStatsInput>,
}

impl SyntheticTree {
    fn create(root: &Path, name: &str, containers: usize) -> Result<Self> {
        let mut tree = Self {
            parents: ["memory", "cpuacct"]
                .iter()
                .map(|h| root.join(h).join(name))
                .collect(),
            pods: Vec::new(),
        };
        // What an interrupted run left behind would make mkdir fail.
        tree.remove();
        let pod_count = containers.div_ceil(SYNTHETIC_CONTAINERS_PER_POD);
        for i in 0..pod_count {
            let first = i * SYNTHETIC_CONTAINERS_PER_POD;
            let ids: Vec<String> = (first..containers.min(first + SYNTHETIC_CONTAINERS_PER_POD))
                .map(|j| format!("c{j}"))
                .collect();
            tree.pods.push(PodStatsInput {
                namespace: "ringlet-io-bench".to_owned(),
                name: format!("pod{i}"),
                uid: PodUid::new(format!("synthetic-{i}")),
                start_time: timestamp_from_unix_nanos(0),
                cgroup: format!("/{name}/pod{i}"),
                containers: ids
                    .iter()
                    .map(|id| ContainerStatsInput {
                        name: id.clone(),
                        id: ContainerId::new(id.clone()),
                        start_time: timestamp_from_unix_nanos(0),
                    })
                    .collect(),
            });
        }
        for parent in &tree.parents {
            fs::create_dir(parent).with_context(|| format!("creating {}", parent.display()))?;
            for pod in &tree.pods {
                let pod_dir = parent.join(pod.cgroup.trim_start_matches(&format!("/{name}/")));
                fs::create_dir(&pod_dir)
                    .with_context(|| format!("creating {}", pod_dir.display()))?;
                for container in &pod.containers {
                    let dir = pod_dir.join(container.id.as_str());
                    fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
                }
            }
        }
        Ok(tree)
    }

    /// Best effort: a cgroup directory is removed with rmdir, children first.
    fn remove(&self) {
        for parent in &self.parents {
            remove_cgroup_tree(parent);
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(children) = fs::read_dir(dir) {
        for child in children.flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&child.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

impl Drop for SyntheticTree {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The runtime manager's view of the agent; a status query needs none of it.
struct BenchHelper;

impl RuntimeHelper for BenchHelper {
    fn pod_cgroup_parent(&self, _pod: &k8s_openapi::api::core::v1::Pod) -> Result<String, String> {
        Err("the io bench creates no pods".to_owned())
    }

    fn pod_dir(&self, uid: &PodUid) -> PathBuf {
        Path::new("/tmp/ringlet-io-bench/pods").join(uid.as_str())
    }

    fn node_name(&self) -> &'static str {
        "ringlet-io-bench"
    }

    fn pod_log_dir(&self, namespace: &str, name: &str, uid: &PodUid) -> PathBuf {
        Path::new("/var/log/pods").join(format!("{namespace}_{name}_{}", uid.as_str()))
    }
}
