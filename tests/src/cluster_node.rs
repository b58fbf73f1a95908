//! A `ringlet` joined to the shared control plane as a node: it gets a node kubeconfig (or a
//! bootstrap one), accepts the API server's kubelet client certificate, and has a namespace of its
//! own for the pods the test creates through the API server. Dropping it force-deletes those pods,
//! waits (bounded) until their containers are gone, and deletes the Node and its Lease, so the next
//! test can use the same node name.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use serde_json::Value;

use crate::cluster::{Cluster, run, run_with_input};
use crate::daemon::Daemon;
use crate::{Agent, AgentOptions, containers_of_namespace, wait_for};

/// The kube-apiserver `cargo xtask cluster up` started.
pub fn api_server_daemon() -> Daemon {
    Daemon::new("kube-apiserver", crate::cluster::CLUSTER_DIR)
}

/// See the module docs.
pub struct ClusterNode {
    pub cluster: Cluster,
    pub namespace: String,
    /// Always `Some` until drop, which stops the agent before it deletes the Node (a running agent
    /// would register it again).
    agent: Option<Agent>,
    /// With `in_cluster`: the service account files, removed after the agent stopped.
    _service_account: Option<ServiceAccountFiles>,
    /// Held from before the node's old objects are deleted until the new ones are: another
    /// process's agent may be running as this node (`localhost` is shared) until then.
    _node_lock: crate::node_lock::NodeLock,
}

/// What a test may change about its node.
#[derive(Default)]
pub struct ClusterNodeOptions {
    /// The node name instead of `e2e-<test>`; `localhost` for a node the API server must reach
    /// (`kubectl logs`/`exec`: it connects to the Hostname address, which resolves to loopback).
    pub node: Option<String>,
    /// Extra flags.
    pub args: Vec<String>,
    /// How the agent reaches the API server.
    pub credentials: NodeCredentials,
    /// With [`NodeCredentials::NodeKubeconfig`]: the client certificate's lifetime instead of a
    /// year (certificate rotation tests).
    pub client_certificate_validity: Option<Duration>,
}

/// How a test's agent reaches the API server.
#[derive(Default, Clone, Copy, PartialEq, Eq)]
pub enum NodeCredentials {
    /// A ready kubeconfig with the node's client certificate.
    #[default]
    NodeKubeconfig,
    /// `--bootstrap-kubeconfig` (TLS bootstrap); a thread signs the node's CSR as soon as it
    /// appears (the agent serves nothing before that).
    Bootstrap,
    /// As if in a pod, with `--in-cluster-config`: a service account `ringlet-node` of the test's
    /// namespace, bound to the `system:node` `ClusterRole`, whose token, CA and namespace are
    /// written where a pod has them, and `KUBERNETES_SERVICE_HOST`/`_PORT` naming the API server.
    InCluster,
}

impl ClusterNode {
    /// Starts an agent for `test` on the control plane with the options' credentials.
    pub fn start(test: &str, cluster: &Cluster, options: ClusterNodeOptions) -> Result<Self> {
        let namespace = name_for(test);
        let node = options.node.clone().unwrap_or_else(|| namespace.clone());
        let node_lock = crate::node_lock::node_lock()?;
        // Built before any credential is minted: the first build of a run can take minutes on a
        // busy machine, longer than a short-lived client certificate lives.
        crate::ringlet_binary()?;
        cluster.prepare_namespace(&namespace)?;
        delete_node_objects(cluster, &node);
        let mut args = options.args;
        let mut env = Vec::new();
        let mut service_account = None;
        match options.credentials {
            NodeCredentials::InCluster => {
                service_account = Some(ServiceAccountFiles::write(cluster, &namespace, &node)?);
                args.push("--in-cluster-config".to_owned());
                env.extend([
                    ("KUBERNETES_SERVICE_HOST".to_owned(), "127.0.0.1".to_owned()),
                    (
                        "KUBERNETES_SERVICE_PORT".to_owned(),
                        crate::cluster::API_SERVER_PORT.to_string(),
                    ),
                ]);
            }
            NodeCredentials::Bootstrap => {
                let kubeconfig =
                    std::env::temp_dir().join(format!("ringlet-bootstrap-{node}.conf"));
                let _ = std::fs::remove_file(&kubeconfig);
                args.extend([
                    "--bootstrap-kubeconfig".to_owned(),
                    cluster.bootstrap_kubeconfig().display().to_string(),
                    "--kubeconfig".to_owned(),
                    kubeconfig.display().to_string(),
                ]);
                // The agent's healthz answers only after the bootstrap: sign its CSR meanwhile.
                let signer = cluster.clone();
                let signed_node = node.clone();
                std::thread::spawn(move || {
                    if let Ok(csr) = signer.wait_for_node_csr(&signed_node, Duration::from_mins(1))
                    {
                        let _ = signer.sign_csr(&csr);
                    }
                });
            }
            NodeCredentials::NodeKubeconfig => {
                args.extend([
                    "--kubeconfig".to_owned(),
                    cluster
                        .node_kubeconfig_valid_for(&node, options.client_certificate_validity)?
                        .display()
                        .to_string(),
                ]);
            }
        }
        let agent = Agent::start(
            test,
            AgentOptions {
                node: Some(node),
                client_ca_file: Some(cluster.ca_file()),
                args,
                env,
                ..AgentOptions::default()
            },
        )?;
        Ok(Self {
            cluster: cluster.clone(),
            namespace,
            agent: Some(agent),
            _service_account: service_account,
            _node_lock: node_lock,
        })
    }

    #[allow(clippy::missing_panics_doc, reason = "the agent is there until drop")]
    pub fn agent(&self) -> &Agent {
        self.agent
            .as_ref()
            .unwrap_or_else(|| unreachable!("the agent is there until drop"))
    }

