//! Container cgroups as containerd's runc makes them: named after the container below the sandbox's
//! `cgroup_parent` (`<parent>/<id>` with the cgroupfs driver, `<parent slice path>/cri-containerd-
//! <id>.scope` with systemd), created in every mounted hierarchy (each cgroup v1 controller, named
//! v1 hierarchies such as `name=systemd`, and the cgroup2 tree, where a hybrid host's eBPF PLEG
//! looks), with the container's CPU and memory limits. No kubelet counterpart: this is the
//! runtime's side of `pkg/kubelet/cm`'s naming (`cgroup_manager_linux.go`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

use crate::cri::v1 as cri;

/// The prefix containerd gives a container's systemd scope.
const SCOPE_PREFIX: &str = "cri-containerd-";

/// Super options of a v1 cgroup mount that are not controllers.
const NOT_CONTROLLERS: [&str; 6] = [
    "rw",
    "ro",
    "xattr",
    "noprefix",
    "clone_children",
    "cpuset_v2_mode",
];

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("reading /proc/self/mountinfo")]
    Mountinfo(#[source] io::Error),
    #[error("no cgroup hierarchy is mounted")]
    NoHierarchy,
    #[error("invalid systemd slice name {name:?} in the cgroup parent")]
    InvalidSlice { name: String },
    #[error("creating cgroup {}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("writing {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("removing cgroup {}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// How the agent spells cgroups (its `cgroupDriver`), which decides how containers are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Driver {
    Cgroupfs,
    Systemd,
}

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    pub mount: PathBuf,
    /// The v1 controllers it carries (empty for a named hierarchy); `None` for the cgroup2 tree.
    pub controllers: Option<Vec<String>>,
}

impl Hierarchy {
    fn is_v1_with(&self, controller: &str) -> bool {
        self.controllers
            .as_ref()
            .is_some_and(|c| c.iter().any(|c| c == controller))
    }
}

/// Every cgroup hierarchy mounted on the host.
#[derive(Debug, Clone, Default)]
pub struct Hierarchies(Vec<Hierarchy>);

impl Hierarchies {
    /// The hierarchies `/proc/self/mountinfo` lists.
    pub fn discover() -> Result<Self, CgroupError> {
        let text = fs::read_to_string("/proc/self/mountinfo").map_err(CgroupError::Mountinfo)?;
        let found = Self::parse_mountinfo(&text);
        if found.0.is_empty() {
            return Err(CgroupError::NoHierarchy);
        }
        Ok(found)
    }

    /// Parses mountinfo; a hierarchy mounted twice counts once (its first mount).
    pub fn parse_mountinfo(text: &str) -> Self {
        let mut found = Vec::new();
        // A hierarchy is identified by its controllers and name (`name=systemd`).
        let mut seen: Vec<Vec<&str>> = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            let Some(separator) = fields.iter().position(|f| *f == "-") else {
                continue;
            };
            let (Some(mount), Some(fs_type), Some(options)) = (
                fields.get(4),
                fields.get(separator + 1),
                fields.get(separator + 3),
            ) else {
                continue;
            };
            let (identity, controllers) = match *fs_type {
                "cgroup2" => (vec!["cgroup2"], None),
                "cgroup" => {
                    let options: Vec<&str> = options
                        .split(',')
                        .filter(|o| !NOT_CONTROLLERS.contains(o))
                        .collect();
                    let identity = options
                        .iter()
                        .copied()
                        .filter(|o| !o.contains('=') || o.starts_with("name="))
                        .collect();
                    let controllers = options
                        .iter()
                        .filter(|o| !o.contains('='))
                        .map(|o| (*o).to_owned())
                        .collect();
                    (identity, Some(controllers))
                }
                _ => continue,
            };
            if !seen.contains(&identity) {
                seen.push(identity);
                found.push(Hierarchy {
                    mount: PathBuf::from(unescape(mount)),
                    controllers,
                });
            }
        }
        Self(found)
    }

    pub fn all(&self) -> &[Hierarchy] {
        &self.0
    }

    /// Where `controller`'s files are: its v1 hierarchy, else the cgroup2 tree.
    pub fn for_controller(&self, controller: &str) -> Option<&Hierarchy> {
        self.0
            .iter()
            .find(|h| h.is_v1_with(controller))
            .or_else(|| self.0.iter().find(|h| h.controllers.is_none()))
    }
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        if let Some(byte) = octal {
            out.push(byte);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The pod's cgroup below each hierarchy's root, from the sandbox's `cgroup_parent`: a path
/// (`/kubepods/besteffort/pod<uid>`, or the systemd driver's full slice path), or a bare systemd
/// slice name (`kubepods-besteffort-pod<uid>.slice`, the upstream kubelet's form), expanded as
/// runc does.
pub fn parent_path(driver: Driver, parent: &str) -> Result<PathBuf, CgroupError> {
    if driver == Driver::Systemd && !parent.contains('/') {
        return expand_slice(parent);
    }
    Ok(PathBuf::from(parent.trim_start_matches('/')))
}

/// `a-b-c.slice` → `a.slice/a-b.slice/a-b-c.slice`; `-.slice` is the root.
fn expand_slice(name: &str) -> Result<PathBuf, CgroupError> {
    let invalid = || CgroupError::InvalidSlice {
        name: name.to_owned(),
    };
    let stem = name.strip_suffix(".slice").ok_or_else(invalid)?;
    if stem == "-" {
        return Ok(PathBuf::new());
    }
    if stem.is_empty() || stem.starts_with('-') || stem.ends_with('-') || stem.contains("--") {
        return Err(invalid());
    }
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in stem.split('-') {
        if !prefix.is_empty() {
            prefix.push('-');
        }
        prefix.push_str(part);
        path.push(format!("{prefix}.slice"));
    }
    Ok(path)
}

/// The container's own cgroup directory name.
pub fn container_leaf(driver: Driver, id: &str) -> String {
    match driver {
        Driver::Cgroupfs => id.to_owned(),
        Driver::Systemd => format!("{SCOPE_PREFIX}{id}.scope"),
    }
}

/// A container's cgroup: the same relative path in every hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroup {
    relative: PathBuf,
    dirs: Vec<PathBuf>,
}

