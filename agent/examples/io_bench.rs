//! The agent's CRI round trips and cgroup file sweeps on one I/O engine: `Version`,
//! `ListContainers`, `PodSandboxStatus` and a targeted relist of one pod (`get_pod_status` through
//! the runtime manager) against a real containerd, then `read_small_files` over the cgroup files a
//! `/stats/summary` scrape reads for the running bench pods and for a synthetic tree of container
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
use ringlet::container::{PodUid, Runtime};
use ringlet::events::Recorder;
use ringlet::io::{self, IoEngine, IoEngineSetting};
use ringlet::kuberuntime::{
    CriClient, KubeGenericRuntimeManager, RuntimeHelper, RuntimeSettings, labels,
};
use ringlet_proto::runtime::v1 as cri;
use serde_json::{Value, json};

const CRI_TIMEOUT: Duration = Duration::from_secs(10);
/// The v1 files a `/stats/summary` scrape reads per cgroup, by hierarchy.
const CPUACCT_FILES: &[&str] = &["cpuacct.usage"];
const MEMORY_FILES: &[&str] = &[
    "memory.usage_in_bytes",
    "memory.limit_in_bytes",
    "memory.stat",
];
const QOS_CLASSES: &[&str] = &["besteffort", "burstable", ""];

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
    /// Synthetic container cgroups to create for the large sweep.
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
    let real = bench_cgroup_files(&args.cgroup_root, &containers)?;
    let real_case = format!(
        "{} pod + container cgroups of the bench pods ({} files)",
        real.cgroups,
        real.files.len()
    );
    cases.push(sweep_case(engine, &real_case, &real.files, sweeps).await?);

    let tree = SyntheticTree::create(&args.cgroup_root, &args.synthetic_name, args.synthetic)?;
    let synthetic_case = format!(
        "{} synthetic container cgroups ({} files)",
        args.synthetic,
        tree.files.len()
    );
    cases.push(sweep_case(engine, &synthetic_case, &tree.files, sweeps).await?);
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
    measure(engine.as_str(), "cgroup sweep", case, sweeps, || async {
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
    })
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

struct CgroupFiles {
    cgroups: usize,
    files: Vec<PathBuf>,
}

/// The files a summary scrape reads for every bench pod's cgroup and each of its containers'.
fn bench_cgroup_files(root: &Path, containers: &[cri::Container]) -> Result<CgroupFiles> {
    let mut pods: HashMap<String, Vec<&str>> = HashMap::new();
    for container in containers {
        let uid = container
            .labels
            .get(labels::POD_UID)
            .with_context(|| format!("container {} has no pod uid label", container.id))?;
        pods.entry(uid.clone()).or_default().push(&container.id);
    }
    let mut relative = Vec::new();
    for (uid, ids) in &pods {
        let pod = QOS_CLASSES
            .iter()
            .map(|qos| Path::new("kubepods").join(qos).join(format!("pod{uid}")))
            .find(|pod| root.join("memory").join(pod).is_dir())
            .with_context(|| format!("no memory cgroup of pod {uid} under kubepods"))?;
        relative.push(pod.clone());
        relative.extend(ids.iter().map(|id| pod.join(id)));
    }
    Ok(CgroupFiles {
        cgroups: relative.len(),
        files: files_of(root, &relative),
    })
}

fn files_of(root: &Path, cgroups: &[PathBuf]) -> Vec<PathBuf> {
    let mut files = Vec::with_capacity(cgroups.len() * 4);
    for cgroup in cgroups {
        files.extend(
            CPUACCT_FILES
                .iter()
                .map(|f| root.join("cpuacct").join(cgroup).join(f)),
        );
        files.extend(
            MEMORY_FILES
                .iter()
                .map(|f| root.join("memory").join(cgroup).join(f)),
        );
    }
    files
}

/// `<hierarchy>/<name>/c<i>` in the `memory` and `cpuacct` hierarchies; removed on drop.
struct SyntheticTree {
    parents: Vec<PathBuf>,
    files: Vec<PathBuf>,
}

impl SyntheticTree {
    fn create(root: &Path, name: &str, count: usize) -> Result<Self> {
        let mut tree = Self {
            parents: ["memory", "cpuacct"]
                .iter()
                .map(|h| root.join(h).join(name))
                .collect(),
            files: Vec::new(),
        };
        // What an interrupted run left behind would make mkdir fail.
        tree.remove();
        for parent in &tree.parents {
            fs::create_dir(parent).with_context(|| format!("creating {}", parent.display()))?;
            for i in 0..count {
                let dir = parent.join(format!("c{i}"));
                fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            }
        }
        let cgroups: Vec<PathBuf> = (0..count)
            .map(|i| Path::new(name).join(format!("c{i}")))
            .collect();
        tree.files = files_of(root, &cgroups);
        Ok(tree)
    }

    /// Best effort: a cgroup directory is removed with rmdir, children first.
    fn remove(&self) {
        for parent in &self.parents {
            if let Ok(children) = fs::read_dir(parent) {
                for child in children.flatten() {
                    if child.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = fs::remove_dir(child.path());
                    }
                }
            }
            let _ = fs::remove_dir(parent);
        }
    }
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
