//! The scale bench's results (`cargo xtask bench scale`): what one agent measured at one pod count
//! on the hollow runtime, written as `bench/results/scale.{json,md,svg}` with the ringlet/kubelet
//! ratio of every figure and a plot of each figure against the pod count for both agents.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::benchkit::{self, Machine};
use crate::density_bench::{Line, Quantiles, panel};
use crate::health_watch::{HEALTH_POLL, HealthFailure};

/// Said with every result: the numbers are an agent's cost with a runtime that costs nothing.
pub const HARNESS: &str = "measured on ringlet-hollow, a scale harness, not a container runtime: \
    each container is a tiny real process in a real cgroup below its pod's, with no image, rootfs, \
    namespaces, network or shim, so the agents' costs are measured without a runtime's";

/// Everything measured for one agent at one pod count in one mode.
#[derive(Serialize, Deserialize)]
pub struct Point {
    /// `standalone` or `cluster`.
    pub mode: String,
    pub agent: String,
    pub pods: usize,
    /// Creating the pods (manifests written, or API creates) → all Running.
    pub all_running_s: f64,
    pub idle_cpu_percent: f64,
    /// Median of the RSS sampled every second of the idle window.
    pub rss_mib: f64,
    pub rss_mib_max: f64,
    /// Full relists from all Running to the end of the exits.
    pub full_relists: u64,
    pub full_relist_mean_ms: Option<f64>,
    /// Interpolated within the agent's histogram buckets.
    pub full_relist: Quantiles,
    /// Kill → status: on `/pods` standalone, on the API server (a watch) in cluster mode.
    pub exit_status: Quantiles,
    /// Cluster mode: kill → the agent's `/pods`.
    pub exit_on_pods: Option<Quantiles>,
    /// Cluster mode: the exit on the API server minus on the agent's `/pods`.
    pub status_update_lag: Option<Quantiles>,
    pub pods_read: Quantiles,
    pub summary_read: Quantiles,
    /// Cluster mode: `apiserver_request_total` over the idle window (every client).
    pub api_requests_per_minute: Option<f64>,
    /// Cluster mode: the node's own requests over the idle window, from the audit log.
    pub node_requests_per_minute: Option<f64>,
    pub health_checks: u64,
    pub health_unanswered: u64,
    pub health_failures: Vec<HealthFailure>,
    /// Lines of the agent's log saying `PLEG is not healthy`.
    pub pleg_unhealthy_log_lines: usize,
}

#[derive(Serialize, Deserialize)]
pub struct Report {
    pub benchmark: String,
    pub harness: String,
    pub date: String,
    pub commit: String,
    pub machine: Machine,
    pub ringlet_version: String,
    pub kubelet_version: Option<String>,
    pub kubelet_skipped: Option<String>,
    pub pid_max: u64,
    pub exits: usize,
    pub settle_s: u64,
    pub window_s: u64,
    pub reads: usize,
    pub points: Vec<Point>,
    /// Runs that failed; the others stay in the report.
    pub failures: Vec<String>,
}

/// One figure of a point.
struct Figure {
    name: &'static str,
    unit: &'static str,
    value: fn(&Point) -> Option<f64>,
}

