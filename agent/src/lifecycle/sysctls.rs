//! Which sysctls a pod may set (`spec.securityContext.sysctls`): the safe ones, namespaced and
//! isolated from other pods, always; the node's `allowedUnsafeSysctls` (names, or prefixes ending
//! in `*`) on top. A pod naming any other is refused at admission with `SysctlForbidden`, as the
//! kubelet's sysctl admit handler does (`pkg/kubelet/sysctl`); one setting a network sysctl with
//! `hostNetwork`, or an IPC one with `hostIPC`, too, since it would change the host's.

use k8s_openapi::api::core::v1::Pod;

use super::predicate::Rejection;

/// The kubelet's reason for a pod refused for its sysctls.
pub const FORBIDDEN_REASON: &str = "SysctlForbidden";

/// The sysctls every pod may set: namespaced and isolated, so they touch no other pod. Every one
/// of them is namespaced from Linux 4.15 on, below the agent's minimum (5.10).
const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The kernel namespace a sysctl belongs to, where it is known to be namespaced at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Namespace {
    Ipc,
    Net,
}

impl Namespace {
    /// Which namespace `name` (dot-separated) is in: `kernel.sem`, `kernel.shm*`, `kernel.msg*`
    /// and `fs.mqueue.*` are IPC, `net.*` network; anything else is not known to be namespaced.
    fn of(name: &str) -> Option<Self> {
        if name == "kernel.sem"
            || ["kernel.shm", "kernel.msg", "fs.mqueue."]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        {
            Some(Self::Ipc)
        } else if name.starts_with("net.") {
            Some(Self::Net)
        } else {
            None
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Ipc => "ipc",
            Self::Net => "net",
        }
    }
}

