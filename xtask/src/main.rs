//! `cargo xtask`: ringlet's developer tasks. `lab` prepares a real containerd on this machine,
//! `cluster` a real Kubernetes control plane on loopback, `image` builds the agent's container
//! image, `demo` runs the agent on example static pods, `test` runs every test tier,
//! `conformance` runs the Kubernetes e2e conformance specs against it, `bench` measures it.

mod bench;
mod benchkit;
mod cluster;
mod cluster_bench;
mod cmd;
mod compare_bench;
mod conformance;
mod demo;
mod density_bench;
mod exit_chain;
mod exit_poll;
mod fuzz;
mod health_watch;
mod hollow_host;
mod http;
mod image;
mod io_bench;
mod kubelet_host;
mod lab;
mod lab_registry;
mod machine_cpu;
mod node_bench;
mod oci;
mod pleg_bench;
mod pressure_bench;
mod probe_bench;
mod scale_bench;
mod scale_report;
mod server_bench;
mod test;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ringlet developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Manage the local containerd lab (packages, images, CNI, containerd).
    Lab {
        #[command(subcommand)]
        action: LabAction,
    },
    /// Manage the local control plane (etcd and kube-apiserver on loopback).
    Cluster {
        #[command(subcommand)]
        action: ClusterAction,
    },
    /// Build the agent's container image (static binary and CA bundle) under target/image/.
    Image {
        /// Also import it into the lab's containerd (namespace k8s.io).
        #[arg(long)]
        import: bool,
    },
    /// Set the lab up and run ringlet on the example static pods in the foreground.
    Demo,
    /// Run the unit and component tests, then the privileged suite against the lab.
    Test,
    /// Run one target's property tests over and over with fresh seeds (the long form of the fuzzing
    /// that `cargo test` does with a fixed number of cases).
    Fuzz(fuzz::FuzzArgs),
    /// Run the Kubernetes e2e conformance specs against ringlet and/or the upstream kubelet as
    /// node `localhost` of a full control plane; results in bench/results/conformance.{json,md}.
    Conformance(conformance::ConformanceArgs),
    /// Run a benchmark and write its results under bench/results/.
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
}

#[derive(Subcommand)]
enum LabAction {
    /// Install missing packages, build and import the images, start containerd.
    Up {
        /// The containerd release to run: 1.6 (Debian bookworm's, the default) or 1.7 (trixie's,
        /// for the kubelet's Evented PLEG); a lab containerd of the other release is stopped.
        /// Without it, whichever the lab runs stays.
        #[arg(long, value_enum)]
        containerd: Option<lab::Containerd>,
        /// Also start the lab's private image registry (TLS and htpasswd on 127.0.0.1:5443) and
        /// push the lab's busybox to it.
        #[arg(long)]
        registry: bool,
    },
    /// Stop the containerd (and the registry) that `lab up` started.
    Down,
    /// Show packages, containerd and images.
    Status,
}

#[derive(Subcommand)]
enum ClusterAction {
    /// Generate the PKI, kubeconfigs and bootstrap token, start etcd and kube-apiserver.
    Up {
        /// Also start kube-controller-manager and kube-scheduler (from the conformance folder).
        #[arg(long)]
        controllers: bool,
    },
    /// Stop what `cluster up` started (the scheduler, controller manager, kube-apiserver, etcd).
    Down,
    /// Show what runs and whether the API server is ready.
    Status,
}

#[derive(Subcommand)]
enum Bench {
    /// Time from agent start to all static pods running, and from a container exit to the status change.
    Startup(bench::StartupArgs),
    /// eBPF PLEG vs relist PLEG: exit latency, idle CPU, and a synthetic high-density churn.
    Pleg(pleg_bench::PlegArgs),
    /// The kubelet API over TLS: requests/s and latency of /pods and /healthz under keep-alive load.
    Server(server_bench::ServerArgs),
    /// `io_uring` vs epoll engine: CRI round trips, cgroup sweeps and the kubelet API on both.
    Io(io_bench::IoArgs),
    /// ringlet and the upstream kubelet as nodes of one control plane: API pods, idle cost, audit.
    Cluster(cluster_bench::ClusterArgs),
    /// Probes at periodSeconds 1 on 100 pods: agent CPU and probe latency, ringlet vs the kubelet.
    Probes(probe_bench::ProbesArgs),
    /// ringlet ebpf, ringlet relist and the upstream kubelet on the same static pods: exit →
    /// status, start, teardown, idle CPU and RSS, with ratios against the kubelet.
    Compare(compare_bench::CompareArgs),
    /// 100 to 1,000 real pods on one node in both PLEG modes: start, idle cost, exit → status.
    Density(density_bench::DensityArgs),
    /// Memory pressure, ringlet and the kubelet as nodes: from a `memory.available` threshold
    /// crossing to the first eviction and to the node's `MemoryPressure` condition.
    Pressure(pressure_bench::PressureArgs),
    /// 1,000 to 10,000 pods on ringlet-hollow (a scale harness, not a runtime), ringlet and the
    /// kubelet, standalone and as a node: idle cost, relist, exit → status, API requests.
    Scale(scale_bench::ScaleArgs),
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Lab { action } => match action {
            LabAction::Up {
                containerd,
                registry,
            } => lab::up_with(containerd)
                .and_then(|()| if registry { lab_registry::up() } else { Ok(()) }),
            LabAction::Down => lab::down(),
            LabAction::Status => lab::status(),
        },
        Command::Cluster { action } => match action {
            ClusterAction::Up { controllers } => cluster::up(controllers),
            ClusterAction::Down => cluster::down(),
            ClusterAction::Status => cluster::status(),
        },
        Command::Image { import } => image::run(import),
        Command::Demo => demo::run(),
        Command::Test => test::run(),
        Command::Fuzz(args) => fuzz::fuzz(&args),
        Command::Conformance(args) => conformance::conformance(&args),
        Command::Bench { bench } => match bench {
            Bench::Startup(args) => bench::startup(&args),
            Bench::Pleg(args) => pleg_bench::pleg(&args),
            Bench::Server(args) => server_bench::server(&args),
            Bench::Io(args) => io_bench::io(&args),
            Bench::Cluster(args) => cluster_bench::cluster(&args),
            Bench::Probes(args) => probe_bench::probes(&args),
            Bench::Compare(args) => compare_bench::compare(&args),
            Bench::Density(args) => density_bench::density(&args),
            Bench::Pressure(args) => pressure_bench::pressure(&args),
            Bench::Scale(args) => scale_bench::scale(&args),
        },
    }
}

/// The workspace root: xtask lives one level below it.
fn workspace_root() -> PathBuf {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map_or_else(|| manifest_dir.clone(), PathBuf::from)
}

/// The cargo that runs us, so nested builds use the same toolchain, without the variables
/// `cargo run` set for xtask (see [`ringlet_tests::cargo_command`]).
fn cargo() -> std::process::Command {
    ringlet_tests::cargo_command()
}
