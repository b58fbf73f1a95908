//! The `/etc/hosts` the kubelet writes for a pod's containers (`pkg/kubelet/kubelet_pods.go`:
//! `makeHostsMount`, `managedHostsFileContent`, `nodeHostsFileContent`,
//! `GeneratePodHostNameAndDomain`): `<pod-dir>/etc-hosts`, bind-mounted over every container's
//! `/etc/hosts` unless the container mounts something there itself. A pod on the pod network gets
//! loopback and the pod's own name for each of its addresses; a host-network pod a copy of the
//! node's file under another header (so the suite can tell the two apart). `hostAliases` come last
//! in both.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod};

/// Where the hosts file is in a container.
pub const CONTAINER_PATH: &str = "/etc/hosts";
/// The file's name in the pod directory.
const FILE_NAME: &str = "etc-hosts";
/// The node's own hosts file, which host-network pods see a copy of.
pub const NODE_HOSTS: &str = "/etc/hosts";
const MANAGED_HEADER: &str = "# Kubernetes-managed hosts file.\n";
const MANAGED_HEADER_HOST_NETWORK: &str = "# Kubernetes-managed hosts file (host network).\n";
/// Longest hostname the kernel accepts.
const MAX_HOSTNAME_LEN: usize = 63;

/// The pod's hostname and, when it has a `subdomain`, its domain (`<subdomain>.<namespace>.svc.
/// <cluster domain>`). `hostnameOverride` wins over both and has no domain. The name is cut to 63
/// characters without a trailing `-` or `.`.
pub fn hostname_and_domain(pod: &Pod, cluster_domain: &str) -> (String, Option<String>) {
    let spec = pod.spec.as_ref();
    if let Some(name) = spec.and_then(|s| s.hostname_override.as_deref()) {
        return (cut(name), None);
    }
    let name = spec
        .and_then(|s| s.hostname.as_deref())
        .filter(|h| !h.is_empty())
        .or(pod.metadata.name.as_deref())
        .unwrap_or_default();
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|subdomain| {
            format!(
                "{subdomain}.{}.svc.{cluster_domain}",
                pod.metadata.namespace.as_deref().unwrap_or("default")
            )
        });
    (cut(name), domain)
}

fn cut(name: &str) -> String {
    let mut cut: String = name.chars().take(MAX_HOSTNAME_LEN).collect();
    while cut.ends_with(['-', '.']) {
        cut.pop();
    }
    cut
}

fn host_network(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false)
}

/// Whether the kubelet gives `container` its hosts file: the pod has an address to put in it
/// (host-network pods always do), and the container mounts nothing at `/etc/hosts` itself.
pub fn is_managed_for(container: &Container, pod_ips: &[String]) -> bool {
    !pod_ips.is_empty()
        && !container
            .volume_mounts
            .iter()
            .flatten()
            .any(|mount| Path::new(&mount.mount_path) == Path::new(CONTAINER_PATH))
}

/// The `hostAliases` section: a blank line, a comment, and one line per address with its names.
fn host_aliases(pod: &Pod) -> String {
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_deref())
        .unwrap_or_default();
    if aliases.is_empty() {
        return String::new();
    }
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        out.push_str(alias.ip.as_str());
        out.push('\t');
        out.push_str(&alias.hostnames.as_deref().unwrap_or_default().join("\t"));
        out.push('\n');
    }
    out
}

/// The file's content: for a host-network pod the node's hosts file (`node_hosts`) under its own
/// header, else loopback, the IPv6 multicast names and the pod's name for each of `pod_ips`; then
/// the `hostAliases`.
pub fn content(pod: &Pod, pod_ips: &[String], cluster_domain: &str, node_hosts: &str) -> String {
    let mut out = String::new();
    if host_network(pod) {
        out.push_str(MANAGED_HEADER_HOST_NETWORK);
        out.push_str(node_hosts);
    } else {
        out.push_str(MANAGED_HEADER);
        out.push_str("127.0.0.1\tlocalhost\n");
        out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
        out.push_str("fe00::0\tip6-localnet\n");
        out.push_str("fe00::0\tip6-mcastprefix\n");
        out.push_str("fe00::1\tip6-allnodes\n");
        out.push_str("fe00::2\tip6-allrouters\n");
        let (name, domain) = hostname_and_domain(pod, cluster_domain);
        for ip in pod_ips {
            match &domain {
                Some(domain) => {
                    let _ = writeln!(out, "{ip}\t{name}.{domain}\t{name}");
                }
                None => {
                    let _ = writeln!(out, "{ip}\t{name}");
                }
            }
        }
    }
    out.push_str(&host_aliases(pod));
    out
}

