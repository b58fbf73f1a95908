//! `cargo xtask bench pleg`: the eBPF PLEG against the relist PLEG, in one run, on the same pod
//! manifests. For each mode: idle agent CPU with 10 / 50 / 100 running pods, then container exit →
//! status visible on `/pods` (bench side) and the agent's own kernel → event / kernel → status
//! histograms (agent side). Then a synthetic high-density churn without containerd for the
//! kernel → userspace part (`agent/examples/hint_throughput.rs`).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::benchkit::{
    self, Agent, cleanup, free_port, fresh_run_dir, git_commit, histogram, now_utc, percentile,
    process_cpu_seconds, runtime_containers, sleep_pod_manifest, time_exits, wait_all_running,
    wait_for_free_pins,
};
use crate::{cargo, cmd, http, lab, workspace_root};

const NAMESPACE: &str = "ringlet-bench-pleg";
/// Distinct from the privileged tests' `e2e-*` nodes: agents only clean up their own node's pods.
const NODE: &str = "bench-pleg";
const POLL: Duration = Duration::from_millis(2);
const EVENT_HISTOGRAM: &str = "ringlet_pleg_event_latency_seconds";
const STATUS_HISTOGRAM: &str = "ringlet_pod_status_latency_seconds";
// relist first: it needs no pins, so it runs while another agent may still hold them.
const RUNTIME_LAG_HISTOGRAM: &str = "ringlet_pleg_runtime_lag_seconds";
const MODES: [&str; 2] = ["relist", "ebpf"];

#[derive(clap::Args)]
pub struct PlegArgs {
    /// Pod counts for the idle CPU measurement, ascending, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,50,100")]
    pods: Vec<usize>,
    /// Container exits timed per mode (one per pod, so at most the largest pod count).
    #[arg(long, default_value_t = 40)]
    exits: usize,
    /// Seconds to let the agent settle after all pods run, before the CPU window.
    #[arg(long, default_value_t = 10)]
    settle: u64,
    /// Length of the idle CPU window in seconds.
    #[arg(long, default_value_t = 30)]
    window: u64,
    /// Container cgroups the synthetic churn creates.
    #[arg(long, default_value_t = 2000)]
    synthetic_containers: usize,
    /// Container cgroups alive at once in the synthetic churn.
    #[arg(long, default_value_t = 1000)]
    synthetic_concurrency: usize,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Measure nothing: write pleg.md and pleg.svg again from this pleg.json.
    #[arg(long)]
    render: Option<PathBuf>,
}

#[derive(Serialize, Deserialize)]
struct Metric {
    mode: Cow<'static, str>,
    #[serde(rename = "metric")]
    name: Cow<'static, str>,
    /// Where the number comes from: `bench` (SIGKILL → seen on /pods) or `agent` (its histogram).
    source: Cow<'static, str>,
    /// Infinite (JSON null) when a histogram quantile lies above its largest bucket.
    #[serde(deserialize_with = "null_is_infinite")]
    median_ms: f64,
    #[serde(deserialize_with = "null_is_infinite")]
    p99_ms: f64,
    samples: usize,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    samples_ms: Vec<f64>,
}

#[derive(Serialize, Deserialize)]
struct IdleCpu {
    mode: Cow<'static, str>,
    pods: usize,
    cpu_seconds_per_minute: f64,
    window_s: u64,
}

#[derive(Serialize, Deserialize)]
struct Report {
    benchmark: Cow<'static, str>,
    date: String,
    commit: String,
    machine: benchkit::Machine,
    latency: Vec<Metric>,
    idle_cpu: Vec<IdleCpu>,
    synthetic: Value,
}

