//! The ring-buffer reader: takes kernel events off the BPF ring buffer, resolves their cgroup to a
//! pod and container, and sends PLEG hints; turns lost events (failed reservations in the kernel, a
//! full hint channel) into one `Hint::Resync`. Never blocks on the hint channel.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use aya::maps::{MapData, PerCpuArray, RingBuf};
use ringlet_ebpf::RawEvent;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc::{self, error::TrySendError};

use super::paths::{CgroupOwners, parse_cgroup_path};
use super::{Counters, read_drops};
use crate::pleg::{Hint, HintKind, PodHint};

/// How often the drop counter is read when no events arrive (after every batch too).
const DROP_POLL: Duration = Duration::from_millis(100);

/// The hint one kernel event means, or `None` when it concerns no pod cgroup (or, for cgroup
/// events, a cgroup that is not a container's own). Updates `owners` from mkdir/rmdir events.
pub fn decode(event: &RawEvent, owners: &mut CgroupOwners) -> Option<PodHint> {
    let (kind, owner) = match event.kind {
        ringlet_ebpf::EVENT_CGROUP_MKDIR => {
            let owner = parse_cgroup_path(event.path()?)?;
            owners.insert(event.cgroup_id, owner.clone());
            (HintKind::CgroupCreated, owner)
        }
        ringlet_ebpf::EVENT_CGROUP_RMDIR => {
            let owner = owners
                .remove(event.cgroup_id)
                .or_else(|| parse_cgroup_path(event.path()?))?;
            (HintKind::CgroupRemoved, owner)
        }
        ringlet_ebpf::EVENT_EXEC => (HintKind::Started, owners.resolve(event.cgroup_id)?),
        ringlet_ebpf::EVENT_EXIT => (HintKind::Died, owners.resolve(event.cgroup_id)?),
        ringlet_ebpf::EVENT_OOM_VICTIM => (HintKind::OomKilled, owners.resolve(event.cgroup_id)?),
        _ => return None,
    };
    if matches!(kind, HintKind::CgroupCreated | HintKind::CgroupRemoved)
        && !owner.is_container_cgroup
    {
        return None;
    }
    let (exit_code, signal) = if kind == HintKind::Died {
        let status = event.exit_status;
        let signal = i32::try_from(status & 0x7f).unwrap_or_default();
        (
            i32::try_from((status >> 8) & 0xff).ok(),
            (signal != 0).then_some(signal),
        )
    } else {
        (None, None)
    };
    Some(PodHint {
        pod: owner.pod,
        kind,
        container: owner.container,
        tgid: (event.tgid != 0).then_some(event.tgid),
        exit_code,
        signal,
        kernel_time_ns: event.ktime_ns,
    })
}

/// Why the reader stopped sending.
struct Closed;

pub(super) struct Reader {
    ring: AsyncFd<RingBuf<MapData>>,
    drops: Arc<PerCpuArray<MapData, u64>>,
    owners: CgroupOwners,
    hints: mpsc::Sender<Hint>,
    counters: Arc<Counters>,
    drops_seen: u64,
    /// A resync owed to the PLEG, with its reason, until the channel has room for it.
    resync: Option<String>,
}

impl Reader {
    pub(super) fn new(
        ring: AsyncFd<RingBuf<MapData>>,
        drops: Arc<PerCpuArray<MapData, u64>>,
        owners: CgroupOwners,
        hints: mpsc::Sender<Hint>,
        counters: Arc<Counters>,
    ) -> Self {
        let drops_seen = read_drops(&drops);
        Self {
            ring,
            drops,
            owners,
            hints,
            counters,
            drops_seen,
            resync: None,
        }
    }

