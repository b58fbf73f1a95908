//! `cargo xtask demo`: sets the lab up and runs ringlet in the foreground on the example static pods in
//! `deploy/examples/pods/`, until Ctrl-C. Once the pods run it kills one container and shows the
//! chain of that exit through the agent (see `exit_chain`), then streams the lifecycle events.

use std::fs;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::{cargo, cmd, exit_chain, lab, workspace_root};

const READ_ONLY_PORT: u16 = 10255;
const API_PORT: u16 = 10250;
/// The agent's default event socket (`--events-socket`).
const EVENTS_SOCKET: &str = "/run/ringlet/events.sock";

pub fn run() -> Result<()> {
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
        .arg("--pod-manifest-path")
        .arg(&manifests)
        .arg("--root-dir")
        .arg(&root_dir)
        .arg("--read-only-port")
        .arg(READ_ONLY_PORT.to_string())
        .arg("--client-ca-file")
        .arg(&client_ca)
        .args(["--hostname-override", "ringlet-demo"]);
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
         Add, edit or remove manifests in that directory while it runs. Ctrl-C stops ringlet \
         (the pods keep running, as with the kubelet; remove their manifests first to stop them).\n",
        manifests.display()
    );
    let mut child = agent.spawn().context("starting target/debug/ringlet")?;
    // Ctrl-C reaches ringlet through the terminal's process group; ignoring it here lets us wait for
    // ringlet's own clean shutdown instead of leaving it orphaned.
    ignore_sigint();
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

fn ignore_sigint() {
    // SAFETY: installing SIG_IGN has no handler code to be unsafe in; it only changes the disposition.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
}
