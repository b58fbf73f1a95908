//! `cargo xtask bench startup`: how fast ringlet brings N static pods to Running, and how fast a
//! container's exit shows up in the pod status. Both are observed from outside, on the read-only
//! `/pods` endpoint polled every 10 ms, so the numbers include everything a client would see.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;

use crate::benchkit::{
    self, Agent, cleanup, free_port, fresh_run_dir, git_commit, machine, now_utc, percentile,
    runtime_containers, sleep_pod_manifest, time_exits, wait_all_running,
};
use crate::{lab, workspace_root};

/// Bench pods live in their own namespace so they are easy to tell from anything else on the node.
const NAMESPACE: &str = "ringlet-bench";
const POLL: Duration = Duration::from_millis(10);

#[derive(clap::Args)]
pub struct StartupArgs {
    /// Pod counts to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,50")]
    pods: Vec<usize>,
    /// How many container exits to time for each pod count.
    #[arg(long, default_value_t = 10)]
    exits: usize,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Extra flags passed to ringlet, after `--` (for example `-- --pleg=relist`).
    #[arg(last = true)]
    ringlet_args: Vec<String>,
}

#[derive(Serialize)]
struct Metric {
    pods: usize,
    #[serde(rename = "metric")]
    name: &'static str,
    median_ms: f64,
    p99_ms: f64,
    samples: usize,
    samples_ms: Vec<f64>,
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    ringlet_args: Vec<String>,
    machine: benchkit::Machine,
    metrics: Vec<Metric>,
}

pub fn startup(args: &StartupArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) {
        bail!("--pods needs at least one pod count, each above 0");
    }
    lab::up()?;
    let root = workspace_root();
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;

    let mut metrics = Vec::new();
    for &pods in &args.pods {
        println!("== {pods} pods");
        metrics.extend(run_startup(&binary, pods, args)?);
    }
    let report = Report {
        benchmark: "startup",
        date: now_utc()?,
        commit: git_commit(&root),
        ringlet_args: args.ringlet_args.clone(),
        machine: machine()?,
        metrics,
    };
    benchkit::write_results(&root, "startup", &report, &markdown(&report))
}

fn run_startup(binary: &Path, pods: usize, args: &StartupArgs) -> Result<Vec<Metric>> {
    let (run_dir, manifests, root_dir) = fresh_run_dir(&format!("startup-{pods}"))?;
    for i in 0..pods {
        fs::write(
            manifests.join(format!("bench-{i}.yaml")),
            sleep_pod_manifest(&format!("bench-{i}"), NAMESPACE),
        )?;
    }
    if !runtime_containers(NAMESPACE)?.is_empty() {
        bail!("containers of namespace {NAMESPACE} are still in containerd from an earlier run");
    }

    let port = free_port()?;
    let log = run_dir.join("ringlet.log");
    let started = Instant::now();
    let mut agent = Agent::spawn(
        Command::new(binary)
            .args(ringlet_tests::LAB_AGENT_FLAGS)
            .arg("--pod-manifest-path")
            .arg(&manifests)
            .arg("--root-dir")
            .arg(&root_dir)
            .args(["--read-only-port", &port.to_string()])
            .args(["--healthz-port", &free_port()?.to_string()])
            .args(["--port", &free_port()?.to_string()])
            .args(["--hostname-override", "ringlet-bench"])
            .args(&args.ringlet_args),
        log,
    )?;

    let running = wait_all_running(&mut agent, port, pods, started, NAMESPACE)?;
    let mut per_pod: Vec<f64> = running.values().copied().collect();
    let all = per_pod.iter().copied().fold(0.0, f64::max);
    println!("all {pods} pods running after {all:.1} ms");

    let exits = time_exits(
        &mut agent,
        port,
        NAMESPACE,
        args.exits.min(pods),
        POLL,
        Duration::ZERO,
        Duration::ZERO,
    )?;
    println!("{} exits timed", exits.len());

    cleanup(&manifests, NAMESPACE)?;
    agent.stop();

    per_pod.sort_by(f64::total_cmp);
    Ok(vec![
        metric(pods, "all pods running after start", vec![all]),
        metric(pods, "pod running after start", per_pod),
        metric(pods, "container exit to status change", exits),
    ])
}

fn metric(pods: usize, name: &'static str, mut samples_ms: Vec<f64>) -> Metric {
    samples_ms.sort_by(f64::total_cmp);
    Metric {
        pods,
        name,
        median_ms: percentile(&samples_ms, 50.0),
        p99_ms: percentile(&samples_ms, 99.0),
        samples: samples_ms.len(),
        samples_ms,
    }
}

fn markdown(report: &Report) -> String {
    let m = &report.machine;
    let mut out = format!(
        "# startup benchmark\n\n\
         ringlet commit `{}`, {}, extra flags `{}`\n\n\
         machine: {} × {}, {} memory, Linux {}, {}\n\n\
         `/pods` polled every {} ms; an exit is a SIGKILL of the container's main process.\n\n\
         | pods | metric | median ms | p99 ms | samples |\n|---:|---|---:|---:|---:|\n",
        report.commit,
        report.date,
        report.ringlet_args.join(" "),
        m.cpus,
        m.cpu,
        m.memory,
        m.kernel,
        m.containerd,
        POLL.as_millis(),
    );
    for metric in &report.metrics {
        let _ = writeln!(
            out,
            "| {} | {} | {:.1} | {:.1} | {} |",
            metric.pods, metric.name, metric.median_ms, metric.p99_ms, metric.samples
        );
    }
    out
}
