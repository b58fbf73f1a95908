//! The node's IP address when `--node-ip` does not name one: apimachinery's `util/net`
//! `ChooseHostInterface` / `ResolveBindAddress`, which the kubelet's node-address setter and
//! `status.hostIP` rely on. The address is the first global unicast address, in the preferred family,
//! of an up interface that carries a default route (`/proc/net/route`, `/proc/net/ipv6_route`).

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

use nix::ifaddrs::getifaddrs;
use nix::net::if_::InterfaceFlags;

const IPV4_ROUTE_FILE: &str = "/proc/net/route";
const IPV6_ROUTE_FILE: &str = "/proc/net/ipv6_route";

/// Why no host address could be chosen; the texts are upstream's.
#[derive(Debug, thiserror::Error)]
pub enum HostIpError {
    #[error("listing the host's network interfaces")]
    Interfaces(#[source] io::Error),
    #[error("reading {path}")]
    Routes {
        path: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("no default routes found in \"{IPV4_ROUTE_FILE}\" or \"{IPV6_ROUTE_FILE}\"")]
    NoDefaultRoutes,
    #[error("unable to select an IP from default routes.")]
    NoRouteAddress,
    #[error("no acceptable interface with global unicast address found on host")]
    NoGlobalAddress,
}

/// A network interface of the host with its addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostInterface {
    name: String,
    up: bool,
    loopback: bool,
    point_to_point: bool,
    addresses: Vec<IpAddr>,
}

/// The host's interfaces in the kernel's order, each with its IPv4 and IPv6 addresses.
fn host_interfaces() -> Result<Vec<HostInterface>, HostIpError> {
    let mut order: Vec<String> = Vec::new();
    let mut by_name: BTreeMap<String, HostInterface> = BTreeMap::new();
    // getifaddrs lists an interface once per address (plus once for its link), so entries are
    // gathered by name.
    for entry in getifaddrs().map_err(|errno| HostIpError::Interfaces(errno.into()))? {
        let interface = by_name
            .entry(entry.interface_name.clone())
            .or_insert_with(|| {
                order.push(entry.interface_name.clone());
                HostInterface {
                    name: entry.interface_name.clone(),
                    up: entry.flags.contains(InterfaceFlags::IFF_UP),
                    loopback: entry.flags.contains(InterfaceFlags::IFF_LOOPBACK),
                    point_to_point: entry.flags.contains(InterfaceFlags::IFF_POINTOPOINT),
                    addresses: Vec::new(),
                }
            });
        let address = entry.address.as_ref().and_then(|address| {
            address
                .as_sockaddr_in()
                .map(|v4| IpAddr::V4(v4.ip()))
                .or_else(|| address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip())))
        });
        interface.addresses.extend(address);
    }
    Ok(order
        .iter()
        .filter_map(|name| by_name.remove(name))
        .collect())
}

/// Every address on the host's interfaces (what the kubelet checks a configured node IP against).
pub fn host_addresses() -> Result<Vec<IpAddr>, HostIpError> {
    Ok(host_interfaces()?
        .into_iter()
        .flat_map(|interface| interface.addresses)
        .collect())
}

/// The kubelet's choice of host address (`ChooseHostInterface`, or `ResolveBindAddress` for an
/// unspecified `--node-ip` of a family): IPv4 first unless `prefer_ipv6`.
pub fn host_ip(prefer_ipv6: bool) -> Result<IpAddr, HostIpError> {
    let interfaces = host_interfaces()?;
    let v4 = match std::fs::read_to_string(IPV4_ROUTE_FILE) {
        Ok(text) => Some(text),
        Err(err) if err.kind() == io::ErrorKind::NotFound => None,
        Err(source) => {
            return Err(HostIpError::Routes {
                path: IPV4_ROUTE_FILE,
                source,
            });
        }
    };
    // The IPv6 table is optional: a kernel without IPv6 has none.
    let v6 = std::fs::read_to_string(Path::new(IPV6_ROUTE_FILE)).ok();
    choose_host_ip(v4.as_deref(), v6.as_deref(), &interfaces, prefer_ipv6)
}

