//! `cargo xtask bench probes`: what probes cost. The same static pods — `--pods` (100) busybox
//! `httpd`s, each with an HTTP readiness probe and a TCP liveness probe at `periodSeconds: 1` — run
//! under ringlet and then under the upstream kubelet (standalone, `staticPodPath`, on the same
//! containerd). Once every pod is Ready and a settle time has passed, a window measures the agent's
//! CPU (utime + stime) and, from `/metrics/probes` before and after, the probes done and their
//! latency (p50/p99 interpolated in `prober_probe_duration_seconds`' buckets, which both agents
//! share). Results go to `bench/results/probes.{json,md}`.
//!
//! The kubelet changes the host when it starts (sysctls, iptables canary chains, directories and
//! `QoS` cgroups); what it changed is put back afterwards, also after a run that was killed. It
//! also stops every pod in containerd it does not know, so it only starts while containerd holds no
//! containers at all.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use serde_json::Value;

use crate::benchkit::{
    self, Agent, bench_pods, cleanup, free_port, fresh_run_dir, git_commit, histogram_quantile,
    machine, now_utc, process_cpu_seconds, runtime_containers, sorted_buckets,
};
use crate::kubelet_host::{HostGuard, containers_of_others, find_kubelet, spawn_standalone};
use crate::{cmd, http, lab, workspace_root};

const NAMESPACE: &str = "ringlet-bench-probes";
const NODE: &str = "bench-probes";
const IMAGE: &str = "docker.io/library/busybox:1.35";
const READY_POLL: Duration = Duration::from_millis(200);
const DURATION_BUCKETS: &str = "prober_probe_duration_seconds_bucket";
const PROBE_TOTAL: &str = "prober_probe_total";

#[derive(clap::Args)]
pub struct ProbesArgs {
    /// Static pods, each with two probes at periodSeconds 1.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Seconds between every pod Ready and the measurement window.
    #[arg(long, default_value_t = 15)]
    settle: u64,
    /// Length of the measurement window, in seconds.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Measure ringlet only.
    #[arg(long)]
    skip_kubelet: bool,
    /// Extra flags passed to ringlet, after `--`.
    #[arg(last = true)]
    ringlet_args: Vec<String>,
}

#[derive(Serialize)]
struct Latency {
    /// `Liveness`, `Readiness`, or `all`.
    probe_type: String,
    p50_ms: f64,
    p99_ms: f64,
    /// Timed probes in the window (the agents time successful and unknown probes only).
    timed: u64,
}

#[derive(Serialize)]
struct Side {
    agent: &'static str,
    version: String,
    skipped: Option<String>,
    all_ready_after_s: Option<f64>,
    /// Agent CPU (user + system) per wall second in the window.
    cpu_cores: Option<f64>,
    probes_per_second: Option<f64>,
    failed_probes: Option<u64>,
    latency: Vec<Latency>,
}

impl Side {
    fn skipped(agent: &'static str, version: String, reason: String) -> Self {
        Self {
            agent,
            version,
            skipped: Some(reason),
            all_ready_after_s: None,
            cpu_cores: None,
            probes_per_second: None,
            failed_probes: None,
            latency: Vec::new(),
        }
    }
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    machine: benchkit::Machine,
    /// `/proc/loadavg` (1, 5, 15 min) before each side started.
    load_before: Vec<(String, [f64; 3])>,
    pods: usize,
    probes: &'static str,
    settle_seconds: u64,
    window_seconds: u64,
    ringlet_args: Vec<String>,
    sides: Vec<Side>,
}

