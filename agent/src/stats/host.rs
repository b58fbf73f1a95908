//! Node-wide figures from procfs, filesystem usage from `statvfs`, and the bytes a directory tree
//! holds (cAdvisor's machine and filesystem stats as the kubelet uses them).

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::StatsError;
use super::cgroup::{MemorySample, parse_u64, required};
use super::types::InterfaceStats;

/// The contents of files read ahead, by path.
type ReadAhead = HashMap<PathBuf, Vec<u8>>;

thread_local! {
    /// Files read ahead for the scrape running on this thread (see [`with_prefetched`]).
    static PREFETCHED: RefCell<Option<ReadAhead>> = const { RefCell::new(None) };
}

/// Runs `scrape` with `files` as the contents of those paths: the cgroup files of a scrape are read
/// ahead in one batch through the agent's I/O engine, and the (synchronous) parsing reads them
/// from memory. Paths not in `files` (they could not be read ahead) are read from disk as usual.
pub(super) fn with_prefetched<T>(
    files: HashMap<PathBuf, Vec<u8>>,
    scrape: impl FnOnce() -> T,
) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            PREFETCHED.with_borrow_mut(|prefetched| *prefetched = None);
        }
    }
    PREFETCHED.with_borrow_mut(|prefetched| *prefetched = Some(files));
    let _reset = Reset;
    scrape()
}

/// Reads a whole (small) file, from the read-ahead of the running scrape when it holds it.
pub(super) fn read_to_string(path: &Path) -> Result<String, StatsError> {
    let prefetched = PREFETCHED.with_borrow(|prefetched| {
        prefetched.as_ref().and_then(|files| {
            files
                .get(path)
                .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
        })
    });
    if let Some(text) = prefetched {
        return Ok(text);
    }
    std::fs::read_to_string(path).map_err(|source| StatsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Parses `key value` lines (cgroup `*.stat`, `/proc/vmstat`) and `Key: value kB` lines
/// (`/proc/meminfo`, returned in bytes). Lines whose value is not a number are skipped.
pub(crate) fn read_key_values(path: &Path) -> Result<HashMap<String, u64>, StatsError> {
    Ok(parse_key_values(&read_to_string(path)?))
}

fn parse_key_values(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let key = fields.next()?.trim_end_matches(':');
            let value: u64 = fields.next()?.parse().ok()?;
            let value = match fields.next() {
                Some("kB") => value.saturating_mul(1024),
                _ => value,
            };
            Some((key.to_owned(), value))
        })
        .collect()
}

/// The node's procfs (a fixture tree in tests).
#[derive(Debug, Clone)]
pub(super) struct Procfs {
    root: PathBuf,
    /// `USER_HZ`, the unit of `/proc/stat`.
    clock_ticks: u64,
}

impl Procfs {
    pub fn new(root: PathBuf, clock_ticks: u64) -> Self {
        Self { root, clock_ticks }
    }

    /// Cumulative busy CPU time of all cores in nanoseconds: everything in the `cpu` line of
    /// `/proc/stat` but idle and iowait (guest time is already part of user time).
    pub fn cpu_usage_ns(&self) -> Result<u64, StatsError> {
        let path = self.root.join("stat");
        let text = read_to_string(&path)?;
        let line = text
            .lines()
            .find(|line| line.split_whitespace().next() == Some("cpu"))
            .ok_or(StatsError::MissingField {
                path: path.clone(),
                field: "cpu",
            })?;
        let fields = line
            .split_whitespace()
            .skip(1)
            .map(|value| parse_u64(value, &path))
            .collect::<Result<Vec<u64>, _>>()?;
        // user nice system idle iowait irq softirq steal: the first eight are in every kernel this
        // agent supports.
        let [user, nice, system, _idle, _iowait, irq, softirq, steal, ..] = fields[..] else {
            return Err(StatsError::Parse {
                path,
                what: "a cpu line with at least eight fields",
                value: line.to_owned(),
            });
        };
        let ticks = [user, nice, system, irq, softirq, steal]
            .iter()
            .fold(0u64, |sum, value| sum.saturating_add(*value));
        let nanos_per_tick = 1_000_000_000 / self.clock_ticks.max(1);
        Ok(ticks.saturating_mul(nanos_per_tick))
    }

    /// Boot time in seconds since the epoch (`btime` in `/proc/stat`).
    pub fn boot_time(&self) -> Result<i64, StatsError> {
        let path = self.root.join("stat");
        let stat = read_key_values(&path)?;
        let btime = required(&stat, "btime", &path)?;
        i64::try_from(btime).map_err(|_| StatsError::Parse {
            path,
            what: "a boot time in seconds",
            value: btime.to_string(),
        })
    }

    /// Node memory as cAdvisor's root container sees it: usage is everything not free.
    pub fn memory(&self) -> Result<NodeMemory, StatsError> {
        let meminfo_path = self.root.join("meminfo");
        let meminfo = read_key_values(&meminfo_path)?;
        let vmstat_path = self.root.join("vmstat");
        let vmstat = read_key_values(&vmstat_path)?;
        let field = |key| required(&meminfo, key, &meminfo_path);
        let total = field("MemTotal")?;
        let swap_total = field("SwapTotal")?;
        Ok(NodeMemory {
            sample: MemorySample {
                usage: total.saturating_sub(field("MemFree")?),
                inactive_file: field("Inactive(file)")?,
                rss: field("AnonPages")?,
                page_faults: required(&vmstat, "pgfault", &vmstat_path)?,
                major_page_faults: required(&vmstat, "pgmajfault", &vmstat_path)?,
                limit: Some(total),
            },
            swap: (swap_total > 0)
                .then(|| field("SwapFree"))
                .transpose()?
                .map(|free| SwapUsage {
                    available: free,
                    usage: swap_total.saturating_sub(free),
                }),
        })
    }