#[allow(clippy::cast_precision_loss)]
const FIGURES: [Figure; 15] = [
    Figure {
        name: "all Running after creating the pods",
        unit: "s",
        value: |p| Some(p.all_running_s),
    },
    Figure {
        name: "idle agent CPU",
        unit: "% of a core",
        value: |p| Some(p.idle_cpu_percent),
    },
    Figure {
        name: "agent RSS",
        unit: "MiB",
        value: |p| Some(p.rss_mib),
    },
    Figure {
        name: "full relist, mean",
        unit: "ms",
        value: |p| p.full_relist_mean_ms,
    },
    Figure {
        name: "full relist, p99",
        unit: "ms",
        value: |p| p.full_relist.p99_ms,
    },
    Figure {
        name: "exit → status, median",
        unit: "ms",
        value: |p| p.exit_status.median_ms,
    },
    Figure {
        name: "exit → status, p99",
        unit: "ms",
        value: |p| p.exit_status.p99_ms,
    },
    Figure {
        name: "GET /pods, median",
        unit: "ms",
        value: |p| p.pods_read.median_ms,
    },
    Figure {
        name: "GET /pods, p99",
        unit: "ms",
        value: |p| p.pods_read.p99_ms,
    },
    Figure {
        name: "GET /stats/summary, median",
        unit: "ms",
        value: |p| p.summary_read.median_ms,
    },
    Figure {
        name: "GET /stats/summary, p99",
        unit: "ms",
        value: |p| p.summary_read.p99_ms,
    },
    Figure {
        name: "API server requests (all clients)",
        unit: "per minute",
        value: |p| p.api_requests_per_minute,
    },
    Figure {
        name: "the node's API requests",
        unit: "per minute",
        value: |p| p.node_requests_per_minute,
    },
    Figure {
        name: "status-update lag (API server − /pods), p99",
        unit: "ms",
        value: |p| p.status_update_lag.and_then(|q| q.p99_ms),
    },
    Figure {
        name: "PLEG unhealthy readings",
        unit: "count",
        value: |p| Some((p.health_failures.len() + p.pleg_unhealthy_log_lines) as f64),
    },
];

/// Writes `scale.json`, `scale.md` and `scale.svg` under `bench/results/`.
pub fn write(root: &Path, report: &Report) -> Result<()> {
    benchkit::write_results(root, "scale", report, &markdown(report))?;
    let svg_path = root.join("bench/results/scale.svg");
    fs::write(&svg_path, svg(report)).with_context(|| format!("writing {}", svg_path.display()))?;
    println!("wrote {}", svg_path.display());
    Ok(())
}

fn find<'a>(report: &'a Report, mode: &str, agent: &str, pods: usize) -> Option<&'a Point> {
    report
        .points
        .iter()
        .find(|p| p.mode == mode && p.agent == agent && p.pods == pods)
}

fn counts(report: &Report, mode: &str) -> Vec<usize> {
    let mut pods: Vec<usize> = report
        .points
        .iter()
        .filter(|p| p.mode == mode)
        .map(|p| p.pods)
        .collect();
    pods.sort_unstable();
    pods.dedup();
    pods
}

fn show(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.2}"))
}

/// ringlet's figure over the kubelet's, when both exist and the kubelet's is not zero.
fn ratio(ringlet: Option<f64>, kubelet: Option<f64>) -> Option<f64> {
    match (ringlet, kubelet) {
        (Some(r), Some(k)) if k != 0.0 => Some(r / k),
        _ => None,
    }
}

