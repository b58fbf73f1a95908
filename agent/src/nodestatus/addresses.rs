//! The node's addresses: the kubelet's `NodeAddress` setter without a cloud provider
//! (`pkg/kubelet/nodestatus`) and its `validateNodeIP` (`pkg/kubelet/kubelet_node_status.go`).
//!
//! The choice of IP needs the host (its interfaces, DNS, the default route), so it is
//! [`resolve_node_ips`], called by the update loop off the core executor; the setter only writes
//! what it resolved.

use std::fmt;
use std::net::{IpAddr, ToSocketAddrs};

use k8s_openapi::api::core::v1::{Node, NodeAddress};

use super::{NodeFacts, NodeStatusError};
use crate::kubelet::{HostIpError, host_addresses, host_ip};

/// Set by the kubelet for external cloud providers only; anything else removes it.
const PROVIDED_NODE_IP_ANNOTATION: &str = "alpha.kubernetes.io/provided-node-ip";

/// Why a configured node IP is refused; the texts are upstream's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeIpRejection {
    Loopback,
    Multicast,
    LinkLocal,
    Unspecified,
    NotOnHost(IpAddr),
    /// The host's interfaces could not be listed to check the address against.
    Interfaces(String),
}

impl fmt::Display for NodeIpRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Loopback => f.write_str("nodeIP can't be loopback address"),
            Self::Multicast => f.write_str("nodeIP can't be a multicast address"),
            Self::LinkLocal => f.write_str("nodeIP can't be a link-local unicast address"),
            Self::Unspecified => f.write_str("nodeIP can't be an all zeros address"),
            Self::NotOnHost(ip) => write!(
                f,
                "node IP: {:?} not found in the host's network interfaces",
                ip.to_string()
            ),
            Self::Interfaces(err) => f.write_str(err),
        }
    }
}

/// Writes `InternalIP` for each resolved IP, then `Hostname`. Without a resolved IP the addresses
/// stay as they were (the kubelet's setter fails before touching them).
pub(super) fn set_addresses(node: &mut Node, facts: &NodeFacts<'_>) {
    if let Some(annotations) = node.metadata.annotations.as_mut() {
        annotations.remove(PROVIDED_NODE_IP_ANNOTATION);
    }
    if facts.node_ips.is_empty() {
        return;
    }
    let addresses = facts
        .node_ips
        .iter()
        .take(2)
        .map(|ip| NodeAddress {
            type_: "InternalIP".to_owned(),
            address: ip.to_string(),
        })
        .chain(std::iter::once(NodeAddress {
            type_: "Hostname".to_owned(),
            address: facts.hostname.to_owned(),
        }))
        .collect();
    node.status.get_or_insert_with(Default::default).addresses = Some(addresses);
}

/// The node's IPs as the kubelet picks them without a cloud provider:
/// 1. the configured `--node-ip` values (one, or an IPv4 and an IPv6 one), validated: not loopback,
///    multicast, link-local or unspecified, and present on an interface of this host;
/// 2. else the hostname when it is an IP;
/// 3. else the first valid address DNS gives for the node name, the preferred family first;
/// 4. else the address of the interface with the default route.
///
/// `0.0.0.0` / `::` (or nothing) configured means "detect", preferring IPv6 for `::`. Blocking (DNS,
/// `getifaddrs`, `/proc/net/route`): run it off the core executor.
pub fn resolve_node_ips(
    configured: &[IpAddr],
    hostname: &str,
    node_name: &str,
) -> Result<Vec<IpAddr>, NodeStatusError> {
    resolve(configured, hostname, node_name, &SystemNetwork)
}

/// The host facts the resolution asks for, behind a trait so tests can stand in for the host.
trait HostNetwork {
    fn addresses(&self) -> Result<Vec<IpAddr>, HostIpError>;
    fn lookup(&self, name: &str) -> Vec<IpAddr>;
    fn default_route_ip(&self, prefer_ipv6: bool) -> Result<IpAddr, HostIpError>;
}

struct SystemNetwork;

impl HostNetwork for SystemNetwork {
    fn addresses(&self) -> Result<Vec<IpAddr>, HostIpError> {
        host_addresses()
    }

    fn lookup(&self, name: &str) -> Vec<IpAddr> {
        // A failed lookup is no error upstream either: the default route is the next choice.
        (name, 0)
            .to_socket_addrs()
            .map(|addrs| addrs.map(|addr| addr.ip()).collect())
            .unwrap_or_default()
    }

    fn default_route_ip(&self, prefer_ipv6: bool) -> Result<IpAddr, HostIpError> {
        host_ip(prefer_ipv6)
    }
}