impl ContainerCgroup {
    /// Creates `relative` (and missing parents) in every hierarchy and writes the container's
    /// limits; on failure, removes what it created.
    pub fn create(
        hierarchies: &Hierarchies,
        relative: &Path,
        resources: Option<&cri::LinuxContainerResources>,
    ) -> Result<Self, CgroupError> {
        let mut cgroup = Self {
            relative: relative.to_owned(),
            dirs: Vec::new(),
        };
        let created = hierarchies.all().iter().try_for_each(|hierarchy| {
            let dir = hierarchy.mount.join(relative);
            fs::create_dir_all(&dir).map_err(|source| CgroupError::Create {
                path: dir.clone(),
                source,
            })?;
            cgroup.dirs.push(dir.clone());
            if hierarchy.is_v1_with("cpuset") {
                fill_cpusets(&hierarchy.mount, relative)?;
            }
            if let Some(resources) = resources {
                write_limits(hierarchy, &dir, resources)?;
            }
            Ok(())
        });
        match created {
            Ok(()) => Ok(cgroup),
            Err(e) => {
                if let Err(removing) = cgroup.remove() {
                    tracing::warn!("cleaning up after a failed cgroup creation: {removing}");
                }
                Err(e)
            }
        }
    }

    /// The path below each hierarchy's root.
    pub fn relative(&self) -> &Path {
        &self.relative
    }

    /// Each hierarchy's `cgroup.procs`, open for writing, so a forked child can move itself in.
    pub fn procs_files(&self) -> Result<Vec<File>, CgroupError> {
        self.dirs
            .iter()
            .map(|dir| {
                let path = dir.join("cgroup.procs");
                OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|source| CgroupError::Write { path, source })
            })
            .collect()
    }

    /// Removes the container's directories (not its parents); an already missing one is fine.
    pub fn remove(&self) -> Result<(), CgroupError> {
        let mut first_error = None;
        for dir in &self.dirs {
            match fs::remove_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    first_error.get_or_insert(CgroupError::Remove {
                        path: dir.clone(),
                        source: e,
                    });
                }
                _ => {}
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A v1 cpuset cgroup takes no process until its `cpuset.cpus` and `cpuset.mems` are set: fill
/// each empty one on the way down from its parent, as runc does.
fn fill_cpusets(mount: &Path, relative: &Path) -> Result<(), CgroupError> {
    let mut dir = mount.to_owned();
    for component in relative.components() {
        let parent = dir.clone();
        dir.push(component);
        for file in ["cpuset.cpus", "cpuset.mems"] {
            let own = dir.join(file);
            if fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty()) {
                let inherited = fs::read_to_string(parent.join(file)).unwrap_or_default();
                write(&own, inherited.trim())?;
            }
        }
    }
    Ok(())
}

