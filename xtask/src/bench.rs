//! `cargo xtask bench startup`: how fast ringlet brings N static pods to Running, and how fast a
//! container's exit shows up in the pod status. Both are observed from outside, on the read-only
//! `/pods` endpoint polled every 10 ms, so the numbers include everything a client would see.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::Value;

use crate::{cargo, cmd, http, lab, workspace_root};

/// Bench pods live in their own namespace so they are easy to tell from anything else on the node.
const NAMESPACE: &str = "ringlet-bench";
const POLL: Duration = Duration::from_millis(10);
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
const CLEANUP_TIMEOUT: Duration = Duration::from_mins(3);
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

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
    machine: Machine,
    metrics: Vec<Metric>,
}

#[derive(Serialize)]
struct Machine {
    cpu: String,
    cpus: usize,
    memory: String,
    kernel: String,
    containerd: String,
}

pub fn startup(args: &StartupArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) {
        bail!("--pods needs at least one pod count, each above 0");
    }
    lab::up()?;
    let root = workspace_root();
    let binary = if let Some(binary) = &args.binary {
        binary.clone()
    } else {
        cmd::run(
            cargo()
                .current_dir(&root)
                .args(["build", "--release", "-p", "ringlet"]),
        )?;
        root.join("target/release/ringlet")
    };

    let mut metrics = Vec::new();
    for &pods in &args.pods {
        println!("== {pods} pods");
        metrics.extend(run_startup(&binary, pods, args)?);
    }
    let report = Report {
        benchmark: "startup",
        date: cmd::output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))?
            .trim()
            .to_owned(),
        commit: git_commit(&root),
        ringlet_args: args.ringlet_args.clone(),
        machine: machine()?,
        metrics,
    };
    let out_dir = root.join("bench/results");
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let json_path = out_dir.join("startup.json");
    fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    let md = markdown(&report);
    let md_path = out_dir.join("startup.md");
    fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    println!(
        "{md}\nwrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

/// A running ringlet that is stopped (SIGTERM, then SIGKILL) however the run ends.
struct Agent {
    child: Child,
    log: PathBuf,
    stopped: bool,
}

impl Agent {
    fn exited(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("ringlet exited with {status}; see {}", self.log.display());
        }
        Ok(())
    }

    fn stop(&mut self) {
        // Once reaped, the pid may belong to another process: never signal it twice.
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        cmd::signal(self.child.id(), libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(POLL);
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

fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr()?.port())
}

fn pod_manifest(i: usize) -> String {
    // sleep ignores SIGTERM as PID 1: a short grace period keeps the cleanup from waiting 30 s per pod.
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: bench-{i}
  namespace: {NAMESPACE}
spec:
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

fn run_startup(binary: &Path, pods: usize, args: &StartupArgs) -> Result<Vec<Metric>> {
    let run_dir = Path::new(lab::LAB_DIR).join(format!("bench/startup-{pods}"));
    if run_dir.exists() {
        fs::remove_dir_all(&run_dir).with_context(|| format!("removing {}", run_dir.display()))?;
    }
    let manifests = run_dir.join("manifests");
    let root_dir = run_dir.join("root");
    fs::create_dir_all(&manifests)?;
    fs::create_dir_all(&root_dir)?;
    for i in 0..pods {
        fs::write(manifests.join(format!("bench-{i}.yaml")), pod_manifest(i))?;
    }
    if !runtime_containers()?.is_empty() {
        bail!("containers of namespace {NAMESPACE} are still in containerd from an earlier run");
    }

    let port = free_port()?;
    let log = run_dir.join("ringlet.log");
    let log_file = fs::File::create(&log)?;
    let started = Instant::now();
    let child = Command::new(binary)
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(&root_dir)
        .args(["--read-only-port", &port.to_string()])
        .args(["--healthz-port", &free_port()?.to_string()])
        .args(["--hostname-override", "ringlet-bench"])
        .args(&args.ringlet_args)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    let mut agent = Agent {
        child,
        log,
        stopped: false,
    };

    let running = wait_all_running(&mut agent, port, pods, started)?;
    let mut per_pod: Vec<f64> = running.values().copied().collect();
    let all = per_pod.iter().copied().fold(0.0, f64::max);
    println!("all {pods} pods running after {all:.1} ms");

    let exits = time_exits(&mut agent, port, args.exits.min(pods))?;
    println!("{} exits timed", exits.len());

    cleanup(&manifests)?;
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

/// Nearest-rank percentile of sorted samples (NaN when there are none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The bench pods on `/pods`, or `None` while the server is not answering yet.
fn bench_pods(port: u16) -> Option<Vec<Value>> {
    let body = http::get(port, "/pods").ok()?;
    let list: Value = serde_json::from_slice(&body).ok()?;
    Some(
        list["items"]
            .as_array()?
            .iter()
            .filter(|p| p["metadata"]["namespace"] == NAMESPACE)
            .cloned()
            .collect(),
    )
}

fn all_containers_running(pod: &Value) -> bool {
    let wanted = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    pod["status"]["containerStatuses"]
        .as_array()
        .is_some_and(|s| s.len() == wanted && s.iter().all(|c| c["state"]["running"].is_object()))
}

/// Polls `/pods` until every bench pod runs; returns each pod's time to Running since `started`.
fn wait_all_running(
    agent: &mut Agent,
    port: u16,
    pods: usize,
    started: Instant,
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
        for pod in bench_pods(port).unwrap_or_default() {
            if all_containers_running(&pod)
                && let Some(name) = pod["metadata"]["name"].as_str()
            {
                running.entry(name.to_owned()).or_insert(now);
            }
        }
        std::thread::sleep(POLL);
    }
    Ok(running)
}

/// The first container of a bench pod: (pod name, container id, restart count).
fn first_container(pod: &Value) -> Option<(String, String, u64)> {
    let status = &pod["status"]["containerStatuses"][0];
    let id = status["containerID"].as_str()?;
    let id = id.split_once("://").map_or(id, |(_, id)| id);
    Some((
        pod["metadata"]["name"].as_str()?.to_owned(),
        id.to_owned(),
        status["restartCount"].as_u64().unwrap_or(0),
    ))
}

/// Task id -> pid of every running task in containerd's CRI namespace.
fn task_pids() -> Result<HashMap<String, u32>> {
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

/// SIGKILLs the main process of `count` bench containers, one at a time, and times how long `/pods`
/// takes to show each exit (the container terminated, restarted, or replaced).
fn time_exits(agent: &mut Agent, port: u16, count: usize) -> Result<Vec<f64>> {
    let mut pods = bench_pods(port).context("reading /pods")?;
    pods.sort_by_key(|p| p["metadata"]["name"].as_str().map(str::to_owned));
    let task_pid = task_pids()?;
    let mut samples = Vec::new();
    for (name, id, restarts) in pods.iter().filter_map(first_container).take(count) {
        let Some(&pid) = task_pid.get(&id) else {
            println!("no running task for {name} ({id}); skipped");
            continue;
        };
        let killed = Instant::now();
        if !cmd::signal(pid, libc::SIGKILL) {
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
            let changed = bench_pods(port).unwrap_or_default().iter().any(|p| {
                p["metadata"]["name"] == name.as_str()
                    && (!all_containers_running(p)
                        || first_container(p).is_some_and(|(_, i, r)| i != id || r != restarts))
            });
            if changed {
                samples.push(ms(killed.elapsed()));
                break;
            }
            std::thread::sleep(POLL);
        }
    }
    Ok(samples)
}

/// Containers (sandboxes included) that containerd still holds for bench pods.
fn runtime_containers() -> Result<Vec<String>> {
    let filter = format!("labels.\"io.kubernetes.pod.namespace\"=={NAMESPACE}");
    Ok(
        cmd::output(lab::ctr().args(["containers", "ls", "-q", &filter]))?
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

/// Removes the manifests and waits until ringlet has removed every bench container from containerd.
fn cleanup(manifests: &Path) -> Result<()> {
    for entry in fs::read_dir(manifests)? {
        fs::remove_file(entry?.path())?;
    }
    let started = Instant::now();
    loop {
        let left = runtime_containers()?;
        if left.is_empty() {
            println!("pods gone after {:.1} s", started.elapsed().as_secs_f64());
            return Ok(());
        }
        if started.elapsed() > CLEANUP_TIMEOUT {
            bail!(
                "{} bench containers still in containerd {CLEANUP_TIMEOUT:?} after removing the manifests",
                left.len()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn git_commit(root: &Path) -> String {
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

fn machine() -> Result<Machine> {
    let version = cmd::output(Command::new("containerd").arg("--version"))?;
    Ok(Machine {
        cpu: proc_field("/proc/cpuinfo", "model name"),
        cpus: std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        memory: proc_field("/proc/meminfo", "MemTotal"),
        kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned()),
        containerd: version.trim().to_owned(),
    })
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn percentile_uses_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert!((percentile(&samples, 50.0) - 50.0).abs() < f64::EPSILON);
        assert!((percentile(&samples, 99.0) - 99.0).abs() < f64::EPSILON);
        assert!((percentile(&[7.0], 99.0) - 7.0).abs() < f64::EPSILON);
        assert!(percentile(&[], 50.0).is_nan());
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