pub fn probes(args: &ProbesArgs) -> Result<()> {
    if args.pods == 0 || args.window == 0 {
        bail!("--pods and --window must be above 0");
    }
    lab::up()?;
    let root = workspace_root();
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    let mut load_before = Vec::new();
    let mut sides = Vec::new();

    println!("== ringlet");
    benchkit::wait_for_free_pins()?;
    load_before.push(("ringlet".to_owned(), loadavg()?));
    let version = cmd::output(Command::new(&binary).arg("--version"))
        .map_or_else(|_| "unknown".to_owned(), |v| v.trim().to_owned());
    sides.push(run_side(
        "ringlet",
        version,
        |run_dir, root_dir, manifests, port| {
            let mut command = Command::new(&binary);
            command
                .args(ringlet_tests::LAB_AGENT_FLAGS)
                .arg("--pod-manifest-path")
                .arg(manifests)
                .arg("--root-dir")
                .arg(root_dir)
                .args(["--read-only-port", &port.to_string()])
                .args(["--healthz-port", &free_port()?.to_string()])
                .args(["--port", &free_port()?.to_string()])
                .args(["--hostname-override", NODE])
                .arg("--events-socket")
                .arg(run_dir.join("events.sock"))
                .args(&args.ringlet_args);
            Agent::spawn(&mut command, run_dir.join("ringlet.log"))
        },
        args,
    )?);

    if args.skip_kubelet {
        sides.push(Side::skipped(
            "kubelet",
            String::new(),
            "--skip-kubelet".to_owned(),
        ));
    } else {
        println!("== upstream kubelet");
        match find_kubelet() {
            Err(reason) => {
                println!("skipping the kubelet: {reason}");
                sides.push(Side::skipped("kubelet", String::new(), reason));
            }
            Ok((kubelet, version)) => {
                // The kubelet stops every pod it does not know: wait until containerd holds none.
                benchkit::wait_until_quiet(containers_of_others)?;
                load_before.push(("kubelet".to_owned(), loadavg()?));
                let host = HostGuard::take()?;
                let side = run_side(
                    "kubelet",
                    version,
                    |run_dir, root_dir, manifests, port| {
                        spawn_standalone(&kubelet, NODE, run_dir, root_dir, manifests, port, false)
                    },
                    args,
                );
                host.restore()?;
                sides.push(side?);
            }
        }
    }

    let report = Report {
        benchmark: "probes",
        date: now_utc()?,
        commit: git_commit(&root),
        machine: machine()?,
        load_before,
        pods: args.pods,
        probes: "readiness httpGet /healthz and liveness tcpSocket, both on the pod's busybox \
                 httpd, periodSeconds 1",
        settle_seconds: args.settle,
        window_seconds: args.window,
        ringlet_args: args.ringlet_args.clone(),
        sides,
    };
    benchkit::write_results(&root, "probes", &report, &markdown(&report))
}

/// The bench pod `name`: busybox httpd with an HTTP readiness and a TCP liveness probe.
fn probe_pod_manifest(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {NAMESPACE}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  dnsPolicy: Default
  containers:
  - name: web
    image: {IMAGE}
    imagePullPolicy: IfNotPresent
    command: [\"sh\", \"-c\", \"mkdir -p /www && echo ok > /www/healthz && exec httpd -f -p 8080 -h /www\"]
    readinessProbe:
      httpGet: {{path: /healthz, port: 8080}}
      periodSeconds: 1
    livenessProbe:
      tcpSocket: {{port: 8080}}
      periodSeconds: 1
"
    )
}

