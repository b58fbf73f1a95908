//! The `ringlet-hollow` binary: a hollow CRI endpoint for scale tests (a scale harness, not a
//! container runtime).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use ringlet_hollow::cgroup::Driver;
use ringlet_hollow::server::{self, Settings};
use tokio::signal::unix::{SignalKind, signal};

/// ringlet-hollow is a SCALE HARNESS, NOT A CONTAINER RUNTIME. It answers the CRI calls of a node
/// agent (ringlet or the upstream kubelet) as containerd's CRI plugin does, but runs no images:
/// each container is a tiny process (`ringlet-hollow-child`) forked into a real cgroup below
/// its pod's cgroup, without namespaces, rootfs, network or shim. Kernel cgroup and exit events are
/// real; nothing else is. State is kept in memory: a restart forgets every sandbox, container and
/// image, and the containers' processes are killed with the runtime.
#[derive(Debug, Parser)]
#[command(
    name = "ringlet-hollow",
    version,
    after_help = "Container commands: the words of `command` then `args` run in order: \
`sleep:<ms>` sleeps, `out:<text>` / `err:<text>` write a line to the CRI log, \
`ignore-sigterm` makes SIGTERM ineffective, `exit:<code>` exits with that code (0-255). Other \
words are ignored; without `exit:` the process waits until a signal ends it (exit code 128 + the \
signal). ExecSync, Exec, Attach and PortForward are not supported."
)]
struct Cli {
    /// The unix socket to serve the CRI on (the agent's `--container-runtime-endpoint`).
    #[arg(long, default_value = "/run/ringlet-hollow/hollow.sock")]
    listen: PathBuf,
    /// Reported as the image and writable-layer filesystem.
    #[arg(long, default_value = "/var/lib/ringlet-hollow")]
    root: PathBuf,
    /// The agent's cgroup driver: how containers' cgroups are named, and what `RuntimeConfig`
    /// reports.
    #[arg(long, value_enum, default_value = "cgroupfs")]
    cgroup_driver: Driver,
    /// The program containers run [default: `ringlet-hollow-child` next to this binary].
    #[arg(long)]
    child_program: Option<PathBuf>,
    /// Log filter (`RUST_LOG` syntax).
    #[arg(long, env = "RUST_LOG", default_value = "info")]
    log: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    // One thread: containers are forked from it (see `server::serve`), and the harness should cost
    // next to nothing.
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ringlet-hollow: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let settings = Settings {
        listen: cli.listen,
        root: cli.root,
        driver: cli.cgroup_driver,
        child_program: cli.child_program,
    };
    let served = runtime.block_on(async {
        let (mut terminate, mut interrupt) = (
            signal(SignalKind::terminate()).map_err(anyhow::Error::from)?,
            signal(SignalKind::interrupt()).map_err(anyhow::Error::from)?,
        );
        let shutdown = async move {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = interrupt.recv() => {}
            }
        };
        server::serve(settings, shutdown)
            .await
            .map_err(anyhow::Error::from)
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ringlet-hollow: {e:#}");
            ExitCode::FAILURE
        }
    }
}
