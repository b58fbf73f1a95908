//! Pod DNS (the kubelet's `pkg/kubelet/network/dns`, `Configurer.GetPodDNS`): the resolver
//! configuration a pod's sandbox gets through CRI `DNSConfig`, from the pod's `dnsPolicy` and
//! `dnsConfig`, the node's resolv.conf (`resolvConf`) and the cluster's DNS (`clusterDNS`,
//! `clusterDomain`), cut to the kubelet's limits.
//!
//! - `ClusterFirst` (and `ClusterFirstWithHostNet`): the cluster DNS servers only, the search list
//!   `<namespace>.svc.<domain> svc.<domain> <domain>` then the node's, options `ndots:5`. Without
//!   `clusterDNS` the pod falls back to `Default`, with a `MissingClusterDNS` event on the node and
//!   on the pod. A host-network pod with `ClusterFirst` gets `Default`.
//! - `Default`: the node's nameservers, search paths and options; with `resolvConf` empty, a
//!   resolver on the node's loopback and the search path `.`.
//! - `None`: nothing but the pod's `dnsConfig`.
//!
//! The pod's `dnsConfig` is then added (nameservers and search paths without duplicates, its
//! options replacing same-named ones), and the result cut to 3 nameservers, 32 search paths of at
//! most 253 characters and a 2048-character search line, with a `DNSConfigForming` event when
//! anything is dropped. The decisions are pure ([`DnsConfigurer::pod_dns`]); reading the node's
//! file and recording the events belong to the runtime manager.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, PodDNSConfig};
use ringlet_proto::runtime::v1 as cri;
use tokio::io::AsyncReadExt as _;

use super::KubeGenericRuntimeManager;
use crate::apis::config::DnsSettings;
use crate::error_chain::error_chain;
use crate::events::{EventObject, EventType};
use crate::prober::format_pod;

/// Most nameservers a pod gets (the API's `MaxDNSNameservers`, glibc's `MAXNS`).
const MAX_NAMESERVERS: usize = 3;
/// Most search paths a pod gets (the API's `MaxDNSSearchPaths`).
const MAX_SEARCH_PATHS: usize = 32;
/// Longest search line, the paths joined by spaces (the API's `MaxDNSSearchListChars`).
const MAX_SEARCH_LINE_CHARS: usize = 2048;
/// Longest search path kept: some resolvers (glibc 2.28) abort on a longer one.
const MAX_SEARCH_PATH_CHARS: usize = 253;
/// The options of a pod resolving through the cluster DNS.
const CLUSTER_FIRST_OPTIONS: &[&str] = &["ndots:5"];
/// A resolv.conf is a few lines; a bigger file is refused rather than read into memory.
const MAX_RESOLV_CONF_BYTES: u64 = 10 << 20;

/// Event reasons, as the kubelet records them.
const MISSING_CLUSTER_DNS: &str = "MissingClusterDNS";
const DNS_CONFIG_FORMING: &str = "DNSConfigForming";
const CHECK_LIMITS_FOR_RESOLV_CONF: &str = "CheckLimitsForResolvConf";

/// Why a pod's resolver configuration could not be made (the sandbox is then not created).
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    #[error("reading the node's resolver configuration {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the node's resolver configuration {path} is larger than {MAX_RESOLV_CONF_BYTES} bytes"
    )]
    TooLarge { path: PathBuf },
    #[error("the node's resolver configuration {path} has a nameserver line without an address")]
    EmptyNameserver { path: PathBuf },
}

/// What a resolv.conf says, and what a pod's resolver is configured with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    fn into_cri(self) -> cri::DnsConfig {
        cri::DnsConfig {
            servers: self.nameservers,
            searches: self.searches,
            options: self.options,
        }
    }
}

