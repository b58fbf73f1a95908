//! `cargo xtask test`: the lints (`cargo fmt --check`, clippy with warnings as errors), the unit and
//! component tiers, then the privileged tiers against the lab (the runtime manager's smoke tests on
//! real containerd, the agent's container image, the end-to-end suite, which shares one control
//! plane for the whole run, and a fixed subset of the upstream e2e conformance specs).
//! Every tier always runs, so one failing tier still shows the others' results.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use crate::conformance::{self, AgentChoice, ConformanceArgs, Suite};
use crate::{cargo, cluster, image, lab, lab_registry, workspace_root};

/// The end-to-end test files whose behaviour depends on the I/O engine: the engine's sockets under
/// the kubelet API (TLS, exec and attach streams, log reads) and its selection and fallback.
const ENGINE_SENSITIVE: &[&str] = &["io_engine", "kubelet_api"];
/// ginkgo's parallel processes for CI's conformance subset.
const CONFORMANCE_PROCS: u32 = 6;

pub fn run() -> Result<()> {
    let root = workspace_root();
    let mut tiers = Tiers::default();
    // The lab first: it installs what the build needs (clang and libbpf headers for the eBPF
    // programs) as well as the containerd the privileged tiers use, and the registry the image
    // pull tests pull from.
    println!("== lab");
    let started = Instant::now();
    lab::up()?;
    lab_registry::up()?;
    // After the lab, which installs etcd-server.
    println!("== control plane");
    cluster::up(false)?;
    // The end-to-end tests do the controllers' work themselves (and expect nothing else to);
    // a conformance run that was killed may have left them running.
    cluster::stop_controllers()?;
    tiers.record("lab and control plane", started, true);

    println!("== lints");
    let started = Instant::now();
    let formatted = cargo()
        .current_dir(&root)
        .args(["fmt", "--all", "--check"])
        .status()?
        .success();
    let clippy = cargo()
        .current_dir(&root)
        .args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        .status()?
        .success();
    let lints = tiers.record("lints", started, formatted && clippy);

    println!("== unit and component tests");
    let started = Instant::now();
    let unit = cargo()
        .current_dir(&root)
        .args([
            "test",
            "--no-fail-fast",
            "--workspace",
            "--exclude",
            "ringlet-tests",
        ])
        .status()?
        .success();
    let unit = tiers.record("unit and component tests", started, unit);

    println!("== privileged tests");
    let started = Instant::now();
    let smoke = cargo()
        .current_dir(&root)
        .args(["test", "-p", "ringlet", "--lib", "kuberuntime::", "--"])
        // The runtime manager's and the streaming API's smoke tests on the lab's containerd.
        .args(["--ignored", "--test-threads=1"])
        .status()?
        .success();
    let smoke = tiers.record("runtime smoke tests", started, smoke);
    // The agent's image for the end-to-end test that runs it (a static release build).
    println!("== container image");
    let started = Instant::now();
    let image = image::run(true)
        .inspect_err(|err| println!("cargo xtask image failed: {err:#}"))
        .is_ok();
    let image = tiers.record("container image", started, image);
    let end_to_end = end_to_end(&root, &mut tiers)?;
    // Last, as it brings up the controller manager and scheduler the other tiers run without:
    // the fixed subset of the upstream e2e suite (`cargo xtask conformance` runs all of it).
    println!("== e2e conformance subset");
    let started = Instant::now();
    let conformance = conformance::conformance(&ConformanceArgs {
        agent: AgentChoice::Ringlet,
        suite: Suite::Ci,
        focus: None,
        skip: None,
        procs: CONFORMANCE_PROCS,
        ringlet: None,
    })
    .inspect_err(|err| println!("cargo xtask conformance --suite ci failed: {err:#}"))
    .is_ok();
    let conformance = tiers.record("e2e conformance subset", started, conformance);
    let privileged = smoke && image && end_to_end && conformance;

    tiers.print();
    if !(lints && unit && privileged) {
        bail!("tests failed");
    }
    Ok(())
}

/// The end-to-end suite. Both I/O engines are first-class: the whole suite runs on the default
/// engine (epoll), and the tests of what the engine carries (sockets, TLS, streams, file reads) run
/// on `io_uring` too.
fn end_to_end(root: &std::path::Path, tiers: &mut Tiers) -> Result<bool> {
    println!("== end-to-end tests on the epoll engine");
    let started = Instant::now();
    let epoll = cargo()
        .current_dir(root)
        .env(ringlet_tests::IO_ENGINE_ENV, "epoll")
        .args([
            "test",
            "--no-fail-fast",
            "-p",
            "ringlet-tests",
            "--",
            "--test-threads=1",
        ])
        .status()?
        .success();
    let epoll = tiers.record("end-to-end tests (epoll)", started, epoll);
    println!("== engine-sensitive end-to-end tests on the uring engine");
    let started = Instant::now();
    let mut uring = cargo();
    uring
        .current_dir(root)
        .env(ringlet_tests::IO_ENGINE_ENV, "uring")
        .args(["test", "--no-fail-fast", "-p", "ringlet-tests"]);
    for test in ENGINE_SENSITIVE {
        uring.args(["--test", test]);
    }
    let uring = uring.args(["--", "--test-threads=1"]).status()?.success();
    let uring = tiers.record("engine-sensitive end-to-end tests (uring)", started, uring);
    Ok(epoll && uring)
}

/// Each tier's outcome and wall time, printed at the end so a run shows where its time went (CI
/// has a time budget).
#[derive(Default)]
struct Tiers(Vec<(&'static str, Duration, bool)>);

impl Tiers {
    /// Records a tier that started at `started` and returns whether it passed.
    fn record(&mut self, name: &'static str, started: Instant, passed: bool) -> bool {
        self.0.push((name, started.elapsed(), passed));
        passed
    }

    fn print(&self) {
        println!("== summary");
        let mut total = Duration::ZERO;
        for (name, took, passed) in &self.0 {
            total += *took;
            let verdict = if *passed { "passed" } else { "FAILED" };
            println!(
                "{name:<45} {verdict:<7} {:>5.1} min",
                took.as_secs_f64() / 60.0
            );
        }
        println!("{:<53} {:>5.1} min", "total", total.as_secs_f64() / 60.0);
    }
}
