//! Hints: what a hint source (the eBPF ring-buffer reader) tells the PLEG. A hint makes the PLEG
//! re-read one pod from the runtime (a targeted relist), or, for `Resync`, everything; only a `Died`
//! hint whose process is the container's proven init also writes the pod cache (the kernel knows
//! that death first). Corresponds to nothing in the kubelet: upstream's Evented PLEG wrote the cache
//! from every runtime event, which is what this design avoids.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::container::{ContainerId, PodUid};

/// What the kernel saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HintKind {
    /// A container (or sandbox) cgroup was created under the pods' parent cgroup.
    CgroupCreated,
    /// A container (or sandbox) cgroup was removed.
    CgroupRemoved,
    /// First exec in a container cgroup: the container's process started.
    Started,
    /// The container's init task exited.
    Died,
    /// The OOM killer chose a task of the container.
    OomKilled,
}

/// One fact about one pod, with the kernel's monotonic timestamp (`CLOCK_MONOTONIC`, ns) so the
/// PLEG can measure kernel → event and kernel → status latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodHint {
    pub pod: PodUid,
    pub kind: HintKind,
    /// The container (or sandbox) id when the cgroup path names it.
    pub container: Option<ContainerId>,
    /// The process (thread group) the kernel event is about, in the initial pid namespace; `None`
    /// for cgroup events.
    pub tgid: Option<u32>,
    /// For `Died`: the exit code (`status >> 8`) and the terminating signal (`status & 0x7f`).
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub kernel_time_ns: u64,
}

/// What a hint source sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hint {
    Pod(PodHint),
    /// Events may have been lost (ring-buffer reservations failed, or the reader fell behind): the
    /// PLEG must relist everything now.
    Resync {
        reason: String,
    },
    /// A pod worker needs the pod's status read after its own last sync (the cache only holds an
    /// older read, and in ebpf mode no relist may come for a minute): relist this one pod.
    Refresh {
        pod: PodUid,
    },
}

/// The PLEG's end of a hint source: the hints, a weak way back in through which pod workers ask
/// for [`Hint::Refresh`], and the way to ask the source to look for lost events. The weak sender
/// does not keep the channel open, so the PLEG still sees the hint source go away and falls back to
/// relisting.
pub struct HintChannel {
    pub hints: mpsc::Receiver<Hint>,
    pub refresh: mpsc::WeakSender<Hint>,
    pub check: HintSourceCheck,
}

/// Asks a hint source to check now whether it lost events (the eBPF reader then reads the kernel's
/// drop counter and sends [`Hint::Resync`] if it grew). The PLEG asks at the start of every full
/// relist: with the source's own wake-ups on events, that covers an idle source without a timer.
/// Cloneable; clones reach the same source.
#[derive(Clone, Debug)]
pub struct HintSourceCheck {
    /// The source's eventfd: every write wakes it.
    wake: Arc<OwnedFd>,
}

impl HintSourceCheck {
    /// Requests go to the source blocked on `eventfd` (non-blocking, so a request never waits).
    pub fn new(eventfd: Arc<OwnedFd>) -> Self {
        Self { wake: eventfd }
    }

    /// Wakes the source to check; never blocks.
    pub fn request(&self) {
        match rustix::io::write(&*self.wake, &1_u64.to_ne_bytes()) {
            // The counter is full only when requests are already pending, which ask the same.
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(error) => tracing::warn!(%error, "waking the hint source to check for lost events"),
        }
    }
}

impl HintChannel {
    /// A refresher for [`crate::container::PodCache::with_refresher`]: asks for a refresh without
    /// waiting (a full channel already means relists are coming).
    pub fn refresher(&self) -> impl Fn(&PodUid) + Send + Sync + 'static {
        let refresh = self.refresh.clone();
        move |pod: &PodUid| {
            if let Some(sender) = refresh.upgrade() {
                let _ = sender.try_send(Hint::Refresh { pod: pod.clone() });
            }
        }
    }
}