/// Makes sure the pod's hosts file is in `pod_dir` and returns its path. As the kubelet, the file
/// is written once per pod: its containers share it, and what one of them writes there outlives
/// its restarts. A new file is written to a temporary name and renamed, so a container never reads
/// half of it; a host-network pod's copy reads the node's `/etc/hosts` now.
pub fn ensure(
    pod_dir: &Path,
    pod: &Pod,
    pod_ips: &[String],
    cluster_domain: &str,
) -> io::Result<PathBuf> {
    let path = pod_dir.join(FILE_NAME);
    if path.exists() {
        return Ok(path);
    }
    let node_hosts = if host_network(pod) {
        std::fs::read_to_string(NODE_HOSTS)?
    } else {
        String::new()
    };
    let text = content(pod, pod_ips, cluster_domain, &node_hosts);
    std::fs::create_dir_all(pod_dir)?;
    let staged = pod_dir.join(format!(".{FILE_NAME}.tmp"));
    std::fs::write(&staged, text)?;
    std::fs::rename(&staged, &path)?;
    Ok(path)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut spec = spec;
        spec["containers"] = serde_json::json!([{ "name": "c" }]);
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "web-0", "namespace": "shop" },
            "spec": spec,
        }))
        .unwrap()
    }

    const HEAD: &str = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n\
        ::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\n\
        fe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";

    #[test]
    fn a_pod_network_pod_gets_its_name_for_each_address_and_its_aliases() {
        let p = pod(serde_json::json!({
            "hostAliases": [
                { "ip": "123.45.67.89", "hostnames": ["foo", "bar"] },
                { "ip": "10.0.0.1", "hostnames": ["baz"] },
            ],
        }));
        let ips = ["10.88.0.7".to_owned(), "fd00::7".to_owned()];
        assert_eq!(
            content(&p, &ips, "cluster.local", "ignored"),
            format!(
                "{HEAD}10.88.0.7\tweb-0\nfd00::7\tweb-0\n\n# Entries added by HostAliases.\n\
                 123.45.67.89\tfoo\tbar\n10.0.0.1\tbaz\n"
            )
        );
    }

    #[test]
    fn a_subdomain_gives_the_pod_a_fully_qualified_name() {
        let p = pod(serde_json::json!({ "hostname": "db", "subdomain": "t" }));
        assert_eq!(
            hostname_and_domain(&p, "cluster.local"),
            ("db".to_owned(), Some("t.shop.svc.cluster.local".to_owned()))
        );
        assert_eq!(
            content(&p, &["10.88.0.7".to_owned()], "cluster.local", ""),
            format!("{HEAD}10.88.0.7\tdb.t.shop.svc.cluster.local\tdb\n")
        );
    }

    #[test]
    fn a_hostname_override_wins_and_has_no_domain() {
        let p = pod(serde_json::json!({
            "hostname": "db", "subdomain": "t", "hostnameOverride": "override.example.host",
        }));
        assert_eq!(
            hostname_and_domain(&p, "cluster.local"),
            ("override.example.host".to_owned(), None)
        );
        assert!(
            content(&p, &["10.88.0.7".to_owned()], "cluster.local", "")
                .ends_with("10.88.0.7\toverride.example.host\n")
        );
    }

    #[test]
    fn long_names_are_cut_without_a_trailing_separator() {
        let name = format!("{}-tail", "a".repeat(62));
        let p = pod(serde_json::json!({ "hostname": name }));
        assert_eq!(hostname_and_domain(&p, "").0, "a".repeat(62));
    }

    #[test]
    fn a_host_network_pod_gets_the_nodes_file_under_its_own_header() {
        let p = pod(serde_json::json!({
            "hostNetwork": true,
            "hostAliases": [{ "ip": "123.45.67.89", "hostnames": ["foo"] }],
        }));
        let node = "127.0.0.1\tlocalhost\n10.0.2.15\tnode-1\n";
        let text = content(&p, &["10.0.2.15".to_owned()], "", node);
        assert_eq!(
            text,
            format!(
                "# Kubernetes-managed hosts file (host network).\n{node}\n\
                 # Entries added by HostAliases.\n123.45.67.89\tfoo\n"
            )
        );
        assert!(!text.starts_with(MANAGED_HEADER));
    }

    #[test]
    fn a_container_mounting_its_own_hosts_file_keeps_it() {
        let plain: Container = serde_json::from_value(serde_json::json!({ "name": "a" })).unwrap();
        let own: Container = serde_json::from_value(serde_json::json!({
            "name": "b",
            "volumeMounts": [{ "name": "h", "mountPath": "/etc/hosts" }],
        }))
        .unwrap();
        let ips = ["10.88.0.7".to_owned()];
        assert!(is_managed_for(&plain, &ips));
        assert!(!is_managed_for(&own, &ips));
        assert!(!is_managed_for(&plain, &[]), "no address, nothing to write");
    }

    #[test]
    fn the_file_is_written_once_into_the_pod_directory() {
        let dir = tempfile::tempdir().unwrap();
        let p = pod(serde_json::json!({}));
        let path = ensure(dir.path(), &p, &["10.88.0.7".to_owned()], "").unwrap();
        assert_eq!(path, dir.path().join("etc-hosts"));
        assert!(
            std::fs::read_to_string(&path)
                .unwrap()
                .ends_with("10.88.0.7\tweb-0\n")
        );
        std::fs::write(&path, "written by a container\n").unwrap();
        ensure(dir.path(), &p, &["10.88.0.8".to_owned()], "").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "written by a container\n",
            "a restarted container keeps the pod's file"
        );
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no staging file left"
        );
    }
}
