//! Which host process is each container's init: what lets the eBPF PLEG take a kernel-reported exit
//! as the container's death (ringlet's own; the kubelet trusts only the runtime). An identity is
//! proven, never guessed, in one of two ways: the runtime reported the container's pid (CRI verbose
//! `ContainerStatus`, read when the container is first seen running without a known init, e.g.
//! after an agent restart), or the kernel reported the first exec in the container's cgroup after
//! the agent's own `StartContainer` of it. A process started later inside the container (`kubectl
//! exec`, a shell) is neither, so its exit never counts as the container's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use super::ContainerId;

/// How long a start the agent began is remembered without the runtime listing the container.
const START_WINDOW_NS: u64 = 60_000_000_000;

/// How the agent knows a container's init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    /// The agent is starting the container: the first exec the kernel reports in its cgroup at or
    /// after this `CLOCK_MONOTONIC` time (ns) is its init.
    Starting { since_ns: u64 },
    /// The init's tgid in the initial pid namespace.
    Known(u32),
    /// The runtime was asked and did not say; not asked again.
    Unreported,
}

/// The registry, shared by the runtime manager (which starts containers) and the PLEG (which reads
/// kernel facts and the runtime). Cloneable; clones share the state.
#[derive(Clone, Debug, Default)]
pub struct InitProcesses {
    inits: Arc<Mutex<HashMap<ContainerId, Init>>>,
}

impl InitProcesses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Init>> {
        self.inits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The agent is about to call `StartContainer` for `id`; `now_ns` is `CLOCK_MONOTONIC` now.
    pub fn starting(&self, id: &ContainerId, now_ns: u64) {
        self.lock()
            .insert(id.clone(), Init::Starting { since_ns: now_ns });
    }

    /// The kernel reported the first exec in `id`'s cgroup by `tgid` at `kernel_time_ns`: it is the
    /// init when the agent started the container before that. Returns whether it was taken.
    pub fn first_exec(&self, id: &ContainerId, tgid: u32, kernel_time_ns: u64) -> bool {
        let mut inits = self.lock();
        match inits.get(id) {
            Some(Init::Starting { since_ns }) if kernel_time_ns >= *since_ns => {
                inits.insert(id.clone(), Init::Known(tgid));
                true
            }
            _ => false,
        }
    }

    /// The runtime reported `id`'s init pid (`None`: it did not say).
    pub fn reported(&self, id: &ContainerId, pid: Option<u32>) {
        let init = pid.filter(|p| *p > 0).map_or(Init::Unreported, Init::Known);
        self.lock().insert(id.clone(), init);
    }

    /// Whether the container's init is known or was asked for (nothing more to learn).
    pub fn settled(&self, id: &ContainerId) -> bool {
        matches!(self.lock().get(id), Some(Init::Known(_) | Init::Unreported))
    }

    /// Whether the process `tgid` is proven to be `id`'s init.
    pub fn is_init(&self, id: &ContainerId, tgid: u32) -> bool {
        self.lock().get(id) == Some(&Init::Known(tgid))
    }

    /// Forgets every container `keep` rejects (gone from the runtime), except one the agent began
    /// starting within a minute of `now_ns` (a listing may predate its creation).
    pub fn retain(&self, keep: impl Fn(&ContainerId) -> bool, now_ns: u64) {
        self.lock().retain(|id, init| {
            keep(id)
                || matches!(init, Init::Starting { since_ns }
                    if now_ns.saturating_sub(*since_ns) < START_WINDOW_NS)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_exec_after_the_agents_start_is_the_init() {
        let inits = InitProcesses::default();
        let id = ContainerId::from("c");
        assert!(
            !inits.first_exec(&id, 40, 100),
            "no start by the agent: an exec proves nothing"
        );
        inits.starting(&id, 200);
        assert!(
            !inits.first_exec(&id, 41, 150),
            "an exec before the start is not the container's"
        );
        assert!(inits.first_exec(&id, 42, 250));
        assert!(inits.is_init(&id, 42));
        assert!(
            !inits.first_exec(&id, 43, 300),
            "a later exec (kubectl exec) does not replace the init"
        );
        assert!(!inits.is_init(&id, 43));
        assert!(inits.settled(&id));
    }

    #[test]
    fn the_runtimes_pid_is_the_init_and_a_missing_one_proves_nothing() {
        let inits = InitProcesses::default();
        let known = ContainerId::from("a");
        let unreported = ContainerId::from("b");
        assert!(!inits.settled(&known));
        inits.reported(&known, Some(7));
        inits.reported(&unreported, None);
        assert!(inits.is_init(&known, 7));
        assert!(!inits.is_init(&known, 8));
        assert!(inits.settled(&unreported));
        assert!(!inits.is_init(&unreported, 0));
        let starting = ContainerId::from("s");
        let stale = ContainerId::from("t");
        inits.starting(&stale, 1_000);
        inits.starting(&starting, START_WINDOW_NS);
        inits.retain(|id| id == &known, START_WINDOW_NS + 2_000);
        assert!(!inits.settled(&unreported));
        assert!(inits.settled(&known));
        assert!(
            inits.first_exec(&starting, 9, START_WINDOW_NS + 1),
            "a recent start is kept"
        );
        assert!(
            !inits.first_exec(&stale, 9, START_WINDOW_NS + 1),
            "a stale one is not"
        );
    }
}
