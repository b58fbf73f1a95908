//! `cargo xtask conformance`: the Kubernetes e2e suite (`e2e.test` run by ginkgo, from the shared
//! conformance folder) against ringlet and the upstream kubelet, one after the other on the same
//! setup: the lab's containerd with the images the suite uses ([`images`]), the control plane with
//! kube-controller-manager and kube-scheduler, and the agent joined as node `localhost`
//! ([`node`]). Each agent's ginkgo report is read into [`report`]'s records; a run of a whole
//! suite ([`suites`]) replaces that agent's column of the suite's section in
//! `bench/results/conformance.{json,md}`, a run with `--focus` or `--skip` of its own only prints
//! its results. A Ctrl-C (or SIGTERM) stops ginkgo, and the node is cleaned up before the command
//! exits.

pub mod images;
mod node;
mod report;
mod suites;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use ringlet_tests::cluster::{CLUSTER_DIR, Cluster, KUBECTL};

use crate::benchkit;
use crate::kubelet_host::find_kubelet;
use crate::{cluster, lab, workspace_root};
use node::{AgentKind, Node};
use report::{AgentRun, Results};
pub use suites::Suite;

/// The e2e suite's version (the conformance folder's binaries).
const E2E_VERSION: &str = "v1.36.2";
/// The results file's name under `bench/results/`.
const RESULTS: &str = "conformance";
/// Where each agent's run (its log, ginkgo's output and report) goes.
const RUN_DIR: &str = "conformance";
/// ginkgo's own timeout for the whole suite (its default, 1 h, is shorter than a broader run).
const SUITE_TIMEOUT: &str = "4h";

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentChoice {
    Ringlet,
    Kubelet,
    /// The kubelet first, then ringlet, on the same setup.
    Both,
}

#[derive(clap::Args, Debug)]
pub struct ConformanceArgs {
    /// Which agent runs as the node.
    #[arg(long, value_enum, default_value_t = AgentChoice::Ringlet)]
    pub agent: AgentChoice,
    /// Which specs: the parallel node conformance specs, the rest of the node's conformance, or
    /// CI's subset.
    #[arg(long, value_enum, default_value_t = Suite::Node)]
    pub suite: Suite,
    /// Run only the specs of the suite that match this regular expression (results are printed,
    /// not written to bench/results).
    #[arg(long)]
    pub focus: Option<String>,
    /// Leave out the specs that match this regular expression (results are printed, not written).
    #[arg(long)]
    pub skip: Option<String>,
    /// ginkgo's parallel processes.
    #[arg(long, default_value_t = 6)]
    pub procs: u32,
    /// The ringlet binary to run instead of a fresh debug build.
    #[arg(long)]
    pub ringlet: Option<PathBuf>,
}

/// Set by Ctrl-C or SIGTERM: no further agent runs, and the command fails after cleaning up.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);
/// The running ginkgo's pid (0 when none), which a SIGTERM to us is passed on to.
static GINKGO: AtomicU32 = AtomicU32::new(0);

pub fn conformance(args: &ConformanceArgs) -> Result<()> {
    let outcomes = run(args)?;
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, failures)| *failures > 0)
        .map(|(agent, failures)| format!("{agent}: {failures} specs did not pass"))
        .collect();
    if args.suite == Suite::Ci && !failed.is_empty() {
        bail!("the CI conformance subset failed: {}", failed.join("; "));
    }
    Ok(())
}

