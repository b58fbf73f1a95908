//! `cargo xtask fuzz <target> --seconds N` (issue 14 §3): the long form of the property tests that
//! run with a fixed number of cases in every `cargo test`. It builds the agent's unit tests once
//! (release, so more cases per second) and runs one target's property tests again and again, each run
//! with fresh random seeds, until the time is up or a case fails. A failure prints proptest's
//! minimal failing input and its seed (`PROPTEST_RNG_SEED` replays it); the finding then becomes a
//! named regression test next to the property.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde_json::Value;

use crate::{cargo, workspace_root};

/// What can be fuzzed: each is a module of property tests in the agent.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Target {
    /// Manifest decoding, defaulting and validation (`podconfig::proptests`).
    Manifests,
    /// The `KubeletConfiguration` file and flag loader (`apis::config::proptests`).
    Config,
    /// The eBPF ring buffer record reader and event decoder.
    EbpfDecoder,
    /// The CRI log-line parser, the log reader and the `/containerLogs` query.
    Logs,
    /// The kubelet API's paths, `/exec`, `/attach` and `/portForward` queries and `/logs/` paths.
    KubeletApi,
}

impl Target {
    /// The test-name filter that selects the target's property tests.
    fn filter(self) -> &'static str {
        match self {
            Self::Manifests => "podconfig::proptests::",
            Self::Config => "apis::config::proptests::",
            Self::EbpfDecoder => "ebpf::reader::tests::properties::",
            Self::Logs => "kuberuntime::logs::proptests::",
            Self::KubeletApi => "server::proptests::",
        }
    }
}

#[derive(Args)]
pub struct FuzzArgs {
    /// Which property tests to run.
    #[arg(value_enum)]
    target: Target,
    /// How long to keep running them.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
}

pub fn fuzz(args: &FuzzArgs) -> Result<()> {
    let binary = build_unit_tests()?;
    let filter = args.target.filter();
    let budget = Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut rounds = 0u64;
    while started.elapsed() < budget {
        let output = Command::new(&binary)
            .args([filter, "--quiet"])
            .output()
            .with_context(|| format!("running {}", binary.display()))?;
        rounds += 1;
        if !output.status.success() {
            println!("{}", String::from_utf8_lossy(&output.stdout));
            eprintln!("{}", String::from_utf8_lossy(&output.stderr));
            bail!(
                "fuzz {:?}: a case failed in round {rounds} after {:.0?}; make the minimal input above a regression test",
                args.target,
                started.elapsed()
            );
        }
        if rounds == 1 && String::from_utf8_lossy(&output.stdout).contains("running 0 tests") {
            bail!("fuzz {:?}: no test matches {filter}", args.target);
        }
    }
    println!(
        "fuzz {:?}: {rounds} rounds of {filter} in {:.0?}, no failure",
        args.target,
        started.elapsed()
    );
    Ok(())
}

/// Builds the agent's unit tests in release and returns the test binary.
fn build_unit_tests() -> Result<PathBuf> {
    let output = cargo()
        .current_dir(workspace_root())
        .args([
            "test",
            "-p",
            "ringlet",
            "--lib",
            "--release",
            "--no-run",
            "--message-format=json",
        ])
        .output()
        .context("running cargo test --no-run")?;
    if !output.status.success() {
        bail!(
            "building the unit tests failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .find_map(|message| message["executable"].as_str().map(PathBuf::from))
        .context("cargo built no test executable for the ringlet lib")
}
