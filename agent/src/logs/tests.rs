#![allow(clippy::unwrap_used)]

use std::fs;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Semaphore;

use super::*;

const NODE: &str = "node-a";

/// A runtime whose running containers log to files in a temporary directory; it reopens a log
/// as containerd does, by creating the file at the log path.
#[derive(Default)]
struct FakeRuntime {
    /// Running containers and their log paths.
    logs: Vec<(String, PathBuf)>,
    /// Reopening fails, as it does for a container that stopped meanwhile.
    refuse_reopen: bool,
    reopened: Mutex<Vec<String>>,
    /// When set, `log_path` waits for a permit (the test hands them out) and counts the calls
    /// waiting.
    gate: Option<Semaphore>,
    in_flight: AtomicUsize,
}

impl FakeRuntime {
    fn path(&self, id: &str) -> &Path {
        &self.logs.iter().find(|(known, _)| known == id).unwrap().1
    }

    fn reopened(&self) -> Vec<String> {
        let mut ids = self.reopened.lock().unwrap().clone();
        ids.sort();
        ids
    }
}

#[async_trait]
impl LogRuntime for FakeRuntime {
    async fn running_containers(&self, node: &str) -> Result<Vec<String>, CriError> {
        assert_eq!(node, NODE);
        Ok(self.logs.iter().map(|(id, _)| id.clone()).collect())
    }

    async fn log_path(&self, id: &str) -> Result<String, CriError> {
        if let Some(gate) = &self.gate {
            self.in_flight.fetch_add(1, Ordering::SeqCst);
            gate.acquire().await.unwrap().forget();
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(self.path(id).display().to_string())
    }

    async fn reopen_container_log(&self, id: &str) -> Result<(), CriError> {
        self.reopened.lock().unwrap().push(id.to_owned());
        if self.refuse_reopen {
            return Err(CriError::Call {
                call: "ReopenContainerLog",
                code: tonic::Code::Unknown,
                message: "container is not in running state".to_owned(),
            });
        }
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.path(id))
            .unwrap();
        Ok(())
    }
}

fn policy(max_size: u64, max_workers: usize) -> LogRotatePolicy {
    LogRotatePolicy {
        max_size,
        max_files: 5,
        max_workers,
        monitor_interval: Duration::from_secs(10),
    }
}

/// A container log of `size` bytes at `<dir>/<id>/0.log`.
fn log_of(dir: &Path, id: &str, size: usize) -> (String, PathBuf) {
    let path = dir.join(id).join("0.log");
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, "x".repeat(size)).unwrap();
    (id.to_owned(), path)
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

fn manager(runtime: &Arc<FakeRuntime>, policy: LogRotatePolicy) -> ContainerLogManager {
    let runtime: Arc<dyn LogRuntime> = runtime.clone();
    ContainerLogManager::new(runtime, NODE, policy)
}

#[tokio::test]
async fn logs_at_the_size_limit_are_rotated_and_reopened_others_are_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(FakeRuntime {
        logs: vec![
            log_of(dir.path(), "at-limit", 100),
            log_of(dir.path(), "below", 99),
            log_of(dir.path(), "above", 150),
        ],
        ..FakeRuntime::default()
    });
    let mut rotated = manager(&runtime, policy(100, 1))
        .rotate_logs()
        .await
        .unwrap();
    rotated.sort();
    assert_eq!(runtime.reopened(), ["above", "at-limit"]);
    assert_eq!(rotated.len(), 2);
    for (id, size) in [("above", 150), ("at-limit", 100)] {
        let files = names(&dir.path().join(id));
        assert_eq!(files.len(), 2, "{files:?}");
        assert_eq!(files[0], "0.log", "reopened by the runtime");
        assert_eq!(
            fs::metadata(dir.path().join(id).join("0.log"))
                .unwrap()
                .len(),
            0
        );
        let suffix = files[1].strip_prefix("0.log.").unwrap();
        assert!(
            suffix.len() == 15
                && suffix.as_bytes()[8] == b'-'
                && suffix.bytes().filter(u8::is_ascii_digit).count() == 14,
            "a YYYYMMDD-hhmmss suffix: {suffix}"
        );
        let renamed = dir.path().join(id).join(&files[1]);
        assert_eq!(fs::metadata(&renamed).unwrap().len(), size);
        assert!(rotated.contains(&renamed));
    }
    assert_eq!(names(&dir.path().join("below")), ["0.log"]);
}