/// Runs the suite on each agent asked for; returns each agent's count of specs not passed.
fn run(args: &ConformanceArgs) -> Result<Vec<(&'static str, usize)>> {
    crate::cmd::ensure_root("the conformance run")?;
    ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        let pid = GINKGO.load(Ordering::SeqCst);
        if pid != 0 {
            ringlet_tests::daemon::signal(pid, libc::SIGINT);
        }
    })
    .context("installing the Ctrl-C handler")?;
    let root = workspace_root();
    // The whole run is the node's: another run's agent (or a test's) would share containerd and
    // the run directory, which the setup clears.
    let _node_lock = ringlet_tests::node_lock::node_lock()?;
    let setup = Setup::prepare(args)?;
    let agents: &[AgentKind] = match args.agent {
        AgentChoice::Ringlet => &[AgentKind::Ringlet],
        AgentChoice::Kubelet => &[AgentKind::Kubelet],
        AgentChoice::Both => &[AgentKind::Kubelet, AgentKind::Ringlet],
    };
    // Only a whole suite's run is a result to keep; CI's subset and a narrowed run are checks.
    let keep = args.focus.is_none() && args.skip.is_none() && args.suite != Suite::Ci;
    let mut results = load_results(&root)?;
    let mut failures = Vec::new();
    let mut ran_all = || -> Result<()> {
        for &kind in agents {
            if INTERRUPTED.load(Ordering::SeqCst) {
                break;
            }
            let (binary, version) = agent_binary(kind, &root, args.ringlet.as_deref())?;
            let (run, outcomes) = setup.run_agent(kind, &binary, version, args.procs)?;
            let not_passed = outcomes.values().filter(|o| !o.passed()).count();
            failures.push((kind.name(), not_passed));
            if keep {
                results
                    .sections
                    .entry(args.suite.name().to_owned())
                    .or_default()
                    .record(kind.name(), run, outcomes);
            }
        }
        Ok(())
    };
    let ran = ran_all();
    // The controllers go whatever happened: the other tests expect a control plane without them.
    cluster::stop_controllers()?;
    ran?;
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; the node was cleaned up");
    }
    if keep {
        let section = results
            .sections
            .entry(args.suite.name().to_owned())
            .or_default();
        args.suite.title().clone_into(&mut section.title);
        section.skip.clone_from(&setup.selection.skip);
        section.focus = if args.suite == Suite::Broader {
            vec![format!("{} specs by name", setup.selection.focus.len())]
        } else {
            setup.selection.focus.clone()
        };
        E2E_VERSION.clone_into(&mut results.e2e_version);
        results.machine = benchkit::machine()?.describe();
        benchkit::write_results(&root, RESULTS, &results, &report::markdown(&results))?;
    }
    Ok(failures)
}

/// What every agent's run shares: the suite's binaries, the selection and the run directory.
struct Setup {
    ginkgo: PathBuf,
    e2e: PathBuf,
    selection: suites::Selection,
    run_root: PathBuf,
    cluster: Cluster,
}

impl Setup {
    /// Brings up the lab, the control plane with its controllers and the images, and selects the
    /// specs.
    fn prepare(args: &ConformanceArgs) -> Result<Self> {
        println!("== lab");
        lab::up()?;
        println!("== control plane with controller manager and scheduler");
        cluster::up(true)?;
        println!("== e2e images");
        images::build_and_import()?;
        let folder = cluster::run_conformance_setup()?;
        let ginkgo = folder.join("ginkgo");
        let e2e = folder.join("e2e.test");
        let run_root = Path::new(lab::LAB_DIR).join(RUN_DIR);
        std::fs::create_dir_all(&run_root)
            .with_context(|| format!("creating {}", run_root.display()))?;
        let mut selection = suites::selection(args.suite, &ginkgo, &e2e, &run_root)?;
        if args.focus.is_some() || args.skip.is_some() {
            selection = suites::narrow(
                &selection,
                args.focus.as_deref(),
                args.skip.as_deref(),
                &ginkgo,
                &e2e,
                &run_root,
            )?;
        }
        let selected = suites::dry_run(&ginkgo, &e2e, &selection, &run_root.join("dry-run"))?;
        println!("{} specs selected", selected.len());
        if selected.is_empty() {
            bail!("the suite with this focus and skip selects no spec");
        }
        if args.suite == Suite::Ci {
            suites::check_ci_specs(&selected)?;
        }
        Ok(Self {
            ginkgo,
            e2e,
            selection,
            run_root,
            cluster: Cluster::local(),
        })
    }

