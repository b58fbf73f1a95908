//! The node's heartbeat Lease (the kubelet's `pkg/kubelet/nodelease` on `component-helpers`' lease
//! controller): `kube-node-lease/<node>`, held by the node, `leaseDurationSeconds` from
//! `nodeLeaseDurationSeconds`, owned by the Node, renewed every quarter of its duration. The node
//! lifecycle controller reads it to tell whether the node is alive, so it is renewed even when the
//! status has nothing new to say. A failed renewal is retried with back-off (200 ms up to 7 s).
//!
//! The renewals go through a client of their own, as the kubelet's go through its
//! `heartbeatClient`: not rate-limited with the agent's other requests, and giving up after
//! `nodeStatusUpdateFrequency` (at most the lease's duration) instead of the shared client's 30 s,
//! so a burst of requests or one slow answer cannot hold the lease until it expires.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use kube::api::{Api, PostParams};
use tokio::sync::watch;

use crate::apis::config::NodeSettings;
use crate::apiserver::{ApiClient, ApiServerError, is_conflict, is_not_found};
use crate::status::wall_clock_now;

/// The namespace of node leases.
pub const LEASE_NAMESPACE: &str = "kube-node-lease";
const RETRY_START: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(7);

/// How long one heartbeat request may take (the kubelet's heartbeat client `Timeout`):
/// `nodeStatusUpdateFrequency`, at most the lease's duration.
pub fn heartbeat_timeout(settings: &NodeSettings) -> Duration {
    let lease = Duration::from_secs(u64::from(settings.node_lease_duration_seconds));
    settings.node_status_update_frequency.min(lease)
}

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
    /// The lease of `node_name`, renewed through a heartbeat client of its own to `api`'s API
    /// server. `node` carries the registered Node: the lease waits for its UID to name it as the
    /// owner.
    pub fn new(
        api: &ApiClient,
        node_name: String,
        settings: &NodeSettings,
        node: watch::Receiver<Option<Node>>,
    ) -> Result<Self, ApiServerError> {
        Ok(Self {
            client: api.heartbeat_client(heartbeat_timeout(settings))?,
            node_name,
            duration_seconds: settings.node_lease_duration_seconds,
            renew_interval: settings.lease_renew_interval(),
            node,
            latest: None,
        })
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;
    use crate::apiserver::ApiClientOptions;

    /// How long a test waits for a renewal before calling it stuck: far below the shared
    /// client's 30 s timeout, far above the heartbeat's here.
    const STUCK: Duration = Duration::from_secs(10);

    /// An API server on loopback that answers every request 404, or never when `hang`.
    async fn api_server(hang: bool) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut connection, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buffer = [0; 4096];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match connection.read(&mut buffer).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buffer[..n]),
                        }
                    }
                    if hang {
                        std::future::pending::<()>().await;
                    }
                    let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#;
                    let answer = format!(
                        "HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n\
                         content-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = connection.write_all(answer.as_bytes()).await;
                });
            }
        });
        format!("http://{address}")
    }

    /// The agent's client to `url`, with its 30 s timeout and `options`' rate limit.
    fn agent_client(url: &str, qps: u32, burst: u32) -> ApiClient {
        let options = ApiClientOptions {
            qps,
            burst,
            ..ApiClientOptions::default()
        };
        let config = kube::Config::new(url.parse().unwrap());
        ApiClient::from_config(config, "the test's client".to_owned(), options).unwrap()
    }

    fn lease(api: &ApiClient, settings: &NodeSettings) -> NodeLease {
        let (_, node) = watch::channel(None);
        NodeLease::new(api, "n1".to_owned(), settings, node).unwrap()
    }

    #[test]
    fn the_heartbeat_waits_at_most_the_status_update_frequency_or_the_lease() {
        let defaults = NodeSettings::default();
        assert_eq!(heartbeat_timeout(&defaults), Duration::from_secs(10));
        let slow_status = NodeSettings {
            node_status_update_frequency: Duration::from_mins(1),
            ..NodeSettings::default()
        };
        assert_eq!(heartbeat_timeout(&slow_status), Duration::from_secs(40));
    }

    #[tokio::test]
    async fn a_silent_api_server_costs_a_renewal_only_the_heartbeat_timeout() {
        let url = api_server(true).await;
        let settings = NodeSettings {
            node_status_update_frequency: Duration::from_millis(300),
            ..NodeSettings::default()
        };
        let mut lease = lease(&agent_client(&url, 50, 100), &settings);
        let renewed = tokio::time::timeout(STUCK, lease.renew("node-uid")).await;
        assert_eq!(renewed.ok(), Some(false), "the renewal gave up in time");
    }

    #[tokio::test]
    async fn the_agents_rate_limit_does_not_hold_the_lease_back() {
        let url = api_server(false).await;
        // One request per 20 s on average, in a burst of 20: used up by the requests below.
        let api = agent_client(&url, 1, 20);
        let leases: Api<Lease> = Api::namespaced(api.client(), LEASE_NAMESPACE);
        for _ in 0..20 {
            assert!(
                leases
                    .get("other")
                    .await
                    .is_err_and(|err| is_not_found(&err))
            );
        }
        let mut lease = lease(&api, &NodeSettings::default());
        // Not found, then created: both answered 404, so the renewal fails, but at once.
        let renewed = tokio::time::timeout(STUCK, lease.renew("node-uid")).await;
        assert_eq!(renewed.ok(), Some(false), "the renewal was not queued");
    }
}
