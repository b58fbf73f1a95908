//! `cargo xtask bench io`: the `io_uring` engine against the epoll engine on the same workload, in
//! one run. For each engine an agent with 100 static pods runs with `--io-engine=<engine>`; while
//! its pods run, `agent/examples/io_bench` (on the same engine) times CRI round trips against the
//! lab's containerd, cgroup file sweeps and in-process stats scrapes (of the bench pods and of a
//! synthetic tree of 1,000 container cgroups), then the load generator of `bench server` times the
//! TLS kubelet API (`/pods`, `/healthz`, `/stats/summary`). Results carry medians, p99 and the CPU of
//! the process doing the I/O, and the report pairs each case's uring and epoll numbers.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::benchkit::{
    self, cleanup, fresh_run_dir, git_commit, machine, now_utc, percentile, process_cpu_seconds,
    sleep_pod_manifest, wait_all_running,
};
use crate::server_bench::{client_config, run_load, spawn_api_agent};
use crate::{cargo, cmd, lab, workspace_root};

const NAMESPACE: &str = "ringlet-bench";
const ENGINES: [&str; 2] = ["uring", "epoll"];
const SUMMARY_PATH: &str = "/stats/summary";

#[derive(clap::Args)]
pub struct IoArgs {
    /// Static pods the agent runs while it is measured.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Concurrent keep-alive connections for `/pods` and `/healthz`, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100")]
    connections: Vec<usize>,
    /// Concurrent scrapers of `/stats/summary`, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    summary_connections: Vec<usize>,
    /// Seconds of load per HTTPS case, after a 1 s warm-up.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Measured calls of each CRI method per engine.
    #[arg(long, default_value_t = 1000)]
    calls: usize,
    /// Measured sweeps, and in-process scrapes, of each cgroup file set per engine.
    #[arg(long, default_value_t = 200)]
    sweeps: usize,
    /// Synthetic container cgroups (in pods of 10) for the large sweep and scrape.
    #[arg(long, default_value_t = 1000)]
    synthetic: usize,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Extra flags passed to ringlet, after `--`.
    #[arg(last = true)]
    ringlet_args: Vec<String>,
}

/// One measured case on one engine; `agent/examples/io_bench` prints the same shape.
#[derive(Serialize, Deserialize, Clone)]
struct Measurement {
    section: String,
    case: String,
    engine: String,
    samples: usize,
    errors: usize,
    p50_ms: f64,
    p99_ms: f64,
    /// Calls, sweeps or requests per second.
    per_second: f64,
    /// CPU time (user + system) of the process doing the I/O per operation: the example for CRI
    /// and sweeps, the agent for HTTPS.
    cpu_ms_per_op: f64,
    cpu_seconds_per_second: f64,
    /// Why the case stopped early, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    failure: Option<String>,
}

impl Measurement {
    fn failed(
        section: &str,
        path: &str,
        connections: usize,
        engine: &str,
        error: &anyhow::Error,
    ) -> Self {
        Self {
            section: section.to_owned(),
            case: format!("`{path}` x{connections}"),
            engine: engine.to_owned(),
            samples: 0,
            errors: connections,
            p50_ms: f64::NAN,
            p99_ms: f64::NAN,
            per_second: 0.0,
            cpu_ms_per_op: f64::NAN,
            cpu_seconds_per_second: f64::NAN,
            failure: Some(format!("{error:#}")),
        }
    }
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    pods: usize,
    seconds_per_https_case: u64,
    ringlet_args: Vec<String>,
    machine: benchkit::Machine,
    cases: Vec<Measurement>,
}

pub fn io(args: &IoArgs) -> Result<()> {
    if args.connections.contains(&0) || args.summary_connections.contains(&0) || args.pods == 0 {
        bail!("--pods and every connection count must be above 0");
    }
    lab::up()?;
    let root = workspace_root();
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    cmd::run(cargo().current_dir(&root).args([
        "build",
        "--release",
        "-p",
        "ringlet",
        "--example",
        "io_bench",
    ]))?;
    let example = root.join("target/release/examples/io_bench");
    let mut cases = Vec::new();
    for engine in ENGINES {
        cases.extend(
            engine_run(args, &binary, &example, engine)
                .with_context(|| format!("measuring the {engine} engine"))?,
        );
    }
    let report = Report {
        benchmark: "io",
        date: now_utc()?,
        commit: git_commit(&root),
        pods: args.pods,
        seconds_per_https_case: args.seconds,
        ringlet_args: args.ringlet_args.clone(),
        machine: machine()?,
        cases,
    };
    write_report(&root, &report)
}

