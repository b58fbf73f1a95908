//! The kernel's word that memory crossed a threshold (the kubelet's `memoryThresholdNotifier` and
//! `linuxCgroupNotifier` in `pkg/kubelet/eviction`): on cgroup v1, an eventfd registered through
//! the root memory cgroup's `cgroup.event_control` for a `memory.usage_in_bytes` threshold, so an
//! eviction round starts as soon as usage crosses it instead of at the next 10 s poll.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::event::{EventfdFlags, eventfd};
use tokio::io::unix::AsyncFd;

use super::EvictionError;
use super::observe::NodeMemory;
use super::signals::{Signal, Threshold};

/// One registered usage threshold; dropping it unregisters it (the kernel removes the
/// registration when the eventfd closes).
#[derive(Debug)]
pub struct ThresholdNotifier {
    events: AsyncFd<OwnedFd>,
    /// Kept open for the registration's lifetime, as the kernel expects.
    _usage: File,
}

/// The usage at which the working set reaches the threshold (the kubelet's `UpdateThreshold`):
/// capacity minus the threshold plus the current inactive file pages, since usage counts those
/// and the working set does not.
pub fn usage_threshold(threshold: &Threshold, memory: &NodeMemory) -> Option<u64> {
    if threshold.signal != Signal::MemoryAvailable {
        return None;
    }
    let observed = memory.observation();
    let quantity = u64::try_from(threshold.value.amount(observed.capacity)).ok()?;
    Some(
        memory
            .capacity
            .saturating_sub(quantity)
            .saturating_add(memory.inactive_file),
    )
}

fn io_error(path: &Path, source: io::Error) -> EvictionError {
    EvictionError::Io {
        path: path.to_owned(),
        source,
    }
}

impl ThresholdNotifier {
    /// Registers `usage_threshold` on the v1 memory cgroup at `cgroup_dir`.
    pub fn register(cgroup_dir: &Path, usage_threshold: u64) -> Result<Self, EvictionError> {
        let control: PathBuf = cgroup_dir.join("cgroup.event_control");
        let usage_path = cgroup_dir.join("memory.usage_in_bytes");
        let events = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|errno| io_error(&control, errno.into()))?;
        let usage = File::open(&usage_path).map_err(|e| io_error(&usage_path, e))?;
        OpenOptions::new()
            .write(true)
            .open(&control)
            .and_then(|mut file| {
                file.write_all(
                    format!(
                        "{} {} {usage_threshold}",
                        events.as_raw_fd(),
                        usage.as_raw_fd()
                    )
                    .as_bytes(),
                )
            })
            .map_err(|e| io_error(&control, e))?;
        let events = crate::sys::register_readable(events).map_err(|e| io_error(&control, e))?;
        Ok(Self {
            events,
            _usage: usage,
        })
    }

    /// Waits until usage crosses the threshold (either way, as the kernel reports it).
    pub async fn crossed(&self) -> io::Result<()> {
        loop {
            let mut ready = self.events.readable().await?;
            let mut counter = [0_u8; 8];
            match ready
                .try_io(|fd| rustix::io::read(fd.get_ref(), &mut counter).map_err(Into::into))
            {
                Ok(result) => return result.map(drop),
                Err(_would_block) => {}
            }
        }
    }
}