/// Parses a resolv.conf as the kubelet does: `nameserver` lines add up, the last `search` and
/// `options` lines win (search paths lose a trailing dot, so `a.` and `a` count once), `#` starts
/// a comment line, anything else is ignored. A `nameserver` line without an address refuses the
/// file.
fn parse_resolv_conf(path: &Path, text: &str) -> Result<ResolvConf, DnsError> {
    let mut conf = ResolvConf::default();
    let mut empty_nameserver = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            continue;
        }
        let mut fields = line.split_whitespace();
        match fields.next() {
            Some("nameserver") => match fields.next() {
                Some(address) => conf.nameservers.push(address.to_owned()),
                None => empty_nameserver = true,
            },
            Some("search") => {
                conf.searches = fields
                    .map(|s| s.strip_suffix('.').unwrap_or(s).to_owned())
                    .collect();
            }
            Some("options") => conf.options = fields.map(str::to_owned).collect(),
            _ => {}
        }
    }
    if empty_nameserver {
        return Err(DnsError::EmptyNameserver {
            path: path.to_owned(),
        });
    }
    Ok(conf)
}

/// Which base a pod's resolver configuration starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodDnsType {
    Cluster,
    Host,
    None,
}

fn pod_dns_type(pod: &Pod) -> PodDnsType {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec.and_then(|s| s.dns_policy.as_deref()) {
        Some("None") => PodDnsType::None,
        Some("ClusterFirstWithHostNet") => PodDnsType::Cluster,
        Some("Default") => PodDnsType::Host,
        // The API server defaults an unset policy to ClusterFirst, which is Default on the host
        // network.
        None | Some("" | "ClusterFirst") => {
            if host_network {
                PodDnsType::Host
            } else {
                PodDnsType::Cluster
            }
        }
        Some(other) => {
            // The API server refuses other policies; the kubelet takes ClusterFirst then.
            tracing::error!(
                pod = %format_pod(pod),
                policy = other,
                "invalid dnsPolicy, falling back to ClusterFirst"
            );
            PodDnsType::Cluster
        }
    }
}

/// What a warning is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WarningTarget {
    Node,
    Pod,
}

/// A warning the kubelet records as an event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsWarning {
    pub target: WarningTarget,
    pub reason: &'static str,
    pub message: String,
}

/// A pod's resolver configuration and the warnings making it gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDns {
    pub config: cri::DnsConfig,
    pub warnings: Vec<DnsWarning>,
}

/// The node's DNS settings and addresses, turned into each pod's resolver configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DnsConfigurer {
    settings: DnsSettings,
    /// The node's addresses (`--node-ip`): their families pick the loopback resolver of `Default`
    /// pods when there is no `resolvConf`.
    node_ips: Vec<IpAddr>,
}

impl DnsConfigurer {
    pub fn new(settings: DnsSettings, node_ips: Vec<IpAddr>) -> Self {
        Self { settings, node_ips }
    }

    /// `clusterDomain` (empty when not set).
    pub fn cluster_domain(&self) -> &str {
        &self.settings.cluster_domain
    }

    /// Reads the node's resolv.conf (`resolvConf`), afresh for every pod as the kubelet does, so
    /// a change on the node reaches the next sandbox; nothing when `resolvConf` is empty.
    pub async fn read_node_resolv_conf(&self) -> Result<ResolvConf, DnsError> {
        let Some(path) = &self.settings.resolv_conf else {
            return Ok(ResolvConf::default());
        };
        let read = |source| DnsError::Read {
            path: path.clone(),
            source,
        };
        let file = tokio::fs::File::open(path).await.map_err(read)?;
        let mut bytes = Vec::new();
        file.take(MAX_RESOLV_CONF_BYTES + 1)
            .read_to_end(&mut bytes)
            .await
            .map_err(read)?;
        if bytes.len() as u64 > MAX_RESOLV_CONF_BYTES {
            return Err(DnsError::TooLarge { path: path.clone() });
        }
        parse_resolv_conf(path, &String::from_utf8_lossy(&bytes))
    }