    pub fn agent_mut(&mut self) -> &mut Agent {
        self.agent
            .as_mut()
            .unwrap_or_else(|| unreachable!("the agent is there until drop"))
    }

    pub fn node(&self) -> &str {
        &self.agent().node
    }

    /// `kubectl -n <namespace>` as the cluster admin.
    pub fn kubectl(&self) -> Command {
        let mut command = self.cluster.kubectl();
        command.args(["-n", &self.namespace]);
        command
    }

    /// `kubectl apply` of a YAML or JSON document in the test's namespace.
    pub fn apply(&self, document: &str) -> Result<()> {
        run_with_input(self.kubectl().args(["apply", "-f", "-"]), document)?;
        Ok(())
    }

    /// The pod as the API server has it, `None` when it does not exist.
    pub fn api_pod(&self, name: &str) -> Result<Option<Value>> {
        let out = self
            .kubectl()
            .args(["get", "pod", name, "-o", "json", "--ignore-not-found"])
            .output()
            .context("cannot run kubectl")?;
        let text = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            anyhow::bail!(
                "kubectl get pod {name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if text.trim().is_empty() {
            return Ok(None);
        }
        Ok(Some(serde_json::from_str(&text)?))
    }

    /// Waits until the API server's copy of pod `name` satisfies `check`.
    pub fn wait_api_pod(
        &self,
        name: &str,
        what: &str,
        timeout: Duration,
        check: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        wait_for(
            &format!("pod {name} {what} on the API server"),
            timeout,
            || self.api_pod(name).ok().flatten().filter(|pod| check(pod)),
        )
        .with_context(|| format!("agent log:\n{}", crate::tail(&self.agent().log(), 40)))
    }

    /// The Node object.
    pub fn node_object(&self) -> Result<Value> {
        self.cluster.get_json(&["node", self.node()])
    }

    /// Events in the test's namespace about `object` (a pod name).
    pub fn events_about(&self, object: &str) -> Result<Vec<Value>> {
        let list = self.cluster.get_json(&[
            "events",
            "-n",
            &self.namespace,
            "--field-selector",
            &format!("involvedObject.name={object}"),
        ])?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }
}

impl Drop for ClusterNode {
    fn drop(&mut self) {
        let _ = run(self.kubectl().args([
            "delete",
            "pods",
            "--all",
            "--grace-period=0",
            "--force",
            "--wait=false",
        ]));
        let _ = wait_for(
            "the test's API pods to be stopped",
            Duration::from_mins(1),
            || {
                containers_of_namespace(&self.namespace)
                    .ok()?
                    .is_empty()
                    .then_some(())
            },
        );
        let node = self.node().to_owned();
        drop(self.agent.take());
        delete_node_objects(&self.cluster, &node);
    }
}

/// `e2e-<test>`, cut short enough for a node name (a DNS label) that pod names are made from.
fn name_for(test: &str) -> String {
    let mut name = format!("e2e-{}", test.replace('_', "-"));
    name.truncate(40);
    name.trim_end_matches('-').to_owned()
}

/// Removes the Node and its Lease, left by this test or an earlier run.
fn delete_node_objects(cluster: &Cluster, node: &str) {
    let _ =
        run(cluster
            .kubectl()
            .args(["delete", "node", node, "--ignore-not-found", "--wait=false"]));
    let _ = run(cluster.kubectl().args([
        "delete",
        "lease",
        node,
        "-n",
        "kube-node-lease",
        "--ignore-not-found",
    ]));
}

/// Where a pod finds its service account's token, CA and namespace (and kube's in-cluster
/// configuration reads them).
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A service account's files written where a pod has them; removed on drop, with the directories
/// this created.
struct ServiceAccountFiles {
    created: PathBuf,
}

impl ServiceAccountFiles {
    /// Creates service account `ringlet-node` in `namespace`, binds it to `system:node` (the
    /// permissions a kubelet has) and writes a token for it. Refuses to touch a machine that has
    /// its own service account directory.
    fn write(cluster: &Cluster, namespace: &str, node: &str) -> Result<Self> {
        let dir = Path::new(SERVICE_ACCOUNT_DIR);
        let created = dir
            .ancestors()
            .take_while(|d| !d.exists())
            .last()
            .map(Path::to_path_buf)
            .ok_or_else(|| {
                anyhow!(
                    "{SERVICE_ACCOUNT_DIR} already exists on this machine: the in-cluster test \
                     would overwrite a real service account"
                )
            })?;
        run(cluster.kubectl().args([
            "create",
            "serviceaccount",
            "ringlet-node",
            "-n",
            namespace,
            "--dry-run=client",
            "-o",
            "yaml",
        ]))
        .and_then(|yaml| run_with_input(cluster.kubectl().args(["apply", "-f", "-"]), &yaml))?;
        let binding = format!("e2e-in-cluster-{node}");
        let _ = run(cluster.kubectl().args([
            "delete",
            "clusterrolebinding",
            &binding,
            "--ignore-not-found",
        ]));
        run(cluster.kubectl().args([
            "create",
            "clusterrolebinding",
            &binding,
            "--clusterrole=system:node",
            &format!("--serviceaccount={namespace}:ringlet-node"),
        ]))?;
        let token = run(cluster.kubectl().args([
            "create",
            "token",
            "ringlet-node",
            "-n",
            namespace,
            "--duration=1h",
        ]))?;
        let files = Self { created };
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("token"), token.trim())?;
        std::fs::copy(cluster.ca_file(), dir.join("ca.crt"))?;
        std::fs::write(dir.join("namespace"), namespace)?;
        Ok(files)
    }
}

impl Drop for ServiceAccountFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.created);
    }
}
