//! The ring-buffer reader: takes kernel events off the BPF ring buffer, resolves their cgroup to a
//! pod and container, and sends PLEG hints; turns lost events (failed reservations in the kernel, a
//! full hint channel) into one `Hint::Resync`. Never blocks on the hint channel.
//!
//! It runs on its own thread (`ringlet-ebpf-reader`), blocked in `poll(2)` on the ring buffer and an
//! eventfd, so no task on the agent's runtimes can delay it and an idle reader costs nothing: it
//! wakes when the kernel writes events, when the PLEG asks it to check for lost events (at every
//! full relist), when the hint channel has room for a resync it owes, and to stop. It reads the
//! kernel's drop counter on every wake-up. The cgroup map's tree walks (the first scan, rescans
//! for unknown ids, prunes) run here too, never on the agent's async core.

use std::future::Future;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aya::maps::{MapData, PerCpuArray, RingBuf};
use ringlet_ebpf::RawEvent;
use rustix::event::{PollFd, PollFlags, poll};
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::mpsc::{self, OwnedPermit};

use super::paths::{CgroupOwners, parse_cgroup_path};
use super::{Counters, read_drops};
use crate::pleg::{Hint, HintKind, HintSourceCheck, PodHint};

/// The reader thread's name (`comm` shows its first 15 bytes, `ringlet-ebpf-re`).
const THREAD_NAME: &str = "ringlet-ebpf-reader";

/// How often at most the cgroup map is pruned of cgroups that are gone. An idle reader is woken at
/// every full relist (the safety relist, 60 s by default), so that is how often an idle node could
/// prune; it walks the cgroups only when events were lost since (a prune's only work).
const PRUNE_INTERVAL: Duration = Duration::from_mins(1);

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

/// What the reader works with.
pub(super) struct Reader {
    pub(super) ring: RingBuf<MapData>,
    pub(super) drops: Arc<PerCpuArray<MapData, u64>>,
    /// Gets the kernel's drop counter (summed over CPUs) each time the reader reads it.
    pub(super) on_drops: Box<dyn FnMut(u64) + Send>,
    pub(super) owners: CgroupOwners,
    pub(super) hints: mpsc::Sender<Hint>,
    pub(super) counters: Arc<Counters>,
}

/// The running reader thread. Dropping it stops the thread and waits for it, so the ring buffer
/// and the hint sender are released when the drop returns.
pub(super) struct ReaderThread {
    wake: HintSourceCheck,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ReaderThread {
    /// Starts `reader` on its own thread, woken through `eventfd` (non-blocking).
    pub(super) fn spawn(reader: Reader, eventfd: OwnedFd) -> io::Result<Self> {
        let eventfd = Arc::new(eventfd);
        let wake = HintSourceCheck::new(Arc::clone(&eventfd));
        let stop = Arc::new(AtomicBool::new(false));
        let running = Running::new(reader, eventfd, Arc::clone(&stop), wake.clone());
        let thread = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || running.run())?;
        Ok(Self {
            wake,
            stop,
            thread: Some(thread),
        })
    }

    /// Asks the reader to read the drop counter now.
    pub(super) fn check(&self) -> HintSourceCheck {
        self.wake.clone()
    }
}

impl Drop for ReaderThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Any wake-up makes the thread look at the stop flag.
        self.wake.request();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("the eBPF ring-buffer reader thread panicked");
        }
    }
}

/// The hint channel's room for a resync the reader owes.
type Room = Pin<Box<dyn Future<Output = Result<OwnedPermit<Hint>, SendError<()>>> + Send>>;

/// A resync owed to the PLEG until the channel has room for it.
struct OwedResync {
    reason: String,
    room: Room,
}

/// Wakes the reader thread when the hint channel has room for an owed resync, so the reader need
/// not poll for it.
struct RoomWaker(HintSourceCheck);

impl Wake for RoomWaker {
    fn wake(self: Arc<Self>) {
        self.0.request();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.request();
    }
}