/// One agent: pods, Ready, settle, the window, cleanup (whatever happened in between).
fn run_side(
    agent_name: &'static str,
    version: String,
    spawn: impl Fn(&Path, &Path, &Path, u16) -> Result<Agent>,
    args: &ProbesArgs,
) -> Result<Side> {
    let (run_dir, manifests, root_dir) = fresh_run_dir(&format!("probes-{agent_name}"))?;
    if !runtime_containers(NAMESPACE)?.is_empty() {
        bail!("containers of namespace {NAMESPACE} are still in containerd from an earlier run");
    }
    for i in 0..args.pods {
        let name = format!("probe-{i}");
        fs::write(
            manifests.join(format!("{name}.yaml")),
            probe_pod_manifest(&name),
        )?;
    }
    let port = free_port()?;
    let started = Instant::now();
    let mut agent = spawn(&run_dir, &root_dir, &manifests, port)?;
    println!(
        "{agent_name} started (pid {}), log {}",
        agent.pid(),
        agent.log.display()
    );
    let measured = measure(&mut agent, port, started, args);
    let cleaned = cleanup(&manifests, NAMESPACE);
    agent.stop();
    let (ready_after, window) = measured?;
    cleaned?;
    let window_s = window.seconds;
    let failed = window.probes.failed;
    #[allow(
        clippy::cast_precision_loss,
        reason = "probe counts stay far below 2^52"
    )]
    let probes = window.probes.total() as f64;
    Ok(Side {
        agent: agent_name,
        version,
        skipped: None,
        all_ready_after_s: Some(ready_after),
        cpu_cores: Some(window.cpu_seconds / window_s),
        probes_per_second: Some(probes / window_s),
        failed_probes: Some(failed),
        latency: window.latency(),
    })
}

/// What the window saw.
struct Window {
    seconds: f64,
    cpu_seconds: f64,
    probes: Counts,
    buckets: Histograms,
}

impl Window {
    fn latency(&self) -> Vec<Latency> {
        let mut all = BTreeMap::<String, f64>::new();
        let mut out = Vec::new();
        for (probe_type, buckets) in &self.buckets.0 {
            for (le, count) in buckets {
                *all.entry(le.clone()).or_default() += count;
            }
            out.push(latency(probe_type, buckets));
        }
        out.push(latency("all", &all));
        out
    }
}

fn latency(probe_type: &str, buckets: &BTreeMap<String, f64>) -> Latency {
    let sorted = sorted_buckets(buckets);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let timed = sorted.last().map_or(0, |(_, c)| c.round() as u64);
    Latency {
        probe_type: probe_type.to_owned(),
        p50_ms: histogram_quantile(&sorted, 0.5) * 1000.0,
        p99_ms: histogram_quantile(&sorted, 0.99) * 1000.0,
        timed,
    }
}

/// Waits for every pod Ready, settles, and measures the window; returns seconds to all Ready.
fn measure(
    agent: &mut Agent,
    port: u16,
    started: Instant,
    args: &ProbesArgs,
) -> Result<(f64, Window)> {
    let timeout = Duration::from_mins(2) + Duration::from_secs(2) * u32::try_from(args.pods)?;
    loop {
        agent.exited()?;
        let ready = bench_pods(port, NAMESPACE)
            .unwrap_or_default()
            .iter()
            .filter(|p| pod_ready(p))
            .count();
        if ready >= args.pods {
            break;
        }
        if started.elapsed() > timeout {
            bail!(
                "{ready} of {} pods Ready after {timeout:?}; see {}",
                args.pods,
                agent.log.display()
            );
        }
        std::thread::sleep(READY_POLL);
    }
    let ready_after = started.elapsed().as_secs_f64();
    println!("all {} pods Ready after {ready_after:.1} s", args.pods);
    std::thread::sleep(Duration::from_secs(args.settle));
    agent.exited()?;
    let pid = agent.pid();
    let before = scrape(port)?;
    let cpu_before = process_cpu_seconds(pid)?;
    let window_start = Instant::now();
    std::thread::sleep(Duration::from_secs(args.window));
    let cpu_after = process_cpu_seconds(pid)?;
    let seconds = window_start.elapsed().as_secs_f64();
    let after = scrape(port)?;
    agent.exited()?;
    let window = Window {
        seconds,
        cpu_seconds: cpu_after - cpu_before,
        probes: after.0.minus(&before.0),
        buckets: after.1.minus(&before.1),
    };
    println!(
        "window {seconds:.1} s: CPU {:.3} cores, {} probes ({} failed)",
        window.cpu_seconds / seconds,
        window.probes.total(),
        window.probes.failed
    );
    Ok((ready_after, window))
}

