//! The decisions of one probe worker (the kubelet's `worker.doProbe`), apart from its timer and I/O
//! so each rule is testable on its own: which container to probe, when not to (initial delay,
//! startup gating, on hold after a liveness failure, the pod finished), and how consecutive results
//! become a verdict (`successThreshold`, `failureThreshold`).

use k8s_openapi::api::core::v1::{
    ContainerStatus as ApiContainerStatus, PodStatus as ApiPodStatus, Probe,
};
use k8s_openapi::jiff::Timestamp;

use super::ProbeType;
use super::results::{ProbeResult, ProbeResults};
use crate::container::{ContainerId, PodUid};
use crate::status::parse_api_container_id;

/// What the worker does this period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Probe container `id` at `pod_ip`.
    Probe { id: ContainerId, pod_ip: String },
    /// Nothing this period.
    Wait,
    /// The worker is done for good.
    Stop,
}

/// The probe settings a worker applies, with the API's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub initial_delay_seconds: i64,
    pub period_seconds: u64,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Thresholds {
    pub fn of(spec: &Probe) -> Self {
        let positive = |v: Option<i32>, default: u32| {
            v.and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .unwrap_or(default)
        };
        Self {
            initial_delay_seconds: i64::from(spec.initial_delay_seconds.unwrap_or(0)),
            period_seconds: u64::from(positive(spec.period_seconds, 10)),
            success_threshold: positive(spec.success_threshold, 1),
            failure_threshold: positive(spec.failure_threshold, 3),
        }
    }
}

/// One worker's memory between probes.
pub struct WorkerState {
    probe_type: ProbeType,
    pod: PodUid,
    container: String,
    thresholds: Thresholds,
    /// The pod was being deleted when the worker was created.
    deleting: bool,
    /// `restartPolicy: Never`: a container that exited stays exited.
    never_restarts: bool,
    results: ProbeResults,
    /// The container instance being probed.
    id: Option<ContainerId>,
    last: Option<ProbeResult>,
    run: u32,
    /// After a liveness or startup failure: no probing until a new container shows up.
    on_hold: bool,
}

impl WorkerState {
    pub fn new(
        probe_type: ProbeType,
        pod: PodUid,
        container: String,
        thresholds: Thresholds,
        deleting: bool,
        never_restarts: bool,
        results: ProbeResults,
    ) -> Self {
        Self {
            probe_type,
            pod,
            container,
            thresholds,
            deleting,
            never_restarts,
            results,
            id: None,
            last: None,
            run: 0,
            on_hold: false,
        }
    }

    /// The verdict a new container has until the probe says otherwise: not ready, alive, not yet
    /// started.
    fn initial(&self) -> ProbeResult {
        match self.probe_type {
            ProbeType::Readiness => ProbeResult::Failure,
            ProbeType::Liveness => ProbeResult::Success,
            ProbeType::Startup => ProbeResult::Unknown,
        }
    }

    /// The container instance the worker last saw.
    pub fn container_id(&self) -> Option<&ContainerId> {
        self.id.as_ref()
    }

    fn set(&self, result: ProbeResult) {
        if let Some(id) = &self.id {
            self.results.set(self.probe_type, id, result, &self.pod);
        }
    }