/// The reader on its thread.
struct Running {
    reader: Reader,
    eventfd: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    room_waker: Waker,
    drops_seen: u64,
    /// The drop count at the last prune: the cgroup map needs one only after a loss.
    drops_at_last_prune: u64,
    resync: Option<OwedResync>,
    last_prune: Instant,
}

impl Running {
    fn new(
        reader: Reader,
        eventfd: Arc<OwnedFd>,
        stop: Arc<AtomicBool>,
        wake: HintSourceCheck,
    ) -> Self {
        let drops_seen = read_drops(&reader.drops);
        Self {
            reader,
            eventfd,
            stop,
            room_waker: Waker::from(Arc::new(RoomWaker(wake))),
            drops_seen,
            drops_at_last_prune: drops_seen,
            resync: None,
            last_prune: Instant::now(),
        }
    }

    fn run(mut self) {
        // Events that come meanwhile wait in the ring buffer; ids they name resolve by rescans.
        self.reader.owners.scan();
        loop {
            if let Err(error) = self.wait() {
                tracing::error!(%error, "polling the BPF ring buffer; the eBPF hint source stops");
                return;
            }
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let events = drain(&mut self.reader.ring);
            // Closed: the PLEG is gone, nobody needs hints any more.
            if self.handle(&events).is_err() || self.check_drops().is_err() {
                return;
            }
            self.prune_if_due();
        }
    }