pub fn pleg(args: &PlegArgs) -> Result<()> {
    if args.pods.is_empty() || args.pods.contains(&0) || !args.pods.is_sorted() {
        bail!("--pods needs ascending pod counts, each above 0");
    }
    let most = args.pods.iter().copied().max().unwrap_or_default();
    if args.exits == 0 || args.exits > most {
        bail!("--exits must be between 1 and the largest pod count ({most})");
    }
    let root = workspace_root();
    let out_dir = root.join("bench/results");
    if let Some(json) = &args.render {
        let text = fs::read(json).with_context(|| format!("reading {}", json.display()))?;
        let report: Report =
            serde_json::from_slice(&text).with_context(|| format!("parsing {}", json.display()))?;
        return write_views(&out_dir, &report, args);
    }
    lab::up()?;
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    cmd::run(cargo().current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "ringlet",
        "--example",
        "hint_throughput",
    ]))?;

    let mut latency = Vec::new();
    let mut idle_cpu = Vec::new();
    for mode in MODES {
        println!("== --pleg-mode={mode}");
        let (l, c) = run_mode(&binary, mode, args)?;
        latency.extend(l);
        idle_cpu.extend(c);
    }
    println!("== synthetic churn");
    let synthetic = synthetic(&root, args)?;

    let report = Report {
        benchmark: "pleg".into(),
        date: now_utc()?,
        commit: git_commit(&root),
        machine: benchkit::machine()?,
        latency,
        idle_cpu,
        synthetic,
    };
    fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let json_path = out_dir.join("pleg.json");
    fs::write(&json_path, serde_json::to_vec_pretty(&report)?)
        .with_context(|| format!("writing {}", json_path.display()))?;
    write_views(&out_dir, &report, args)
}

fn write_views(out_dir: &Path, report: &Report, args: &PlegArgs) -> Result<()> {
    let md = markdown(report, args);
    let md_path = out_dir.join("pleg.md");
    fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    let svg_path = out_dir.join("pleg.svg");
    fs::write(&svg_path, svg(&report.latency))
        .with_context(|| format!("writing {}", svg_path.display()))?;
    println!(
        "{md}\nwrote {} and {}",
        md_path.display(),
        svg_path.display()
    );
    Ok(())
}

fn run_mode(
    binary: &Path,
    mode: &'static str,
    args: &PlegArgs,
) -> Result<(Vec<Metric>, Vec<IdleCpu>)> {
    let (run_dir, manifests, root_dir) = fresh_run_dir(&format!("pleg-{mode}"))?;
    if !runtime_containers(NAMESPACE)?.is_empty() {
        bail!("containers of namespace {NAMESPACE} are still in containerd from an earlier run");
    }
    if mode == "ebpf" {
        wait_for_free_pins()?;
    }
    let port = free_port()?;
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
            .args(["--hostname-override", NODE])
            .args(["--pleg-mode", mode])
            .arg("--events-socket")
            .arg(run_dir.join("events.sock")),
        run_dir.join("ringlet.log"),
    )?;
    // Whatever fails below, the pods go: removing the manifests makes the agent delete them.
    let result = measure_mode(&mut agent, port, mode, &manifests, args);
    let cleaned = cleanup(&manifests, NAMESPACE);
    agent.stop();
    let measured = result?;
    cleaned?;
    Ok(measured)
}