/// The container's CPU and memory limits (0 means unset in the CRI); other resources are not
/// applied.
fn write_limits(
    hierarchy: &Hierarchy,
    dir: &Path,
    resources: &cri::LinuxContainerResources,
) -> Result<(), CgroupError> {
    let shares = u64::try_from(resources.cpu_shares).unwrap_or(0);
    let period = u64::try_from(resources.cpu_period).unwrap_or(0);
    let quota = u64::try_from(resources.cpu_quota).unwrap_or(0);
    let memory = u64::try_from(resources.memory_limit_in_bytes).unwrap_or(0);
    let mut writes: Vec<(&str, String)> = Vec::new();
    if hierarchy.controllers.is_some() {
        if hierarchy.is_v1_with("cpu") {
            if shares > 0 {
                writes.push(("cpu.shares", shares.to_string()));
            }
            if period > 0 {
                writes.push(("cpu.cfs_period_us", period.to_string()));
            }
            if quota > 0 {
                writes.push(("cpu.cfs_quota_us", quota.to_string()));
            }
        }
        if hierarchy.is_v1_with("memory") && memory > 0 {
            writes.push(("memory.limit_in_bytes", memory.to_string()));
        }
    } else {
        if shares > 0 {
            writes.push(("cpu.weight", cpu_weight(shares).to_string()));
        }
        if quota > 0 {
            let period = if period > 0 { period } else { 100_000 };
            writes.push(("cpu.max", format!("{quota} {period}")));
        }
        if memory > 0 {
            writes.push(("memory.max", memory.to_string()));
        }
        // A hybrid host's cgroup2 tree has no controllers, and a pure cgroup2 parent may not
        // delegate them: only files that exist are written.
        writes.retain(|(file, _)| dir.join(file).exists());
    }
    writes
        .iter()
        .try_for_each(|(file, value)| write(&dir.join(file), value))
}

/// runc's mapping of cgroup v1 shares (2–262144) onto cgroup v2 weights (1–10000).
fn cpu_weight(shares: u64) -> u64 {
    1 + (shares.clamp(2, 262_144) - 2) * 9_999 / 262_142
}

