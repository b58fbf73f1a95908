//! PLEG health, mode and counters shared between the relister and its handles (the kubelet's
//! `GenericPLEG.Healthy`). Any successful relist, full or targeted, counts as activity; in ebpf mode
//! the safety relist guarantees one per relist period.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use super::PlegMode;
use crate::container::{PodUid, RunningPod};

pub(super) struct Shared {
    last_relist: Mutex<Option<Instant>>,
    last_full_relist: Mutex<Option<Instant>>,
    discarded_events: AtomicU64,
    mode: Mutex<PlegMode>,
    /// The live part (ready sandboxes, containers not exited) of every pod as last read.
    running: Mutex<HashMap<PodUid, RunningPod>>,
    /// The last panic of the PLEG loop, until a full relist completes after it.
    panic: Mutex<Option<String>>,
    panics: AtomicU64,
}

impl Shared {
    pub(super) fn new(mode: PlegMode) -> Self {
        Self {
            last_relist: Mutex::new(None),
            last_full_relist: Mutex::new(None),
            discarded_events: AtomicU64::new(0),
            mode: Mutex::new(mode),
            running: Mutex::default(),
            panic: Mutex::new(None),
            panics: AtomicU64::new(0),
        }
    }

    fn panic(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.panic.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The loop panicked with `message`: unhealthy until [`Shared::clear_panic`].
    pub(super) fn record_panic(&self, message: &str) {
        self.panics.fetch_add(1, Ordering::Relaxed);
        *self.panic() = Some(message.to_owned());
    }

    /// A full relist completed: the loop works again.
    pub(super) fn clear_panic(&self) {
        self.panic().take();
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, RunningPod>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records one pod as last read (`None`: gone).
    pub(super) fn set_running_pod(&self, uid: &PodUid, pod: Option<&RunningPod>) {
        match pod.map(live_part).filter(is_live) {
            Some(live) => self.running().insert(uid.clone(), live),
            None => self.running().remove(uid),
        };
    }

    /// Records every pod as a full relist read them.
    pub(super) fn set_running_pods<'a>(&self, pods: impl IntoIterator<Item = &'a RunningPod>) {
        let live = pods
            .into_iter()
            .map(live_part)
            .filter(is_live)
            .map(|pod| (pod.uid.clone(), pod))
            .collect();
        *self.running() = live;
    }

    pub(super) fn set_mode(&self, mode: PlegMode) {
        *self.mode.lock().unwrap_or_else(PoisonError::into_inner) = mode;
    }

    pub(super) fn record_full_relist(&self, at: Instant) {
        *self
            .last_full_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    /// When the last successful full relist started.
    pub(super) fn last_full_relist(&self) -> Option<Instant> {
        *self
            .last_full_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn record_relist(&self, at: Instant) {
        *self
            .last_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(at);
    }

    pub(super) fn count_discarded_event(&self) {
        self.discarded_events.fetch_add(1, Ordering::Relaxed);
    }
}

/// A cloneable view of the PLEG's health and mode, for the sync loop's runtime-health check and
/// `/healthz`.
#[derive(Clone)]
pub struct PlegHandle {
    shared: Arc<Shared>,
    threshold: Duration,
}

impl PlegHandle {
    pub(super) fn new(shared: Arc<Shared>, threshold: Duration) -> Self {
        Self { shared, threshold }
    }

    /// `Ok` when a relist succeeded within the threshold, otherwise why the PLEG is unhealthy.
    pub fn healthy(&self) -> Result<(), String> {
        if let Some(message) = self.shared.panic().as_ref() {
            return Err(format!(
                "pleg loop panicked and has not completed a relist since ({} panics since start): {message}",
                self.panics()
            ));
        }
        let Some(last) = self.last_relist() else {
            return Err("pleg has yet to be successful".to_owned());
        };
        let elapsed = last.elapsed();
        if elapsed > self.threshold {
            return Err(format!(
                "pleg was last seen active {} ago; threshold is {}",
                go_duration(elapsed),
                go_duration(self.threshold)
            ));
        }
        Ok(())
    }

    /// The mode the PLEG runs in now (ebpf mode falls back to relist when its hint source stops).
    pub fn mode(&self) -> PlegMode {
        *self
            .shared
            .mode
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// When the last successful relist (full or targeted) started.
    pub fn last_relist(&self) -> Option<Instant> {
        *self
            .shared
            .last_relist
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The pods with a ready sandbox or a container that has not exited, as the PLEG last read them
    /// (what `Runtime::get_pods(false)` would list, without asking the runtime), except those in
    /// `wanted`.
    pub fn running_pods_except(&self, wanted: &HashSet<PodUid>) -> Vec<RunningPod> {
        self.shared
            .running()
            .values()
            .filter(|pod| !wanted.contains(&pod.uid))
            .cloned()
            .collect()
    }

    /// The UIDs of the pods [`Self::running_pods_except`] lists from.
    pub fn running_pod_uids(&self) -> HashSet<PodUid> {
        self.shared.running().keys().cloned().collect()
    }

    /// How often the PLEG loop panicked (and was restarted) since the start.
    pub fn panics(&self) -> u64 {
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// Events dropped because the event channel was full (`kubelet_pleg_discard_events`).
    pub fn discarded_events(&self) -> u64 {
        self.shared.discarded_events.load(Ordering::Relaxed)
    }
}

fn live_part(pod: &RunningPod) -> RunningPod {
    let mut live = pod.clone();
    live.sandboxes
        .retain(|s| s.state == crate::container::SandboxState::Ready);
    live.containers
        .retain(|c| c.state != crate::container::ContainerState::Exited);
    live
}

fn is_live(pod: &RunningPod) -> bool {
    !pod.sandboxes.is_empty() || !pod.containers.is_empty()
}

/// Formats a duration the way Go's `time.Duration.String` does for durations of a second or more
/// (`3m5s`, `1h0m0.5s`), so the health message reads like the kubelet's.
fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let (hours, minutes, seconds) = (secs / 3600, secs / 60 % 60, secs % 60);
    let mut out = String::new();
    if hours > 0 {
        let _ = write!(out, "{hours}h");
    }
    if hours > 0 || minutes > 0 {
        let _ = write!(out, "{minutes}m");
    }
    let _ = write!(out, "{seconds}");
    let nanos = d.subsec_nanos();
    if nanos > 0 {
        let frac = format!("{nanos:09}");
        let _ = write!(out, ".{}", frac.trim_end_matches('0'));
    }
    out.push('s');
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn go_duration_matches_go_formatting() {
        assert_eq!(go_duration(Duration::from_mins(3)), "3m0s");
        assert_eq!(go_duration(Duration::from_secs(185)), "3m5s");
        assert_eq!(go_duration(Duration::from_millis(3_723_500)), "1h2m3.5s");
        assert_eq!(go_duration(Duration::from_secs(7)), "7s");
    }
}