/// A sysctl name with `/` as its separator (`net/ipv4/tcp_syncookies`, allowed by the API) in its
/// dotted form; a name whose first separator is a dot is left as it is (dots may then appear in
/// its parts, e.g. interface names, as `/`). The two separators swap roles, as `sysctl(8)` reads
/// them.
fn dotted(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(first) if name.as_bytes()[first] == b'/' => name
            .chars()
            .map(|c| match c {
                '/' => '.',
                '.' => '/',
                other => other,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// Whether `pattern` is a sysctl name, or a prefix ending in `*`, as the API validates them:
/// lowercase segments of letters, digits, `_` and `-` separated by dots or slashes, at most 253
/// characters.
fn is_valid_pattern(pattern: &str) -> bool {
    const MAX_LEN: usize = 253;
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    let segment_ok = |segment: &str| {
        !segment.is_empty()
            && segment
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-".contains(c))
    };
    pattern.len() <= MAX_LEN
        && !name.is_empty()
        && name
            .trim_end_matches(['.', '/'])
            .split(['.', '/'])
            .all(segment_ok)
}

/// The sysctls pods may set on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SysctlAllowlist {
    /// `allowedUnsafeSysctls` as configured.
    allowed_unsafe: Vec<String>,
    /// Whole names, with their namespace.
    names: Vec<(String, Namespace)>,
    /// Prefixes (the patterns' text before `*`), with their namespace.
    prefixes: Vec<(String, Namespace)>,
}

impl Default for SysctlAllowlist {
    /// The safe sysctls only.
    fn default() -> Self {
        Self {
            allowed_unsafe: Vec::new(),
            names: SAFE_SYSCTLS
                .iter()
                .filter_map(|name| Some(((*name).to_owned(), Namespace::of(name)?)))
                .collect(),
            prefixes: Vec::new(),
        }
    }
}

impl SysctlAllowlist {
    /// The safe sysctls and `allowed_unsafe` (`allowedUnsafeSysctls`); an entry that is not a valid
    /// sysctl pattern or not known to be namespaced is named in the error.
    pub fn new(allowed_unsafe: &[String]) -> Result<Self, String> {
        let mut allowlist = Self {
            allowed_unsafe: allowed_unsafe.to_vec(),
            ..Self::default()
        };
        for pattern in allowed_unsafe.iter().map(String::as_str) {
            if !is_valid_pattern(pattern) {
                return Err(format!(
                    "sysctl {pattern:?} is not a sysctl name or a prefix of names ending in *"
                ));
            }
            let pattern = dotted(pattern);
            if let Some(prefix) = pattern.strip_suffix('*') {
                let namespace = Namespace::of(prefix).ok_or_else(|| {
                    format!("the sysctls {pattern:?} are not known to be namespaced")
                })?;
                allowlist.prefixes.push((prefix.to_owned(), namespace));
            } else {
                let namespace = Namespace::of(&pattern).ok_or_else(|| {
                    format!("the sysctl {pattern:?} is not known to be namespaced")
                })?;
                allowlist.names.push((pattern, namespace));
            }
        }
        Ok(allowlist)
    }

    /// `allowedUnsafeSysctls` as configured.
    pub fn allowed_unsafe(&self) -> &[String] {
        &self.allowed_unsafe
    }

    /// Why `name` may not be set by a pod with these host namespaces, or `None` when it may.
    fn forbids(&self, name: &str, host_network: bool, host_ipc: bool) -> Option<String> {
        let name = dotted(name);
        let namespace = self
            .names
            .iter()
            .find(|(allowed, _)| *allowed == name)
            .or_else(|| {
                self.prefixes
                    .iter()
                    .find(|(prefix, _)| name.starts_with(prefix.as_str()))
            })
            .map(|(_, namespace)| *namespace);
        match namespace {
            None => Some(format!("{name:?} not allowlisted")),
            Some(ns @ Namespace::Net) if host_network => Some(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(ns @ Namespace::Ipc) if host_ipc => Some(format!(
                "{name:?} not allowed with host {} enabled",
                ns.as_str()
            )),
            Some(_) => None,
        }
    }

    /// Admits `pod` unless one of its sysctls is forbidden: the first one is named.
    pub fn admit(&self, pod: &Pod) -> Result<(), Rejection> {
        let Some(spec) = &pod.spec else {
            return Ok(());
        };
        let sysctls = spec
            .security_context
            .as_ref()
            .and_then(|context| context.sysctls.as_deref())
            .unwrap_or_default();
        let host_network = spec.host_network.unwrap_or(false);
        let host_ipc = spec.host_ipc.unwrap_or(false);
        match sysctls
            .iter()
            .find_map(|sysctl| self.forbids(&sysctl.name, host_network, host_ipc))
        {
            Some(why) => Err(Rejection {
                reason: FORBIDDEN_REASON.to_owned(),
                message: format!("forbidden sysctl: {why}"),
            }),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(sysctls: &[&str], host_network: bool, host_ipc: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": { "name": "p" },
            "spec": {
                "hostNetwork": host_network,
                "hostIPC": host_ipc,
                "securityContext": {
                    "sysctls": sysctls
                        .iter()
                        .map(|name| serde_json::json!({ "name": name, "value": "1" }))
                        .collect::<Vec<_>>(),
                },
                "containers": [{ "name": "c" }],
            },
        }))
        .unwrap()
    }

    #[test]
    fn safe_sysctls_pass_and_others_are_forbidden_by_name() {
        let allowlist = SysctlAllowlist::default();
        assert_eq!(allowlist, SysctlAllowlist::new(&[]).unwrap());
        assert_eq!(
            allowlist.names.len(),
            SAFE_SYSCTLS.len(),
            "every safe sysctl is namespaced"
        );
        assert!(
            allowlist
                .admit(&pod(
                    &["kernel.shm_rmid_forced", "net.ipv4.tcp_rmem"],
                    false,
                    false
                ))
                .is_ok()
        );
        let refused = allowlist
            .admit(&pod(
                &["kernel.shm_rmid_forced", "kernel.msgmax"],
                false,
                false,
            ))
            .unwrap_err();
        assert_eq!(refused.reason, "SysctlForbidden");
        assert_eq!(
            refused.message,
            "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
        );
        assert!(allowlist.admit(&pod(&[], false, false)).is_ok());
    }

    #[test]
    fn slash_separated_names_are_read_as_their_dotted_form() {
        let allowlist = SysctlAllowlist::new(&[]).unwrap();
        assert!(
            allowlist
                .admit(&pod(&["net/ipv4/ip_local_port_range"], false, false))
                .is_ok()
        );
        assert_eq!(
            dotted("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
        assert_eq!(
            dotted("net.ipv4.conf.eno2/100.rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
    }

    #[test]
    fn allowed_unsafe_names_and_prefixes_are_admitted() {
        let allowlist =
            SysctlAllowlist::new(&["kernel.msg*".to_owned(), "net.core.somaxconn".to_owned()])
                .unwrap();
        assert!(
            allowlist
                .admit(&pod(&["kernel.msgmax", "net.core.somaxconn"], false, false))
                .is_ok()
        );
        assert!(
            allowlist
                .admit(&pod(&["kernel.sem"], false, false))
                .is_err()
        );
    }

    #[test]
    fn host_namespaces_forbid_the_sysctls_of_their_kind() {
        let allowlist = SysctlAllowlist::new(&["kernel.msg*".to_owned()]).unwrap();
        let refused = allowlist
            .admit(&pod(&["net.ipv4.tcp_syncookies"], true, false))
            .unwrap_err();
        assert_eq!(
            refused.message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"
        );
        assert!(
            allowlist
                .admit(&pod(&["kernel.msgmax"], true, false))
                .is_ok()
        );
        let refused = allowlist
            .admit(&pod(&["kernel.msgmax"], false, true))
            .unwrap_err();
        assert!(refused.message.contains("host ipc enabled"));
    }

    #[test]
    fn unnamespaced_or_malformed_patterns_are_refused_by_name() {
        let err = SysctlAllowlist::new(&["vm.swappiness".to_owned()]).unwrap_err();
        assert!(
            err.contains("\"vm.swappiness\" is not known to be namespaced"),
            "{err}"
        );
        let err = SysctlAllowlist::new(&["kernel.*".to_owned()]).unwrap_err();
        assert!(
            err.contains("\"kernel.*\" are not known to be namespaced"),
            "{err}"
        );
        let err = SysctlAllowlist::new(&["Net.Core".to_owned()]).unwrap_err();
        assert!(err.contains("not a sysctl name"), "{err}");
        assert!(SysctlAllowlist::new(&["net.*".to_owned(), "fs.mqueue.*".to_owned()]).is_ok());
    }
}