    /// Counters of the host's interfaces from `/proc/net/dev`, leaving out loopback and the
    /// container side of pod networking (the device prefixes cAdvisor ignores).
    pub fn network_interfaces(&self) -> Result<Vec<InterfaceStats>, StatsError> {
        const IGNORED_PREFIXES: [&str; 4] = ["lo", "veth", "docker", "nerdctl"];
        let path = self.root.join("net/dev");
        let text = read_to_string(&path)?;
        let mut interfaces = Vec::new();
        // Two header lines, then `name: rx_bytes packets errs drop fifo frame compressed
        // multicast tx_bytes packets errs ...`.
        for line in text.lines().skip(2) {
            let Some((name, counters)) = line.split_once(':') else {
                continue;
            };
            let name = name.trim();
            if IGNORED_PREFIXES
                .iter()
                .any(|prefix| name.starts_with(prefix))
            {
                continue;
            }
            let counters = counters
                .split_whitespace()
                .map(|value| parse_u64(value, &path))
                .collect::<Result<Vec<u64>, _>>()?;
            let &[
                rx_bytes,
                _,
                rx_errors,
                _,
                _,
                _,
                _,
                _,
                tx_bytes,
                _,
                tx_errors,
                ..,
            ] = &counters[..]
            else {
                return Err(StatsError::Parse {
                    path,
                    what: "at least eleven interface counters",
                    value: line.to_owned(),
                });
            };
            interfaces.push(InterfaceStats {
                name: name.to_owned(),
                rx_bytes: Some(rx_bytes),
                rx_errors: Some(rx_errors),
                tx_bytes: Some(tx_bytes),
                tx_errors: Some(tx_errors),
            });
        }
        Ok(interfaces)
    }

    /// `kernel.pid_max`.
    pub fn pid_max(&self) -> Result<i64, StatsError> {
        let path = self.root.join("sys/kernel/pid_max");
        let text = read_to_string(&path)?;
        parse_i64(text.trim(), &path)
    }

    /// Threads on the node now: the denominator of the fourth field of `/proc/loadavg`
    /// (`running/total`), which is cheaper than listing `/proc`.
    pub fn process_count(&self) -> Result<i64, StatsError> {
        let path = self.root.join("loadavg");
        let text = read_to_string(&path)?;
        let total = text
            .split_whitespace()
            .nth(3)
            .and_then(|field| field.split_once('/'))
            .map(|(_, total)| total)
            .ok_or_else(|| StatsError::Parse {
                path: path.clone(),
                what: "a running/total field",
                value: text.trim().to_owned(),
            })?;
        parse_i64(total, &path)
    }
}

fn parse_i64(value: &str, path: &Path) -> Result<i64, StatsError> {
    value.parse().map_err(|_| StatsError::Parse {
        path: path.to_owned(),
        what: "an integer",
        value: value.to_owned(),
    })
}

/// Node memory from `/proc/meminfo` and `/proc/vmstat`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct NodeMemory {
    /// Usage, working set inputs, faults; the limit is the node's memory.
    pub sample: MemorySample,
    /// `None` on a node without swap.
    pub swap: Option<SwapUsage>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SwapUsage {
    pub available: u64,
    pub usage: u64,
}

/// Size and inode counts of the filesystem holding a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FsUsage {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// `statvfs(2)` on `path`.
pub(crate) fn fs_usage(path: &Path) -> Result<FsUsage, StatsError> {
    let stat = rustix::fs::statvfs(path).map_err(|errno| StatsError::Statvfs {
        path: path.to_owned(),
        source: errno.into(),
    })?;
    let block = stat.f_frsize;
    let blocks = stat.f_blocks;
    Ok(FsUsage {
        capacity: blocks.saturating_mul(block),
        available: stat.f_bavail.saturating_mul(block),
        used: blocks.saturating_sub(stat.f_bfree).saturating_mul(block),
        inodes: stat.f_files,
        inodes_free: stat.f_ffree,
    })
}

/// Bytes (file lengths) and inodes under a directory tree, symlinks not followed. Entries that
/// vanish during the walk (log rotation) are skipped; a missing top directory is an error.
pub(super) fn dir_usage(path: &Path) -> Result<DirUsage, StatsError> {
    let metadata = std::fs::symlink_metadata(path).map_err(|source| StatsError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut usage = DirUsage {
        bytes: 0,
        inodes: 1,
    };
    if !metadata.is_dir() {
        usage.bytes = metadata.len();
        return Ok(usage);
    }
    let mut pending = vec![path.to_owned()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            usage.inodes += 1;
            if metadata.is_dir() {
                pending.push(entry.path());
            } else {
                usage.bytes = usage.bytes.saturating_add(metadata.len());
            }
        }
    }
    Ok(usage)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct DirUsage {
    pub bytes: u64,
    pub inodes: u64,
}

/// `USER_HZ`, the unit of `/proc/stat` times.
pub(super) fn clock_ticks() -> u64 {
    rustix::param::clock_ticks_per_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_in_both_spellings() {
        let parsed =
            parse_key_values("MemTotal:  2 kB\ntotal_rss 5\nbogus line here\nname value\n");
        assert_eq!(parsed.get("MemTotal"), Some(&2048));
        assert_eq!(parsed.get("total_rss"), Some(&5));
        assert_eq!(parsed.get("bogus"), None);
        assert_eq!(parsed.get("name"), None);
    }
}
