//! The node's IP address for `status.hostIP` (the kubelet's `nodeutil` address selection, reduced to
//! "the first non-loopback IPv4 address of an interface that is up").

use std::net::{IpAddr, Ipv4Addr};

/// The first non-loopback IPv4 address of an up interface, or 127.0.0.1 when there is none.
pub fn node_ip() -> IpAddr {
    first_non_loopback_ipv4().map_or(IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V4)
}

fn first_non_loopback_ipv4() -> Option<Ipv4Addr> {
    let mut list: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a pointer to a list it allocated into `list`; we free it below.
    if unsafe { libc::getifaddrs(&raw mut list) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cursor = list;
    while !cursor.is_null() {
        // SAFETY: `cursor` is a non-null node of the list getifaddrs returned, alive until freeifaddrs.
        let entry = unsafe { &*cursor };
        cursor = entry.ifa_next;
        let up = entry.ifa_flags & (libc::IFF_UP as u32) != 0;
        let loopback = entry.ifa_flags & (libc::IFF_LOOPBACK as u32) != 0;
        if !up || loopback || entry.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-null and points to a sockaddr owned by the list.
        let family = unsafe { (*entry.ifa_addr).sa_family };
        if i32::from(family) != libc::AF_INET {
            continue;
        }
        // SAFETY: the family is AF_INET, so the address is a sockaddr_in; it is read unaligned
        // because the list only guarantees a sockaddr's alignment.
        let addr = unsafe { entry.ifa_addr.cast::<libc::sockaddr_in>().read_unaligned() };
        found = Some(Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)));
        break;
    }
    // SAFETY: `list` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(list) };
    found
}