    pub(super) async fn run(mut self) {
        let mut poll = tokio::time::interval(DROP_POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                ready = self.ring.readable_mut() => match ready {
                    Ok(mut guard) => {
                        let events = drain(guard.get_inner_mut());
                        guard.clear_ready();
                        if self.handle(&events).is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::error!(%error, "polling the BPF ring buffer; the eBPF hint source stops");
                        return;
                    }
                },
                _ = poll.tick() => {}
            }
            if self.check_drops().is_err() {
                return;
            }
        }
    }

    fn handle(&mut self, events: &[RawEvent]) -> Result<(), Closed> {
        self.counters
            .events_read
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        for event in events {
            if let Some(hint) = decode(event, &mut self.owners) {
                self.send(Hint::Pod(hint))?;
            } else {
                tracing::trace!(
                    kind = event.kind,
                    cgroup_id = event.cgroup_id,
                    "kernel event for no pod"
                );
            }
        }
        Ok(())
    }

    fn check_drops(&mut self) -> Result<(), Closed> {
        let drops = read_drops(&self.drops);
        if drops > self.drops_seen {
            let lost = drops - self.drops_seen;
            self.drops_seen = drops;
            tracing::warn!(
                lost,
                total = drops,
                "the BPF ring buffer was full: events lost, relisting everything"
            );
            self.owe_resync(format!(
                "{lost} kernel events lost: the BPF ring buffer was full"
            ));
        }
        self.flush_resync()
    }

    fn owe_resync(&mut self, reason: String) {
        self.resync.get_or_insert(reason);
    }

    /// Sends the owed resync if the channel has room.
    fn flush_resync(&mut self) -> Result<(), Closed> {
        let Some(reason) = self.resync.take() else {
            return Ok(());
        };
        match self.hints.try_send(Hint::Resync { reason }) {
            Ok(()) => {
                self.counters.resyncs.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(TrySendError::Full(Hint::Resync { reason })) => {
                self.resync = Some(reason);
                Ok(())
            }
            Err(TrySendError::Full(_)) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(Closed),
        }
    }

    /// Sends a hint without waiting: when the channel is full the hint is dropped and a resync is
    /// owed instead, which covers it.
    fn send(&mut self, hint: Hint) -> Result<(), Closed> {
        self.flush_resync()?;
        if self.resync.is_some() {
            self.counters.hints_lost.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        match self.hints.try_send(hint) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.counters.hints_lost.fetch_add(1, Ordering::Relaxed);
                self.owe_resync("the hint channel was full: hints lost".to_owned());
                Ok(())
            }
            Err(TrySendError::Closed(_)) => Err(Closed),
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>) -> Vec<RawEvent> {
    let mut events = Vec::new();
    while let Some(item) = ring.next() {
        if let Some(event) = RawEvent::from_bytes(&item) {
            events.push(event);
        } else {
            tracing::warn!(len = item.len(), "short record on the BPF ring buffer");
        }
    }
    events
}

/// An error and its causes on one line.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::{ContainerId, PodUid};
    use crate::ebpf::CgroupOwner;

    const UID: &str = "0b5c5e0e-8e1f-4d5c-9a3e-2f4b6c7d8e9f";
    const ID: &str = "4f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";

    fn event(kind: u32, cgroup_id: u64, path: &str, exit_status: u32) -> RawEvent {
        let mut raw = [0; ringlet_ebpf::PATH_LEN];
        raw[..path.len()].copy_from_slice(path.as_bytes());
        RawEvent {
            kind,
            tgid: 10,
            cgroup_id,
            ktime_ns: 77,
            pid: 10,
            exit_status,
            path: raw,
        }
    }

    fn owners() -> CgroupOwners {
        // An empty directory: rescans find nothing.
        CgroupOwners::new(std::env::temp_dir().join("ringlet-no-such-cgroup"))
    }

    fn hint(kind: HintKind) -> PodHint {
        PodHint {
            pod: PodUid::new(UID),
            kind,
            container: Some(ContainerId::new(ID)),
            tgid: Some(10),
            exit_code: None,
            signal: None,
            kernel_time_ns: 77,
        }
    }

    #[test]
    fn a_container_lifecycle_decodes_into_hints() {
        let mut owners = owners();
        let path = format!("/kubepods/besteffort/pod{UID}/{ID}");
        assert_eq!(
            decode(
                &event(ringlet_ebpf::EVENT_CGROUP_MKDIR, 5, &path, 0),
                &mut owners
            ),
            Some(hint(HintKind::CgroupCreated))
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXEC, 5, "", 0), &mut owners),
            Some(hint(HintKind::Started))
        );
        assert_eq!(
            decode(
                &event(ringlet_ebpf::EVENT_OOM_VICTIM, 5, "", 0),
                &mut owners
            ),
            Some(hint(HintKind::OomKilled))
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXIT, 5, "", 3 << 8), &mut owners),
            Some(PodHint {
                exit_code: Some(3),
                ..hint(HintKind::Died)
            })
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXIT, 5, "", 9), &mut owners),
            Some(PodHint {
                exit_code: Some(0),
                signal: Some(9),
                ..hint(HintKind::Died)
            })
        );
        assert_eq!(
            decode(
                &event(ringlet_ebpf::EVENT_CGROUP_RMDIR, 5, &path, 0),
                &mut owners
            ),
            Some(hint(HintKind::CgroupRemoved))
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXEC, 5, "", 0), &mut owners),
            None,
            "removed from the map"
        );
    }

    #[test]
    fn events_for_no_container_give_no_hint() {
        let mut owners = owners();
        assert_eq!(
            decode(
                &event(
                    ringlet_ebpf::EVENT_CGROUP_MKDIR,
                    1,
                    &format!("/kubepods/pod{UID}"),
                    0
                ),
                &mut owners
            ),
            None
        );
        assert_eq!(
            decode(
                &event(
                    ringlet_ebpf::EVENT_CGROUP_MKDIR,
                    2,
                    "/kubepods/besteffort",
                    0
                ),
                &mut owners
            ),
            None
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXEC, 3, "", 0), &mut owners),
            None
        );
        assert_eq!(decode(&event(99, 3, "", 0), &mut owners), None);
        // The pod cgroup is still known, so a task in it resolves (to the pod, no container).
        owners.insert(
            4,
            CgroupOwner {
                pod: PodUid::new(UID),
                container: None,
                is_container_cgroup: false,
            },
        );
        assert_eq!(
            decode(&event(ringlet_ebpf::EVENT_EXEC, 4, "", 0), &mut owners).map(|h| h.container),
            Some(None)
        );
    }
}