    /// The pod's resolver configuration, from the node's resolv.conf `node` (as
    /// [`Self::read_node_resolv_conf`] read it), and the warnings to record.
    pub fn pod_dns(&self, pod: &Pod, node: ResolvConf) -> PodDns {
        let mut warnings = Vec::new();
        let mut dns = node;
        match pod_dns_type(pod) {
            PodDnsType::None => dns = ResolvConf::default(),
            PodDnsType::Cluster if !self.settings.cluster_dns.is_empty() => {
                // The cluster DNS forwards what it does not serve itself, so it is the only
                // nameserver, and the node's options do not apply.
                dns.nameservers = self
                    .settings
                    .cluster_dns
                    .iter()
                    .map(IpAddr::to_string)
                    .collect();
                dns.searches = self.cluster_searches(pod, dns.searches);
                dns.options = CLUSTER_FIRST_OPTIONS
                    .iter()
                    .map(|&o| o.to_owned())
                    .collect();
            }
            PodDnsType::Cluster => {
                let message = "kubelet does not have ClusterDNS IP configured and cannot create \
                               Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.";
                warnings.push(DnsWarning {
                    target: WarningTarget::Node,
                    reason: MISSING_CLUSTER_DNS,
                    message: message.to_owned(),
                });
                warnings.push(DnsWarning {
                    target: WarningTarget::Pod,
                    reason: MISSING_CLUSTER_DNS,
                    message: format!("pod: {:?}. {message}", format_pod(pod)),
                });
                self.host_dns(&mut dns);
            }
            PodDnsType::Host => self.host_dns(&mut dns),
        }
        if let Some(pod_config) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
            append_pod_config(&mut dns, pod_config);
        }
        warnings.extend(fit_limits(&mut dns).into_iter().map(|message| DnsWarning {
            target: WarningTarget::Pod,
            reason: DNS_CONFIG_FORMING,
            message,
        }));
        PodDns {
            config: dns.into_cri(),
            warnings,
        }
    }

    /// `Default` pods take the node's configuration as it is; without a resolv.conf, the
    /// resolver library's own default ("the nameserver on the local machine") is made explicit,
    /// which a runtime would otherwise replace with its host's file.
    fn host_dns(&self, dns: &mut ResolvConf) {
        if self.settings.resolv_conf.is_some() {
            return;
        }
        dns.nameservers.extend(
            self.node_ips
                .iter()
                .map(|ip| if ip.is_ipv6() { "::1" } else { "127.0.0.1" }.to_owned()),
        );
        if dns.nameservers.is_empty() {
            dns.nameservers.push("127.0.0.1".to_owned());
        }
        dns.searches = vec![".".to_owned()];
    }

    /// `<namespace>.svc.<domain> svc.<domain> <domain>`, then the node's search paths.
    fn cluster_searches(&self, pod: &Pod, node_searches: Vec<String>) -> Vec<String> {
        let domain = &self.settings.cluster_domain;
        if domain.is_empty() {
            return node_searches;
        }
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let mut searches = vec![
            format!("{namespace}.svc.{domain}"),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        searches.extend(node_searches);
        without_duplicates(searches)
    }

    /// What in the node's resolv.conf will cost pods search paths (the kubelet's
    /// `CheckLimitsForResolvConf`, a `CheckLimitsForResolvConf` event on the node): more search
    /// paths than leave room for the cluster's three, a path or a line too long. `None` when it
    /// fits, or when there is no resolv.conf.
    pub fn check_node_resolv_conf(&self, node: &ResolvConf) -> Option<String> {
        let path = self.settings.resolv_conf.as_ref()?.display();
        let mut limit = MAX_SEARCH_PATHS;
        if !self.settings.cluster_domain.is_empty() {
            limit -= 3;
        }
        if node.searches.len() > limit {
            return Some(format!(
                "Resolv.conf file '{path}' contains search line consisting of more than {limit} domains!"
            ));
        }
        if node
            .searches
            .iter()
            .any(|s| s.len() > MAX_SEARCH_PATH_CHARS)
        {
            return Some(format!(
                "Resolv.conf file \"{path}\" contains a search path which length is more than allowed {MAX_SEARCH_PATH_CHARS} chars!"
            ));
        }
        if node.searches.join(" ").len() > MAX_SEARCH_LINE_CHARS {
            return Some(format!(
                "Resolv.conf file '{path}' contains search line which length is more than allowed {MAX_SEARCH_LINE_CHARS} chars!"
            ));
        }
        None
    }
}

fn without_duplicates(items: Vec<String>) -> Vec<String> {
    let mut kept: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !kept.contains(&item) {
            kept.push(item);
        }
    }
    kept
}

