//! The `KubeletConfiguration` fields of pod DNS, in one section: `clusterDNS`, `clusterDomain` and
//! `resolvConf` (the inputs of the kubelet's `pkg/kubelet/network/dns` configurer), with the
//! kubelet's defaults. Reading, defaulting, validating and rendering a field all happen here; what
//! a pod's resolver configuration becomes is `kuberuntime::dns`.

use std::net::IpAddr;
use std::path::PathBuf;

use serde_json::{Value, json};

use super::file::FieldReader;

/// The kubelet's `resolvConf` default.
const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";
/// Longest domain name.
const MAX_DOMAIN_CHARS: usize = 253;
/// Longest label of a domain name.
const MAX_LABEL_CHARS: usize = 63;

/// The DNS settings, defaulted and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// `clusterDNS`: the cluster's DNS servers, the only nameservers of `ClusterFirst` pods. Empty
    /// (the default): `ClusterFirst` pods fall back to `Default` with a `MissingClusterDNS` event.
    pub cluster_dns: Vec<IpAddr>,
    /// `clusterDomain`: the cluster's domain, searched by `ClusterFirst` pods
    /// (`<namespace>.svc.<domain> svc.<domain> <domain>`) and the domain of their hosts-file names.
    /// Empty (the default): no cluster search paths.
    pub cluster_domain: String,
    /// `resolvConf` (default `/etc/resolv.conf`): the node's resolver configuration, the base of
    /// every pod's. `None` (an empty string in the file or the flag): no base, and `Default` pods
    /// ask a resolver on the node's loopback.
    pub resolv_conf: Option<PathBuf>,
}

impl Default for DnsSettings {
    fn default() -> Self {
        Self {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: Some(PathBuf::from(DEFAULT_RESOLV_CONF)),
        }
    }
}

/// The section's values as read from the file or the flags, before defaulting.
#[derive(Debug, Default, Clone)]
pub(super) struct RawDnsSettings {
    pub cluster_dns: Option<Vec<String>>,
    pub cluster_domain: Option<String>,
    /// `Some("")` is not unset: it turns the base configuration off.
    pub resolv_conf: Option<String>,
}

impl RawDnsSettings {
    /// Reads `key` if it belongs to this section; returns whether it did.
    pub(super) fn read(&mut self, key: &str, reader: &mut FieldReader<'_>) -> bool {
        match key {
            "clusterDNS" => self.cluster_dns = reader.string_list(),
            "clusterDomain" => self.cluster_domain = reader.string(),
            "resolvConf" => self.resolv_conf = reader.string(),
            _ => return false,
        }
        true
    }
}

/// Applies the defaults and validates, appending every problem. The kubelet logs and skips a
/// `clusterDNS` entry that is not an IP address; ringlet refuses the configuration instead, so a
/// typo does not silently leave pods without their cluster DNS.
pub(super) fn build(raw: RawDnsSettings, problems: &mut Vec<String>) -> DnsSettings {
    let mut cluster_dns = Vec::new();
    for entry in raw.cluster_dns.unwrap_or_default() {
        let entry = entry.trim();
        if entry.is_empty() {
            continue;
        }
        match entry.parse() {
            Ok(ip) => cluster_dns.push(ip),
            Err(_) => problems.push(format!(
                "clusterDNS (--cluster-dns): {entry:?} is not an IP address"
            )),
        }
    }
    let cluster_domain = raw.cluster_domain.unwrap_or_default();
    if !cluster_domain.is_empty()
        && let Err(reason) = validate_domain(&cluster_domain)
    {
        problems.push(format!(
            "clusterDomain (--cluster-domain): {cluster_domain:?} {reason}"
        ));
    }
    let resolv_conf = match raw.resolv_conf {
        None => DnsSettings::default().resolv_conf,
        Some(path) if path.is_empty() => None,
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                problems.push(format!(
                    "resolvConf (--resolv-conf): {} must be an absolute path, or empty for none",
                    path.display()
                ));
            }
            Some(path)
        }
    };
    DnsSettings {
        cluster_dns,
        cluster_domain,
        resolv_conf,
    }
}