fn resolve(
    configured: &[IpAddr],
    hostname: &str,
    node_name: &str,
    host: &dyn HostNetwork,
) -> Result<Vec<IpAddr>, NodeStatusError> {
    let primary = configured.first().copied();
    let specified = |ip: Option<IpAddr>| ip.filter(|ip| !ip.is_unspecified());
    let (node_ip, secondary_ip) = (specified(primary), specified(configured.get(1).copied()));
    for (which, ip) in [("nodeIP", node_ip), ("secondaryNodeIP", secondary_ip)] {
        if let Some(ip) = ip {
            validate(ip, host)
                .map_err(|reason| NodeStatusError::InvalidNodeIp { which, reason })?;
        }
    }
    match (node_ip, secondary_ip) {
        (Some(first), Some(second)) => return Ok(vec![first, second]),
        (Some(first), None) => return Ok(vec![first]),
        _ => {}
    }
    if let Ok(ip) = hostname.parse::<IpAddr>() {
        return Ok(vec![ip]);
    }
    let prefer_ipv6 = primary.is_some_and(|ip| ip.is_ipv6());
    let mut chosen = None;
    for ip in host.lookup(node_name) {
        if validate(ip, host).is_err() {
            continue;
        }
        if ip.to_canonical().is_ipv6() == prefer_ipv6 {
            chosen = Some(ip);
            break;
        }
        chosen.get_or_insert(ip);
    }
    if let Some(ip) = chosen {
        return Ok(vec![ip]);
    }
    host.default_route_ip(prefer_ipv6)
        .map(|ip| vec![ip])
        .map_err(|err| NodeStatusError::NoNodeIp {
            node: node_name.to_owned(),
            cause: crate::error_chain::error_chain(&err),
        })
}