    /// Decides what to do given the pod's latest API status (`None` while the pod has none) at
    /// wall-clock time `now`.
    pub fn next(&mut self, status: Option<&ApiPodStatus>, now: Timestamp) -> Next {
        let Some(status) = status else {
            return Next::Wait;
        };
        if matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return Next::Stop;
        }
        let Some(container) = find(status, &self.container) else {
            return Next::Wait;
        };
        let Some(id) = container
            .container_id
            .as_deref()
            .and_then(parse_api_container_id)
            .filter(|id| !id.as_str().is_empty())
        else {
            return Next::Wait;
        };
        if self.id.as_ref() != Some(&id) {
            if let Some(old) = &self.id {
                self.results.remove(self.probe_type, old);
            }
            self.id = Some(id.clone());
            self.set(self.initial());
            self.on_hold = false;
        }
        if self.on_hold {
            return Next::Wait;
        }
        let state = container.state.as_ref();
        let Some(running) = state.and_then(|s| s.running.as_ref()) else {
            self.set(ProbeResult::Failure);
            let terminated = state.is_some_and(|s| s.terminated.is_some());
            return if terminated && self.never_restarts {
                Next::Stop
            } else {
                Next::Wait
            };
        };
        if self.deleting && self.probe_type != ProbeType::Readiness {
            // A pod being deleted is not restarted for a failing probe: end quietly.
            self.set(ProbeResult::Success);
            return Next::Stop;
        }
        let started_at = running.started_at.as_ref().map_or(now, |t| t.0);
        let since_start = now.as_second() - started_at.as_second();
        if since_start < self.thresholds.initial_delay_seconds {
            return Next::Wait;
        }
        let started = container.started == Some(true);
        // Startup runs until the container has started; the others only once it has.
        if started == (self.probe_type == ProbeType::Startup) {
            return Next::Wait;
        }
        Next::Probe {
            id,
            pod_ip: status.pod_ip.clone().unwrap_or_default(),
        }
    }

    /// Counts a probe's result; a run reaching its threshold becomes the container's verdict.
    pub fn record(&mut self, result: ProbeResult) {
        if self.last == Some(result) {
            self.run += 1;
        } else {
            self.last = Some(result);
            self.run = 1;
        }
        let below = match result {
            ProbeResult::Failure => self.run < self.thresholds.failure_threshold,
            ProbeResult::Success => self.run < self.thresholds.success_threshold,
            ProbeResult::Unknown => false,
        };
        if below {
            return;
        }
        self.set(result);
        if result == ProbeResult::Failure && self.probe_type != ProbeType::Readiness {
            // The container will be restarted: no probing until the new one runs.
            self.on_hold = true;
            self.run = 0;
        }
    }
}

