//! Facts about the machine read once at start: what cAdvisor's `machine.Info` and `VersionInfo`
//! give the kubelet's node-status setters (CPU count, memory, huge pages, machine/system/boot ids,
//! kernel and OS image) plus Go's `GOOS`/`GOARCH` names.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::NodeStatusError;
use crate::stats::read_key_values;

/// Facts about the machine, read once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineInfo {
    /// Online logical CPUs.
    pub num_cores: u32,
    /// `MemTotal` in bytes.
    pub memory_capacity_bytes: u64,
    /// `SwapTotal` in bytes (0 without swap).
    pub swap_capacity_bytes: u64,
    /// Huge page size in KiB -> pages reserved (`nr_hugepages`), every size the kernel offers.
    pub hugepages: BTreeMap<u64, u64>,
    /// `/etc/machine-id` (or D-Bus's copy); empty when neither exists.
    pub machine_id: String,
    /// The DMI product UUID; empty where it cannot be read (it is root-only on most machines).
    pub system_uuid: String,
    pub boot_id: String,
    /// `uname -r`.
    pub kernel_version: String,
    /// `PRETTY_NAME` of os-release, `"Linux"` when it has none, `"Unknown"` without the file.
    pub os_image: String,
    /// Go's `GOARCH` name of this build (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// Go's `GOOS` name: `linux`.
    pub operating_system: String,
}

/// Reads the machine's facts from `/proc`, `/sys` and `/etc`.
pub fn read_machine_info() -> Result<MachineInfo, NodeStatusError> {
    read_machine_info_from(Path::new("/"))
}

/// [`read_machine_info`] under another root (a fixture tree in tests).
fn read_machine_info_from(root: &Path) -> Result<MachineInfo, NodeStatusError> {
    let cpuinfo_path = root.join("proc/cpuinfo");
    let num_cores = count_processors(&read(&cpuinfo_path)?);
    if num_cores == 0 {
        return Err(NodeStatusError::MachineFact {
            path: cpuinfo_path,
            what: "a processor entry",
        });
    }
    let meminfo_path = root.join("proc/meminfo");
    let meminfo = read_key_values(&meminfo_path).map_err(NodeStatusError::Meminfo)?;
    let memory_capacity_bytes =
        meminfo
            .get("MemTotal")
            .copied()
            .ok_or_else(|| NodeStatusError::MachineFact {
                path: meminfo_path.clone(),
                what: "a MemTotal line",
            })?;
    Ok(MachineInfo {
        num_cores,
        memory_capacity_bytes,
        swap_capacity_bytes: meminfo.get("SwapTotal").copied().unwrap_or(0),
        hugepages: read_hugepages(&root.join("sys/kernel/mm/hugepages"))?,
        machine_id: first_readable(&[
            root.join("etc/machine-id"),
            root.join("var/lib/dbus/machine-id"),
        ]),
        system_uuid: first_readable(&[root.join("sys/class/dmi/id/product_uuid")]),
        boot_id: first_readable(&[root.join("proc/sys/kernel/random/boot_id")]),
        // The kernel's release string, the same text `uname(2)` returns.
        kernel_version: first_readable(&[root.join("proc/sys/kernel/osrelease")]),
        os_image: read_os_image(root),
        architecture: go_arch().to_owned(),
        operating_system: "linux".to_owned(),
    })
}

fn read(path: &Path) -> Result<String, NodeStatusError> {
    std::fs::read_to_string(path).map_err(|source| NodeStatusError::Read {
        path: path.to_owned(),
        source,
    })
}

/// The first of `paths` that can be read, trimmed; empty when none can (cAdvisor only warns).
fn first_readable(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .map(|text| text.trim().to_owned())
        .unwrap_or_default()
}

/// `/proc/cpuinfo` has one `processor : N` entry per online logical CPU on every architecture.
fn count_processors(cpuinfo: &str) -> u32 {
    let count = cpuinfo
        .lines()
        .filter(|line| {
            line.split_once(':')
                .is_some_and(|(key, _)| key.trim() == "processor")
        })
        .count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// Huge page sizes from `hugepages-<size>kB/nr_hugepages`; no directory means no huge page support,
/// which is not an error.
fn read_hugepages(dir: &Path) -> Result<BTreeMap<u64, u64>, NodeStatusError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(BTreeMap::new());
    };
    let mut pages = BTreeMap::new();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let size_kib = name
            .strip_prefix("hugepages-")
            .and_then(|rest| rest.strip_suffix("kB"))
            .and_then(|size| size.parse::<u64>().ok())
            .ok_or_else(|| NodeStatusError::MachineFact {
                path: entry.path(),
                what: "a hugepages-<size>kB directory name",
            })?;
        let count_path = entry.path().join("nr_hugepages");
        let count = read(&count_path)?;
        let count = count
            .trim()
            .parse::<u64>()
            .map_err(|_| NodeStatusError::MachineFact {
                path: count_path,
                what: "a page count",
            })?;
        pages.insert(size_kib, count);
    }
    Ok(pages)
}