fn measure_mode(
    agent: &mut Agent,
    port: u16,
    mode: &'static str,
    manifests: &Path,
    args: &PlegArgs,
) -> Result<(Vec<Metric>, Vec<IdleCpu>)> {
    let mut idle = Vec::new();
    let mut written = 0;
    for &pods in &args.pods {
        let started = Instant::now();
        for i in written..pods {
            fs::write(
                manifests.join(format!("pleg-{i}.yaml")),
                sleep_pod_manifest(&format!("pleg-{i}"), NAMESPACE),
            )?;
        }
        written = pods;
        wait_all_running(agent, port, pods, started, NAMESPACE)?;
        println!(
            "{pods} pods running after {:.1} s",
            started.elapsed().as_secs_f64()
        );
        std::thread::sleep(Duration::from_secs(args.settle));
        agent.exited()?;
        let before = process_cpu_seconds(agent.pid())?;
        std::thread::sleep(Duration::from_secs(args.window));
        agent.exited()?;
        let used = process_cpu_seconds(agent.pid())? - before;
        #[allow(clippy::cast_precision_loss)]
        let per_minute = used * 60.0 / args.window as f64;
        println!("idle CPU with {pods} pods: {per_minute:.3} CPU-s/min");
        idle.push(IdleCpu {
            mode: mode.into(),
            pods,
            cpu_seconds_per_minute: per_minute,
            window_s: args.window,
        });
    }

    let before = http::get(port, "/metrics").context("reading /metrics")?;
    // The pause lets each restart settle so the next sample does not race that pod's sync; the
    // jitter spreads the kills over the relist period.
    let exits = time_exits(
        agent,
        port,
        NAMESPACE,
        args.exits,
        POLL,
        Duration::from_millis(200),
        Duration::from_secs(1),
    )?;
    // The status histogram is observed when the status manager writes: give it a moment.
    std::thread::sleep(Duration::from_millis(500));
    let after = http::get(port, "/metrics").context("reading /metrics")?;
    let (before, after) = (
        String::from_utf8_lossy(&before),
        String::from_utf8_lossy(&after),
    );
    let mut metrics = vec![metric(mode, "exit → status on /pods", "bench", exits)];
    for (name, family) in [
        ("kernel → PLEG event", EVENT_HISTOGRAM),
        ("kernel → status", STATUS_HISTOGRAM),
        ("kernel → containerd reports it", RUNTIME_LAG_HISTOGRAM),
    ] {
        let delta = histogram(&after, family).minus(&histogram(&before, family));
        if delta.count() > 0 {
            metrics.push(Metric {
                mode: mode.into(),
                name: name.into(),
                source: "agent".into(),
                median_ms: delta.quantile(0.5) * 1000.0,
                p99_ms: delta.quantile(0.99) * 1000.0,
                samples: usize::try_from(delta.count())?,
                samples_ms: Vec::new(),
            });
        }
    }
    Ok((metrics, idle))
}

fn metric(
    mode: &'static str,
    name: &'static str,
    source: &'static str,
    mut samples_ms: Vec<f64>,
) -> Metric {
    samples_ms.sort_by(f64::total_cmp);
    Metric {
        mode: mode.into(),
        name: name.into(),
        source: source.into(),
        median_ms: percentile(&samples_ms, 50.0),
        p99_ms: percentile(&samples_ms, 99.0),
        samples: samples_ms.len(),
        samples_ms,
    }
}

fn synthetic(root: &Path, args: &PlegArgs) -> Result<Value> {
    let example = root.join("target/release/examples/hint_throughput");
    let out = cmd::output(
        Command::new(&example)
            .args(["--containers", &args.synthetic_containers.to_string()])
            .args(["--concurrency", &args.synthetic_concurrency.to_string()]),
    )?;
    let value: Value = serde_json::from_str(&out).context("parsing hint_throughput's output")?;
    println!("{value}");
    Ok(value)
}

fn ratio(report: &Report, name: &str, source: &str, p99: bool) -> Option<f64> {
    let get = |mode: &str| {
        find(report, mode, name, source).map(|m| if p99 { m.p99_ms } else { m.median_ms })
    };
    Some(get("relist")? / get("ebpf")?)
}

