//! Kernel-published container exits (ringlet's own; the kubelet waits for the runtime). When the
//! kernel reports that a container's proven init exited, the PLEG shows the container exited at
//! once; the record kept here overlays every later runtime read of the pod until the runtime reports
//! the exit itself (its record then replaces the kernel's) or, after [`KERNEL_EXIT_GRACE`], the
//! runtime still reports the container running and the overlay is withdrawn.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::{KERNEL_EXIT_GRACE, PodHint, monotonic_now_ns};
use crate::container::{ContainerId, ContainerState, ContainerStatus, PodStatus, PodUid};

/// How long an OOM-victim fact waits for its container's exit before it is forgotten.
const OOM_FACT_TTL: Duration = Duration::from_secs(10);

/// What the kernel said about one container's exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct KernelExit {
    pub(super) pod: PodUid,
    /// As runtimes report it: the exit code, or `128 + signal` for a signal.
    pub(super) exit_code: i32,
    /// Unix nanoseconds, from the kernel's timestamp.
    pub(super) finished_at: i64,
    pub(super) reason: &'static str,
    pub(super) kernel_time_ns: u64,
    published: Instant,
}

impl KernelExit {
    fn apply(&self, container: &mut ContainerStatus) {
        container.state = ContainerState::Exited;
        container.exit_code = self.exit_code;
        container.finished_at = self.finished_at;
        self.reason.clone_into(&mut container.reason);
        container.message.clear();
    }
}

/// How a runtime read settled an overlaid exit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Reconciled {
    /// The runtime reports the exit now; its record replaced the kernel's.
    Confirmed {
        container: ContainerId,
        kernel_exit_code: i32,
        runtime_exit_code: i32,
        kernel_time_ns: u64,
    },
    /// The runtime still reports the container running past the grace period.
    Withdrawn {
        container: ContainerId,
        waited: Duration,
    },
}

#[derive(Debug, Default)]
pub(super) struct KernelExits {
    exits: HashMap<ContainerId, KernelExit>,
    /// Containers the OOM killer chose, with when the kernel said so.
    oom_victims: HashMap<ContainerId, Instant>,
}

impl KernelExits {
    /// The OOM killer chose a task of `container`: its init's exit, if it follows, is `OOMKilled`.
    pub(super) fn oom_victim(&mut self, container: ContainerId, now: Instant) {
        self.oom_victims.insert(container, now);
    }

    /// Applies a proven init exit to the pod's cached `status` and keeps it as an overlay. Returns
    /// `false` (and keeps nothing) when the status does not show the container, or shows it exited
    /// already: then there is nothing the kernel knows better.
    pub(super) fn publish(&mut self, hint: &PodHint, status: &mut PodStatus, now: Instant) -> bool {
        let Some(id) = &hint.container else {
            return false;
        };
        let Some(container) = status
            .containers
            .iter_mut()
            .find(|c| &c.id == id && c.state != ContainerState::Exited)
        else {
            return false;
        };
        let exit_code = runtime_exit_code(hint);
        let reason = if self.oom_victims.remove(id).is_some() {
            "OOMKilled"
        } else if exit_code == 0 {
            "Completed"
        } else {
            "Error"
        };
        let exit = KernelExit {
            pod: hint.pod.clone(),
            exit_code,
            finished_at: wall_clock_ns(hint.kernel_time_ns),
            reason,
            kernel_time_ns: hint.kernel_time_ns,
            published: now,
        };
        exit.apply(container);
        self.exits.insert(id.clone(), exit);
        true
    }

    /// How many exits wait for the runtime to report them.
    pub(super) fn pending(&self) -> usize {
        self.exits.len()
    }

    /// Whether the kernel's exit of `container` is published and waits for the runtime's report.
    pub(super) fn overlays(&self, container: &ContainerId) -> bool {
        self.exits.contains_key(container)
    }

    /// Whether an overlay waits on a read of `pod`.
    pub(super) fn covers(&self, pod: &PodUid) -> bool {
        self.exits.values().any(|exit| &exit.pod == pod)
    }

    /// Shows the overlaid exits in a listing of the pod (a full relist's), unless the grace period
    /// ran out; the status read that follows settles them.
    pub(super) fn overlay_listing(&self, pod: &mut crate::container::RunningPod, now: Instant) {
        for container in &mut pod.containers {
            if container.state == ContainerState::Exited {
                continue;
            }
            if let Some(exit) = self.exits.get(&container.id)
                && now.saturating_duration_since(exit.published) < KERNEL_EXIT_GRACE
            {
                container.state = ContainerState::Exited;
            }
        }
    }

    /// Overlays a runtime read of a pod's status: an exit the runtime reports now (or a container
    /// it no longer has) ends its overlay; one it still reports running keeps the kernel's exit
    /// until the grace period runs out, then the overlay is withdrawn.
    pub(super) fn overlay(&mut self, status: &mut PodStatus, now: Instant) -> Vec<Reconciled> {
        let ids: Vec<ContainerId> = self
            .exits
            .iter()
            .filter(|(_, exit)| exit.pod == status.uid)
            .map(|(id, _)| id.clone())
            .collect();
        let mut settled = Vec::new();
        for id in ids {
            let Some(exit) = self.exits.get(&id) else {
                continue;
            };
            let Some(container) = status.containers.iter_mut().find(|c| c.id == id) else {
                self.exits.remove(&id);
                continue;
            };
            let waited = now.saturating_duration_since(exit.published);
            if container.state == ContainerState::Exited {
                settled.push(Reconciled::Confirmed {
                    container: id.clone(),
                    kernel_exit_code: exit.exit_code,
                    runtime_exit_code: container.exit_code,
                    kernel_time_ns: exit.kernel_time_ns,
                });
                self.exits.remove(&id);
            } else if waited >= KERNEL_EXIT_GRACE {
                settled.push(Reconciled::Withdrawn {
                    container: id.clone(),
                    waited,
                });
                self.exits.remove(&id);
            } else {
                exit.apply(container);
            }
        }
        settled
    }