/// A domain name as search paths take it: labels of letters, digits and inner `-`, at most 253
/// characters, one trailing dot allowed.
fn validate_domain(domain: &str) -> Result<(), &'static str> {
    let name = domain.strip_suffix('.').unwrap_or(domain);
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= MAX_LABEL_CHARS
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    if name.len() > MAX_DOMAIN_CHARS {
        Err("must be at most 253 characters")
    } else if name.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("must be a domain name such as cluster.local")
    }
}

impl DnsSettings {
    /// The section's `/configz` fields, named as in a config file.
    pub(super) fn configz(&self) -> impl Iterator<Item = (&'static str, Value)> {
        let cluster_dns: Vec<String> = self.cluster_dns.iter().map(IpAddr::to_string).collect();
        let resolv_conf = self
            .resolv_conf
            .as_ref()
            .map(|path| path.display().to_string())
            .unwrap_or_default();
        [
            ("clusterDNS", json!(cluster_dns)),
            ("clusterDomain", json!(self.cluster_domain)),
            ("resolvConf", json!(resolv_conf)),
        ]
        .into_iter()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn raw(
        cluster_dns: &[&str],
        domain: Option<&str>,
        resolv_conf: Option<&str>,
    ) -> RawDnsSettings {
        RawDnsSettings {
            cluster_dns: Some(cluster_dns.iter().map(|s| (*s).to_owned()).collect()),
            cluster_domain: domain.map(str::to_owned),
            resolv_conf: resolv_conf.map(str::to_owned),
        }
    }

    #[test]
    fn defaults_are_the_kubelets() {
        let mut problems = Vec::new();
        let settings = build(RawDnsSettings::default(), &mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(settings, DnsSettings::default());
        assert!(settings.cluster_dns.is_empty());
        assert_eq!(settings.cluster_domain, "");
        assert_eq!(
            settings.resolv_conf.as_deref(),
            Some(std::path::Path::new("/etc/resolv.conf"))
        );
    }

    #[test]
    fn addresses_of_both_families_and_an_empty_resolv_conf_are_taken() {
        let mut problems = Vec::new();
        let settings = build(
            raw(
                &["10.96.0.10", " fd00::a ", ""],
                Some("cluster.local."),
                Some(""),
            ),
            &mut problems,
        );
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(
            settings.cluster_dns,
            [
                "10.96.0.10".parse::<IpAddr>().unwrap(),
                "fd00::a".parse().unwrap()
            ]
        );
        assert_eq!(settings.cluster_domain, "cluster.local.");
        assert_eq!(settings.resolv_conf, None);
    }

    #[test]
    fn bad_values_are_named() {
        let mut problems = Vec::new();
        build(
            raw(&["10.0.0.300"], Some("-bad.local"), Some("etc/resolv.conf")),
            &mut problems,
        );
        assert_eq!(
            problems,
            [
                "clusterDNS (--cluster-dns): \"10.0.0.300\" is not an IP address",
                "clusterDomain (--cluster-domain): \"-bad.local\" must be a domain name such as cluster.local",
                "resolvConf (--resolv-conf): etc/resolv.conf must be an absolute path, or empty for none",
            ]
        );
        let mut problems = Vec::new();
        build(
            raw(&[], Some(&format!("{}.local", "a".repeat(250))), None),
            &mut problems,
        );
        assert_eq!(
            problems,
            [format!(
                "clusterDomain (--cluster-domain): \"{}.local\" must be at most 253 characters",
                "a".repeat(250)
            )]
        );
    }

    #[test]
    fn configz_renders_what_a_file_would_say() {
        let settings = build(
            raw(&["10.96.0.10"], Some("cluster.local"), Some("")),
            &mut Vec::new(),
        );
        let fields: Vec<(&str, Value)> = settings.configz().collect();
        assert_eq!(
            fields,
            [
                ("clusterDNS", json!(["10.96.0.10"])),
                ("clusterDomain", json!("cluster.local")),
                ("resolvConf", json!("")),
            ]
        );
    }
}