fn markdown(report: &Report, args: &PlegArgs) -> String {
    let mut out = format!(
        "# PLEG benchmark: eBPF vs relist\n\n\
         ringlet commit `{}`, {}; `cargo xtask bench pleg` (both modes in one run, same pod \
         manifests: busybox `sleep`, restartPolicy Always, node `{NODE}`)\n\n\
         machine: {}\n\n\
         ## Container exit latency\n\n\
         An exit is a SIGKILL of one container's main process (one per pod, {} pods after the CPU \
         runs, each pod killed once so no back-off; the next kill follows 0.2–1.2 s, spread, after an exit \
         shows, so kills do not lock to the relist phase). **bench**: CLOCK_MONOTONIC just before the \
         kill → `/pods` shows the container terminated or restarted (polled every {} ms, one \
         request per poll, so it includes serving and reading `/pods`). **agent**: the agent's \
         own histograms over the same exits (kernel timestamp of the exit → PLEG event / → status \
         written / → containerd reporting the change), their quantiles interpolated linearly \
         within the bucket as Prometheus' `histogram_quantile` does (buckets from 10 µs to 10 s, \
         four per decade, so within 1.78× of the true value); relist mode has no kernel timestamp \
         and records none.\n\n\
         | metric | source | mode | median ms | p99 ms | samples |\n|---|---|---|---:|---:|---:|\n",
        report.commit,
        report.date,
        report.machine.describe(),
        args.pods.iter().max().copied().unwrap_or_default(),
        POLL.as_millis(),
    );
    for m in &report.latency {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} |",
            m.name,
            m.source,
            m.mode,
            show_ms(m.median_ms),
            show_ms(m.p99_ms),
            m.samples
        );
    }
    if let (Some(median), Some(p99)) = (
        ratio(report, "exit → status on /pods", "bench", false),
        ratio(report, "exit → status on /pods", "bench", true),
    ) {
        let _ = writeln!(
            out,
            "\nexit → status on `/pods`, relist / ebpf: median {median:.1}×, p99 {p99:.1}×\n"
        );
    }
    let _ = write!(
        out,
        "![latency CDF](pleg.svg)\n\n## Idle agent CPU\n\n\
         utime + stime of the agent from `/proc/<pid>/stat` over {} s, after all pods run and \
         {} s of settling; CPU-seconds per minute.\n\n\
         | pods | ebpf | relist | relist / ebpf |\n|---:|---:|---:|---:|\n",
        args.window, args.settle
    );
    for &pods in &args.pods {
        let (ebpf, relist) = (idle(report, "ebpf", pods), idle(report, "relist", pods));
        let _ = writeln!(
            out,
            "| {pods} | {ebpf:.3} | {relist:.3} | {:.1}× |",
            relist / ebpf
        );
    }
    targets(&mut out, report, args);
    let s = &report.synthetic;
    let _ = write!(
        out,
        "\n## Synthetic high-density churn (no containerd)\n\n\
         `agent/examples/hint_throughput`: the agent's eBPF programs on a private pods' parent \
         cgroup; {} container cgroups ({} alive at once, peak {}), each with a real process moved \
         into it that execs `unshare --pid --fork sh -c 'sleep {}; exit N'`, then rmdir. Latency \
         is the hint's kernel timestamp → the reader receives it (CLOCK_MONOTONIC both).\n\n\
         | hints | per kind | duration s | hints/s | kernel drops | hints lost | resyncs | \
         median µs | p99 µs | p99.9 µs | max µs |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n\
         | {} | `{}` | {:.1} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
        s["containers"],
        s["concurrency"],
        s["peak_live_cgroups"],
        s["hold_s"],
        s["hints"],
        s["hints_by_kind"],
        s["duration_s"].as_f64().unwrap_or(f64::NAN),
        s["hints_per_s"].as_f64().unwrap_or(f64::NAN),
        s["kernel_drops"],
        s["hints_lost"],
        s["resyncs"],
        s["latency_us"]["median"].as_f64().unwrap_or(f64::NAN),
        s["latency_us"]["p99"].as_f64().unwrap_or(f64::NAN),
        s["latency_us"]["p999"].as_f64().unwrap_or(f64::NAN),
        s["latency_us"]["max"].as_f64().unwrap_or(f64::NAN),
    );
    out
}

fn null_is_infinite<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

/// Milliseconds for a table, to the microsecond; a histogram quantile above the largest bucket
/// has no value.
fn show_ms(v: f64) -> String {
    if v.is_infinite() {
        "above the largest bucket (10 s)".to_owned()
    } else {
        format!("{v:.3}")
    }
}

