//! What a failed watch of the API server says in a log line: the one description every watcher of
//! the agent (pods, secrets and config maps, services) uses, as client-go's reflector logs one.

use kube::runtime::watcher;

use super::ApiClient;
use crate::error_chain::error_chain;

impl ApiClient {
    /// `action` (e.g. `watch services`) and why the watch failed: the request's failure as
    /// [`describe`](Self::describe) words it, or the error the API server ended the watch with.
    pub fn describe_watch(&self, action: &str, err: &watcher::Error) -> String {
        match err {
            watcher::Error::InitialListFailed(err)
            | watcher::Error::WatchStartFailed(err)
            | watcher::Error::WatchFailed(err) => self.describe(action, err),
            watcher::Error::WatchError(status) => format!(
                "{action}: the API server ended the watch with {} {}: {}",
                status.code, status.reason, status.message
            ),
            other @ watcher::Error::NoResourceVersion => {
                format!("{action}: {}", error_chain(other))
            }
        }
    }
}
