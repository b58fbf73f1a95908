//! Container and sandbox stats read from their cgroups (v1 controllers, or the cgroup2 tree), as
//! containerd's `container_stats_list_linux.go` and `sandbox_stats_linux.go` derive them: CPU time,
//! memory usage, working set (usage less inactive file pages), RSS, page faults, and the pod's
//! process count. The kubelet reads them in `pkg/kubelet/stats/cri_stats_provider.go`. A writable
//! layer is reported empty (there is none) and no network usage (there is no network).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use crate::cgroup::{self, Driver, Hierarchies};
use crate::cri::v1 as cri;
use crate::state::{Container, Sandbox};

/// A v1 memory limit at or above this is "unlimited" (the kernel's is 2^63 less a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// What a stats read needs besides the object.
pub struct StatsContext<'a> {
    pub hierarchies: &'a Hierarchies,
    pub driver: Driver,
    /// The filesystem reported for writable layers.
    pub root: &'a Path,
    pub timestamp: i64,
}

impl StatsContext<'_> {
    pub fn container(&self, container: &Container) -> cri::ContainerStats {
        let relative = container
            .cgroup
            .as_ref()
            .map(cgroup::ContainerCgroup::relative);
        cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: container.id.clone(),
                metadata: container.config.metadata.clone(),
                labels: container.config.labels.clone(),
                annotations: container.config.annotations.clone(),
            }),
            cpu: relative.and_then(|r| self.cpu(r)),
            memory: relative.and_then(|r| self.memory(r)),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: self.timestamp,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: self.root.to_string_lossy().into_owned(),
                }),
                used_bytes: Some(cri::UInt64Value { value: 0 }),
                inodes_used: Some(cri::UInt64Value { value: 0 }),
            }),
        }
    }

    /// The pod cgroup's totals, with its containers' stats.
    pub fn sandbox(
        &self,
        sandbox: &Sandbox,
        containers: Vec<cri::ContainerStats>,
    ) -> cri::PodSandboxStats {
        let relative = cgroup::parent_path(self.driver, sandbox.cgroup_parent()).ok();
        let relative = relative.as_deref();
        cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: sandbox.id.clone(),
                metadata: sandbox.config.metadata.clone(),
                labels: sandbox.config.labels.clone(),
                annotations: sandbox.config.annotations.clone(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: relative.and_then(|r| self.cpu(r)),
                memory: relative.and_then(|r| self.memory(r)),
                network: None,
                process: relative.and_then(|r| self.process(r)),
                containers,
            }),
        }
    }

    fn cpu(&self, relative: &Path) -> Option<cri::CpuUsage> {
        let hierarchy = self.hierarchies.for_controller("cpuacct")?;
        let dir = hierarchy.mount.join(relative);
        let usage_ns = if hierarchy.controllers.is_some() {
            read_u64(&dir.join("cpuacct.usage"))?
        } else {
            read_flat(&dir.join("cpu.stat"))?.get("usage_usec")? * 1_000
        };
        Some(cri::CpuUsage {
            timestamp: self.timestamp,
            usage_core_nano_seconds: Some(cri::UInt64Value { value: usage_ns }),
            // Left to the client, which computes it from two readings.
            usage_nano_cores: None,
        })
    }

    fn memory(&self, relative: &Path) -> Option<cri::MemoryUsage> {
        let hierarchy = self.hierarchies.for_controller("memory")?;
        let dir = hierarchy.mount.join(relative);
        let (usage, limit, stat, keys) = if hierarchy.controllers.is_some() {
            let limit = read_u64(&dir.join("memory.limit_in_bytes")).filter(|l| *l < V1_UNLIMITED);
            (
                read_u64(&dir.join("memory.usage_in_bytes"))?,
                limit,
                read_flat(&dir.join("memory.stat"))?,
                [
                    "total_inactive_file",
                    "total_rss",
                    "total_pgfault",
                    "total_pgmajfault",
                ],
            )
        } else {
            (
                read_u64(&dir.join("memory.current"))?,
                // "max" does not parse: no limit.
                read_u64(&dir.join("memory.max")),
                read_flat(&dir.join("memory.stat"))?,
                ["inactive_file", "anon", "pgfault", "pgmajfault"],
            )
        };
        let [inactive_file, rss, faults, major_faults] = keys.map(|k| stat.get(k).copied());
        let working_set = usage.saturating_sub(inactive_file.unwrap_or(0));
        let value = |value| Some(cri::UInt64Value { value });
        Some(cri::MemoryUsage {
            timestamp: self.timestamp,
            working_set_bytes: value(working_set),
            available_bytes: limit.and_then(|l| value(l.saturating_sub(working_set))),
            usage_bytes: value(usage),
            rss_bytes: rss.and_then(value),
            page_faults: faults.and_then(value),
            major_page_faults: major_faults.and_then(value),
        })
    }

    fn process(&self, relative: &Path) -> Option<cri::ProcessUsage> {
        let hierarchy = self.hierarchies.for_controller("pids")?;
        let count = read_u64(&hierarchy.mount.join(relative).join("pids.current"))?;
        Some(cri::ProcessUsage {
            timestamp: self.timestamp,
            process_count: Some(cri::UInt64Value { value: count }),
        })
    }
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A flat-keyed cgroup file (`memory.stat`, `cpu.stat`): `<key> <value>` lines.
fn read_flat(path: &Path) -> Option<HashMap<String, u64>> {
    let text = fs::read_to_string(path).ok()?;
    Some(parse_flat(&text))
}