fn write(path: &Path, value: &str) -> Result<(), CgroupError> {
    fs::write(path, value).map_err(|source| CgroupError::Write {
        path: path.to_owned(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
25 30 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:25 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:11 - cgroup cgroup rw,xattr,name=systemd
28 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:12 - cgroup cgroup rw,cpu
29 25 0:27 / /sys/fs/cgroup/cpuacct rw,relatime shared:13 - cgroup cgroup rw,cpuacct
30 25 0:28 / /sys/fs/cgroup/memory rw,relatime shared:14 - cgroup cgroup rw,memory
31 25 0:29 / /sys/fs/cgroup/pids rw,relatime shared:15 - cgroup cgroup rw,pids
32 25 0:30 / /sys/fs/cgroup/net_cls,net_prio rw,relatime shared:16 - cgroup cgroup rw,net_cls,net_prio
33 40 0:28 / /mnt/again\\040there rw,relatime - cgroup cgroup rw,memory
34 25 0:31 / /sys/fs/cgroup/blkio rw,relatime shared:17 - cgroup cgroup rw,blkio,clone_children
";

    #[test]
    fn mountinfo_lists_each_hierarchy_once() {
        let found = Hierarchies::parse_mountinfo(HYBRID);
        let mounts: Vec<&str> = found
            .all()
            .iter()
            .map(|h| h.mount.to_str().unwrap())
            .collect();
        assert_eq!(
            mounts,
            [
                "/sys/fs/cgroup/unified",
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/cpu",
                "/sys/fs/cgroup/cpuacct",
                "/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/pids",
                "/sys/fs/cgroup/net_cls,net_prio",
                "/sys/fs/cgroup/blkio",
            ]
        );
        assert_eq!(found.all()[1].controllers, Some(Vec::new()));
        assert_eq!(
            found.all()[6].controllers,
            Some(vec!["net_cls".to_owned(), "net_prio".to_owned()])
        );
        assert_eq!(found.all()[7].controllers, Some(vec!["blkio".to_owned()]));
        let mount = |c| found.for_controller(c).map(|h| h.mount.clone());
        assert_eq!(mount("cpuacct"), Some("/sys/fs/cgroup/cpuacct".into()));
        assert_eq!(mount("pids"), Some("/sys/fs/cgroup/pids".into()));
        // A controller with no v1 hierarchy is looked for in the cgroup2 tree.
        assert_eq!(mount("io"), Some("/sys/fs/cgroup/unified".into()));
    }

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape("/mnt/again\\040there"), "/mnt/again there");
        assert_eq!(unescape("/a\\\\b\\04"), "/a\\\\b\\04");
        let two = "1 0 0:1 / /a\\040b rw - cgroup2 cgroup2 rw\n";
        let found = Hierarchies::parse_mountinfo(two);
        assert_eq!(found.all()[0].mount, PathBuf::from("/a b"));
    }

    #[test]
    fn parents_follow_the_driver() {
        let path = |driver, parent| parent_path(driver, parent).unwrap();
        assert_eq!(
            path(Driver::Cgroupfs, "/kubepods/besteffort/pod1"),
            PathBuf::from("kubepods/besteffort/pod1")
        );
        assert_eq!(
            path(Driver::Systemd, "kubepods-besteffort-pod1_2.slice"),
            PathBuf::from(
                "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1_2.slice"
            )
        );
        assert_eq!(
            path(Driver::Systemd, "/kubepods.slice/kubepods-pod1.slice"),
            PathBuf::from("kubepods.slice/kubepods-pod1.slice")
        );
        assert_eq!(path(Driver::Systemd, "-.slice"), PathBuf::new());
        for bad in ["kubepods", "-a.slice", "a--b.slice", "a-.slice", ".slice"] {
            assert!(parent_path(Driver::Systemd, bad).is_err(), "{bad}");
        }
        assert_eq!(container_leaf(Driver::Cgroupfs, "abc"), "abc");
        assert_eq!(
            container_leaf(Driver::Systemd, "abc"),
            "cri-containerd-abc.scope"
        );
    }

    #[test]
    fn limits_are_written_in_each_version_s_files() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["cpu.weight", "cpu.max"] {
            fs::write(dir.path().join(file), "").unwrap();
        }
        let resources = cri::LinuxContainerResources {
            cpu_shares: 1024,
            cpu_quota: 50_000,
            memory_limit_in_bytes: 1 << 20,
            ..Default::default()
        };
        let v2 = Hierarchy {
            mount: PathBuf::from("/"),
            controllers: None,
        };
        write_limits(&v2, dir.path(), &resources).unwrap();
        let read = |file: &str| fs::read_to_string(dir.path().join(file)).unwrap();
        assert_eq!(read("cpu.weight"), "39");
        assert_eq!(read("cpu.max"), "50000 100000");
        // No memory controller delegated: no memory.max is created.
        assert!(!dir.path().join("memory.max").exists());

        let v1_cpu = Hierarchy {
            mount: PathBuf::from("/"),
            controllers: Some(vec!["cpu".to_owned(), "cpuacct".to_owned()]),
        };
        write_limits(&v1_cpu, dir.path(), &resources).unwrap();
        assert_eq!(read("cpu.shares"), "1024");
        assert_eq!(read("cpu.cfs_quota_us"), "50000");
        assert!(!dir.path().join("cpu.cfs_period_us").exists());
        assert!(!dir.path().join("memory.limit_in_bytes").exists());
    }

    #[test]
    fn cpu_weights_match_runc() {
        assert_eq!(cpu_weight(2), 1);
        assert_eq!(cpu_weight(262_144), 10_000);
        assert_eq!(cpu_weight(1024), 39);
    }

    #[test]
    fn empty_cpusets_inherit_on_the_way_down() {
        let root = tempfile::tempdir().unwrap();
        fs::write(root.path().join("cpuset.cpus"), "0-1\n").unwrap();
        fs::write(root.path().join("cpuset.mems"), "0\n").unwrap();
        let pod = root.path().join("pod");
        let container = pod.join("c");
        fs::create_dir_all(&container).unwrap();
        for dir in [&pod, &container] {
            fs::write(dir.join("cpuset.cpus"), "\n").unwrap();
            fs::write(dir.join("cpuset.mems"), "\n").unwrap();
        }
        fs::write(pod.join("cpuset.cpus"), "1\n").unwrap();
        fill_cpusets(root.path(), Path::new("pod/c")).unwrap();
        let read = |path: PathBuf| fs::read_to_string(path).unwrap();
        assert_eq!(read(pod.join("cpuset.cpus")), "1\n");
        assert_eq!(read(pod.join("cpuset.mems")), "0");
        assert_eq!(read(container.join("cpuset.cpus")), "1");
        assert_eq!(read(container.join("cpuset.mems")), "0");
    }
}
