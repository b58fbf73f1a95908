//! The node the e2e suite runs its pods on: ringlet or the upstream kubelet joined to the control
//! plane as `localhost` (the API server reaches a node by its Hostname address, and `localhost`
//! resolves to the loopback address the agent serves on), on port 10250, with the cluster CA as
//! its client CA. Each agent runs in its own process group, so a Ctrl-C at the terminal reaches
//! ginkgo but not the agent, which must stay to remove the suite's pods. [`Node::clean_up`]
//! removes what the suite left (its namespaces, any pod bound to the node), waits until
//! containerd holds no container, stops the agent, and deletes the Node, its Lease and `CSINode`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ringlet_tests::cluster::Cluster;
use ringlet_tests::kubelet_host::{LabKubelet, Registration};

use crate::benchkit::{self, Agent, free_port};
use crate::kubelet_host::HostGuard;
use crate::{cmd, lab};

/// The node's name: see the module docs.
pub const NODE: &str = "localhost";
/// The kubelet API's port, the kubelet's default.
const API_PORT: u16 = 10250;
const READY_TIMEOUT: Duration = Duration::from_mins(2);
/// How long the suite's namespaces may take to go once deleted (their pods' grace periods run).
const NAMESPACES_TIMEOUT: Duration = Duration::from_mins(5);
/// How long the agent may take to remove the last containers once their pods are gone; the
/// upstream kubelet removes sandboxes only at its container GC, once a minute.
const CONTAINERS_TIMEOUT: Duration = Duration::from_mins(3);
const POLL: Duration = Duration::from_secs(1);

/// The agents a conformance run can put on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentKind {
    Ringlet,
    Kubelet,
}

impl AgentKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::Ringlet => "ringlet",
            Self::Kubelet => "kubelet",
        }
    }
}

/// One agent running as the node, with what it changed on the host.
pub struct Node {
    agent: Agent,
    kind: AgentKind,
    root_dir: PathBuf,
    run_dir: PathBuf,
    host: Option<HostGuard>,
}

/// Why the node cannot be started yet: another agent runs, holds the eBPF pins, or containerd
/// holds containers (an agent stops the pods it does not know).
pub fn in_the_way() -> Result<Option<String>> {
    let containers = cmd::output(lab::ctr().args(["containers", "ls", "-q"]))?;
    let count = containers.lines().filter(|l| !l.trim().is_empty()).count();
    if count > 0 {
        return Ok(Some(format!(
            "containerd holds {count} containers of other pods"
        )));
    }
    Ok(benchkit::pins_in_use().or_else(|| crate::node_bench::agent_processes(None)))
}

impl Node {
    /// Starts `kind` (`binary`) as node `localhost` with its files in `run_dir`, and waits until the
    /// Node is Ready. The caller holds the node lock: until the old Node is deleted, another
    /// process's agent may be running as `localhost`.
    pub fn start(
        kind: AgentKind,
        binary: &Path,
        cluster: &Cluster,
        run_dir: &Path,
    ) -> Result<Self> {
        benchkit::wait_until_quiet(in_the_way)?;
        delete_node_objects(cluster)?;
        let root_dir = run_dir.join("root");
        std::fs::create_dir_all(&root_dir)
            .with_context(|| format!("creating {}", root_dir.display()))?;
        let kubeconfig = cluster.node_kubeconfig(NODE)?;
        let host = match kind {
            AgentKind::Kubelet => Some(HostGuard::take()?),
            AgentKind::Ringlet => None,
        };
        let mut command = match kind {
            AgentKind::Ringlet => {
                let mut command = Command::new(binary);
                command
                    .arg("--kubeconfig")
                    .arg(&kubeconfig)
                    .args(["--hostname-override", NODE])
                    .arg("--root-dir")
                    .arg(&root_dir)
                    .arg("--client-ca-file")
                    .arg(cluster.ca_file())
                    .args(["--port", &API_PORT.to_string()])
                    .args(["--read-only-port", "0"])
                    .args(["--healthz-port", &free_port()?.to_string()])
                    .args(["--address", "127.0.0.1"])
                    .arg("--pod-logs-dir")
                    .arg(run_dir.join("pod-logs"))
                    .args(ringlet_tests::LAB_AGENT_FLAGS)
                    .args([
                        "--container-runtime-endpoint",
                        &format!("unix://{}", lab::SOCKET),
                    ])
                    .arg("--events-socket")
                    .arg(run_dir.join("events.sock"))
                    .env("RINGLET_LOG", "ringlet=debug,info");
                command
            }
            AgentKind::Kubelet => LabKubelet {
                manifests: run_dir.join("manifests"),
                run_dir: run_dir.to_path_buf(),
                root_dir: root_dir.clone(),
                read_only_port: 0,
                port: API_PORT,
                healthz_port: free_port()?,
                registration: Some(Registration {
                    kubeconfig,
                    client_ca_file: cluster.ca_file(),
                }),
                evented_pleg: false,
            }
            .command(binary, NODE)?,
        };
        // Ctrl-C at the terminal goes to ginkgo, not to the agent that must clean up after it.
        command.process_group(0);
        let agent = Agent::spawn(&mut command, run_dir.join(format!("{}.log", kind.name())))?;
        println!(
            "{} started as node {NODE} (pid {}), log {}",
            kind.name(),
            agent.pid(),
            agent.log.display()
        );
        let mut node = Self {
            agent,
            kind,
            root_dir,
            run_dir: run_dir.to_path_buf(),
            host,
        };
        node.wait_ready(cluster)?;
        Ok(node)
    }

