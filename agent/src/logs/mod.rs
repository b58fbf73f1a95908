//! Container log rotation (the kubelet's `pkg/kubelet/logs`, its `ContainerLogManager`): every
//! `containerLogMonitorInterval` the node's running containers are listed and, at most
//! `containerLogMaxWorkers` at a time, each whose log file has reached `containerLogMaxSize` is
//! rotated ([`files::rotate`], on the blocking pool, keeping `containerLogMaxFiles` files) and the
//! runtime is asked through CRI `ReopenContainerLog` to write to a new file at the log path. When
//! the runtime refuses, the file is renamed back, so nothing is lost and the next round tries
//! again. Readers following a log (`kuberuntime::logs`) finish the renamed file and go on with the
//! new one.
//!
//! Unlike the kubelet, which rotates every running container of the runtime, only the containers
//! ringlet runs for this node are touched: several agents may share one runtime.

mod files;

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use jiff::Zoned;
use ringlet_proto::runtime::v1 as cri;
use tokio::time::MissedTickBehavior;

pub use files::FileError;

use crate::apis::config::ContainerLogSettings;
use crate::error_chain::error_chain;
use crate::kuberuntime::{CriClient, CriError, labels};

/// How a node's container logs are rotated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRotatePolicy {
    /// A live log file this many bytes or bigger is rotated.
    pub max_size: u64,
    /// Files kept per container log, the live one included (at least 2).
    pub max_files: usize,
    /// Containers whose logs are checked and rotated at the same time (at least 1).
    pub max_workers: usize,
    /// How often the logs are checked.
    pub monitor_interval: Duration,
}

impl LogRotatePolicy {
    /// The configured policy; `None` when rotation is off (a negative `containerLogMaxSize`).
    pub fn from_settings(settings: &ContainerLogSettings) -> Option<Self> {
        Some(Self {
            max_size: settings.max_size_bytes?,
            max_files: usize::try_from(settings.max_files).unwrap_or(usize::MAX),
            max_workers: usize::try_from(settings.max_workers)
                .unwrap_or(usize::MAX)
                .max(1),
            monitor_interval: settings.monitor_interval,
        })
    }
}