    /// Forgets the exits of pods `keep` rejects (gone from the runtime).
    pub(super) fn retain_pods(&mut self, keep: impl Fn(&PodUid) -> bool) {
        self.exits.retain(|_, exit| keep(&exit.pod));
    }

    /// Forgets OOM facts no exit followed.
    pub(super) fn expire_oom_facts(&mut self, now: Instant) {
        self.oom_victims
            .retain(|_, at| now.saturating_duration_since(*at) < OOM_FACT_TTL);
    }
}

/// The exit code of a `Died` hint as runtimes report it: the code, or `128 + signal`.
pub(crate) fn runtime_exit_code(hint: &PodHint) -> i32 {
    match hint.signal {
        Some(signal) => 128 + signal,
        None => hint.exit_code.unwrap_or_default(),
    }
}

/// The wall-clock time (Unix ns) of a `CLOCK_MONOTONIC` kernel timestamp.
fn wall_clock_ns(kernel_time_ns: u64) -> i64 {
    let age = Duration::from_nanos(monotonic_now_ns().saturating_sub(kernel_time_ns));
    let at = SystemTime::now()
        .checked_sub(age)
        .unwrap_or(UNIX_EPOCH)
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(at.as_nanos()).unwrap_or(i64::MAX)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::pleg::HintKind;

    fn status(state: ContainerState) -> PodStatus {
        PodStatus {
            uid: PodUid::from("p"),
            containers: vec![ContainerStatus {
                started_at: 2,
                ..ContainerStatus::for_test("c", "app", state)
            }],
            ..PodStatus::default()
        }
    }

    fn died(exit_code: i32, signal: Option<i32>) -> PodHint {
        PodHint {
            pod: PodUid::from("p"),
            kind: HintKind::Died,
            container: Some(ContainerId::from("c")),
            tgid: Some(42),
            exit_code: Some(exit_code),
            signal,
            kernel_time_ns: monotonic_now_ns().saturating_sub(5_000_000),
        }
    }

    #[test]
    fn a_signal_exit_is_128_plus_signal_at_the_kernels_time() {
        let mut exits = KernelExits::default();
        let mut status = status(ContainerState::Running);
        let before = wall_clock_ns(monotonic_now_ns());
        assert!(exits.publish(&died(0, Some(9)), &mut status, Instant::now()));
        let container = &status.containers[0];
        assert_eq!(container.state, ContainerState::Exited);
        assert_eq!(container.exit_code, 137);
        assert_eq!(container.reason, "Error");
        assert!(
            container.finished_at < before && container.finished_at > before - 1_000_000_000,
            "finishedAt is the kernel's time, about 5 ms ago"
        );
        assert!(exits.covers(&PodUid::from("p")));
    }

    #[test]
    fn codes_and_oom_give_the_reason() {
        let mut exits = KernelExits::default();
        let mut completed = status(ContainerState::Running);
        exits.publish(&died(0, None), &mut completed, Instant::now());
        assert_eq!(completed.containers[0].reason, "Completed");
        let mut oom = status(ContainerState::Running);
        exits.oom_victim(ContainerId::from("c"), Instant::now());
        exits.publish(&died(0, Some(9)), &mut oom, Instant::now());
        assert_eq!(oom.containers[0].reason, "OOMKilled");
        let mut exited = status(ContainerState::Exited);
        assert!(
            !exits.publish(&died(1, None), &mut exited, Instant::now()),
            "an exit the runtime reported already is not overlaid"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_runtimes_exit_replaces_the_kernels() {
        let mut exits = KernelExits::default();
        let mut cached = status(ContainerState::Running);
        exits.publish(&died(0, Some(9)), &mut cached, Instant::now());

        let mut lagging = status(ContainerState::Running);
        assert!(exits.overlay(&mut lagging, Instant::now()).is_empty());
        assert_eq!(lagging.containers[0].state, ContainerState::Exited);
        assert_eq!(lagging.containers[0].exit_code, 137);

        let mut reported = status(ContainerState::Exited);
        reported.containers[0].exit_code = 1;
        let settled = exits.overlay(&mut reported, Instant::now());
        assert!(matches!(
            settled.as_slice(),
            [Reconciled::Confirmed {
                kernel_exit_code: 137,
                runtime_exit_code: 1,
                ..
            }]
        ));
        assert_eq!(reported.containers[0].exit_code, 1, "the runtime's record");
        assert!(!exits.covers(&PodUid::from("p")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_runtime_that_keeps_reporting_running_withdraws_the_overlay() {
        let mut exits = KernelExits::default();
        let mut cached = status(ContainerState::Running);
        let published = Instant::now();
        exits.publish(&died(0, Some(9)), &mut cached, published);

        let mut listing = status(ContainerState::Running).to_running_pod();
        exits.overlay_listing(&mut listing, published + Duration::from_secs(1));
        assert_eq!(listing.containers[0].state, ContainerState::Exited);

        let late = published + KERNEL_EXIT_GRACE;
        let mut listing = status(ContainerState::Running).to_running_pod();
        exits.overlay_listing(&mut listing, late);
        assert_eq!(listing.containers[0].state, ContainerState::Running);
        let mut read = status(ContainerState::Running);
        let settled = exits.overlay(&mut read, late);
        assert!(matches!(settled.as_slice(), [Reconciled::Withdrawn { .. }]));
        assert_eq!(read.containers[0].state, ContainerState::Running);
        assert!(!exits.covers(&PodUid::from("p")));
    }
}
