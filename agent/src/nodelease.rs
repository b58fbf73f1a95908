//! The node's heartbeat Lease (the kubelet's `pkg/kubelet/nodelease` on `component-helpers`' lease
//! controller): `kube-node-lease/<node>`, held by the node, `leaseDurationSeconds` from
//! `nodeLeaseDurationSeconds`, owned by the Node, renewed every quarter of its duration. The node
//! lifecycle controller reads it to tell whether the node is alive, so it is renewed even when the
//! status has nothing new to say. A failed renewal is retried with back-off (200 ms up to 7 s).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use crate::apiserver::{ApiClient, is_conflict, is_not_found};
use crate::status::wall_clock_now;

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
const RETRY_START: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(7);

/// Renews the lease; see the module docs.
pub struct NodeLease {
    client: ApiClient,
    node_name: String,
    duration_seconds: u32,
    renew_interval: Duration,
    node: watch::Receiver<Option<Node>>,
    /// The lease as the last successful write returned it: the next renewal updates it directly
    /// (one request), and reads it again only after a conflict or when it is gone.
    latest: Option<Lease>,
}

impl NodeLease {
    /// `node` carries the registered Node: the lease waits for its UID to name it as the owner.
    pub fn new(
        client: ApiClient,
        node_name: String,
        duration_seconds: u32,
        renew_interval: Duration,
        node: watch::Receiver<Option<Node>>,
    ) -> Self {
        Self {
            client,
            node_name,
            duration_seconds,
            renew_interval,
            node,
            latest: None,
        }
    }

    pub async fn run(mut self) {
        let mut retry = RETRY_START;
        loop {
            let owner_uid = self.registered_uid().await;
            let Some(owner_uid) = owner_uid else { return };
            if self.renew(&owner_uid).await {
                retry = RETRY_START;
                tokio::time::sleep(self.renew_interval).await;
            } else {
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }

    /// Waits until the Node is registered (has a UID); `None` when the agent is shutting down.
    async fn registered_uid(&mut self) -> Option<String> {
        let node = self
            .node
            .wait_for(|node| node.as_ref().is_some_and(|n| n.metadata.uid.is_some()))
            .await
            .ok()?;
        node.as_ref().and_then(|n| n.metadata.uid.clone())
    }

    /// One renewal: update the lease (read first unless the last write returned it), or create it
    /// when it does not exist. Returns whether it worked (failures are logged).
    async fn renew(&mut self, owner_uid: &str) -> bool {
        let api: Api<Lease> = Api::namespaced(self.client.client(), LEASE_NAMESPACE);
        let name = self.node_name.clone();
        let action = |verb: &str| format!("{verb} lease {LEASE_NAMESPACE}/{name}");
        let current = match self.latest.take() {
            Some(lease) => Ok(lease),
            None => api.get(&name).await,
        };
        match current {
            Ok(mut lease) => {
                lease.spec = Some(self.spec(lease.spec.take()));
                if lease
                    .metadata
                    .owner_references
                    .as_ref()
                    .is_none_or(Vec::is_empty)
                {
                    lease.metadata.owner_references = Some(vec![self.owner(owner_uid)]);
                }
                match api.replace(&name, &PostParams::default(), &lease).await {
                    Ok(renewed) => {
                        self.latest = Some(renewed);
                        true
                    }
                    // Written or deleted by someone else since: read it again right away.
                    Err(err) if is_conflict(&err) || is_not_found(&err) => false,
                    Err(err) => {
                        tracing::warn!(
                            "failed to renew the node lease: {}",
                            self.client.describe(&action("update"), &err)
                        );
                        false
                    }
                }
            }
            Err(err) if is_not_found(&err) => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(LEASE_NAMESPACE.to_owned()),
                        owner_references: Some(vec![self.owner(owner_uid)]),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(None)),
                };
                match api.create(&PostParams::default(), &lease).await {
                    Ok(created) => {
                        self.latest = Some(created);
                        tracing::info!(lease = %format!("{LEASE_NAMESPACE}/{name}"), "created the node lease");
                        true
                    }
                    Err(err) => {
                        tracing::warn!(
                            "failed to create the node lease: {}",
                            self.client.describe(&action("create"), &err)
                        );
                        false
                    }
                }
            }
            Err(err) => {
                tracing::warn!(
                    "failed to renew the node lease: {}",
                    self.client.describe(&action("get"), &err)
                );
                false
            }
        }
    }

    /// The spec with this node as holder and the renewal time now; an acquire time is kept.
    fn spec(&self, old: Option<LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(wall_clock_now());
        let old = old.unwrap_or_default();
        LeaseSpec {
            holder_identity: Some(self.node_name.clone()),
            lease_duration_seconds: i32::try_from(self.duration_seconds).ok(),
            acquire_time: old.acquire_time.or_else(|| Some(now.clone())),
            renew_time: Some(now),
            ..old
        }
    }

    fn owner(&self, uid: &str) -> OwnerReference {
        OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: self.node_name.clone(),
            uid: uid.to_owned(),
            controller: None,
            block_owner_deletion: None,
        }
    }
}