fn parse_flat(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let (key, value) = line.split_once(' ')?;
            Some((key.to_owned(), value.trim().parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        fs::create_dir_all(dir).unwrap();
        fs::write(dir.join(file), text).unwrap();
    }

    #[test]
    fn v1_files_give_containerd_s_figures() {
        let root = tempfile::tempdir().unwrap();
        let mount = |name: &str| root.path().join(name);
        let mountinfo: Vec<String> = ["cpuacct", "memory", "pids"]
            .iter()
            .enumerate()
            .map(|(i, c)| {
                format!(
                    "{i} 1 0:{i} / {} rw - cgroup cgroup rw,{c}",
                    mount(c).display()
                )
            })
            .collect();
        let mountinfo = mountinfo.join("\n");
        let hierarchies = Hierarchies::parse_mountinfo(&mountinfo);
        let pod = Path::new("kubepods/pod1");
        write(&mount("cpuacct").join(pod), "cpuacct.usage", "1234\n");
        write(
            &mount("memory").join(pod),
            "memory.usage_in_bytes",
            "1000\n",
        );
        write(
            &mount("memory").join(pod),
            "memory.limit_in_bytes",
            "9223372036854771712\n",
        );
        write(
            &mount("memory").join(pod),
            "memory.stat",
            "cache 5\ntotal_inactive_file 300\ntotal_rss 600\n\
             total_pgfault 7\ntotal_pgmajfault 1\n",
        );
        write(&mount("pids").join(pod), "pids.current", "3\n");
        let context = StatsContext {
            hierarchies: &hierarchies,
            driver: Driver::Cgroupfs,
            root: Path::new("/var/lib/ringlet-hollow"),
            timestamp: 9,
        };
        let cpu = context.cpu(pod).unwrap();
        assert_eq!(cpu.usage_core_nano_seconds.unwrap().value, 1234);
        let memory = context.memory(pod).unwrap();
        let value = |v: Option<cri::UInt64Value>| v.map(|v| v.value);
        assert_eq!(value(memory.working_set_bytes), Some(700));
        assert_eq!(value(memory.usage_bytes), Some(1000));
        assert_eq!(value(memory.rss_bytes), Some(600));
        assert_eq!(value(memory.page_faults), Some(7));
        assert_eq!(value(memory.major_page_faults), Some(1));
        assert_eq!(value(memory.available_bytes), None, "unlimited");
        write(
            &mount("memory").join(pod),
            "memory.limit_in_bytes",
            "1700\n",
        );
        let memory = context.memory(pod).unwrap();
        assert_eq!(value(memory.available_bytes), Some(1000));
        let process = context.process(pod).unwrap();
        assert_eq!(value(process.process_count), Some(3));
        assert_eq!(context.cpu(&PathBuf::from("missing")), None);
    }

    #[test]
    fn v2_files_give_the_same_figures() {
        let root = tempfile::tempdir().unwrap();
        let mountinfo = format!(
            "1 0 0:1 / {} rw - cgroup2 cgroup2 rw\n",
            root.path().display()
        );
        let hierarchies = Hierarchies::parse_mountinfo(&mountinfo);
        let dir = root.path().join("pod");
        write(&dir, "cpu.stat", "usage_usec 5\nuser_usec 3\n");
        write(&dir, "memory.current", "1000\n");
        write(&dir, "memory.max", "max\n");
        write(
            &dir,
            "memory.stat",
            "anon 600\ninactive_file 300\npgfault 7\npgmajfault 1\n",
        );
        let context = StatsContext {
            hierarchies: &hierarchies,
            driver: Driver::Cgroupfs,
            root: Path::new("/"),
            timestamp: 9,
        };
        let pod = Path::new("pod");
        assert_eq!(
            context.cpu(pod).unwrap().usage_core_nano_seconds,
            Some(cri::UInt64Value { value: 5000 })
        );
        let memory = context.memory(pod).unwrap();
        assert_eq!(
            memory.working_set_bytes,
            Some(cri::UInt64Value { value: 700 })
        );
        assert_eq!(memory.rss_bytes, Some(cri::UInt64Value { value: 600 }));
        assert_eq!(memory.available_bytes, None);
    }
}
