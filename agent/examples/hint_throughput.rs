//! The kernel → userspace half of the eBPF PLEG under churn, without containerd: loads the agent's
//! eBPF programs on a private pods' parent cgroup, creates container cgroups with real processes
//! below it (create, run, exit, rmdir), and reports hint throughput, losses and the kernel → reader
//! latency as JSON on stdout. `cargo xtask bench pleg` builds and runs it; it corresponds to no
//! kubelet package.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ringlet::ebpf::{self, EbpfOptions};
use ringlet::pleg::{Hint, HintKind, monotonic_now_ns};
use serde_json::json;
use tokio::sync::mpsc;

/// How long the reader waits for more hints after the last container is gone.
const QUIET: Duration = Duration::from_secs(1);
const HINT_CHANNEL: usize = 1 << 16;

#[derive(Parser)]
struct Args {
    /// A private pods' parent in the cgroup2 tree, so no running agent sees the churn.
    #[arg(long, default_value = "/sys/fs/cgroup/unified/ringlet-bench-hints")]
    parent: PathBuf,
    /// A private pin directory, so no running agent's pins are touched.
    #[arg(long, default_value = "/sys/fs/bpf/ringlet-bench-hints")]
    pin_dir: PathBuf,
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Container cgroups created in all.
    #[arg(long, default_value_t = 2000)]
    containers: usize,
    /// Container cgroups alive at once.
    #[arg(long, default_value_t = 500)]
    concurrency: usize,
    /// How long each container's process lives, in seconds.
    #[arg(long, default_value_t = 1.0)]
    hold: f64,
    #[arg(long, default_value_t = ebpf::DEFAULT_RING_BUFFER_BYTES)]
    ring_buffer_bytes: u32,
}

fn pod_dir(parent: &Path, pod: usize) -> PathBuf {
    parent.join(format!(
        "besteffort/pod{pod:08x}-beef-0000-0000-000000000000"
    ))
}

struct Churn {
    next: AtomicUsize,
    live: AtomicUsize,
    peak: AtomicUsize,
    failures: AtomicUsize,
}

/// One container: its cgroup, a process moved into it before it execs into a new pid namespace,
/// the exit, and the rmdir.
fn run_container(args: &Args, index: usize, churn: &Churn) -> Result<()> {
    let dir = pod_dir(&args.parent, index % args.pods).join(format!("{:064x}", index + 1));
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let live = churn.live.fetch_add(1, Ordering::Relaxed) + 1;
    churn.peak.fetch_max(live, Ordering::Relaxed);
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec unshare --pid --fork sh -c 'sleep {}; exit {}'",
        dir.display(),
        args.hold,
        index % 100 + 1
    );
    let status = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    churn.live.fetch_sub(1, Ordering::Relaxed);
    // The cgroup empties a moment after the last task is reaped: retry rmdir briefly.
    let mut removed = std::fs::remove_dir(&dir);
    for _ in 0..100 {
        if removed.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
        removed = std::fs::remove_dir(&dir);
    }
    removed.with_context(|| format!("removing {}", dir.display()))?;
    let status = status.context("running a container process")?;
    if status.code() != Some(i32::try_from(index % 100 + 1)?) {
        bail!("container {index} exited with {status}");
    }
    Ok(())
}

fn setup(args: &Args) -> Result<()> {
    for pod in 0..args.pods {
        let dir = pod_dir(&args.parent, pod);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    Ok(())
}

/// Removes every cgroup below the private parent (deepest first) and the parent itself.
fn teardown(parent: &Path) {
    fn remove(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    remove(&entry.path());
                }
            }
        }
        if let Err(error) = std::fs::remove_dir(dir) {
            eprintln!("removing {}: {error}", dir.display());
        }
    }
    if parent.exists() {
        remove(parent);
    }
}

fn kind_name(kind: HintKind) -> &'static str {
    match kind {
        HintKind::CgroupCreated => "cgroup_created",
        HintKind::CgroupRemoved => "cgroup_removed",
        HintKind::Started => "started",
        HintKind::Died => "died",
        HintKind::OomKilled => "oom_killed",
    }
}

