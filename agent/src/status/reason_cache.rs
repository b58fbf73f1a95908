//! The last start failure of every container (the kubelet's `ReasonCache`), so a container that could
//! not be started shows the failure (`CrashLoopBackOff`, `ErrImageNeverPull`, …) as its waiting
//! reason until a later start succeeds.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::container::{PodSyncResult, PodUid, SyncAction, SyncFailure};

/// Start failures by pod UID and container name; safe to share between tasks.
#[derive(Default)]
pub struct ReasonCache {
    pods: Mutex<HashMap<PodUid, HashMap<String, SyncFailure>>>,
}

impl ReasonCache {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PodUid, HashMap<String, SyncFailure>>> {
        self.pods.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the container-start outcomes of one sync: a failed start replaces the container's
    /// entry, a successful one clears it. Other steps (sandbox, kill) do not touch the cache.
    pub fn update(&self, uid: &PodUid, result: &PodSyncResult) {
        let mut pods = self.lock();
        for step in &result.results {
            if !matches!(
                step.action,
                SyncAction::StartContainer | SyncAction::InitContainer
            ) {
                continue;
            }
            match &step.failure {
                Some(failure) => {
                    pods.entry(uid.clone())
                        .or_default()
                        .insert(step.target.clone(), failure.clone());
                }
                None => {
                    if let Some(containers) = pods.get_mut(uid) {
                        containers.remove(&step.target);
                        if containers.is_empty() {
                            pods.remove(uid);
                        }
                    }
                }
            }
        }
    }

    /// The last start failure of the container, if it has not been started successfully since.
    pub fn get(&self, uid: &PodUid, name: &str) -> Option<SyncFailure> {
        self.lock().get(uid).and_then(|c| c.get(name)).cloned()
    }

    /// Forgets a pod (when it is removed).
    pub fn remove(&self, uid: &PodUid) {
        self.lock().remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::container::SyncResult;

    fn step(action: SyncAction, target: &str, reason: Option<&str>) -> SyncResult {
        SyncResult {
            action,
            target: target.to_owned(),
            failure: reason.map(|r| SyncFailure {
                reason: r.to_owned(),
                message: format!("{r} message"),
            }),
        }
    }

    #[test]
    fn failures_are_kept_until_a_successful_start() {
        let cache = ReasonCache::new();
        let uid = PodUid::from("p");
        cache.update(
            &uid,
            &PodSyncResult {
                results: vec![
                    step(
                        SyncAction::CreatePodSandbox,
                        "sb",
                        Some("CreatePodSandboxError"),
                    ),
                    step(SyncAction::StartContainer, "app", Some("CrashLoopBackOff")),
                    step(
                        SyncAction::StartContainer,
                        "side",
                        Some("ErrImageNeverPull"),
                    ),
                ],
            },
        );
        assert_eq!(
            cache.get(&uid, "app").map(|f| f.reason),
            Some("CrashLoopBackOff".to_owned())
        );
        assert_eq!(
            cache.get(&uid, "sb"),
            None,
            "only container starts are cached"
        );

        cache.update(
            &uid,
            &PodSyncResult {
                results: vec![
                    step(SyncAction::StartContainer, "app", None),
                    step(SyncAction::KillContainer, "side", None),
                ],
            },
        );
        assert_eq!(cache.get(&uid, "app"), None);
        assert_eq!(
            cache.get(&uid, "side").map(|f| f.message),
            Some("ErrImageNeverPull message".to_owned()),
            "a kill does not clear a start failure"
        );

        cache.remove(&uid);
        assert_eq!(cache.get(&uid, "side"), None);
    }
}
