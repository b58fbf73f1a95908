//! Service environment variables (the kubelet's `pkg/kubelet/envvars` and `getServiceEnvVarMap` in
//! `kubelet_pods.go`, fed by the service lister `kubelet.go` sets up): `<SVC>_SERVICE_HOST`,
//! `<SVC>_SERVICE_PORT`, one `<SVC>_SERVICE_PORT_<PORT NAME>` per named port and the Docker-link
//! variables (`<SVC>_PORT`, `<SVC>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT`, `_ADDR`), for the
//! Services of the pod's namespace when `enableServiceLinks` is on and always for `kubernetes` in
//! `default`. Services come from a watch of all Services ([`ServiceStore`]); until it has listed once,
//! pods from the API server cannot get their environment (the kubelet's rule, so a restart does not
//! start pods without `KUBERNETES_SERVICE_HOST`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::runtime::WatchStreamExt as _;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};

use crate::apiserver::ApiClient;

/// The Services whose variables every pod gets, from the `default` namespace.
const MASTER_SERVICES: &[&str] = &["kubernetes"];
const DEFAULT_NAMESPACE: &str = "default";
const WATCH_TIMEOUT_SECONDS: u32 = 290;

/// The cluster's Services as a watch last saw them. Cheap to clone.
#[derive(Clone)]
pub struct ServiceStore {
    store: Store<Service>,
    listed: Arc<AtomicBool>,
}

impl ServiceStore {
    /// Starts watching every Service. Must run inside the agent's runtime.
    pub fn start(client: &ApiClient) -> Self {
        let (store, writer) = reflector::store();
        let listed = Arc::new(AtomicBool::new(false));
        let api: Api<Service> = Api::all(client.watch_client());
        let config = watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS);
        let stream = reflector::reflector(writer, watcher::watcher(api, config).default_backoff());
        let client = client.clone();
        let flag = Arc::clone(&listed);
        tokio::spawn(async move {
            let mut stream = stream.boxed();
            let mut failing = false;
            loop {
                match stream.try_next().await {
                    Ok(Some(event)) => {
                        if matches!(event, Event::InitDone) {
                            flag.store(true, Ordering::Release);
                        }
                        if std::mem::take(&mut failing) {
                            tracing::info!("watching services again");
                        }
                    }
                    Ok(None) => return,
                    Err(err) => {
                        if !failing {
                            tracing::warn!(
                                "{}; retrying with back-off",
                                client.describe_watch("watch services", &err)
                            );
                        }
                        failing = true;
                    }
                }
            }
        });
        Self { store, listed }
    }

    /// Whether the watch has listed the Services at least once (the kubelet's `serviceHasSynced`).
    pub fn has_synced(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The service variables of a pod in `namespace`.
    pub fn env_for(&self, namespace: &str, enable_service_links: bool) -> BTreeMap<String, String> {
        let services = self.store.state();
        service_env(
            services.iter().map(AsRef::as_ref),
            namespace,
            enable_service_links,
        )
    }
}

/// Whether a Service has a cluster IP (not headless, not `ExternalName`).
fn has_cluster_ip(service: &Service) -> bool {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.as_deref())
        .is_some_and(|ip| !ip.is_empty() && ip != "None")
}

/// The variables of a pod in `namespace` from `services` (the kubelet's `getServiceEnvVarMap`):
/// `kubernetes` in `default` always, the namespace's own Services when `enable_service_links`.
pub fn service_env<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    namespace: &str,
    enable_service_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<&str, &Service> = BTreeMap::new();
    for service in services {
        if !has_cluster_ip(service) {
            continue;
        }
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let ns = service.metadata.namespace.as_deref().unwrap_or_default();
        if ns == DEFAULT_NAMESPACE && MASTER_SERVICES.contains(&name) {
            chosen.entry(name).or_insert(service);
        } else if ns == namespace && enable_service_links {
            chosen.insert(name, service);
        }
    }
    chosen
        .into_values()
        .flat_map(from_service)
        .collect::<BTreeMap<_, _>>()
}