/// The address for `status.hostIP` and the serving certificate: [`host_ip`], else any global
/// unicast address of an up interface (so a host without a default route still gets its own
/// address), else 127.0.0.1.
pub fn node_ip() -> IpAddr {
    host_ip(false)
        .ok()
        .or_else(|| {
            host_interfaces()
                .ok()
                .and_then(|interfaces| ip_from_any_interface(&interfaces, false).ok())
        })
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST))
}

/// [`host_ip`] over given route tables (`None`: the IPv4 table does not exist) and interfaces.
fn choose_host_ip(
    v4_routes: Option<&str>,
    v6_routes: Option<&str>,
    interfaces: &[HostInterface],
    prefer_ipv6: bool,
) -> Result<IpAddr, HostIpError> {
    let Some(v4_routes) = v4_routes else {
        return ip_from_any_interface(interfaces, prefer_ipv6);
    };
    let mut routes = default_routes_v4(v4_routes);
    routes.extend(v6_routes.map(default_routes_v6).unwrap_or_default());
    if routes.is_empty() {
        return Err(HostIpError::NoDefaultRoutes);
    }
    for want_v6 in families(prefer_ipv6) {
        for route in routes.iter().filter(|route| route.ipv6 == want_v6) {
            let on_route = interfaces
                .iter()
                .filter(|interface| interface.name == route.interface && interface.up)
                .find_map(|interface| global_address(interface, want_v6));
            // A host that routes over link-local addresses only (RFC 5549) puts its global
            // address on the loopback interface.
            let on_loopback = || {
                interfaces
                    .iter()
                    .filter(|interface| interface.up && interface.loopback)
                    .find_map(|interface| global_address(interface, want_v6))
            };
            if let Some(ip) = on_route.or_else(on_loopback) {
                return Ok(ip);
            }
        }
    }
    Err(HostIpError::NoRouteAddress)
}

/// Go's `net.IP.IsGlobalUnicast`: not unspecified, loopback, multicast, link-local or broadcast.
fn is_global_unicast(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            !(v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local())
        }
    }
}

fn families(prefer_ipv6: bool) -> [bool; 2] {
    if prefer_ipv6 {
        [true, false]
    } else {
        [false, true]
    }
}

fn global_address(interface: &HostInterface, ipv6: bool) -> Option<IpAddr> {
    interface
        .addresses
        .iter()
        .copied()
        .find(|ip| ip.to_canonical().is_ipv6() == ipv6 && is_global_unicast(*ip))
}

/// Upstream's `chooseIPFromHostInterfaces`, used when there is no routing table to read.
fn ip_from_any_interface(
    interfaces: &[HostInterface],
    prefer_ipv6: bool,
) -> Result<IpAddr, HostIpError> {
    families(prefer_ipv6)
        .into_iter()
        .find_map(|want_v6| {
            interfaces
                .iter()
                .filter(|interface| {
                    interface.up && !interface.loopback && !interface.point_to_point
                })
                .find_map(|interface| global_address(interface, want_v6))
        })
        .ok_or(HostIpError::NoGlobalAddress)
}

#[derive(Debug, PartialEq, Eq)]
struct DefaultRoute {
    interface: String,
    ipv6: bool,
}

/// Default routes of `/proc/net/route`: `Iface Destination Gateway ...`, the destination in hex.
fn default_routes_v4(text: &str) -> Vec<DefaultRoute> {
    text.lines()
        .filter(|line| !line.starts_with("Iface"))
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let interface = fields.next()?;
            (fields.next()? == "00000000").then(|| DefaultRoute {
                interface: interface.to_owned(),
                ipv6: false,
            })
        })
        .collect()
}