    /// One agent as the node through the selected specs, cleaned up after however they went.
    fn run_agent(
        &self,
        kind: AgentKind,
        binary: &Path,
        version: String,
        procs: u32,
    ) -> Result<(AgentRun, report::Outcomes)> {
        let run_dir = self.run_root.join(kind.name());
        fresh_dir(&run_dir)?;
        println!("== {} as node {}: {version}", kind.name(), node::NODE);
        let started = benchkit::now_utc()?;
        let clock = Instant::now();
        let node = Node::start(kind, binary, &self.cluster, &run_dir)?;
        let ran = run_ginkgo(&self.ginkgo, &self.e2e, &self.selection, procs, &run_dir);
        let agent_log = node.log().to_path_buf();
        let cleaned = node.clean_up(&self.cluster);
        let outcomes = ran.and_then(|()| {
            let json = std::fs::read_to_string(run_dir.join("report.json"))
                .with_context(|| format!("reading ginkgo's report in {}", run_dir.display()))?;
            report::parse_ginkgo_report(&json)
        })?;
        cleaned?;
        let not_passed: Vec<_> = outcomes.iter().filter(|(_, o)| !o.passed()).collect();
        println!(
            "{}: {} of {} specs passed; its log {}, ginkgo's output in {}",
            kind.name(),
            outcomes.len() - not_passed.len(),
            outcomes.len(),
            agent_log.display(),
            run_dir.display()
        );
        for (name, outcome) in not_passed {
            println!("  {}: {name}\n      {}", outcome.state, outcome.message);
        }
        let run = AgentRun {
            version,
            started,
            minutes: (clock.elapsed().as_secs_f64() / 60.0 * 10.0).round() / 10.0,
            procs,
        };
        Ok((run, outcomes))
    }
}

/// The binary of `kind` and a line saying which it is.
fn agent_binary(kind: AgentKind, root: &Path, ringlet: Option<&Path>) -> Result<(PathBuf, String)> {
    match kind {
        AgentKind::Kubelet => find_kubelet().map_err(anyhow::Error::msg),
        AgentKind::Ringlet => {
            if let Some(binary) = ringlet {
                return Ok((
                    binary.to_path_buf(),
                    format!("ringlet {}", binary.display()),
                ));
            }
            let binary = ringlet_tests::ringlet_binary()?;
            Ok((
                binary,
                format!("ringlet {} (debug build)", benchkit::git_commit(root)),
            ))
        }
    }
}

/// Runs the selected specs with ginkgo in parallel; its report goes to `report.json` in
/// `run_dir`, its output to the terminal and `ginkgo.log`.
fn run_ginkgo(
    ginkgo: &Path,
    e2e: &Path,
    selection: &suites::Selection,
    procs: u32,
    run_dir: &Path,
) -> Result<()> {
    let mut command = Command::new(ginkgo);
    command
        .arg(format!("--procs={procs}"))
        .arg(format!("--timeout={SUITE_TIMEOUT}"))
        .args(["--no-color", "--silence-skips", "--json-report=report.json"])
        .arg(format!("--output-dir={}", run_dir.display()));
    suites::add_filters(&mut command, selection);
    let kubectl = Path::new(CLUSTER_DIR).join(KUBECTL);
    let admin = Cluster::local().admin_kubeconfig;
    command
        .arg(e2e)
        .arg("--")
        .arg(format!("--kubeconfig={}", admin.display()))
        .arg(format!("--kubectl-path={}", kubectl.display()))
        .args([
            "--provider=local",
            "--minStartupPods=0",
            "--allowed-not-ready-nodes=0",
        ])
        .arg(format!("--report-dir={}", run_dir.display()));
    let log = std::fs::File::create(run_dir.join("ginkgo.log"))?;
    let mut child = command
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", ginkgo.display()))?;
    GINKGO.store(child.id(), Ordering::SeqCst);
    let status = child.wait();
    GINKGO.store(0, Ordering::SeqCst);
    let status = status.context("waiting for ginkgo")?;
    // ginkgo exits 1 when a spec failed: the report says which. Without a report it failed itself.
    if !run_dir.join("report.json").exists() {
        bail!(
            "ginkgo exited with {status} without a report; see {}",
            run_dir.join("ginkgo.log").display()
        );
    }
    Ok(())
}

fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        benchkit::unmount_below(dir)?;
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

/// The committed results, to update one section of; empty when there are none yet.
fn load_results(root: &Path) -> Result<Results> {
    let path = root.join("bench/results").join(format!("{RESULTS}.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Results::default()),
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}
