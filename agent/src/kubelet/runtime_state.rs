//! Runtime health as the sync loop and `/healthz` see it (the kubelet's `runtimeState` and
//! `updateRuntimeUp`): whether the runtime answered its last `Status` call and reported ready, whether
//! pod networking is ready, and when the sync loop last went round; and the runtime's name, which
//! its `Version` call gives once (the kubelet's `runtimeName`, the scheme of container ids).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

use crate::container::Runtime;

#[derive(Default)]
struct State {
    runtime_error: Option<String>,
    network_error: Option<String>,
    sync_loop_seen: Option<Instant>,
    /// When the runtime last reported itself ready (the kubelet's `lastBaseRuntimeSync`).
    last_runtime_sync: Option<Timestamp>,
    /// The runtime's name as its `Version` call reported it (`containerd`, `cri-o`).
    runtime_name: Option<Arc<str>>,
}

/// Cloneable handle to the runtime state.
#[derive(Clone, Default)]
pub struct RuntimeState {
    state: Arc<Mutex<State>>,
}

/// How often the runtime's `Status` is polled (the kubelet's 5 s).
pub const RUNTIME_UP_PERIOD: Duration = Duration::from_secs(5);

impl RuntimeState {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why pods cannot be synced now, if they cannot. Before the first `Status` answer the runtime
    /// counts as unavailable.
    pub fn runtime_error(&self) -> Option<String> {
        self.lock().runtime_error.clone()
    }

    /// Why pod networking is not ready, if it is not (host-network pods still start).
    pub fn network_error(&self) -> Option<String> {
        self.lock().network_error.clone()
    }

    /// The runtime's name, once its `Version` call answered.
    pub fn runtime_name(&self) -> Option<Arc<str>> {
        self.lock().runtime_name.clone()
    }

    /// What the node reports as its runtime's version when `Version` fails: `<name>://Unknown`
    /// (`Unknown` before the name is known).
    pub fn unknown_runtime_version(&self) -> String {
        self.runtime_name()
            .map_or_else(|| "Unknown".to_owned(), |name| format!("{name}://Unknown"))
    }

    /// When the runtime last answered `Status` with `RuntimeReady` true.
    pub fn last_runtime_sync(&self) -> Option<Timestamp> {
        self.lock().last_runtime_sync
    }

    pub fn mark_sync_loop_seen(&self) {
        self.lock().sync_loop_seen = Some(Instant::now());
    }

    /// The `/healthz` syncloop check: the loop went round within `threshold`.
    pub fn sync_loop_healthy(&self, threshold: Duration) -> Result<(), String> {
        match self.lock().sync_loop_seen {
            None => Err("sync loop has not started yet".to_owned()),
            Some(seen) if seen.elapsed() > threshold => Err(format!(
                "sync loop last went round {:.1}s ago; threshold is {:.0}s",
                seen.elapsed().as_secs_f64(),
                threshold.as_secs_f64()
            )),
            Some(_) => Ok(()),
        }
    }

    /// One `updateRuntimeUp` round: asks the runtime for its status and records the outcome; asks
    /// its name too until it is known, so pods synced once the runtime is up have it.
    pub async fn update_runtime_up(&self, runtime: &dyn Runtime) {
        if self.runtime_name().is_none() {
            self.learn_runtime_name(runtime).await;
        }
        let (runtime_error, network_error) = match runtime.status().await {
            Ok(status) => (status.runtime_not_ready(), status.network_not_ready()),
            Err(err) => {
                let message = format!("container runtime is down: {err}");
                (Some(message.clone()), Some(message))
            }
        };
        let mut state = self.lock();
        if runtime_error.is_none() {
            state.last_runtime_sync = Some(crate::status::wall_clock_now());
        }
        if state.runtime_error != runtime_error {
            if let Some(err) = &runtime_error {
                tracing::warn!("{err}");
            } else {
                tracing::info!("container runtime is ready");
            }
        }
        state.runtime_error = runtime_error;
        state.network_error = network_error;
    }

    async fn learn_runtime_name(&self, runtime: &dyn Runtime) {
        match runtime.version().await {
            Ok(version) => match crate::status::runtime_name_of(&version) {
                Some(name) => {
                    tracing::info!(runtime = name, %version, "container runtime");
                    self.lock().runtime_name = Some(name.into());
                }
                None => {
                    tracing::warn!(%version, "the container runtime's version names no runtime");
                }
            },
            // A runtime that does not answer is reported by the `Status` call next.
            Err(err) => tracing::debug!("cannot ask the container runtime its version: {err}"),
        }
    }

    /// Marks the runtime unavailable until the first `Status` answer.
    pub fn new_unknown() -> Self {
        let state = Self::default();
        let mut inner = state.lock();
        inner.runtime_error =
            Some("container runtime status check may not have completed yet".to_owned());
        inner.network_error = Some("network state unknown".to_owned());
        drop(inner);
        state
    }
}