    pub fn log(&self) -> &Path {
        &self.agent.log
    }

    fn wait_ready(&mut self, cluster: &Cluster) -> Result<()> {
        let started = Instant::now();
        loop {
            self.agent.exited()?;
            if cluster
                .get_json(&["node", NODE])
                .is_ok_and(|node| node_ready(&node))
            {
                println!("node {NODE} is Ready after {:?}", started.elapsed());
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                bail!(
                    "node {NODE} was not Ready within {READY_TIMEOUT:?}; see {}",
                    self.agent.log.display()
                );
            }
            std::thread::sleep(POLL);
        }
    }

    /// Removes what the suite left on the node, stops the agent and deletes the node's objects;
    /// every step runs whatever the earlier ones did, and the first error is returned.
    pub fn clean_up(mut self, cluster: &Cluster) -> Result<()> {
        let pods_removed = self.remove_pods(cluster);
        self.agent.stop();
        let objects_removed = delete_node_objects(cluster);
        let host_restored = self.host.take().map_or(Ok(()), HostGuard::restore);
        let files_removed = benchkit::unmount_below(&self.run_dir).and_then(|()| {
            if self.root_dir.exists() {
                std::fs::remove_dir_all(&self.root_dir)
                    .with_context(|| format!("removing {}", self.root_dir.display()))?;
            }
            Ok(())
        });
        println!("{} stopped, node {NODE} removed", self.kind.name());
        pods_removed?;
        objects_removed?;
        host_restored?;
        files_removed
    }

    /// Deletes the suite's namespaces and any pod bound to the node, and waits until the agent has
    /// removed every container.
    fn remove_pods(&mut self, cluster: &Cluster) -> Result<()> {
        cmd::output(cluster.kubectl().args([
            "delete",
            "namespaces",
            "--selector=e2e-run",
            "--wait=false",
            "--ignore-not-found",
        ]))?;
        self.wait_for("the e2e namespaces to go", NAMESPACES_TIMEOUT, || {
            let left = cluster.get_json(&["namespaces", "--selector=e2e-run"])?;
            Ok(left["items"].as_array().is_none_or(Vec::is_empty))
        })?;
        cmd::output(cluster.kubectl().args([
            "delete",
            "pods",
            "--all-namespaces",
            &format!("--field-selector=spec.nodeName={NODE}"),
            "--grace-period=0",
            "--force",
            "--ignore-not-found",
        ]))?;
        self.wait_for(
            "containerd to hold no containers",
            CONTAINERS_TIMEOUT,
            || {
                let left = cmd::output(lab::ctr().args(["containers", "ls", "-q"]))?;
                Ok(left.trim().is_empty())
            },
        )
    }

    /// Polls `done` until it says yes, failing after `timeout` or when the agent exits.
    fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let started = Instant::now();
        loop {
            if done()? {
                return Ok(());
            }
            self.agent.exited()?;
            if started.elapsed() > timeout {
                bail!("waited {timeout:?} for {what}");
            }
            std::thread::sleep(POLL);
        }
    }
}

fn node_ready(node: &serde_json::Value) -> bool {
    node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Ready" && c["status"] == "True")
}

/// Deletes the Node `localhost`, its Lease and its `CSINode` (what an earlier run may have left).
fn delete_node_objects(cluster: &Cluster) -> Result<()> {
    for args in [
        ["node", NODE, ""],
        ["lease", NODE, "--namespace=kube-node-lease"],
        ["csinode", NODE, ""],
    ] {
        let mut command = cluster.kubectl();
        command
            .arg("delete")
            .args(args.iter().filter(|a| !a.is_empty()))
            .arg("--ignore-not-found");
        cmd::output(&mut command)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_ready_only_with_a_true_ready_condition() {
        let node = |status: &str| {
            serde_json::json!({ "status": { "conditions": [
                { "type": "MemoryPressure", "status": "False" },
                { "type": "Ready", "status": status },
            ] } })
        };
        assert!(node_ready(&node("True")));
        assert!(!node_ready(&node("False")));
        assert!(!node_ready(&serde_json::json!({})));
    }
}