/// `my-svc` → `MY_SVC`.
fn env_name(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// The variables of one Service (the kubelet's `FromServices` for one).
fn from_service(service: &Service) -> Vec<(String, String)> {
    let Some(spec) = &service.spec else {
        return Vec::new();
    };
    let ports = spec.ports.as_deref().unwrap_or_default();
    let Some(first) = ports.first() else {
        return Vec::new();
    };
    let ip = spec.cluster_ip.clone().unwrap_or_default();
    let prefix = env_name(service.metadata.name.as_deref().unwrap_or_default());
    let mut vars = vec![
        (format!("{prefix}_SERVICE_HOST"), ip.clone()),
        (format!("{prefix}_SERVICE_PORT"), first.port.to_string()),
    ];
    for port in ports {
        if let Some(name) = port.name.as_deref().filter(|n| !n.is_empty()) {
            vars.push((
                format!("{prefix}_SERVICE_PORT_{}", env_name(name)),
                port.port.to_string(),
            ));
        }
    }
    // Docker-link variables; an IPv6 address is bracketed as Go's net.JoinHostPort does.
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.clone()
    };
    for (i, port) in ports.iter().enumerate() {
        let protocol = port
            .protocol
            .as_deref()
            .filter(|p| !p.is_empty())
            .unwrap_or("TCP");
        let url = format!("{}://{host}:{}", protocol.to_lowercase(), port.port);
        if i == 0 {
            vars.push((format!("{prefix}_PORT"), url.clone()));
        }
        let port_prefix = format!("{prefix}_PORT_{}_{}", port.port, protocol.to_uppercase());
        vars.push((format!("{port_prefix}_PROTO"), protocol.to_lowercase()));
        vars.push((format!("{port_prefix}_PORT"), port.port.to_string()));
        vars.push((format!("{port_prefix}_ADDR"), ip.clone()));
        vars.push((port_prefix, url));
    }
    vars
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn service(namespace: &str, name: &str, ip: &str, ports: &serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterIP": ip, "ports": ports},
        }))
        .unwrap()
    }

    #[test]
    fn a_service_gives_host_port_and_docker_link_variables() {
        let services = [service(
            "shop",
            "cart-db",
            "10.96.0.7",
            &serde_json::json!([
                {"port": 5432},
                {"name": "metrics", "port": 9187, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"},
            ]),
        )];
        let env = service_env(&services, "shop", true);
        let expected: BTreeMap<String, String> = [
            ("CART_DB_SERVICE_HOST", "10.96.0.7"),
            ("CART_DB_SERVICE_PORT", "5432"),
            ("CART_DB_SERVICE_PORT_METRICS", "9187"),
            ("CART_DB_SERVICE_PORT_DNS", "53"),
            ("CART_DB_PORT", "tcp://10.96.0.7:5432"),
            ("CART_DB_PORT_5432_TCP", "tcp://10.96.0.7:5432"),
            ("CART_DB_PORT_5432_TCP_PROTO", "tcp"),
            ("CART_DB_PORT_5432_TCP_PORT", "5432"),
            ("CART_DB_PORT_5432_TCP_ADDR", "10.96.0.7"),
            ("CART_DB_PORT_9187_TCP", "tcp://10.96.0.7:9187"),
            ("CART_DB_PORT_9187_TCP_PROTO", "tcp"),
            ("CART_DB_PORT_9187_TCP_PORT", "9187"),
            ("CART_DB_PORT_9187_TCP_ADDR", "10.96.0.7"),
            ("CART_DB_PORT_53_UDP", "udp://10.96.0.7:53"),
            ("CART_DB_PORT_53_UDP_PROTO", "udp"),
            ("CART_DB_PORT_53_UDP_PORT", "53"),
            ("CART_DB_PORT_53_UDP_ADDR", "10.96.0.7"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        assert_eq!(env, expected);
    }

    #[test]
    fn the_kubernetes_service_is_always_there_and_other_namespaces_never() {
        let services = [
            service(
                "default",
                "kubernetes",
                "10.96.0.1",
                &serde_json::json!([{"name": "https", "port": 443}]),
            ),
            service(
                "default",
                "web",
                "10.96.0.2",
                &serde_json::json!([{"port": 80}]),
            ),
            service(
                "other",
                "db",
                "10.96.0.3",
                &serde_json::json!([{"port": 5432}]),
            ),
            service(
                "shop",
                "headless",
                "None",
                &serde_json::json!([{"port": 80}]),
            ),
            service(
                "shop",
                "api",
                "10.96.0.4",
                &serde_json::json!([{"port": 8080}]),
            ),
        ];
        let linked = service_env(&services, "shop", true);
        assert_eq!(linked["KUBERNETES_SERVICE_HOST"], "10.96.0.1");
        assert_eq!(linked["KUBERNETES_SERVICE_PORT_HTTPS"], "443");
        assert_eq!(linked["API_SERVICE_HOST"], "10.96.0.4");
        for absent in [
            "WEB_SERVICE_HOST",
            "DB_SERVICE_HOST",
            "HEADLESS_SERVICE_HOST",
        ] {
            assert!(!linked.contains_key(absent), "{absent}");
        }
        let unlinked = service_env(&services, "shop", false);
        assert!(unlinked.contains_key("KUBERNETES_SERVICE_HOST"));
        assert!(!unlinked.contains_key("API_SERVICE_HOST"));
        let in_default = service_env(&services, "default", true);
        assert_eq!(in_default["WEB_SERVICE_HOST"], "10.96.0.2");
    }

    #[test]
    fn ipv6_cluster_ips_are_bracketed_in_urls() {
        let services = [service(
            "ns",
            "v6",
            "fd00::10",
            &serde_json::json!([{"port": 80}]),
        )];
        let env = service_env(&services, "ns", true);
        assert_eq!(env["V6_PORT"], "tcp://[fd00::10]:80");
        assert_eq!(env["V6_SERVICE_HOST"], "fd00::10");
    }
}