pub fn markdown(report: &Report) -> String {
    let mut out = format!(
        "# Scale: ringlet and the upstream kubelet with thousands of pods on the hollow runtime\n\n\
         **{}.**\n\n\
         ringlet `{}` (commit `{}`), kubelet {}, {}; `cargo xtask bench scale`\n\n\
         machine: {}; `kernel.pid_max` {}\n\n\
         For each mode, pod count and agent, one at a time: a fresh `ringlet-hollow`, the agent on \
         it (cgroupfs, `--max-pods` the pod count), the pods created (standalone: static pod \
         manifests; cluster: `POST`s bound to the agent's node of the loopback control plane, \
         whose Ready pods are seen through a watch), and then: **idle CPU** (utime + stime over {} \
         s after {} s of settling, % of one core) and **RSS** (median of one sample a second); \
         **full relist** (`kubelet_pleg_relist_duration_seconds` from all Running to the end of \
         the run: the mean of its sum and count, the p99 interpolated in its buckets; ringlet \
         relists in full once a minute as a safety net); **GET /pods** and **GET \
         /stats/summary** ({} reads each on the read-only port); **exit → status**: {} containers \
         of pods chosen at random killed with SIGKILL one at a time, until `/pods` \
         (standalone) or the API server (cluster) shows the exit; **API requests**: \
         `apiserver_request_total` over the idle window (every client of the API server), and \
         the node's own from the audit log; **PLEG unhealthy**: failed `/healthz` reads (every \
         {} s through the run; the kubelet's `/healthz` has no PLEG check) plus log lines saying \
         `PLEG is not healthy`. Ratios are ringlet over the kubelet (below 1: ringlet is lower).\n",
        report.harness,
        report.ringlet_version,
        report.commit,
        report.kubelet_version.as_deref().unwrap_or("not run"),
        report.date,
        report.machine.describe(),
        report.pid_max,
        report.window_s,
        report.settle_s,
        report.reads,
        report.exits,
        HEALTH_POLL.as_secs(),
    );
    if let Some(reason) = &report.kubelet_skipped {
        let _ = writeln!(out, "\nThe kubelet did not run: {reason}.");
    }
    for mode in ["standalone", "cluster"] {
        let pods = counts(report, mode);
        if pods.is_empty() {
            continue;
        }
        let _ = write!(
            out,
            "\n## {mode}\n\n| figure | pods | ringlet | kubelet | ringlet / kubelet |\n\
             |---|---:|---:|---:|---:|\n"
        );
        for figure in &FIGURES {
            for &n in &pods {
                let value = |agent| find(report, mode, agent, n).and_then(figure.value);
                let (r, k) = (value("ringlet"), value("kubelet"));
                if r.is_none() && k.is_none() {
                    continue;
                }
                let _ = writeln!(
                    out,
                    "| {} ({}) | {n} | {} | {} | {} |",
                    figure.name,
                    figure.unit,
                    show(r),
                    show(k),
                    show(ratio(r, k))
                );
            }
        }
    }
    health_markdown(&mut out, report);
    if !report.failures.is_empty() {
        out.push_str("\n## Runs that failed\n\n");
        for failure in &report.failures {
            let _ = writeln!(out, "- {failure}");
        }
    }
    out.push_str("\n![each figure against the pod count, both agents](scale.svg)\n");
    out
}

fn health_markdown(out: &mut String, report: &Report) {
    out.push_str(
        "\n## PLEG health\n\n| mode | agent | pods | /healthz reads | unanswered | failed | log lines `PLEG is not healthy` |\n\
         |---|---|---:|---:|---:|---:|---:|\n",
    );
    for p in &report.points {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            p.mode,
            p.agent,
            p.pods,
            p.health_checks,
            p.health_unanswered,
            p.health_failures.len(),
            p.pleg_unhealthy_log_lines
        );
    }
    for p in &report.points {
        for f in &p.health_failures {
            let _ = writeln!(out, "- {}: {} while {}", f.mode, f.status, f.phase);
        }
    }
}