#[allow(clippy::cast_precision_loss)]
fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return f64::NAN;
    }
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rank = (p / 100.0 * sorted_ns.len() as f64).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1] as f64 / 1000.0
}

#[allow(clippy::cast_precision_loss, clippy::too_many_lines)]
async fn measure(args: Arc<Args>) -> Result<serde_json::Value> {
    let (tx, mut rx) = mpsc::channel(HINT_CHANNEL);
    let mut options = EbpfOptions::new(args.parent.clone());
    options.pin_dir.clone_from(&args.pin_dir);
    options.ring_buffer_bytes = args.ring_buffer_bytes;
    let handle = ebpf::start(options, tx, |_| {}).context("starting the eBPF hint source")?;
    setup(&args)?;

    let churn = Arc::new(Churn {
        next: AtomicUsize::new(0),
        live: AtomicUsize::new(0),
        peak: AtomicUsize::new(0),
        failures: AtomicUsize::new(0),
    });
    let done = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let workers: Vec<_> = (0..args.concurrency.min(args.containers))
        .map(|_| {
            let (args, churn) = (Arc::clone(&args), Arc::clone(&churn));
            std::thread::spawn(move || {
                loop {
                    let index = churn.next.fetch_add(1, Ordering::Relaxed);
                    if index >= args.containers {
                        return;
                    }
                    if let Err(error) = run_container(&args, index, &churn) {
                        eprintln!("{error:#}");
                        churn.failures.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    let waiter = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            for worker in workers {
                // A panicking worker only loses its own containers, counted as missing hints.
                let _ = worker.join();
            }
            done.store(true, Ordering::Release);
        })
    };

    let mut kinds: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut latencies = Vec::with_capacity(args.containers * 4);
    let mut resyncs = 0u64;
    let mut last_hint = started;
    loop {
        match tokio::time::timeout(Duration::from_millis(100), rx.recv()).await {
            Ok(Some(Hint::Pod(hint))) => {
                latencies.push(monotonic_now_ns().saturating_sub(hint.kernel_time_ns));
                *kinds.entry(kind_name(hint.kind)).or_default() += 1;
                last_hint = Instant::now();
            }
            Ok(Some(Hint::Resync { .. })) => resyncs += 1,
            Ok(None) => bail!("the eBPF reader stopped"),
            Err(_) => {}
        }
        if done.load(Ordering::Acquire) && last_hint.elapsed() > QUIET {
            break;
        }
    }
    let churn_secs = last_hint.duration_since(started).as_secs_f64();
    let _ = waiter.join();
    latencies.sort_unstable();
    let hints = latencies.len();
    Ok(json!({
        "pods": args.pods,
        "containers": args.containers,
        "concurrency": args.concurrency,
        "hold_s": args.hold,
        "ring_buffer_bytes": args.ring_buffer_bytes,
        "peak_live_cgroups": churn.peak.load(Ordering::Relaxed),
        "container_failures": churn.failures.load(Ordering::Relaxed),
        "duration_s": churn_secs,
        "hints": hints,
        "hints_by_kind": kinds,
        "hints_per_s": hints as f64 / churn_secs,
        "kernel_drops": handle.dropped_events(),
        "events_read": handle.events_read(),
        "hints_lost": handle.hints_lost(),
        "resyncs": resyncs,
        "latency_us": {
            "median": percentile_us(&latencies, 50.0),
            "p99": percentile_us(&latencies, 99.0),
            "p999": percentile_us(&latencies, 99.9),
            "max": percentile_us(&latencies, 100.0),
        },
    }))
}

fn main() -> Result<()> {
    let args = Arc::new(Args::parse());
    if args.pods == 0 || args.containers == 0 || args.concurrency == 0 {
        bail!("--pods, --containers and --concurrency must be above 0");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    let result = runtime.block_on(measure(Arc::clone(&args)));
    teardown(&args.parent);
    println!("{}", serde_json::to_string_pretty(&result?)?);
    Ok(())
}