#[tokio::test]
async fn a_refused_reopen_gives_the_log_its_name_back() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(FakeRuntime {
        logs: vec![log_of(dir.path(), "stopping", 200)],
        refuse_reopen: true,
        ..FakeRuntime::default()
    });
    let manager = manager(&runtime, policy(100, 1));
    let rotated = manager.rotate_logs().await.unwrap();
    assert!(rotated.is_empty());
    assert_eq!(runtime.reopened(), ["stopping"]);
    let log_dir = dir.path().join("stopping");
    assert_eq!(names(&log_dir), ["0.log"]);
    assert_eq!(fs::metadata(log_dir.join("0.log")).unwrap().len(), 200);
    let err = manager.rotate_container("stopping").await.unwrap_err();
    assert!(
        matches!(&err, LogsError::Reopen { id, .. } if id == "stopping"),
        "{err:?}"
    );
    assert!(
        error_chain(&err).contains("container is not in running state"),
        "{}",
        error_chain(&err)
    );
}

#[tokio::test]
async fn a_log_left_renamed_by_an_unfinished_rotation_is_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let (id, path) = log_of(dir.path(), "app", 10);
    fs::rename(&path, dir.path().join("app/0.log.20260101-000000")).unwrap();
    let runtime = Arc::new(FakeRuntime {
        logs: vec![(id, path)],
        ..FakeRuntime::default()
    });
    let rotated = manager(&runtime, policy(100, 1))
        .rotate_logs()
        .await
        .unwrap();
    assert!(rotated.is_empty(), "the new log is empty: {rotated:?}");
    assert_eq!(runtime.reopened(), ["app"]);
    assert_eq!(
        names(&dir.path().join("app")),
        ["0.log", "0.log.20260101-000000"]
    );
}

#[tokio::test]
async fn a_container_without_a_log_path_is_skipped() {
    let runtime = Arc::new(FakeRuntime {
        logs: vec![("quiet".to_owned(), PathBuf::new())],
        ..FakeRuntime::default()
    });
    let rotated = manager(&runtime, policy(0, 1)).rotate_logs().await.unwrap();
    assert!(rotated.is_empty());
    assert!(runtime.reopened().is_empty());
}

#[tokio::test(start_paused = true)]
async fn at_most_max_workers_containers_are_handled_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Arc::new(FakeRuntime {
        logs: (0..5)
            .map(|i| log_of(dir.path(), &format!("c{i}"), 10))
            .collect(),
        gate: Some(Semaphore::new(0)),
        ..FakeRuntime::default()
    });
    let manager = manager(&runtime, policy(1, 2));
    let control = async {
        let mut waiting = Vec::new();
        for _ in 0..3 {
            // Time is paused: the sleep ends once every other future is stuck, so the count is
            // of every call the round could start.
            tokio::time::sleep(Duration::from_secs(1)).await;
            waiting.push(runtime.in_flight.load(Ordering::SeqCst));
            runtime.gate.as_ref().unwrap().add_permits(2);
        }
        waiting
    };
    let (rotated, waiting) = tokio::join!(manager.rotate_logs(), control);
    assert_eq!(waiting, [2, 2, 1]);
    assert_eq!(rotated.unwrap().len(), 5);
}

#[test]
fn the_listing_asks_for_the_nodes_running_containers() {
    let filter = running_filter(NODE);
    assert_eq!(
        filter.state.map(|s| s.state),
        Some(cri::ContainerState::ContainerRunning.into())
    );
    assert_eq!(
        filter.label_selector,
        HashMap::from([(labels::MANAGED.to_owned(), NODE.to_owned())])
    );
    assert!(filter.id.is_empty() && filter.pod_sandbox_id.is_empty());
}

#[test]
fn the_policy_follows_the_settings_and_a_negative_size_turns_rotation_off() {
    let settings = ContainerLogSettings {
        max_size: "1Mi".to_owned(),
        max_size_bytes: Some(1_048_576),
        max_files: 3,
        max_workers: 4,
        monitor_interval: Duration::from_secs(5),
    };
    assert_eq!(
        LogRotatePolicy::from_settings(&settings),
        Some(LogRotatePolicy {
            max_size: 1_048_576,
            max_files: 3,
            max_workers: 4,
            monitor_interval: Duration::from_secs(5),
        })
    );
    let off = ContainerLogSettings {
        max_size: "-1".to_owned(),
        max_size_bytes: None,
        ..settings
    };
    assert_eq!(LogRotatePolicy::from_settings(&off), None);
}
