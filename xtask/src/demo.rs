//! `cargo xtask demo`: sets the lab up and runs ringlet in the foreground on the example static pods in
//! `deploy/examples/pods/`, until Ctrl-C. Once the pods run it kills one container and shows the
//! chain of that exit through the agent (see `exit_chain`), then streams the lifecycle events.
//! Ctrl-C stops the pods first (their manifests go, so the agent stops them as the kubelet would),
//! then the agent: nothing of the demo is left running.

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::{cargo, cmd, exit_chain, lab, workspace_root};

const READ_ONLY_PORT: u16 = 10255;
const API_PORT: u16 = 10250;
/// The agent's default event socket (`--events-socket`).
const EVENTS_SOCKET: &str = "/run/ringlet/events.sock";
/// The node name the demo's agent runs as; its static pods are `<name>-ringlet-demo`.
const NODE_NAME: &str = "ringlet-demo";
/// How long Ctrl-C waits for the agent to stop the pods (their grace periods are 30 s at most).
const STOP_PODS_WITHIN: Duration = Duration::from_mins(1);

pub fn run() -> Result<()> {
    // The demo's agent shares the lab's containerd with the tests' agents and conformance runs.
    let _node_lock = ringlet_tests::node_lock::node_lock()?;
    lab::up()?;
    let root = workspace_root();
    cmd::run(cargo().current_dir(&root).args(["build", "-p", "ringlet"]))?;

    let demo_dir = Path::new(lab::LAB_DIR).join("demo");
    let manifests = demo_dir.join("manifests");
    let root_dir = demo_dir.join("root");
    fs::create_dir_all(&manifests).with_context(|| format!("creating {}", manifests.display()))?;
    fs::create_dir_all(&root_dir).with_context(|| format!("creating {}", root_dir.display()))?;
    copy_example_pods(&root.join("deploy/examples/pods"), &manifests)?;
    // A client CA the agent trusts and an admin certificate it signed, so the kubelet API can be
    // tried with curl.
    ringlet_tests::ClientIdentity::write(&demo_dir)?;
    let client_ca = ringlet_tests::ClientIdentity::ca_file(&demo_dir);
    let (client_cert, client_key) = ringlet_tests::ClientIdentity::paths(&demo_dir);
    let serving_cert = root_dir.join("pki/kubelet.crt");

    let mut agent = Command::new(root.join("target/debug/ringlet"));
    let config = root.join("deploy/examples/kubelet-config.yaml");
    if config.exists() {
        agent.arg("--config").arg(&config);
    } else {
        println!(
            "note: {} is missing, running with defaults",
            config.display()
        );
    }
    agent
        .args(ringlet_tests::LAB_AGENT_FLAGS)
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(&root_dir)
        .arg("--read-only-port")
        .arg(READ_ONLY_PORT.to_string())
        .arg("--client-ca-file")
        .arg(&client_ca)
        .args(["--hostname-override", NODE_NAME]);
    let api_curl = format!(
        "curl --cacert {} --cert {} --key {} https://127.0.0.1:{API_PORT}",
        serving_cert.display(),
        client_cert.display(),
        client_key.display()
    );

    println!(
        "\nringlet is starting on the pods in {}. Look at it with:\n  \
         curl -s localhost:{READ_ONLY_PORT}/pods\n  \
         curl localhost:10248/healthz\n  \
         {api_curl}/pods   (the kubelet API over TLS; also /stats/summary, /configz,\n    \
         /metrics/resource, /containerLogs/default/env-ringlet-demo/main, /runningpods/)\n  \
         ctr -n k8s.io containers ls\n  \
         curl localhost:18080   (the web pod's hostPort)\n\
         Add, edit or remove manifests in that directory while it runs. Ctrl-C stops the pods, \
         then ringlet; `cargo xtask lab down` then removes the lab.\n",
        manifests.display()
    );
    // In a process group of its own, Ctrl-C does not reach ringlet: the demo stops the pods
    // through it first, then stops it.
    let mut child = agent
        .process_group(0)
        .spawn()
        .context("starting target/debug/ringlet")?;
    let agent_pid = child.id();
    ctrlc::set_handler(move || stop(agent_pid, &manifests))
        .context("installing the Ctrl-C handler")?;
    let ringlet = root.join("target/debug/ringlet");
    if let Err(error) = exit_chain::show(&ringlet, READ_ONLY_PORT, Path::new(EVENTS_SOCKET)) {
        println!("note: the exit chain could not be shown: {error:#}");
    }
    let status = child.wait().context("waiting for ringlet")?;
    println!("ringlet exited: {status}");
    if !status.success() && status.code().is_some() {
        bail!("ringlet failed: {status}");
    }
    Ok(())
}

fn copy_example_pods(from: &Path, to: &Path) -> Result<()> {
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let path = entry?.path();
        if path
            .extension()
            .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
            && let Some(name) = path.file_name()
        {
            fs::copy(&path, to.join(name))
                .with_context(|| format!("copying {}", path.display()))?;
        }
    }
    Ok(())
}

/// Ctrl-C: removes the pods' manifests, waits until the agent has stopped their sandboxes (or
/// [`STOP_PODS_WITHIN`] passed), then stops the agent; sandboxes still there are removed through CRI.
fn stop(agent_pid: u32, manifests: &Path) {
    println!(
        "\nstopping the demo's pods (removing their manifests from {})",
        manifests.display()
    );
    for manifest in manifest_files(manifests) {
        if let Err(error) = fs::remove_file(&manifest) {
            println!("note: removing {}: {error}", manifest.display());
        }
    }
    let deadline = Instant::now() + STOP_PODS_WITHIN;
    loop {
        match ringlet_tests::count_sandboxes_of_node(NODE_NAME) {
            Ok(0) => break,
            Ok(left) if Instant::now() >= deadline => {
                println!("{left} sandboxes still there after {STOP_PODS_WITHIN:?}");
                break;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(500)),
            Err(error) => {
                println!("note: listing the sandboxes: {error:#}");
                break;
            }
        }
    }
    println!("stopping ringlet");
    ringlet_tests::daemon::signal(agent_pid, libc::SIGTERM);
    if let Err(error) = ringlet_tests::remove_sandboxes_of_node(NODE_NAME) {
        println!("note: removing what is left of the demo's pods: {error:#}");
    }
}

/// The manifests in `dir`.
fn manifest_files(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.extension()
                .is_some_and(|e| e == "yaml" || e == "yml" || e == "json")
        })
        .collect()
}