/// Every case of one engine: an agent on `engine` with the bench pods, the example while they run,
/// then the HTTPS load; the pods are removed before the agent stops, however the run ends.
fn engine_run(
    args: &IoArgs,
    binary: &Path,
    example: &Path,
    engine: &str,
) -> Result<Vec<Measurement>> {
    let (run_dir, manifests, root_dir) = fresh_run_dir(&format!("io-{engine}"))?;
    for i in 0..args.pods {
        fs::write(
            manifests.join(format!("bench-{i}.yaml")),
            sleep_pod_manifest(&format!("bench-{i}"), NAMESPACE),
        )?;
    }
    let started = Instant::now();
    let mut agent_args = vec![format!("--io-engine={engine}")];
    agent_args.extend(args.ringlet_args.iter().cloned());
    let (mut agent, read_only_port, api_port) = spawn_api_agent(binary, &run_dir, &agent_args)?;
    let measured = (|| {
        wait_all_running(&mut agent, read_only_port, args.pods, started, NAMESPACE)?;
        println!("{engine}: {} pods running", args.pods);
        let mut cases = example_cases(args, example, engine)?;
        let tls = client_config(&root_dir, &run_dir)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let loads = ["/pods", "/healthz"]
            .into_iter()
            .flat_map(|path| args.connections.iter().map(move |&c| (path, c)))
            .chain(args.summary_connections.iter().map(|&c| (SUMMARY_PATH, c)));
        for (path, connections) in loads {
            let cpu_before = process_cpu_seconds(agent.pid())?;
            let load = std::time::Duration::from_secs(args.seconds);
            let loaded = runtime.block_on(run_load(
                Arc::clone(&tls),
                api_port,
                path,
                connections,
                load,
            ));
            let cpu = process_cpu_seconds(agent.pid())? - cpu_before;
            agent.exited()?;
            let section = if path == SUMMARY_PATH {
                "stats summary over HTTPS"
            } else {
                "https"
            };
            // A case whose connection broke is reported as failed, so the other engine still runs.
            let mut result = match loaded {
                Ok(result) => result,
                Err(error) => {
                    println!("{engine} `{path}` x{connections} failed: {error:#}");
                    cases.push(Measurement::failed(
                        section,
                        path,
                        connections,
                        engine,
                        &error,
                    ));
                    continue;
                }
            };
            result.latencies_ms.sort_by(f64::total_cmp);
            let seconds = result.elapsed.as_secs_f64();
            #[allow(clippy::cast_precision_loss)]
            let requests = result.latencies_ms.len() as f64;
            let case = Measurement {
                section: section.to_owned(),
                case: format!("`{path}` x{connections}"),
                engine: engine.to_owned(),
                samples: result.latencies_ms.len(),
                errors: result.errors,
                p50_ms: percentile(&result.latencies_ms, 50.0),
                p99_ms: percentile(&result.latencies_ms, 99.0),
                per_second: requests / seconds,
                cpu_ms_per_op: cpu * 1000.0 / requests,
                cpu_seconds_per_second: cpu / seconds,
                failure: None,
            };
            println!(
                "{engine} {}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
                case.case, case.per_second, case.p50_ms, case.p99_ms, case.errors
            );
            cases.push(case);
        }
        Ok::<_, anyhow::Error>(cases)
    })();
    // The agent removes the pods once their manifests are gone, so it stops only after that.
    let cleaned = cleanup(&manifests, NAMESPACE);
    agent.stop();
    cleaned?;
    measured
}

/// The CRI and cgroup sweep cases of `agent/examples/io_bench` on `engine`.
fn example_cases(args: &IoArgs, example: &Path, engine: &str) -> Result<Vec<Measurement>> {
    let out = cmd::output(
        Command::new(example)
            .args(["--io-engine", engine])
            .args(["--namespace", NAMESPACE])
            .args(["--calls", &args.calls.to_string()])
            .args(["--sweeps", &args.sweeps.to_string()])
            .args(["--synthetic", &args.synthetic.to_string()]),
    )?;
    let cases: Vec<Measurement> = serde_json::from_str(&out)
        .with_context(|| format!("parsing the output of {}", example.display()))?;
    for case in &cases {
        println!(
            "{engine} {}: p50 {:.3} ms, p99 {:.3} ms",
            case.case, case.p50_ms, case.p99_ms
        );
    }
    Ok(cases)
}

/// `uring / epoll`, or `-` when either side is missing or zero.
fn ratio(uring: Option<f64>, epoll: Option<f64>) -> String {
    match (uring, epoll) {
        (Some(u), Some(e)) if e > 0.0 && u.is_finite() => format!("{:.2}", u / e),
        _ => "-".to_owned(),
    }
}