/// cAdvisor's `ContainerOsVersion`: the first `PRETTY_NAME=` value of `/etc/os-release` (or
/// `/usr/lib/os-release` when that does not exist) with its quotes trimmed.
fn read_os_image(root: &Path) -> String {
    let text = std::fs::read_to_string(root.join("etc/os-release"))
        .or_else(|_| std::fs::read_to_string(root.join("usr/lib/os-release")));
    match text {
        Ok(text) => pretty_name(&text),
        Err(_) => "Unknown".to_owned(),
    }
}

fn pretty_name(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|line| {
            line.find("PRETTY_NAME=")
                .map(|at| &line[at + "PRETTY_NAME=".len()..])
        })
        .map_or_else(
            || "Linux".to_owned(),
            |value| value.trim_matches('"').to_owned(),
        )
}

/// Go's `GOARCH` for the architecture this agent was built for (the kubelet reports its own).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "x86" => "386",
        "aarch64" => "arm64",
        "powerpc64" if cfg!(target_endian = "little") => "ppc64le",
        "loongarch64" => "loong64",
        "mips64" if cfg!(target_endian = "little") => "mips64le",
        "mips" if cfg!(target_endian = "little") => "mipsle",
        // arm, s390x, riscv64, ppc64, mips and mips64 are spelled the same.
        other => other,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn reads_a_fixture_machine() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(
            root,
            "proc/cpuinfo",
            "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n\nprocessor\t: 2\n",
        );
        write(
            root,
            "proc/meminfo",
            "MemTotal:        8029064 kB\nMemFree:  1 kB\nSwapTotal:       1024 kB\n",
        );
        write(
            root,
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "16\n",
        );
        write(
            root,
            "sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            "0\n",
        );
        write(root, "var/lib/dbus/machine-id", "abc123\n");
        write(root, "proc/sys/kernel/random/boot_id", "b-o-o-t\n");
        write(root, "proc/sys/kernel/osrelease", "6.1.0-18-amd64\n");
        write(
            root,
            "usr/lib/os-release",
            "NAME=\"Debian\"\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n",
        );
        let info = read_machine_info_from(root).unwrap();
        assert_eq!(info.num_cores, 3);
        assert_eq!(info.memory_capacity_bytes, 8_029_064 * 1024);
        assert_eq!(info.swap_capacity_bytes, 1024 * 1024);
        assert_eq!(info.hugepages, BTreeMap::from([(2048, 16), (1_048_576, 0)]));
        assert_eq!(info.machine_id, "abc123");
        assert_eq!(info.system_uuid, "");
        assert_eq!(info.boot_id, "b-o-o-t");
        assert_eq!(info.kernel_version, "6.1.0-18-amd64");
        assert_eq!(info.os_image, "Debian GNU/Linux 12 (bookworm)");
    }

    #[test]
    fn a_machine_without_cpuinfo_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "proc/meminfo", "MemTotal: 1 kB\n");
        let err = read_machine_info_from(dir.path()).unwrap_err();
        assert!(err.to_string().contains("cpuinfo"), "{err}");
    }

    #[test]
    fn os_image_defaults() {
        assert_eq!(pretty_name("NAME=x\nID=y\n"), "Linux");
        assert_eq!(pretty_name("PRETTY_NAME=Plain Name\n"), "Plain Name");
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read_os_image(dir.path()), "Unknown");
    }

    #[test]
    fn reads_this_machine() {
        let info = read_machine_info().unwrap();
        let parallelism = std::thread::available_parallelism().unwrap().get();
        // The process may be confined to fewer CPUs than the machine has, never more.
        assert!(
            usize::try_from(info.num_cores).unwrap() >= parallelism,
            "{info:?}"
        );
        let stat = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert!(stat.contains(&format!("{} kB", info.memory_capacity_bytes / 1024)));
        assert!(info.memory_capacity_bytes > 64 << 20, "{info:?}");
        assert_eq!(info.boot_id.len(), 36, "{info:?}");
        assert!(
            info.kernel_version
                .starts_with(|c: char| c.is_ascii_digit())
        );
        assert!(!info.os_image.is_empty());
        assert_eq!(info.operating_system, "linux");
        assert!(
            ["amd64", "arm64"].contains(&info.architecture.as_str())
                || !info.architecture.contains('_'),
            "{info:?}"
        );
    }
}