    /// Blocks until the ring buffer has events or the eventfd was written (and resets it).
    fn wait(&mut self) -> io::Result<()> {
        let mut fds = [
            PollFd::new(&self.reader.ring, PollFlags::IN),
            PollFd::new(&*self.eventfd, PollFlags::IN),
        ];
        loop {
            match poll(&mut fds, None) {
                Ok(_) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(error) => return Err(error.into()),
            }
        }
        if fds[1].revents().contains(PollFlags::IN) {
            match rustix::io::read(&*self.eventfd, &mut [0; 8]) {
                Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }

    fn handle(&mut self, events: &[RawEvent]) -> Result<(), Closed> {
        self.reader
            .counters
            .events_read
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        for event in events {
            if let Some(hint) = decode(event, &mut self.reader.owners) {
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

    fn prune_if_due(&mut self) {
        if self.last_prune.elapsed() < PRUNE_INTERVAL {
            return;
        }
        self.last_prune = Instant::now();
        let events_lost = self.drops_seen != self.drops_at_last_prune;
        self.drops_at_last_prune = self.drops_seen;
        let forgotten = self.reader.owners.prune_after_losses(events_lost);
        if forgotten > 0 {
            tracing::debug!(
                forgotten,
                known = self.reader.owners.len(),
                "forgot cgroups that are gone from the cgroup map"
            );
        }
    }

    fn check_drops(&mut self) -> Result<(), Closed> {
        let drops = read_drops(&self.reader.drops);
        (self.reader.on_drops)(drops);
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
        if self.resync.is_none() {
            let sender = self.reader.hints.clone();
            self.resync = Some(OwedResync {
                reason,
                room: Box::pin(sender.reserve_owned()),
            });
        }
    }

    /// Sends the owed resync if the channel has room; otherwise the room waker wakes the thread
    /// once it has.
    fn flush_resync(&mut self) -> Result<(), Closed> {
        let Some(owed) = self.resync.as_mut() else {
            return Ok(());
        };
        match owed
            .room
            .as_mut()
            .poll(&mut Context::from_waker(&self.room_waker))
        {
            Poll::Pending => Ok(()),
            Poll::Ready(Err(SendError(()))) => Err(Closed),
            Poll::Ready(Ok(permit)) => {
                let reason = std::mem::take(&mut owed.reason);
                self.resync = None;
                // Counted first: whoever receives the resync may look at the counter at once.
                self.reader.counters.resyncs.fetch_add(1, Ordering::Relaxed);
                permit.send(Hint::Resync { reason });
                Ok(())
            }
        }
    }

    /// Sends a hint without waiting: when the channel is full the hint is dropped and a resync is
    /// owed instead, which covers it.
    fn send(&mut self, hint: Hint) -> Result<(), Closed> {
        self.flush_resync()?;
        if self.resync.is_some() {
            self.reader
                .counters
                .hints_lost
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        match self.reader.hints.try_send(hint) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.reader
                    .counters
                    .hints_lost
                    .fetch_add(1, Ordering::Relaxed);
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

    /// Issue 14 §3: no record off the ring buffer panics the decoder, whatever its bytes. A fixed
    /// number of cases, so it runs in every `cargo test`.
    mod properties {
        use proptest::prelude::*;

        use super::*;

        /// Path components the decoder gives meaning to, mixed with arbitrary text.
        fn component() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("kubepods".to_owned()),
                Just("kubepods.slice".to_owned()),
                Just("besteffort".to_owned()),
                Just(format!("pod{UID}")),
                Just(format!(
                    "kubepods-besteffort-pod{}.slice",
                    UID.replace('-', "_")
                )),
                Just(ID.to_owned()),
                Just(format!("cri-containerd-{ID}.scope")),
                Just("-pod.slice".to_owned()),
                Just(".scope".to_owned()),
                "pod[0-9a-f_-]{0,70}",
                "[0-9a-f]{0,130}(\\.scope)?",
                "\\PC{0,24}",
            ]
        }

        fn path() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                prop::collection::vec(component(), 0..8).prop_map(|c| c.join("/").into_bytes()),
                prop::collection::vec(any::<u8>(), 0..ringlet_ebpf::PATH_LEN + 8),
            ]
        }

        fn raw_event() -> impl Strategy<Value = RawEvent> {
            (
                prop_oneof![1_u32..=5, any::<u32>()],
                any::<u32>(),
                // Few ids, so mkdir, exec, exit and rmdir of one cgroup meet.
                prop_oneof![0_u64..6, any::<u64>()],
                any::<u64>(),
                any::<u32>(),
                path(),
            )
                .prop_map(|(kind, tgid, cgroup_id, ktime_ns, exit_status, path)| {
                    let mut raw = [0; ringlet_ebpf::PATH_LEN];
                    let len = path.len().min(raw.len());
                    raw[..len].copy_from_slice(&path[..len]);
                    RawEvent {
                        kind,
                        tgid,
                        cgroup_id,
                        ktime_ns,
                        pid: tgid,
                        exit_status,
                        path: raw,
                    }
                })
        }

        fn config() -> ProptestConfig {
            ProptestConfig {
                cases: 512,
                // A finding becomes a named regression test next to these, not a file.
                failure_persistence: None,
                ..ProptestConfig::default()
            }
        }

        proptest! {
            #![proptest_config(config())]

            #[test]
            fn no_bytes_panic_the_record_reader_or_the_decoder(
                bytes in prop::collection::vec(any::<u8>(), 0..RawEvent::SIZE * 2),
            ) {
                let mut owners = owners();
                match RawEvent::from_bytes(&bytes) {
                    Some(event) => {
                        prop_assert!(bytes.len() >= RawEvent::SIZE);
                        let _ = decode(&event, &mut owners);
                    }
                    None => prop_assert!(bytes.len() < RawEvent::SIZE),
                }
            }

            #[test]
            fn no_sequence_of_events_panics_the_decoder(
                events in prop::collection::vec(raw_event(), 1..24),
            ) {
                let mut owners = owners();
                for event in &events {
                    if let Some(hint) = decode(event, &mut owners) {
                        // What comes out is what the PLEG relies on.
                        prop_assert!(hint.exit_code.is_none_or(|c| (0..=255).contains(&c)));
                        prop_assert!(hint.signal.is_none_or(|s| (1..=127).contains(&s)));
                        prop_assert_eq!(hint.tgid.is_some(), event.tgid != 0);
                        prop_assert_eq!(hint.kernel_time_ns, event.ktime_ns);
                    }
                }
            }
        }
    }
}