/// One panel per figure, a line per agent and mode against the pod count.
fn svg(report: &Report) -> String {
    const COLUMNS: usize = 3;
    const PANEL_W: f64 = 420.0;
    const PANEL_H: f64 = 260.0;
    const TOP: f64 = 50.0;
    let figures: Vec<&Figure> = FIGURES
        .iter()
        .filter(|f| report.points.iter().any(|p| (f.value)(p).is_some()))
        .collect();
    let rows = figures.len().div_ceil(COLUMNS);
    #[allow(clippy::cast_precision_loss)]
    let (w, h) = (PANEL_W * COLUMNS as f64, TOP + PANEL_H * rows as f64);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"{w}\" height=\"{h}\" fill=\"white\"/>\n\
         <text x=\"{x}\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">ringlet and the kubelet \
         against the pod count (commit {commit})</text>\n\
         <text x=\"{x}\" y=\"38\" text-anchor=\"middle\">on ringlet-hollow: a scale harness, not a \
         container runtime</text>\n",
        x = w / 2.0,
        commit = report.commit,
    );
    let series = [
        ("ringlet", "standalone", "#d62728"),
        ("ringlet", "cluster", "#ff9896"),
        ("kubelet", "standalone", "#1f77b4"),
        ("kubelet", "cluster", "#aec7e8"),
    ];
    #[allow(clippy::cast_precision_loss)]
    for (i, figure) in figures.iter().enumerate() {
        let lines: Vec<Line> = series
            .iter()
            .map(|(agent, mode, color)| Line {
                mode: format!("{agent} {mode}"),
                color,
                points: report
                    .points
                    .iter()
                    .filter(|p| p.agent == *agent && p.mode == *mode)
                    .filter_map(|p| Some((p.pods as f64, (figure.value)(p)?)))
                    .collect(),
            })
            .filter(|l| !l.points.is_empty())
            .collect();
        let frame = (
            (i % COLUMNS) as f64 * PANEL_W,
            TOP + (i / COLUMNS) as f64 * PANEL_H,
            PANEL_W,
            PANEL_H,
        );
        panel(
            &mut out,
            frame,
            &format!("{} ({})", figure.name, figure.unit),
            &lines,
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(agent: &str, pods: usize, cpu: f64) -> Point {
        let none = Quantiles::of_samples(Vec::new());
        Point {
            mode: "standalone".into(),
            agent: agent.into(),
            pods,
            all_running_s: 1.0,
            idle_cpu_percent: cpu,
            rss_mib: 10.0,
            rss_mib_max: 11.0,
            full_relists: 0,
            full_relist_mean_ms: None,
            full_relist: none,
            exit_status: Quantiles::of_samples(vec![10.0, 20.0]),
            exit_on_pods: None,
            status_update_lag: None,
            pods_read: none,
            summary_read: none,
            api_requests_per_minute: None,
            node_requests_per_minute: None,
            health_checks: 3,
            health_unanswered: 0,
            health_failures: Vec::new(),
            pleg_unhealthy_log_lines: 0,
        }
    }

    fn report(points: Vec<Point>) -> Report {
        Report {
            benchmark: "scale".into(),
            harness: HARNESS.into(),
            date: "2026-11-28T00:00:00Z".into(),
            commit: "abc".into(),
            machine: benchkit::machine_with("ringlet-hollow"),
            ringlet_version: "ringlet 0".into(),
            kubelet_version: Some("Kubernetes v1.36.2".into()),
            kubelet_skipped: None,
            pid_max: 4_194_304,
            exits: 2,
            settle_s: 1,
            window_s: 1,
            reads: 1,
            points,
            failures: Vec::new(),
        }
    }

    #[test]
    fn the_table_divides_ringlet_by_the_kubelet_at_the_same_count() {
        let md = markdown(&report(vec![
            point("ringlet", 50, 0.5),
            point("kubelet", 50, 5.0),
            point("ringlet", 200, 1.0),
        ]));
        assert!(
            md.contains("a scale harness, not a container runtime"),
            "{md}"
        );
        assert!(
            md.contains("| idle agent CPU (% of a core) | 50 | 0.50 | 5.00 | 0.10 |"),
            "{md}"
        );
        assert!(
            md.contains("| idle agent CPU (% of a core) | 200 | 1.00 | – | – |"),
            "no kubelet at 200 pods, no ratio: {md}"
        );
        assert!(
            !md.contains("API server requests"),
            "no cluster figures standalone: {md}"
        );
    }

    #[test]
    fn the_plot_has_a_panel_per_measured_figure_and_a_line_per_agent() {
        let svg = svg(&report(vec![
            point("ringlet", 50, 0.5),
            point("kubelet", 50, 5.0),
            point("ringlet", 200, 1.0),
            point("kubelet", 200, 9.0),
        ]));
        assert!(svg.contains("idle agent CPU (% of a core)"));
        assert!(svg.contains("ringlet standalone") && svg.contains("kubelet standalone"));
        assert!(
            !svg.contains("status-update lag"),
            "not measured standalone"
        );
        assert!(svg.contains("a scale harness, not a"));
    }
}
