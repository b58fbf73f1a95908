//! Which host process is each container's (and sandbox's) init: what lets the eBPF PLEG take a
//! kernel-reported exit as the container's death, or as no death at all when another process exited
//! (ringlet's own; the kubelet trusts only the runtime). An identity is proven, never guessed: it is
//! the pid the runtime reports (CRI verbose `ContainerStatus` or `PodSandboxStatus`), read once when
//! the PLEG first sees the container running or the sandbox ready, whether the agent started it or
//! adopted it after a restart. A process started later inside the container (`kubectl exec`, a
//! shell) never has that pid.
//!
//! The first exec the kernel sees in a container's cgroup is no proof: measured here (containerd 1.6,
//! runc 1.1), a short-lived process sometimes execs in a new cgroup before the container's init does,
//! so taking it for the init published deaths of containers that kept running.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::container::ContainerId;

/// How the agent knows a container's init.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    /// The runtime is being asked.
    Asking,
    /// The init's tgid in the initial pid namespace.
    Known(u32),
    /// The runtime was asked and did not say; not asked again.
    Unreported,
}

/// The registry the PLEG keeps. Cloneable; clones share the state (the reads that fill it run
/// beside the PLEG).
#[derive(Clone, Debug, Default)]
pub(crate) struct InitProcesses {
    inits: Arc<Mutex<HashMap<ContainerId, Init>>>,
}

impl InitProcesses {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Init>> {
        self.inits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Of `ids`, the containers whose init nobody asked the runtime for yet; they count as being
    /// asked from now on.
    pub(crate) fn to_ask(&self, ids: impl IntoIterator<Item = ContainerId>) -> Vec<ContainerId> {
        let mut inits = self.lock();
        ids.into_iter()
            .filter(|id| {
                let new = !inits.contains_key(id);
                if new {
                    inits.insert(id.clone(), Init::Asking);
                }
                new
            })
            .collect()
    }

    /// The runtime reported `id`'s init pid (`None`: it did not say).
    pub(crate) fn reported(&self, id: &ContainerId, pid: Option<u32>) {
        let init = pid.filter(|p| *p > 0).map_or(Init::Unreported, Init::Known);
        self.lock().insert(id.clone(), init);
    }

    /// Asking the runtime about `id` failed: a later read asks again.
    pub(crate) fn ask_again(&self, id: &ContainerId) {
        self.lock().remove(id);
    }

    /// Whether the process `tgid` is proven to be `id`'s init.
    pub(crate) fn is_init(&self, id: &ContainerId, tgid: u32) -> bool {
        self.lock().get(id) == Some(&Init::Known(tgid))
    }

    /// Whether `id`'s init is known and is none of `tgids`: their exits did not stop `id`.
    pub(crate) fn is_none_of(&self, id: &ContainerId, tgids: &[u32]) -> bool {
        match self.lock().get(id) {
            Some(Init::Known(init)) => !tgids.is_empty() && !tgids.contains(init),
            _ => false,
        }
    }

    /// Forgets every container `keep` rejects (gone from the runtime).
    pub(crate) fn retain(&self, keep: impl Fn(&ContainerId) -> bool) {
        self.lock().retain(|id, _| keep(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_runtimes_pid_is_the_init() {
        let inits = InitProcesses::default();
        let known = ContainerId::from("a");
        let unreported = ContainerId::from("b");
        let failed = ContainerId::from("c");
        assert_eq!(
            inits.to_ask([known.clone(), unreported.clone(), failed.clone()]),
            vec![known.clone(), unreported.clone(), failed.clone()]
        );
        assert!(
            inits.to_ask([known.clone()]).is_empty(),
            "asked once, not again while the answer is pending"
        );
        assert!(!inits.is_init(&known, 7), "not known while asking");
        inits.reported(&known, Some(7));
        inits.reported(&unreported, None);
        inits.ask_again(&failed);
        assert!(inits.is_init(&known, 7));
        assert!(!inits.is_init(&known, 8));
        assert!(!inits.is_init(&unreported, 0));
        assert_eq!(
            inits.to_ask([known.clone(), unreported.clone(), failed.clone()]),
            vec![failed]
        );
        inits.retain(|id| id == &known);
        assert_eq!(inits.to_ask([unreported.clone()]), vec![unreported]);
        assert!(inits.is_init(&known, 7));
    }

    #[test]
    fn only_a_known_init_rules_exits_out() {
        let inits = InitProcesses::default();
        let known = ContainerId::from("a");
        let asking = ContainerId::from("b");
        inits.to_ask([known.clone(), asking.clone()]);
        inits.reported(&known, Some(7));
        assert!(inits.is_none_of(&known, &[5, 6]));
        assert!(
            !inits.is_none_of(&known, &[5, 7]),
            "one of them was the init"
        );
        assert!(!inits.is_none_of(&known, &[]), "exits of unnamed processes");
        assert!(
            !inits.is_none_of(&asking, &[5]),
            "the init is not known yet"
        );
        assert!(!inits.is_none_of(&ContainerId::from("never-seen"), &[5]));
    }
}