/// Default routes of `/proc/net/ipv6_route` (destination, prefix, source, prefix, next hop, metric,
/// refcount, use, flags, interface); a default route without a next hop is the loopback's
/// unreachable route and is skipped, as upstream does.
fn default_routes_v6(text: &str) -> Vec<DefaultRoute> {
    const ZERO: &str = "00000000000000000000000000000000";
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (destination, next_hop, interface) =
                (fields.first()?, fields.get(4)?, fields.get(9)?);
            (*destination == ZERO && *next_hop != ZERO).then(|| DefaultRoute {
                interface: (*interface).to_owned(),
                ipv6: true,
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const V4_ROUTES: &str = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n\
        eth1\t000010AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n\
        eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n";
    const V6_ROUTES: &str = "\
        fd000000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 fd000000000000000000000000000001 00000400 00000002 00000000 00000003     eth0\n\
        00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo\n";

    fn interface(name: &str, addresses: &[&str]) -> HostInterface {
        HostInterface {
            name: name.to_owned(),
            up: true,
            loopback: name == "lo",
            point_to_point: false,
            addresses: addresses.iter().map(|a| a.parse().unwrap()).collect(),
        }
    }

    fn host() -> Vec<HostInterface> {
        vec![
            interface("lo", &["127.0.0.1", "::1"]),
            interface("eth1", &["172.16.0.5"]),
            interface("eth0", &["fe80::1", "192.0.2.2", "fd00::2"]),
        ]
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn picks_the_default_route_interface_not_the_first_interface() {
        let chosen = choose_host_ip(Some(V4_ROUTES), Some(V6_ROUTES), &host(), false).unwrap();
        assert_eq!(chosen, ip("192.0.2.2"));
    }

    #[test]
    fn an_ipv6_preference_takes_the_global_ipv6_address() {
        let chosen = choose_host_ip(Some(V4_ROUTES), Some(V6_ROUTES), &host(), true).unwrap();
        assert_eq!(chosen, ip("fd00::2"));
    }

    #[test]
    fn a_down_route_interface_falls_back_to_a_global_loopback_address_only() {
        let mut interfaces = host();
        interfaces[2].up = false;
        let err = choose_host_ip(Some(V4_ROUTES), None, &interfaces, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unable to select an IP from default routes."
        );
        interfaces[0].addresses.push(ip("203.0.113.7"));
        let chosen = choose_host_ip(Some(V4_ROUTES), None, &interfaces, false).unwrap();
        assert_eq!(chosen, ip("203.0.113.7"));
    }

    #[test]
    fn no_default_route_is_an_error_and_no_route_table_lists_interfaces() {
        let only_subnet = V4_ROUTES.lines().take(2).collect::<Vec<_>>().join("\n");
        let err = choose_host_ip(Some(&only_subnet), None, &host(), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no default routes found in \"/proc/net/route\" or \"/proc/net/ipv6_route\""
        );
        let chosen = choose_host_ip(None, None, &host(), false).unwrap();
        assert_eq!(chosen, ip("172.16.0.5"));
    }

    #[test]
    fn global_unicast_follows_go() {
        for (text, global) in [
            ("10.1.2.3", true),
            ("fd00::2", true),
            ("127.0.0.1", false),
            ("169.254.1.1", false),
            ("fe80::1", false),
            ("224.0.0.1", false),
            ("255.255.255.255", false),
            ("0.0.0.0", false),
            ("::ffff:127.0.0.1", false),
        ] {
            assert_eq!(is_global_unicast(ip(text)), global, "{text}");
        }
    }

    #[test]
    fn this_host_has_interfaces_with_loopback() {
        let interfaces = host_interfaces().unwrap();
        assert!(
            interfaces
                .iter()
                .any(|i| i.loopback && i.addresses.iter().any(IpAddr::is_loopback)),
            "{interfaces:?}"
        );
    }
}