fn pod_ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// `prober_probe_total` by result, summed over every series.
#[derive(Clone, Debug, Default, PartialEq)]
struct Counts {
    successful: u64,
    failed: u64,
    unknown: u64,
}

impl Counts {
    fn total(&self) -> u64 {
        self.successful + self.failed + self.unknown
    }

    fn minus(&self, before: &Self) -> Self {
        Self {
            successful: self.successful.saturating_sub(before.successful),
            failed: self.failed.saturating_sub(before.failed),
            unknown: self.unknown.saturating_sub(before.unknown),
        }
    }
}

/// Cumulative `prober_probe_duration_seconds` bucket counts, summed over pods: probe type → `le`
/// → count.
#[derive(Clone, Debug, Default, PartialEq)]
struct Histograms(BTreeMap<String, BTreeMap<String, f64>>);

impl Histograms {
    fn minus(&self, before: &Self) -> Self {
        let mut out = self.clone();
        for (probe_type, buckets) in &mut out.0 {
            for (le, count) in buckets.iter_mut() {
                let earlier = before
                    .0
                    .get(probe_type)
                    .and_then(|b| b.get(le))
                    .copied()
                    .unwrap_or(0.0);
                *count = (*count - earlier).max(0.0);
            }
        }
        out
    }
}

fn scrape(port: u16) -> Result<(Counts, Histograms)> {
    let body = http::get(port, "/metrics/probes")?;
    Ok(parse_probe_metrics(&String::from_utf8_lossy(&body)))
}

/// The value of label `name` in a Prometheus sample's label set.
fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let start = labels.find(&format!("{name}=\""))? + name.len() + 2;
    let end = labels[start..].find('"')?;
    Some(&labels[start..start + end])
}

fn parse_probe_metrics(text: &str) -> (Counts, Histograms) {
    let mut counts = Counts::default();
    let mut histograms = Histograms::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        match name {
            PROBE_TOTAL => {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let value = value.round() as u64;
                match label(labels, "result") {
                    Some("successful") => counts.successful += value,
                    Some("failed") => counts.failed += value,
                    Some("unknown") => counts.unknown += value,
                    _ => {}
                }
            }
            DURATION_BUCKETS => {
                let (Some(probe_type), Some(le)) =
                    (label(labels, "probe_type"), label(labels, "le"))
                else {
                    continue;
                };
                *histograms
                    .0
                    .entry(probe_type.to_owned())
                    .or_default()
                    .entry(le.to_owned())
                    .or_default() += value;
            }
            _ => {}
        }
    }
    (counts, histograms)
}

fn loadavg() -> Result<[f64; 3]> {
    let text = fs::read_to_string("/proc/loadavg")?;
    let mut fields = text
        .split_whitespace()
        .map(|f| f.parse().unwrap_or(f64::NAN));
    Ok([
        fields.next().unwrap_or(f64::NAN),
        fields.next().unwrap_or(f64::NAN),
        fields.next().unwrap_or(f64::NAN),
    ])
}

