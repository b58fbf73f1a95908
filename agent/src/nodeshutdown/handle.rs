//! The node shutdown manager's state as the rest of the agent sees it (the kubelet's
//! nodeshutdown `Manager` interface: `ShutdownStatus` for the node's Ready condition and `Admit`
//! for pod admission).

use std::sync::Arc;

use tokio::sync::watch;

use crate::lifecycle::Rejection;

/// The admission rejection's reason while the node shuts down (`NodeShutdownNotAdmittedReason`).
pub const NOT_ADMITTED_REASON: &str = "NodeShutdown";
const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// What the node's Ready condition says while the node shuts down.
const SHUTTING_DOWN: &str = "node is shutting down";

/// Cloneable view of whether the node is shutting down.
#[derive(Debug, Clone)]
pub struct NodeShutdownHandle {
    shutting_down: Arc<watch::Sender<bool>>,
}

impl Default for NodeShutdownHandle {
    fn default() -> Self {
        Self {
            shutting_down: Arc::new(watch::channel(false).0),
        }
    }
}

impl NodeShutdownHandle {
    /// Why the node is not ready, while it shuts down (the kubelet's `ShutdownStatus`).
    pub fn status(&self) -> Option<String> {
        self.is_shutting_down().then(|| SHUTTING_DOWN.to_owned())
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutting_down.borrow()
    }

    /// Wakes when the node starts shutting down or the shutdown is cancelled.
    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.shutting_down.subscribe()
    }

    /// The admit handler: every pod is refused while the node shuts down.
    pub fn admit(&self) -> Result<(), Rejection> {
        if self.is_shutting_down() {
            return Err(Rejection {
                reason: NOT_ADMITTED_REASON.to_owned(),
                message: NOT_ADMITTED_MESSAGE.to_owned(),
            });
        }
        Ok(())
    }

    pub(super) fn set_shutting_down(&self, shutting_down: bool) {
        self.shutting_down.send_replace(shutting_down);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_shutting_down_node_is_not_ready_and_refuses_every_pod_until_cancelled() {
        let handle = NodeShutdownHandle::default();
        let changes = handle.subscribe();
        assert_eq!(handle.status(), None);
        assert!(handle.admit().is_ok());
        handle.set_shutting_down(true);
        assert!(changes.has_changed().unwrap());
        assert_eq!(handle.status().as_deref(), Some("node is shutting down"));
        let refused = handle.admit().unwrap_err();
        assert_eq!(refused.reason, "NodeShutdown");
        assert_eq!(
            refused.message,
            "Pod was rejected as the node is shutting down."
        );
        handle.set_shutting_down(false);
        assert_eq!(handle.status(), None);
        assert!(handle.admit().is_ok());
    }
}
