//! `cargo xtask bench server`: the kubelet API's throughput and latency over TLS. An agent with 100
//! static pods serves the API with client-certificate authentication; an in-process load generator
//! (hyper + rustls on a single-threaded tokio runtime, so it takes one of the machine's cores and
//! leaves the other to the agent) keeps N keep-alive connections busy with one path for a fixed
//! time and records every request's latency and the agent's CPU time.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use serde::Serialize;

use crate::benchkit::{
    self, Agent, cleanup, free_port, fresh_run_dir, git_commit, machine, now_utc, percentile,
    process_cpu_seconds, sleep_pod_manifest, wait_all_running,
};
use crate::{lab, workspace_root};

const NAMESPACE: &str = "ringlet-bench";
const WARMUP: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct ServerArgs {
    /// Concurrent keep-alive connections to measure, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    connections: Vec<usize>,
    /// Paths to load, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "/pods,/healthz")]
    paths: Vec<String>,
    /// Static pods the agent runs while it is measured.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Seconds of load per (path, connections) case, after a 1 s warm-up.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    /// Benchmark this ringlet binary instead of building target/release/ringlet.
    #[arg(long)]
    binary: Option<PathBuf>,
    /// Extra flags passed to ringlet, after `--`.
    #[arg(last = true)]
    ringlet_args: Vec<String>,
}

#[derive(Serialize)]
struct Case {
    path: String,
    connections: usize,
    requests: usize,
    errors: usize,
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// The agent's CPU time (user + system) per second of load.
    agent_cpu_per_second: f64,
}

#[derive(Serialize)]
struct Report {
    benchmark: &'static str,
    date: String,
    commit: String,
    pods: usize,
    seconds_per_case: u64,
    ringlet_args: Vec<String>,
    machine: benchkit::Machine,
    cases: Vec<Case>,
}

pub fn server(args: &ServerArgs) -> Result<()> {
    if args.connections.is_empty() || args.connections.contains(&0) || args.paths.is_empty() {
        bail!("--connections needs counts above 0 and --paths at least one path");
    }
    lab::up()?;
    let root = workspace_root();
    let binary = benchkit::ringlet_binary(&root, args.binary.as_deref())?;
    let (run_dir, manifests, root_dir) = fresh_run_dir("server")?;
    for i in 0..args.pods {
        fs::write(
            manifests.join(format!("bench-{i}.yaml")),
            sleep_pod_manifest(&format!("bench-{i}"), NAMESPACE),
        )?;
    }
    let started = Instant::now();
    let (mut agent, read_only_port, api_port) =
        spawn_api_agent(&binary, &run_dir, &args.ringlet_args)?;
    let measured = (|| {
        wait_all_running(&mut agent, read_only_port, args.pods, started, NAMESPACE)?;
        let tls = client_config(&root_dir, &run_dir)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let mut cases = Vec::new();
        for path in &args.paths {
            for &connections in &args.connections {
                let cpu_before = process_cpu_seconds(agent.pid())?;
                let load = Duration::from_secs(args.seconds);
                let result = runtime.block_on(run_load(
                    Arc::clone(&tls),
                    api_port,
                    path,
                    connections,
                    load,
                ))?;
                let cpu = process_cpu_seconds(agent.pid())? - cpu_before;
                agent.exited()?;
                let case = result.summarise(path, connections, cpu);
                println!(
                    "{path} x{connections}: {:.0} req/s, p50 {:.2} ms, p99 {:.2} ms, {} errors",
                    case.requests_per_second, case.p50_ms, case.p99_ms, case.errors
                );
                cases.push(case);
            }
        }
        Ok::<_, anyhow::Error>(cases)
    })();
    // The agent removes the pods once their manifests are gone, so it stops only after that.
    let cleaned = cleanup(&manifests, NAMESPACE);
    agent.stop();
    cleaned?;
    let report = Report {
        benchmark: "server",
        date: now_utc()?,
        commit: git_commit(&root),
        pods: args.pods,
        seconds_per_case: args.seconds,
        ringlet_args: args.ringlet_args.clone(),
        machine: machine()?,
        cases: measured?,
    };
    write_report(&root, &report)
}

/// What the connections of one case measured (the warm-up excluded).
pub(crate) struct LoadResult {
    pub(crate) latencies_ms: Vec<f64>,
    pub(crate) errors: usize,
    pub(crate) elapsed: Duration,
}

impl LoadResult {
    fn summarise(mut self, path: &str, connections: usize, agent_cpu_seconds: f64) -> Case {
        self.latencies_ms.sort_by(f64::total_cmp);
        let seconds = self.elapsed.as_secs_f64();
        #[allow(clippy::cast_precision_loss)]
        let per_second = self.latencies_ms.len() as f64 / seconds;
        Case {
            path: path.to_owned(),
            connections,
            requests: self.latencies_ms.len(),
            errors: self.errors,
            requests_per_second: per_second,
            p50_ms: percentile(&self.latencies_ms, 50.0),
            p99_ms: percentile(&self.latencies_ms, 99.0),
            agent_cpu_per_second: agent_cpu_seconds / seconds,
        }
    }
}