/// Adds the pod's `dnsConfig`: nameservers and search paths after the base's, without
/// duplicates; its options replace the base's of the same name (`ndots:2` replaces `ndots:5`).
/// The kubelet merges options through a map, in no particular order; here the base's order is
/// kept and new options come after it.
fn append_pod_config(dns: &mut ResolvConf, pod_config: &PodDNSConfig) {
    let mut nameservers = std::mem::take(&mut dns.nameservers);
    nameservers.extend(pod_config.nameservers.iter().flatten().cloned());
    dns.nameservers = without_duplicates(nameservers);
    let mut searches = std::mem::take(&mut dns.searches);
    searches.extend(pod_config.searches.iter().flatten().cloned());
    dns.searches = without_duplicates(searches);

    let mut options: Vec<(String, String)> = Vec::new();
    let mut set = |name: &str, value: &str| match options.iter_mut().find(|(n, _)| n == name) {
        Some(option) => value.clone_into(&mut option.1),
        None => options.push((name.to_owned(), value.to_owned())),
    };
    for option in &dns.options {
        let (name, value) = option.split_once(':').unwrap_or((option, ""));
        set(name, value);
    }
    for option in pod_config.options.iter().flatten() {
        if let Some(name) = &option.name {
            set(name, option.value.as_deref().unwrap_or_default());
        }
    }
    dns.options = options
        .into_iter()
        .map(|(name, value)| {
            if value.is_empty() {
                name
            } else {
                format!("{name}:{value}")
            }
        })
        .collect();
}

/// Cuts the configuration to what resolvers take; returns a message for each line cut.
fn fit_limits(dns: &mut ResolvConf) -> Vec<String> {
    let mut messages = Vec::new();
    if dns.nameservers.len() > MAX_NAMESERVERS {
        dns.nameservers.truncate(MAX_NAMESERVERS);
        messages.push(format!(
            "Nameserver limits were exceeded, some nameservers have been omitted, the applied \
             nameserver line is: {}",
            dns.nameservers.join(" ")
        ));
    }
    let count = dns.searches.len();
    dns.searches.truncate(MAX_SEARCH_PATHS);
    dns.searches.retain(|s| s.len() <= MAX_SEARCH_PATH_CHARS);
    // Whole paths come off the end until the line fits.
    let mut line = dns.searches.join(" ").len();
    while line > MAX_SEARCH_LINE_CHARS {
        let Some(last) = dns.searches.pop() else {
            break;
        };
        line = line.saturating_sub(last.len() + 1);
    }
    if dns.searches.len() < count {
        messages.push(format!(
            "Search Line limits were exceeded, some search paths have been omitted, the applied \
             search line is: {}",
            dns.searches.join(" ")
        ));
    }
    messages
}

impl KubeGenericRuntimeManager {
    /// The pod's resolver configuration for its sandbox; the warnings making it gave are logged
    /// and recorded as events.
    pub(super) async fn pod_dns_config(&self, pod: &Pod) -> Result<cri::DnsConfig, DnsError> {
        let dns = &self.settings.dns;
        let node = dns.read_node_resolv_conf().await?;
        let PodDns { config, warnings } = dns.pod_dns(pod, node);
        for warning in warnings {
            tracing::warn!(pod = %format_pod(pod), reason = warning.reason, "{}", warning.message);
            let object = match warning.target {
                WarningTarget::Node => EventObject::node(self.helper.node_name()),
                WarningTarget::Pod => EventObject::pod(pod),
            };
            self.event(object, EventType::Warning, warning.reason, warning.message);
        }
        Ok(config)
    }

    /// Checks the node's resolv.conf once, as the kubelet does when its sync loop starts: a file
    /// that cannot be read, or whose search line will be cut in pods, is a warning event on the
    /// node.
    pub async fn check_node_resolv_conf(&self) {
        let dns = &self.settings.dns;
        if dns.settings.resolv_conf.is_none() {
            return;
        }
        let problem = match dns.read_node_resolv_conf().await {
            Ok(node) => dns.check_node_resolv_conf(&node),
            Err(err) => Some(error_chain(&err)),
        };
        if let Some(message) = problem {
            tracing::warn!(reason = CHECK_LIMITS_FOR_RESOLV_CONF, "{message}");
            self.event(
                EventObject::node(self.helper.node_name()),
                EventType::Warning,
                CHECK_LIMITS_FOR_RESOLV_CONF,
                message,
            );
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