/// The kubelet's `validateNodeIP`.
fn validate(ip: IpAddr, host: &dyn HostNetwork) -> Result<(), NodeIpRejection> {
    let canonical = ip.to_canonical();
    let link_local = match canonical {
        IpAddr::V4(v4) => v4.is_link_local(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    if canonical.is_loopback() {
        return Err(NodeIpRejection::Loopback);
    }
    if canonical.is_multicast() {
        return Err(NodeIpRejection::Multicast);
    }
    if link_local {
        return Err(NodeIpRejection::LinkLocal);
    }
    if canonical.is_unspecified() {
        return Err(NodeIpRejection::Unspecified);
    }
    let on_host = host
        .addresses()
        .map_err(|err| NodeIpRejection::Interfaces(crate::error_chain::error_chain(&err)))?
        .iter()
        .any(|address| address.to_canonical() == canonical);
    if on_host {
        Ok(())
    } else {
        Err(NodeIpRejection::NotOnHost(ip))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::tests::{facts_with, machine};
    use super::*;

    struct FakeHost {
        addresses: Vec<IpAddr>,
        dns: Vec<IpAddr>,
        default_v4: Option<IpAddr>,
        default_v6: Option<IpAddr>,
    }

    impl HostNetwork for FakeHost {
        fn addresses(&self) -> Result<Vec<IpAddr>, HostIpError> {
            Ok(self.addresses.clone())
        }

        fn lookup(&self, _name: &str) -> Vec<IpAddr> {
            self.dns.clone()
        }

        fn default_route_ip(&self, prefer_ipv6: bool) -> Result<IpAddr, HostIpError> {
            let (first, second) = if prefer_ipv6 {
                (self.default_v6, self.default_v4)
            } else {
                (self.default_v4, self.default_v6)
            };
            first.or(second).ok_or(HostIpError::NoDefaultRoutes)
        }
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn host() -> FakeHost {
        FakeHost {
            addresses: vec![
                ip("127.0.0.1"),
                ip("10.0.0.5"),
                ip("fd00::5"),
                ip("fe80::5"),
            ],
            dns: Vec::new(),
            default_v4: Some(ip("10.0.0.5")),
            default_v6: Some(ip("fd00::5")),
        }
    }

    fn resolved(
        configured: &[&str],
        hostname: &str,
        host: &FakeHost,
    ) -> Result<Vec<IpAddr>, String> {
        let configured: Vec<IpAddr> = configured.iter().map(|s| ip(s)).collect();
        resolve(&configured, hostname, "node-1", host).map_err(|err| err.to_string())
    }

    #[test]
    fn a_configured_ip_must_be_usable_and_on_this_host() {
        let host = host();
        assert_eq!(
            resolved(&["10.0.0.5"], "h", &host),
            Ok(vec![ip("10.0.0.5")])
        );
        assert_eq!(
            resolved(&["127.0.0.1"], "h", &host),
            Err("failed to validate nodeIP: nodeIP can't be loopback address".to_owned())
        );
        assert_eq!(
            resolved(&["fe80::5"], "h", &host),
            Err(
                "failed to validate nodeIP: nodeIP can't be a link-local unicast address"
                    .to_owned()
            )
        );
        assert_eq!(
            resolved(&["224.0.0.1"], "h", &host),
            Err("failed to validate nodeIP: nodeIP can't be a multicast address".to_owned())
        );
        assert_eq!(
            resolved(&["10.9.9.9"], "h", &host),
            Err(
                "failed to validate nodeIP: node IP: \"10.9.9.9\" not found in the host's network interfaces"
                    .to_owned()
            )
        );
        assert_eq!(
            resolved(&["10.0.0.5", "::1"], "h", &host),
            Err("failed to validate secondaryNodeIP: nodeIP can't be loopback address".to_owned())
        );
    }

    #[test]
    fn dual_stack_keeps_both_in_order() {
        assert_eq!(
            resolved(&["fd00::5", "10.0.0.5"], "h", &host()),
            Ok(vec![ip("fd00::5"), ip("10.0.0.5")])
        );
    }

    #[test]
    fn without_a_node_ip_hostname_then_dns_then_default_route() {
        let mut host = host();
        assert_eq!(resolved(&[], "192.0.2.9", &host), Ok(vec![ip("192.0.2.9")]));
        host.dns = vec![ip("127.0.1.1"), ip("fd00::5"), ip("10.0.0.5")];
        assert_eq!(resolved(&[], "h", &host), Ok(vec![ip("10.0.0.5")]));
        assert_eq!(resolved(&["::"], "h", &host), Ok(vec![ip("fd00::5")]));
        host.dns = vec![ip("127.0.1.1")];
        assert_eq!(resolved(&["0.0.0.0"], "h", &host), Ok(vec![ip("10.0.0.5")]));
        assert_eq!(resolved(&["::"], "h", &host), Ok(vec![ip("fd00::5")]));
        host.default_v4 = None;
        host.default_v6 = None;
        assert_eq!(
            resolved(&[], "h", &host),
            Err(
                "can't get ip address of node node-1. error: no default routes found in \
                 \"/proc/net/route\" or \"/proc/net/ipv6_route\""
                    .to_owned()
            )
        );
    }

    #[test]
    fn the_setter_writes_internal_ips_then_hostname_or_leaves_addresses() {
        let machine = machine();
        let mut facts = facts_with(&machine);
        let ips = [ip("10.0.0.5"), ip("fd00::5")];
        facts.node_ips = &ips;
        let mut node = Node::default();
        node.metadata.annotations = Some(BTreeMap::from([(
            PROVIDED_NODE_IP_ANNOTATION.to_owned(),
            "1.2.3.4".to_owned(),
        )]));
        set_addresses(&mut node, &facts);
        let addresses: Vec<(String, String)> = node
            .status
            .as_ref()
            .unwrap()
            .addresses
            .iter()
            .flatten()
            .map(|a| (a.type_.clone(), a.address.clone()))
            .collect();
        assert_eq!(
            addresses,
            [
                ("InternalIP".to_owned(), "10.0.0.5".to_owned()),
                ("InternalIP".to_owned(), "fd00::5".to_owned()),
                ("Hostname".to_owned(), "node-1.example".to_owned()),
            ]
        );
        assert_eq!(node.metadata.annotations, Some(BTreeMap::new()));
        facts.node_ips = &[];
        set_addresses(&mut node, &facts);
        assert_eq!(node.status.unwrap().addresses.unwrap().len(), 3);
    }

    /// This host's interfaces and routes, with DNS left out so the test does not wait on a
    /// resolver.
    struct NoDns;

    impl HostNetwork for NoDns {
        fn addresses(&self) -> Result<Vec<IpAddr>, HostIpError> {
            SystemNetwork.addresses()
        }

        fn lookup(&self, _name: &str) -> Vec<IpAddr> {
            Vec::new()
        }

        fn default_route_ip(&self, prefer_ipv6: bool) -> Result<IpAddr, HostIpError> {
            SystemNetwork.default_route_ip(prefer_ipv6)
        }
    }

    #[test]
    fn this_host_resolves_a_non_loopback_address_or_says_why() {
        match resolve(&[], "not-an-ip", "node-1", &NoDns) {
            Ok(ips) => {
                assert_eq!(ips.len(), 1);
                assert!(!ips[0].is_loopback(), "{ips:?}");
                // What was detected passes the check a configured IP gets.
                let again = resolve(&ips, "not-an-ip", "node-1", &NoDns).unwrap();
                assert_eq!(again, ips);
            }
            Err(err) => assert!(
                err.to_string()
                    .starts_with("can't get ip address of node node-1"),
                "{err}"
            ),
        }
        let err = resolve(&[ip("127.0.0.1")], "h", "node-1", &NoDns).unwrap_err();
        assert!(matches!(
            err,
            NodeStatusError::InvalidNodeIp {
                which: "nodeIP",
                reason: NodeIpRejection::Loopback
            }
        ));
    }
}