pub(crate) async fn run_load(
    tls: Arc<rustls::ClientConfig>,
    port: u16,
    path: &str,
    connections: usize,
    load: Duration,
) -> Result<LoadResult> {
    let start = Instant::now();
    let measure_from = start + WARMUP;
    let end = measure_from + load;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..connections {
        let tls = Arc::clone(&tls);
        let path = path.to_owned();
        workers.spawn(connection(tls, port, path, measure_from, end));
    }
    let mut result = LoadResult {
        latencies_ms: Vec::new(),
        errors: 0,
        elapsed: load,
    };
    while let Some(joined) = workers.join_next().await {
        let (latencies, errors) = joined??;
        result.latencies_ms.extend(latencies);
        result.errors += errors;
    }
    Ok(result)
}

/// One keep-alive connection sending `GET path` back to back until `end`; latencies of requests
/// started after `measure_from`, and how many failed.
async fn connection(
    tls: Arc<rustls::ClientConfig>,
    port: u16,
    path: String,
    measure_from: Instant,
    end: Instant,
) -> Result<(Vec<f64>, usize)> {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    tcp.set_nodelay(true)?;
    let server_name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(server_name, tcp)
        .await
        .context("TLS handshake with the agent")?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let uri: hyper::Uri = format!("https://127.0.0.1:{port}{path}").parse()?;
    let mut latencies = Vec::new();
    let mut errors = 0;
    while Instant::now() < end {
        let request = hyper::Request::get(uri.clone())
            .header(hyper::header::HOST, "127.0.0.1")
            .body(Empty::<bytes::Bytes>::new())?;
        let sent = Instant::now();
        sender.ready().await?;
        let response = sender.send_request(request).await?;
        let ok = response.status().is_success();
        response.into_body().collect().await?;
        if sent >= measure_from {
            latencies.push(benchkit::ms(sent.elapsed()));
            errors += usize::from(!ok);
        }
    }
    Ok((latencies, errors))
}

/// An agent under load: 100 (or `pods`) static pods, the kubelet API on a free port with the bench's
/// client CA, started with `ringlet_args`; returns it with its read-only and API ports.
pub(crate) fn spawn_api_agent(
    binary: &Path,
    run_dir: &Path,
    ringlet_args: &[String],
) -> Result<(Agent, u16, u16)> {
    ringlet_tests::ClientIdentity::write(run_dir)?;
    let read_only_port = free_port()?;
    let api_port = free_port()?;
    let agent = Agent::spawn(
        Command::new(binary)
            .args(ringlet_tests::LAB_AGENT_FLAGS)
            .arg("--pod-manifest-path")
            .arg(run_dir.join("manifests"))
            .arg("--root-dir")
            .arg(run_dir.join("root"))
            .args(["--read-only-port", &read_only_port.to_string()])
            .args(["--healthz-port", &free_port()?.to_string()])
            .args(["--port", &api_port.to_string()])
            .args(["--address", "127.0.0.1"])
            .arg("--client-ca-file")
            .arg(ringlet_tests::ClientIdentity::ca_file(run_dir))
            .args(["--hostname-override", "ringlet-bench"])
            .args(ringlet_args),
        run_dir.join("ringlet.log"),
    )?;
    Ok((agent, read_only_port, api_port))
}

/// The load generator's TLS client: trusts the agent's generated certificate under `root_dir`.
pub(crate) fn client_config(root_dir: &Path, run_dir: &Path) -> Result<Arc<rustls::ClientConfig>> {
    ringlet_tests::ClientIdentity::tls_client_config(run_dir, &root_dir.join("pki/kubelet.crt"))
}

fn write_report(root: &Path, report: &Report) -> Result<()> {
    let out_dir = root.join("bench/results");
    fs::create_dir_all(&out_dir)?;
    let json_path = out_dir.join("server.json");
    fs::write(&json_path, serde_json::to_vec_pretty(report)?)?;
    let mut md = format!(
        "# bench server: the kubelet API over TLS\n\ncommit {}, {}, {} pods, {} s per case after a \
         1 s warm-up, client certificate auth, keep-alive connections.\nMachine: {}\n\n\
         | path | connections | requests/s | p50 ms | p99 ms | errors | agent CPU s/s |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        report.commit,
        report.date,
        report.pods,
        report.seconds_per_case,
        report.machine.describe()
    );
    for case in &report.cases {
        writeln!(
            md,
            "| `{}` | {} | {:.0} | {:.2} | {:.2} | {} | {:.2} |",
            case.path,
            case.connections,
            case.requests_per_second,
            case.p50_ms,
            case.p99_ms,
            case.errors,
            case.agent_cpu_per_second
        )?;
    }
    let md_path = out_dir.join("server.md");
    fs::write(&md_path, &md)?;
    println!(
        "{md}\nwrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(())
}