/// Why a round or one container's rotation failed.
#[derive(Debug, thiserror::Error)]
pub enum LogsError {
    #[error("listing the running containers")]
    List(#[source] CriError),
    #[error("reading the status of container {id}")]
    Status {
        id: String,
        #[source]
        source: CriError,
    },
    #[error("reading the size of {path}, the log of container {id}")]
    Size {
        id: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("asking the runtime to reopen {path}, the log of container {id}")]
    Reopen {
        id: String,
        path: PathBuf,
        #[source]
        source: CriError,
    },
    #[error("rotating the log of container {id}")]
    Files {
        id: String,
        #[source]
        source: FileError,
    },
    #[error("rotating the log of container {id}: the file task did not finish")]
    Task {
        id: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// The runtime calls log rotation makes (the part of the kubelet's `internalapi.RuntimeService`
/// its log manager uses).
#[async_trait]
pub trait LogRuntime: Send + Sync {
    /// The ids of the running containers ringlet runs for `node`.
    async fn running_containers(&self, node: &str) -> Result<Vec<String>, CriError>;
    /// The container's log file; empty when it has none.
    async fn log_path(&self, id: &str) -> Result<String, CriError>;
    /// Has the runtime write the container's output to a new file at its log path.
    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError>;
}

#[async_trait]
impl LogRuntime for CriClient {
    async fn running_containers(&self, node: &str) -> Result<Vec<String>, CriError> {
        let containers = self.list_containers(Some(running_filter(node))).await?;
        Ok(containers.into_iter().map(|c| c.id).collect())
    }

    async fn log_path(&self, id: &str) -> Result<String, CriError> {
        Ok(self.container_status(id).await?.log_path)
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        CriClient::reopen_container_log(self, id).await
    }
}

/// The running containers ringlet created for `node`.
fn running_filter(node: &str) -> cri::ContainerFilter {
    cri::ContainerFilter {
        state: Some(cri::ContainerStateValue {
            state: cri::ContainerState::ContainerRunning.into(),
        }),
        label_selector: HashMap::from([(labels::MANAGED.to_owned(), node.to_owned())]),
        ..cri::ContainerFilter::default()
    }
}

/// Rotates the logs of the containers ringlet runs for one node.
pub struct ContainerLogManager {
    runtime: Arc<dyn LogRuntime>,
    node: String,
    policy: LogRotatePolicy,
}

impl ContainerLogManager {
    pub fn new(
        runtime: Arc<dyn LogRuntime>,
        node: impl Into<String>,
        policy: LogRotatePolicy,
    ) -> Self {
        Self {
            runtime,
            node: node.into(),
            policy,
        }
    }

    /// Runs a round every monitor interval, for as long as the future is polled. A failed round
    /// or container is logged; the next round tries again.
    pub async fn run(self) {
        let policy = &self.policy;
        tracing::info!(
            max_size = policy.max_size,
            max_files = policy.max_files,
            workers = policy.max_workers,
            interval = ?policy.monitor_interval,
            "rotating container logs"
        );
        let mut ticker = tokio::time::interval(policy.monitor_interval);
        // A round slower than the interval delays the next one rather than starting a burst.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            if let Err(err) = self.rotate_logs().await {
                tracing::warn!("container log rotation: {}", error_chain(&err));
            }
        }
    }

    /// One round over the running containers; returns the names the rotated logs got. A
    /// container that cannot be rotated is logged and skipped.
    pub async fn rotate_logs(&self) -> Result<Vec<PathBuf>, LogsError> {
        let containers = self
            .runtime
            .running_containers(&self.node)
            .await
            .map_err(LogsError::List)?;
        let rotated = futures::stream::iter(containers)
            .map(|id| async move {
                self.rotate_container(&id).await.unwrap_or_else(|err| {
                    tracing::warn!(
                        container = id,
                        "container log rotation: {}",
                        error_chain(&err)
                    );
                    None
                })
            })
            .buffer_unordered(self.policy.max_workers)
            .filter_map(futures::future::ready)
            .collect()
            .await;
        Ok(rotated)
    }

    /// Rotates the container's log if it is big enough; returns the name it got.
    async fn rotate_container(&self, id: &str) -> Result<Option<PathBuf>, LogsError> {
        let log = self
            .runtime
            .log_path(id)
            .await
            .map_err(|source| LogsError::Status {
                id: id.to_owned(),
                source,
            })?;
        if log.is_empty() {
            return Ok(None);
        }
        let log = PathBuf::from(log);
        let size = match self.size(id, &log).await {
            Err(LogsError::Size { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
                // A rotation renamed it but the runtime never reopened it (the agent stopped in
                // between): the runtime still writes to the renamed file.
                self.reopen(id, &log).await?;
                self.size(id, &log).await?
            }
            size => size?,
        };
        if size < self.policy.max_size {
            return Ok(None);
        }
        let max_files = self.policy.max_files;
        let path = log.clone();
        let rotated = blocking(id, move || files::rotate(&path, max_files, &Zoned::now())).await?;
        if let Err(err) = self.reopen(id, &log).await {
            // The runtime still writes to the renamed file: give it its name back so the next
            // round tries again with nothing lost.
            let (from, to) = (rotated.clone(), log.clone());
            if let Err(rename) = blocking(id, move || files::rename(&from, &to)).await {
                tracing::error!(
                    container = id,
                    "the container keeps logging to a rotated file: {}",
                    error_chain(&rename)
                );
            }
            return Err(err);
        }
        tracing::debug!(container = id, rotated = %rotated.display(), size, "rotated a container log");
        Ok(Some(rotated))
    }

    async fn size(&self, id: &str, log: &Path) -> Result<u64, LogsError> {
        tokio::fs::metadata(log)
            .await
            .map(|meta| meta.len())
            .map_err(|source| LogsError::Size {
                id: id.to_owned(),
                path: log.to_owned(),
                source,
            })
    }

    async fn reopen(&self, id: &str, log: &Path) -> Result<(), LogsError> {
        self.runtime
            .reopen_container_log(id)
            .await
            .map_err(|source| LogsError::Reopen {
                id: id.to_owned(),
                path: log.to_owned(),
                source,
            })
    }
}

/// Runs file work on the blocking pool, off the agent's single-threaded core.
async fn blocking<T: Send + 'static>(
    id: &str,
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, LogsError> {
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(|source| LogsError::Files {
            id: id.to_owned(),
            source,
        }),
        Err(source) => Err(LogsError::Task {
            id: id.to_owned(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests;