fn write_report(root: &Path, report: &Report) -> Result<()> {
    let out_dir = root.join("bench/results");
    fs::create_dir_all(&out_dir)?;
    let json_path = out_dir.join("io.json");
    fs::write(&json_path, serde_json::to_vec_pretty(report)?)?;
    let mut md = format!(
        "# bench io: io_uring engine vs epoll engine\n\ncommit {}, {}, {} pods running on the \
         lab's containerd. Each engine in turn: an agent with `--io-engine=<engine>`; CRI calls, \
         cgroup file sweeps and whole stats scrapes (`StatsProvider::scrape`, what `/stats/summary` \
         runs, without HTTP) from `agent/examples/io_bench` on the same engine (sequential calls \
         after a warm-up; CPU is the example process's, `io_uring` workers included); HTTPS through \
         the `bench server` load generator ({} s per case after a 1 s warm-up, TLS keep-alive, \
         client certificate; CPU is the agent's). Ratios are uring / epoll: below 1 means uring \
         is faster (latency, CPU), above 1 means uring does more per second.\nMachine: {}\n",
        report.commit,
        report.date,
        report.pods,
        report.seconds_per_https_case,
        report.machine.describe()
    );
    let mut sections: Vec<&str> = Vec::new();
    for case in &report.cases {
        if !sections.contains(&case.section.as_str()) {
            sections.push(&case.section);
        }
    }
    for section in sections {
        write!(
            md,
            "\n## {section}\n\n\
             | case | p50 ms uring | p50 ms epoll | p50 ratio | p99 ms uring | p99 ms epoll | \
             p99 ratio | per s uring | per s epoll | ratio | CPU ms/op uring | CPU ms/op epoll | \
             CPU ratio | errors u/e |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
        )?;
        let mut names: Vec<&str> = Vec::new();
        for case in report.cases.iter().filter(|c| c.section == section) {
            if !names.contains(&case.case.as_str()) {
                names.push(&case.case);
            }
        }
        for name in names {
            let find = |engine: &str| {
                report
                    .cases
                    .iter()
                    .find(|c| c.section == section && c.case == name && c.engine == engine)
            };
            let (u, e) = (find("uring"), find("epoll"));
            let cell = |c: Option<&Measurement>, f: fn(&Measurement) -> f64, digits: usize| {
                c.map_or_else(|| "-".to_owned(), |c| format!("{:.digits$}", f(c)))
            };
            let errors = |c: Option<&Measurement>| {
                c.map_or_else(|| "-".to_owned(), |c| c.errors.to_string())
            };
            let p50 = |c: &Measurement| c.p50_ms;
            let p99 = |c: &Measurement| c.p99_ms;
            let rate = |c: &Measurement| c.per_second;
            let cpu = |c: &Measurement| c.cpu_ms_per_op;
            writeln!(
                md,
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {}/{} |",
                cell(u, p50, 3),
                cell(e, p50, 3),
                ratio(u.map(p50), e.map(p50)),
                cell(u, p99, 3),
                cell(e, p99, 3),
                ratio(u.map(p99), e.map(p99)),
                cell(u, rate, 0),
                cell(e, rate, 0),
                ratio(u.map(rate), e.map(rate)),
                cell(u, cpu, 4),
                cell(e, cpu, 4),
                ratio(u.map(cpu), e.map(cpu)),
                errors(u),
                errors(e),
            )?;
        }
    }
    write_failures(&mut md, &report.cases)?;
    let md_path = out_dir.join("io.md");
    fs::write(&md_path, &md)?;
    println!(
        "{md}\nwrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}

/// The cases that stopped early and why.
fn write_failures(md: &mut String, cases: &[Measurement]) -> Result<()> {
    let failures: Vec<&Measurement> = cases.iter().filter(|c| c.failure.is_some()).collect();
    if !failures.is_empty() {
        md.push_str("\n## failed cases\n\n");
        for case in failures {
            writeln!(
                md,
                "- {} {} on {}: {}",
                case.section,
                case.case,
                case.engine,
                case.failure.as_deref().unwrap_or_default()
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratio_is_uring_over_epoll_and_dashes_what_cannot_be_divided() {
        assert_eq!(ratio(Some(1.0), Some(4.0)), "0.25");
        assert_eq!(ratio(Some(1.0), Some(0.0)), "-");
        assert_eq!(ratio(None, Some(1.0)), "-");
        assert_eq!(ratio(Some(f64::NAN), Some(1.0)), "-");
    }
}