fn find<'a>(report: &'a Report, mode: &str, name: &str, source: &str) -> Option<&'a Metric> {
    report
        .latency
        .iter()
        .find(|m| m.mode == mode && m.name == name && m.source == source)
}

fn idle(report: &Report, mode: &str, pods: usize) -> f64 {
    report
        .idle_cpu
        .iter()
        .find(|c| c.mode == mode && c.pods == pods)
        .map_or(f64::NAN, |c| c.cpu_seconds_per_minute)
}

/// The targets next to what was measured.
fn targets(out: &mut String, report: &Report, args: &PlegArgs) {
    let verdict = |met: bool| if met { "met" } else { "**not met**" };
    let p99 = |mode: &str, name: &str, source: &str| {
        find(report, mode, name, source).map_or(f64::NAN, |m| m.p99_ms)
    };
    let event = p99("ebpf", "kernel → PLEG event", "agent");
    let status_agent = p99("ebpf", "kernel → status", "agent");
    let pods_ebpf = p99("ebpf", "exit → status on /pods", "bench");
    let pods_relist = p99("relist", "exit → status on /pods", "bench");
    let (fewest, most) = (
        args.pods.first().copied().unwrap_or_default(),
        args.pods.last().copied().unwrap_or_default(),
    );
    let (cpu_few, cpu_most, cpu_relist) = (
        idle(report, "ebpf", fewest),
        idle(report, "ebpf", most),
        idle(report, "relist", most),
    );
    let drops = report.synthetic["kernel_drops"]
        .as_u64()
        .unwrap_or(u64::MAX);
    let _ = write!(
        out,
        "\n## Targets (issue 3)\n\n| target | measured | verdict |\n|---|---|---|\n\
         | ebpf exit → PLEG event p99 < 5 ms | agent histogram p99 {} ms | {} |\n\
         | ebpf exit → status p99 < 20 ms | on `/pods` p99 {pods_ebpf:.2} ms; agent histogram \
         p99 {} ms | {} |\n\
         | ebpf ≥ 100× below relist (exit → status p99) | relist / ebpf = {:.1}× | {} |\n\
         | ebpf idle CPU independent of pod count | {fewest} pods {cpu_few:.3}, {most} pods \
         {cpu_most:.3} CPU-s/min | {} |\n\
         | ebpf idle CPU ≥ 10× below relist at {most} pods | relist / ebpf = {:.1}× | {} |\n\
         | no lost events in the synthetic churn | {drops} kernel drops | {} |\n",
        show_ms(event),
        verdict(event < 5.0),
        show_ms(status_agent),
        verdict(pods_ebpf < 20.0 && status_agent < 20.0),
        pods_relist / pods_ebpf,
        verdict(pods_relist / pods_ebpf >= 100.0),
        // Within the window's resolution (one clock tick is 0.01 CPU-s) or within 50 %.
        verdict((cpu_most - cpu_few).abs() <= (0.5 * cpu_few).max(0.03)),
        cpu_relist / cpu_most,
        verdict(cpu_relist / cpu_most >= 10.0),
        verdict(drops == 0),
    );
}

/// A CDF of the bench-side exit → status samples of both modes.
fn svg(latency: &[Metric]) -> String {
    let series: Vec<benchkit::Series> = latency
        .iter()
        .filter(|m| !m.samples_ms.is_empty())
        .map(|m| benchkit::Series {
            label: format!(
                "--pleg-mode={} (median {:.1} ms, p99 {:.1} ms)",
                m.mode, m.median_ms, m.p99_ms
            ),
            color: if m.mode == "ebpf" {
                "#d62728"
            } else {
                "#1f77b4"
            },
            samples_ms: &m.samples_ms,
        })
        .collect();
    benchkit::cdf_svg("container exit → status on /pods (CDF)", &series)
}
