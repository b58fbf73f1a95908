//! Driver-independent cgroup names and their cgroupfs and systemd spellings (the kubelet's
//! `CgroupName`, `ToCgroupfs` and `ToSystemd` in `pkg/kubelet/cm/cgroup_manager_linux.go`).

use crate::apis::config::CgroupDriver;

const SLICE_SUFFIX: &str = ".slice";

/// A cgroup as a list of components, e.g. `["kubepods", "burstable", "pod<uid>"]`; the driver
/// decides how it is spelled on the host.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    pub fn new(components: Vec<String>) -> Self {
        Self(components)
    }

    /// Parses a `cgroupRoot` as the driver spells it: `/a/b` for cgroupfs, `/` or `/a.slice/a-b.slice`
    /// (only the last slice matters) for systemd.
    pub fn parse(root: &str, driver: CgroupDriver) -> Self {
        match driver {
            CgroupDriver::Cgroupfs => Self(
                root.split('/')
                    .filter(|part| !part.is_empty())
                    .map(str::to_owned)
                    .collect(),
            ),
            CgroupDriver::Systemd => {
                let leaf = root.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                let leaf = leaf.strip_suffix(SLICE_SUFFIX).unwrap_or(leaf);
                if leaf.is_empty() {
                    return Self::default();
                }
                Self(leaf.split('-').map(|part| part.replace('_', "-")).collect())
            }
        }
    }

    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// This name with `component` appended.
    #[must_use]
    pub fn child(&self, component: impl Into<String>) -> Self {
        let mut components = self.0.clone();
        components.push(component.into());
        Self(components)
    }

    /// The absolute path the driver uses, e.g. `/kubepods/burstable/pod1234` or
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice`.
    pub fn to_driver_path(&self, driver: CgroupDriver) -> String {
        format!("/{}", self.relative_path(driver))
    }

    /// The path below a hierarchy's mount point (no leading `/`; empty for the root).
    pub fn relative_path(&self, driver: CgroupDriver) -> String {
        match driver {
            CgroupDriver::Cgroupfs => self.0.join("/"),
            CgroupDriver::Systemd => {
                let escaped: Vec<String> = self.0.iter().map(|part| escape_systemd(part)).collect();
                (1..=escaped.len())
                    .map(|depth| format!("{}{SLICE_SUFFIX}", escaped[..depth].join("-")))
                    .collect::<Vec<_>>()
                    .join("/")
            }
        }
    }

    /// The last path component the driver uses for this name.
    pub fn leaf(&self, driver: CgroupDriver) -> String {
        let path = self.relative_path(driver);
        path.rsplit('/').next().unwrap_or_default().to_owned()
    }
}

/// systemd uses `-` to express nesting in slice names, so dashes inside a component become `_`.
fn escape_systemd(part: &str) -> String {
    part.replace('-', "_")
}

/// Undoes [`escape_systemd`] for a name read back from the host.
pub(super) fn unescape_systemd(part: &str) -> String {
    part.replace('_', "-")
}

#[cfg(test)]
#[allow(clippy::expect_used, clippy::unwrap_used)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        CgroupName::new(parts.iter().map(|p| (*p).to_owned()).collect())
    }

    #[test]
    fn cgroupfs_spelling() {
        let pod = name(&["kubepods", "burstable", "pod1234-5678"]);
        assert_eq!(
            pod.to_driver_path(CgroupDriver::Cgroupfs),
            "/kubepods/burstable/pod1234-5678"
        );
        assert_eq!(pod.leaf(CgroupDriver::Cgroupfs), "pod1234-5678");
        assert_eq!(
            CgroupName::default().to_driver_path(CgroupDriver::Cgroupfs),
            "/"
        );
    }

    #[test]
    fn systemd_spelling() {
        let pod = name(&["kubepods", "burstable", "pod1234-5678"]);
        assert_eq!(
            pod.to_driver_path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice"
        );
        assert_eq!(
            name(&["kubepods", "podab-cd"]).to_driver_path(CgroupDriver::Systemd),
            "/kubepods.slice/kubepods-podab_cd.slice"
        );
        assert_eq!(
            CgroupName::default().to_driver_path(CgroupDriver::Systemd),
            "/"
        );
    }

    #[test]
    fn parses_roots() {
        assert_eq!(
            CgroupName::parse("/", CgroupDriver::Cgroupfs),
            CgroupName::default()
        );
        assert_eq!(
            CgroupName::parse("/a/b/", CgroupDriver::Cgroupfs),
            name(&["a", "b"])
        );
        assert_eq!(
            CgroupName::parse("/", CgroupDriver::Systemd),
            CgroupName::default()
        );
        assert_eq!(
            CgroupName::parse(
                "/ringlet.slice/ringlet-my_node.slice",
                CgroupDriver::Systemd
            ),
            name(&["ringlet", "my-node"])
        );
    }
}