fn markdown(report: &Report) -> String {
    let m = &report.machine;
    let mut out = format!(
        "# bench probes: what probes cost, ringlet and the upstream kubelet\n\n\
         ringlet commit `{}`, {}, extra flags `{}`\n\n\
         machine: {} × {}, {} memory, Linux {}, {}\n\n\
         {} static pods, each: {}. Measured over {} s, {} s after every pod was Ready: agent CPU \
         (user + system per second, whole process) and, from `/metrics/probes`, probes done and \
         the latency of the timed ones (`prober_probe_duration_seconds`, p50/p99 interpolated \
         within its buckets: 5, 10, 25, 50, 100 ms, ...).\n\n\
         | agent | all Ready after s | CPU cores | probes/s | failed | p50 ms | p99 ms |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        report.commit,
        report.date,
        report.ringlet_args.join(" "),
        m.cpus,
        m.cpu,
        m.memory,
        m.kernel,
        m.containerd,
        report.pods,
        report.probes,
        report.window_seconds,
        report.settle_seconds,
    );
    let number = |v: Option<f64>, digits: usize| {
        v.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
    };
    for side in &report.sides {
        if let Some(reason) = &side.skipped {
            let _ = writeln!(out, "| {} | skipped: {reason} | | | | | |", side.agent);
            continue;
        }
        let all = side.latency.iter().find(|l| l.probe_type == "all");
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            side.agent,
            number(side.all_ready_after_s, 1),
            number(side.cpu_cores, 3),
            number(side.probes_per_second, 1),
            side.failed_probes.unwrap_or_default(),
            number(all.map(|l| l.p50_ms), 2),
            number(all.map(|l| l.p99_ms), 2),
        );
    }
    out.push_str("\nBy probe type:\n\n| agent | probe | timed | p50 ms | p99 ms |\n|---|---|---:|---:|---:|\n");
    for side in &report.sides {
        for l in side.latency.iter().filter(|l| l.probe_type != "all") {
            let _ = writeln!(
                out,
                "| {} | {} | {} | {:.2} | {:.2} |",
                side.agent, l.probe_type, l.timed, l.p50_ms, l.p99_ms
            );
        }
    }
    let _ = write!(out, "\nLoad average before each side: ");
    let loads: Vec<String> = report
        .load_before
        .iter()
        .map(|(side, l)| format!("{side} {:.2} {:.2} {:.2}", l[0], l[1], l[2]))
        .collect();
    out.push_str(&loads.join("; "));
    out.push_str(".\n");
    for side in &report.sides {
        if !side.version.is_empty() {
            let _ = writeln!(out, "\n{}: `{}`", side.agent, side.version);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = r#"# HELP prober_probe_duration_seconds Duration in seconds for a probe response.
# TYPE prober_probe_duration_seconds histogram
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="a",probe_type="Readiness",le="0.005"} 80
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="a",probe_type="Readiness",le="0.01"} 100
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="a",probe_type="Readiness",le="+Inf"} 100
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="b",probe_type="Readiness",le="0.005"} 20
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="b",probe_type="Readiness",le="0.01"} 100
prober_probe_duration_seconds_bucket{container="web",namespace="ns",pod="b",probe_type="Readiness",le="+Inf"} 100
prober_probe_total{container="web",namespace="ns",pod="a",pod_uid="u",probe_type="Readiness",result="successful"} 200
prober_probe_total{container="web",namespace="ns",pod="a",pod_uid="u",probe_type="Readiness",result="failed"} 3
"#;

    #[test]
    fn probe_metrics_sum_over_pods() {
        let (counts, histograms) = parse_probe_metrics(SAMPLE);
        assert_eq!(
            counts,
            Counts {
                successful: 200,
                failed: 3,
                unknown: 0
            }
        );
        let readiness = &histograms.0["Readiness"];
        assert!((readiness["0.005"] - 100.0).abs() < f64::EPSILON);
        assert!((readiness["+Inf"] - 200.0).abs() < f64::EPSILON);
    }

    #[test]
    fn quantiles_interpolate_within_the_summed_buckets() {
        let (_, histograms) = parse_probe_metrics(SAMPLE);
        let sorted = sorted_buckets(&histograms.0["Readiness"]);
        // Half of 200 is 100, the whole first bucket: its upper bound.
        assert!((histogram_quantile(&sorted, 0.5) - 0.005).abs() < 1e-9);
        // 198 of 200: 98 of the 100 in (5 ms, 10 ms].
        assert!((histogram_quantile(&sorted, 0.99) - 0.0099).abs() < 1e-9);
    }

    #[test]
    fn a_window_is_the_difference_of_two_scrapes() {
        let (counts, histograms) = parse_probe_metrics(SAMPLE);
        let (zero_counts, zero) = (counts.minus(&counts), histograms.minus(&histograms));
        assert_eq!(zero_counts.total(), 0);
        assert!(zero.0["Readiness"].values().all(|c| *c == 0.0));
    }
}