fn find<'a>(status: &'a ApiPodStatus, name: &str) -> Option<&'a ApiContainerStatus> {
    let with_id = |statuses: &'a Option<Vec<ApiContainerStatus>>| {
        statuses
            .iter()
            .flatten()
            .find(|c| c.name == name && c.container_id.as_deref().is_some_and(|id| !id.is_empty()))
    };
    with_id(&status.container_statuses).or_else(|| with_id(&status.init_container_statuses))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStateTerminated,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::prober::results::ResultUpdates;

    const T0: i64 = 1_767_225_600;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(T0 + secs).unwrap()
    }

    fn thresholds(initial_delay: i64, success: u32, failure: u32) -> Thresholds {
        Thresholds {
            initial_delay_seconds: initial_delay,
            period_seconds: 1,
            success_threshold: success,
            failure_threshold: failure,
        }
    }

    fn worker(probe_type: ProbeType, t: Thresholds) -> (WorkerState, ProbeResults, ResultUpdates) {
        let (results, updates) = ProbeResults::new();
        let state = WorkerState::new(
            probe_type,
            PodUid::from("p1"),
            "app".into(),
            t,
            false,
            false,
            results.clone(),
        );
        (state, results, updates)
    }

    fn status(id: &str, running_since: Option<i64>, started: bool) -> ApiPodStatus {
        let state = match running_since {
            Some(since) => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(Time(at(since))),
                }),
                ..ContainerState::default()
            },
            None => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: 137,
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            },
        };
        ApiPodStatus {
            phase: Some("Running".into()),
            pod_ip: Some("10.88.0.7".into()),
            container_statuses: Some(vec![ApiContainerStatus {
                name: "app".into(),
                container_id: Some(format!("containerd://{id}")),
                state: Some(state),
                started: Some(started),
                ..ApiContainerStatus::default()
            }]),
            ..ApiPodStatus::default()
        }
    }

    fn probe_of(id: &str) -> Next {
        Next::Probe {
            id: ContainerId::from(id),
            pod_ip: "10.88.0.7".into(),
        }
    }

    fn verdict(results: &ProbeResults, t: ProbeType, id: &str) -> Option<ProbeResult> {
        results.get(t, &ContainerId::from(id))
    }

    #[test]
    fn a_new_container_gets_the_initial_verdict_of_its_probe_type() {
        for (t, initial) in [
            (ProbeType::Readiness, ProbeResult::Failure),
            (ProbeType::Liveness, ProbeResult::Success),
            (ProbeType::Startup, ProbeResult::Unknown),
        ] {
            let (mut w, results, _) = worker(t, thresholds(0, 1, 3));
            let started = t != ProbeType::Startup;
            assert_eq!(
                w.next(Some(&status("c1", Some(0), started)), at(0)),
                probe_of("c1")
            );
            assert_eq!(verdict(&results, t, "c1"), Some(initial), "{t}");
        }
    }

    #[test]
    fn nothing_is_probed_without_a_status_or_a_container_id() {
        let (mut w, _, _) = worker(ProbeType::Readiness, thresholds(0, 1, 3));
        assert_eq!(w.next(None, at(0)), Next::Wait);
        let mut no_id = status("c1", Some(0), true);
        no_id.container_statuses.as_mut().unwrap()[0].container_id = None;
        assert_eq!(w.next(Some(&no_id), at(0)), Next::Wait);
        let mut no_scheme = status("c1", Some(0), true);
        no_scheme.container_statuses.as_mut().unwrap()[0].container_id = Some("c1".into());
        assert_eq!(w.next(Some(&no_scheme), at(0)), Next::Wait);
    }

    #[test]
    fn the_container_is_found_whatever_runtime_named_it() {
        let (mut w, results, _) = worker(ProbeType::Readiness, thresholds(0, 1, 3));
        let mut s = status("c1", Some(0), true);
        s.container_statuses.as_mut().unwrap()[0].container_id = Some("cri-o://c1".into());
        assert_eq!(w.next(Some(&s), at(0)), probe_of("c1"));
        w.record(ProbeResult::Success);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Success),
            "the verdict is the runtime's container's"
        );
    }

    #[test]
    fn the_initial_delay_holds_probes_back() {
        let (mut w, _, _) = worker(ProbeType::Liveness, thresholds(5, 1, 3));
        let s = status("c1", Some(0), true);
        assert_eq!(w.next(Some(&s), at(4)), Next::Wait);
        assert_eq!(w.next(Some(&s), at(5)), probe_of("c1"));
    }

    #[test]
    fn startup_gates_liveness_and_readiness_and_stops_once_started() {
        let not_started = status("c1", Some(0), false);
        let started = status("c1", Some(0), true);
        for t in [ProbeType::Liveness, ProbeType::Readiness] {
            let (mut w, _, _) = worker(t, thresholds(0, 1, 3));
            assert_eq!(w.next(Some(&not_started), at(1)), Next::Wait, "{t}");
            assert_eq!(w.next(Some(&started), at(1)), probe_of("c1"), "{t}");
        }
        let (mut w, _, _) = worker(ProbeType::Startup, thresholds(0, 1, 3));
        assert_eq!(w.next(Some(&not_started), at(1)), probe_of("c1"));
        assert_eq!(w.next(Some(&started), at(1)), Next::Wait);
    }

    #[test]
    fn thresholds_turn_runs_into_verdicts() {
        let (mut w, results, _) = worker(ProbeType::Readiness, thresholds(0, 2, 3));
        w.next(Some(&status("c1", Some(0), true)), at(0));
        w.record(ProbeResult::Success);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Failure)
        );
        w.record(ProbeResult::Success);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Success)
        );
        w.record(ProbeResult::Failure);
        w.record(ProbeResult::Failure);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Success)
        );
        // A success in between starts the count again.
        w.record(ProbeResult::Success);
        w.record(ProbeResult::Failure);
        w.record(ProbeResult::Failure);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Success)
        );
        w.record(ProbeResult::Failure);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Failure)
        );
        // Readiness keeps probing after a failure.
        assert_eq!(
            w.next(Some(&status("c1", Some(0), true)), at(9)),
            probe_of("c1")
        );
    }

    #[test]
    fn a_liveness_failure_holds_the_worker_until_a_new_container_runs() {
        let (mut w, results, mut updates) = worker(ProbeType::Liveness, thresholds(0, 1, 2));
        let first = status("c1", Some(0), true);
        w.next(Some(&first), at(0));
        w.record(ProbeResult::Failure);
        w.record(ProbeResult::Failure);
        assert_eq!(
            verdict(&results, ProbeType::Liveness, "c1"),
            Some(ProbeResult::Failure)
        );
        assert_eq!(w.next(Some(&first), at(1)), Next::Wait);
        let sent: Vec<ProbeResult> = std::iter::from_fn(|| updates.try_recv().ok())
            .map(|u| u.result)
            .collect();
        assert_eq!(sent, [ProbeResult::Success, ProbeResult::Failure]);

        let second = status("c2", Some(5), true);
        assert_eq!(w.next(Some(&second), at(5)), probe_of("c2"));
        assert_eq!(
            verdict(&results, ProbeType::Liveness, "c1"),
            None,
            "old verdict dropped"
        );
        assert_eq!(
            verdict(&results, ProbeType::Liveness, "c2"),
            Some(ProbeResult::Success)
        );
        // The failure run starts over for the new container.
        w.record(ProbeResult::Failure);
        assert_eq!(
            verdict(&results, ProbeType::Liveness, "c2"),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn a_stopped_container_fails_and_ends_the_worker_only_when_it_stays_stopped() {
        let (mut w, results, _) = worker(ProbeType::Readiness, thresholds(0, 1, 3));
        let exited = status("c1", None, false);
        assert_eq!(w.next(Some(&exited), at(0)), Next::Wait);
        assert_eq!(
            verdict(&results, ProbeType::Readiness, "c1"),
            Some(ProbeResult::Failure)
        );

        let (results, _updates) = ProbeResults::new();
        let mut never = WorkerState::new(
            ProbeType::Readiness,
            PodUid::from("p1"),
            "app".into(),
            thresholds(0, 1, 3),
            false,
            true,
            results,
        );
        assert_eq!(never.next(Some(&exited), at(0)), Next::Stop);
    }

    #[test]
    fn a_finished_pod_ends_the_worker() {
        let (mut w, _, _) = worker(ProbeType::Readiness, thresholds(0, 1, 3));
        let mut done = status("c1", None, false);
        done.phase = Some("Succeeded".into());
        assert_eq!(w.next(Some(&done), at(0)), Next::Stop);
    }

    #[test]
    fn a_pod_being_deleted_ends_liveness_quietly() {
        let (results, _updates) = ProbeResults::new();
        let mut w = WorkerState::new(
            ProbeType::Liveness,
            PodUid::from("p1"),
            "app".into(),
            thresholds(0, 1, 3),
            true,
            false,
            results.clone(),
        );
        assert_eq!(
            w.next(Some(&status("c1", Some(0), true)), at(0)),
            Next::Stop
        );
        assert_eq!(
            verdict(&results, ProbeType::Liveness, "c1"),
            Some(ProbeResult::Success)
        );
    }

    #[test]
    fn defaults_are_the_apis() {
        assert_eq!(
            Thresholds::of(&Probe::default()),
            Thresholds {
                initial_delay_seconds: 0,
                period_seconds: 10,
                success_threshold: 1,
                failure_threshold: 3,
            }
        );
    }
}
